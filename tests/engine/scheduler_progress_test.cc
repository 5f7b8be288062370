// The scheduler always makes progress while its tiers fill up (issue 37), as a property on a
// model-free pool (scheduler_harness.h). The configuration under which `kvl serve` stalled for
// good: many sequences at once, a small pool, `auto` with balanced quality, a RAM tier and a disk
// tier that both fill, requests mixing kv_quality, prompts that share prefixes (so the KV store
// files pages in the tiers and finds them again) and a queue of ~30 waiting. One Schedule call
// never returned there: a waiting request alone in an empty pool asked the store again, pinned
// the same tier pages, let them go as a last resort, and asked again, forever.
//
// Asserted per seeded trial: every Schedule call ends within a bounded number of passes of its
// planning loop (a guard thread interrupts a call that runs for seconds, which fails the trial
// instead of hanging the test), and every request finishes within a bounded number of steps
// with a reason a client can act on: its max_tokens ("length"), cut by the budget with tokens
// ("kv_pressure"), too big for the pool with no token sent ("error", RESOURCE_EXHAUSTED), or
// cancelled.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "scheduler_harness.h"

namespace kvl {
namespace {

using testing_scheduler::kBlock;
using testing_scheduler::PoolSetup;
using testing_scheduler::SchedulerHarness;

// Interrupts the scheduler (SchedulerOptions::interrupt) when one Schedule call has run for
// longer than `limit`: the trial then fails naming it, where a stall would hang the test.
class ScheduleGuard {
 public:
  explicit ScheduleGuard(std::chrono::milliseconds limit) : limit_(limit) {
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!done_) {
        if (in_call_ && std::chrono::steady_clock::now() - call_started_ > limit_) {
          interrupt_.store(true);
          ++interrupts_;
          in_call_ = false;
        }
        wake_.wait_for(lock, std::chrono::milliseconds(50));
      }
    });
  }
  ~ScheduleGuard() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  const std::atomic<bool>* flag() const { return &interrupt_; }
  void Enter() {
    std::lock_guard<std::mutex> lock(mutex_);
    interrupt_.store(false);
    in_call_ = true;
    call_started_ = std::chrono::steady_clock::now();
  }
  void Leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    in_call_ = false;
  }
  int interrupts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return interrupts_;
  }

 private:
  const std::chrono::milliseconds limit_;
  std::atomic<bool> interrupt_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  bool in_call_ = false;
  std::chrono::steady_clock::time_point call_started_;
  int interrupts_ = 0;
  std::thread thread_;
};

struct Planned {
  std::vector<int32_t> prompt;
  int32_t max_new = 0;
  KvQuality quality = KvQuality::kBalanced;
  int64_t submit_step = 0;
  int64_t cancel_step = -1;
};

struct Trial {
  PoolSetup setup;
  std::vector<Planned> requests;
  std::string description;
};

// One layer page of the harness's pool on disk: a 4 KiB slot (the record and the page, aligned).
constexpr int64_t kDiskSlotBytes = 4096;
constexpr int64_t kLayers = 2;  // the harness's pool

