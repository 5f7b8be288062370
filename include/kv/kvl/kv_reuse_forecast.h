// When a KV page will be read next, and how often after that, predicted from what the engine knows
// of its own schedule instead of guessed from recency.
//
// Under full attention a running sequence reads every one of its pages at each of its steps, in
// block order, and the scheduler knows the most steps it may still take (its max_tokens, its
// context): a running page's next read is this step or the next, and its reads left are its
// reader's steps left. That read pattern is a cyclic scan, the case that defeats LRU (the least
// recently read page is the next one read) and frequency counts; Belady's optimal leaves the page
// read farthest ahead, which this forecast names without seeing the future. A page a preempted
// sequence holds is read again for certain when that sequence resumes. A page nobody holds (its
// request finished) is read again only through prefix reuse (a next turn, a shared opening); how
// likely and how soon is estimated from the history of such pages (KvIdleReuseHistory), one
// history per kind of page where their readers differ (a conversation's next turn comes when its
// user answers, a shared opening with any request).
//
// Its users: the pressure planner (kv_pressure.h) orders the running pages it may move; the cost
// model (kv_policy.h) takes a page's probability of another read from it (ReuseProbability); the
// KV manager (kv_manager.h) reuses its free cached blocks (idle pages of the prefix cache) in
// its order, the least likely to be read again first, with one KvIdleReuseHistory of its own;
// and `kvl bench replay` (kv_trace_replay.h) evaluates it against LRU, LFU and Belady on
// recorded traces, in the replay's model and through the KV manager's own code. All order pages
// with KvPageLeavesFirst.
//
// Thread-safety: KvIdleReuseHistory is not synchronized (one owner, the step loop or a replay);
// the functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvl {

// What is known of one page's readers at the moment a page has to leave.
struct KvReuseInput {
  // A running sequence holds the page and reads it at each of its steps. Where several do (a
  // shared prefix), the one that reads it first.
  bool running_reader = false;
  int64_t steps_to_read = 0;  // its next read: 0 this step (not read yet), 1 the next one, ...
  int64_t order_in_step = 0;  // its place among that step's page reads (sequences, then blocks)
  int64_t reads_left = -1;    // steps its running readers may still take (-1: unknown)
  // No running sequence holds it, but a preempted one waiting to resume does: it is read again
  // when that one is readmitted, at each of the steps it has left (reads_left), the first in
  // about `steps_to_resume` steps (when the running sequences free the blocks it needs).
  bool waiting_reader = false;
  int64_t steps_to_resume = 1;
  // No running sequence holds it: steps since it was last read, and how often this page was read
  // again after such a pause before (its idle periods, this one included, and the reads that
  // ended the earlier ones). `step` is the step being planned, to which the idle history measures
  // the pauses of the pages idle now.
  int64_t step = 0;
  int64_t idle_steps = 0;
  int64_t idle_periods = 1;
  int64_t revivals = 0;
  // The pauses those revivals ended, summed (0: not known): a page read again after about the
  // same pause each time (a conversation's history at every turn, an opening every other round)
  // is expected about that long after its last read again.
  int64_t revival_gap_steps = 0;
  // Reads of it by requests admitted while another held it (a shared opening): reads again it
  // had without going idle, each counted as an idle period that ended in a revival.
  int64_t shared_reads = 0;
};

struct KvReuseForecast {
  double next_read_steps = 0;  // expected steps to its next read (fractions within a step)
  double reads_left = 0;       // expected reads from now on
  int64_t order_in_step = 0;   // ties: the page read later in the step leaves first
};

// How likely a page nobody reads any more is to be read again (prefix reuse, a resume), and how
// soon, given how long it has been idle: from every page that went idle (its last running reader
// finished or stopped) and the pause of every idle page read again. Conditioning on the pause so
// far tells a reply's tail, never read again, from a shared opening between two requests. A page
// idle for t steps is revived with probability (revivals after pauses > t) / (pages that were idle
// for t steps), each count with one in two added (Laplace's rule) so that an empty history says
// 1/2. The pages that were idle for t steps are those revived after longer pauses and those idle
// now for t steps or more, as in a survival table (Kaplan and Meier): a page idle for fewer steps
// has not reached t yet, and says nothing of whether pages idle that long are read again.
class KvIdleReuseHistory {
 public:
  // Where no page was revived after a pause as long as a page's: the pause still assumed (a named
  // default, not a measurement).
  static constexpr double kDefaultIdleGapSteps = 16;

  // Keeps the pauses of the last `max_revivals` revived pages only (0: all), so that a history
  // fed for as long as a server runs stays bounded (an offline replay keeps all).
  KvIdleReuseHistory() = default;
  explicit KvIdleReuseHistory(size_t max_revivals) : max_revivals_(max_revivals) {}

  // A page went idle after its read at step `last_read_step`.
  void PageWentIdle(int64_t last_read_step);
  // Takes back one PageWentIdle (the page's pause turned out to belong to another history).
  void ForgetIdlePage(int64_t last_read_step);
  // The page idle since its read at `last_read_step` was read again at `step`.
  void PageRevived(int64_t last_read_step, int64_t step);

  // P(read again) at step `step` of a page idle for `idle_steps`, whose own record is
  // `page_idle_periods` idle periods (this one included) of which `page_revivals` ended in a read;
  // and the expected steps still to wait if it is read again.
  double RevivalProbability(int64_t step, int64_t idle_steps, int64_t page_idle_periods,
                            int64_t page_revivals) const;
  double RemainingGapSteps(int64_t idle_steps) const;

  int64_t idle_pages() const { return static_cast<int64_t>(idle_since_.size()); }  // idle now
  int64_t revived_pages() const { return static_cast<int64_t>(gaps_.size()); }
  int64_t longest_gap() const { return gaps_.empty() ? 0 : gaps_.back(); }  // 0: none revived

 private:
  std::vector<int64_t> idle_since_;  // the last reads of the pages idle now, ascending
  std::vector<int64_t> gaps_;        // the pauses of revived pages, ascending
  std::vector<double> gap_sums_;     // gap_sums_[i]: the sum of gaps_[0 .. i-1]
  // With a bound: the kept pauses in the order they were recorded, a ring whose oldest entry is
  // at oldest_ once full.
  size_t max_revivals_ = 0;
  std::vector<int64_t> recorded_;
  size_t oldest_ = 0;
};

KvReuseForecast ForecastReuse(const KvReuseInput& page, const KvIdleReuseHistory& history);

// Whether page a should leave the pool before page b: the one read farthest ahead (Belady's rule
// with the forecast for the future), counted in whole steps; then the one with fewer reads left
// (a page that leaves a running sequence is read from its tier at each of them); then the one
// read later in the step (the next read farthest ahead within a cyclic scan).
bool KvPageLeavesFirst(const KvReuseForecast& a, const KvReuseForecast& b);

}  // namespace kvl
