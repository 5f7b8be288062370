// When an action cannot be carried out, the lattice says why and, where the policy leaves it a
// choice, takes another: a full tier falls back to the next cheapest action; a cost model that
// prices keeping above a slow tier still moves pages (keeping is no answer when the pool is
// short); and a fixed policy with nowhere to go fails with the tier's own reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include "kv/small_filesystem.h"
#include "budget_tiers.h"
#include "kvl/engine.h"
#include "test_paths.h"

namespace kvl {
namespace {

constexpr int64_t kPageBytes = 16 * 1280;  // stories260K: one 16-token f32 page

struct Outcome {
  std::vector<int32_t> tokens;
  std::string finish;
  Status error;
  EngineMetrics metrics;
};

Outcome Generate(const EngineOptions& o, int32_t n) {
  Outcome out;
  auto created = Engine::Create(o);
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  if (!created.ok()) return out;
  Engine& e = **created;
  Request r;
  r.prompt = testing::StoryPrompts()[0];
  r.max_new_tokens = n;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  EXPECT_TRUE(e.Submit(r, [&](const TokenEvent& ev) {
                 if (ev.token >= 0) out.tokens.push_back(ev.token);
                 if (ev.finished) {
                   out.finish = ev.finish_reason;
                   out.error = ev.error;
                 }
               }).ok());
  e.RunUntilIdle();
  out.metrics = e.Metrics();
  return out;
}

EngineOptions Options(int64_t budget_pages) {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 1;
  o.context_length = 512;
  o.max_seqs = 1;
  o.kv_budget_bytes = budget_pages * kPageBytes;
  o.cache_type_k = o.cache_type_v = "f32";  // kPageBytes is an f32 page
  o.kv_stream_reserve = 0.5;
  o.calibrate = false;
  o.profile_path = ::testing::TempDir() + "/kvl-failures-no-profile-" + std::to_string(getpid());
  return o;
}

int64_t Pages(const EngineMetrics& m, KvAction a) {
  return m.kv_actions[static_cast<size_t>(a)].pages;
}

TEST(KvFailuresTest, APricyDiskIsStillUsedWhenThePoolMustShrink) {
  // A profile describing a very slow disk: demoting a page prices far above keeping it. Under
  // pressure the page has to leave all the same, and the disk is the only lossless place.
  const std::string disk = ::testing::TempDir() + "/kvl-slow-disk-" + std::to_string(getpid());
  EngineOptions o = Options(24);
  o.kv_tiers = {"disk:" + disk + ":64MiB:scratch"};
  MachineProfile slow;
  slow.model.layers = 5;  // stories260K
  slow.recompute_from_tokens.token_layer_ms = 1e6 / (16 * 5);  // 1e6 ms per 16-token page
  slow.recompute_from_residual.call_ms = 1e6;
  slow.memory_copy_gbps = 10;
  slow.ram.read.gbps = slow.ram.write.gbps = 10;
  slow.disk_buffered.read.gbps = slow.disk_buffered.write.gbps = 1e-6;  // a kilobyte per second
  slow.disk_buffered.read.call_ms = slow.disk_buffered.write.call_ms = 1e3;
  o.cost_profile = slow;
  EngineOptions keep = Options(64);
  const Outcome all = Generate(keep, 300);
  const Outcome paged = Generate(o, 300);
  EXPECT_EQ(paged.finish, "length") << paged.error.ToString();
  EXPECT_EQ(paged.tokens, all.tokens);
  EXPECT_GT(Pages(paged.metrics, KvAction::kDemoteDisk), 5);
}

TEST(KvFailuresTest, AFullTierFallsBackToTheNextCheapestActionUnderAuto) {
  // The RAM tier holds two pages' layers; once it is full, auto with balanced quality
  // compresses instead (and the run completes).
  EngineOptions o = Options(24);
  testing::SetTiersBesidePool(&o, {"ram:" + std::to_string(2 * kPageBytes)});
  o.kv_quality = "balanced";
  const Outcome run = Generate(o, 300);
  EXPECT_EQ(run.finish, "length") << run.error.ToString();
  EXPECT_EQ(run.tokens.size(), 300u);
  const int64_t demoted = Pages(run.metrics, KvAction::kDemoteRam);
  const int64_t compressed = Pages(run.metrics, KvAction::kCompressInt8) +
                             Pages(run.metrics, KvAction::kCompressInt4);
  EXPECT_LE(demoted, 2);  // what the tier holds
  EXPECT_GT(compressed, 0) << "demoted " << demoted;
}

// A sequence that outgrows what the budget and a full tier hold ends where it got to, its tokens
// kept, never with a late error that throws the work away; its finish reason is "kv_pressure",
// not max_tokens' "length", and stderr says why, in the tier's own words.
TEST(KvFailuresTest, AFixedPolicyWithAFullTierEndsAtKvPressureAndSaysTheTiersReason) {
  EngineOptions o = Options(24);
  testing::SetTiersBesidePool(&o, {"ram:" + std::to_string(2 * kPageBytes)});
  o.kv_policy = "demote";
  ::testing::internal::CaptureStderr();
  const Outcome run = Generate(o, 400);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(run.finish, "kv_pressure") << run.error.ToString();
  EXPECT_TRUE(run.error.ok()) << run.error.ToString();
  EXPECT_GT(run.tokens.size(), 100u);  // 24 pages and 2 in the tier: about 26 x 16 tokens
  EXPECT_LT(run.tokens.size(), 400u);
  EXPECT_NE(log.find("finish reason kv_pressure"), std::string::npos) << log;
  EXPECT_NE(log.find("the ram tier"), std::string::npos) << log;
  EXPECT_NE(log.find("free"), std::string::npos) << log;
}

// A full disk is a full tier (issue 37): a disk tier asking for 64 MiB on a filesystem of 256 KiB
// is shrunk to it at start (stderr names both sizes), and then serves exactly as a tier of that
// size on a roomy disk does: the same tokens and the same finish reason for a request that needs
// more pages out of the pool than either holds (a cut by "kv_pressure" with the text so far, as a
// full tier gives), never an I/O error on every later write, never an error for the request.
TEST(KvFailuresTest, ADiskTierOnASmallFilesystemServesAsATierOfThatSize) {
  testing::SmallFilesystem fs(::testing::TempDir(), 256 << 10);
  if (!fs.mounted()) GTEST_SKIP() << "no small filesystem: " << fs.skip_reason();
  EngineOptions small = Options(24);
  small.kv_tiers = {"disk:" + fs.dir() + "/pages:64MiB"};
  ::testing::internal::CaptureStderr();
  const Outcome on_small = Generate(small, 400);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("shrunk to"), std::string::npos) << log;
  EXPECT_NE(log.find("67112960 bytes but its filesystem has"), std::string::npos) << log;
  ASSERT_EQ(on_small.metrics.kv_tiers.size(), 1u);
  const int64_t capacity = on_small.metrics.kv_tiers[0].capacity_bytes;
  EXPECT_LE(capacity, 256 << 10);
  EXPECT_GE(capacity, 200 << 10);
  const std::string roomy_path = ::testing::TempDir() + "/kvl-roomy-" + std::to_string(getpid());
  EngineOptions roomy = Options(24);
  roomy.kv_tiers = {"disk:" + roomy_path + ":" + std::to_string(capacity)};  // persistent too
  const Outcome on_roomy = Generate(roomy, 400);
  std::remove(roomy_path.c_str());
  EXPECT_TRUE(on_small.error.ok()) << on_small.error.ToString();
  EXPECT_NE(on_small.finish, "error");
  EXPECT_EQ(on_small.finish, on_roomy.finish);
  EXPECT_EQ(on_small.tokens, on_roomy.tokens);
  EXPECT_GT(on_small.tokens.size(), 200u);
  EXPECT_EQ(on_small.metrics.kv_tiers[0].pages_in, on_roomy.metrics.kv_tiers[0].pages_in);
  EXPECT_GT(on_small.metrics.kv_tiers[0].pages_in, 0);
  EXPECT_EQ(on_small.metrics.kv_tiers[0].errors, on_roomy.metrics.kv_tiers[0].errors) << log;
}

}  // namespace
}  // namespace kvl
