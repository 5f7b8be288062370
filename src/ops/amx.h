// Internal: Intel AMX (eight 1 KiB tile registers and TMUL, their int8 matrix multiply) as the
// engine of the AVX-512 table's packed int8 GEMM where the CPU has it (Sapphire Rapids on).
//
// A vpdpbusd multiplies 16 rows x 4 bytes by one token's 4 bytes; one tdpbsud multiplies 16 rows
// x up to 64 bytes by up to 16 tokens, on a unit beside the vector ports. The packed panels
// (kernel_table.h) are already AMX's B operand: a 64-byte code vector holds 4 consecutive bytes
// of each of 16 rows, which is one row of a B tile, and a block's vectors are consecutive rows.
// The activations' rows are the A operand as they lie. So a tile kernel computes each block's
// (sub-block's) int32 dot of 16 rows x up to 16 tokens in one instruction and applies the same
// float operations to it as the VNNI tiles: integer dots are exact whatever computes them, so the
// outputs stay bit-identical to the scalar path (batch invariance, ops.h).
//
// Linux hands the tile state only to a process that asks for it (arch_prctl
// ARCH_REQ_XCOMP_PERM); AmxAvailable asks once. The tiles are off unless KVL_AMX=1: on this
// project's Sapphire Rapids VM they beat the VNNI tiles in one thread's kernel benchmark (Q8_0,
// 9-16 tokens: 1.2-1.3x) but not measurably on the whole 2-thread forward pass (the verify step
// and pp512 moved both ways between alternated runs, docs/BENCHMARKS.md), so the default keeps
// the path every machine runs.
#pragma once

#include <cstdint>

#include "kernel_table.h"

namespace kvl::ops {

// True when the CPU has AMX-TILE and AMX-INT8 and the kernel granted this process the tile state.
// Decided once per process.
bool AmxAvailable();

// Whether the AVX-512 table's packed GEMM uses the AMX tiles now: AmxAvailable() and turned on
// (KVL_AMX=1, or SetAmxEnabled(true): tests and benchmarks compare both paths in one process).
bool AmxEnabled();
void SetAmxEnabled(bool enabled);

// The most tokens one AMX tile takes (the rows of its A and C tiles).
inline constexpr int64_t kAmxMaxTokens = 16;

// Whether a packed MatMul of n_tokens tokens over `type` runs on the AMX tiles (when
// AmxEnabled()): Q8_0 / Q4_0 batches of 8 to 16 tokens. Each block costs the tiles a load of its
// codes, a load of the tokens' bytes and a store of the dots that the vector ports read back
// (neither forwarded through the store buffer): below 8 tokens that is more than the vpdpbusd it
// saves, and in a 2-thread prefill the tiles measured slower than the VNNI tiles (amx.cc).
bool AmxTakes(DType type, int64_t n_tokens);

// Computes y[t][r] for r in [r0, r1) (r0 a multiple of kPanelRows), t in [t0, t1) over packed
// Q8_0 or Q4_0 weights: the outputs of Avx512MatMulPackedTile, bit for bit. Call only where
// AmxEnabled().
void AmxMatMulPackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);

}  // namespace kvl::ops
