#include "kvl/kv_trace_replay.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "kvl/kv_reuse_forecast.h"

namespace kvl {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// What the replay knows of one page.
struct ReplayPage {
  bool seen = false;
  int64_t slot = -1;          // its index in the resident list; -1: not resident
  int64_t last_step = -1;     // the step it was last read in
  int64_t last_tick = -1;     // the access it was last read at
  int64_t reads = 0;          // reads so far, resident or not
  int64_t next_use = kNever;  // the access that reads it next (Belady)
  int64_t block = 0;          // its index in the requests that read it (a shared prefix: the same)
  int64_t last_order = 0;     // its place among the reads of the step it was last read in
  // The forecast's view: the running requests that read it, and its idle periods (no running
  // request held it) and the reads that ended one.
  std::vector<int64_t> readers;
  bool idle = false;
  int64_t idle_periods = 0;
  int64_t revivals = 0;
  int64_t revival_gap_steps = 0;  // the pauses those revivals ended, summed
  // A conversation's page: a later request continued a chain holding it from that chain's last
  // page (a chat's next turn resubmits the whole history, reply included), or a request that
  // continued one wrote it. Its idle periods are counted in the conversations' history.
  bool conversation = false;
  bool idle_in_conversation = false;  // the history its current idle period is counted in
};

// What the replay knows of one request, as the engine knows it at its step.
struct ReplayRequest {
  int64_t last_step = -1;
  int64_t offset = 0;          // its first read's place among its last step's reads
  int64_t steps_left = -1;     // after that step, at most; -1: unknown
  bool running = false;        // read at the last step that read anything, and not finished
  bool continues = false;      // its first read began with the whole chain of a stopped request
  bool waiting = false;        // preempted before it finished: it resumes
  std::vector<int64_t> pages;  // by block
};

// The engine's reuse forecast over a replay: which requests run, which pages each holds, and the
// history of idle pages. Fed the accesses in order; asked for a page's forecast at any access.
class ForecastState {
 public:
  // `preempted`: the steps at which the engine preempted each request (the trace's L lines of
  // cause preempt), ascending.
  ForecastState(std::vector<ReplayPage>* pages,
                std::unordered_map<int64_t, std::vector<int64_t>> preempted)
      : pages_(*pages), preempted_(std::move(preempted)) {}

  // Access `tick` is about to be read. The engine plans a whole step (which sequences run, which
  // pages each reads) before running it, and so does this: at a new step the requests not in it,
  // or that took their last step, stop running (finished, or waiting), and their pages go idle
  // unless another running request holds them; then every request of the step becomes a reader
  // of every page its read lists, so a page a request later in the step is about to read is not
  // idle to the ones before it (and one a finished request's next turn reads again is revived).
  void Begin(std::span<const KvTraceAccess> accesses, int64_t tick) {
    const KvTraceAccess& a = accesses[static_cast<size_t>(tick)];
    if (a.step != step_) {
      step_ = a.step;
      step_first_tick_ = tick;
      size_t end = static_cast<size_t>(tick);
      while (end < accesses.size() && accesses[end].step == a.step) ++end;
      RetireStopped(accesses.subspan(static_cast<size_t>(tick), end - static_cast<size_t>(tick)));
      for (size_t k = static_cast<size_t>(tick); k < end;) k = PlanRead(accesses, k);
    }
    now_order_ = tick - step_first_tick_;
    ReplayPage& p = pages_[static_cast<size_t>(a.page)];
    p.last_order = now_order_;
    if (p.idle) {
      p.idle = false;
      ++p.revivals;
      p.revival_gap_steps += a.step - p.last_step;
      if (p.conversation && !p.idle_in_conversation) {
        // Revived by a conversation's next turn: the pause belongs to that history.
        history(false).ForgetIdlePage(p.last_step);
        history(true).PageWentIdle(p.last_step);
      }
      history(p.conversation).PageRevived(p.last_step, a.step);
    }
  }

  // Whether the engine's planner would never move page `id`: the first `sink_blocks` or the
  // newest `recent_blocks` pages of a request reading it.
  bool Pinned(int64_t id, int64_t sink_blocks, int64_t recent_blocks) const {
    const ReplayPage& p = pages_[static_cast<size_t>(id)];
    for (int64_t r : p.readers) {
      const ReplayRequest& q = requests_.at(r);
      if (!q.running) continue;
      if (p.block < sink_blocks ||
          p.block >= static_cast<int64_t>(q.pages.size()) - recent_blocks) {
        return true;
      }
    }
    return false;
  }

