// Internal: the packed Q8_0 GEMM on AMX-INT8 tiles (Sapphire Rapids and later), for the AVX-512
// table's batched tiles (gemm_avx512.cc). Not an ISA table of its own: AMX needs the OS to grant
// the process its tile state, which the CPU feature list cannot promise, so the AVX-512 kernels
// ask AmxInt8Usable() and fall back to vpdpbusd where the answer is no.
#pragma once

#include <cstdint>

#include "kernel_table.h"

namespace kvl::ops {

// Tokens per AMX tile: its 16 rows.
inline constexpr int64_t kAmxTokens = 16;

// Whether this process may run AMX-INT8 tiles: the CPU has AMX-TILE and AMX-INT8, the OS enabled
// tile state (XCR0) and granted it to the process (arch_prctl), and neither SetAmxInt8Allowed nor
// the environment (KVL_AMX=off) turned it off. Asked once, then cached.
bool AmxInt8Usable();

// Tests and benchmarks: false makes every batched tile run on vpdpbusd, as on a CPU without AMX.
void SetAmxInt8Allowed(bool allowed);

// y[t][16 p + i] for panels p in [p0, p1), tokens t in [t0, t1), (t1 - t0) a multiple of
// kAmxTokens, over packed Q8_0 weights: every output exactly what the scalar kernel gives (each
// block's int32 dot, then acc += float(dot) * (dw * dx) in block order, from 0). Only when
// AmxInt8Usable().
void AmxPackedTileQ8_0(const MatMulArgs& a, int64_t p0, int64_t p1, int64_t t0, int64_t t1);

}  // namespace kvl::ops