Trial RandomTrial(uint32_t seed, const std::string& scratch) {
  std::mt19937 rng(seed);
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Trial t;
  PoolSetup& s = t.setup;
  s.max_seqs = pick(2, 8);
  s.num_blocks = pick(10, 40);
  s.max_batch_tokens = 4 * pick(2, 16);
  s.policy = "auto";
  s.quality = "balanced";
  s.ram_tier = true;
  // The harness's page is 2 layers x 4 tokens x 4 floats of K and of V: 256 bytes.
  s.ram_tier_bytes = 256 * pick(2, 16);
  s.disk_tier_path = fmt::format("{}/pages-{}", scratch, seed);
  s.disk_tier_bytes = kDiskSlotBytes * kLayers * pick(2, 24);
  s.recent_tokens = 4 * pick(0, 2);
  s.staged_pages = pick(1, 8);
  s.keep_lossy_sessions = pick(0, 1) == 1;
  t.description = fmt::format(
      "seed {}: -np {}, {} blocks, step of {} tokens, RAM tier {} pages, disk tier {} pages, "
      "{} staged pages, recent {} tokens{}",
      seed, s.max_seqs, s.num_blocks, s.max_batch_tokens, s.ram_tier_bytes / 256,
      s.disk_tier_bytes / (kDiskSlotBytes * kLayers), s.staged_pages, s.recent_tokens,
      s.keep_lossy_sessions ? ", lossy sessions kept" : "");
  // A few conversations that come back: requests share their prefixes, longer than the pool at
  // times (balanced quality bounds nothing up front).
  const int64_t pool_tokens = s.num_blocks * kBlock;
  std::vector<std::vector<int32_t>> prefixes(static_cast<size_t>(pick(1, 3)));
  for (std::vector<int32_t>& prefix : prefixes) {
    prefix.resize(static_cast<size_t>(2 * pool_tokens));
    for (int32_t& id : prefix) id = pick(3, 500);
  }
  const int count = pick(24, 48);
  int64_t step = 0;
  const std::vector<KvQuality> qualities = {KvQuality::kLossless, KvQuality::kBalanced,
                                            KvQuality::kBalanced, KvQuality::kAggressive};
  for (int i = 0; i < count; ++i) {
    Planned r;
    const std::vector<int32_t>& prefix = prefixes[static_cast<size_t>(pick(0, int(prefixes.size()) - 1))];
    const int length = pick(2, static_cast<int>(pool_tokens * 3 / 2));
    const int shared = pick(0, 3) == 0 ? pick(0, length) : std::max(0, length - pick(0, 8));
    r.prompt.assign(prefix.begin(), prefix.begin() + std::min<int>(shared, int(prefix.size())));
    while (static_cast<int>(r.prompt.size()) < length) r.prompt.push_back(pick(3, 500));
    r.max_new = pick(1, 64);
    r.quality = qualities[static_cast<size_t>(pick(0, 3))];
    // Bursts: most arrive together, so that ~30 wait at once.
    step += pick(0, 4) == 0 ? pick(5, 60) : 0;
    r.submit_step = step;
    if (pick(0, 7) == 0) r.cancel_step = step + pick(0, 100);
    t.requests.push_back(std::move(r));
  }
  return t;
}

