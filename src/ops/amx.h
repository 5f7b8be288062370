// Internal: Intel AMX (tile registers and TDPBSUD, Sapphire Rapids and later) as an optional unit of
// the AVX-512 table's packed int8 GEMM. One TDPBSUD multiplies up to 16 tokens' int8 activations by
// a sub-block of 16 weight rows in one instruction, where VNNI needs one vpdpbusd per 4 values per
// token; the kernels (gemm_amx.cc) then apply each sub-block's scales with the same float
// operations as the VNNI kernels. The integer dots are exact either way, so the outputs are
// bit-identical to the VNNI and scalar kernels (kernel_table.h's contract) and the choice never
// changes a result: it is made per MatMul call by the number of tokens alone.
//
// Used only where the CPU reports AMX-TILE and AMX-INT8, the OS enables the tile state (XCR0 bits
// 17 and 18) and grants this process the permission to use it (Linux: arch_prctl
// ARCH_REQ_XCOMP_PERM). KVL_AMX=0 in the environment turns it off (to compare, or on a hypervisor
// that reports it but traps it).
#pragma once

#include <cstdint>

#include "kernel_table.h"

namespace kvl::ops {

// Whether the packed kernels use AMX in this process: the CPU and OS allow it and neither KVL_AMX=0
// nor SetAmxEnabled(false) turned it off. Thread-safe; the detection runs once.
bool AmxEnabled();

// Turns AMX off (false) or back on where the machine allows it (true), for tests and benchmarks
// that compare the two paths in one process. Not to be called while a MatMul runs.
void SetAmxEnabled(bool enabled);

// Whether the machine allows AMX at all, whatever SetAmxEnabled says.
bool AmxAvailable();

// Batches of at least this many tokens take the AMX kernels; fewer stay on VNNI (one token per
// weight read is bandwidth-bound, and a tile instruction for one row wastes most of it).
inline constexpr int64_t kAmxMinTokens = 2;

// KernelTable::matmul_packed_tile for Q8_0 (gemm_amx.cc) and the K-quants; call only when
// AmxEnabled().
void AmxQ8PackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);
void AmxKQuantPackedTile(const MatMulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);

}  // namespace kvl::ops
