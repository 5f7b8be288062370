// Every request field llama-server and vLLM document is honoured or refused (issue 44): a walk
// over their lists on real `kvl serve` processes, the observable effect of the fields kvlattice
// maps from llama-server's names, and --lenient.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server_process.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::EngineReference;
using testing::GreedyReference;
using testing::PostJson;
using testing::ServerProcess;

constexpr const char* kPrompt = "Once upon a time";

// What the walk expects of a field sent with its value.
enum class Expect {
  kHonoured,  // 200
  kInert,     // 200: it only tunes a sampler that is off (dry_base while dry_multiplier is 0)
  kRefused,   // 400 whose error.param names the field
};

struct Field {
  const char* name;
  const char* value;  // JSON
  Expect expect;
  const char* with = "";  // JSON members the field needs beside it (",\"logprobs\":true")
};

constexpr Expect H = Expect::kHonoured, I = Expect::kInert, R = Expect::kRefused;

// llama-server's POST /completion options, in the order of tools/server/README.md
// ("POST /completion: Given a prompt, it returns the predicted completion", *Options*).
const std::vector<Field> kLlamaCompletionFields = {
    {"prompt", R"("Once")", H},
    {"temperature", "0.5", H},
    {"dynatemp_range", "0.5", R},
    {"dynatemp_exponent", "2", I},
    {"top_k", "1", H},
    {"top_p", "0.5", H},
    {"min_p", "0.1", H},
    {"n_predict", "2", H},
    {"n_indent", "2", R},
    {"n_keep", "5", R},
    {"n_cmpl", "2", R},
    {"n_cache_reuse", "256", R},
    {"stream", "true", H},
    {"stop", R"(["\n"])", H},
    {"typical_p", "0.5", R},
    {"repeat_penalty", "1.3", H},
    {"repeat_last_n", "16", H},
    {"presence_penalty", "0.5", H},
    {"frequency_penalty", "0.5", H},
    {"dry_multiplier", "0.8", R},
    {"dry_base", "2", I},
    {"dry_allowed_length", "3", I},
    {"dry_penalty_last_n", "32", I},
    {"dry_sequence_breakers", R"(["\n"])", I},
    {"xtc_probability", "0.5", R},
    {"xtc_threshold", "0.2", I},
    {"mirostat", "2", R},
    {"mirostat_tau", "4", I},
    {"mirostat_eta", "0.2", I},
    {"grammar", R"("root ::= [a-z]+")", H},
    {"json_schema", R"({"type":"string"})", H},
    {"seed", "42", H},
    {"ignore_eos", "true", H},
    {"logit_bias", "[[1, -100]]", H},
    {"n_probs", "2", H},
    {"min_keep", "2", R},
    {"t_max_predict_ms", "100", R},
    {"id_slot", "0", R},
    {"cache_prompt", "false", R},
    {"return_tokens", "true", H},
    {"samplers", R"(["top_k", "temperature"])", H},
    {"timings_per_token", "true", R},
    {"return_progress", "true", R},
    {"sse_ping_interval", "5", R},
    {"post_sampling_probs", "true", R},
    {"response_fields", R"(["content"])", R},
    {"lora", R"([{"id": 0, "scale": 0.5}])", R},
};

