// Internal state of the Engine, shared by engine.cc (API, lifecycle) and scheduler.cc (the step).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "kvl/kv_pager.h"
#include "kvl/engine.h"
#include "kvl/forward.h"
#include "kvl/kv_tier.h"
#include "kvl/thread_pool.h"

namespace kvl {

using Clock = std::chrono::steady_clock;

inline double MillisecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Releases generated text while holding back whatever could still turn into a stop string, so a
// stop string is never streamed out before it is recognized.
class StopTextFilter {
 public:
  explicit StopTextFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds a piece; returns the text that is now safe to emit. Sets *stopped when a stop string
  // completed (the text before it is emitted, the stop string and anything after it is dropped).
  std::string Push(std::string_view piece, bool* stopped);
  // Whatever is held back, at the end of generation.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

// A full page of a preempted sequence saved in a tier, to be promoted back at resume.
struct DemotedPage {
  int64_t block_index = 0;  // position in the sequence's block table
  KvTier* tier = nullptr;
  uint64_t page_id = 0;  // KvPager's name for the page's layer pages in the tier
  KvAction action = KvAction::kDemoteRam;
  double predicted_ms = 0;
};

// One request from admission to its last token.
struct Sequence {
  RequestId id = 0;
  SeqId slot = -1;                 // KV manager sequence id while admitted
  Request request;
  EventCallback on_event;
  std::vector<int32_t> tokens;     // prompt, then generated tokens
  int64_t num_prompt = 0;
  int64_t num_computed = 0;        // leading tokens whose K/V is in the cache
  int64_t cached_prompt_tokens = -1;  // prefix hit at first admission (-1: not admitted yet)
  int32_t num_generated = 0;
  int32_t prev_token = -1;         // for DecodeToken's leading-space rule
  std::unique_ptr<Sampler> sampler;
  StopTextFilter stop_filter{{}};
  Clock::time_point submitted;
  Clock::time_point first_token;
  Clock::time_point last_token;
  bool finished = false;
  bool stream_failed = false;         // this step read a streamed page that failed its checksum
  std::vector<DemotedPage> demoted;   // pages saved at the last preemption, in block order
  int64_t restore_tokens = 0;         // this admission: tokens to promote instead of compute
  std::vector<double> recompute_predicted_ms;  // pages dropped at preemption, per page
  // Pages promoted from a K/V copy have no valid residual checkpoints (only K/V moved).
  std::vector<bool> checkpoint_missing;        // by block index
};

// A bounded window of recent samples for percentiles.
class SampleWindow {
 public:
  void Add(double v);
  double Mean() const;
  double Percentile(double p) const;

 private:
  static constexpr size_t kCapacity = 4096;
  std::vector<double> values_;
  size_t next_ = 0;
};

struct Engine::Impl {
  EngineOptions options;
  int64_t context_length = 0;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<ops::OpsContext> ops;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<KvManager> kv;
  std::unique_ptr<KvBlockStorage> storage;
  std::unique_ptr<KvPager> pager;  // pages of running sequences that left the pool
  std::unique_ptr<PagedKvCache> cache;
  std::unique_ptr<Forward> forward;

  // Submission side, guarded by inbox_mutex.
  mutable std::mutex inbox_mutex;
  std::condition_variable inbox_cv;
  std::deque<std::unique_ptr<Sequence>> inbox;
  std::unordered_set<RequestId> cancel_requests;
  RequestId next_request_id = 1;
  int64_t requests_submitted = 0;

  // Step-loop side (owned by whoever runs Step).
  std::deque<std::unique_ptr<Sequence>> waiting;   // not admitted (new or preempted), FIFO
  std::vector<std::unique_ptr<Sequence>> running;  // admitted, in admission order
  std::vector<SeqId> free_slots;
  TokenBatch batch;
  std::vector<KvSeqStep> steps;
  std::vector<Sequence*> step_seqs;
  std::vector<SeqId> run_seqs;           // sequences of one forward run
  std::vector<Sequence*> to_recompute;   // streamed reads failed: recompute from tokens

  // The KV action lattice: applied to the pages of running sequences under memory pressure
  // (compress, demote and stream, evict) and to a preempted sequence's pages (demote, recompute).
  std::vector<TierSpec> tier_specs;
  std::unique_ptr<KvTier> ram_tier;
  std::unique_ptr<KvTier> disk_tier;
  KvPolicyChoice policy;
  KvQuality quality = KvQuality::kLossless;
  PageCostProfile page_costs;
  bool pages_running_sequences = false;  // the policy can act on running sequences' pages
  bool step_has_prefill = false;          // the step being planned computes prompt chunks
  int64_t sink_tokens = 4;               // never evicted or moved: attention sinks
  int64_t recent_tokens = 64;            // the newest tokens stay resident at full precision
  std::array<KvActionCounter, kNumKvActions> action_counters{};  // guarded by metrics_mutex
  int64_t checksum_failures = 0;                                 // guarded by metrics_mutex

  // Background loop.
  std::thread loop;
  std::atomic<bool> loop_running{false};

  // Metrics, guarded by metrics_mutex (written by the step loop, read by Metrics()).
  mutable std::mutex metrics_mutex;
  int64_t requests_finished = 0;
  int64_t preemptions = 0;
  int64_t num_steps = 0;
  int64_t tokens_prefilled = 0;
  int64_t tokens_generated = 0;
  int64_t batch_tokens_total = 0;
  int64_t batch_seqs_total = 0;
  int64_t last_batch_tokens = 0;
  int64_t last_batch_seqs = 0;
  SampleWindow ttft_ms;
  SampleWindow itl_ms;
  KvStats kv_stats;
  KvPagerStats pager_stats;
  int64_t num_running = 0;
  int64_t num_waiting = 0;

  bool StepImpl();
  Status ParseKvSettings();
  bool KeepsResidualCheckpoints() const;
  Status SetUpKvActions(const KvBlockLayout& layout);
  // Scheduling pieces (scheduler.cc).
  void TakeInbox();
  void ApplyCancellations();
  bool BuildPlan(KvPlan* plan);
  void Preempt(size_t running_index);
  // The action for one page: of a preempted sequence (running == false), or of a running one
  // under memory pressure.
  KvAction ChoosePageAction(const Sequence& seq, int64_t block_index, bool running,
                            double* predicted_ms);
  // Frees about `blocks_short` blocks by acting on the coldest pages of running sequences;
  // false when no page could be acted on.
  bool RelievePressure(int64_t blocks_short);
  void CountPageAction(KvAction action);  // one page of `action`: pages and bytes
  // Promotes the seq's demoted pages into its freshly committed blocks; returns how many of the
  // restore tokens really came back (a failed or corrupt read ends the run: the rest is computed).
  int64_t RestorePages(Sequence& seq, int64_t first_block, int64_t num_blocks);
  void RunForwardAndSample(const KvPlan& plan);
  void AppendToken(Sequence& seq, int32_t token);
  void Finish(Sequence& seq, const std::string& reason, Status error = Status::Ok());
  void ReleaseFinished();
  void UpdateGauges();
};

}  // namespace kvl
