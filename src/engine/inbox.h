// Where requests and cancellations wait between the threads that submit them and the step loop
// that takes them: the only state of the engine that any thread may touch.
//
// Thread-safety: every method may be called from any thread, except Drain (the step loop).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "request.h"

namespace kvl {

class Scheduler;

class Inbox {
 public:
  // Gives the request its id and queues it; wakes a waiting step loop.
  RequestId Push(std::unique_ptr<Sequence> seq);
  // The request with this id finishes as "cancelled" at the step loop's next Drain; wakes a
  // waiting step loop (a cancel needs no other request to arrive first) and interrupts a step
  // being planned (interrupt()), so that the cancel is not held up by it.
  void Cancel(RequestId id);
  // The step loop is stopping: a step being planned returns at once (interrupt() stays set until
  // Resume), and a waiting loop wakes.
  void Interrupt();
  // The step loop starts (again).
  void Resume();
  // Set from a Cancel or an Interrupt until the step loop's next Drain: what the scheduler checks
  // inside its planning loop (SchedulerOptions::interrupt).
  const std::atomic<bool>* interrupt() const { return &interrupt_; }
  // Requests or cancellations queued that the step loop has not taken yet (the watchdog's "work
  // waits").
  bool HasQueued() const;
  // The step loop: every queued request to the scheduler, then the cancellations asked for.
  void Drain(Scheduler& scheduler);
  // The step loop, idle: returns once a request or a cancellation is queued or Wake is called
  // (no poll: an idle engine sleeps).
  void Wait();
  // The same for at most `timeout`: false when it passed with nothing queued and no Wake.
  bool WaitFor(std::chrono::duration<double> timeout);
  // Ends a Wait at once (the loop is stopping); a Wake before the Wait is kept, so the Wait
  // returns at once and no wake is lost between the loop's check and its wait.
  void Wake();
  int64_t requests_submitted() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> queue_;
  std::unordered_set<RequestId> cancels_;
  RequestId next_id_ = 1;
  int64_t submitted_ = 0;
  bool woken_ = false;
  std::atomic<bool> interrupt_{false};
  std::atomic<bool> stopping_{false};  // Interrupt until Resume: Drain keeps interrupt_ set
  std::unordered_set<RequestId> draining_;  // the step loop's copy of cancels_, reused
};

}  // namespace kvl
