// A fixed pool of worker threads for data-parallel loops. The calling thread takes part, so a
// pool of N threads starts N-1 workers. Passed in to whoever needs it, never a singleton.
//
// Thread-safety: ParallelFor may be called from one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kvl/status.h"

namespace kvl {

class ThreadPool {
 public:
  // Throws std::system_error when a thread cannot be started (a low process limit); Create
  // turns that into a Status, and is what code handling user input calls.
  explicit ThreadPool(int num_threads);
  static StatusOr<std::unique_ptr<ThreadPool>> Create(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(task, thread) for every task in [0, num_tasks) and returns when all are done. Tasks
  // are handed out dynamically; `thread` is in [0, num_threads) (per-thread scratch index).
  // Allocation-free: fn is passed by reference, not wrapped in std::function.
  template <typename Fn>
  void ParallelFor(int64_t num_tasks, Fn&& fn) {
    Run(num_tasks, &Trampoline<std::remove_reference_t<Fn>>, &fn);
  }

 private:
  using TaskFn = void (*)(void* closure, int64_t task, int thread);
  template <typename Fn>
  static void Trampoline(void* closure, int64_t task, int thread) {
    (*static_cast<Fn*>(closure))(task, thread);
  }

  void Run(int64_t num_tasks, TaskFn fn, void* closure);
  void WorkerLoop(int thread);
  // A woken worker enters the loop open now; false when there is none (every task was claimed
  // before it woke).
  bool JoinLoop();
  void DrainTasks(int thread);
  void StopWorkers();

  int num_threads_;
  std::vector<std::thread> workers_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // bumped per Run (under mutex_, read lock-free)
  bool stopping_ = false;    // guarded by mutex_

  // The current loop. Written before state_ opens it, read by workers that joined it.
  TaskFn fn_ = nullptr;
  void* closure_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  // Whether workers may join the current loop (bit 32: open while tasks may be unclaimed) and
  // how many joined and are not done (bits 0-31).
  // Run waits only for the workers that joined, never for one that has not woken up yet: on a
  // core shared with another process a sleeping worker can take a whole time slice to run, and
  // waiting for it at each of the hundreds of loops of a decode step would cost more than
  // running its tasks on the calling thread.
  std::atomic<uint64_t> state_{0};
};

}  // namespace kvl