// vLLM's CompletionRequest (vllm/entrypoints/openai/protocol.py: OpenAI's fields, then its
// "completion-sampling-params" and "completion-extra-params").
const std::vector<Field> kCompletionFields = {
    {"prompt", R"("Once")", H},
    {"prompt_embeds", R"("AAAA")", R},
    {"best_of", "2", R},
    {"echo", "true", R},
    {"frequency_penalty", "0.5", H},
    {"logit_bias", R"({"1": -100})", H},
    {"logprobs", "2", H},
    {"max_tokens", "2", H},
    {"n", "2", R},
    {"presence_penalty", "0.5", H},
    {"seed", "42", H},
    {"stop", R"(["\n"])", H},
    {"stream", "true", H},
    {"stream_options", R"({"include_usage": true})", H, R"(,"stream":true)"},
    {"suffix", R"("The end.")", R},
    {"temperature", "0.5", H},
    {"top_p", "0.5", H},
    {"user", R"("user-1")", H},
    {"use_beam_search", "true", R},
    {"top_k", "1", H},
    {"min_p", "0.1", H},
    {"repetition_penalty", "1.3", H},
    {"length_penalty", "0.5", I},
    {"stop_token_ids", "[13]", R},
    {"include_stop_str_in_output", "true", R},
    {"ignore_eos", "true", H},
    {"min_tokens", "2", R},
    {"skip_special_tokens", "false", R},
    {"spaces_between_special_tokens", "false", R},
    {"truncate_prompt_tokens", "8", R},
    {"allowed_token_ids", "[1, 2]", R},
    {"prompt_logprobs", "1", R},
    {"add_special_tokens", "false", R},
    {"response_format", R"({"type": "json_object"})", H},
    {"guided_json", R"({"type": "string"})", R},
    {"guided_regex", R"("a+")", R},
    {"guided_choice", R"(["a"])", R},
    {"guided_grammar", R"("root ::= \"a\"")", R},
    {"guided_decoding_backend", R"("outlines")", R},
    {"guided_whitespace_pattern", R"(" ")", R},
    {"priority", "1", R},
    {"request_id", R"("r-1")", R},
    {"logits_processors", R"(["my.Processor"])", R},
    {"return_tokens_as_token_ids", "true", R},
    {"cache_salt", R"("salt")", R},
    {"kv_transfer_params", "{}", R},
    {"vllm_xargs", "{}", R},
    // llama-server's names are read on the OpenAI routes too.
    {"n_predict", "2", H},
    {"repeat_penalty", "1.3", H},
    {"mirostat", "2", R},
};

// vLLM's ChatCompletionRequest (the same file: OpenAI's fields, "chat-completion-sampling-params"
// and "chat-completion-extra-params"), llama-server's chat additions (README, "POST
// /v1/chat/completions") and OpenAI's own fields vLLM does not list.
const std::vector<Field> kChatFields = {
    {"messages", R"([{"role": "user", "content": "Hello"}])", H},
    {"frequency_penalty", "0.5", H},
    {"logit_bias", R"({"1": -100})", H},
    {"logprobs", "true", H},
    {"top_logprobs", "2", H, R"(,"logprobs":true)"},
    {"max_tokens", "2", H},
    {"max_completion_tokens", "2", H},
    {"n", "2", R},
    {"presence_penalty", "0.5", H},
    {"response_format", R"({"type": "json_object"})", H},
    {"seed", "42", H},
    {"stop", R"(["\n"])", H},
    {"stream", "true", H},
    {"stream_options", R"({"include_usage": true})", H, R"(,"stream":true)"},
    {"temperature", "0.5", H},
    {"top_p", "0.5", H},
    // stories260K has no template that renders tools (a 400 naming messages): tool_choice none.
    {"tools", R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])", H,
     R"(,"tool_choice":"none")"},
    {"tool_choice", R"("none")", H},
    {"reasoning_effort", R"("low")", R},
    {"include_reasoning", "false", R},
    {"parallel_tool_calls", "true", H},
    {"user", R"("user-1")", H},
    {"best_of", "2", R},
    {"use_beam_search", "true", R},
    {"top_k", "1", H},
    {"min_p", "0.1", H},
    {"repetition_penalty", "1.3", H},
    {"length_penalty", "0.5", I},
    {"stop_token_ids", "[13]", R},
    {"include_stop_str_in_output", "true", R},
    {"ignore_eos", "true", H},
    {"min_tokens", "2", R},
    {"skip_special_tokens", "false", R},
    {"spaces_between_special_tokens", "false", R},
    {"truncate_prompt_tokens", "8", R},
    {"prompt_logprobs", "1", R},
    {"allowed_token_ids", "[1, 2]", R},
    {"bad_words", R"(["dragon"])", R},
    {"echo", "true", R},
    {"add_generation_prompt", "true", H},
    {"continue_final_message", "true", R},
    {"add_special_tokens", "true", R},
    {"documents", R"([{"title": "a", "text": "b"}])", R},
    {"chat_template", R"("{{ messages }}")", R},
    {"chat_template_kwargs", R"({"enable_thinking": false})", H},
    {"mm_processor_kwargs", "{}", R},
    {"guided_json", R"({"type": "string"})", R},
    {"guided_regex", R"("a+")", R},
    {"guided_choice", R"(["a"])", R},
    {"guided_grammar", R"("root ::= \"a\"")", R},
    {"structural_tag", R"("x")", R},
    {"guided_decoding_backend", R"("outlines")", R},
    {"guided_whitespace_pattern", R"(" ")", R},
    {"priority", "1", R},
    {"request_id", R"("r-1")", R},
    {"logits_processors", R"(["my.Processor"])", R},
    {"return_tokens_as_token_ids", "true", R},
    {"cache_salt", R"("salt")", R},
    {"kv_transfer_params", "{}", R},
    {"vllm_xargs", "{}", R},
    // llama-server's chat fields.
    {"reasoning_format", R"("none")", H},
    {"reasoning_control", "true", R},
    {"generation_prompt", R"("x")", R},
    {"parse_tool_calls", "true", R},
    {"n_predict", "2", H},
    {"grammar", R"("root ::= [a-z]+")", H},
    {"mirostat", "2", R},
    // OpenAI's, beyond vLLM's list.
    {"store", "true", R},
    {"metadata", R"({"k": "v"})", R},
    {"service_tier", R"("flex")", R},
    {"modalities", R"(["text", "audio"])", R},
    {"prediction", R"({"type": "content", "content": "x"})", R},
    {"web_search_options", "{}", R},
    {"functions", R"([{"name": "f"}])", R},
};

