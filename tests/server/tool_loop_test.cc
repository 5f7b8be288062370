// The official `openai` npm client's tool loop against `kvl serve`, with the real chat templates
// of Llama-3.1, Qwen2.5, Qwen3, Qwen3-Coder (XML function tags) and Mistral-Nemo (llama.cpp's models/templates, as npm's
// node-llama-cpp bundles them) on random-weight files with real vocabularies: a request with
// tools, the tool_calls reply, the tool's result sent back, the final answer; for tool_choice
// auto, required, a named function and none, streamed and not.
//
// The weights are random, so: required and named must still give valid calls (the grammar makes
// them), each one's arguments validated by ajv against its tool's schema, and the streamed calls
// equal to the plain ones (greedy, the same tokens); auto is given the family's own call text
// through llama-server's `grammar` field, so that the server's parser reads the syntax the
// model family writes; none renders no tools and parses nothing. The turn sent back is rendered
// by the template with the call and the tool's result in it (/apply-template).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "node_client.h"
#include "server_process.h"
#include "tokenizer/llama_vocab_files.h"

namespace kvl {
namespace {

using nlohmann::json;

constexpr char kToolLoopScript[] = R"js(
import OpenAI from 'openai';
import Ajv from 'ajv';

const baseURL = process.env.KVL_BASE_URL;
const format = process.env.KVL_FORMAT;
const client = new OpenAI({ apiKey: 'none', baseURL: baseURL + '/v1', maxRetries: 0, timeout: 60000 });
const ajv = new Ajv({ strict: false });
const model = (await client.models.list()).data[0].id;
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: {
      city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] } },
      required: ['city', 'unit'] } } },
  { type: 'function', function: { name: 'add', description: 'Adds two integers',
    parameters: { type: 'object', properties: {
      a: { type: 'integer', minimum: -100, maximum: 100 },
      b: { type: 'integer', minimum: -100, maximum: 100 } }, required: ['a', 'b'] } } },
];
const validators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
// What each family writes for a call, forced under tool_choice auto by a GBNF literal.
const familyCall = {
  hermes: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
  llama3: '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
  mistral: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, "id": "a1B2c3D4e"}]',
  xml: '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>',
}[format];
const modes = [
  { name: 'auto', extra: { tool_choice: 'auto', grammar: 'root ::= ' + JSON.stringify(familyCall) },
    calls: true, only: 'get_weather', args: { city: 'Paris', unit: 'celsius' } },
  { name: 'required', extra: { tool_choice: 'required' }, calls: true },
  { name: 'named', extra: { tool_choice: { type: 'function', function: { name: 'add' } } },
    calls: true, only: 'add' },
  { name: 'none', extra: { tool_choice: 'none', max_tokens: 8 }, calls: false },
];
const messages = [
  { role: 'system', content: 'You are a helpful assistant with tools.' },
  { role: 'user', content: 'What is the weather in Paris?' } ];
const out = { failures: [], calls: 0, loops: 0, requests: 0 };
const fail = (what) => out.failures.push(what);
const idOk = (id) => format === 'mistral' ? /^[a-zA-Z0-9]{9}$/.test(id) : /^call_[a-zA-Z0-9]+$/.test(id);

async function ask(body, stream) {
  ++out.requests;
  if (!stream) {
    const r = await client.chat.completions.create(body);
    return { message: r.choices[0].message, finish: r.choices[0].finish_reason };
  }
  const s = await client.chat.completions.create({ ...body, stream: true });
  const message = { role: 'assistant', content: null, tool_calls: [] };
  let finish = null;
  for await (const chunk of s) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    const d = choice.delta;
    if (typeof d.content === 'string') message.content = (message.content ?? '') + d.content;
    for (const tc of d.tool_calls ?? []) {
      let call = message.tool_calls[tc.index];
      if (!call) {
        // The first delta of a call carries its id, type and name.
        if (!tc.id || tc.type !== 'function' || !tc.function?.name) fail(`stream: first delta of call ${tc.index} lacks id/type/name: ${JSON.stringify(tc)}`);
        call = message.tool_calls[tc.index] = { id: tc.id, type: tc.type, function: { name: tc.function?.name ?? '', arguments: '' } };
      }
      call.function.arguments += tc.function?.arguments ?? '';
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  if (message.tool_calls.length === 0) delete message.tool_calls;
  return { message, finish };
}

const plain = {};
for (const mode of modes) {
  for (const stream of [false, true]) {
    const tag = `${mode.name}${stream ? ' streamed' : ''}`;
    // Room for kMaxForcedCalls calls of a random model, whitespace runs (bounded by the grammar)
    // and all: a forced call always ends by the grammar, never by max_tokens.
    const body = { model, messages, tools, temperature: 0, max_tokens: 1500, ...mode.extra };
    const { message, finish } = await ask(body, stream);
    const calls = message.tool_calls ?? [];
    if (!mode.calls) {
      if (calls.length > 0 || finish === 'tool_calls') fail(`${tag}: tool_choice none gave calls`);
      if (typeof message.content !== 'string') fail(`${tag}: no content: ${JSON.stringify(message)}`);
      continue;
    }
    if (finish !== 'tool_calls') fail(`${tag}: finish_reason ${finish}: ${JSON.stringify(message)}`);
    if (calls.length === 0) { fail(`${tag}: no tool_calls: ${JSON.stringify(message)}`); continue; }
    for (const call of calls) {
      ++out.calls;
      if (!idOk(call.id)) fail(`${tag}: id ${call.id}`);
      if (call.type !== 'function') fail(`${tag}: type ${call.type}`);
      const validate = validators[call.function.name];
      if (!validate) { fail(`${tag}: unknown function ${call.function.name}`); continue; }
      if (mode.only && call.function.name !== mode.only) fail(`${tag}: called ${call.function.name}, not ${mode.only}`);
      let args;
      try { args = JSON.parse(call.function.arguments); } catch (e) { fail(`${tag}: arguments not JSON: ${call.function.arguments}`); continue; }
      if (!validate(args)) fail(`${tag}: arguments ${call.function.arguments} fail the schema: ${ajv.errorsText(validate.errors)}`);
      if (mode.args && JSON.stringify(args) !== JSON.stringify(mode.args)) fail(`${tag}: arguments ${call.function.arguments}`);
    }
    // Greedy: the stream's calls are the plain reply's.
    const summary = JSON.stringify(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]));
    if (!stream) plain[mode.name] = summary;
    else if (plain[mode.name] !== summary) fail(`${tag}: streamed calls ${summary} differ from ${plain[mode.name]}`);

    // The loop: the call and the tool's result go back, and the model answers.
    const result = 'sunny, 21 degrees';
    const followup = [...messages,
      { role: 'assistant', content: message.content || null, tool_calls: calls },
      ...calls.map((c) => ({ role: 'tool', tool_call_id: c.id, name: c.function.name, content: result }))];
    const rendered = await fetch(baseURL + '/apply-template', { method: 'POST',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ messages: followup, tools }) });
    const prompt = (await rendered.json()).prompt ?? '';
    if (!prompt.includes(result) || !prompt.includes(calls[0].function.name)) {
      fail(`${tag}: the template did not render the call and its result: ${prompt.slice(-600)}`);
    }
    const final = await ask({ model, messages: followup, tools, temperature: 0, max_tokens: 8 }, stream);
    if (typeof final.message.content !== 'string' || !['stop', 'length'].includes(final.finish)) {
      fail(`${tag}: final answer ${JSON.stringify(final)}`);
    } else {
      ++out.loops;
    }
  }
}
console.log(JSON.stringify(out));
)js";

