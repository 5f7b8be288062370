// Whether the step loop still makes progress: the engine's watchdog (issue 37). A step that never
// ends (a planning loop that went round forever) left /health answering 200 while every request
// waited; the watchdog turns that into a reason a probe can see.
//
// The step loop notes when each step starts and ends and whether work was left; Check, from any
// thread, says the loop is stalled when a step has been running for longer than the limit, or
// when work waits (requests queued or running) and no step has ended for that long. Each passage
// from making progress to stalled is a trip; the time spent stalled is summed. A background
// thread (Engine::Start) checks about four times per limit, so that trips and stalled time are
// counted even when nobody asks.
//
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace kvl {

struct StepWatchdogReport {
  bool stalled = false;
  std::string reason;           // empty unless stalled: what waits and for how long
  double seconds_since_step = 0;  // since the last step ended (or the loop started)
  int64_t trips = 0;            // passages into a stall, in all
  double stalled_seconds = 0;   // time spent stalled, in all (the current stall included)
};

class StepWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  // `limit_seconds` <= 0: never stalled.
  explicit StepWatchdog(double limit_seconds) : limit_seconds_(limit_seconds) {}

  double limit_seconds() const { return limit_seconds_; }
  // The step loop starts: the time it has taken no step yet starts counting from here.
  void LoopStarted(Clock::time_point now);
  void StepStarted(Clock::time_point now);
  // `work_left`: requests still running or waiting after it.
  void StepEnded(Clock::time_point now, bool work_left);
  // `work_queued`: requests or cancellations queued that the loop has not taken yet.
  StepWatchdogReport Check(Clock::time_point now, bool work_queued);

 private:
  const double limit_seconds_;
  mutable std::mutex mutex_;
  bool started_ = false;  // LoopStarted was called: before it, nothing is checked
  bool in_step_ = false;
  bool work_left_ = false;
  Clock::time_point step_started_{};
  Clock::time_point last_progress_{};  // the last step's end, or the loop's start
  bool stalled_ = false;
  Clock::time_point last_check_{};  // while stalled: stalled time is summed from check to check
  int64_t trips_ = 0;
  double stalled_seconds_ = 0;
};

}  // namespace kvl
