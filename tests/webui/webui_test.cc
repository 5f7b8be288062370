// kvl serve's web page: the page and its assets served from the binary, GET /v1/kv/state against
// what a request really did, and the page itself in headless Chromium (webui_check.mjs drives
// it through puppeteer-core and reports what it saw; the assertions are here).
#include <fcntl.h>
#include <sys/file.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "run_shell.h"
#include "server/server_process.h"

namespace kvl::testing {
namespace {

using nlohmann::json;

std::string Url(const ServerProcess& server) {
  return "http://127.0.0.1:" + std::to_string(server.port());
}

// The assistant's reply the API gives to `messages`, greedy, with no browser in between.
std::string ApiReply(const ServerProcess& server, const json& messages, int max_tokens) {
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(120, 0);
  const json body = {{"messages", messages}, {"temperature", 0}, {"max_tokens", max_tokens}};
  auto res = PostJson(client, "/v1/chat/completions", body.dump());
  if (!res || res->status != 200) return "<no reply>";
  return json::parse(res->body)["choices"][0]["message"]["content"].get<std::string>();
}

json KvState(const ServerProcess& server, const httplib::Headers& headers = {}) {
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/v1/kv/state", headers);
  EXPECT_TRUE(res && res->status == 200);
  return res ? json::parse(res->body, nullptr, false) : json();
}

TEST(WebUi, ServesThePageAndItsAssetsFromTheBinary) {
  ServerProcess server({});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<script type=\"module\" src=\"/webui/app.js\">"), std::string::npos);
  // Scripts only from the server itself: an injected inline script would not run.
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("script-src 'self'"),
            std::string::npos);
  for (const char* asset : {"app.js", "chat_client.js", "kvview.js", "markdown.js", "store.js"}) {
    auto res = client.Get(std::string("/webui/") + asset);
    ASSERT_TRUE(res) << asset;
    EXPECT_EQ(res->status, 200) << asset;
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/javascript; charset=utf-8") << asset;
    EXPECT_GT(res->body.size(), 1000u) << asset;
  }
  auto css = client.Get("/webui/style.css");
  ASSERT_TRUE(css);
  EXPECT_EQ(css->get_header_value("Content-Type"), "text/css; charset=utf-8");
  auto missing = client.Get("/webui/nothing.js");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_NE(missing->body.find("no web page asset nothing.js"), std::string::npos);
  // The API is where it was.
  auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
}

