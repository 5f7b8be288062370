#include "metrics_recorder.h"

#include <algorithm>
#include <cmath>

namespace kvl {

void SampleWindow::Add(double v) {
  if (values_.size() < kCapacity) {
    values_.push_back(v);
  } else {
    values_[next_] = v;
    next_ = (next_ + 1) % kCapacity;
  }
}

double SampleWindow::Mean() const {
  if (values_.empty()) return 0;
  double sum = 0;
  for (double v : values_) sum += v;
  return sum / static_cast<double>(values_.size());
}

double SampleWindow::Percentile(double p) const {
  if (values_.empty()) return 0;
  std::vector<double> sorted = values_;
  std::sort(sorted.begin(), sorted.end());
  const size_t index =
      static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

void MetricsRecorder::CountPageAction(KvAction action, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  KvActionCounter& counter = action_counters_[static_cast<size_t>(action)];
  ++counter.pages;
  counter.bytes += bytes;
}

void MetricsRecorder::CountRestored(KvAction action, double predicted_ms, double measured_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  KvActionCounter& counter = action_counters_[static_cast<size_t>(action)];
  ++counter.pages_restored;
  counter.predicted_ms += predicted_ms;
  counter.measured_ms += measured_ms;
  restore_predictions_[static_cast<size_t>(action)].Add(predicted_ms, measured_ms);
}

void MetricsRecorder::CountRebuiltInStep(int64_t pages, double predicted_page_ms,
                                         double measured_page_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  rebuilt_in_step_.pages += pages;
  rebuilt_in_step_.pages_restored += pages;
  rebuilt_in_step_.predicted_ms += predicted_page_ms * static_cast<double>(pages);
  rebuilt_in_step_.measured_ms += measured_page_ms * static_cast<double>(pages);
  for (int64_t i = 0; i < pages; ++i) {
    rebuilt_in_step_predictions_.Add(predicted_page_ms, measured_page_ms);
  }
}

void MetricsRecorder::CountRecomputedBesideDecode() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++recomputed_beside_decode_;
}

void MetricsRecorder::CountPromoted(int64_t tier_index, double predicted_ms, double measured_ms) {
  if (tier_index < 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (promote_predictions_.size() <= static_cast<size_t>(tier_index)) {
    promote_predictions_.resize(static_cast<size_t>(tier_index) + 1);
  }
  promote_predictions_[static_cast<size_t>(tier_index)].Add(predicted_ms, measured_ms);
}

KvPredictionError MetricsRecorder::PromotionError(int64_t tier_index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (tier_index < 0 || static_cast<size_t>(tier_index) >= promote_predictions_.size()) return {};
  return promote_predictions_[static_cast<size_t>(tier_index)].Summary();
}

void MetricsRecorder::CountReadFailure(int64_t pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++checksum_failures_;
  pages_recomputed_after_failure_ += pages;
}

void MetricsRecorder::CountPreemption() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++preemptions_;
}

void MetricsRecorder::CountFinished() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_finished_;
}

void MetricsRecorder::CountTokenLatency(const Sequence& seq, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (seq.num_generated == 0) {
    ttft_ms_.Add(MillisecondsBetween(seq.submitted, now));
  } else {
    itl_ms_.Add(MillisecondsBetween(seq.last_token, now));
  }
}

void MetricsRecorder::CountGenerated() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++tokens_generated_;
}

void MetricsRecorder::CountSpecStep(int64_t drafted, int64_t accepted) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++spec_seq_steps_;
  if (drafted > 0) ++spec_draft_steps_;
  spec_drafted_ += drafted;
  spec_accepted_ += accepted;
}

void MetricsRecorder::CountStep(int64_t batch_tokens, int64_t batch_seqs, int64_t prefill_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++num_steps_;
  tokens_prefilled_ += prefill_tokens;
  last_batch_tokens_ = batch_tokens;
  last_batch_seqs_ = batch_seqs;
  batch_tokens_total_ += batch_tokens;
  batch_seqs_total_ += batch_seqs;
}

void MetricsRecorder::SetWindowGauges(const KvWindowStats& window) {
  std::lock_guard<std::mutex> lock(mutex_);
  window_stats_ = window;
}

