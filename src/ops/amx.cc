// Whether this process may use the AMX tiles (amx.h).
#include "amx.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "isa_features.h"

namespace kvl::ops {
namespace {

// arch_prctl codes and the XSAVE feature number of the tile data (asm/prctl.h, Linux 5.16 on).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureTileData = 18;

bool DetectAmx() {
  const CpuFeatureSet present = DetectCpuFeatures();
  if (!present.Contains(AmxCpuFeatures())) return false;
  // Granted once, for every thread of the process; refused by kernels without AMX support and by
  // sandboxes that filter the call.
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) == 0;
}

// Off unless KVL_AMX=1: on the whole forward pass with 2 threads the tiles have not measured
// faster on the machine they were written on (amx.h).
bool EnabledFromEnvironment() {
  const char* env = std::getenv("KVL_AMX");
  return env != nullptr && std::strcmp(env, "1") == 0;
}

std::atomic<bool> g_enabled{EnabledFromEnvironment()};

}  // namespace

bool AmxAvailable() {
  static const bool available = DetectAmx();
  return available;
}

bool AmxTakes(DType type, int64_t n_tokens) {
  // The verify step and batched decode over Q8_0 / Q4_0, where one thread's matmul_bench had the
  // tiles 1.2-1.3x ahead (the 2-thread verify step moved both ways: 1.38-1.49x a one-row step
  // with them, 1.18-1.55x without). Not prefill: Qwen3-0.6B Q8_0 pp512, 2 threads, 273-325 t/s
  // with the tiles against 385-389 without. Not K-quants: unpacking their codes to a buffer the
  // tile loads made 9-token tiles no faster, and Q6_K slower.
  return (type == DType::kQ8_0 || type == DType::kQ4_0) && n_tokens >= 8 &&
         n_tokens <= kAmxMaxTokens;
}

bool AmxEnabled() { return g_enabled.load(std::memory_order_relaxed) && AmxAvailable(); }

void SetAmxEnabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }

}  // namespace kvl::ops