TEST(WebUi, NoWebUiTurnsThePageOffAndKeepsTheState) {
  ServerProcess server({"--no-webui"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 404);
  auto asset = client.Get("/webui/app.js");
  ASSERT_TRUE(asset);
  EXPECT_EQ(asset->status, 404);
  EXPECT_EQ(KvState(server)["pool"]["blocks_total"].get<int64_t>() > 0, true);
}

// The state endpoint's figures are the engine's: a request's prompt and tokens, its pages at its
// last step, and the prefix hit of a second request with the same prompt.
TEST(WebUi, KvStateNeedsTheKeyAndFollowsRequests) {
  ServerProcess server({"--api-key", "sekret"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  httplib::Client client("127.0.0.1", server.port());
  auto refused = client.Get("/v1/kv/state");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_NE(refused->body.find("invalid_api_key"), std::string::npos);
  const httplib::Headers auth = {{"Authorization", "Bearer sekret"}};

  const json before = KvState(server, auth);
  const json& pool = before["pool"];
  EXPECT_EQ(pool["blocks_free"].get<int64_t>() + pool["blocks_cached"].get<int64_t>() +
                pool["blocks_in_use"].get<int64_t>() + pool["blocks_compressed"].get<int64_t>(),
            pool["blocks_total"].get<int64_t>());
  EXPECT_EQ(pool["block_tokens"], 16);
  EXPECT_EQ(before["requests"]["finished"], 0);
  EXPECT_TRUE(before["sequences"].empty());
  EXPECT_EQ(before["actions"].size(), 9u);  // kNumKvActions: demote-redis is the ninth

  const std::string prompt(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends.");
  const json body = {{"prompt", prompt}, {"temperature", 0}, {"max_tokens", 40}};
  json usage[2];
  for (json& u : usage) {
    auto res = PostJson(client, "/v1/completions", body.dump(), auth);
    ASSERT_TRUE(res && res->status == 200);
    u = json::parse(res->body)["usage"];
  }
  // The gauges are set at the end of the step that sent the last token, just after the reply.
  json after = KvState(server, auth);
  for (int i = 0; i < 100 && after["requests"]["running"] != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    after = KvState(server, auth);
  }
  EXPECT_EQ(after["requests"]["finished"], 2);
  EXPECT_EQ(after["requests"]["running"], 0);
  ASSERT_EQ(after["sequences_ended"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const json& map = after["sequences_ended"][i];
    EXPECT_EQ(map["request"], i + 1);
    EXPECT_EQ(map["prompt_tokens"], usage[i]["prompt_tokens"]);
    EXPECT_EQ(map["cached_prompt_tokens"], usage[i]["prompt_tokens_details"]["cached_tokens"]);
    // As of its last step: the prompt and every token but the last one sampled (40 in all).
    const int64_t tokens = map["tokens"];
    EXPECT_EQ(tokens, usage[i]["prompt_tokens"].get<int64_t>() + 39);
    // Every computed token's page, all in the pool (no tier, no pressure).
    ASSERT_EQ(map["pages"].size(), static_cast<size_t>((tokens - 1 + 15) / 16)) << map.dump();
    for (const json& where : map["pages"]) EXPECT_EQ(where, "pool");
  }
  // The second request found the first one's full prompt blocks.
  const int64_t cached = usage[1]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, 16);
  EXPECT_EQ(cached % 16, 0);
  EXPECT_EQ(after["prefix"]["hit_tokens"], before["prefix"]["hit_tokens"].get<int64_t>() + cached);
  EXPECT_EQ(after["prefix"]["query_tokens"].get<int64_t>(),
            usage[0]["prompt_tokens"].get<int64_t>() + usage[1]["prompt_tokens"].get<int64_t>());
  EXPECT_GT(after["pool"]["blocks_cached"].get<int64_t>(), 0);
  EXPECT_GT(after["time_ms"].get<double>(), before["time_ms"].get<double>());
}

// ---- In a real browser ----

std::string RunCommand(const std::string& command, int* exit_code) {
  const kvl::testing::CommandResult run = kvl::testing::RunShell(command);
  *exit_code = run.exit_code;
  return run.output;
}

// Chromium, node and puppeteer-core (installed with npm into a cache folder of its own, once,
// under a lock: ctest runs the browser tests in parallel). Empty `skip` when all are there.
struct Browser {
  std::string chromium;
  std::string node_dir;
  std::string skip;
};

const Browser& FindBrowser() {
  static const Browser browser = [] {
    Browser b;
    const char* chromium = std::getenv("KVL_CHROMIUM");
    b.chromium = chromium != nullptr ? chromium : "/usr/bin/chromium";
    if (!std::filesystem::exists(b.chromium)) {
      b.skip = b.chromium + " is missing (Debian: apt-get install chromium; `make test` does)";
      return b;
    }
    int code = 0;
    RunCommand("node --version > /dev/null 2>&1", &code);
    if (code != 0) {
      b.skip = "node is missing (Debian: apt-get install nodejs npm)";
      return b;
    }
    const char* dir = std::getenv("KVL_WEBUI_NODE_DIR");
    const char* home = std::getenv("HOME");
    b.node_dir = dir != nullptr    ? std::string(dir)
                 : home != nullptr ? std::string(home) + "/.cache/kvlattice/webui-node"
                                   : "/tmp/kvlattice-webui-node";
    std::filesystem::create_directories(b.node_dir);
    const std::string lock_path = b.node_dir + "/.lock";
    const int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
    if (lock >= 0) ::flock(lock, LOCK_EX);
    if (!std::filesystem::exists(b.node_dir + "/node_modules/puppeteer-core/package.json")) {
      // 24.x: the last major that runs on Debian 12's node 18.
      const std::string log =
          RunCommand("npm install --no-save --no-audit --no-fund --loglevel=error --prefix '" +
                         b.node_dir + "' puppeteer-core@24.9.0 2>&1",
                     &code);
      if (code != 0) b.skip = "npm could not install puppeteer-core: " + log.substr(0, 400);
    }
    if (lock >= 0) ::close(lock);  // closing releases the lock
    return b;
  }();
  return browser;
}

// Runs webui_check.mjs in `mode` against `server`; its report (the last line it printed).
json RunPage(const Browser& browser, const ServerProcess& server, const std::string& mode,
             const std::string& extra_args = "") {
  int code = 0;
  const std::string output = RunCommand(
      "KVL_WEBUI_NODE_DIR='" + browser.node_dir +
          "' node '" KVL_SOURCE_DIR "/tests/webui/webui_check.mjs' --mode " + mode + " --url " +
          Url(server) + " --chromium '" + browser.chromium + "' " + extra_args + " 2>&1",
      &code);
  const size_t start = output.rfind("\n{");
  json report =
      json::parse(start == std::string::npos ? output : output.substr(start + 1), nullptr, false);
  EXPECT_FALSE(report.is_discarded()) << "the driver printed no report (exit " << code << "):\n"
                                      << output;
  EXPECT_EQ(report.value("ok", false), true) << report.value("error", output);
  for (const json& error : report.value("page_errors", json::array())) {
    // The browser logs each refused request; without the key, refusals are what is tested.
    if (mode == "key" && error.get<std::string>().find("status of 401") != std::string::npos) {
      continue;
    }
    ADD_FAILURE() << "page error: " << error;
  }
  return report;
}

// Each text the reply showed while streaming is a start of the next one.
void ExpectGrowing(const json& seen) {
  for (size_t i = 1; i < seen.size(); ++i) {
    const std::string a = seen[i - 1], b = seen[i];
    EXPECT_EQ(b.substr(0, a.size()), a) << "step " << i;
  }
}

int DistinctTexts(const json& seen) {
  std::set<std::string> texts(seen.begin(), seen.end());
  return static_cast<int>(texts.size());
}

// A pool of 9 blocks and a RAM tier: a 200-token reply does not fit, so pages leave the pool
// while it runs (lossless: the reply stays the greedy one) and the KV view has them to show.
TEST(WebUiBrowser, ChatsStreamsReloadsAndShowsThePrefixCache) {
  const Browser& browser = FindBrowser();
  if (!browser.skip.empty()) GTEST_SKIP() << browser.skip;
  // The budget holds the RAM tier: 128 KiB for the pool (what 256 KiB held in f32 blocks, before
  // f16 became the default), 16 MiB for the tier's pages and 1344 KiB for its map of them (8192
  // f16 layer pages of 2 KiB, 168 bytes each).
  ServerProcess server({"--kv-budget", "17856KiB", "--kv-tier", "ram:16MiB"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  // The screenshots go to a temp dir: a test run never rewrites the tree. KVL_SCREENSHOTS_DIR
  // (say, docs/images) keeps them where the docs show them.
  const char* wanted = std::getenv("KVL_SCREENSHOTS_DIR");
  const std::string images = wanted != nullptr && *wanted != '\0'
                                 ? std::string(wanted)
                                 : ::testing::TempDir() + "kvl-webui-screenshots-" +
                                       std::to_string(::getpid());
  std::filesystem::create_directories(images);
  const json r =
      RunPage(browser, server, "chat", "--max-tokens 200 --screenshots '" + images + "'");
  ASSERT_TRUE(r.value("ok", false));

  // Shift+Enter wrote a new line and sent nothing.
  EXPECT_EQ(r["shift_enter"]["value"], "one\ntwo");
  EXPECT_EQ(r["shift_enter"]["conversations"], 0);

  // The streamed reply is the API's greedy reply, one SSE frame per token, and the composer
  // never moved while it streamed.
  const json& reply = r["reply"];
  EXPECT_EQ(reply["text"].get<std::string>(), ApiReply(server, reply["messages_sent"], 200));
  EXPECT_EQ(reply["finish_reason"], "length");
  EXPECT_EQ(reply["stats"]["tokens"], 200);
  EXPECT_EQ(reply["stats"]["frames"], 200);
  EXPECT_GT(reply["stats"]["ttft_ms"].get<double>(), 0);
  EXPECT_GT(reply["stats"]["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(reply["stats"]["cached_tokens"], 0);
  const int64_t prompt_tokens = reply["stats"]["prompt_tokens"];
  EXPECT_GT(prompt_tokens, 32);  // more than two KV blocks: the second conversation finds them
  const std::string stats = reply["stats_line"];
  for (const std::string& part : std::vector<std::string>{
           "200 tokens", " tok/s", "TTFT ",
           "0 of " + std::to_string(prompt_tokens) + " prompt tokens cached"}) {
    EXPECT_NE(stats.find(part), std::string::npos) << stats << " lacks " << part;
  }
  ExpectGrowing(reply["seen"]);
  const std::set<double> tops(reply["composer_tops"].begin(), reply["composer_tops"].end());
  EXPECT_EQ(tops.size(), 1u) << reply["composer_tops"];

  // The KV view after it: one request done; its pages (every computed token's), some of them
  // in the RAM tier, where the pool sent them while the reply ran; the actions that did it.
  const json& kv1 = r["kv_after_first"];
  EXPECT_EQ(kv1["finished"], 1);
  EXPECT_EQ(kv1["query_tokens"], prompt_tokens);
  EXPECT_EQ(kv1["hit_tokens"], 0);
  int64_t blocks = 0;
  for (const char* state : {"in_use", "compressed", "cached", "free"}) {
    blocks += std::stoll(kv1["pool"][state].get<std::string>());
  }
  EXPECT_EQ(kv1["grid_cells"], blocks);
  EXPECT_LT(blocks, 16);  // the reply's 16 pages do not fit
  EXPECT_EQ(kv1["seq_pages"], (prompt_tokens + 199 - 1 + 15) / 16);
  int pages_in_pool = 0, pages_out = 0;
  for (const json& cell : kv1["seq_page_cells"]) {
    (cell == "cell page-pool" ? pages_in_pool : pages_out) += 1;
  }
  EXPECT_GT(pages_in_pool, 0);
  EXPECT_GT(pages_out, 0) << kv1["seq_page_cells"];
  int64_t pages_acted_on = 0;
  for (const auto& [action, pages] : kv1["actions"].items()) {
    if (action != "keep") pages_acted_on += pages.get<int64_t>();
  }
  EXPECT_GE(pages_acted_on, pages_out);
  ASSERT_EQ(kv1["tiers"].size(), 1u);
  EXPECT_EQ(kv1["tiers"][0].get<std::string>().substr(0, 3), "ram");

  // A reload finds the conversation.
  const json& reloaded = r["after_reload"];
  ASSERT_EQ(reloaded["conversations"].size(), 1u);
  EXPECT_EQ(r["first_message"].get<std::string>().substr(0, 20),
            reloaded["conversations"][0].get<std::string>().substr(0, 20));
  ASSERT_EQ(reloaded["messages"].size(), 2u);
  EXPECT_EQ(reloaded["messages"][0]["text"], r["first_message"]);
  EXPECT_EQ(reloaded["messages"][1]["text"], reply["seen"].back());
  EXPECT_EQ(reloaded["stored_reply"], reply["text"]);

  // A second conversation starting the same way: its prompt's full blocks were cached, and the
  // KV view's figures moved by as much.
  const json& second = r["second"];
  EXPECT_EQ(second["text"], reply["text"]);
  const int64_t cached = second["stats"]["cached_tokens"];
  EXPECT_EQ(cached, (prompt_tokens - 1) / 16 * 16);  // whole blocks, never the last token
  const json& kv2 = r["kv_after_second"];
  EXPECT_EQ(kv2["finished"], 2);
  EXPECT_EQ(kv2["hit_tokens"].get<int64_t>() - kv1["hit_tokens"].get<int64_t>(), cached);
  EXPECT_GT(kv2["hit_rate"].get<double>(), kv1["hit_rate"].get<double>());
  EXPECT_NE(kv2["seq_caption"].get<std::string>().find(std::to_string(cached) +
                                                       " prompt tokens from the cache"),
            std::string::npos)
      << kv2["seq_caption"];
  EXPECT_EQ(r["conversations_after_second"], 2);

  // Regenerate replaced the last reply with the same greedy one; an edit of the first message
  // dropped what followed it and continued from there.
  const json& regenerated = r["regenerated"];
  EXPECT_EQ(regenerated["before"], 2);
  ASSERT_EQ(regenerated["messages"].size(), 2u);
  EXPECT_EQ(regenerated["messages"][1]["content"], reply["text"]);
  const json& edited = r["edited"];
  ASSERT_EQ(edited["messages"].size(), 2u);
  EXPECT_EQ(edited["messages"][0]["content"], r["edited_message"]);
  const json edited_sent = json::array({{{"role", "user"}, {"content", r["edited_message"]}}});
  EXPECT_EQ(edited["messages"][1]["content"], ApiReply(server, edited_sent, 200));
  EXPECT_NE(edited["messages"][1]["content"], reply["text"]);
  EXPECT_EQ(r["renamed"], "Shared prefix");

  // Markup in a message or in model text is text.
  const json& xss = r["xss"];
  EXPECT_TRUE(xss["xss"].is_null()) << xss["xss"];
  EXPECT_EQ(xss["elements_in_messages"], 0);
  EXPECT_TRUE(xss["links"].empty()) << xss["links"];
  EXPECT_EQ(xss["user_text"], xss["user_expected"]);
  const std::string probe = xss["probe_text"];
  for (const char* text : {"<script>window.__xss = 5</script>",
                           "<img src=x onerror=", "<b onmouseover=", "<svg onload="}) {
    EXPECT_NE(probe.find(text), std::string::npos) << text;
  }
  for (const json& tag : xss["probe_tags"]) {
    EXPECT_TRUE(std::set<std::string>({"p", "strong", "div", "button", "pre", "code", "ul", "li"})
                    .contains(tag))
        << tag;
  }
  EXPECT_EQ(r["hostile"]["finish_reason"], "length");

  // Usable on a phone and in the dark.
  EXPECT_LE(r["at_360"]["scroll_width"].get<int>(), 360);
  EXPECT_EQ(r["at_360"]["input_visible"], true);
  EXPECT_EQ(r["kv_panel_390"]["shown"], true);
  EXPECT_LE(r["kv_panel_390"]["scroll_width"], r["kv_panel_390"]["client_width"]);
  EXPECT_EQ(r["kv_panel_closed"], true);
  EXPECT_NE(r["light_background"], r["dark_background"]);
  EXPECT_EQ(r["after_delete"].size(), 1u);
  for (const json& name : r["screenshots"]) {
    const std::string path = images + "/" + name.get<std::string>();
    EXPECT_GT(std::filesystem::file_size(path), 10000u) << path;
  }
  EXPECT_EQ(r["screenshots"].size(), 4u);
}

TEST(WebUiBrowser, AsksForTheApiKeyThenChats) {
  const Browser& browser = FindBrowser();
  if (!browser.skip.empty()) GTEST_SKIP() << browser.skip;
  ServerProcess server({"--api-key", "sekret"});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  const json r = RunPage(browser, server, "key", "--key sekret");
  ASSERT_TRUE(r.value("ok", false));
  EXPECT_NE(r["without_key"].get<std::string>().find("Incorrect or missing API key"),
            std::string::npos)
      << r["without_key"];
  EXPECT_EQ(r["refused"]["finish_reason"], "error");
  EXPECT_NE(r["refused"]["error"].get<std::string>().find("Incorrect or missing API key"),
            std::string::npos)
      << r["refused"]["error"];
  const json& messages = r["with_key"]["messages"];
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[1]["finish_reason"], "length");
  EXPECT_FALSE(messages[1]["content"].get<std::string>().empty());
  EXPECT_EQ(r["key_in_local_storage"], false);
}

// A TinyLlama-shaped model (kvl synth: random weights, the real shape) is slow enough to watch a
// reply grow token by token and to stop it midway.
TEST(WebUiBrowser, StreamsTokenByTokenAndStopsALongReplyOnTinyLlamaShape) {
  const Browser& browser = FindBrowser();
  if (!browser.skip.empty()) GTEST_SKIP() << browser.skip;
  const std::string model =
      ::testing::TempDir() + "webui_tinyllama_" + std::to_string(::getpid()) + ".gguf";
  int code = 0;
  const std::string log =
      RunCommand(std::string(KVL_KVL_BINARY) + " synth --shape tinyllama-1.1b --type q4_0 -o '" +
                     model + "' 2>&1",
                 &code);
  ASSERT_EQ(code, 0) << log;
  struct Remove {
    std::string path;
    ~Remove() { std::filesystem::remove(path); }
  } remove{model};
  ServerProcess server(model, {});
  ASSERT_TRUE(server.WaitReady()) << server.Log();
  const json r = RunPage(browser, server, "stop", "--max-tokens 12");
  ASSERT_TRUE(r.value("ok", false));

  const json& reply = r["reply"];
  EXPECT_EQ(reply["text"].get<std::string>(), ApiReply(server, reply["messages_sent"], 12));
  EXPECT_EQ(reply["stats"]["frames"], 12);
  ExpectGrowing(reply["seen"]);
  // Seen growing: at least one text a token (the empty reply and the finished one besides);
  // frames that arrive within one animation frame may share a picture, hence half.
  EXPECT_GE(DistinctTexts(reply["seen"]), 1 + 12 / 2) << reply["seen"];

  // Esc stopped the long reply after its first tokens, and the server let the request go at
  // once: nothing ran a moment later, far before its 400 tokens.
  EXPECT_EQ(r["stop_shown"], true);
  const json& stopped = r["stopped"];
  EXPECT_EQ(stopped["finish_reason"], "stopped");
  EXPECT_GE(stopped["tokens"].get<int>(), 1);
  EXPECT_LT(stopped["tokens"].get<int>(), 400);
  EXPECT_EQ(stopped["send_shown"], true);
  EXPECT_EQ(r["after_stop"]["running"], 0);
  EXPECT_LT(r["after_stop"]["tokens_generated"].get<int>(), 12 + 100);
  EXPECT_GE(r["kv"]["seq_pages"].get<int>(), 1);
}

}  // namespace
}  // namespace kvl::testing
