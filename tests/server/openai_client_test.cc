// A real client: the official `openai` npm package (v4) drives `kvl serve` from Node. The package
// is installed once into <build>/npm-openai and reused; without `node`, or when npm cannot fetch
// the package (no network), the test is skipped and says why.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "node_client.h"
#include "server_process.h"
#include "test_paths.h"

namespace kvl {
namespace {

using nlohmann::json;

// A completion, a chat completion, the same chat streamed (deltas joined), chat logprobs, the
// model list, and a client with a wrong key; one JSON line of what came back.
constexpr char kClientScript[] = R"js(
import OpenAI from 'openai';

const baseURL = process.env.KVL_BASE_URL;
const client = new OpenAI({ apiKey: process.env.KVL_API_KEY, baseURL, maxRetries: 0, timeout: 60000 });
const out = {};
const messages = [{ role: 'user', content: 'The little dog' }];

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const completion = await client.completions.create({
  model: 'stories260K', prompt: 'Once upon a time', max_tokens: 24, temperature: 0 });
out.completion = completion.choices[0].text;
out.completion_finish = completion.choices[0].finish_reason;
out.completion_tokens = completion.usage.completion_tokens;

const chat = await client.chat.completions.create({
  model: 'stories260K', messages, max_tokens: 24, temperature: 0 });
out.chat = chat.choices[0].message.content;
out.chat_role = chat.choices[0].message.role;

const stream = await client.chat.completions.create({
  model: 'stories260K', messages, max_tokens: 24, temperature: 0, stream: true,
  stream_options: { include_usage: true } });
out.stream = '';
out.stream_chunks = 0;
for await (const chunk of stream) {
  ++out.stream_chunks;
  if (chunk.choices.length > 0) {
    out.stream += chunk.choices[0].delta.content ?? '';
    if (chunk.choices[0].finish_reason) out.stream_finish = chunk.choices[0].finish_reason;
  }
  if (chunk.usage) out.stream_usage_tokens = chunk.usage.completion_tokens;
}

const withLogprobs = await client.chat.completions.create({
  model: 'stories260K', messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
out.logprobs = withLogprobs.choices[0].logprobs.content.map(
  (t) => ({ token: t.token, logprob: t.logprob, top: t.top_logprobs.length }));

const wrong = new OpenAI({ apiKey: 'not-the-key', baseURL, maxRetries: 0 });
try {
  await wrong.completions.create({ model: 'stories260K', prompt: 'Hi', max_tokens: 2 });
  out.wrong_key = 'no error';
} catch (e) {
  out.wrong_key = `${e instanceof OpenAI.AuthenticationError ? 'AuthenticationError' : e.constructor.name} ${e.status}`;
}
console.log(JSON.stringify(out));
)js";

TEST(OpenAiClientTest, OfficialNodeSdkCompletesChatsStreamsAndGetsAuthenticationError) {
  // The openai package, installed once per build folder (node_client.h): a skip where node, npm
  // or the network is missing.
  const std::string why_not = testing::InstallNpmPackages("npm-openai", "openai@4");
  if (!why_not.empty()) GTEST_SKIP() << why_not;
  const std::filesystem::path dir =
      std::filesystem::path(KVL_KVL_BINARY).parent_path() / "npm-openai";
  const std::filesystem::path script = dir / "kvl_openai_client.mjs";
  std::ofstream(script) << kClientScript;

  testing::ServerProcess server({"--api-key", "sdk-test-key", "-np", "4"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  const testing::ShellResult node =
      testing::RunShell("KVL_BASE_URL=http://127.0.0.1:" + std::to_string(server.port()) +
            "/v1 KVL_API_KEY=sdk-test-key timeout 120 node '" + script.string() + "'");
  ASSERT_EQ(node.status, 0) << node.out << "\nserver log:\n" << server.Log();
  // The script's one line of JSON is the last line it prints.
  const size_t line = node.out.rfind("\n{");
  const json out = json::parse(node.out.substr(line == std::string::npos ? 0 : line + 1), nullptr,
                               /*allow_exceptions=*/false);
  ASSERT_TRUE(out.is_object()) << node.out;

  EXPECT_EQ(out["models"], json::array({"stories260K"}));
  EXPECT_EQ(out["completion"], testing::GreedyReference("Once upon a time", 24)) << out.dump();
  EXPECT_EQ(out["completion_finish"], "length");
  EXPECT_EQ(out["completion_tokens"], 24);
  const std::string chat_reference = testing::GreedyReference("The little dog", 24);
  EXPECT_EQ(out["chat"], chat_reference) << out.dump();
  EXPECT_EQ(out["chat_role"], "assistant");
  // The streamed deltas, joined, are the plain greedy reply.
  EXPECT_EQ(out["stream"], chat_reference) << out.dump();
  EXPECT_EQ(out["stream_finish"], "length");
  EXPECT_EQ(out["stream_usage_tokens"], 24);
  EXPECT_GE(out["stream_chunks"].get<int>(), 24 + 3);  // role, tokens, finish, usage
  ASSERT_EQ(out["logprobs"].size(), 4u) << out.dump();
  for (const json& t : out["logprobs"]) {
    EXPECT_LT(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["top"], 2);
  }
  EXPECT_EQ(out["wrong_key"], "AuthenticationError 401");
  EXPECT_EQ(server.Terminate(/*seconds=*/20), 0);  // SIGTERM by pid: a clean exit
}

}  // namespace
}  // namespace kvl
