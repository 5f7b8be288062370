// A MatMulGroup whose matrices mix a weight stream with arithmetic on weights that stay in cache:
// a decode step's Q (one token, 4 MiB of weights to read from DRAM) beside the K and V of a page
// rebuilt in the same step (65 tokens over 0.5 MiB each: arithmetic, its weights read once and
// then reused from cache). Run one after the other, the memory idles while the arithmetic runs and
// the arithmetic units idle while the stream runs. Paired, each task computes a piece of the
// arithmetic while its kernel pulls the next piece of the stream into L2 (StreamAhead), then
// runs that piece of the stream from L2: the step's weight stream hides the rebuild's arithmetic,
// which is what issue 28's "rebuilds ride in the step" asks of a decode step.
//
// Only the order of the work changes: every output is computed by the same tile kernel as
// unpaired, so results are bit-identical (tests/ops/stream_pairs_test.cc).
#pragma once

#include <cstdint>
#include <span>

#include "kernel_table.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"

namespace kvl::ops {

// Whether ws (with their token counts) has both a stream and arithmetic worth pairing on isa.
bool PairsStreamWithArithmetic(Isa isa, std::span<const MatMulArgs> args,
                               std::span<const int64_t> token_counts);

// Runs every (matrix, row, token) of args in pairs; args are MatMulGroup's, ready to run, and the
// arithmetic is cut into balanced tiles of at most token_tile tokens (MatMulGroup's token tile).
void RunStreamPairs(ThreadPool& pool, const KernelTable& kernels, std::span<const MatMulArgs> args,
                    std::span<const int64_t> token_counts, int64_t token_tile);

}  // namespace kvl::ops
