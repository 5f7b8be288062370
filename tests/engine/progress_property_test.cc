// Progress under KV pressure, as a property: random engines (budgets, sequences at once, tiers,
// policies, prices, prefix cache on or off) serve random requests (token-id prompts sharing a
// prefix, random lengths and max_tokens, random arrival and cancellation steps). Every request
// must finish within a bounded number of steps, with a reason a client can act on; greedy output
// on a lossless configuration must equal the same request run alone with the whole pool.
// It exists for the livelock a hostile probe found (`kvl serve -np 1 --kv-budget 2MiB --kv-tier
// ram:8MiB`: a request preempted ~140 times a second, forever).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fixed_prices.h"
#include "greedy_reply.h"
#include "kvl/calibration.h"
#include "budget_tiers.h"
#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl {
namespace {

// stories260K: 5 layers x 2 x 32 floats = 1280 bytes per token, 20 KiB per 16-token page.
constexpr int64_t kPageBytes = 16 * 1280;
constexpr int64_t kContext = 512;

struct PlannedRequest {
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 0;
  int64_t submit_step = 0;
  int64_t cancel_step = -1;  // -1: never cancelled
};

struct Outcome {
  bool finished = false;
  std::string reason;
  Status error;
  std::vector<int32_t> tokens;
};

struct Trial {
  EngineOptions options;
  bool lossless = false;  // its greedy output must equal the reference
  std::vector<PlannedRequest> requests;
  std::string description;
};

Trial RandomTrial(uint32_t seed, const std::string& scratch_dir) {
  std::mt19937 rng(seed);
  auto pick = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Trial t;
  EngineOptions& o = t.options;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.context_length = kContext;
  o.max_seqs = std::vector<int>{1, 1, 2, 4, 8}[static_cast<size_t>(pick(0, 4))];
  o.kv_budget_bytes = pick(12, 64) * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.prefix_cache = pick(0, 4) != 0;
  // Prices fixed here, or the ones a calibration measured on a busy 2-core VM (kept in
  // tests/engine/data): under those the livelock showed, 27,077 preemptions of one request.
  if (seed % 2 == 1) {
    static const MachineProfile busy = [] {
      StatusOr<MachineProfile> p = LoadProfile(
          std::string(KVL_TESTS_DIR) + "/engine/data/stories260k_profile_measured_busy.json");
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      return p.ok() ? *p : MachineProfile{};
    }();
    o.cost_profile = busy;
  } else {
    o.cost_profile = testing::FixedStoriesPrices(/*residual_ms=*/0.2 * pick(1, 50),
                                                 /*tokens_ms=*/1.0 * pick(1, 100));
  }
  const int tiers = pick(0, 5);
  const std::string ram = fmt::format("ram:{}KiB", 64 * pick(2, 32));
  // The one budget holds the RAM tier beside the pool's pages (kvl/kv_budget.h).
  if (tiers == 1 || tiers == 4) testing::SetTiersBesidePool(&o, {ram});
  if (tiers == 2) testing::SetTiersBesidePool(&o, {ram + ":zstd"});
  if (tiers == 3 || tiers == 4) {
    o.kv_tiers.push_back(fmt::format("disk:{}/pages-{}:{}MiB", scratch_dir, seed, pick(1, 16)));
  }
  const std::vector<std::string> policies = {
      "auto", "auto", "auto", "demote", "compress", "recompute-residual", "recompute-tokens"};
  o.kv_policy = policies[static_cast<size_t>(pick(0, static_cast<int>(policies.size()) - 1))];
  t.lossless = o.kv_policy != "compress";
  t.description = fmt::format("seed {}: -np {} --kv-budget {}KiB {}--kv-policy {}{}", seed,
                              o.max_seqs, o.kv_budget_bytes / 1024,
                              o.prefix_cache ? "" : "--no-prefix-cache ", o.kv_policy, [&] {
                                std::string s;
                                for (const std::string& tier : o.kv_tiers)
                                  s += " --kv-tier " + tier;
                                return s;
                              }());

  // Conversations come back: a few prefixes that several requests share, so pages leave the
  // pool for the store and are found there again, while the tiers evict under pressure.
  std::vector<std::vector<int32_t>> prefixes(static_cast<size_t>(pick(1, 3)));
  for (std::vector<int32_t>& prefix : prefixes) {
    prefix.resize(335);
    for (int32_t& id : prefix) id = pick(3, 511);
  }
  const int count = pick(6, 16);
  int64_t step = 0;
  for (int i = 0; i < count; ++i) {
    PlannedRequest r;
    const std::vector<int32_t>& prefix =
        prefixes[static_cast<size_t>(pick(0, static_cast<int>(prefixes.size()) - 1))];
    const int length = pick(5, 335);
    const int shared = pick(0, 3) == 0 ? pick(0, length) : std::max(0, length - pick(0, 20));
    r.prompt.assign(prefix.begin(), prefix.begin() + shared);
    while (static_cast<int>(r.prompt.size()) < length) r.prompt.push_back(pick(3, 511));
    r.max_new_tokens = pick(1, static_cast<int>(kContext) - length - 1);
    step += pick(0, 3) == 0 ? pick(0, 40) : pick(100, 600);
    r.submit_step = step;
    if (pick(0, 5) == 0) r.cancel_step = step + pick(0, 200);
    t.requests.push_back(std::move(r));
  }
  return t;
}

Request GreedyIds(const PlannedRequest& planned) {
  Request r;
  r.prompt_ids = planned.prompt;
  r.max_new_tokens = planned.max_new_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

// Each request alone in a pool that holds it whole: what a lossless configuration must give.
std::vector<int32_t> Reference(Engine& alone, const PlannedRequest& planned) {
  std::vector<int32_t> tokens;
  auto id = alone.Submit(GreedyIds(planned), [&tokens](const TokenEvent& ev) {
    if (!ev.finished) tokens.push_back(ev.token);
  });
  EXPECT_TRUE(id.ok());
  alone.RunUntilIdle();
  return tokens;
}

TEST(ProgressPropertyTest, EveryRequestFinishesWithinBoundedStepsUnderRandomPressure) {
  const std::string scratch = ::testing::TempDir() + "/kvl-progress-" + std::to_string(::getpid());
  std::filesystem::create_directories(scratch);
  EngineOptions alone_options;
  alone_options.model_path = testing::Stories260KPath();
  alone_options.num_threads = 1;
  alone_options.context_length = kContext;
  alone_options.max_seqs = 1;
  alone_options.calibrate = false;
  alone_options.cache_type_k = alone_options.cache_type_v = "f32";  // as the trials (kPageBytes)
  auto alone = testing::MakeEngine(alone_options);
  ASSERT_NE(alone, nullptr);

  int trials = 0, requests_checked = 0, exact_checked = 0, cancelled = 0, preempted_trials = 0;
  int too_big = 0, refused = 0, cut_by_budget = 0;
  int64_t in_place = 0, promoted = 0, evictions = 0;  // store pages taken in place, promoted
  // KVL_PROGRESS_SEEDS=N (and KVL_PROGRESS_FIRST_SEED) run other trials, KVL_PROGRESS_VERBOSE=1
  // names each. Seed 34 livelocked before the store found pages only whole. 56 seeds: since
  // `auto` keeps checkpoints only where it would rebuild from them, its pools hold more pages
  // and 40 seeds preempted in 3 trials only (56: 5).
  const uint32_t seeds =
      getenv("KVL_PROGRESS_SEEDS") ? std::atoi(getenv("KVL_PROGRESS_SEEDS")) : 56;
  const uint32_t first =
      getenv("KVL_PROGRESS_FIRST_SEED") ? std::atoi(getenv("KVL_PROGRESS_FIRST_SEED")) : 1;
  for (uint32_t seed = first; seed <= seeds; ++seed) {
    Trial trial = RandomTrial(seed, scratch);
    SCOPED_TRACE(trial.description);
    if (getenv("KVL_PROGRESS_VERBOSE")) {
      std::printf("%s\n", trial.description.c_str());
      std::fflush(stdout);
    }
    auto engine = Engine::Create(trial.options);
    if (!engine.ok()) {
      // A random combination the engine refuses (a policy without the tier it needs, a budget
      // too small for the pager's buffers) is refused up front, naming the flag.
      EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument) << engine.status().ToString();
      EXPECT_NE(engine.status().message().find("--kv-"), std::string::npos)
          << engine.status().ToString();
      continue;
    }
    Engine& e = **engine;
    ++trials;
    std::vector<Outcome> outcomes(trial.requests.size());
    std::map<size_t, RequestId> ids;
    int64_t total_tokens = 0;
    for (const PlannedRequest& r : trial.requests) {
      total_tokens += static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
    }
    // A request's tokens each take at most a few steps even when paged and recomputed; a
    // livelock takes them all.
    const int64_t step_bound = 20 * total_tokens + 2000;
    int64_t step = 0;
    size_t finished = 0;
    for (; finished < outcomes.size() && step < step_bound; ++step) {
      for (size_t i = 0; i < trial.requests.size(); ++i) {
        const PlannedRequest& r = trial.requests[i];
        if (r.submit_step == step) {
          auto id = e.Submit(GreedyIds(r), [&outcomes, &finished, i](const TokenEvent& ev) {
            Outcome& o = outcomes[i];
            if (!ev.finished) {
              o.tokens.push_back(ev.token);
              return;
            }
            o.finished = true;
            o.reason = ev.finish_reason;
            o.error = ev.error;
            ++finished;
          });
          if (!id.ok()) {
            // Refused at admission: a request the pool can never hold, named so.
            EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument) << id.status().ToString();
            EXPECT_NE(id.status().message().find("KV budget"), std::string::npos)
                << id.status().ToString();
            outcomes[i] = {true, "refused", id.status(), {}};
            ++finished;
            continue;
          }
          ids[i] = *id;
        }
        if (r.cancel_step == step && ids.count(i)) e.Cancel(ids[i]);
      }
      e.Step();
    }
    const EngineMetrics m = e.Metrics();
    if (m.preemptions > 0) ++preempted_trials;
    for (const KvTierMetrics& tier : m.kv_tiers) {
      in_place += tier.blocks_in_place;
      promoted += tier.blocks_promoted;
      evictions += tier.evictions;
    }
    for (size_t i = 0; i < outcomes.size(); ++i) {
      const Outcome& o = outcomes[i];
      const PlannedRequest& r = trial.requests[i];
      ASSERT_TRUE(o.finished) << "request " << i << " (prompt " << r.prompt.size()
                              << " tokens, max_tokens " << r.max_new_tokens
                              << ") not finished after " << step << " steps; " << m.preemptions
                              << " preemptions, " << m.tokens_generated << " tokens generated";
      ++requests_checked;
      if (o.reason == "cancelled") {
        ++cancelled;
        continue;
      }
      if (o.reason == "refused") {
        ++refused;
        continue;
      }
      if (o.reason == "error") {
        // The one error pressure may give: a prompt the whole budget cannot hold, named so.
        EXPECT_NE(o.error.message().find("KV budget"), std::string::npos) << o.error.ToString();
        EXPECT_TRUE(o.tokens.empty());  // never a late error after tokens were sent
        ++too_big;
        continue;
      }
      // max_tokens reached ("length"), or as far as the budget goes ("kv_pressure": its text so
      // far, never an error).
      EXPECT_GE(static_cast<int32_t>(o.tokens.size()), 1);
      EXPECT_LE(static_cast<int32_t>(o.tokens.size()), r.max_new_tokens);
      if (static_cast<int32_t>(o.tokens.size()) < r.max_new_tokens) {
        EXPECT_EQ(o.reason, "kv_pressure");
        ++cut_by_budget;
      } else {
        EXPECT_EQ(o.reason, "length");
      }
      if (trial.lossless && r.max_new_tokens <= 64) {
        // A prefix of the reference where the budget cut it.
        std::vector<int32_t> reference = Reference(*alone, r);
        reference.resize(o.tokens.size());
        EXPECT_EQ(o.tokens, reference) << "request " << i;
        ++exact_checked;
      }
    }
  }
  std::filesystem::remove_all(scratch);
  // The cases the property exists for really happened.
  EXPECT_GE(trials, 20);
  EXPECT_GE(preempted_trials, 4);
  EXPECT_GE(cancelled, 5);
  EXPECT_GE(exact_checked, 20);
  RecordProperty("requests", requests_checked);
  std::printf(
      "progress: %d trials, %d requests, %d preempted trials, %d cancelled, %d refused at "
      "admission, %d cut by the budget, %d prompts too big, %d compared exactly; store pages "
      "%ld in place, %ld promoted; %ld tier evictions\n",
      trials, requests_checked, preempted_trials, cancelled, refused, cut_by_budget, too_big,
      exact_checked, in_place, promoted, evictions);
}

}  // namespace
}  // namespace kvl
