#include "step_watchdog.h"

#include <fmt/format.h>

namespace kvl {
namespace {

double SecondsBetween(StepWatchdog::Clock::time_point a, StepWatchdog::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

void StepWatchdog::LoopStarted(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  started_ = true;
  in_step_ = false;
  last_progress_ = now;
}

void StepWatchdog::StepStarted(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_step_ = true;
  step_started_ = now;
}

void StepWatchdog::StepEnded(Clock::time_point now, bool work_left) {
  std::lock_guard<std::mutex> lock(mutex_);
  in_step_ = false;
  work_left_ = work_left;
  last_progress_ = now;
  if (stalled_) stalled_seconds_ += SecondsBetween(last_check_, now);
  stalled_ = false;
}

StepWatchdogReport StepWatchdog::Check(Clock::time_point now, bool work_queued) {
  std::lock_guard<std::mutex> lock(mutex_);
  StepWatchdogReport r;
  if (!started_ || limit_seconds_ <= 0) return r;
  r.seconds_since_step = SecondsBetween(last_progress_, now);
  std::string reason;
  if (in_step_ && SecondsBetween(step_started_, now) > limit_seconds_) {
    reason = fmt::format("a step has been running for {:.1f} s (limit {:g} s)",
                         SecondsBetween(step_started_, now), limit_seconds_);
  } else if (!in_step_ && (work_left_ || work_queued) && r.seconds_since_step > limit_seconds_) {
    reason = fmt::format("requests have waited {:.1f} s with no step (limit {:g} s)",
                         r.seconds_since_step, limit_seconds_);
  }
  if (!reason.empty()) {
    if (!stalled_) {
      ++trips_;
      stalled_ = true;
    } else {
      stalled_seconds_ += SecondsBetween(last_check_, now);
    }
    last_check_ = now;
  } else if (stalled_) {
    stalled_seconds_ += SecondsBetween(last_check_, now);
    stalled_ = false;
  }
  r.stalled = stalled_;
  r.reason = std::move(reason);
  r.trips = trips_;
  r.stalled_seconds = stalled_seconds_;
  return r;
}

}  // namespace kvl