std::string Base(const std::string& path) {
  if (path == "/completion") return R"("prompt":"Once upon a time","n_predict":3)";
  if (path == "/v1/completions") return R"("prompt":"Once upon a time","max_tokens":3)";
  return R"("messages":[{"role":"user","content":"Hi"}],"max_tokens":3)";
}

// The base body with `field` set (replacing the base's own value of it).
std::string BodyWith(const std::string& path, const Field& field) {
  json body = json::parse("{" + Base(path) + field.with + "}");
  body[field.name] = json::parse(field.value);
  return body.dump();
}

class RequestFieldsTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"-np", "2"});
    ASSERT_TRUE(server_->WaitReady()) << server_->Log();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static httplib::Client Client() {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(30, 0);
    return client;
  }
  // The request's answer as JSON (the final object of a stream: its last frame with choices or
  // with stop true).
  static json Post(const std::string& path, const std::string& body, int want_status) {
    httplib::Client client = Client();
    auto res = PostJson(client, path, body);
    EXPECT_TRUE(res) << path << " " << body;
    if (!res) return json();
    EXPECT_EQ(res->status, want_status) << path << " " << body << " -> " << res->body;
    if (res->status != 200) return json::parse(res->body, nullptr, false);
    if (res->get_header_value("Content-Type").starts_with("text/event-stream")) return json();
    return json::parse(res->body, nullptr, false);
  }

  static void Walk(const std::string& path, const std::vector<Field>& fields) {
    int honoured = 0, refused = 0;
    for (const Field& field : fields) {
      SCOPED_TRACE(path + " " + field.name + " = " + field.value);
      const std::string body = BodyWith(path, field);
      if (field.expect == Expect::kRefused) {
        const json error = Post(path, body, 400)["error"];
        EXPECT_EQ(error["param"], field.name) << error.dump();
        EXPECT_NE(error["message"].get<std::string>().find(field.name), std::string::npos)
            << error.dump();
        ++refused;
      } else {
        Post(path, body, 200);
        ++honoured;
      }
    }
    EXPECT_EQ(honoured + refused, static_cast<int>(fields.size()));
    std::printf("%s: %d fields honoured (or inert), %d refused\n", path.c_str(), honoured,
                refused);
  }

  static ServerProcess* server_;
};
ServerProcess* RequestFieldsTest::server_ = nullptr;

