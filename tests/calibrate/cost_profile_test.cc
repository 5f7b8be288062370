// ObtainProfile as a user meets it: what it measures, says and writes for a missing, valid or
// unusable profile at a user's path or a default one, and with calibration turned off.
#include "kvl/cost_profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "calibration_test_util.h"
#include "captured_messages.h"
#include "kvl/profile_corrections.h"

// In kvl::testing, beside the shared helpers of calibration_test_util.h.
namespace kvl::testing {
namespace {

using Messages = testing::CapturedMessages;  // what it says, as on the engine's stderr

// Sets an environment variable (or unsets it, for nullopt) for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
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

// A fresh empty directory for one test.
std::string FreshDir(const std::string& name) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

ProfileOptions Options(const std::string& path, FILE* messages) {
  ProfileOptions o;
  o.path = path;
  o.calibration = TinyCalibrateOptions();
  o.calibration.repetitions = 1;
  o.messages = messages;
  return o;
}

StatusOr<MachineProfile> Obtain(const ProfileOptions& options) {
  return ObtainProfile(*Stories260K().model, Stories260K().ctx, options);
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A valid profile of stories260K, as if measured earlier (fast: no measuring).
MachineProfile SomeValidProfile() {
  MachineProfile p = AnalyticProfile(*Stories260K().model, Stories260K().ctx);
  p.source = std::string(kProfileSourceMeasured);
  p.memory_bytes = 1;
  p.disk_bytes = 1;
  p.disk_dir = "/tmp";
  return p;
}

TEST(ObtainProfileTest, MissingProfileIsMeasuredAnnouncedAndSaved) {
  const std::string path = FreshDir("missing") + "/sub/profile.json";
  Messages messages;
  StatusOr<MachineProfile> p = Obtain(Options(path, messages.file()));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->source, kProfileSourceMeasured);
  const std::string text = messages.Text();
  EXPECT_TRUE(Contains(text, "kvl: no cost profile at " + path +
                                 ": measuring this machine (quick calibration, about "))
      << text;
  for (const char* stage : {"matmul", "recompute", "memory", "disk", "tiers", "compress"}) {
    EXPECT_TRUE(Contains(text, std::string(stage) + " ")) << stage << "\n" << text;
  }
  EXPECT_TRUE(Contains(text, "kvl: cost profile saved to " + path)) << text;
  StatusOr<MachineProfile> saved = LoadProfile(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(*saved, *p);

  // The next start finds it: one line, nothing measured, the same profile.
  Messages again;
  StatusOr<MachineProfile> found = Obtain(Options(path, again.file()));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(*found, *p);
  const std::string found_text = again.Text();
  // One line, and a second only to say the profile was measured on a busy machine (the test
  // machine may well be; the user's file is used as given then).
  const size_t first_end = found_text.find('\n');
  EXPECT_TRUE(Contains(found_text.substr(0, first_end), path)) << found_text;
  const std::string rest = found_text.substr(first_end + 1);
  if (MeasuredUnderLoad(*p)) {
    EXPECT_TRUE(Contains(rest, "note: this profile was measured on a busy machine")) << found_text;
    EXPECT_EQ(rest.find('\n'), rest.size() - 1) << found_text;
  } else {
    EXPECT_EQ(rest, "") << found_text;
  }
  EXPECT_FALSE(Contains(found_text, "measuring")) << found_text;
}

TEST(ObtainProfileTest, UnusableProfileAtAUsersPathIsAnErrorAndIsNotTouched) {
  const std::string dir = FreshDir("user-invalid");
  const std::string path = dir + "/profile.json";
  ASSERT_TRUE(SaveProfile(SomeValidProfile(), path).ok());
  const std::string valid_text = ReadFile(path);

  struct Case {
    std::string name;
    std::string text;
    StatusCode code;
    std::string needle;
  };
  nlohmann::json old_version = nlohmann::json::parse(valid_text);
  old_version["version"] = 2;  // the version before curves
  nlohmann::json other_model = nlohmann::json::parse(valid_text);
  other_model["model"]["dim"] = 4096;
  const Case cases[] = {
      {"garbage", "{ not json", StatusCode::kDataLoss, "not valid JSON"},
      {"old version", old_version.dump(2), StatusCode::kInvalidArgument, "'version' is 2"},
      {"other model", other_model.dump(2), StatusCode::kInvalidArgument, "dim 4096"},
  };
  for (const Case& c : cases) {
    WriteFile(path, c.text);
    for (bool calibrate : {true, false}) {
      Messages messages;
      ProfileOptions o = Options(path, messages.file());
      o.calibrate = calibrate;
      StatusOr<MachineProfile> p = Obtain(o);
      ASSERT_FALSE(p.ok()) << c.name;
      EXPECT_EQ(p.status().code(), c.code) << c.name << ": " << p.status().ToString();
      EXPECT_TRUE(Contains(p.status().message(), c.needle)) << p.status().ToString();
      EXPECT_TRUE(Contains(p.status().message(), path)) << p.status().ToString();
      EXPECT_TRUE(Contains(p.status().message(), "left as it is")) << p.status().ToString();
      EXPECT_EQ(ReadFile(path), c.text) << c.name;
      EXPECT_FALSE(Contains(messages.Text(), "measuring")) << messages.Text();
    }
  }
  // Nothing else appeared beside it (no temp file, no replacement).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(ObtainProfileTest, UnusableProfileAtTheDefaultPathIsReplacedAndSaysSo) {
  const std::string cache = FreshDir("xdg-cache");
  ScopedEnv no_profile("KVL_PROFILE", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", cache);
  const std::string path = DefaultProfilePath(ProfileKey(*Stories260K().model, Stories260K().ctx));
  ASSERT_EQ(path.rfind(cache, 0), 0u) << path;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  WriteFile(path, "{ not json");

  Messages messages;
  StatusOr<MachineProfile> p = Obtain(Options("", messages.file()));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string text = messages.Text();
  EXPECT_TRUE(Contains(text, "unusable cost profile")) << text;
  EXPECT_TRUE(Contains(text, "not valid JSON")) << text;
  EXPECT_TRUE(Contains(text, "measuring this machine to replace it")) << text;
  EXPECT_TRUE(Contains(text, "kvl: cost profile saved to " + path)) << text;
  StatusOr<MachineProfile> saved = LoadProfile(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(*saved, *p);
}

// A profile measured on one thread prices the engine's matmuls and recomputes at about twice what
// its two threads take: at a default path it is measured anew, at a user's path used as given.
TEST(ObtainProfileTest, ProfileOfOtherThreadsIsReplacedAtADefaultPathAndKeptAtAUsersPath) {
  MachineProfile one_thread = SomeValidProfile();
  ASSERT_EQ(one_thread.threads, 2);  // Stories260K's pool
  one_thread.threads = 1;

  const std::string default_path = FreshDir("kvl-profile-threads") + "/p.json";
  ASSERT_TRUE(SaveProfile(one_thread, default_path).ok());
  {
    ScopedEnv env("KVL_PROFILE", default_path);
    Messages messages;
    StatusOr<MachineProfile> p = Obtain(Options("", messages.file()));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    const std::string text = messages.Text();
    EXPECT_TRUE(Contains(text, "on 1 thread(s), this run uses")) << text;
    EXPECT_TRUE(Contains(text, "measuring this machine to replace it")) << text;
    EXPECT_EQ(p->threads, 2);
    StatusOr<MachineProfile> saved = LoadProfile(default_path);
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_EQ(saved->threads, 2);
  }

  const std::string users_path = FreshDir("kvl-profile-threads-user") + "/p.json";
  ASSERT_TRUE(SaveProfile(one_thread, users_path).ok());
  const std::string before = ReadFile(users_path);
  Messages messages;
  StatusOr<MachineProfile> p = Obtain(Options(users_path, messages.file()));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, *LoadProfile(users_path));
  EXPECT_EQ(p->threads, 1);
  const std::string text = messages.Text();
  EXPECT_TRUE(Contains(text, "on 1 thread(s), this run uses")) << text;
  EXPECT_TRUE(Contains(text, "its prices are used as they are")) << text;
  EXPECT_FALSE(Contains(text, "measuring")) << text;
  EXPECT_EQ(ReadFile(users_path), before);
}

TEST(ObtainProfileTest, KvlProfileVariableIsADefaultPathToo) {
  const std::string path = FreshDir("kvl-profile-env") + "/p.json";
  ScopedEnv env("KVL_PROFILE", path);
  nlohmann::json old_version = nlohmann::json::parse([] {
    const std::string tmp = TempPath("env-source.json");
    KVL_CHECK(SaveProfile(SomeValidProfile(), tmp).ok());
    return ReadFile(tmp);
  }());
  old_version["version"] = 2;  // the version before curves: re-measured, and the message says why
  WriteFile(path, old_version.dump());

  Messages messages;
  StatusOr<MachineProfile> p = Obtain(Options("", messages.file()));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(Contains(messages.Text(), "'version' is 2")) << messages.Text();
  EXPECT_TRUE(Contains(messages.Text(), "measuring this machine to replace it")) << messages.Text();
  EXPECT_TRUE(Contains(messages.Text(), "saved to " + path)) << messages.Text();
  EXPECT_TRUE(LoadProfile(path).ok());
}

TEST(ObtainProfileTest, WithoutCalibrationDefaultsAreMarkedAndNothingIsWritten) {
  const std::string dir = FreshDir("no-calibrate");
  const std::string cache = FreshDir("no-calibrate-cache");
  ScopedEnv no_profile("KVL_PROFILE", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", cache);
  for (const std::string& path : {dir + "/profile.json", std::string()}) {
    Messages messages;
    ProfileOptions o = Options(path, messages.file());
    o.calibrate = false;
    StatusOr<MachineProfile> p = Obtain(o);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->source, kProfileSourceDefault);
    MachineProfile expected = AnalyticProfile(*Stories260K().model, Stories260K().ctx);
    expected.timestamp = p->timestamp;  // the only field that may differ
    EXPECT_EQ(*p, expected);
    EXPECT_EQ(p->memory_bytes, 0);
    EXPECT_EQ(p->disk_bytes, 0);
    const int64_t layers = p->model.layers;
    EXPECT_GT(p->recompute_from_tokens.Ms(16, layers, 0), p->recompute_from_residual.Ms(16, layers, 0));
    EXPECT_GT(p->recompute_from_residual.Ms(16, layers, 0), 0);
    EXPECT_GT(p->memory_copy_gbps, 0);
    EXPECT_GT(p->disk_buffered.read.gbps, 0);
    EXPECT_EQ(p->kld_tokens, 0);  // assumed, and --explain says so
    EXPECT_TRUE(Contains(ExplainProfile(*p), "default: assumed")) << ExplainProfile(*p);
    const std::string text = messages.Text();
    EXPECT_TRUE(Contains(text, "analytic defaults")) << text;
    EXPECT_FALSE(Contains(text, "measuring")) << text;
    EXPECT_FALSE(Contains(text, "saved")) << text;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  EXPECT_TRUE(std::filesystem::is_empty(cache));
}

TEST(ObtainProfileTest, WithoutCalibrationAUsableProfileIsStillUsed) {
  const std::string path = FreshDir("no-calibrate-valid") + "/profile.json";
  const MachineProfile valid = SomeValidProfile();
  ASSERT_TRUE(SaveProfile(valid, path).ok());
  ProfileOptions o = Options(path, nullptr);
  o.calibrate = false;
  StatusOr<MachineProfile> p = Obtain(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, valid);
}

TEST(ObtainProfileTest, AUsersPathThatCannotBeWrittenFailsBeforeMeasuring) {
  const std::string file = FreshDir("not-a-dir") + "/file";
  WriteFile(file, "x");
  Messages messages;
  StatusOr<MachineProfile> p = Obtain(Options(file + "/profile.json", messages.file()));
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Contains(p.status().message(), "is not a directory")) << p.status().ToString();
  EXPECT_FALSE(Contains(messages.Text(), "measuring")) << messages.Text();
}

// A profile measured while others took most of the CPU, at a default path.
std::string WriteBusyProfileAtADefaultPath(const std::string& dir) {
  MachineProfile busy = SomeValidProfile();
  busy.others_cpu_share = 0.8;
  busy.sample_spread = 0.1;
  busy.timestamp = "2020-01-01T00:00:00Z";
  const std::string path = dir + "/profile.json";
  KVL_CHECK(SaveProfile(busy, path).ok());
  return path;
}

ProfileOptions AtADefaultPath(const std::string& path, FILE* messages, double others_now) {
  ProfileOptions o = Options(path, messages);
  o.path_from_user = false;
  o.current_others_cpu_share = [others_now] { return std::optional<double>(others_now); };
  return o;
}

TEST(ObtainProfileTest, ABusyProfileIsMeasuredAgainOnceTheMachineIsQuiet) {
  const std::string path = WriteBusyProfileAtADefaultPath(FreshDir("busy-quiet"));
  Messages messages;
  StatusOr<MachineProfile> p = Obtain(AtADefaultPath(path, messages.file(), 0.05));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string text = messages.Text();
  EXPECT_TRUE(Contains(text, "cost profile " + path + " was measured on a busy machine (other "
                             "processes took 80% of the CPU, samples spread 10%) and the machine "
                             "is quiet now: measuring this machine again"))
      << text;
  EXPECT_NE(p->timestamp, "2020-01-01T00:00:00Z");
  StatusOr<MachineProfile> saved = LoadProfile(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(*saved, *p);
}

TEST(ObtainProfileTest, ABusyProfileIsUsedWithANoteWhileTheMachineIsStillBusy) {
  const std::string path = WriteBusyProfileAtADefaultPath(FreshDir("busy-busy"));
  Messages messages;
  StatusOr<MachineProfile> p = Obtain(AtADefaultPath(path, messages.file(), 0.9));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string text = messages.Text();
  EXPECT_EQ(p->timestamp, "2020-01-01T00:00:00Z");
  EXPECT_TRUE(Contains(text, "note: this profile was measured on a busy machine (other processes "
                             "took 80% of the CPU"))
      << text;
  EXPECT_FALSE(Contains(text, "measuring")) << text;

  // A user's file is used as given even on a quiet machine, with the command that re-measures it.
  Messages users;
  ProfileOptions o = AtADefaultPath(path, users.file(), 0.0);
  o.path_from_user = true;
  StatusOr<MachineProfile> kept = Obtain(o);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->timestamp, "2020-01-01T00:00:00Z");
  EXPECT_TRUE(Contains(users.Text(), "kvl calibrate -m MODEL -o " + path)) << users.Text();
}

// A run found a correction drifted past the bound and wrote why into the profile
// (kvl/profile_corrections.h): the next start at a default path measures it again, saying why.
TEST(ObtainProfileTest, AProfileARunFoundOffIsMeasuredAgainAtTheNextStart) {
  const std::string path = FreshDir("drifted") + "/profile.json";
  MachineProfile drifted = SomeValidProfile();
  drifted.timestamp = "2020-01-01T00:00:00Z";
  drifted.corrections = {{"recompute-tokens", 1.9, 20}};
  const std::string reason = DriftReason({"recompute-tokens", 1.9, 20, 1.5});
  drifted.remeasure_reason = reason;
  ASSERT_TRUE(SaveProfile(drifted, path).ok());

  Messages messages;
  StatusOr<MachineProfile> p = Obtain(AtADefaultPath(path, messages.file(), 0.0));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string text = messages.Text();
  EXPECT_TRUE(Contains(text, "cost profile " + path + ": a run found it off (" + reason +
                                 "): measuring this machine again"))
      << text;
  EXPECT_NE(p->timestamp, "2020-01-01T00:00:00Z");
  // A fresh measurement: no corrections of the old prices, no reason left, and why it was made.
  EXPECT_TRUE(p->corrections.empty());
  EXPECT_TRUE(p->remeasure_reason.empty());
  EXPECT_EQ(p->measured_because, reason);
  EXPECT_TRUE(MeasuredForDrift(*p));
  StatusOr<MachineProfile> saved = LoadProfile(path);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(*saved, *p);
}

TEST(ObtainProfileTest, AUsersProfileARunFoundOffIsUsedWithAWord) {
  const std::string path = FreshDir("drifted-users") + "/profile.json";
  MachineProfile drifted = SomeValidProfile();
  drifted.timestamp = "2020-01-01T00:00:00Z";
  drifted.remeasure_reason = "drift: something";
  ASSERT_TRUE(SaveProfile(drifted, path).ok());
  Messages messages;
  StatusOr<MachineProfile> p = Obtain(Options(path, messages.file()));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->timestamp, "2020-01-01T00:00:00Z");
  const std::string text = messages.Text();
  EXPECT_TRUE(Contains(text, "note: a run found this profile off (drift: something); `kvl "
                             "calibrate -m MODEL -o " + path + "` measures it again"))
      << text;
  EXPECT_FALSE(Contains(text, "measuring")) << text;
}

TEST(ObtainProfileTest, AProfileWithoutLoadFieldsReadsAsQuiet) {
  const std::string path = FreshDir("no-load-fields") + "/profile.json";
  ASSERT_TRUE(SaveProfile(SomeValidProfile(), path).ok());
  nlohmann::json j = nlohmann::json::parse(ReadFile(path));
  j["machine"].erase("others_cpu_share");
  j["machine"].erase("sample_spread");
  WriteFile(path, j.dump());
  StatusOr<MachineProfile> p = LoadProfile(path);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->others_cpu_share, 0);
  EXPECT_FALSE(MeasuredUnderLoad(*p));

  j["machine"]["others_cpu_share"] = -0.1;
  WriteFile(path, j.dump());
  EXPECT_FALSE(LoadProfile(path).ok());
}

TEST(CheckProfileWritableTest, RefusesWhatSaveProfileCouldNotOrShouldNotReplace) {
  const std::string dir = FreshDir("writable");
  EXPECT_TRUE(CheckProfileWritable(dir + "/a/b/profile.json").ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // checked, not created
  EXPECT_EQ(CheckProfileWritable(dir).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckProfileWritable("/dev/null").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckProfileWritable("").code(), StatusCode::kInvalidArgument);
  WriteFile(dir + "/file", "x");
  EXPECT_TRUE(CheckProfileWritable(dir + "/file").ok());  // an existing profile is replaced
  EXPECT_EQ(CheckProfileWritable(dir + "/file/sub/profile.json").code(),
            StatusCode::kInvalidArgument);
}

TEST(PagePricesTest, EvaluatesTheCurvesAtThePagesShapeAndCopiesTheRates) {
  MachineProfile profile = SomeValidProfile();
  profile.model.layers = 4;
  profile.model.kv_bytes_per_token_per_layer_f32 = 512;
  profile.recompute_from_residual = {0.5, 0.25, 0.01, 0, {}};
  profile.recompute_from_tokens = {1.0, 0.5, 0.02, 1e-5, {}};
  profile.ram.read = {0.01, 0.002, 11.0, 0, 0, {}};
  profile.ram.write = {0.02, 0.004, 9.0, 0, 0, {}};
  profile.disk_buffered.read = {0.03, 0.001, 3.0, 0, 0, {}};
  profile.disk_buffered.write = {0.05, 0.002, 2.0, 0, 0, {}};
  profile.disk_direct.read = {0.1, 0.05, 1.5, 0, 0, {}};
  profile.disk_direct.write = {0.2, 0.06, 0.75, 0, 0, {}};
  profile.compress_int8 = {0.001, 0.002, 4.0, 0, 0, {}};
  profile.compress_int4 = {0.001, 0.003, 2.0, 0, 0, {}};
  profile.kld_tokens = 100;
  profile.int8_kld = 2e-5;
  profile.int4_kld = 3e-3;
  ASSERT_TRUE(profile.decode_idle.Add({16, 1.0, 0.5}));
  ASSERT_TRUE(profile.decode_idle.Add({512, 1.0, 0.1}));
  PageCostProfile prices;
  prices.kv_bytes = 12345;
  prices.has_disk_tier = true;
  PagePriceOptions o;
  o.block_tokens = 32;
  o.recompute_batch_tokens = 256;
  FillPagePrices(profile, o, &prices);
  // Every layer of the profile's model, buffered disk.
  EXPECT_DOUBLE_EQ(prices.recompute_residual_ms, 0.5 + 0.25 * 4 + 0.01 * 32 * 4);
  // The page's own tokens: projections, and attention among themselves ((32 + 1) / 2 on average).
  EXPECT_DOUBLE_EQ(prices.recompute_tokens_ms, 0.02 * 32 * 4 + 1e-5 * 32 * 4 * 16.5);
  EXPECT_DOUBLE_EQ(prices.recompute_tokens_context_ms, 1e-5 * 32 * 4);
  EXPECT_DOUBLE_EQ(prices.recompute_tokens_call_ms, 1.0 + 0.5 * 4);
  EXPECT_EQ(prices.block_tokens, 32);
  EXPECT_EQ(prices.recompute_batch_tokens, 256);
  // A page deeper in the context costs more; its share of the call is 32 / 256.
  EXPECT_DOUBLE_EQ(RecomputeTokensMs(prices, 1000), 0.02 * 32 * 4 + 1e-5 * 32 * 4 * 16.5 +
                                                        1e-5 * 32 * 4 * 1000 +
                                                        (1.0 + 0.5 * 4) * 32 / 256);
  EXPECT_DOUBLE_EQ(prices.ram_gbps, 11.0);
  EXPECT_DOUBLE_EQ(prices.ram_latency_ms, 0.01 + 0.002 * 4);  // one tier page per layer
  EXPECT_DOUBLE_EQ(prices.ram_write_gbps, 9.0);
  EXPECT_DOUBLE_EQ(prices.disk_read_gbps, 3.0);
  EXPECT_DOUBLE_EQ(prices.disk_write_gbps, 2.0);
  EXPECT_DOUBLE_EQ(prices.disk_latency_ms, 0.03 + 0.001 * 4);
  EXPECT_DOUBLE_EQ(prices.disk_write_latency_ms, 0.05 + 0.002 * 4);
  const double layer_bytes = 32 * 512;
  EXPECT_DOUBLE_EQ(prices.compress_ms, 0.001 + 0.002 * 4 + 4 * layer_bytes / 4e6);
  EXPECT_DOUBLE_EQ(prices.compress_int4_ms, 0.001 + 0.003 * 4 + 4 * layer_bytes / 2e6);
  EXPECT_EQ(prices.int8_kld, 2e-5);
  EXPECT_EQ(prices.int4_kld, 3e-3);
  EXPECT_EQ(prices.decode_idle, profile.decode_idle);  // the policy evaluates it per step
  EXPECT_EQ(prices.kv_bytes, 12345);  // the caller's fields stay
  EXPECT_TRUE(prices.has_disk_tier);

  // Half the depth (a partial-depth page) and an O_DIRECT disk tier.
  o.layers = 2;
  o.disk_direct = true;
  FillPagePrices(profile, o, &prices);
  EXPECT_DOUBLE_EQ(prices.recompute_residual_ms, 0.5 + 0.25 * 2 + 0.01 * 32 * 2);
  EXPECT_DOUBLE_EQ(prices.disk_read_gbps, 1.5);
  EXPECT_DOUBLE_EQ(prices.disk_latency_ms, 0.1 + 0.05 * 2);
}

// A page set past a curve's knee is priced at the bandwidth the curve averages over its bytes,
// so the policy's latency + bytes / bandwidth is the curve's time for the page.
TEST(PagePricesTest, APagePastTheKneeIsPricedAtTheAveragedBandwidth) {
  MachineProfile profile;
  profile.model.layers = 8;
  profile.model.kv_bytes_per_token_per_layer_f32 = 16384;
  profile.memory_copy_gbps = 20;
  profile.ram.read = {0.01, 0.002, 12.0, 4 << 20, 4.0, {}};
  profile.ram.write = profile.ram.read;
  PagePriceOptions o;
  auto priced_ms = [&](int64_t tokens) {
    o.block_tokens = tokens;
    PageCostProfile prices;
    FillPagePrices(profile, o, &prices);
    const double bytes = static_cast<double>(tokens * 8 * 16384);
    return TransferMs(bytes, prices.ram_gbps, prices.ram_latency_ms);
  };
  // 16 tokens: 2 MiB, below the knee; 1024 tokens: 128 MiB, mostly past it.
  EXPECT_NEAR(priced_ms(16), profile.ram.read.Ms(8, 16 * 16384), 1e-9);
  EXPECT_NEAR(priced_ms(1024), profile.ram.read.Ms(8, 1024 * 16384), 1e-9);
  EXPECT_GT(priced_ms(1024), 0.01 + 0.016 + (128 << 20) / 12e6 * 2.5);  // not at the cache rate
  // The caller's page bytes (an f16 cache: half the f32 bytes) pick the bandwidth.
  o.page_bytes = 512 * 8 * 16384;
  o.block_tokens = 1024;
  PageCostProfile prices;
  FillPagePrices(profile, o, &prices);
  EXPECT_NEAR(TransferMs(static_cast<double>(o.page_bytes), prices.ram_gbps, prices.ram_latency_ms),
              profile.ram.read.Ms(8, 512 * 16384), 1e-9);
}

// A reader whose working set fits the last-level cache reads a tier's pages warm; one whose
// set does not, or who does not know it, reads them cold; a tier measured without warm reads
// (the analytic defaults) is read cold by everyone.
TEST(PagePricesTest, TheWorkingSetChoosesWarmOrColdReads) {
  MachineProfile profile;
  profile.model.layers = 4;
  profile.model.kv_bytes_per_token_per_layer_f32 = 4096;
  profile.cache_bytes = 32 << 20;
  profile.ram.read = {0.001, 0.0005, 5.0, 0, 0, {{1, 4096, 0.002}}};
  profile.ram.warm_read = {0.001, 0.0002, 15.0, 0, 0, {{1, 4096, 0.001}}};
  profile.ram.write = profile.ram.read;
  profile.disk_direct.read = {0.05, 0.01, 2.0, 0, 0, {{1, 4096, 0.07}}};
  profile.disk_direct.warm_read = {0.04, 0.01, 2.5, 0, 0, {{1, 4096, 0.06}}};
  profile.disk_direct.write = profile.disk_direct.read;
  PagePriceOptions o;
  o.disk_direct = true;
  auto prices_for = [&](int64_t working_set_bytes) {
    o.working_set_bytes = working_set_bytes;
    PageCostProfile prices;
    FillPagePrices(profile, o, &prices);
    return prices;
  };
  const PageCostProfile fits = prices_for(8 << 20), spills = prices_for(64 << 20),
                        unknown = prices_for(0);
  EXPECT_DOUBLE_EQ(fits.ram_gbps, 15.0);
  EXPECT_DOUBLE_EQ(fits.ram_latency_ms, 0.001 + 0.0002 * 4);
  EXPECT_DOUBLE_EQ(fits.disk_read_gbps, 2.5);
  for (const PageCostProfile& cold : {spills, unknown}) {
    EXPECT_DOUBLE_EQ(cold.ram_gbps, 5.0);
    EXPECT_DOUBLE_EQ(cold.ram_latency_ms, 0.001 + 0.0005 * 4);
    EXPECT_DOUBLE_EQ(cold.disk_read_gbps, 2.0);
  }
  // Writes are the same whatever the reader's set.
  EXPECT_DOUBLE_EQ(fits.ram_write_gbps, spills.ram_write_gbps);
  profile.ram.warm_read = TransferCurve{};
  EXPECT_DOUBLE_EQ(prices_for(8 << 20).ram_gbps, 5.0);
  // At exactly the cache's size the set still fits.
  EXPECT_EQ(&profile.disk_direct.ReadFor(32 << 20, 32 << 20), &profile.disk_direct.warm_read);
  EXPECT_EQ(&profile.disk_direct.ReadFor((32 << 20) + 1, 32 << 20), &profile.disk_direct.read);
  EXPECT_EQ(&profile.disk_direct.ReadFor(8 << 20, 0), &profile.disk_direct.read);
}

TEST(EstimateTest, GrowsWithTheWorkAndIsAtLeastASecond) {
  const LoadedModel& m = Stories260K();
  EXPECT_GE(EstimateCalibrationSeconds(*m.model, m.ctx, TinyCalibrateOptions()), 1);
  CalibrateOptions big = TinyCalibrateOptions();
  big.disk_bytes = int64_t{4} << 30;
  EXPECT_GT(EstimateCalibrationSeconds(*m.model, m.ctx, big),
            EstimateCalibrationSeconds(*m.model, m.ctx, TinyCalibrateOptions()) + 10);
}

}  // namespace
}  // namespace kvl::testing