TEST(SchedulerProgressTest, EverySchedulePlansInBoundedPassesAndEveryRequestFinishesAsTiersFill) {
  const std::string scratch =
      ::testing::TempDir() + "/kvl-scheduler-progress-" + std::to_string(::getpid());
  std::filesystem::create_directories(scratch);
  // KVL_SCHEDULER_PROGRESS_SEEDS=N (and _FIRST_SEED) run other trials.
  const uint32_t seeds = getenv("KVL_SCHEDULER_PROGRESS_SEEDS")
                             ? std::atoi(getenv("KVL_SCHEDULER_PROGRESS_SEEDS"))
                             : 150;
  const uint32_t first = getenv("KVL_SCHEDULER_PROGRESS_FIRST_SEED")
                             ? std::atoi(getenv("KVL_SCHEDULER_PROGRESS_FIRST_SEED"))
                             : 1;
  ScheduleGuard guard(std::chrono::milliseconds(5000));
  int trials = 0, requests = 0, lengths = 0, cut = 0, too_big = 0, cancelled = 0;
  int64_t most_passes = 0, steps_total = 0, tier_evictions = 0, ram_full_trials = 0;
  int64_t preemptions = 0;
  for (uint32_t seed = first; seed < first + seeds; ++seed) {
    Trial trial = RandomTrial(seed, scratch);
    SCOPED_TRACE(trial.description);
    trial.setup.interrupt = guard.flag();
    // The scheduler says on stderr why each sequence it cuts was cut: hundreds of lines here.
    ::testing::internal::CaptureStderr();
    SchedulerHarness h(trial.setup);
    struct DropStderr {
      ~DropStderr() { ::testing::internal::GetCapturedStderr(); }
    } drop_stderr;
    if (!h.create_error().ok()) {
      // A pool too small for the staging it was given is refused up front, naming the flag.
      EXPECT_EQ(h.create_error().code(), StatusCode::kInvalidArgument)
          << h.create_error().ToString();
      continue;
    }
    ++trials;
    std::vector<RequestId> ids(trial.requests.size(), 0);
    int64_t total_tokens = 0;
    for (const Planned& r : trial.requests) {
      total_tokens += static_cast<int64_t>(r.prompt.size()) + r.max_new;
    }
    // A token takes at most a few steps, even paged and recomputed; a stall takes them all.
    const int64_t step_bound = 20 * total_tokens + 2000;
    // Each pass of Schedule's loop frees something (a page out of the pool, a tier page let
    // go, a parked session), asks for less (an admission fewer, a smaller chunk) or stops or
    // preempts a sequence; a request stopped as too big lets the admissions be tried again. So a
    // call takes at most about (requests + 1) x (blocks + sequences + requests) passes. (The
    // stall: one call, passes without end.)
    const int64_t requests_in_trial = static_cast<int64_t>(trial.requests.size());
    const int64_t pass_bound = (requests_in_trial + 1) * (trial.setup.num_blocks +
                                                          trial.setup.max_seqs +
                                                          requests_in_trial + 16);
    bool tier_filled = false;
    int64_t step = 0;
    for (; step < step_bound; ++step) {
      for (size_t i = 0; i < trial.requests.size(); ++i) {
        const Planned& r = trial.requests[i];
        if (r.submit_step == step) ids[i] = h.Submit(r.prompt, r.max_new, r.quality);
        if (r.cancel_step == step && ids[i] != 0) h.Cancel(ids[i]);
      }
      guard.Enter();
      const bool worked = h.Step();
      guard.Leave();
      ASSERT_EQ(guard.interrupts(), 0)
          << "a Schedule call ran for 5 s (" << h.scheduler().last_schedule_passes()
          << " passes) at step " << step << " with " << h.scheduler().num_running()
          << " running and " << h.scheduler().num_waiting() << " waiting";
      most_passes = std::max(most_passes, h.scheduler().last_schedule_passes());
      ASSERT_LE(h.scheduler().last_schedule_passes(), pass_bound) << "at step " << step;
      if (!worked && h.finished().size() == trial.requests.size()) break;
      if (!tier_filled) {
        for (const KvTier* tier : h.memory().tiers()) {
          const TierStats ts = tier->stats();
          if (tier->kind() == TierKind::kRam && ts.bytes_used + 256 > ts.capacity_bytes) {
            tier_filled = true;
          }
        }
      }
    }
    ASSERT_EQ(h.finished().size(), trial.requests.size())
        << "after " << step << " steps: " << h.scheduler().num_running() << " running, "
        << h.scheduler().num_waiting() << " waiting";
    steps_total += step;
    ram_full_trials += tier_filled;
    for (const KvTier* tier : h.memory().tiers()) tier_evictions += tier->stats().evictions;
    preemptions += h.metrics().preemptions;
    for (size_t i = 0; i < trial.requests.size(); ++i) {
      const TokenEvent& e = h.finished().at(ids[i]);
      ++requests;
      if (e.finish_reason == "cancelled") {
        ++cancelled;
      } else if (e.finish_reason == "error") {
        // The one error pressure may give: a prompt this pool can never hold, before any token.
        EXPECT_EQ(e.error.code(), StatusCode::kResourceExhausted) << e.error.ToString();
        EXPECT_EQ(e.generated_tokens, 0);
        ++too_big;
      } else if (e.finish_reason == "kv_pressure") {
        // (The harness appends a token before the step that computes it: a sequence may be cut
        // with all of its tokens sampled and the last one not computed yet.)
        EXPECT_GT(e.generated_tokens, 0);
        EXPECT_LE(e.generated_tokens, trial.requests[i].max_new);
        ++cut;
      } else {
        EXPECT_EQ(e.finish_reason, "length") << "request " << i;
        EXPECT_EQ(e.generated_tokens, trial.requests[i].max_new) << "request " << i;
        ++lengths;
      }
    }
  }
  std::filesystem::remove_all(scratch);
  std::printf(
      "scheduler progress: %d trials, %d requests (%d to max_tokens, %d cut by KV pressure, %d "
      "too big, %d cancelled), %ld steps, %ld preemptions, RAM tier full in %ld trials, %ld tier "
      "evictions; most passes of one Schedule call %ld\n",
      trials, requests, lengths, cut, too_big, cancelled, steps_total, preemptions,
      ram_full_trials, tier_evictions, most_passes);
  // The cases the property exists for really happened.
  EXPECT_GE(trials, seeds * 3 / 4);
  EXPECT_GE(ram_full_trials, trials / 4);
  EXPECT_GT(tier_evictions, 0);
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(lengths, requests / 4);
  EXPECT_GT(cancelled, 0);
}

}  // namespace
}  // namespace kvl