TEST_F(RequestFieldsTest, LlamaServersCompletionFieldsAreHonouredOrRefused) {
  Walk("/completion", kLlamaCompletionFields);
}

TEST_F(RequestFieldsTest, VllmsCompletionFieldsAreHonouredOrRefused) {
  Walk("/v1/completions", kCompletionFields);
}

TEST_F(RequestFieldsTest, VllmsAndOpenAisChatFieldsAreHonouredOrRefused) {
  Walk("/v1/chat/completions", kChatFields);
}

TEST_F(RequestFieldsTest, UnknownFieldsAndTunersOfAnActiveFeatureAreRefusedByName) {
  const json unknown = Post("/v1/chat/completions",
                            "{" + Base("/v1/chat/completions") + R"(,"temprature":0.5})", 400);
  EXPECT_EQ(unknown["error"]["param"], "temprature");
  EXPECT_NE(unknown["error"]["message"].get<std::string>().find("--lenient"), std::string::npos);
  // dry_base is inert while DRY is off; beside dry_multiplier 0.8 both are refused, the first
  // met named.
  const json tuned = Post("/completion", "{" + Base("/completion") +
                                             R"(,"dry_base":2,"dry_multiplier":0.8})", 400);
  EXPECT_EQ(tuned["error"]["param"], "dry_base");
  EXPECT_NE(tuned["error"]["message"].get<std::string>().find("dry_multiplier"),
            std::string::npos);
  // A feature's off value passes: llama-server's clients send the whole default set.
  Post("/completion", "{" + Base("/completion") +
                          R"(,"mirostat":0,"typical_p":1.0,"dry_multiplier":0,"xtc_probability":0,
                           "cache_prompt":true,"id_slot":-1,"n_keep":0,"min_keep":0})",
       200);
}

SamplingParams Greedy() {
  SamplingParams s;
  s.temperature = 0.0f;
  s.repeat_penalty = 1.0f;
  return s;
}

std::string CompletionText(const std::string& extra) {
  const json answer = RequestFieldsTest::Post("/v1/completions",
                           std::string(R"({"prompt":"Once upon a time","max_tokens":48,)") +
                               R"("temperature":0)" + extra + "}",
                           200);
  return answer["choices"][0]["text"].get<std::string>();
}

// The served text equals the in-process engine's under the same penalties: the Sampler whose
// penalized logits tests/sampling/sampler_penalty_test.cc checks value by value.
TEST_F(RequestFieldsTest, FrequencyAndPresencePenaltiesChangeGreedyOutputAsTheSamplerDoes) {
  const std::string plain = GreedyReference(kPrompt, 48);
  SamplingParams frequency = Greedy();
  frequency.frequency_penalty = 1.5f;
  const std::string want_frequency = EngineReference(kPrompt, 48, frequency);
  SamplingParams presence = Greedy();
  presence.presence_penalty = 2.0f;
  const std::string want_presence = EngineReference(kPrompt, 48, presence);
  // Greedy stories260K repeats itself within 48 tokens: the penalties must change the text.
  ASSERT_NE(want_frequency, plain);
  ASSERT_NE(want_presence, plain);
  EXPECT_EQ(CompletionText(R"(,"frequency_penalty":1.5)"), want_frequency);
  EXPECT_EQ(CompletionText(R"(,"presence_penalty":2.0)"), want_presence);
  EXPECT_EQ(CompletionText(""), plain);
}