void MetricsRecorder::SetGauges(const KvStats& kv, const KvPagerStats& pager, int64_t running,
                                int64_t waiting) {
  std::lock_guard<std::mutex> lock(mutex_);
  kv_stats_ = kv;
  pager_stats_ = pager;
  num_running_ = running;
  num_waiting_ = waiting;
}

void MetricsRecorder::ReservePageMaps(int32_t max_seqs, int64_t max_pages, int64_t block_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  block_tokens_ = std::max<int64_t>(block_tokens, 1);
  page_maps_.resize(static_cast<size_t>(max_seqs));
  ended_maps_.resize(kKvEndedPageMaps);
  for (KvSequencePageMap& map : page_maps_) map.pages.reserve(static_cast<size_t>(max_pages));
  for (KvSequencePageMap& map : ended_maps_) map.pages.reserve(static_cast<size_t>(max_pages));
}

namespace {

KvPageLocation LocationOf(const KvPage& page) {
  switch (page.fate) {
    case KvPageFate::kResident:
      return KvPageLocation::kPool;
    case KvPageFate::kCompressed:
      return KvPageLocation::kCompressed;
    case KvPageFate::kInTier: {
      if (page.tier == nullptr) return KvPageLocation::kRamTier;
      switch (page.tier->kind()) {
        case TierKind::kDisk:
          return KvPageLocation::kDiskTier;
        case TierKind::kRedis:
          return KvPageLocation::kRedisTier;
        case TierKind::kRam:
          return KvPageLocation::kRamTier;
      }
      return KvPageLocation::kRamTier;
    }
    case KvPageFate::kCheckpointed:
      return KvPageLocation::kCheckpointed;
    case KvPageFate::kEvicted:
      return KvPageLocation::kEvicted;
    case KvPageFate::kDropped:
      return KvPageLocation::kDropped;
  }
  return KvPageLocation::kPool;
}

}  // namespace

std::string_view KvPageLocationName(KvPageLocation location) {
  switch (location) {
    case KvPageLocation::kPool:
      return "pool";
    case KvPageLocation::kCompressed:
      return "compressed";
    case KvPageLocation::kRamTier:
      return "ram";
    case KvPageLocation::kDiskTier:
      return "disk";
    case KvPageLocation::kRedisTier:
      return "redis";
    case KvPageLocation::kCheckpointed:
      return "checkpointed";
    case KvPageLocation::kEvicted:
      return "evicted";
    case KvPageLocation::kDropped:
      return "dropped";
  }
  return "unknown";
}

void MetricsRecorder::SetPageMaps(std::span<const std::unique_ptr<Sequence>> running) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Maps of sequences that stopped running move to the ended ring, swapped (both reserved, so
  // nothing is allocated). The same sequences in the same order, the usual decode step, skip it.
  bool same = running.size() == num_page_maps_;
  for (size_t i = 0; same && i < num_page_maps_; ++i) {
    same = running[i]->id == page_maps_[i].request;
  }
  for (size_t i = 0; !same && i < num_page_maps_ && !ended_maps_.empty(); ++i) {
    const RequestId id = page_maps_[i].request;
    if (std::any_of(running.begin(), running.end(), [id](const auto& s) { return s->id == id; })) {
      continue;
    }
    std::swap(ended_maps_[ended_next_], page_maps_[i]);
    ended_next_ = (ended_next_ + 1) % ended_maps_.size();
    num_ended_maps_ = std::min(num_ended_maps_ + 1, ended_maps_.size());
  }
  // More sequences than reserved cannot run (max_seqs), but a map is never worth a crash.
  num_page_maps_ = std::min(running.size(), page_maps_.size());
  for (size_t i = 0; i < num_page_maps_; ++i) {
    const Sequence& seq = *running[i];
    KvSequencePageMap& map = page_maps_[i];
    map.request = seq.id;
    map.prompt_tokens = seq.num_prompt;
    map.tokens = static_cast<int64_t>(seq.tokens.size());
    map.cached_prompt_tokens = std::max<int64_t>(seq.cached_prompt_tokens, 0);
    map.pages.clear();  // keeps its capacity: no allocation below the reserved page count
    // The pager's table grows only as far as a page that left the pool: the pages past it that
    // hold computed K/V are in their pool blocks.
    const size_t computed_pages =
        static_cast<size_t>((seq.num_computed + block_tokens_ - 1) / block_tokens_);
    const std::vector<KvPage>& pages = seq.kv_pages.pages;
    for (size_t b = 0; b < std::max(computed_pages, pages.size()); ++b) {
      map.pages.push_back(b < pages.size() ? LocationOf(pages[b]) : KvPageLocation::kPool);
    }
  }
}