  // The forecast for resident page `id` while access `a` is read.
  KvReuseForecast Forecast(int64_t id, const KvTraceAccess& a) const {
    const ReplayPage& p = pages_[static_cast<size_t>(id)];
    KvReuseInput in;
    bool found = false;
    int64_t reads_left = 0;
    for (int64_t r : p.readers) {
      const ReplayRequest& q = requests_.at(r);
      if (!q.running) continue;
      // Read already in this step (its place in the step's reads is at or before the access being
      // read): next at its request's next step, if it takes one. Otherwise later in this step.
      const int64_t order = q.offset + p.block;
      const bool in_step = q.last_step == a.step;
      const bool read_now = in_step && order <= now_order_;
      if (read_now && q.steps_left == 0) continue;
      const int64_t steps_to_read = read_now ? 1 : 0;
      if (!found || steps_to_read < in.steps_to_read ||
          (steps_to_read == in.steps_to_read && order < in.order_in_step)) {
        in.steps_to_read = steps_to_read;
        in.order_in_step = order;
      }
      found = true;
      // Its reads from now on: the steps its request may still take after this one's read (a
      // request of this step that has not read the page yet reads it once more now).
      const int64_t reads = q.steps_left < 0 ? -1 : q.steps_left + (in_step && !read_now ? 1 : 0);
      reads_left = reads < 0 || reads_left < 0 ? -1 : std::max(reads_left, reads);
    }
    in.running_reader = found;
    in.reads_left = found ? reads_left : 0;
    if (!found) {
      // A preempted request resumes when running ones free their blocks: at the soonest, once
      // the first of them finishes.
      for (int64_t r : p.readers) {
        const ReplayRequest& q = requests_.at(r);
        if (!q.waiting) continue;
        in.waiting_reader = true;
        in.reads_left = q.steps_left < 0 || in.reads_left < 0
                            ? -1
                            : std::max(in.reads_left, q.steps_left + 1);
      }
      if (in.waiting_reader) in.steps_to_resume = StepsToFirstFinish() + 1;
    }
    // Idle: read again (if at all) in the order its request read it, when that comes back.
    if (!found) in.order_in_step = p.last_order;
    in.step = a.step;
    in.idle_steps = a.step - p.last_step;
    in.idle_periods = p.idle_periods + (p.idle ? 0 : 1);  // this one, if it is not counted yet
    in.revivals = p.revivals;
    in.revival_gap_steps = p.revival_gap_steps;
    return ForecastReuse(in, history(p.conversation));
  }

 private:
  // Registers the read of one request in this step, which starts at access `k`: its place in the
  // step, its steps left, and itself as a reader of each page it lists. Returns the access after
  // the read.
  size_t PlanRead(std::span<const KvTraceAccess> accesses, size_t k) {
    const KvTraceAccess& first = accesses[k];
    ReplayRequest& q = requests_[first.request];
    const bool first_read = q.last_step < 0;
    q.last_step = first.step;
    q.waiting = false;
    q.offset = static_cast<int64_t>(k) - step_first_tick_;
    q.steps_left = first.steps_left;
    if (!q.running) {
      q.running = true;
      running_.push_back(first.request);
    }
    q.pages.clear();
    size_t end = k;
    for (; end < accesses.size(); ++end) {
      const KvTraceAccess& next = accesses[end];
      if (next.request != first.request || next.step != first.step ||
          next.block != first.block + static_cast<int64_t>(end - k)) {
        break;
      }
      q.pages.push_back(next.page);
      std::vector<int64_t>& readers = pages_[static_cast<size_t>(next.page)].readers;
      if (std::find(readers.begin(), readers.end(), first.request) == readers.end()) {
        readers.push_back(first.request);
      }
    }
    if (first_read) q.continues = ContinuesAChain(accesses.subspan(k, end - k), q.pages);
    // The chain it continues is the front of its own pages: all are the conversation's.
    if (q.continues) {
      for (int64_t page : q.pages) pages_[static_cast<size_t>(page)].conversation = true;
    }
    return end;
  }

  // Whether a request's first read (`read`, listing `pages`) begins with the whole chain of a
  // stopped request, up to that chain's last page, among the blocks it found in the pool: a
  // conversation's next turn. A request that shares only an opening reads part of a chain.
  bool ContinuesAChain(std::span<const KvTraceAccess> read,
                       const std::vector<int64_t>& pages) const {
    for (size_t b = read.size(); b-- > 0;) {
      if (read[b].computed) continue;
      const auto tails = stopped_tails_.find(pages[b]);
      if (tails == stopped_tails_.end()) continue;
      for (int64_t r : tails->second) {
        const std::vector<int64_t>& chain = requests_.at(r).pages;
        if (chain.size() == b + 1 && std::equal(chain.begin(), chain.end(), pages.begin())) {
          return true;
        }
      }
    }
    return false;
  }

