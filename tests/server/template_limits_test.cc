// Chat templates inside a budget, on a real `kvl serve` and `kvl chat`: a template that is slow
// for one message renders off the event loops, so /health answers within a second meanwhile and
// the render ends at its deadline as a 400; SIGTERM is not held up by a render; a GGUF whose
// tokenizer.chat_template cannot be used (a 20k-link operator chain, or a test render past the
// budget) falls back to the built-in its markers name, with a warning, instead of crashing.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvl/gguf.h"
#include "run_shell.h"
#include "server_process.h"

namespace kvl {
namespace {

using nlohmann::json;
using testing::PostJson;
using testing::ServerProcess;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + name + "_" + std::to_string(::getpid());
}

// Renders the conversation quickly, unless a message says "slow": then it loops without end.
constexpr char kSlowForOneMessage[] =
    "{% for m in messages %}{% if m.content == 'slow' %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}{% endif %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>\n";

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

const char kSlowBody[] = R"({"messages": [{"role": "user", "content": "slow"}], "max_tokens": 2})";

TEST(TemplateLimitsTest, SlowTemplateRendersOffTheEventLoopsAndEndsAtItsDeadline) {
  const std::string path = WriteFile("slow.jinja", kSlowForOneMessage);
  // A budget too large to stop it: the deadline does.
  ServerProcess server({"--chat-template-file", path, "--chat-template-steps", "1000000000000000",
                        "--chat-template-timeout", "4"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  // Two slow renders, on two connections: each of the transport's two event loops gets one.
  const Clock::time_point start = Clock::now();
  std::vector<std::future<std::pair<int, std::string>>> slow;
  for (const char* route : {"/v1/chat/completions", "/apply-template"}) {
    slow.push_back(std::async(std::launch::async, [&server, route] {
      httplib::Client client("127.0.0.1", server.port());
      client.set_read_timeout(30, 0);
      auto res = PostJson(client, route, kSlowBody);
      return res ? std::make_pair(res->status, res->body) : std::make_pair(-1, std::string());
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Meanwhile /health on new connections (dealt to both loops) and a fast render answer at once.
  double slowest_health = 0;
  int health_checks = 0;
  while (SecondsSince(start) < 3) {
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(5, 0);
    const Clock::time_point asked = Clock::now();
    auto res = client.Get("/health");
    ASSERT_TRUE(res) << "no /health answer while a template renders\n" << server.Log();
    EXPECT_EQ(res->status, 200);
    slowest_health = std::max(slowest_health, SecondsSince(asked));
    ++health_checks;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_LT(slowest_health, 1.0) << "over " << health_checks << " checks";
  {
    httplib::Client client("127.0.0.1", server.port());
    const Clock::time_point asked = Clock::now();
    auto res = PostJson(client, "/apply-template", R"({"messages": [{"role": "user", "content": "hi"}]})");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_LT(SecondsSince(asked), 1.0);
  }
  for (auto& f : slow) {
    const auto [status, body] = f.get();
    EXPECT_EQ(status, 400) << body;
    EXPECT_NE(body.find("ran past its deadline of 4 s"), std::string::npos) << body;
  }
  // The renders ran the whole time /health was being answered.
  EXPECT_GE(SecondsSince(start), 3.5);
  std::printf("%d /health checks during two 4 s renders, slowest %.3f s\n", health_checks, slowest_health);
  std::remove(path.c_str());
}

TEST(TemplateLimitsTest, DefaultBudgetRefusesTheSlowMessageAndSigtermDoesNotWaitForARender) {
  const std::string path = WriteFile("slow_default.jinja", kSlowForOneMessage);
  ServerProcess server({"--chat-template-file", path, "--shutdown-grace", "1"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(30, 0);
  auto res = PostJson(client, "/v1/chat/completions", kSlowBody);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_NE(res->body.find("passed 2000000 steps"), std::string::npos) << res->body;
  res = PostJson(client, "/v1/chat/completions",
                 R"({"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 2})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;

  // A render with a minute of budget left when SIGTERM comes: stopped after the grace.
  ServerProcess patient({"--chat-template-file", path, "--chat-template-steps", "1000000000000000",
                         "--chat-template-timeout", "60", "--shutdown-grace", "1"});
  ASSERT_TRUE(patient.WaitReady()) << patient.Log();
  auto pending = std::async(std::launch::async, [&patient] {
    httplib::Client c("127.0.0.1", patient.port());
    c.set_read_timeout(60, 0);
    auto r = PostJson(c, "/apply-template", kSlowBody);
    return r ? r->status : -1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const Clock::time_point signalled = Clock::now();
  EXPECT_EQ(patient.Terminate(20), 0) << patient.Log();
  EXPECT_LT(SecondsSince(signalled), 10.0) << patient.Log();
  const int status = pending.get();
  EXPECT_TRUE(status == 400 || status == -1) << status;
  std::remove(path.c_str());
}

// Little-endian bytes of `value`'s low `size` bytes.
std::vector<uint8_t> LittleEndian(uint64_t value, size_t size) {
  std::vector<uint8_t> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
  return out;
}

size_t ScalarSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    default: return 8;
  }
}

// stories260K with `chat_template` as its tokenizer.chat_template: every other key and every
// tensor copied as they are.
std::string ModelWithTemplate(const std::string& name, const std::string& chat_template) {
  auto source = GgufFile::Open(testing::Stories260KPath());
  EXPECT_TRUE(source.ok()) << source.status().ToString();
  GgufWriter writer;
  for (const GgufKeyValue& kv : (*source)->metadata()) {
    const GgufValue& v = kv.value;
    std::string key(kv.key);
    if (v.type == GgufValueType::kString) {
      writer.AddString(key, std::string(v.str));
    } else if (v.type == GgufValueType::kArray && v.array_type == GgufValueType::kString) {
      writer.AddStringArray(key, std::vector<std::string>(v.strings.begin(), v.strings.end()));
    } else if (v.type == GgufValueType::kArray) {
      std::vector<uint8_t> payload = LittleEndian(static_cast<uint32_t>(v.array_type), 4);
      const std::vector<uint8_t> count = LittleEndian(v.array_count, 8);
      payload.insert(payload.end(), count.begin(), count.end());
      payload.insert(payload.end(), v.array_data, v.array_data + v.array_count * ScalarSize(v.array_type));
      writer.AddRaw(key, v.type, std::move(payload));
    } else if (v.type == GgufValueType::kFloat32) {
      const float f = static_cast<float>(v.f);
      uint32_t bits = 0;
      std::memcpy(&bits, &f, 4);
      writer.AddRaw(key, v.type, LittleEndian(bits, 4));
    } else if (v.type == GgufValueType::kFloat64) {
      uint64_t bits = 0;
      std::memcpy(&bits, &v.f, 8);
      writer.AddRaw(key, v.type, LittleEndian(bits, 8));
    } else {
      const bool is_signed = v.type == GgufValueType::kInt8 || v.type == GgufValueType::kInt16 ||
                             v.type == GgufValueType::kInt32 || v.type == GgufValueType::kInt64;
      writer.AddRaw(key, v.type, LittleEndian(is_signed ? static_cast<uint64_t>(v.i) : v.u, ScalarSize(v.type)));
    }
  }
  writer.AddString("tokenizer.chat_template", chat_template);
  for (const GgufTensorInfo& t : (*source)->tensors()) {
    const uint8_t* data = t.data;
    const int64_t bytes = t.num_bytes;
    writer.AddTensor(std::string(t.name), t.type, t.dims,
                     [data, bytes](uint8_t* out, size_t n) { std::memcpy(out, data, std::min<size_t>(n, bytes)); });
  }
  const std::string path = TempPath(name) + ".gguf";
  const Status written = writer.Write(path);
  EXPECT_TRUE(written.ok()) << written.ToString();
  return path;
}

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(TemplateLimitsTest, GgufTemplateThatCannotBeUsedFallsBackWithAWarning) {
  struct Case {
    std::string name, chat_template, reason, builtin;
  };
  const Case cases[] = {
      // The probe's chain: a stack overflow at load before.
      {"chain", "{{ '<|im_start|>' }}{{ 1" + Repeat("+1", 20000) + " }}", "a chain of more than 200 '+'", "chatml"},
      // Parses, but its test render passes the step budget: a few steps, each on 4 MiB (hours of
      // copying before, when a step was a step whatever its work).
      {"budget",
       "[INST]{% set ns = namespace(s='x') %}{% for i in range(22) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
       "{% for i in range(100000) %}{% if (ns.s ~ 'y') == '' %}{% endif %}{% endfor %}",
       "passed 2000000 steps", "mistral"},
  };
  for (const Case& c : cases) {
    const std::string model = ModelWithTemplate("fallback_" + c.name, c.chat_template);
    ServerProcess server(model, {});
    ASSERT_TRUE(server.WaitReady()) << server.Log();
    const std::string log = server.Log();
    EXPECT_NE(log.find(c.reason), std::string::npos) << log;
    EXPECT_NE(log.find("using the built-in chat template '" + c.builtin + "'"), std::string::npos) << log;
    httplib::Client client("127.0.0.1", server.port());
    auto res = PostJson(client, "/apply-template", R"({"messages": [{"role": "user", "content": "Hi"}]})");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["prompt"],
              c.builtin == "chatml" ? "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" : "[INST] Hi [/INST]");

    // kvl chat loads the same model's template the same way.
    const std::string turns = WriteFile("turns_" + c.name, "Once upon a time\n");
    const testing::CommandResult chat = testing::RunShell(std::string(KVL_KVL_BINARY) + " chat -m " + model +
                                                          " -f " + turns + " -n 4 --temp 0 -t 1 2>&1");
    EXPECT_EQ(chat.exit_code, 0) << chat.output;
    EXPECT_NE(chat.output.find(c.reason), std::string::npos) << chat.output;
    EXPECT_NE(chat.output.find("using the built-in chat template '" + c.builtin + "'"), std::string::npos)
        << chat.output;
    std::remove(turns.c_str());
    std::remove(model.c_str());
  }
}

}  // namespace
}  // namespace kvl
