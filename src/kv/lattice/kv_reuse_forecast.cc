#include "kvl/kv_reuse_forecast.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvl {
namespace {

// An idle page never revived is still not certain to stay unread: its probability is floored so
// that its expected distance stays finite and comparable.
constexpr double kMinRevivalProbability = 1e-3;
// How much the whole history weighs against one page's own: as much as this many of its own idle
// periods.
constexpr double kHistoryWeightPeriods = 2;

}  // namespace

void KvIdleReuseHistory::PageWentIdle(int64_t last_read_step) {
  idle_since_.insert(std::upper_bound(idle_since_.begin(), idle_since_.end(), last_read_step),
                     last_read_step);
}

void KvIdleReuseHistory::ForgetIdlePage(int64_t last_read_step) {
  const auto at = std::lower_bound(idle_since_.begin(), idle_since_.end(), last_read_step);
  if (at != idle_since_.end() && *at == last_read_step) idle_since_.erase(at);
}

void KvIdleReuseHistory::PageRevived(int64_t last_read_step, int64_t step) {
  ForgetIdlePage(last_read_step);  // no longer idle
  const int64_t gap = std::max<int64_t>(0, step - last_read_step);
  if (max_revivals_ > 0) {
    if (recorded_.size() < max_revivals_) {
      recorded_.push_back(gap);
    } else {
      // The oldest pause makes room: its entry leaves the sorted pauses and their sums.
      const int64_t old = recorded_[oldest_];
      recorded_[oldest_] = gap;
      oldest_ = (oldest_ + 1) % max_revivals_;
      const auto it = std::lower_bound(gaps_.begin(), gaps_.end(), old);
      const size_t i = static_cast<size_t>(it - gaps_.begin());
      gaps_.erase(it);
      gap_sums_.erase(gap_sums_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      for (size_t k = i + 1; k < gap_sums_.size(); ++k) gap_sums_[k] -= static_cast<double>(old);
    }
  }
  const auto at = std::upper_bound(gaps_.begin(), gaps_.end(), gap);
  const size_t i = static_cast<size_t>(at - gaps_.begin());
  gaps_.insert(at, gap);
  if (gap_sums_.empty()) gap_sums_.push_back(0);
  gap_sums_.insert(gap_sums_.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                   gap_sums_[i] + static_cast<double>(gap));
  for (size_t k = i + 2; k < gap_sums_.size(); ++k) gap_sums_[k] += static_cast<double>(gap);
}

double KvIdleReuseHistory::RevivalProbability(int64_t step, int64_t idle_steps,
                                              int64_t page_idle_periods,
                                              int64_t page_revivals) const {
  // The pages that were idle for `idle_steps`: those revived after a longer pause, which were
  // still to be read, and those idle now since at least as long ago. Pages idle for less are left
  // out rather than counted as never read again: counting them would make every long pause look
  // hopeless, the more so the more pages went idle lately, and so rank idle pages by recency
  // alone (LRU's order) whatever the revivals say.
  const size_t within =
      static_cast<size_t>(std::upper_bound(gaps_.begin(), gaps_.end(), idle_steps) - gaps_.begin());
  const double later = static_cast<double>(gaps_.size() - within);
  const double idle_as_long = static_cast<double>(
      std::upper_bound(idle_since_.begin(), idle_since_.end(), step - idle_steps) -
      idle_since_.begin());
  const double all = (later + 1.0) / (later + idle_as_long + 2.0);
  // Then the page's own record: a shared opening read by request after request, a turn's history
  // read at every turn.
  const double own =
      (static_cast<double>(page_revivals) + kHistoryWeightPeriods * all) /
      (static_cast<double>(std::max<int64_t>(0, page_idle_periods - 1)) + kHistoryWeightPeriods);
  return std::clamp(own, kMinRevivalProbability, 1.0);
}

double KvIdleReuseHistory::RemainingGapSteps(int64_t idle_steps) const {
  // No page revived after a pause this long (or none at all): the history cannot say how much
  // longer, so every such page is given the named default pause, and the order among them is
  // their revival probability's, which does learn from how long they have waited (the pages that
  // were idle that long and stayed unread). "As long again as it has waited" (Lindy's rule), used
  // before, counted the wait a second time with no revival to support it: among such pages it was
  // LRU's order, which loses every request repeated after a pause longer than the pool can hold
  // its pages through (a cyclic reuse of requests, as a scan of pages is within a request).
  const size_t within =
      static_cast<size_t>(std::upper_bound(gaps_.begin(), gaps_.end(), idle_steps) - gaps_.begin());
  const size_t later = gaps_.size() - within;
  if (later == 0) return kDefaultIdleGapSteps;
  const double sum_later = gap_sums_.back() - gap_sums_[within];
  return std::max(1.0, sum_later / static_cast<double>(later) - static_cast<double>(idle_steps));
}

namespace {

// The steps an idle page still waits for its next read if it is read again: what the history's
// pauses longer than its wait leave, and, for a page read again before, what its own pauses
// leave, weighed as its revival probability weighs them (kHistoryWeightPeriods). A page already
// idle longer than its own pauses is late on its own record: only the history says.
double RemainingIdleSteps(const KvReuseInput& page, int64_t idle,
                          const KvIdleReuseHistory& history) {
  const double from_history = history.RemainingGapSteps(idle);
  if (page.revivals <= 0 || page.revival_gap_steps <= 0) return from_history;
  const double revivals = static_cast<double>(page.revivals);
  const double own_pause = static_cast<double>(page.revival_gap_steps) / revivals;
  if (own_pause <= static_cast<double>(idle)) return from_history;
  const double from_own = own_pause - static_cast<double>(idle);
  return (revivals * from_own + kHistoryWeightPeriods * from_history) /
         (revivals + kHistoryWeightPeriods);
}

}  // namespace

KvReuseForecast ForecastReuse(const KvReuseInput& page, const KvIdleReuseHistory& history) {
  KvReuseForecast f;
  f.order_in_step = page.order_in_step;
  const bool running = page.running_reader && page.reads_left != 0;
  const bool waiting = page.waiting_reader && page.reads_left != 0;
  if (running || waiting) {
    // Read at every step of its reader: the next one known from the schedule, or (a waiting
    // reader) at its resume, certain, only later.
    f.next_read_steps =
        running ? static_cast<double>(std::max<int64_t>(0, page.steps_to_read))
                : static_cast<double>(std::max<int64_t>(1, page.steps_to_resume));
    f.reads_left = page.reads_left < 0 ? std::numeric_limits<double>::infinity()
                                       : static_cast<double>(page.reads_left);
    return f;
  }
  // Read again only if a later request finds it: the expected wait is what remains
  // of the usual pause, stretched by how unlikely the revival is.
  const int64_t idle = std::max<int64_t>(0, page.idle_steps);
  const double p = history.RevivalProbability(page.step, idle, page.idle_periods + page.shared_reads,
                                              page.revivals + page.shared_reads);
  f.next_read_steps = RemainingIdleSteps(page, idle, history) / p;
  f.reads_left = p;
  return f;
}

bool KvPageLeavesFirst(const KvReuseForecast& a, const KvReuseForecast& b) {
  const double step_a = std::floor(a.next_read_steps), step_b = std::floor(b.next_read_steps);
  if (step_a != step_b) return step_a > step_b;
  if (a.reads_left != b.reads_left) return a.reads_left < b.reads_left;
  return a.order_in_step > b.order_in_step;
}

}  // namespace kvl
