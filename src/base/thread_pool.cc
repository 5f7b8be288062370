#include "kvl/thread_pool.h"

#include <fmt/format.h>

#include <new>
#include <system_error>
#include <thread>

namespace kvl {

// Workers spin briefly before sleeping: decode issues hundreds of small loops per token, and a
// condition-variable wake per loop would cost more than the loop itself.
namespace {
constexpr int kSpinIterations = 20000;
inline void CpuRelax() { __builtin_ia32_pause(); }
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  try {
    for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
  } catch (...) {
    // Without this the joinable threads already started would terminate the process when the
    // vector is destroyed; stopped and joined, the caller gets the exception (see Create).
    StopWorkers();
    throw;
  }
}

StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(int num_threads) {
  try {
    return std::make_unique<ThreadPool>(num_threads);
  } catch (const std::system_error& e) {
    return ResourceExhaustedError(
        fmt::format("cannot start {} threads: {} (lower -t, or raise the process limit: ulimit -u)",
                    num_threads, e.what()));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(
        fmt::format("out of memory starting a pool of {} threads", num_threads));
  }
}

ThreadPool::~ThreadPool() { StopWorkers(); }

void ThreadPool::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::DrainTasks(int thread) {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) break;
    fn_(closure_, task, thread);
  }
}

namespace {
constexpr uint64_t kOpenBit = uint64_t{1} << 32;
constexpr uint64_t kJoinedMask = kOpenBit - 1;
}  // namespace

void ThreadPool::Run(int64_t num_tasks, TaskFn fn, void* closure) {
  if (num_tasks <= 0) return;
  if (num_threads_ == 1 || num_tasks == 1) {
    for (int64_t task = 0; task < num_tasks; ++task) fn(closure, task, 0);
    return;
  }
  fn_ = fn;
  closure_ = closure;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  // No worker is in a loop now (the last Run waited for them). Release: a worker that joins (an
  // acquire exchange on state_) sees the loop written above.
  state_.store(kOpenBit, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  DrainTasks(0);
  // Every task is claimed: close the loop to latecomers, then wait for the workers still running
  // one. A worker descheduled mid-task (more runnable threads than cores: tests in parallel, other
  // processes) would keep this loop spinning for a whole time slice: after a short spin, yield
  // the core so it can finish.
  state_.fetch_and(~kOpenBit, std::memory_order_acq_rel);
  for (int i = 0; (state_.load(std::memory_order_acquire) & kJoinedMask) != 0; ++i) {
    if (i < kSpinIterations) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

bool ThreadPool::JoinLoop() {
  // A worker that woke late finds the loop closed and goes back to waiting; one that woke for
  // an earlier loop and finds a later one open joins that one, which is as good.
  uint64_t state = state_.load(std::memory_order_acquire);
  while ((state & kOpenBit) != 0) {
    if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      return true;
    }
  }
  return false;
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    // Spin on the generation counter first, then sleep on the condition variable.
    for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen; ++i) {
      CpuRelax();
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      seen = generation_.load(std::memory_order_acquire);
      if (stopping_) return;
    }
    // Joined, the loop cannot end (nor fn_ change) before this worker leaves it.
    if (!JoinLoop()) continue;
    DrainTasks(thread);
    state_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace kvl
