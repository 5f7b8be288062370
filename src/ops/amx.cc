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
  const char* env = std::getenv("KVL_AMX");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  const CpuFeatureSet present = DetectCpuFeatures();
  if (!present.Contains(AmxCpuFeatures())) return false;
  // Granted once, for every thread of the process; refused by kernels without AMX support and by
  // sandboxes that filter the call.
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) == 0;
}

std::atomic<bool> g_enabled{true};

}  // namespace

bool AmxAvailable() {
  static const bool available = DetectAmx();
  return available;
}

bool AmxTakes(DType type, int64_t n_tokens) {
  // The fewest tokens from which the tiles beat the VNNI tiles, per type; Q6_K's 16-value
  // sub-blocks give each tile op half the work and never win.
  switch (type) {
    case DType::kQ8_0:
    case DType::kQ4_0:
      return n_tokens >= 8;
    case DType::kQ4_K:
    case DType::kQ5_K:
      return n_tokens >= 16;
    default:
      return false;
  }
}

bool AmxEnabled() { return g_enabled.load(std::memory_order_relaxed) && AmxAvailable(); }

void SetAmxEnabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }

}  // namespace kvl::ops
