// Every reply under response_format json_schema validates with ajv (npm), the validator most
// OpenAI-API clients use: the bounded suite of >= 100 schemas (tests/grammar/json_schema_suite.h)
// through `kvl serve` on stories260K, at temperature 0 and 1, each reply a JSON document the
// schema accepts and finished by the grammar (finish_reason stop), never cut by max_tokens.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "grammar/json_schema_suite.h"
#include "node_client.h"
#include "server_process.h"

namespace kvl {
namespace {

using nlohmann::json;

constexpr char kAjvScript[] = R"js(
import fs from 'fs';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const baseURL = process.env.KVL_BASE_URL;
const suite = JSON.parse(fs.readFileSync(process.env.KVL_SUITE, 'utf8'));
const ajv = new Ajv2020({ strict: false });
addFormats.default(ajv, { mode: 'fast' });
// Draft-4's boolean exclusiveMinimum / exclusiveMaximum, as later drafts write them.
function modern(schema) {
  if (Array.isArray(schema)) return schema.map(modern);
  if (schema === null || typeof schema !== 'object') return schema;
  const out = {};
  for (const [k, v] of Object.entries(schema)) out[k] = (k === 'const' || k === 'enum') ? v : modern(v);
  for (const [flag, bound] of [['exclusiveMinimum', 'minimum'], ['exclusiveMaximum', 'maximum']]) {
    if (typeof out[flag] === 'boolean') {
      if (out[flag]) out[flag] = out[bound];
      else delete out[flag];
      if (out[flag] !== undefined) delete out[bound];
    }
  }
  // Draft-7's tuple form: items as a list.
  if (Array.isArray(out.items)) { out.prefixItems = out.items; out.items = false; }
  return out;
}
const out = { outputs: 0, failures: [] };
const jobs = [];
for (const { name, schema } of suite) {
  for (const [temperature, seed] of [[0, 1], [1, 7]]) jobs.push({ name, schema, temperature, seed });
}
async function run(job) {
  const tag = `${job.name} at temperature ${job.temperature}`;
  const res = await fetch(baseURL + '/v1/chat/completions', { method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Once upon a time' }],
      temperature: job.temperature, seed: job.seed, max_tokens: 1200,
      response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: job.schema } } }) });
  const body = await res.json();
  if (res.status !== 200) { out.failures.push(`${tag}: HTTP ${res.status} ${JSON.stringify(body)}`); return; }
  const text = body.choices[0].message.content;
  ++out.outputs;
  if (body.choices[0].finish_reason !== 'stop') out.failures.push(`${tag}: finish_reason ${body.choices[0].finish_reason}: ${text}`);
  let value;
  try { value = JSON.parse(text); } catch (e) { out.failures.push(`${tag}: not JSON: ${text}`); return; }
  const validate = ajv.compile(modern(job.schema));
  if (!validate(value)) out.failures.push(`${tag}: ${text} fails: ${ajv.errorsText(validate.errors)}`);
}
// Two at a time: the server batches them.
for (let i = 0; i < jobs.length; i += 2) await Promise.all(jobs.slice(i, i + 2).map(run));
console.log(JSON.stringify(out));
)js";

TEST(JsonSchemaAjvTest, EveryConstrainedReplyOfTheSuiteValidatesWithAjv) {
  const std::string why_not = testing::InstallNpmPackages("npm-ajv", "ajv@8 ajv-formats@3");
  if (!why_not.empty()) GTEST_SKIP() << why_not;
  const std::vector<testing::SuiteSchema> suite = testing::FullSchemaSuite();
  ASSERT_GE(suite.size(), 100u);
  json schemas = json::array();
  for (const auto& s : suite) {
    schemas.push_back({{"name", s.name}, {"schema", json::parse(s.schema)}});
  }
  const std::string suite_path = ::testing::TempDir() + "kvl_ajv_suite.json";
  std::ofstream(suite_path) << schemas.dump();

  testing::ServerProcess server({"-np", "2"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  std::string log;
  const json out = testing::RunNodeScript(
      "npm-ajv", "kvl_ajv_suite.mjs", kAjvScript,
      "KVL_BASE_URL=http://127.0.0.1:" + std::to_string(server.port()) +
          " KVL_SUITE=" + suite_path,
      150, &log);
  ASSERT_TRUE(out.is_object()) << log << "\nserver log:\n" << server.Log();
  EXPECT_EQ(out["failures"], json::array()) << out.dump(1);
  EXPECT_EQ(out["outputs"], 2 * suite.size());
  EXPECT_EQ(server.Terminate(/*seconds=*/20), 0);
  std::filesystem::remove(suite_path);
}

}  // namespace
}  // namespace kvl