  // Running requests that took their last step, or have no read among `step_reads` (the new
  // step's accesses), stop running.
  void RetireStopped(std::span<const KvTraceAccess> step_reads) {
    for (size_t i = 0; i < running_.size();) {
      const int64_t id = running_[i];
      ReplayRequest& q = requests_[id];
      const bool reads_now =
          std::any_of(step_reads.begin(), step_reads.end(),
                      [&](const KvTraceAccess& r) { return r.request == id; });
      if (reads_now && q.steps_left != 0) {
        ++i;
        continue;
      }
      q.running = false;
      q.waiting = !reads_now && q.steps_left != 0 && PreemptedSince(id, q.last_step);
      running_[i] = running_.back();
      running_.pop_back();
      if (!q.pages.empty()) stopped_tails_[q.pages.back()].push_back(id);
      for (int64_t page : q.pages) {
        if (page >= 0) MaybeIdle(pages_[static_cast<size_t>(page)]);
      }
    }
  }

  // Whether the engine preempted request `id` after its read at `step` (up to the step begun).
  bool PreemptedSince(int64_t id, int64_t step) const {
    const auto it = preempted_.find(id);
    if (it == preempted_.end()) return false;
    const auto after = std::upper_bound(it->second.begin(), it->second.end(), step);
    return after != it->second.end() && *after <= step_;
  }

  // The fewest steps a running request may still take, of those that say (0 when none does).
  int64_t StepsToFirstFinish() const {
    int64_t fewest = -1;
    for (int64_t r : running_) {
      const int64_t left = requests_.at(r).steps_left;
      if (left >= 0 && (fewest < 0 || left < fewest)) fewest = left;
    }
    return std::max<int64_t>(0, fewest);
  }

  // A page no running request holds goes idle, unless a preempted one holds it (it is read when
  // that one resumes; a resume is not a reuse the idle history learns from).
  void MaybeIdle(ReplayPage& p) {
    if (p.idle) return;
    for (int64_t r : p.readers) {
      const ReplayRequest& q = requests_.at(r);
      if (q.running || q.waiting) return;
    }
    p.readers.clear();
    p.idle = true;
    ++p.idle_periods;
    p.idle_in_conversation = p.conversation;
    history(p.conversation).PageWentIdle(p.last_step);
  }

  // A conversation's pages and the others are read again by different readers (its next turn,
  // which comes when its user answers; a request with the same opening, which may come any time),
  // so each kind learns from its own history.
  KvIdleReuseHistory& history(bool conversation) { return histories_[conversation ? 1 : 0]; }
  const KvIdleReuseHistory& history(bool conversation) const {
    return histories_[conversation ? 1 : 0];
  }

  std::vector<ReplayPage>& pages_;
  const std::unordered_map<int64_t, std::vector<int64_t>> preempted_;
  std::unordered_map<int64_t, ReplayRequest> requests_;
  std::vector<int64_t> running_;
  KvIdleReuseHistory histories_[2];  // [0]: other pages, [1]: conversations' pages
  // The last page of each stopped request's chain -> those requests (a next turn finds them).
  std::unordered_map<int64_t, std::vector<int64_t>> stopped_tails_;
  int64_t step_ = -1;
  int64_t step_first_tick_ = 0;
  int64_t now_order_ = 0;  // the access being read: its place among the step's reads
};

}  // namespace

std::unordered_map<int64_t, std::vector<int64_t>> KvTracePreemptions(const KvTrace& trace) {
  std::unordered_map<int64_t, std::vector<int64_t>> out;
  int64_t step = 0;
  for (const KvTraceEvent& ev : trace.events) {
    if (ev.kind == KvTraceEvent::Kind::kStep) step = ev.step;
    if (ev.kind != KvTraceEvent::Kind::kLeave || ev.cause != KvTraceCause::kPreempt) continue;
    std::vector<int64_t>& steps = out[ev.request];
    if (steps.empty() || steps.back() != step) steps.push_back(step);
  }
  return out;
}

