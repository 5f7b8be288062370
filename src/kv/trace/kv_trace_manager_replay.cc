// A page-access trace replayed through the engine's own KV manager (kvl/kv_trace_replay.h,
// ReplayKvTraceThroughManager): the prefix cache's eviction is the engine's code, not a model of
// it.
#include <algorithm>
#include <unordered_map>

#include "kvl/kv_manager.h"
#include "kvl/kv_trace_replay.h"

namespace kvl {
namespace {

// One request's read in one step: blocks [0, count) of it, pages[b] each.
struct StepRead {
  int64_t request = 0;
  std::span<const KvTraceAccess> blocks;
};

// Where a request stands in the manager: its slot and how many of its blocks are full there, and
// the tokens in its partial last block.
struct Held {
  SeqId slot = 0;
  int64_t full_blocks = 0;
  int64_t partial_tokens = 0;
  int64_t last_step = 0;  // the step of its last read
};

// The synthetic tokens of a replay: every token of page p is p, so that two requests share a
// prefix of blocks exactly where the trace says they share pages (equal content ids).
class ReplayTokens {
 public:
  ReplayTokens(std::span<const KvTraceAccess> accesses, int64_t block_tokens)
      : block_tokens_(block_tokens) {
    for (const KvTraceAccess& a : accesses) {
      std::vector<int64_t>& pages = pages_[a.request];
      if (static_cast<int64_t>(pages.size()) <= a.block) {
        pages.resize(static_cast<size_t>(a.block) + 1, kUnknown);
      }
      pages[static_cast<size_t>(a.block)] = a.page;
    }
  }

  // Token `i` of block `block` of `request` (the partial block's tokens are those of the page it
  // becomes, where the trace shows it full later; a page it never becomes is no one's).
  int32_t Token(int64_t request, int64_t block) const {
    const std::vector<int64_t>& pages = pages_.at(request);
    const int64_t page =
        block < static_cast<int64_t>(pages.size()) ? pages[static_cast<size_t>(block)] : kUnknown;
    return static_cast<int32_t>(page);
  }

  // Appends to `out` the tokens that take `request` from `from_tokens` tokens to `to_tokens`.
  void Append(int64_t request, int64_t from_tokens, int64_t to_tokens,
              std::vector<int32_t>* out) const {
    for (int64_t t = from_tokens; t < to_tokens; ++t) out->push_back(Token(request, t / block_tokens_));
  }

