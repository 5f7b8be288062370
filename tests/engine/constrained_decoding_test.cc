// Constrained decoding end to end on stories260K (issue 42): every output under a JSON schema's
// grammar, greedy and sampled, ends at the grammar's end and is JSON the schema accepts; greedy
// takes the best token the grammar allows; a grammar that dead-ends ends the request with an
// error; a grammar that does not parse is refused at Submit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "grammar/json_schema_check.h"
#include "grammar/json_schema_suite.h"
#include "kvl/engine.h"
#include "kvl/json_schema_grammar.h"
#include "kvl/token_mask.h"
#include "test_paths.h"

namespace kvl {
namespace {

using json = nlohmann::json;

std::unique_ptr<Engine> MakeEngine() {
  EngineOptions o;
  o.model_path = testing::Stories260KPath();
  o.num_threads = 2;
  o.context_length = 4096;
  o.max_seqs = 16;
  o.calibrate = false;
  o.profile_path = testing::ProcessProfilePath();
  auto e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

struct Output {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<std::vector<TokenLogprob>> alternatives;  // per token, when asked
  std::string finish_reason;
  Status error;
  bool finished = false;
};

Request ConstrainedRequest(const std::string& gbnf, float temperature, uint64_t seed) {
  Request r;
  r.prompt = "Once upon a time";
  r.max_new_tokens = 3000;  // far past what the bounded schemas can take
  r.sampling.temperature = temperature;
  r.sampling.top_k = 0;
  r.sampling.top_p = 1.0f;
  r.sampling.min_p = 0.0f;
  r.sampling.seed = seed;
  r.grammar = gbnf;
  return r;
}

void SubmitInto(Engine& e, const Request& r, Output* out) {
  const StatusOr<RequestId> id = e.Submit(r, [out](const TokenEvent& ev) {
    out->text += ev.text;
    if (ev.token >= 0) {
      out->tokens.push_back(ev.token);
      out->alternatives.push_back(ev.top_logprobs);
    }
    if (ev.finished) {
      out->finished = true;
      out->finish_reason = ev.finish_reason;
      out->error = ev.error;
    }
  });
  ASSERT_TRUE(id.ok()) << id.status().ToString();
}

TEST(ConstrainedDecodingTest, EverySchemaOutputIsValidJsonGreedyAndSampled) {
  std::unique_ptr<Engine> e = MakeEngine();
  ASSERT_NE(e, nullptr);
  const auto& suite = testing::BoundedSchemaSuite();
  struct Run {
    std::string name;
    float temperature;
    Output output;
  };
  std::vector<Run> runs;
  runs.reserve(suite.size() * 3);
  for (const auto& s : suite) {
    const StatusOr<std::string> gbnf = JsonSchemaToGbnf(json::parse(s.schema));
    ASSERT_TRUE(gbnf.ok()) << s.name << ": " << gbnf.status().ToString();
    for (const auto& [temperature, seed] :
         std::vector<std::pair<float, uint64_t>>{{0.0f, 1}, {1.0f, 2}, {1.0f, 3}}) {
      runs.push_back({s.name, temperature, {}});
      SubmitInto(*e, ConstrainedRequest(*gbnf, temperature, seed), &runs.back().output);
    }
  }
  e->RunUntilIdle();
  int64_t tokens = 0;
  std::set<std::string> distinct;
  for (const Run& run : runs) {
    const Output& out = run.output;
    SCOPED_TRACE(run.name + " at temperature " + std::to_string(run.temperature));
    ASSERT_TRUE(out.finished);
    ASSERT_TRUE(out.error.ok()) << out.error.ToString();
    // The grammar's end, reached: the model had to stop there.
    EXPECT_EQ(out.finish_reason, "eos") << out.text;
    const json value = json::parse(out.text, nullptr, false);
    ASSERT_FALSE(value.is_discarded()) << "not JSON: " << out.text;
    const json schema = json::parse(
        std::find_if(suite.begin(), suite.end(), [&](auto& s) { return run.name == s.name; })
            ->schema);
    EXPECT_EQ(testing::SchemaChecker(schema).Check(value), "") << out.text;
    tokens += static_cast<int64_t>(out.tokens.size());
    distinct.insert(out.text);
  }
  // The outputs are real generations, not one fixed text per schema.
  EXPECT_GT(distinct.size(), suite.size() * 2);
  EXPECT_GT(tokens, static_cast<int64_t>(suite.size()) * 10);
  std::printf("%zu constrained outputs, %lld tokens, %zu distinct\n", runs.size(),
              static_cast<long long>(tokens), distinct.size());
}

TEST(ConstrainedDecodingTest, GreedyTakesTheMostLikelyAllowedToken) {
  std::unique_ptr<Engine> e = MakeEngine();
  ASSERT_NE(e, nullptr);
  const std::string gbnf = *JsonSchemaToGbnf(json::parse(
      R"({"type":"object","properties":{"story":{"type":"string","maxLength":40},"n":{"type":"integer"}},"required":["story","n"]})"));
  Request r = ConstrainedRequest(gbnf, 0.0f, 1);
  r.top_logprobs = 20;
  Output out;
  SubmitInto(*e, r, &out);
  e->RunUntilIdle();
  ASSERT_TRUE(out.error.ok()) << out.error.ToString();
  ASSERT_EQ(out.finish_reason, "eos");
  // Replay the output through the same grammar: each token was allowed, and no allowed token
  // among the 20 most likely was more likely than it.
  const Tokenizer& tok = e->tokenizer();
  std::vector<std::string> pieces(static_cast<size_t>(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.type(id) != TokenType::kControl) pieces[static_cast<size_t>(id)] = tok.TokenPiece(id, false);
  }
  auto vocab = std::make_shared<GrammarVocabulary>(pieces, tok.end_of_generation_ids());
  GrammarConstraint replay(*ParseGbnf(gbnf), vocab);
  int differs_from_unconstrained = 0;
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    bool any = false;
    const uint64_t* mask = replay.AllowedTokens(&any);
    auto allowed = [&](int32_t id) { return (mask[id / 64] >> (id % 64)) & 1; };
    const int32_t token = out.tokens[i];
    ASSERT_TRUE(allowed(token)) << "step " << i;
    float token_logprob = 0;
    for (const TokenLogprob& alt : out.alternatives[i]) {
      if (alt.token == token) token_logprob = alt.logprob;
    }
    for (const TokenLogprob& alt : out.alternatives[i]) {
      if (allowed(alt.token)) {
        EXPECT_LE(alt.logprob, token_logprob) << "step " << i << ": allowed token " << alt.token
                                              << " was more likely than " << token;
      }
    }
    differs_from_unconstrained += out.alternatives[i][0].token != token;
    ASSERT_TRUE(replay.Accept(token).ok());
  }
  // The mask mattered: the model's own favourite was refused at some steps.
  EXPECT_GT(differs_from_unconstrained, 3);
}

TEST(ConstrainedDecodingTest, ADeadEndEndsWithAnErrorAndBadGrammarsAreRefused) {
  std::unique_ptr<Engine> e = MakeEngine();
  ASSERT_NE(e, nullptr);
  // A four-byte character the vocabulary spells only with byte tokens: reached, then the end.
  Output out;
  SubmitInto(*e, ConstrainedRequest("root ::= \"{\" [\\U0010FFFF]", 0.0f, 1), &out);
  e->RunUntilIdle();
  ASSERT_TRUE(out.finished);
  EXPECT_EQ(out.finish_reason, "eos") << out.error.ToString();
  EXPECT_EQ(out.text, "{\U0010FFFF");

  // A dead end: after "{" the grammar wants a surrogate, which no UTF-8 text can hold.
  Output dead;
  SubmitInto(*e, ConstrainedRequest("root ::= \"{\" [\\uD800-\\uDFFF]", 0.0f, 1), &dead);
  e->RunUntilIdle();
  ASSERT_TRUE(dead.finished);
  EXPECT_EQ(dead.finish_reason, "error");
  EXPECT_EQ(dead.text, "{");
  EXPECT_NE(dead.error.message().find("the grammar allows no token"), std::string::npos)
      << dead.error.ToString();

  Request bad = ConstrainedRequest("root ::= \"a\" |\n  [z-a]", 0.0f, 1);
  const StatusOr<RequestId> refused = e->Submit(bad, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("line 2, column 5"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace kvl