std::vector<KvTraceAccess> KvTraceAccesses(const KvTrace& trace) {
  std::vector<KvTraceAccess> out;
  std::unordered_map<int64_t, std::vector<int64_t>> pages_of_request;
  int64_t step = 0;
  for (const KvTraceEvent& ev : trace.events) {
    switch (ev.kind) {
      case KvTraceEvent::Kind::kStep:
        step = ev.step;
        break;
      case KvTraceEvent::Kind::kPage:
        pages_of_request[ev.request].push_back(ev.page);
        break;
      case KvTraceEvent::Kind::kRead: {
        const std::vector<int64_t>& pages = pages_of_request[ev.request];
        for (int64_t b = 0; b < ev.block; ++b) {
          out.push_back({step, pages[static_cast<size_t>(b)], ev.request, b, ev.block, b >= ev.from,
                         ev.steps_left});
        }
        break;
      }
      case KvTraceEvent::Kind::kLeave:
      case KvTraceEvent::Kind::kBack:
        break;
    }
  }
  return out;
}

std::string_view KvReplayPolicyName(KvReplayPolicy policy) {
  switch (policy) {
    case KvReplayPolicy::kPolicy:
      return "policy";
    case KvReplayPolicy::kLru:
      return "lru";
    case KvReplayPolicy::kLfu:
      return "lfu";
    case KvReplayPolicy::kBelady:
      return "belady";
  }
  return "?";
}

KvReplayResult ReplayKvTrace(const KvTrace& trace, std::span<const KvTraceAccess> accesses,
                             KvReplayPolicy policy, const KvReplayOptions& options) {
  KvReplayResult r;
  r.policy = std::string(KvReplayPolicyName(policy));
  r.capacity_pages = options.capacity_pages;
  std::vector<ReplayPage> pages(static_cast<size_t>(trace.num_pages));
  // Belady: for each access, the index of the next access of the same page.
  std::vector<int64_t> next_use;
  if (policy == KvReplayPolicy::kBelady) {
    next_use.assign(accesses.size(), kNever);
    std::vector<int64_t> next_of_page(pages.size(), kNever);
    for (size_t i = accesses.size(); i-- > 0;) {
      const size_t p = static_cast<size_t>(accesses[i].page);
      next_use[i] = next_of_page[p];
      next_of_page[p] = static_cast<int64_t>(i);
    }
  }
  std::vector<int64_t> resident;  // page ids; pages[p].slot is the index here
  resident.reserve(static_cast<size_t>(std::max<int64_t>(0, options.capacity_pages)));

  ForecastState forecast(&pages, KvTracePreemptions(trace));

  // The engine's choice: the page its forecast says leaves first. Every resident page is a
  // candidate (the sinks and the recent window are read at their sequence's next step like its
  // other pages, and the forecast says so), unless the options pin them as the engine does.
  const bool pins = options.pinned_sink_blocks > 0 || options.pinned_recent_blocks > 0;
  auto pinned = [&](size_t i) {
    return pins &&
           forecast.Pinned(resident[i], options.pinned_sink_blocks, options.pinned_recent_blocks);
  };
  auto forecast_victim = [&](const KvTraceAccess& now) -> size_t {
    bool any_movable = !pins;
    for (size_t i = 0; !any_movable && i < resident.size(); ++i) any_movable = !pinned(i);
    size_t best = resident.size();
    KvReuseForecast best_forecast;
    for (size_t i = 0; i < resident.size(); ++i) {
      if (any_movable && pinned(i)) continue;
      const KvReuseForecast f = forecast.Forecast(resident[i], now);
      if (best == resident.size() || KvPageLeavesFirst(f, best_forecast)) {
        best = i;
        best_forecast = f;
      }
    }
    return best;
  };

  // The resident page that leaves to make room, chosen by the policy.
  auto victim = [&](const KvTraceAccess& now) -> size_t {
    if (policy == KvReplayPolicy::kPolicy) return forecast_victim(now);
    size_t best = 0;
    auto worse = [&](const ReplayPage& a, const ReplayPage& b) {  // a leaves before b
      switch (policy) {
        case KvReplayPolicy::kLru:
          return a.last_tick < b.last_tick;
        case KvReplayPolicy::kLfu:
          return a.reads != b.reads ? a.reads < b.reads : a.last_tick < b.last_tick;
        case KvReplayPolicy::kBelady:
          return a.next_use > b.next_use;
        case KvReplayPolicy::kPolicy:
          break;
      }
      return false;
    };
    for (size_t i = 1; i < resident.size(); ++i) {
      if (worse(pages[static_cast<size_t>(resident[i])],
                pages[static_cast<size_t>(resident[best])])) {
        best = i;
      }
    }
    return best;
  };

  // The pool's blocks that hold a partial page at each step: one per request reading in it.
  std::unordered_map<int64_t, int64_t> readers_in_step;
  if (options.partial_pages_per_reader > 0) {
    for (size_t i = 0; i < accesses.size(); ++i) {
      if (i == 0 || accesses[i].request != accesses[i - 1].request ||
          accesses[i].step != accesses[i - 1].step) {
        ++readers_in_step[accesses[i].step];
      }
    }
  }
  auto evict = [&](const KvTraceAccess& now) {
    const size_t v = victim(now);
    const int64_t evicted = resident[v];
    resident[v] = resident.back();  // the last one takes its place
    pages[static_cast<size_t>(resident[v])].slot = static_cast<int64_t>(v);
    resident.pop_back();
    pages[static_cast<size_t>(evicted)].slot = -1;
  };
  int64_t capacity = options.capacity_pages;
  int64_t step = -1;
  for (size_t i = 0; i < accesses.size(); ++i) {
    const KvTraceAccess& a = accesses[i];
    ReplayPage& page = pages[static_cast<size_t>(a.page)];
    if (policy == KvReplayPolicy::kPolicy) forecast.Begin(accesses, static_cast<int64_t>(i));
    if (a.step != step && options.partial_pages_per_reader > 0 && options.capacity_pages > 0) {
      // The step's partial pages take their blocks first.
      step = a.step;
      capacity = std::max<int64_t>(
          1, options.capacity_pages - options.partial_pages_per_reader * readers_in_step[step]);
      while (static_cast<int64_t>(resident.size()) > capacity) evict(a);
    }
    ++r.accesses;
    if (page.slot >= 0) {
      ++r.hits;
    } else {
      if (page.seen) {
        ++r.misses;
      } else {
        ++r.cold;
      }
      if (capacity > 0) {
        if (static_cast<int64_t>(resident.size()) >= capacity) evict(a);
        page.slot = static_cast<int64_t>(resident.size());
        resident.push_back(a.page);
      }
    }
    page.seen = true;
    ++page.reads;
    page.last_step = a.step;
    page.last_tick = static_cast<int64_t>(i);
    page.block = a.block;
    if (!next_use.empty()) page.next_use = next_use[i];
  }
  r.cost_ms = static_cast<double>(r.misses) * options.miss_ms;
  return r;
}