 private:
  static constexpr int64_t kUnknown = -1;
  int64_t block_tokens_;
  std::unordered_map<int64_t, std::vector<int64_t>> pages_;
};

}  // namespace

KvManagerReplayResult ReplayKvTraceThroughManager(const KvTrace& trace,
                                                   std::span<const KvTraceAccess> accesses,
                                                   KvIdleBlockOrder order, int64_t capacity_pages,
                                                   double miss_ms) {
  KvManagerReplayResult out;
  KvReplayResult& r = out.replay;
  r.policy = order == KvIdleBlockOrder::kForecast ? "engine" : "engine-lrf";
  r.capacity_pages = capacity_pages;
  const int64_t bt = std::max<int64_t>(1, trace.header.block_tokens);
  KvManagerOptions options;
  options.layout.block_tokens = static_cast<int32_t>(bt);
  options.layout.num_layers = 1;
  options.layout.kv_dim = 1;
  options.budget_bytes = capacity_pages * options.layout.block_bytes();
  options.idle_block_order = order;
  options.max_seqs = 1024;
  StatusOr<std::unique_ptr<KvManager>> made = KvManager::Create(options);
  if (!made.ok()) {
    out.fits = false;
    return out;
  }
  KvManager& manager = **made;
  const ReplayTokens tokens(accesses, bt);
  const std::unordered_map<int64_t, std::vector<int64_t>> preempted = KvTracePreemptions(trace);
  // Whether the engine preempted `request` after its read at `since`, up to the step begun: it
  // resumes, as the engine tells its manager.
  auto preempted_since = [&](int64_t request, int64_t since, int64_t now) {
    const auto it = preempted.find(request);
    if (it == preempted.end()) return false;
    const auto after = std::upper_bound(it->second.begin(), it->second.end(), since);
    return after != it->second.end() && *after <= now;
  };

  std::unordered_map<int64_t, Held> held;  // requests in the manager
  std::vector<SeqId> free_slots;
  for (SeqId s = options.max_seqs; s-- > 0;) free_slots.push_back(s);
  // The step each page was first read in (-1: not yet).
  std::vector<int64_t> first_read(static_cast<size_t>(trace.num_pages), -1);
  int64_t step = -1;
  std::vector<StepRead> reads;
  std::vector<std::vector<int32_t>> step_tokens;
  std::vector<KvSeqStep> steps;
  std::vector<int64_t> step_request;  // [steps]: whose
  std::vector<KvSeqStep> admitted;    // the admissions of the group being planned
  KvPlan plan;

  auto release = [&](int64_t request, bool resumes) {
    const auto it = held.find(request);
    manager.Free(it->second.slot, resumes);
    free_slots.push_back(it->second.slot);
    held.erase(it);
  };
  // Counts one read of block `b` (page `page`): a hit where it was in the pool, cold where no
  // policy could have had it, else a miss. A page first read in this very step by another request
  // is cold too: two requests admitted together compute their common pages in the same step
  // (neither finds the other's), whatever the eviction order.
  auto count = [&](int64_t page, bool in_pool, bool at_admission) {
    ++r.accesses;
    int64_t& first = first_read[static_cast<size_t>(page)];
    if (first < 0) first = step;
    const bool was_seen = first < step;
    if (at_admission && was_seen) {
      ++out.reuse_reads;
      out.reuse_hits += in_pool;
    }
    if (in_pool) {
      ++r.hits;
    } else if (was_seen) {
      ++r.misses;
    } else {
      ++r.cold;
    }
  };

  for (size_t i = 0; i < accesses.size();) {
    // The step's reads, one per request.
    step = accesses[i].step;
    reads.clear();
    while (i < accesses.size() && accesses[i].step == step) {
      size_t end = i;
      while (end < accesses.size() && accesses[end].step == step &&
             accesses[end].request == accesses[i].request) {
        ++end;
      }
      reads.push_back({accesses[i].request, accesses.subspan(i, end - i)});
      i = end;
    }
    // A request the step does not read finished or waits: its blocks go (as the engine frees a
    // finished or preempted sequence), its full ones cached.
    for (auto it = held.begin(); it != held.end();) {
      const int64_t request = it->first;
      const int64_t last_step = it->second.last_step;
      ++it;
      const bool reads_now = std::any_of(reads.begin(), reads.end(),
                                         [&](const StepRead& x) { return x.request == request; });
      if (!reads_now) release(request, preempted_since(request, last_step, step));
    }
    steps.clear();
    step_request.clear();
    step_tokens.resize(std::max(step_tokens.size(), reads.size()));
    for (const StepRead& read : reads) {
      const int64_t blocks = static_cast<int64_t>(read.blocks.size());
      auto it = held.find(read.request);
      // Fewer blocks than it held (a session continued only as far as it agrees), or more that
      // were read before (a resumed sequence recomputed in chunks, whose later pages may still
      // be cached): admitted again, so its prefix is looked up as an admission's is.
      if (it != held.end()) {
        const int64_t have = it->second.full_blocks;
        const bool seen_ahead = std::any_of(
            read.blocks.begin() + std::min(have, blocks), read.blocks.end(),
            [&](const KvTraceAccess& a) {
              const int64_t first = first_read[static_cast<size_t>(a.page)];
              return first >= 0 && first < step;
            });
        if (blocks < have || seen_ahead) {
          release(read.request, /*resumes=*/true);  // admitted again at once
          it = held.end();
        }
      }
      std::vector<int32_t>& toks = step_tokens[steps.size()];
      toks.clear();
      KvSeqStep s;
      if (it == held.end()) {
        if (free_slots.empty()) {
          out.fits = false;
          return out;
        }
        // Admission: its full pages and the first token of the next (the last token is always
        // computed, so every full page may be found cached).
        s.seq = free_slots.back();
        free_slots.pop_back();
        tokens.Append(read.request, 0, blocks * bt + 1, &toks);
      } else {
        const Held& h = it->second;
        s.seq = h.slot;
        const int64_t have = h.full_blocks * bt + h.partial_tokens;
        // A decode step appends one token; a step that fills pages appends up to the first token
        // of the page after them. A partial page one token short of full waits for the step
        // that shows it full.
        const int64_t want = blocks > h.full_blocks ? blocks * bt + 1
                                                    : std::min(have + 1, (blocks + 1) * bt - 1);
        tokens.Append(read.request, have, want, &toks);
        if (toks.empty()) {
          // Nothing to add: its reads are of pages it holds.
          for (const KvTraceAccess& a : read.blocks) count(a.page, true, false);
          it->second.last_step = step;
          continue;
        }
      }
      s.tokens = toks;
      steps.push_back(s);
      step_request.push_back(read.request);
    }
    // The step in groups, as the engine's scheduler admits them: an admission that would compute
    // a page another admission of the step computes waits a step (with the admissions after it)
    // and finds it cached (KvManager::SharesPagesComputedInStep); the trace, recorded before
    // the scheduler waited so, shows them in one step.
    for (size_t first = 0; first < steps.size();) {
      size_t end = first;
      admitted.clear();
      for (; end < steps.size(); ++end) {
        if (held.count(step_request[end])) continue;  // running
        if (manager.SharesPagesComputedInStep(steps[end].tokens, admitted)) break;
        admitted.push_back(steps[end]);
      }
      const std::span<const KvSeqStep> group(steps.data() + first, end - first);
      manager.Plan(group, &plan);
      if (!plan.fits) {
        out.fits = false;  // the running requests need more blocks than the capacity
        return out;
      }
      // What each read found, before the plan's blocks are taken.
      for (size_t k = 0; k < group.size(); ++k) {
        const KvPlan::SeqPlan& sp = plan.seqs[k];
        const int64_t request = step_request[first + k];
        const StepRead& read = *std::find_if(
            reads.begin(), reads.end(), [&](const StepRead& x) { return x.request == request; });
        const auto it = held.find(request);
        const int64_t in_pool =
            sp.admit ? static_cast<int64_t>(sp.reused.size()) : it->second.full_blocks;
        for (const KvTraceAccess& a : read.blocks) count(a.page, a.block < in_pool, sp.admit);
      }
      manager.Commit(plan);
      for (size_t k = 0; k < group.size(); ++k) {
        const KvPlan::SeqPlan& sp = plan.seqs[k];
        const int64_t request = step_request[first + k];
        if (sp.admit) held[request] = Held{sp.seq, 0, 0};
        Held& h = held[request];
        h.last_step = step;
        const int64_t n = manager.num_tokens(sp.seq);
        h.full_blocks = n / bt;
        h.partial_tokens = n % bt;
      }
      first = end;
    }
  }
  r.cost_ms = static_cast<double>(r.misses) * miss_ms;
  return out;
}

}  // namespace kvl