struct TemplateCase {
  const char* name;
  const char* template_file;  // in llama.cpp's models/templates
  const char* vocab_file;     // in llama.cpp's models
  const char* format;         // hermes | llama3 | mistral | xml
};

class ToolLoopTest : public ::testing::TestWithParam<TemplateCase> {};

TEST_P(ToolLoopTest, OpenAiClientCompletesTheToolLoopForEveryToolChoice) {
  const TemplateCase& c = GetParam();
  std::string why_not = testing::InstallNpmPackages("npm-tools", "openai@4 ajv@8");
  if (!why_not.empty()) GTEST_SKIP() << why_not;
  const std::string llama_cpp = testing::LlamaCppDir(&why_not);
  if (llama_cpp.empty()) GTEST_SKIP() << why_not;
  const std::string model = ::testing::TempDir() + "tool-loop-" + c.name + ".gguf";
  const testing::ShellResult synth =
      testing::RunShell(std::string(KVL_KVL_BINARY) + " synth --shape tiny-test --vocab '" +
                        llama_cpp + "/models/" + c.vocab_file + "' -o '" + model + "'");
  ASSERT_EQ(synth.status, 0) << synth.out;

  testing::ServerProcess server(
      model, {"--chat-template-file", llama_cpp + "/models/templates/" + c.template_file, "-c",
              "2048", "-np", "2"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  std::string log;
  const json out = testing::RunNodeScript(
      "npm-tools", "kvl_tool_loop.mjs", kToolLoopScript,
      "KVL_BASE_URL=http://127.0.0.1:" + std::to_string(server.port()) +
          " KVL_FORMAT=" + c.format,
      150, &log);
  ASSERT_TRUE(out.is_object()) << log << "\nserver log:\n" << server.Log();
  EXPECT_EQ(out["failures"], json::array()) << out.dump(1);
  // 3 modes that call x 2 (plain, streamed), each a loop; none twice; and the 6 final answers.
  EXPECT_EQ(out["loops"], 6) << out.dump(1);
  EXPECT_EQ(out["requests"], 14) << out.dump(1);
  EXPECT_GE(out["calls"].get<int>(), 6);
  EXPECT_EQ(server.Terminate(/*seconds=*/20), 0);
  std::filesystem::remove(model);
}

INSTANTIATE_TEST_SUITE_P(
    RealTemplates, ToolLoopTest,
    ::testing::Values(
        TemplateCase{"Llama31", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                     "ggml-vocab-llama-bpe.gguf", "llama3"},
        TemplateCase{"Qwen25", "Qwen-Qwen2.5-7B-Instruct.jinja", "ggml-vocab-qwen2.gguf",
                     "hermes"},
        TemplateCase{"Qwen3", "Qwen-Qwen3-0.6B.jinja", "ggml-vocab-qwen2.gguf", "hermes"},
        TemplateCase{"Qwen3Coder", "Qwen3-Coder.jinja", "ggml-vocab-qwen2.gguf", "xml"},
        // No Tekken vocabulary ships with llama.cpp: Llama-2's 32k one, where [TOOL_CALLS] is
        // text the grammar spells out.
        TemplateCase{"MistralNemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                     "ggml-vocab-llama-spm.gguf", "mistral"}),
    [](const ::testing::TestParamInfo<TemplateCase>& info) { return info.param.name; });

}  // namespace
}  // namespace kvl
