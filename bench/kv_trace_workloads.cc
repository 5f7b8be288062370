// Records KV page-access traces (--kv-trace) of three workloads, for `kvl bench replay`:
//   turns          C conversations side by side, T turns each: every turn resubmits the whole
//                  history (as token ids, so the prefix is exact) plus a new user line;
//   shared-prefix  N prompts that share a long opening and differ in a short ending, submitted at
//                  once (more than -np run together, so they queue);
//   mixed          rounds of both, plus a prompt with nothing in common with the others.
// Generation is greedy with EOS ignored, so a run is reproducible. At the end it prints what the
// engine did and the cost model's prediction error per action (n, median, p90).
//
// Usage: kv_trace_workloads -m MODEL --workload turns|shared-prefix|mixed --trace FILE
//          [--budget-pages 48] [--kv-policy auto] [--kv-tier ram:64MiB ...] [--kv-profile P]
//          [--parallel 4] [-t 2]
//          [--turns 6] [--conversations 4] [--prompts 24] [-n 48]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "kvl/engine.h"
#include "kvl/kv_trace.h"
#include "kvl/model.h"
#include "kvl/tokenizer.h"

namespace {

// Sentences in the register small story models know; prompts are built from them.
constexpr const char* kSentences[] = {
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the park with her friends.",
    "One day, she found a big red ball under a tall tree.",
    "Tom was a boy who liked to build things with blocks.",
    "The sun was shining and the birds were singing in the sky.",
    "A small dog ran across the garden to say hello.",
    "Mom made a warm cake and the house smelled sweet.",
    "The cat sat on the mat and looked at the fish in the bowl.",
    "They went to the beach and built a castle of sand.",
    "At night the moon came out and the stars were bright.",
    "Ben wanted to fly like a bird, so he made paper wings.",
    "The old tree in the forest had a door at the bottom.",
    "Sue shared her toys with her little brother.",
    "It started to rain, so everyone ran inside to stay dry.",
    "The frog jumped into the pond with a big splash.",
    "Grandpa told a story about a brave knight and a kind dragon.",
};
constexpr int kNumSentences = sizeof(kSentences) / sizeof(kSentences[0]);

struct Args {
  std::string model_path;
  std::string workload = "mixed";
  std::string trace_path;
  int64_t budget_pages = 48;
  std::string kv_policy = "auto";
  std::vector<std::string> kv_tiers = {"ram:64MiB"};
  std::string profile_path;
  bool kv_promote_back = true;
  int32_t parallel = 4;
  int threads = 2;
  int turns = 6;
  int conversations = 4;
  int prompts = 24;
  int32_t num_predict = 48;
};

std::string Sentences(int first, int count) {
  std::string text;
  for (int i = 0; i < count; ++i) {
    if (!text.empty()) text += ' ';
    text += kSentences[(first + i) % kNumSentences];
  }
  return text;
}

// Submits every prompt, runs the engine until all finish, and returns each one's generated ids.
std::vector<std::vector<int32_t>> RunBatch(kvl::Engine& engine,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           int32_t num_predict, int* failures) {
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    kvl::Request r;
    r.prompt_ids = prompts[i];
    r.max_new_tokens = num_predict;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    auto submitted = engine.Submit(std::move(r), [&out, i, failures](const kvl::TokenEvent& ev) {
      if (ev.token >= 0) out[i].push_back(ev.token);
      if (ev.finished && ev.finish_reason == "error") {
        fmt::print(stderr, "request failed: {}\n", ev.error.ToString());
        ++*failures;
      }
    });
    if (!submitted.ok()) {
      fmt::print(stderr, "submit failed: {}\n", submitted.status().ToString());
      ++*failures;
    }
  }
  engine.RunUntilIdle();
  return out;
}

// One round of `conversations` side by side: each history gets a user line, then its reply.
void TurnRound(kvl::Engine& engine, const Args& args, int turn,
               std::vector<std::vector<int32_t>>* histories, int* failures) {
  const kvl::Tokenizer& tok = engine.tokenizer();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t c = 0; c < histories->size(); ++c) {
    std::vector<int32_t>& h = (*histories)[c];
    const std::string user = " " + Sentences(static_cast<int>(c) * 5 + turn * 3, 2);
    const std::vector<int32_t> ids = tok.Encode(user, /*add_bos=*/h.empty());
    h.insert(h.end(), ids.begin(), ids.end());
    prompts.push_back(h);
  }
  const auto replies = RunBatch(engine, prompts, args.num_predict, failures);
  for (size_t c = 0; c < histories->size(); ++c) {
    (*histories)[c].insert((*histories)[c].end(), replies[c].begin(), replies[c].end());
  }
}

