// Whether this process may use AMX (amx.h). Plain flags: cpuid, xgetbv and arch_prctl only.
#include "amx.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace kvl::ops {
namespace {

// Linux's arch_prctl codes (asm/prctl.h) and the tile-data state component, not in glibc's
// headers on Debian 12.
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

uint64_t ReadXcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

bool DetectAmx() {
  const char* env = std::getenv("KVL_AMX");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(1, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  if ((ecx & (1u << 27)) == 0) return false;  // OSXSAVE: xgetbv is allowed
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool amx_tile = (edx & (1u << 24)) != 0, amx_int8 = (edx & (1u << 25)) != 0;
  if (!amx_tile || !amx_int8) return false;
  const uint64_t xcr0 = ReadXcr0();
  if ((xcr0 & (uint64_t{3} << 17)) != (uint64_t{3} << 17)) return false;  // XTILECFG, XTILEDATA
#ifdef __linux__
  // Without this permission the first tile instruction faults; it holds for every thread of the
  // process, those started before included.
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  return true;
}

std::atomic<bool> g_disabled{false};

}  // namespace

bool AmxAvailable() {
  static const bool available = DetectAmx();
  return available;
}

bool AmxEnabled() { return !g_disabled.load(std::memory_order_relaxed) && AmxAvailable(); }

void SetAmxEnabled(bool enabled) { g_disabled.store(!enabled, std::memory_order_relaxed); }

}  // namespace kvl::ops
