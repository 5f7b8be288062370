// What one render may spend: steps weighted by the work each does, bytes held at once, a
// deadline and a cancel flag (RenderOptions). Passing any of them is a RenderError naming it.
//
// The budget of the render a thread is running is found through that thread (CurrentBudget):
// values are made by Value's static factories, which every filter, method and operator calls,
// and each value made during a render counts against it until it is freed. Passing the budget
// through every signature instead would touch every builtin for the same effect.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvl/jinja.h"

namespace kvl::jinja {

class RenderBudget {
 public:
  // Bytes of data read or written that cost one step (a step being one node evaluated): copying
  // or scanning this much takes about as long as evaluating a node.
  static constexpr size_t kBytesPerStep = 1024;

  explicit RenderBudget(const RenderOptions& options);
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

  // One statement, expression or loop iteration.
  void Step() {
    if (++steps_ >= next_check_) Check();
  }
  // Work on `bytes` of data: a copy, a scan or a comparison of that much.
  void Work(size_t bytes) {
    steps_ += static_cast<int64_t>(bytes / kBytesPerStep);
    if (steps_ >= next_check_) Check();
  }
  // `bytes` more held by the render (and written, so also work); past max_bytes an error, with
  // nothing held.
  void Hold(size_t bytes);
  void Release(size_t bytes) { held_->fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed); }
  // The count Hold adds to, shared with each value the render made: a value freed after the
  // render (one it stored in a caller's namespace) still finds it.
  const std::shared_ptr<std::atomic<int64_t>>& held() const { return held_; }
  int64_t held_bytes() const { return held_->load(std::memory_order_relaxed); }
  int64_t steps() const { return steps_; }

  // A string (the output included) longer than max_string_bytes is an error.
  void CheckString(size_t bytes) const;
  size_t max_string_bytes() const { return options_.max_string_bytes; }

 private:
  // The step limit, the deadline and the cancel flag; the clock is read once per kCheckEvery
  // steps.
  void Check();
  static constexpr int64_t kCheckEvery = 1024;

  const RenderOptions& options_;
  int64_t steps_ = 0;
  int64_t next_check_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::shared_ptr<std::atomic<int64_t>> held_ = std::make_shared<std::atomic<int64_t>>(0);
};

// Bytes held against `budget` for as long as this lives: a builtin's scratch space.
class ScratchBytes {
 public:
  ScratchBytes(RenderBudget& budget, size_t bytes) : budget_(budget), bytes_(bytes) { budget.Hold(bytes); }
  ~ScratchBytes() { budget_.Release(bytes_); }
  ScratchBytes(const ScratchBytes&) = delete;
  ScratchBytes& operator=(const ScratchBytes&) = delete;

 private:
  RenderBudget& budget_;
  size_t bytes_;
};

// The budget of the render running on this thread; null outside a render.
RenderBudget* CurrentBudget();

// Makes `budget` the thread's current one while it lives.
class BudgetScope {
 public:
  explicit BudgetScope(RenderBudget* budget);
  ~BudgetScope();
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  RenderBudget* previous_;
};

// Work on `bytes` of data, counted against the thread's render (nothing outside one).
inline void CountWork(size_t bytes) {
  if (RenderBudget* budget = CurrentBudget()) budget->Work(bytes);
}

}  // namespace kvl::jinja
