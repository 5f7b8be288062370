// A scheduler on a model-free pool, for the scheduler's tests: no GGUF, no forward pass, no
// tokenizer, no sampler. Its Step commits each plan through the real KvMemory door, marks the
// planned tokens computed and appends a fixed token to every sequence that finished its step, so
// what is checked is only the scheduling.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "kvl/kv_tier.h"

namespace kvl {
namespace testing_scheduler {

constexpr int32_t kBlock = 4;
constexpr int32_t kNextToken = 7;

inline std::vector<int32_t> Tokens(int32_t first, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

inline int64_t Pages(const EngineMetrics& m, KvAction action) {
  return m.kv_actions[static_cast<size_t>(action)].pages;
}

struct PoolSetup {
  int64_t num_blocks = 32;
  int64_t max_batch_tokens = 8;
  int32_t max_seqs = 4;
  std::string policy = "auto";
  std::string quality = "lossless";
  bool ram_tier = false;
  bool ram_zstd = false;  // compressed: pages streamed from it are staged, not read in place
  int64_t recent_tokens = 0;
  int64_t sink_tokens = 0;
  int64_t staged_pages = 16;  // pages streamed from the tier at once
  int64_t ram_tier_bytes = 64 << 20;
  // A disk tier too, where the path is not empty (a scratch file, removed with the tier).
  std::string disk_tier_path;
  int64_t disk_tier_bytes = 0;
  bool keep_lossy_sessions = false;
  const std::atomic<bool>* interrupt = nullptr;  // SchedulerOptions::interrupt
};

// The test's prices: RAM reads at 10 GB/s, a page recomputed from its tokens in 1 ms.
class FixedPrices final : public KvPriceSource {
 public:
  Status PagePrices(const Query&, PageCostProfile* prices) override {
    prices->ram_gbps = 10;
    prices->recompute_tokens_ms = 1;
    return Status::Ok();
  }
  Status PriceRemoteTier(const TierSpec&, int64_t, int64_t, PageCostProfile*) override {
    return UnimplementedError("no remote tier here");
  }
};

class SchedulerHarness {
 public:
  explicit SchedulerHarness(const PoolSetup& s) {
    KvMemoryOptions o;
    o.block_tokens = kBlock;
    o.num_layers = 2;
    o.kv_dim = 4;
    o.dim = 64;  // wider than K+V: no residual checkpoints in the blocks
    o.context_length = 1024;
    o.max_seqs = s.max_seqs;
    o.pool_blocks = s.num_blocks;
    o.staged_pages = s.staged_pages;
    o.policy = ParseKvPolicy(s.policy).value();
    o.quality = ParseKvQuality(s.quality).value();
    if (s.ram_tier) {
      TierSpec ram;
      ram.kind = TierKind::kRam;
      ram.capacity_bytes = s.ram_tier_bytes;
      ram.compress = s.ram_zstd;
      o.tiers.push_back(ram);
    }
    if (!s.disk_tier_path.empty()) {
      TierSpec disk;
      disk.kind = TierKind::kDisk;
      disk.path = s.disk_tier_path;
      disk.capacity_bytes = s.disk_tier_bytes;
      disk.persistent = false;
      o.tiers.push_back(disk);
    }
    o.sink_tokens = s.sink_tokens;
    o.recent_tokens = s.recent_tokens;
    FixedPrices prices;
    StatusOr<std::unique_ptr<KvMemory>> memory = KvMemory::Create(o, &prices);
    if (!memory.ok()) {
      create_error_ = memory.status();
      return;
    }
    memory_ = std::move(memory).value();
    SchedulerOptions so;
    so.max_batch_tokens = s.max_batch_tokens;
    so.max_seqs = s.max_seqs;
    so.keep_lossy_sessions = s.keep_lossy_sessions;
    so.context_length = o.context_length;
    so.interrupt = s.interrupt;
    scheduler_ = std::make_unique<Scheduler>(so, *memory_, metrics_);
  }

  // Why the pool could not be made (a combination KvMemory refuses); ok otherwise.
  const Status& create_error() const { return create_error_; }

  // A request for `prompt` that generates `max_new` tokens; its events are kept by id.
  RequestId Submit(std::vector<int32_t> prompt, int32_t max_new,
                   std::optional<KvQuality> kv_quality = std::nullopt) {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_id_++;
    seq->tokens = std::move(prompt);
    seq->tokens.reserve(1024);
    seq->num_prompt = static_cast<int64_t>(seq->tokens.size());
    seq->request.max_new_tokens = max_new;
    if (kv_quality) seq->kv_quality = *kv_quality;
    const RequestId id = seq->id;
    seq->on_event = [this](const TokenEvent& e) {
      if (e.finished) finished_[e.request] = e;
    };
    scheduler_->Enqueue(std::move(seq));
    return id;
  }

  void Cancel(RequestId id) { scheduler_->Cancel({id}); }

  // Plans a step and carries it out the way StepRunner does, minus the model. False when idle.
  bool Step() {
    scheduler_->ReleaseFinished();
    if (!scheduler_->Schedule(&plan_)) return false;
    last_steps_.clear();
    for (size_t i = 0; i < plan_.seqs.size(); ++i) {
      last_steps_.push_back({plan_.seqs[i]->id, static_cast<int64_t>(plan_.steps[i].tokens.size()),
                             plan_.kv.seqs[i].admit});
    }
    // The KV step StepRunner opens and closes, through the real door: blocks, admissions, store
    // pages read in place, restores and settling are KvMemory::Open's; no forward run.
    kv_seqs_.clear();
    for (Sequence* seq : plan_.seqs) {
      kv_seqs_.push_back({&seq->kv_pages, seq->id, -1, seq->num_computed, &seq->finished});
    }
    KvStep& step = memory_->Open(plan_.kv, kv_seqs_);
    restored_pages_ += static_cast<int64_t>(step.applied().brought_back.size());
    for (size_t i = 0; i < plan_.seqs.size(); ++i) {
      Sequence& seq = *plan_.seqs[i];
      const KvPlan::SeqPlan& sp = plan_.kv.seqs[i];
      const int64_t n = static_cast<int64_t>(plan_.steps[i].tokens.size());
      if (sp.admit) in_place_pages_ += sp.in_place_blocks;
      seq.num_computed = sp.admit ? n : seq.num_computed + n;
      if (seq.num_computed != static_cast<int64_t>(seq.tokens.size())) continue;
      if (seq.num_generated == seq.request.max_new_tokens) {
        scheduler_->Finish(seq, FinishReason::kLength);
        continue;
      }
      seq.tokens.push_back(kNextToken);
      ++seq.num_generated;
    }
    step.Close({});
    scheduler_->ReleaseFinished();
    return true;
  }

  void RunUntilIdle(int max_steps = 10000) {
    for (int i = 0; i < max_steps && Step(); ++i) {
    }
  }

  struct PlannedStep {
    RequestId id;
    int64_t tokens;
    bool admit;
    bool operator==(const PlannedStep&) const = default;
  };
  const std::vector<PlannedStep>& last_steps() const { return last_steps_; }
  const std::map<RequestId, TokenEvent>& finished() const { return finished_; }
  int64_t restored_pages() const { return restored_pages_; }
  int64_t in_place_pages() const { return in_place_pages_; }
  Scheduler& scheduler() { return *scheduler_; }
  const KvManager& kv() { return memory_->view().manager(); }
  KvMemoryView memory() const { return memory_->view(); }
  EngineMetrics metrics() const {
    EngineMetrics m;
    metrics_.Snapshot(&m);
    return m;
  }

 private:
  std::unique_ptr<KvMemory> memory_;
  MetricsRecorder metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  StepPlan plan_;
  std::vector<KvStepRequest> kv_seqs_;
  RequestId next_id_ = 1;
  int64_t restored_pages_ = 0;
  int64_t in_place_pages_ = 0;
  std::vector<PlannedStep> last_steps_;
  Status create_error_;
  std::map<RequestId, TokenEvent> finished_;
};

}  // namespace testing_scheduler
}  // namespace kvl
