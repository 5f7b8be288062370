#include "render_budget.h"

#include <fmt/format.h>

#include <algorithm>

#include "value_ops.h"

namespace kvl::jinja {
namespace {

thread_local RenderBudget* current_budget = nullptr;

}  // namespace

RenderBudget::RenderBudget(const RenderOptions& options) : options_(options) {
  if (options.max_seconds > 0) {
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(options.max_seconds));
  }
}

void RenderBudget::Hold(size_t bytes) {
  const int64_t now = held_->fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
                      static_cast<int64_t>(bytes);
  if (static_cast<uint64_t>(now) > options_.max_bytes) {
    Release(bytes);
    throw RenderError(fmt::format(
        "the render would hold more than {} bytes at once (its strings, lists, mappings and text "
        "together; the limit is max_bytes)",
        options_.max_bytes));
  }
  Work(bytes);
}

void RenderBudget::CheckString(size_t bytes) const {
  if (bytes > options_.max_string_bytes) {
    throw RenderError(
        fmt::format("a string grew past {} bytes (the render's output limit)", options_.max_string_bytes));
  }
}

void RenderBudget::Check() {
  if (steps_ > options_.max_steps) {
    throw RenderError(fmt::format(
        "the render passed {} steps (an endless loop, runaway recursion or work on large values? "
        "each statement, expression and loop iteration is a step, and so is each {} bytes a filter, "
        "method or operator works on)",
        options_.max_steps, kBytesPerStep));
  }
  if (options_.cancel != nullptr && options_.cancel->load(std::memory_order_relaxed)) {
    throw RenderError("the render was cancelled (the server is shutting down)");
  }
  if (options_.max_seconds > 0 && std::chrono::steady_clock::now() >= deadline_) {
    throw RenderError(fmt::format("the render ran past its deadline of {} s", options_.max_seconds));
  }
  next_check_ = std::min(steps_ + kCheckEvery, options_.max_steps + 1);
}

RenderBudget* CurrentBudget() { return current_budget; }

BudgetScope::BudgetScope(RenderBudget* budget) : previous_(current_budget) { current_budget = budget; }

BudgetScope::~BudgetScope() { current_budget = previous_; }

}  // namespace kvl::jinja