// `count` prompts: one long opening shared by all, then an ending of their own.
std::vector<std::vector<int32_t>> SharedPrefixPrompts(const kvl::Tokenizer& tok, int count,
                                                      int salt) {
  const std::string prefix = Sentences(salt, 8);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    prompts.push_back(tok.Encode(prefix + " " + Sentences(salt + 8 + i * 3, 1 + i % 2), true));
  }
  return prompts;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"record KV page-access traces of the turns, shared-prefix and mixed workloads"};
  app.add_option("-m,--model", args.model_path, "GGUF model")->required();
  app.add_option("--workload", args.workload, "turns | shared-prefix | mixed")
      ->check(CLI::IsMember({"turns", "shared-prefix", "mixed"}))
      ->capture_default_str();
  app.add_option("--trace", args.trace_path, "trace file to write")->required();
  app.add_option("--budget-pages", args.budget_pages, "KV budget in 16-token pages")
      ->capture_default_str();
  app.add_option("--kv-policy", args.kv_policy, "the engine's --kv-policy")->capture_default_str();
  app.add_option("--kv-tier", args.kv_tiers, "the engine's --kv-tier (repeatable)");
  app.add_option("--kv-profile", args.profile_path, "the engine's --kv-profile");
  app.add_flag("!--no-kv-promote-back", args.kv_promote_back, "the engine's --no-kv-promote-back");
  app.add_option("--parallel", args.parallel, "sequences at once")->capture_default_str();
  app.add_option("-t,--threads", args.threads, "threads")->capture_default_str();
  app.add_option("--turns", args.turns, "turns per conversation")->capture_default_str();
  app.add_option("--conversations", args.conversations, "conversations side by side")
      ->capture_default_str();
  app.add_option("--prompts", args.prompts, "shared-prefix prompts")->capture_default_str();
  app.add_option("-n", args.num_predict, "tokens generated per request")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  kvl::EngineOptions o;
  o.model_path = args.model_path;
  o.num_threads = args.threads;
  o.context_length = 1024;
  o.max_seqs = args.parallel;
  o.kv_policy = args.kv_policy;
  o.kv_tiers = args.kv_tiers;
  o.kv_trace_path = args.trace_path;
  o.kv_trace_opener = kvl::OpenKvTraceFile;
  o.profile_path = args.profile_path;
  o.kv_promote_back = args.kv_promote_back;
  // The budget in pages of this model: one page is 16 tokens of every layer's K and V (f32).
  auto model = kvl::Model::Load(args.model_path);
  if (!model.ok()) {
    fmt::print(stderr, "{}\n", model.status().ToString());
    return 1;
  }
  const kvl::ModelConfig& c = (*model)->config();
  const int64_t page_bytes = 16 * int64_t{2} * c.num_layers * c.kv_dim() * 4;
  o.kv_budget_bytes = args.budget_pages * page_bytes;
  o.cache_type_k = o.cache_type_v = "f32";  // the pages above are f32's
  // The one KV budget holds a RAM tier too (kvl/kv_budget.h): the pages are the pool's, the
  // tier's bytes on top.
  for (const std::string& text : o.kv_tiers) {
    const auto spec = kvl::ParseTierSpec(text);
    if (spec.ok() && spec->kind == kvl::TierKind::kRam) o.kv_budget_bytes += spec->capacity_bytes;
  }
  auto engine_or = kvl::Engine::Create(o);
  if (!engine_or.ok()) {
    fmt::print(stderr, "{}\n", engine_or.status().ToString());
    return 1;
  }
  kvl::Engine& engine = **engine_or;
  const kvl::Tokenizer& tok = engine.tokenizer();
  int failures = 0;
  if (args.workload == "turns") {
    std::vector<std::vector<int32_t>> histories(static_cast<size_t>(args.conversations));
    for (int t = 0; t < args.turns; ++t) TurnRound(engine, args, t, &histories, &failures);
  } else if (args.workload == "shared-prefix") {
    RunBatch(engine, SharedPrefixPrompts(tok, args.prompts, 0), args.num_predict, &failures);
  } else {
    // Rounds of two conversations' turns, a few prompts on a shared opening (a different one
    // every other round), and one prompt unlike any other.
    std::vector<std::vector<int32_t>> histories(2);
    for (int t = 0; t < args.turns; ++t) {
      TurnRound(engine, args, t, &histories, &failures);
      auto prompts = SharedPrefixPrompts(tok, 3, (t % 2) * 7);
      prompts.push_back(tok.Encode(Sentences(t * 5 + 2, 6), true));
      RunBatch(engine, prompts, args.num_predict, &failures);
    }
  }
  const kvl::EngineMetrics m = engine.Metrics();
  fmt::print(stderr,
             "{}: {} requests, {} steps, {} preemptions, prefix hits {} of {} tokens, pool {} "
             "blocks\n",
             args.workload, m.requests_finished, m.steps, m.preemptions, m.kv.prefix_hit_tokens,
             m.kv.prefix_query_tokens, m.kv.blocks_total);
  for (int a = 0; a < kvl::kNumKvActions; ++a) {
    const kvl::KvActionCounter& k = m.kv_actions[static_cast<size_t>(a)];
    if (k.pages == 0 && k.pages_restored == 0) continue;
    fmt::print(stderr,
               "  {:<18} {:5} pages, {:5} restored; prediction n {} median {:.1f}% p90 {:.1f}% "
               "(measured / predicted {:.2f})\n",
               kvl::KvActionName(static_cast<kvl::KvAction>(a)), k.pages, k.pages_restored,
               k.error.samples, k.error.median_pct, k.error.p90_pct, k.error.median_ratio);
  }
  for (const kvl::KvTierMetrics& t : m.kv_tiers) {
    if (t.promote_error.samples == 0) continue;
    fmt::print(stderr, "  promote from {:<6} n {} median {:.1f}% p90 {:.1f}%\n", t.name,
               t.promote_error.samples, t.promote_error.median_pct, t.promote_error.p90_pct);
  }
  return failures > 0 ? 1 : 0;
}
