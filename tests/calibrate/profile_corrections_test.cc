// The engine's measured corrections kept in the profile: when one has drifted past the bound,
// and writing them back (a round trip that keeps every measurement, into the profile they were
// measured against only, and never half a file).
#include "kvl/profile_corrections.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "calibration_test_util.h"
#include "kvl/cost_profile.h"

namespace kvl::testing {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A valid profile of stories260K, as if measured earlier (no measuring).
MachineProfile MeasuredEarlier() {
  MachineProfile p = AnalyticProfile(*Stories260K().model, Stories260K().ctx);
  p.source = std::string(kProfileSourceMeasured);
  p.memory_bytes = 1;
  p.disk_bytes = 1;
  p.disk_dir = "/tmp";
  p.timestamp = "2026-01-02T03:04:05Z";
  return p;
}

TEST(CorrectionDriftTest, OnlyACorrectionPastTheBoundWithEnoughEventsDrifts) {
  const double bound = kDefaultProfileDriftBound;  // 1.5
  // Within the bound either way: the corrections take the difference out, no new measurement.
  EXPECT_FALSE(FindCorrectionDrift(std::vector<PriceCorrection>{{"recompute-tokens", 1.4, 50},
                                                                {"demote-ram", 0.7, 50}},
                                   bound)
                   .has_value());
  // Past it, but on too few events to say.
  EXPECT_FALSE(FindCorrectionDrift(
                   std::vector<PriceCorrection>{{"recompute-tokens", 1.8, kMinDriftEvents - 1}},
                   bound)
                   .has_value());
  // Past it on enough events: slower than the profile says...
  std::optional<CorrectionDrift> slow = FindCorrectionDrift(
      std::vector<PriceCorrection>{{"demote-ram", 1.1, 30}, {"recompute-tokens", 1.8, 8}}, bound);
  ASSERT_TRUE(slow.has_value());
  EXPECT_EQ(slow->key, "recompute-tokens");
  EXPECT_EQ(slow->Describe(),
            "the measured correction of recompute-tokens is 1.80x over 8 events, past the bound "
            "of 1.50x (--kv-profile-drift)");
  // ... or faster (a profile measured under load), and the furthest one is named.
  std::optional<CorrectionDrift> fast = FindCorrectionDrift(
      std::vector<PriceCorrection>{{"recompute-tokens", 1.8, 8}, {"demote-ram", 0.4, 9}}, bound);
  ASSERT_TRUE(fast.has_value());
  EXPECT_EQ(fast->key, "demote-ram");
  // 0: never.
  EXPECT_FALSE(
      FindCorrectionDrift(std::vector<PriceCorrection>{{"demote-ram", 0.4, 9}}, 0.0).has_value());
}

TEST(CorrectionDriftTest, AProfileMeasuredForADriftSaysSo) {
  MachineProfile p = MeasuredEarlier();
  EXPECT_FALSE(MeasuredForDrift(p));
  p.measured_because = DriftReason({"recompute-tokens", 1.8, 8, 1.5});
  EXPECT_TRUE(MeasuredForDrift(p));
  p.measured_because = "busy: the last measurement was on a busy machine";
  EXPECT_FALSE(MeasuredForDrift(p));
}

TEST(WriteBackTest, CorrectionsSurviveARestartAndEveryMeasurementStays) {
  const std::string path = FreshDir("write-back") + "/profile.json";
  const MachineProfile measured = MeasuredEarlier();
  ASSERT_TRUE(SaveProfile(measured, path).ok());

  const std::vector<PriceCorrection> corrections = {{"recompute-tokens", 1.3, 12},
                                                    {"redis", 0.8, 3}};
  StatusOr<bool> written = WriteBackCorrections(path, measured.timestamp, corrections, "");
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_TRUE(*written);

  // The next run reads them back, beside measurements that did not move.
  StatusOr<MachineProfile> next = LoadProfile(path);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->corrections, corrections);
  EXPECT_TRUE(next->remeasure_reason.empty());
  MachineProfile expected = measured;
  expected.corrections = corrections;
  EXPECT_EQ(*next, expected);

  // A reason to measure again rides along, and is read back too.
  ASSERT_TRUE(WriteBackCorrections(path, measured.timestamp, corrections, "drift: x").ok());
  StatusOr<MachineProfile> flagged = LoadProfile(path);
  ASSERT_TRUE(flagged.ok()) << flagged.status().ToString();
  EXPECT_EQ(flagged->remeasure_reason, "drift: x");
}

TEST(WriteBackTest, NothingIsWrittenIntoAProfileMeasuredSince) {
  const std::string path = FreshDir("write-back-other") + "/profile.json";
  MachineProfile newer = MeasuredEarlier();
  newer.timestamp = "2026-06-01T00:00:00Z";  // another run measured the machine since
  ASSERT_TRUE(SaveProfile(newer, path).ok());
  const std::string before = ReadFile(path);
  StatusOr<bool> written = WriteBackCorrections(path, "2026-01-02T03:04:05Z",
                                                std::vector<PriceCorrection>{{"demote-ram", 2, 9}},
                                                "");
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_FALSE(*written);
  EXPECT_EQ(ReadFile(path), before);

  // Nor into one that is gone.
  std::filesystem::remove(path);
  StatusOr<bool> gone = WriteBackCorrections(path, newer.timestamp, {}, "");
  ASSERT_TRUE(gone.ok()) << gone.status().ToString();
  EXPECT_FALSE(*gone);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(WriteBackTest, AFailedWriteLeavesTheWholeOldProfile) {
  const std::string path = FreshDir("write-back-fails") + "/profile.json";
  const MachineProfile measured = MeasuredEarlier();
  ASSERT_TRUE(SaveProfile(measured, path).ok());
  const std::string before = ReadFile(path);
  // The temp file the new text goes to first cannot be made: a directory stands in its way.
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  std::filesystem::create_directories(temp + "/blocker");
  StatusOr<bool> written = WriteBackCorrections(
      path, measured.timestamp, std::vector<PriceCorrection>{{"demote-ram", 2, 9}}, "");
  EXPECT_FALSE(written.ok());
  // The profile is the old one, whole: still valid, byte for byte.
  EXPECT_EQ(ReadFile(path), before);
  StatusOr<MachineProfile> still = LoadProfile(path);
  ASSERT_TRUE(still.ok()) << still.status().ToString();
  EXPECT_TRUE(still->corrections.empty());
  std::filesystem::remove_all(temp);
}

TEST(WriteBackTest, CorrectionsOfBadShapeAreRefusedOnLoad) {
  const std::string path = FreshDir("write-back-bad") + "/profile.json";
  MachineProfile p = MeasuredEarlier();
  p.corrections = {{"demote-ram", 2, 9}};
  ASSERT_TRUE(SaveProfile(p, path).ok());
  std::string text = ReadFile(path);
  const size_t at = text.find("\"scale\": 2");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, std::string("\"scale\": 2").size(), "\"scale\": -1");
  WriteFile(path, text);
  StatusOr<MachineProfile> loaded = LoadProfile(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("corrections[0].scale"), std::string::npos)
      << loaded.status().ToString();
}

}  // namespace
}  // namespace kvl::testing