KvRecordedResult ReplayRecordedDecisions(const KvTrace& trace, double miss_ms) {
  // What the engine did is in the reads themselves: a block whose tokens a step computed again
  // was missing (its page gone, or the prefix chain to it broken); a block read from outside the
  // pool was streamed from a tier or rebuilt; an evicted one was lost; any other was in the pool.
  KvRecordedResult out;
  KvReplayResult& r = out.replay;
  r.policy = "recorded";
  r.capacity_pages = trace.header.pool_blocks;
  std::vector<bool> seen(static_cast<size_t>(trace.num_pages), false);
  std::unordered_map<int64_t, std::vector<int64_t>> pages_of_request;
  for (const KvTraceEvent& ev : trace.events) {
    switch (ev.kind) {
      case KvTraceEvent::Kind::kStep:
      case KvTraceEvent::Kind::kLeave:
        break;
      case KvTraceEvent::Kind::kPage:
        pages_of_request[ev.request].push_back(ev.page);
        break;
      case KvTraceEvent::Kind::kBack:
        ++out.brought_back;
        ++r.misses;
        break;
      case KvTraceEvent::Kind::kRead: {
        const std::vector<int64_t>& ids = pages_of_request[ev.request];
        size_t next_outside = 0, next_evicted = 0;  // the lists are ascending
        for (int64_t b = 0; b < ev.block; ++b) {
          const size_t p = static_cast<size_t>(ids[static_cast<size_t>(b)]);
          const bool outside = next_outside < ev.outside.size() && ev.outside[next_outside] == b;
          const bool evicted = next_evicted < ev.evicted.size() && ev.evicted[next_evicted] == b;
          next_outside += outside;
          next_evicted += evicted;
          ++r.accesses;
          if (!seen[p]) {
            ++r.cold;
          } else if (b >= ev.from) {
            ++r.misses;
            ++out.recomputed;
          } else if (outside) {
            ++r.misses;
            ++out.streamed_reads;
          } else if (evicted) {
            ++out.lost_reads;
          } else {
            ++r.hits;
          }
          seen[p] = true;
        }
        break;
      }
    }
  }
  r.cost_ms = static_cast<double>(r.misses) * miss_ms;
  return out;
}

}  // namespace kvl
