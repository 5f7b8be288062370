// ProfileKeeper keeps the cost profile true while the engine runs: the corrections it measures
// are written back and seed the next run; one that drifts past the bound has the machine measured
// again, at the next start after `kvl run` or at an idle moment while serving, with a line saying
// why; and a request that arrives while the machine is measured is answered, the measurement
// stopped and tried again. Fake measurements and feedback with made-up times: nothing is timed
// here, except in the last test, which runs a real engine and only checks that it answers.
#include "engine/profile_keeper.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "kvl/cost_profile.h"
#include "kvl/engine.h"
#include "kvl/kv_pager.h"  // kNumFeedbackKeys
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/thread_pool.h"
#include "captured_messages.h"
#include "test_paths.h"

namespace kvl {
namespace {

constexpr size_t kTokensKey = static_cast<size_t>(KvAction::kRecomputeTokens);

using Messages = testing::CapturedMessages;  // what it says, as on the engine's stderr

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string FreshPath(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("kvl-keeper-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return (dir / "profile.json").string();
}

// stories260K's model and a one-thread pool, for profiles that match an engine of -t 1.
struct Stories {
  std::unique_ptr<ThreadPool> pool = ThreadPool::Create(1).value();
  ops::OpsContext ctx{ops::BestIsa(), pool.get()};
  std::unique_ptr<Model> model = Model::Load(testing::Stories260KPath()).value();
};
Stories& Stories260K() {
  static Stories* stories = new Stories;
  return *stories;
}

// A valid profile of stories260K, as if measured earlier (nothing measured here).
MachineProfile MeasuredEarlier(const std::string& timestamp = "2026-01-02T03:04:05Z") {
  MachineProfile p = AnalyticProfile(*Stories260K().model, Stories260K().ctx);
  p.source = std::string(kProfileSourceMeasured);
  p.memory_bytes = 1;
  p.disk_bytes = 1;
  p.disk_dir = "/tmp";
  p.timestamp = timestamp;
  return p;
}

ProfileKeeperHooks FeedbackHooks(BringBackFeedback* feedback) {
  ProfileKeeperHooks hooks;
  hooks.feedback = feedback;
  hooks.seed = [feedback](size_t key, double scale) { feedback->Seed(key, scale); };
  return hooks;
}

// `events` restores of recompute-tokens pages measured `ratio` times their prediction.
void Observe(BringBackFeedback& feedback, int events, double ratio) {
  for (int i = 0; i < events; ++i) feedback.Observe(kTokensKey, 10.0, 10.0 * ratio);
}

// Calls AtIdle until the measurement started there has ended and been taken (or 30 s pass).
// A keeper of the profile at `path` that prints nothing.
ProfileKeeperOptions SilentOptions(const std::string& path) {
  ProfileKeeperOptions o;
  o.path = path;
  o.messages = nullptr;
  return o;
}

void WaitForMeasurement(ProfileKeeper& keeper) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (keeper.counts().running && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto wait = keeper.IdleWorkIn();
    if (wait && wait->count() == 0) keeper.AtIdle();
  }
}

TEST(ProfileKeeperTest, CorrectionsAreWrittenBackAndTheNextRunStartsFromThem) {
  const std::string path = FreshPath("round-trip");
  ASSERT_TRUE(SaveProfile(MeasuredEarlier(), path).ok());
  {
    BringBackFeedback feedback(kNumFeedbackKeys);
    ProfileKeeper keeper(SilentOptions(path), FeedbackHooks(&feedback), *LoadProfile(path));
    Observe(feedback, 3, 1.3);
    keeper.AtStop();
  }
  StatusOr<MachineProfile> saved = LoadProfile(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ASSERT_EQ(saved->corrections.size(), 1u);
  EXPECT_EQ(saved->corrections[0].key, "recompute-tokens");
  EXPECT_NEAR(saved->corrections[0].scale, 1.3, 1e-12);
  EXPECT_EQ(saved->corrections[0].events, 3);
  EXPECT_TRUE(saved->remeasure_reason.empty());  // 1.3x is within the bound

  // The next run's prices are corrected from its first page on, and its events add up.
  BringBackFeedback next(kNumFeedbackKeys);
  ProfileKeeper keeper(SilentOptions(path), FeedbackHooks(&next), *saved);
  EXPECT_NEAR(next.Scale(kTokensKey), 1.3, 1e-12);
  EXPECT_EQ(next.Scale(static_cast<size_t>(KvAction::kDemoteRam)), 1.0);
  Observe(next, 1, 1.1);
  const std::vector<PriceCorrection> now = keeper.Corrections();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NEAR(now[0].scale, 1.1, 1e-12);
  EXPECT_EQ(now[0].events, 4);
}

// Rebuilds inside decode steps have a correction of their own, saved under its own name and
// seeded back into the same key, apart from rebuilds on their own.
TEST(ProfileKeeperTest, TheInStepRebuildCorrectionRoundTripsUnderItsOwnName) {
  const std::string path = FreshPath("in-step");
  ASSERT_TRUE(SaveProfile(MeasuredEarlier(), path).ok());
  {
    BringBackFeedback feedback(kNumFeedbackKeys);
    ProfileKeeper keeper(SilentOptions(path), FeedbackHooks(&feedback), *LoadProfile(path));
    feedback.Observe(kInStepRebuildFeedbackKey, 4.0, 5.0);
    keeper.AtStop();
  }
  StatusOr<MachineProfile> saved = LoadProfile(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ASSERT_EQ(saved->corrections.size(), 1u);
  EXPECT_EQ(saved->corrections[0].key, "recompute-residual-in-step");
  EXPECT_NEAR(saved->corrections[0].scale, 1.25, 1e-12);
  BringBackFeedback next(kNumFeedbackKeys);
  ProfileKeeper keeper(SilentOptions(path), FeedbackHooks(&next), *saved);
  EXPECT_NEAR(next.Scale(kInStepRebuildFeedbackKey), 1.25, 1e-12);
  EXPECT_EQ(next.Scale(static_cast<size_t>(KvAction::kRecomputeResidual)), 1.0);
}

TEST(ProfileKeeperTest, NothingIsWrittenWhileTheCorrectionsStandStill) {
  const std::string path = FreshPath("still");
  ASSERT_TRUE(SaveProfile(MeasuredEarlier(), path).ok());
  const auto written_at = std::filesystem::last_write_time(path);
  BringBackFeedback feedback(kNumFeedbackKeys);
  ProfileKeeperOptions o = SilentOptions(path);
  o.write_back_seconds = 0;  // every step may write
  ProfileKeeper keeper(o, FeedbackHooks(&feedback), *LoadProfile(path));
  for (int step = 0; step < 5; ++step) keeper.AfterStep();
  keeper.AtStop();
  EXPECT_EQ(std::filesystem::last_write_time(path), written_at);
  EXPECT_FALSE(keeper.IdleWorkIn().has_value());  // nothing to do while idle either
}

TEST(ProfileKeeperTest, ADriftInARunIsSaidAndTheNextStartMeasuresIt) {
  const std::string path = FreshPath("drift-run");
  ASSERT_TRUE(SaveProfile(MeasuredEarlier(), path).ok());
  Messages messages;
  BringBackFeedback feedback(kNumFeedbackKeys);
  ProfileKeeperOptions o;
  o.path = path;
  o.messages = messages.file();
  o.write_back_seconds = 0;
  ProfileKeeper keeper(o, FeedbackHooks(&feedback), *LoadProfile(path));
  Observe(feedback, static_cast<int>(kMinDriftEvents) - 1, 2.0);
  keeper.AfterStep();
  EXPECT_FALSE(Contains(messages.Text(), "past the bound")) << messages.Text();  // too few yet
  Observe(feedback, 1, 2.0);
  keeper.AfterStep();
  const std::string line = "kvl: cost profile " + path +
                           ": the measured correction of recompute-tokens is 2.00x over 8 "
                           "events, past the bound of 1.50x (--kv-profile-drift): it is measured "
                           "again at the next start\n";
  EXPECT_TRUE(Contains(messages.Text(), line)) << messages.Text();
  // Written at once, so that even a run that dies leaves the reason.
  StatusOr<MachineProfile> flagged = LoadProfile(path);
  ASSERT_TRUE(flagged.ok()) << flagged.status().ToString();
  EXPECT_EQ(flagged->remeasure_reason,
            DriftReason({"recompute-tokens", 2.0, static_cast<int64_t>(kMinDriftEvents), 1.5}));
  // Said once.
  Observe(feedback, 5, 2.0);
  keeper.AfterStep();
  keeper.AtStop();
  const std::string text = messages.Text();
  EXPECT_EQ(text.find("past the bound"), text.rfind("past the bound")) << text;
}

// The serving engine's keeper with a fake measurement: `measure_calls` counts them; each waits
// for `release` (or for the stop flag) and returns a profile stamped `new_timestamp`.
struct FakeMeasurement {
  std::mutex mutex;
  std::condition_variable changed;
  bool release = false;
  int calls = 0;
  std::string new_timestamp = "2026-02-02T00:00:00Z";
  std::optional<MachineProfile> applied;

  void Install(ProfileKeeperHooks* hooks) {
    hooks->measure = [this](const std::atomic<bool>& stop) -> StatusOr<MachineProfile> {
      std::unique_lock<std::mutex> lock(mutex);
      ++calls;
      changed.notify_all();
      while (!release && !stop.load()) changed.wait_for(lock, std::chrono::milliseconds(1));
      if (stop.load()) return CancelledError("calibration stopped before it finished");
      return MeasuredEarlier(new_timestamp);
    };
    hooks->others_cpu_share = [] { return std::optional<double>(0.0); };
    hooks->apply = [this](const MachineProfile& p) {
      applied = p;
      return Status::Ok();
    };
  }
  void WaitForCalls(int n) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait_for(lock, std::chrono::seconds(30), [&] { return calls >= n; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
};

TEST(ProfileKeeperTest, WhileServingADriftIsMeasuredAtAnIdleMomentAndPricedWith) {
  const std::string path = FreshPath("drift-serve");
  ASSERT_TRUE(SaveProfile(MeasuredEarlier(), path).ok());
  Messages messages;
  BringBackFeedback feedback(kNumFeedbackKeys);
  FakeMeasurement measurement;
  ProfileKeeperHooks hooks = FeedbackHooks(&feedback);
  measurement.Install(&hooks);
  ProfileKeeperOptions o;
  o.path = path;
  o.messages = messages.file();
  o.write_back_seconds = 0;
  ProfileKeeper keeper(o, std::move(hooks), *LoadProfile(path));
  keeper.EnableIdleMeasuring();
  EXPECT_FALSE(keeper.IdleWorkIn().has_value());

  Observe(feedback, 10, 0.5);  // pages come back twice as fast as the profile says
  keeper.AfterStep();
  const std::string drift =
      "the measured correction of recompute-tokens is 0.50x over 10 events, past the bound of "
      "1.50x (--kv-profile-drift)";
  EXPECT_TRUE(Contains(messages.Text(), "cost profile " + path + ": " + drift +
                                            ": this machine is measured again at the next idle "
                                            "moment"))
      << messages.Text();
  ASSERT_TRUE(keeper.IdleWorkIn().has_value());  // the idle loop must come back
  keeper.AtIdle();
  EXPECT_TRUE(keeper.counts().running);
  measurement.Release();
  WaitForMeasurement(keeper);

  const ProfileKeeper::Counts counts = keeper.counts();
  EXPECT_EQ(counts.started, 1);
  EXPECT_EQ(counts.finished, 1);
  EXPECT_EQ(counts.abandoned, 0);
  // The engine prices with it, and the file holds it, with why it was measured.
  ASSERT_TRUE(measurement.applied.has_value());
  EXPECT_EQ(measurement.applied->timestamp, "2026-02-02T00:00:00Z");
  StatusOr<MachineProfile> saved = LoadProfile(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->timestamp, "2026-02-02T00:00:00Z");
  EXPECT_EQ(saved->measured_because, "drift: " + drift);
  EXPECT_TRUE(MeasuredForDrift(*saved));
  EXPECT_TRUE(Contains(messages.Text(), "cost profile " + path + " measured again in"))
      << messages.Text();
  EXPECT_EQ(keeper.profile().timestamp, "2026-02-02T00:00:00Z");
}

TEST(ProfileKeeperTest, ARequestStopsTheMeasurementAndTheNextIdleMomentTriesAgain) {
  const std::string path = FreshPath("stopped");
  MachineProfile busy = MeasuredEarlier();
  busy.others_cpu_share = 0.8;  // measured under load, and kept: the start was busy too
  ASSERT_TRUE(SaveProfile(busy, path).ok());
  Messages messages;
  BringBackFeedback feedback(kNumFeedbackKeys);
  FakeMeasurement measurement;
  ProfileKeeperHooks hooks = FeedbackHooks(&feedback);
  measurement.Install(&hooks);
  ProfileKeeperOptions o;
  o.path = path;
  o.messages = messages.file();
  ProfileKeeper keeper(o, std::move(hooks), *LoadProfile(path));
  keeper.EnableIdleMeasuring();
  ASSERT_TRUE(keeper.IdleWorkIn().has_value());
  keeper.AtIdle();
  measurement.WaitForCalls(1);
  ASSERT_TRUE(keeper.counts().running);

  keeper.WorkArrived();  // the step loop has a request: the measurement stops at once
  WaitForMeasurement(keeper);
  EXPECT_EQ(keeper.counts().abandoned, 1);
  EXPECT_EQ(keeper.counts().finished, 0);
  EXPECT_TRUE(Contains(messages.Text(), "a request arrived; tried again at the next idle moment"))
      << messages.Text();
  EXPECT_EQ(LoadProfile(path)->timestamp, busy.timestamp);  // nothing half-measured was kept

  // Idle again: measured, this time to the end.
  const auto wait = keeper.IdleWorkIn();
  ASSERT_TRUE(wait.has_value());
  EXPECT_GT(wait->count(), 0);  // after idle_seconds, not at once
  measurement.Release();
  keeper.AtIdle();
  WaitForMeasurement(keeper);
  EXPECT_EQ(keeper.counts().started, 2);
  EXPECT_EQ(keeper.counts().finished, 1);
  EXPECT_EQ(LoadProfile(path)->timestamp, measurement.new_timestamp);
}

TEST(ProfileKeeperTest, ADriftAfterAMeasurementForADriftIsKeptAsACorrection) {
  const std::string path = FreshPath("drift-again");
  MachineProfile remeasured = MeasuredEarlier();
  remeasured.measured_because = DriftReason({"recompute-tokens", 2.0, 9, 1.5});
  ASSERT_TRUE(SaveProfile(remeasured, path).ok());
  Messages messages;
  BringBackFeedback feedback(kNumFeedbackKeys);
  ProfileKeeperOptions o;
  o.path = path;
  o.messages = messages.file();
  ProfileKeeper keeper(o, FeedbackHooks(&feedback), *LoadProfile(path));
  keeper.EnableIdleMeasuring();
  Observe(feedback, 9, 2.0);
  keeper.AtStop();
  EXPECT_TRUE(Contains(messages.Text(), "again after it was measured for that: kept as a "
                                        "correction"))
      << messages.Text();
  StatusOr<MachineProfile> saved = LoadProfile(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_TRUE(saved->remeasure_reason.empty());
  ASSERT_EQ(saved->corrections.size(), 1u);
  EXPECT_NEAR(saved->corrections[0].scale, 2.0, 1e-12);
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (saved_) {
      ::setenv(name_, saved_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

// A real serving engine (Start) whose profile, at a default path ($KVL_PROFILE), carries a
// correction past the bound from an earlier run: it measures the machine again while idle, and a
// request that arrives meanwhile is answered.
TEST(ProfileKeeperEngineTest, ARequestDuringTheMeasurementIsAnswered) {
  const std::string path = FreshPath("engine");
  MachineProfile drifted = MeasuredEarlier();
  drifted.corrections = {{"recompute-tokens", 3.0, 20}};
  ASSERT_TRUE(SaveProfile(drifted, path).ok());
  const ScopedEnv profile_env("KVL_PROFILE", path);

  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.context_length = 128;
  o.kv_policy = "recompute-tokens";  // asks for the profile's prices
  o.spec = "off";
  StatusOr<std::unique_ptr<Engine>> created = Engine::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Engine& e = **created;
  e.Start();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!e.Metrics().profile_measuring && e.Metrics().profile_measures_started == 0 &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(e.Metrics().profile_measures_started, 1) << "the idle engine never measured";

  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  int64_t tokens = 0;
  Request r;
  r.prompt = "Once upon a time";
  r.max_new_tokens = 8;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  ASSERT_TRUE(e.Submit(r, [&](const TokenEvent& ev) {
                 std::lock_guard<std::mutex> lock(mutex);
                 if (ev.token >= 0) ++tokens;
                 if (ev.finished) {
                   finished = true;
                   done.notify_all();
                 }
               }).ok());
  {
    std::unique_lock<std::mutex> lock(mutex);
    done.wait_for(lock, std::chrono::seconds(60), [&] { return finished; });
    EXPECT_TRUE(finished) << "the request was not answered while the machine was measured";
    EXPECT_EQ(tokens, 8);
  }
  // The measurement it interrupted was stopped (or had already ended) and taken at the next idle
  // moment; the engine still stops cleanly.
  const auto settle = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  EngineMetrics m = e.Metrics();
  while (m.profile_measures_abandoned + m.profile_measures_finished == 0 &&
         std::chrono::steady_clock::now() < settle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = e.Metrics();
  }
  EXPECT_GE(m.profile_measures_abandoned + m.profile_measures_finished, 1);
  e.Stop();
}

}  // namespace
}  // namespace kvl
