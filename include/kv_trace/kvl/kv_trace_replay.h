// Offline replay of a KV page-access trace (kvl/kv_trace.h): the trace's page reads run through
// a resident set of N pages under an eviction policy, each miss priced as bringing the page back,
// so that the engine's reuse forecast (kvl/kv_reuse_forecast.h) can be compared with LRU, LFU and
// Belady's optimal (which knows the future) on the same accesses, and the engine's own recorded
// decisions priced the same way.
//
// The model: a read of a resident page is a hit; the first read of a page anywhere in the trace is
// cold (it is computed whatever the policy) and makes it resident; any other read of a page not
// resident is a miss, costs miss_ms, and makes it resident. When a page becomes resident in a full
// set, the policy's victim leaves. Accesses are sequential, in trace order.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvl/kv_trace.h"

namespace kvl {

// One page read, in trace order.
struct KvTraceAccess {
  int64_t step = 0;
  int64_t page = 0;
  int64_t request = 0;
  int64_t block = 0;        // its index in the request that read it
  int64_t read_blocks = 0;  // how many blocks that request read in this step
  bool computed = false;    // its tokens were computed in this step (block >= the read's from)
  int64_t steps_left = -1;  // the most steps its request may still take after this one; -1: unknown
};
std::vector<KvTraceAccess> KvTraceAccesses(const KvTrace& trace);
// The steps at which the engine preempted each request (the steps of its pages' L lines of cause
// preempt), ascending: [request] -> steps.
std::unordered_map<int64_t, std::vector<int64_t>> KvTracePreemptions(const KvTrace& trace);

enum class KvReplayPolicy { kPolicy, kLru, kLfu, kBelady };
std::string_view KvReplayPolicyName(KvReplayPolicy policy);

struct KvReplayOptions {
  int64_t capacity_pages = 0;  // the resident set
  double miss_ms = 0;          // the price of bringing one missed page back
  // Blocks of the set taken at each step by the partial page of each request reading in it (its
  // last page, being written, which the trace does not list): 1 to compare with the engine's
  // pool, which holds them; 0: every block holds a listed page.
  int64_t partial_pages_per_reader = 0;
  // The policy never chooses a running request's first `pinned_sink_blocks` pages or its newest
  // `pinned_recent_blocks` (unless nothing else is resident), as the engine's planner never moves
  // its sinks and recent window. 0 and 0: any page may leave.
  int64_t pinned_sink_blocks = 0;
  int64_t pinned_recent_blocks = 0;
};

struct KvReplayResult {
  std::string policy;
  int64_t capacity_pages = 0;
  int64_t accesses = 0;
  int64_t cold = 0;  // first reads of a page: computed once whatever the policy
  int64_t hits = 0;
  int64_t misses = 0;  // reads of a page seen before and not resident
  double cost_ms = 0;  // misses x miss_ms
};

// Replays the accesses through a resident set of options.capacity_pages pages. The victims:
//   policy: the engine's own reuse forecast and order (ForecastReuse, KvPageLeavesFirst), fed
//           only what the engine knew at that moment: which requests run and read each page, the
//           order they read in at their last step, the steps each may still take (the R lines'
//           <left>), which stopped requests were preempted (L lines of cause preempt: their
//           pages wait for the resume, read again at each step they have left), and the history
//           of idle pages read again (a request that stops reading leaves its pages idle unless
//           another running or waiting one holds them), kept apart for a conversation's pages (a
//           request whose first read began with a stopped request's whole chain continued it:
//           those pages, and the ones it writes, come back when the conversation does);
//   LRU: the least recently read; LFU: the fewest reads so far, resident or not (ties: the least
//        recent);
//   Belady: the page whose next read is farthest ahead (never read again first).
KvReplayResult ReplayKvTrace(const KvTrace& trace, std::span<const KvTraceAccess> accesses,
                             KvReplayPolicy policy, const KvReplayOptions& options);

// The trace's reads through the engine's own KvManager (kvl/kv_manager.h): its prefix cache, and
// its reuse of free cached blocks in `order` (the reuse forecast's, or least recently freed
// first), with a pool of `capacity_pages` blocks; no copy of either. Each request that reads in a
// step is a sequence of the manager (admitted at its first read, with its pages' tokens: every
// token of page p is p, so requests share a prefix exactly where the trace's content ids say);
// it grows one token a step, and by whole pages where the trace shows them full; one that a
// step does not read (finished, or preempted) is freed, its full pages cached (told that it
// resumes where the trace shows the engine preempted it), and admitted again when it reads. A read of a page the manager held (a block of the sequence, or found by
// prefix at its admission) is a hit; the first read of a page anywhere is cold; any other (a
// page computed again) is a miss. Running sequences' pages never leave the pool here (the
// engine's pager moves those, KvPressurePlanner's forecast order), so only the idle pages'
// eviction differs between orders: compare at capacities that hold the running sequences.
struct KvManagerReplayResult {
  KvReplayResult replay;    // policy "engine" (forecast order) or "engine-lrf"
  bool fits = true;         // false: a step's sequences needed more blocks than the pool had
  int64_t reuse_reads = 0;  // reads at an admission of pages seen before: where reuse can hit
  int64_t reuse_hits = 0;   // of those, the pages found cached
};
KvManagerReplayResult ReplayKvTraceThroughManager(const KvTrace& trace,
                                                   std::span<const KvTraceAccess> accesses,
                                                   KvIdleBlockOrder order, int64_t capacity_pages,
                                                   double miss_ms);

// What the engine's own decisions cost, at its own pool size, priced as the simulated policies'
// misses are, read from what it did: every page it brought back (B) is a miss; so is a page whose
// tokens a step computed again after it had been seen (it had left, or the prefix chain to it was
// broken); so is every read of a page from outside the pool (streamed from a tier, read in place
// there, or rebuilt from checkpoints). Any other read is a hit: the page was in the pool
// (compressed pages included). Reads of evicted pages are not misses (the engine lost them) and
// are counted apart.
struct KvRecordedResult {
  KvReplayResult replay;       // policy "recorded", capacity_pages = the header's pool_blocks
  int64_t brought_back = 0;    // of the misses: B events
  int64_t streamed_reads = 0;  // of the misses: reads from outside the pool
  int64_t recomputed = 0;      // of the misses: pages computed again after they were seen
  int64_t lost_reads = 0;      // reads of evicted pages
};
KvRecordedResult ReplayRecordedDecisions(const KvTrace& trace, double miss_ms);

}  // namespace kvl
