// What the engine counts, written by the step loop and read by Metrics() from any thread.
// Thread-safety: every method takes the recorder's mutex.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvl/engine.h"
#include "kvl/kv_memory.h"  // KvSequencePages, KvPageFate, KvStats
#include "prediction_error.h"
#include "request.h"

namespace kvl {

// A bounded window of recent samples for percentiles (allocated once, up front).
class SampleWindow {
 public:
  SampleWindow() { values_.reserve(kCapacity); }
  void Add(double v);
  double Mean() const;
  double Percentile(double p) const;

 private:
  static constexpr size_t kCapacity = 4096;
  std::vector<double> values_;
  size_t next_ = 0;
};

class MetricsRecorder {
 public:
  // One page that took `action` (bytes: its K/V).
  void CountPageAction(KvAction action, int64_t bytes);
  // Pages brought back after a preemption: what the cost model predicted and what it took.
  void CountRestored(KvAction action, double predicted_ms, double measured_ms);
  // One decode step's `pages` rebuilt from checkpoints inside it: each page's predicted and
  // measured marginal time there (InStepRebuildMeter).
  void CountRebuiltInStep(int64_t pages, double predicted_page_ms, double measured_page_ms);
  // A page recomputed from its tokens in a step that also carried decode rows.
  void CountRecomputedBesideDecode();
  // One block promoted from the KV store's tier `tier_index` (KvStore::TierIndex).
  void CountPromoted(int64_t tier_index, double predicted_ms, double measured_ms);
  // The prediction error of the promotions from one store tier.
  KvPredictionError PromotionError(int64_t tier_index) const;
  // A tier read failed its checksum or I/O; `pages` are recomputed from their tokens instead.
  void CountReadFailure(int64_t pages);
  void CountPreemption();
  void CountFinished();
  // A token sampled for `seq` at `now`: time to first token or inter-token latency.
  void CountTokenLatency(const Sequence& seq, Clock::time_point now);
  // A token appended to its sequence (not an end-of-sequence or stop token).
  void CountGenerated();
  // Speculative decoding (issue 26): one sequence's step that sampled, carrying `drafted` draft
  // tokens of which `accepted` were verified (0, 0: a plain step).
  void CountSpecStep(int64_t drafted, int64_t accepted);
  void CountStep(int64_t batch_tokens, int64_t batch_seqs, int64_t prefill_tokens);
  // Gauges, after each step.
  void SetGauges(const KvStats& kv, const KvPagerStats& pager, int64_t running, int64_t waiting);
  // The window rings' bytes and rebuilds (kvl/kv_window_release.h), beside SetGauges.
  void SetWindowGauges(const KvWindowStats& window);

  // Room for the page maps of `max_seqs` running sequences of up to `max_pages` pages (of
  // `block_tokens` tokens) each, so that SetPageMaps allocates nothing in the steady step.
  void ReservePageMaps(int32_t max_seqs, int64_t max_pages, int64_t block_tokens);
  // Where each running sequence's pages live, after each step (in admission order). The maps of
  // sequences no longer running are kept as the ended ones.
  void SetPageMaps(std::span<const std::unique_ptr<Sequence>> running);

  // Everything but requests_submitted (the engine's inbox counts those).
  void Snapshot(EngineMetrics* m) const;

 private:
  mutable std::mutex mutex_;
  std::array<KvActionCounter, kNumKvActions> action_counters_{};
  std::array<PredictionWindow, kNumKvActions> restore_predictions_;  // by KvAction
  std::vector<PredictionWindow> promote_predictions_;                // by store tier index
  KvActionCounter rebuilt_in_step_{};
  int64_t recomputed_beside_decode_ = 0;
  PredictionWindow rebuilt_in_step_predictions_;  // per page and step
  int64_t checksum_failures_ = 0;
  int64_t pages_recomputed_after_failure_ = 0;
  int64_t requests_finished_ = 0;
  int64_t preemptions_ = 0;
  int64_t num_steps_ = 0;
  int64_t tokens_prefilled_ = 0;
  int64_t tokens_generated_ = 0;
  int64_t spec_seq_steps_ = 0, spec_draft_steps_ = 0, spec_drafted_ = 0, spec_accepted_ = 0;
  int64_t batch_tokens_total_ = 0;
  int64_t batch_seqs_total_ = 0;
  int64_t last_batch_tokens_ = 0;
  int64_t last_batch_seqs_ = 0;
  SampleWindow ttft_ms_;
  SampleWindow itl_ms_;
  KvStats kv_stats_;
  KvPagerStats pager_stats_;
  KvWindowStats window_stats_;
  int64_t num_running_ = 0;
  int64_t num_waiting_ = 0;
  std::vector<KvSequencePageMap> page_maps_;  // reserved; the first num_page_maps_ are current
  size_t num_page_maps_ = 0;
  int64_t block_tokens_ = 1;
  std::vector<KvSequencePageMap> ended_maps_;  // a ring of kKvEndedPageMaps, reserved
  size_t ended_next_ = 0;                      // the slot the next ended map takes
  size_t num_ended_maps_ = 0;
};

}  // namespace kvl
