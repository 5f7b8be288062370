// Speculative decoding from the command line (issue 26): the flags, kvl run's summary line, and
// kvl bench spec's JSON (identical tokens on every workload).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "run_command.h"
#include "test_paths.h"

namespace kvl {
namespace {

using testing::CommandResult;
using testing::RunKvl;

TEST(SpecCliTest, RunPrintsTheDraftsAndGivesPlainDecodingsText) {
  const std::string run = "run -m " + testing::Stories260KPath() +
                          " -p 'Lily and Ben went to the park. Lily and Ben went to the park. Lily "
                          "and Ben' -n 64 --temp 0 -t 1 --no-calibrate";
  CommandResult spec = RunKvl(run + " --spec ngram --spec-force --draft-max 4", true);
  ASSERT_EQ(spec.exit_code, 0) << spec.output;
  EXPECT_NE(spec.output.find("kvl: spec: "), std::string::npos) << spec.output;
  EXPECT_EQ(spec.output.find("kvl: spec: 0 drafted"), std::string::npos) << spec.output;
  EXPECT_EQ(RunKvl(run + " --spec ngram --spec-force", false).output,
            RunKvl(run + " --spec off", false).output);
  // With speculation off there are no drafts to report (the line once said "0 drafted" here).
  CommandResult off = RunKvl(run + " --spec off", true);
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_EQ(off.output.find("kvl: spec:"), std::string::npos) << off.output;
}

// A draft model from the command line: -md with --spec draft, stories260K drafting for itself.
TEST(SpecCliTest, RunWithADraftModelGivesPlainDecodingsText) {
  const std::string run = "run -m " + testing::Stories260KPath() +
                          " -p 'Once upon a time' -n 64 --temp 0 -t 1 --no-calibrate";
  const std::string draft = " --spec draft -md " + testing::Stories260KPath() + " --spec-force";
  CommandResult spec = RunKvl(run + draft, true);
  ASSERT_EQ(spec.exit_code, 0) << spec.output;
  EXPECT_NE(spec.output.find("(100.0% acceptance)"), std::string::npos) << spec.output;
  EXPECT_EQ(RunKvl(run + draft, false).output, RunKvl(run + " --spec off", false).output);
  CommandResult alone = RunKvl(run + " -md " + testing::Stories260KPath(), true);
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(alone.output.find("--spec draft"), std::string::npos) << alone.output;
}

TEST(SpecCliTest, BadSpecFlagsAreRefusedByName) {
  const std::string run = "run -m " + testing::Stories260KPath() + " -n 4 --no-calibrate";
  CommandResult bad = RunKvl(run + " --spec sometimes", true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--spec"), std::string::npos) << bad.output;
  CommandResult zero = RunKvl(run + " --draft-max 0", true);
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.output.find("--draft-max"), std::string::npos) << zero.output;
  CommandResult draft = RunKvl(run + " --spec draft", true);
  EXPECT_NE(draft.exit_code, 0);
  EXPECT_NE(draft.output.find("-md"), std::string::npos) << draft.output;
}

TEST(SpecCliTest, BenchSpecReportsEveryWorkloadWithIdenticalTokens) {
  CommandResult r = RunKvl("bench spec -m " + testing::Stories260KPath() +
                               " -t 1 -n 32 --runs 1 -r 1 --depth 32 -o json",
                           false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["workloads"].size(), 8u);
  for (const auto& w : j["workloads"]) {
    EXPECT_TRUE(w["identical_tokens"].get<bool>()) << w["name"];
    EXPECT_GT(w["plain_tok_s"].get<double>(), 0) << w["name"];
  }
  ASSERT_GE(j["step_ms"].size(), 2u);
  EXPECT_EQ(j["step_ms"][0]["rows"].get<int>(), 1);
}

// --spec takes a list: each mode is compared with the same plain runs; a mode it does not know
// is refused by name.
TEST(SpecCliTest, BenchSpecComparesEachModeOfAList) {
  const std::string bench = "bench spec -m " + testing::Stories260KPath() +
                            " -t 1 -n 16 --runs 1 -r 1 --depth 16 -o json "
                            "--workloads retell,agent-repeat,chat-resubmit,prose --spec ";
  CommandResult r = RunKvl(bench + "ngram,auto", false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["workloads"].size(), 8u);
  EXPECT_EQ(j["workloads"][0]["drafter"], "ngram");
  EXPECT_EQ(j["workloads"][1]["drafter"], "auto");
  EXPECT_EQ(j["workloads"][0]["plain_tok_s"], j["workloads"][1]["plain_tok_s"]);
  CommandResult bad = RunKvl(bench + "ngram,magic", true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("'magic'"), std::string::npos) << bad.output;
  CommandResult no_such = RunKvl("bench spec -m " + testing::Stories260KPath() +
                                     " --workloads retell,poetry",
                                 true);
  EXPECT_NE(no_such.exit_code, 0);
  EXPECT_NE(no_such.output.find("'poetry'"), std::string::npos) << no_such.output;
}

// The workloads that repeat an earlier request: an agent re-issuing the same task drafts its
// first run's output from the recent-requests index (--spec auto), nearly all of it accepted;
// the prompt lookup alone (ngram) has no such index. (--spec-force: every draft is sent, so the
// counts do not depend on the machine's step times.)
TEST(SpecCliTest, BenchSpecAgentRepeatDraftsTheEarlierRun) {
  CommandResult r = RunKvl("bench spec -m " + testing::Stories260KPath() +
                               " -t 1 -n 64 --runs 1 -r 1 --depth 16 -o json --spec-force "
                               "--workloads agent-repeat --spec ngram,auto",
                           false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["workloads"].size(), 2u);
  const nlohmann::json& ngram = j["workloads"][0];
  const nlohmann::json& suffix = j["workloads"][1];
  ASSERT_EQ(suffix["drafter"], "auto");
  EXPECT_TRUE(suffix["identical_tokens"].get<bool>());
  EXPECT_GT(suffix["tokens_per_step"].get<double>(), 2.0) << suffix.dump();
  EXPECT_GT(suffix["tokens_per_step"].get<double>(), ngram["tokens_per_step"].get<double>());
}

TEST(SpecCliTest, BenchSpecAddsTheDraftModelsRows) {
  CommandResult r = RunKvl("bench spec -m " + testing::Stories260KPath() + " -md " +
                               testing::Stories260KPath() +
                               " -t 1 -n 32 --runs 1 -r 1 --depth 32 -o json "
                               "--workloads retell,document-qa,chat-quote,prose",
                           false);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["workloads"].size(), 8u);  // four workloads, auto (the default) and draft
  int draft_rows = 0;
  for (const auto& w : j["workloads"]) {
    EXPECT_TRUE(w["identical_tokens"].get<bool>()) << w["name"] << " " << w["drafter"];
    if (w["drafter"] != "draft") continue;
    ++draft_rows;
    // Drafting for itself, every draft token the model sends is its own next token.
    if (w["drafted"].get<int>() > 0) {
      EXPECT_DOUBLE_EQ(w["acceptance"].get<double>(), 1.0);
    }
  }
  EXPECT_EQ(draft_rows, 4);
}

}  // namespace
}  // namespace kvl