TEST_F(RequestFieldsTest, LlamaServersNamesMeanWhatVllmsAndOpenAisDo) {
  // repeat_penalty is repetition_penalty; n_predict is max_tokens, on chat too (where it once
  // ran to the context).
  const std::string penalized = CompletionText(R"(,"repetition_penalty":1.8)");
  EXPECT_NE(penalized, GreedyReference(kPrompt, 48));
  EXPECT_EQ(CompletionText(R"(,"repeat_penalty":1.8)"), penalized);
  EXPECT_EQ(Post("/v1/completions",
                 R"({"prompt":"Once upon a time","max_tokens":1,"repeat_penalty":1.5,)"
                 R"("repetition_penalty":1.2})",
                 400)["error"]["param"],
            "repeat_penalty");
  const json chat = Post("/v1/chat/completions",
                         R"({"messages":[{"role":"user","content":"Hi"}],"n_predict":4,)"
                         R"("ignore_eos":true,"temperature":0})",
                         200);
  EXPECT_EQ(chat["usage"]["completion_tokens"], 4) << chat.dump();
}

TEST_F(RequestFieldsTest, SamplersListTurnsOffWhatItLeavesOutAndRefusesAnotherOrder) {
  // Greedy with a strong repetition penalty differs from plain greedy; without "penalties" in
  // the list the penalty is off and the text is plain greedy's.
  const auto native = [](const std::string& extra) {
    return RequestFieldsTest::Post("/completion",
                std::string(R"({"prompt":"Once upon a time","n_predict":48,"temperature":0,)") +
                    R"("repeat_penalty":1.8,"repeat_last_n":-1)" + extra + "}",
                200)["content"]
        .get<std::string>();
  };
  const std::string plain = GreedyReference(kPrompt, 48);
  EXPECT_NE(native(""), plain);
  EXPECT_NE(native(R"(,"samplers":["penalties","top_k","temperature"])"), plain);
  EXPECT_EQ(native(R"(,"samplers":["top_k","temperature"])"), plain);
  const json order = Post("/completion",
                          "{" + Base("/completion") + R"(,"samplers":["temperature","top_k"]})",
                          400);
  EXPECT_EQ(order["error"]["param"], "samplers");
  const json unknown = Post("/completion",
                            "{" + Base("/completion") + R"(,"samplers":["adaptive_p"]})", 400);
  EXPECT_NE(unknown["error"]["message"].get<std::string>().find("adaptive_p"),
            std::string::npos);
}

TEST(RequestFieldsLenientTest, LenientServerIgnoresWhatItDoesNotHonourAndSaysSo) {
  ServerProcess server({"--lenient"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  const std::string body =
      R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0,)"
      R"("mirostat":2,"made_up":1,"dry_base":3})";
  auto res = PostJson(client, "/v1/chat/completions", body);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  // dry_base tunes DRY, which is off: inert, not ignored.
  EXPECT_EQ(res->get_header_value("X-Kvl-Ignored-Fields"), "mirostat,made_up");
  // Streamed answers carry it too; a request with nothing to ignore does not.
  nlohmann::ordered_json streamed = nlohmann::ordered_json::parse(body);
  streamed["stream"] = true;
  auto stream = PostJson(client, "/v1/chat/completions", streamed.dump());
  ASSERT_TRUE(stream);
  EXPECT_EQ(stream->status, 200);
  EXPECT_EQ(stream->get_header_value("X-Kvl-Ignored-Fields"), "mirostat,made_up");
  auto clean = PostJson(client, "/v1/completions", R"({"prompt":"Once","max_tokens":2})");
  ASSERT_TRUE(clean);
  EXPECT_EQ(clean->status, 200);
  EXPECT_FALSE(clean->has_header("X-Kvl-Ignored-Fields"));
  EXPECT_NE(server.Log().find("ignored fields mirostat,made_up (--lenient)"), std::string::npos)
      << server.Log();
  // A field the server honours is still checked: a bad value is a 400 under --lenient too.
  auto bad = PostJson(client, "/v1/completions", R"({"prompt":"Once","frequency_penalty":3})");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

}  // namespace
}  // namespace kvl
