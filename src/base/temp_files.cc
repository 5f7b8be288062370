#include "kvl/temp_files.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace kvl {
namespace {

constexpr int kMaxTempFiles = 64;
constexpr size_t kMaxPathBytes = 4096;

enum SlotState : int { kFree = 0, kWriting = 1, kPublished = 2 };

struct Slot {
  std::atomic<int> state{kFree};
  char path[kMaxPathBytes];
};
Slot g_slots[kMaxTempFiles];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads slot states");

constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Async-signal-safe: atomic loads and unlink only. SA_RESETHAND restored the default action on
// entry; the re-raised signal is delivered when the handler returns and ends the process.
void RemoveTempFilesAndDie(int sig) {
  const int saved_errno = errno;
  for (Slot& slot : g_slots) {
    if (slot.state.load(std::memory_order_acquire) == kPublished) ::unlink(slot.path);
  }
  errno = saved_errno;
  ::raise(sig);
}

}  // namespace

TempFileGuard::TempFileGuard(const std::string& path) {
  if (path.empty() || path.size() >= kMaxPathBytes) return;
  for (int i = 0; i < kMaxTempFiles; ++i) {
    int expected = kFree;
    if (g_slots[i].state.compare_exchange_strong(expected, kWriting, std::memory_order_acq_rel)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].state.store(kPublished, std::memory_order_release);
      slot_ = i;
      return;
    }
  }
}

TempFileGuard& TempFileGuard::operator=(TempFileGuard&& other) noexcept {
  if (this != &other) {
    Release();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

void TempFileGuard::Release() {
  if (slot_ < 0) return;
  g_slots[slot_].state.store(kFree, std::memory_order_release);
  slot_ = -1;
}

void InstallTempFileCleanup() {
  for (int sig : kCleanupSignals) {
    struct sigaction old_action;
    if (::sigaction(sig, nullptr, &old_action) == 0 && old_action.sa_handler == SIG_IGN) continue;
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_handler = RemoveTempFilesAndDie;
    sigemptyset(&action.sa_mask);
    for (int other : kCleanupSignals) sigaddset(&action.sa_mask, other);  // one cleanup at a time
    action.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &action, nullptr);
  }
}

}  // namespace kvl
