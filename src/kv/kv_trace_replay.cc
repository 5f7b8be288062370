#include "kvl/kv_trace_replay.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "kvl/kv_policy.h"

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
  int64_t read_steps = 0;     // steps it was read in
  int64_t next_use = kNever;  // the access that reads it next (Belady)
  int64_t block = 0;          // its index in the request that last read it ...
  int64_t read_blocks = 0;    // ... which read this many blocks then
};

// The engine's reuse score of a page now, from its replayed history.
double ReuseScore(const ReplayPage& p, int64_t now_step, const KvReplayOptions& o,
                  int64_t block_tokens) {
  PageHistory h;
  h.first_position = p.block * block_tokens;
  h.steps_since_access = now_step - p.last_step;
  h.accesses = p.read_steps;
  // The sinks and the recent window of a sequence that is running (read in this step or the
  // last) are kept, as the engine's planner never acts on them.
  const bool running = p.last_step >= now_step - 1;
  h.is_sink = running && p.block < o.sink_blocks;
  h.in_recent_window = running && p.block >= p.read_blocks - o.recent_blocks;
  return ReuseProbability(h);
}

}  // namespace

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
          out.push_back(
              {step, pages[static_cast<size_t>(b)], ev.request, b, ev.block, b >= ev.from});
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
    case KvReplayPolicy::kReuseScore:
      return "reuse-score";
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

  // The resident page that leaves to make room, chosen by the policy.
  auto victim = [&](int64_t now_step) -> size_t {
    size_t best = 0;
    auto worse = [&](const ReplayPage& a, const ReplayPage& b) {  // a leaves before b
      switch (policy) {
        case KvReplayPolicy::kLru:
          return a.last_tick < b.last_tick;
        case KvReplayPolicy::kLfu:
          return a.reads != b.reads ? a.reads < b.reads : a.last_tick < b.last_tick;
        case KvReplayPolicy::kBelady:
          return a.next_use > b.next_use;
        case KvReplayPolicy::kReuseScore: {
          const double sa = ReuseScore(a, now_step, options, trace.header.block_tokens);
          const double sb = ReuseScore(b, now_step, options, trace.header.block_tokens);
          return sa != sb ? sa < sb : a.last_tick < b.last_tick;
        }
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

  for (size_t i = 0; i < accesses.size(); ++i) {
    const KvTraceAccess& a = accesses[i];
    ReplayPage& page = pages[static_cast<size_t>(a.page)];
    ++r.accesses;
    if (page.slot >= 0) {
      ++r.hits;
    } else {
      if (page.seen) {
        ++r.misses;
      } else {
        ++r.cold;
      }
      if (options.capacity_pages > 0) {
        if (static_cast<int64_t>(resident.size()) >= options.capacity_pages) {
          const size_t v = victim(a.step);
          const int64_t evicted = resident[v];
          resident[v] = resident.back();  // the last one takes its place
          pages[static_cast<size_t>(resident[v])].slot = static_cast<int64_t>(v);
          resident.pop_back();
          pages[static_cast<size_t>(evicted)].slot = -1;
        }
        page.slot = static_cast<int64_t>(resident.size());
        resident.push_back(a.page);
      }
    }
    page.seen = true;
    ++page.reads;
    if (page.last_step != a.step) ++page.read_steps;
    page.last_step = a.step;
    page.last_tick = static_cast<int64_t>(i);
    page.block = a.block;
    page.read_blocks = a.read_blocks;
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