void MetricsRecorder::Snapshot(EngineMetrics* m) const {
  std::lock_guard<std::mutex> lock(mutex_);
  m->kv_sequences.assign(page_maps_.begin(),
                         page_maps_.begin() + static_cast<std::ptrdiff_t>(num_page_maps_));
  for (size_t i = 0; i < num_ended_maps_; ++i) {
    const size_t oldest = (ended_next_ + ended_maps_.size() - num_ended_maps_) % ended_maps_.size();
    m->kv_sequences_ended.push_back(ended_maps_[(oldest + i) % ended_maps_.size()]);
  }
  m->kv = kv_stats_;
  m->kv_rebuilt_in_step = rebuilt_in_step_;
  m->kv_recomputed_pages_beside_decode = recomputed_beside_decode_;
  m->kv_rebuilt_in_step.error = rebuilt_in_step_predictions_.Summary();
  m->kv_actions = action_counters_;
  for (size_t a = 0; a < m->kv_actions.size(); ++a) {
    m->kv_actions[a].error = restore_predictions_[a].Summary();
  }
  m->kv_checksum_failures = checksum_failures_;
  m->kv_pages_recomputed_after_failure = pages_recomputed_after_failure_;
  m->kv_pages_compressed = pager_stats_.compressed_pages;
  m->kv_pages_streamed = pager_stats_.streamed_pages;
  m->kv_pages_evicted = pager_stats_.evicted_pages;
  m->kv_pages_rebuilt = pager_stats_.rebuilt_pages;
  m->kv_pages_promoted_back = pager_stats_.promoted_back_pages;
  m->kv_layers_rebuilt = pager_stats_.layers_rebuilt;
  m->kv_layers_advanced = pager_stats_.layers_advanced;
  m->kv_rebuild_ms = pager_stats_.rebuild_ms;
  m->kv_compressed_bytes = pager_stats_.compressed_bytes;
  m->kv_stream_staging_bytes = pager_stats_.staging_bytes;
  m->kv_staging_capacity_pages = pager_stats_.staging_capacity_pages;
  // Staging is allocated once, before the first step, so the peak is the pool's plus staging.
  m->kv_resident_bytes_peak =
      kv_stats_.kv_bytes_peak + pager_stats_.staging_bytes + window_stats_.ring_bytes;
  m->kv_window_ring_bytes = window_stats_.ring_bytes;
  m->kv_window_rebuilds_from_residuals = window_stats_.rebuilds_from_residuals;
  m->kv_window_rebuilds_from_tokens = window_stats_.rebuilds_from_tokens;
  m->kv_window_tokens_rebuilt = window_stats_.tokens_rebuilt;
  m->kv_layers_streamed = pager_stats_.layers_streamed;
  m->kv_stream_wait_ms = pager_stats_.stream_wait_ms;
  m->requests_finished = requests_finished_;
  m->requests_running = num_running_;
  m->requests_waiting = num_waiting_;
  m->preemptions = preemptions_;
  m->steps = num_steps_;
  m->tokens_prefilled = tokens_prefilled_;
  m->tokens_generated = tokens_generated_;
  m->spec_seq_steps = spec_seq_steps_;
  m->spec_draft_steps = spec_draft_steps_;
  m->spec_drafted = spec_drafted_;
  m->spec_accepted = spec_accepted_;
  m->mean_batch_tokens =
      num_steps_ ? static_cast<double>(batch_tokens_total_) / static_cast<double>(num_steps_) : 0;
  m->mean_batch_seqs =
      num_steps_ ? static_cast<double>(batch_seqs_total_) / static_cast<double>(num_steps_) : 0;
  m->last_batch_tokens = last_batch_tokens_;
  m->last_batch_seqs = last_batch_seqs_;
  m->ttft_mean_ms = ttft_ms_.Mean();
  m->ttft_p50_ms = ttft_ms_.Percentile(50);
  m->ttft_p99_ms = ttft_ms_.Percentile(99);
  m->itl_mean_ms = itl_ms_.Mean();
  m->itl_p50_ms = itl_ms_.Percentile(50);
  m->itl_p99_ms = itl_ms_.Percentile(99);
}

}  // namespace kvl
