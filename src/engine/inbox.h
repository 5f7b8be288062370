// Where requests and cancellations wait between the threads that submit them and the step loop
// that takes them: the only state of the engine that any thread may touch.
//
// Thread-safety: every method may be called from any thread, except Drain (the step loop).
#pragma once

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
  // The request with this id finishes as "cancelled" at the step loop's next Drain.
  void Cancel(RequestId id);
  // The step loop: every queued request to the scheduler, then the cancellations asked for.
  void Drain(Scheduler& scheduler);
  // The step loop, idle: returns once something arrives, Wake is called, or `timeout` passes.
  void Wait(std::chrono::milliseconds timeout);
  // Ends a Wait at once (the loop is stopping).
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
  std::unordered_set<RequestId> draining_;  // the step loop's copy of cancels_, reused
};

}  // namespace kvl
