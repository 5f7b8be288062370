// The command line's checks that the split into per-command flag files (src/cli/*_flags.cc)
// added: bench quality's validation, the engine flag groups bench turns shares with run, and the
// benches' one LeadingAgreement. Parsed in process (ParseCommandLine runs nothing).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/bench/reply_agreement.h"
#include "cli/options.h"

namespace kvl::cli {
namespace {

std::string ParseError(const std::vector<std::string>& args) {
  StatusOr<ParsedCommand> parsed = ParseCommandLine(args);
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(BenchQualityFlagsTest, BadValuesAreErrorsNamingTheFlag) {
  const std::vector<std::string> base = {"bench", "quality", "-m", "model.gguf"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return ParseError(args);
  };
  EXPECT_EQ(with({}), "");
  EXPECT_EQ(with({"-t", "2", "-o", "json"}), "");
  EXPECT_NE(with({"-t", "-1"}).find("-t (--threads; 0 = every core) must be in [0, "),
            std::string::npos);
  EXPECT_NE(with({"-t", "100000"}).find("-t (--threads"), std::string::npos);
  EXPECT_EQ(with({"-o", "csv"}), "-o must be table or json, got 'csv'");
  EXPECT_NE(with({"--json", "/tmp"}).find("--json '/tmp' is a directory"), std::string::npos);
  EXPECT_NE(with({"--json", "/no/such/dir/q.json"}).find("the directory '/no/such/dir' does not exist"),
            std::string::npos);
  EXPECT_NE(with({"-f", ""}).find("-f must name a text file"), std::string::npos);
  EXPECT_EQ(ParseError({"bench", "quality", "-m", ""}), "-m must name a GGUF model file, got ''");
  EXPECT_EQ(with({"--ctx", "128", "--chunks", "0"}), "");
  EXPECT_NE(with({"--ctx", "8"}).find("--ctx (tokens per chunk"), std::string::npos);
  EXPECT_NE(with({"--chunks", "-1"}).find("--chunks (0 = every one) must be in [0, "),
            std::string::npos);
}

TEST(BenchSpecFlagsTest, NegativeThreadsAreRefused) {
  EXPECT_NE(ParseError({"bench", "spec", "-m", "m.gguf", "-t", "-3"}).find("-t (--threads"),
            std::string::npos);
  EXPECT_EQ(ParseError({"bench", "spec", "-m", "m.gguf", "-t", "3"}), "");
}

// bench turns takes the engine's flag groups (not copies): the same spellings reach the same
// fields as in run, and the engine's own validation answers for them.
TEST(BenchTurnsFlagsTest, SharedEngineFlagsReachTheEngineOptions) {
  StatusOr<ParsedCommand> parsed = ParseCommandLine(
      {"bench", "turns", "-m", "m.gguf", "-t", "3", "-c", "512", "-b", "64", "--isa", "scalar",
       "-ctk", "f16", "-ctv", "q8_0", "--kv-profile", "p.json", "--no-calibrate", "--kv-sink",
       "8", "--kv-recent", "32", "--kv-stream-reserve", "0.5"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_EQ(parsed->kind, ParsedCommand::Kind::kBenchTurns);
  const EngineOptions& e = parsed->bench_turns.engine;
  EXPECT_EQ(e.num_threads, 3);
  EXPECT_EQ(e.context_length, 512);
  EXPECT_EQ(e.batch_size, 64);
  EXPECT_EQ(e.isa, "scalar");
  EXPECT_EQ(e.cache_type_k, "f16");
  EXPECT_EQ(e.cache_type_v, "q8_0");
  EXPECT_EQ(e.profile_path, "p.json");
  EXPECT_FALSE(e.calibrate);
  EXPECT_EQ(e.kv_sink_tokens, 8);
  EXPECT_EQ(e.kv_recent_tokens, 32);
  EXPECT_DOUBLE_EQ(e.kv_stream_reserve, 0.5);
  // What the engine refuses, bench turns refuses when parsed.
  EXPECT_NE(ParseError({"bench", "turns", "-m", "m.gguf", "-ctk", "q2"}), "");
  // Flags run has and bench turns does not honour stay unknown to it.
  EXPECT_NE(ParseError({"bench", "turns", "-m", "m.gguf", "--kv-policy", "evict"}), "");
}

// The quality prices (kvl/kv_policy.h KvQualityPrices) are engine flags of run, chat and serve:
// each reaches its field, the defaults stand where none is given, and a bad value is refused
// when parsed, naming its flag.
TEST(KvPriceFlagsTest, PricesReachTheEngineAndBadValuesNameTheFlag) {
  StatusOr<ParsedCommand> parsed = ParseCommandLine(
      {"run", "-m", "m.gguf", "--kv-price-kld-balanced", "2e4", "--kv-price-kld-aggressive",
       "500", "--kv-price-evict-balanced", "7000", "--kv-price-evict-aggressive", "0"});
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const KvQualityPrices& p = parsed->run.engine.kv_quality_prices;
  EXPECT_DOUBLE_EQ(p.balanced_ms_per_kld, 2e4);
  EXPECT_DOUBLE_EQ(p.aggressive_ms_per_kld, 500);
  EXPECT_DOUBLE_EQ(p.balanced_ms_per_evicted_mass, 7000);
  EXPECT_DOUBLE_EQ(p.aggressive_ms_per_evicted_mass, 0);
  StatusOr<ParsedCommand> defaults = ParseCommandLine({"serve", "-m", "m.gguf"});
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_EQ(defaults->serve.serve.engine.kv_quality_prices, KvQualityPrices{});

  EXPECT_NE(ParseError({"run", "-m", "m.gguf", "--kv-price-evict-balanced", "-3"})
                .find("--kv-price-evict-balanced must be a finite price >= 0"),
            std::string::npos);
  EXPECT_NE(ParseError({"run", "-m", "m.gguf", "--kv-price-kld-aggressive", "inf"})
                .find("--kv-price-kld-aggressive"),
            std::string::npos);
  EXPECT_NE(ParseError({"run", "-m", "m.gguf", "--kv-price-kld-balanced", "cheap"})
                .find("--kv-price-kld-balanced"),
            std::string::npos);
  EXPECT_NE(ParseError({"run", "-m", "m.gguf", "--kv-price-evict-aggressive", "6000"})
                .find("--kv-price-evict-aggressive (6000) is above --kv-price-evict-balanced"),
            std::string::npos);
}

TEST(KvProfileDriftFlagTest, ReachesTheEngineAndABoundOfOneOrLessIsRefused) {
  StatusOr<ParsedCommand> defaults = ParseCommandLine({"run", "-m", "m.gguf"});
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_DOUBLE_EQ(defaults->run.engine.kv_profile_drift, kDefaultProfileDriftBound);
  StatusOr<ParsedCommand> run = ParseCommandLine({"run", "-m", "m.gguf", "--kv-profile-drift", "2"});
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_DOUBLE_EQ(run->run.engine.kv_profile_drift, 2.0);
  EXPECT_EQ(ParseError({"run", "-m", "m.gguf", "--kv-profile-drift", "0"}), "");  // never
  for (const char* bad : {"1", "0.9", "0.5"}) {
    EXPECT_NE(ParseError({"run", "-m", "m.gguf", "--kv-profile-drift", bad})
                  .find("--kv-profile-drift must be a factor above 1"),
              std::string::npos)
        << bad;
  }
}

TEST(SeedFlagTest, EveryCommandsSeedIsParsedWhole) {
  StatusOr<ParsedCommand> run = ParseCommandLine({"run", "-m", "m.gguf", "-s", "18446744073709551615"});
  ASSERT_TRUE(run.ok()) << run.status().message();
  EXPECT_EQ(run->run.sampling.seed, 18446744073709551615ull);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"run", "-m", "m.gguf", "-s", "18446744073709551616"},
        std::vector<std::string>{"chat", "-m", "m.gguf", "--seed", "x1"},
        std::vector<std::string>{"synth", "--shape", "tiny-test", "-o", "x", "--seed", "1x"},
        std::vector<std::string>{"bench", "serve", "--seed", ""},
        std::vector<std::string>{"bench", "turns", "-m", "m.gguf", "--seed", "2e3"}}) {
    EXPECT_NE(ParseError(args).find("--seed must be an integer"), std::string::npos) << args[0];
  }
}

TEST(LeadingAgreementTest, CountsTheReferenceReproducedBeforeTheFirstDifference) {
  EXPECT_DOUBLE_EQ(LeadingAgreement({1, 2, 3, 4}, {1, 2, 3, 4}), 1.0);
  EXPECT_DOUBLE_EQ(LeadingAgreement({1, 2, 9, 4}, {1, 2, 3, 4}), 0.5);
  EXPECT_DOUBLE_EQ(LeadingAgreement({9, 2, 3, 4}, {1, 2, 3, 4}), 0.0);
  EXPECT_DOUBLE_EQ(LeadingAgreement({1, 2}, {1, 2, 3, 4}), 0.5);        // stopped early
  EXPECT_DOUBLE_EQ(LeadingAgreement({1, 2, 3, 4, 5}, {1, 2, 3, 4}), 1.0);  // went on
}

// The two copies this replaced answered 1 and 0 for an empty reference, each for every run.
TEST(LeadingAgreementTest, AnEmptyReferenceAgreesOnlyWithAnEmptyRun) {
  EXPECT_DOUBLE_EQ(LeadingAgreement({}, {}), 1.0);
  EXPECT_DOUBLE_EQ(LeadingAgreement({7}, {}), 0.0);
  EXPECT_DOUBLE_EQ(LeadingAgreement({}, {7}), 0.0);
}

}  // namespace
}  // namespace kvl::cli
