// kvl bench turns: the cross-request KV store's experiment. One scripted conversation (user
// messages of scripted words, greedy replies with EOS ignored), the whole history resubmitted as
// one prompt every turn as a chat client does, run under each KV configuration in a fresh engine:
//   a           no reuse: the prefix cache off, the whole history prefilled every turn
//   b           keep-all: the prefix cache and a pool that holds the whole conversation
//   c-ram       a budget of b's resident peak x --budget-fraction, lossless, RAM + disk tiers
//               (the RAM tier carved from the budget: ram:auto)
//   c-disk      the same budget with a direct-I/O disk tier only: RAM holds only the budget
//   c-disk-buffered  the same with buffered I/O: the OS's page cache (outside the process, not
//               in its RSS, reclaimable) may hold the file, so reads may come from RAM
//   d-balanced  the same budget, auto at balanced quality (may compress), RAM + disk tiers
//   d-evict     the same budget, cold pages evicted, no tier
//   d-compress  the same budget, cold pages compressed to int8, no tier
// Per turn: wall time, TTFT, decode speed, prompt / cached / prefilled / promoted tokens, the
// pool's peak bytes, the process's resident memory (VmRSS) and that less the weights (the packed
// copies and the model file's resident pages): what the KV cache, its tiers' RAM and everything
// else the process holds cost, set beside the budget (a RAM tier holds the same DRAM as the pool),
// each tier's hits and traffic, pages per KV action, and the reply against b's (token-exact for the lossless configs, leading agreement for the lossy ones). Prints a table
// per config and a summary, writes JSON (--json), and draws time and resident KV per turn
// (--plot, through scripts/plot_turns.py).
#include <fmt/format.h>
#include <malloc.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_turns.h"
#include "engine_drive.h"
#include "reply_agreement.h"
#include "cli.h"
#include "kvl/engine.h"
#include "kvl/model.h"
#include "kvl/process_memory.h"
#include "kvl/tokenizer.h"

namespace kvl::cli {
namespace {

// Simple story words, so that small story models tokenize them into few, familiar tokens.
constexpr const char* kWords[] = {
    "the",   "little", "girl",   "boy",    "dog",   "cat",    "ball",  "tree",  "park",
    "sun",   "happy",  "sad",    "big",    "small", "red",    "blue",  "green", "house",
    "mom",   "dad",    "friend", "play",   "run",   "jump",   "look",  "find",  "saw",
    "went",  "said",   "loved",  "wanted", "day",   "time",   "toy",   "bird",  "fish",
    "water", "sky",    "garden", "flower", "box",   "car",    "cake",  "nice",  "fun",
    "and",   "with",   "to",     "in",     "on",    "a",      "was",   "very",  "one",
    "Lily",  "Tim",    "Ben",    "Sue",    "walk",  "smile",  "help",  "share", "kind",
    "bear",  "hat",    "shoe",   "door",   "rain",  "snow",   "night", "star",  "moon"};

// One configuration of the experiment.
struct TurnsConfig {
  std::string name;
  std::string description;
  bool at_budget = false;  // the budget is b's resident peak x --budget-fraction
  bool lossless = true;    // its replies must equal b's, token for token
};

// b first (every other config is compared with it and sized from it), then the others in the
// order given, each once; "c" and "d" stand for their variants.
std::vector<TurnsConfig> ExpandConfigs(const std::vector<std::string>& names) {
  static const std::map<std::string, TurnsConfig> kKnown = {
      {"a", {"a", "no reuse (prefix cache off)", false, true}},
      {"b", {"b", "keep-all (prefix cache, unbounded pool)", false, true}},
      {"c-ram", {"c-ram", "budget, auto lossless, RAM + disk tiers", true, true}},
      {"c-disk", {"c-disk", "budget, auto lossless, disk tier only (O_DIRECT)", true, true}},
      {"c-disk-buffered",
       {"c-disk-buffered", "budget, auto lossless, disk tier only (buffered: the page cache)", true,
        true}},
      {"d-balanced", {"d-balanced", "budget, auto balanced, RAM + disk tiers", true, false}},
      {"d-evict", {"d-evict", "budget, evict, no tier", true, false}},
      {"d-compress", {"d-compress", "budget, compress int8, no tier", true, false}},
  };
  std::vector<std::string> order = {"b"};
  for (const std::string& n : names) {
    std::vector<std::string> expanded = {n};
    if (n == "c") expanded = {"c-ram", "c-disk"};
    if (n == "d") expanded = {"d-balanced", "d-evict"};
    for (const std::string& e : expanded) {
      if (std::find(order.begin(), order.end(), e) == order.end()) order.push_back(e);
    }
  }
  std::vector<TurnsConfig> configs;
  for (const std::string& n : order) configs.push_back(kKnown.at(n));  // validated when parsed
  return configs;
}

// One tier over one turn: what it holds after the turn, and its traffic during it.
struct TierTurn {
  std::string name;
  int64_t bytes_used = 0, pages = 0;
  int64_t lookups = 0, hit_blocks = 0, blocks_promoted = 0;
  int64_t pages_in = 0, bytes_in = 0, pages_out = 0, bytes_out = 0;
  int64_t evictions = 0, errors = 0, checksum_failures = 0;
  double promote_ms = 0;
};

// Steps between two readings of the process's memory: a reading (/proc/self/status) costs tens of
// microseconds, a step of a tiny model not many more.
constexpr int64_t kRssSampleSteps = 16;

struct TurnRecord {
  int32_t turn = 0;  // from 1
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;     // found at admission (pool or tiers)
  int64_t prefilled_tokens = 0;  // computed by the forward pass
  int64_t promoted_tokens = 0;   // brought back from a tier into the pool
  double wall_ms = 0;            // submit to the last token
  double ttft_ms = 0;            // submit to the first token
  double decode_tok_s = 0;       // tokens after the first / time after the first
  int64_t pool_bytes_peak = 0;   // the most pool bytes in use between steps of this turn
  int64_t resident_bytes = 0;    // that plus the pager's buffers outside the pool
  int64_t resident_peak_so_far = 0;  // EngineMetrics::kv_resident_bytes_peak after the turn
  // The process itself (kvl/process_memory.h), sampled every kRssSampleSteps steps and at the
  // end: its anonymous resident memory (heap, pool, RAM tiers, packed weights) at its most, the
  // file pages resident at the end, VmRSS at its most, and VmRSS less the weights (the packed
  // copies and the model file's resident pages) at its most, with the weights of that sample.
  int64_t rss_anon_peak_bytes = 0;
  int64_t rss_file_bytes = 0;
  int64_t rss_peak_bytes = 0;
  int64_t rss_minus_weights_peak_bytes = 0;
  int64_t weights_resident_bytes = 0;
  int64_t layers_streamed = 0;   // layer pages attention read from tiers
  double stream_wait_ms = 0;
  int64_t preemptions = 0;
  ActionPages action_pages{};
  std::vector<TierTurn> tiers;
  std::vector<int32_t> reply;
  std::string finish_reason;
  bool identical = false;  // reply == b's
  double agreement = 0;    // leading tokens equal to b's, as a fraction of b's reply
};

struct ConfigRun {
  TurnsConfig config;
  EngineOptions options;
  int64_t budget_bytes = 0;   // kv_budget_bytes as asked (b, a: the engine's)
  int64_t pool_bytes = 0;     // the pool's size
  int64_t staging_bytes = 0;  // the pager's buffers outside the pool
  int64_t resident_peak = 0;  // EngineMetrics::kv_resident_bytes_peak at the end
  // The process's anonymous resident memory once the engine is made and warm, before turn 1:
  // what a turn's figure grows from.
  int64_t rss_anon_start_bytes = 0;
  int64_t packed_weight_bytes = 0;  // Engine::packed_weight_bytes
  // VmRSS less the weights then too: the process's own memory before any turn's KV (the pool's
  // untouched blocks are not resident yet), what the turns' figures grow from.
  int64_t rss_minus_weights_start_bytes = 0;
  int64_t model_file_bytes = 0;     // the weights as the file holds them (Model::weight_bytes)
  int64_t step_tokens = 0;          // Engine::step_tokens: the prefill chunk (fewer under a budget)
  // VmRSS less the weights after the last turn, and again once malloc_trim handed the heap's free
  // pages back to the OS: the difference is fragmentation, not memory the engine holds.
  int64_t rss_minus_weights_end_bytes = 0;
  int64_t rss_minus_weights_end_trimmed_bytes = 0;
  std::vector<TurnRecord> turns;
  std::string error;          // why the run stopped early
};

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// A disk tier big enough for `tokens` of this model's KV at any cache type: one slot per layer
// page and one per identity page, each rounded to 4 KiB with its record, and a margin.
int64_t DiskTierBytes(const ModelConfig& c, int64_t tokens, int32_t block_tokens) {
  const int64_t blocks = tokens / block_tokens + 2;
  const int64_t layer_page = block_tokens * c.kv_dim() * 2 * 4;  // f32 K and V
  const int64_t slot = RoundUp(layer_page + 64, 4096);
  return blocks * (c.num_layers + 1) * slot * 5 / 4 + (16ll << 20);
}

EngineOptions OptionsFor(const TurnsConfig& config, const BenchTurnsArgs& args,
                         const ModelConfig& model, int64_t context, int64_t budget,
                         int64_t conversation_tokens) {
  EngineOptions o = args.engine;
  o.context_length = context;
  o.max_seqs = 1;
  o.kv_budget_bytes = config.at_budget ? budget : 0;  // 0: room for the whole context
  o.prefix_cache = config.name != "a";
  o.kv_policy = "auto";
  o.kv_quality = "";
  o.kv_tiers.clear();
  const std::string disk_path =
      (std::filesystem::path(args.disk_dir) /
       fmt::format("kvl-bench-turns-{}-{}.pages", getpid(), config.name))
          .string();
  const int64_t disk_bytes = DiskTierBytes(model, conversation_tokens, o.block_tokens);
  // Scratch files: each run starts empty and the file goes with the engine.
  const std::string disk = fmt::format("disk:{}:{}:scratch", disk_path, disk_bytes);
  if (config.name == "c-ram" || config.name == "d-balanced") {
    o.kv_quality = config.lossless ? "lossless" : "balanced";
    // The RAM tier is carved from the one budget (kvl/kv_budget.h): the engine splits it.
    o.kv_tiers = {"ram:auto", disk};
  } else if (config.name == "c-disk") {
    // O_DIRECT: the pages are read from the device, not from the OS's cache in RAM.
    o.kv_quality = "lossless";
    o.kv_tiers = {fmt::format("disk:{}:{}:direct:scratch", disk_path, disk_bytes)};
  } else if (config.name == "c-disk-buffered") {
    // Buffered: the process holds the same budget, but the OS may keep the file's pages in its
    // cache (machine memory outside this process, given back under pressure) and serve reads
    // from there.
    o.kv_quality = "lossless";
    o.kv_tiers = {disk};
  } else if (config.name == "d-evict") {
    o.kv_policy = "evict";
  } else if (config.name == "d-compress") {
    o.kv_policy = "compress";
  }
  return o;
}

void FillTurnDeltas(const EngineMetrics& before, const EngineMetrics& after, int32_t block_tokens,
                    TurnRecord* rec) {
  rec->prefilled_tokens = after.tokens_prefilled - before.tokens_prefilled;
  rec->preemptions = after.preemptions - before.preemptions;
  rec->layers_streamed = after.kv_layers_streamed - before.kv_layers_streamed;
  rec->stream_wait_ms = after.kv_stream_wait_ms - before.kv_stream_wait_ms;
  rec->resident_peak_so_far = after.kv_resident_bytes_peak;
  rec->action_pages = ActionPagesBetween(before, after);
  for (size_t i = 0; i < after.kv_tiers.size(); ++i) {
    const KvTierMetrics& x = after.kv_tiers[i];
    const KvTierMetrics y = i < before.kv_tiers.size() ? before.kv_tiers[i] : KvTierMetrics{};
    TierTurn t;
    t.name = x.name;
    t.bytes_used = x.bytes_used;
    t.pages = x.pages;
    t.lookups = x.lookups - y.lookups;
    t.hit_blocks = x.hit_blocks - y.hit_blocks;
    t.blocks_promoted = x.blocks_promoted - y.blocks_promoted;
    t.pages_in = x.pages_in - y.pages_in;
    t.bytes_in = x.bytes_in - y.bytes_in;
    t.pages_out = x.pages_out - y.pages_out;
    t.bytes_out = x.bytes_out - y.bytes_out;
    t.evictions = x.evictions - y.evictions;
    t.errors = x.errors - y.errors;
    t.checksum_failures = x.checksum_failures - y.checksum_failures;
    t.promote_ms = x.promote_ms_measured - y.promote_ms_measured;
    rec->promoted_tokens += t.blocks_promoted * block_tokens;
    rec->tiers.push_back(std::move(t));
  }
}

// The weights this process holds resident: the packed copies (anonymous) and what of the model
// file is resident (the tensors read in place, the embedding rows looked up).
int64_t ResidentWeightBytes(const Engine& engine) {
  return engine.packed_weight_bytes() +
         ReadMappedFileResidentBytes(engine.options().model_path).value_or(0);
}

// One turn: the history as one prompt, `reply_tokens` greedy tokens, the pool sampled between
// steps for the turn's peak.
Status RunTurn(Engine& engine, const std::vector<int32_t>& history, int32_t reply_tokens,
               TurnRecord* rec) {
  Request r;
  r.prompt_ids = history;
  r.max_new_tokens = reply_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  auto sample_rss = [&] {
    const std::optional<ProcessMemory> m = ReadProcessMemory();
    if (!m) return;
    rec->rss_anon_peak_bytes = std::max(rec->rss_anon_peak_bytes, m->rss_anon_bytes);
    rec->rss_file_bytes = m->rss_file_bytes;
    rec->rss_peak_bytes = std::max(rec->rss_peak_bytes, m->rss_bytes);
    const int64_t weights = ResidentWeightBytes(engine);
    if (m->rss_bytes - weights >= rec->rss_minus_weights_peak_bytes) {
      rec->rss_minus_weights_peak_bytes = m->rss_bytes - weights;
      rec->weights_resident_bytes = weights;
    }
  };
  std::vector<Request> requests;
  requests.push_back(std::move(r));
  KVL_ASSIGN_OR_RETURN(std::vector<DrivenReply> replies,
                       DriveRequests(engine, std::move(requests), [&](int64_t step) {
                         rec->pool_bytes_peak = std::max(
                             rec->pool_bytes_peak, engine.kv_manager().stats().kv_bytes_used);
                         if (step % kRssSampleSteps == 0) sample_rss();
                       }));
  sample_rss();
  DrivenReply& reply = replies.front();
  rec->reply = std::move(reply.tokens);
  rec->finish_reason = reply.finish_reason;
  rec->cached_tokens = reply.cached_prompt_tokens;
  KVL_RETURN_IF_ERROR(reply.error);
  rec->prompt_tokens = static_cast<int64_t>(history.size());
  rec->wall_ms = reply.end_ms;
  rec->ttft_ms = rec->reply.empty() ? 0 : reply.ttft_ms;
  const double decode_ms = reply.end_ms - reply.ttft_ms;
  rec->decode_tok_s =
      rec->reply.size() > 1 && decode_ms > 0 ? 1000.0 * static_cast<double>(rec->reply.size() - 1) / decode_ms : 0;
  return Status::Ok();
}

// "5.8M", "192K": the table's tier column stays narrow.
std::string ShortBytes(int64_t n) {
  const double b = static_cast<double>(n);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f}G", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f}M", b / (1024.0 * 1024));
  return fmt::format("{:.0f}K", b / 1024.0);
}

// Per tier: pages found in it at admission (h), bytes written to it (+) and read from it (-).
std::string TiersText(const TurnRecord& rec) {
  std::string out;
  for (const TierTurn& t : rec.tiers) {
    if (!out.empty()) out += "; ";
    out += fmt::format("{} {}h +{} -{}", t.name, t.hit_blocks, ShortBytes(t.bytes_in),
                       ShortBytes(t.bytes_out));
  }
  return out.empty() ? "-" : out;
}

std::string ReplyText(const ConfigRun& run, const TurnRecord& rec) {
  if (run.config.name == "b") return "ref";
  if (rec.identical) return "same";
  return fmt::format("{:.0f}%", 100 * rec.agreement);
}

void PrintConfigHeader(const ConfigRun& run) {
  fmt::print("\n### {}: {}\n", run.config.name, run.config.description);
  fmt::print("budget {}, pool {}, buffers outside the pool {}, {} tokens a step; weights {} in "
             "the file, {} of them packed at load; RSS less the weights before turn 1 {}\n\n",
             run.budget_bytes > 0 ? FormatBytes(run.budget_bytes) : "default (whole conversation)",
             FormatBytes(run.pool_bytes), FormatBytes(run.staging_bytes), run.step_tokens,
             FormatBytes(run.model_file_bytes), FormatBytes(run.packed_weight_bytes),
             FormatBytes(run.rss_minus_weights_start_bytes));
  fmt::print("| {:>4} | {:>6} | {:>6} | {:>7} | {:>8} | {:>8} | {:>8} | {:>7} | {:>11} | {:>11} | {:>11} | {:<32} | {:<22} | {:>5} |\n",
             "turn", "prompt", "cached", "prefill", "promoted", "wall ms", "TTFT ms", "tok/s",
             "resident", "RSS", "RSS-weights", "tiers: hits, +in -out", "pages per action", "reply");
  fmt::print("| {:->4} | {:->6} | {:->6} | {:->7} | {:->8} | {:->8} | {:->8} | {:->7} | {:->11} | {:->11} | {:->11} | {:-<32} | {:-<22} | {:->5} |\n",
             ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":");
  (void)FlushStdout();
}

// Each row as its turn ends, so that a long run shows how far it got.
void PrintTurnRow(const ConfigRun& run, const TurnRecord& r) {
  fmt::print("| {:>4} | {:>6} | {:>6} | {:>7} | {:>8} | {:>8.1f} | {:>8.1f} | {:>7.1f} | {:>11} | {:>11} | {:>11} | {:<32} | {:<22} | {:>5} |\n",
             r.turn, r.prompt_tokens, r.cached_tokens, r.prefilled_tokens, r.promoted_tokens,
             r.wall_ms, r.ttft_ms, r.decode_tok_s, FormatBytes(r.resident_bytes),
             FormatBytes(r.rss_peak_bytes), FormatBytes(r.rss_minus_weights_peak_bytes),
             TiersText(r), ActionPagesText(r.action_pages), ReplyText(run, r));
  (void)FlushStdout();
}

// Hands the heap's free pages back to the OS. glibc keeps much of what a freed engine held
// resident (free chunks inside the heap), and each config runs in this same process after the
// one before: without this, a config's RSS would carry the last one's garbage.
void ReleaseFreedHeap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// The whole conversation in a fresh engine. Errors creating the engine come back; an error in a
// turn ends the run there and is kept in `error`.
StatusOr<ConfigRun> RunConfig(const TurnsConfig& config, const EngineOptions& options,
                              const Conversation& conv, int32_t reply_tokens,
                              const ConfigRun* reference) {
  ConfigRun run;
  run.config = config;
  run.options = options;
  run.budget_bytes = options.kv_budget_bytes;
  ReleaseFreedHeap();  // the engine before this one is gone
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(options));
  run.step_tokens = engine->step_tokens();
  run.pool_bytes = engine->kv_manager().stats().kv_bytes_total;
  // One short untimed request pages the weights in; it fills no block, so it caches nothing.
  KVL_RETURN_IF_ERROR(WarmUpEngine(*engine, conv.user[0][1], conv.user[0][2]));
  EngineMetrics before = engine->Metrics();
  run.staging_bytes = before.kv_stream_staging_bytes;
  if (const std::optional<ProcessMemory> m = ReadProcessMemory()) {
    run.rss_anon_start_bytes = m->rss_anon_bytes;
    run.rss_minus_weights_start_bytes = m->rss_bytes - ResidentWeightBytes(*engine);
  }
  run.packed_weight_bytes = engine->packed_weight_bytes();
  run.model_file_bytes = engine->model().weight_bytes();
  PrintConfigHeader(run);
  std::vector<int32_t> history;
  for (size_t t = 0; t < conv.user.size(); ++t) {
    history.insert(history.end(), conv.user[t].begin(), conv.user[t].end());
    TurnRecord rec;
    rec.turn = static_cast<int32_t>(t + 1);
    const Status s = RunTurn(*engine, history, reply_tokens, &rec);
    const EngineMetrics after = engine->Metrics();
    FillTurnDeltas(before, after, options.block_tokens, &rec);
    rec.resident_bytes = rec.pool_bytes_peak + run.staging_bytes;
    before = after;
    if (!s.ok()) {
      run.error = fmt::format("turn {}: {}", t + 1, s.ToString());
      break;
    }
    history.insert(history.end(), rec.reply.begin(), rec.reply.end());
    // Against b's reply of the same turn (b itself is the reference).
    const std::vector<int32_t>& ref =
        reference != nullptr && t < reference->turns.size() ? reference->turns[t].reply : rec.reply;
    rec.identical = rec.reply == ref;
    rec.agreement = LeadingAgreement(rec.reply, ref);
    PrintTurnRow(run, rec);
    run.turns.push_back(std::move(rec));
  }
  run.resident_peak = engine->Metrics().kv_resident_bytes_peak;
  // How much of the RSS's growth over the turns is the heap's free pages (fragmentation the
  // allocator kept), not memory the engine holds: the same reading after handing them back.
  if (const std::optional<ProcessMemory> m = ReadProcessMemory()) {
    run.rss_minus_weights_end_bytes = m->rss_bytes - ResidentWeightBytes(*engine);
    ReleaseFreedHeap();
    if (const std::optional<ProcessMemory> t = ReadProcessMemory()) {
      run.rss_minus_weights_end_trimmed_bytes = t->rss_bytes - ResidentWeightBytes(*engine);
    }
  }
  fmt::print("\nresident peak {}; RSS less the weights at the end {}, {} once the heap's free "
             "pages are handed back{}\n",
             FormatBytes(run.resident_peak), FormatBytes(run.rss_minus_weights_end_bytes),
             FormatBytes(run.rss_minus_weights_end_trimmed_bytes),
             run.error.empty() ? "" : "; stopped at " + run.error);
  return run;
}

// The numbers the goals are stated in, per config.
struct Summary {
  double first_ms = 0, second_ms = 0, last_ms = 0;  // wall time of turn 1, 2 and the last
  double last_over_second = 0;
  double last_over_b = 0;
  double last_ttft_over_b = 0;  // the turn's TTFT against b's: the history's cost alone
  int64_t resident_max = 0;  // the most resident KV of any turn (pool peak + buffers)
  int64_t rss_minus_weights_max = 0;  // the process less its weights, at its most over the turns
  int64_t prefilled = 0;
  int32_t identical = 0;
  double agreement_mean = 0;
  double total_ms = 0;  // every turn's wall time
  double b_total_ms = 0;  // b's over the same turns (fewer, when this run stopped early)
};

Summary Summarize(const ConfigRun& run, const ConfigRun& b) {
  Summary s;
  if (run.turns.empty()) return s;
  s.first_ms = run.turns.front().wall_ms;
  s.second_ms = run.turns.size() > 1 ? run.turns[1].wall_ms : s.first_ms;
  s.last_ms = run.turns.back().wall_ms;
  s.last_over_second = s.second_ms > 0 ? s.last_ms / s.second_ms : 0;
  const size_t last = run.turns.size() - 1;
  if (last < b.turns.size() && b.turns[last].wall_ms > 0) {
    s.last_over_b = s.last_ms / b.turns[last].wall_ms;
    if (b.turns[last].ttft_ms > 0) s.last_ttft_over_b = run.turns.back().ttft_ms / b.turns[last].ttft_ms;
  }
  for (const TurnRecord& r : run.turns) {
    s.total_ms += r.wall_ms;
    const size_t i = static_cast<size_t>(r.turn - 1);
    if (i < b.turns.size()) s.b_total_ms += b.turns[i].wall_ms;
    s.resident_max = std::max(s.resident_max, r.resident_bytes);
    s.rss_minus_weights_max = std::max(s.rss_minus_weights_max, r.rss_minus_weights_peak_bytes);
    s.prefilled += r.prefilled_tokens;
    s.identical += r.identical ? 1 : 0;
    s.agreement_mean += r.agreement;
  }
  s.agreement_mean /= static_cast<double>(run.turns.size());
  return s;
}

void PrintSummary(const std::vector<ConfigRun>& runs, int32_t turns) {
  const ConfigRun& b = runs.front();
  fmt::print("\n### summary\n\n");
  fmt::print("| {:<15} | {:>11} | {:>12} | {:>13} | {:>10} | {:>10} | {:>7} | {:>9} | {:>13} | {:>9} | {:>9} | {:>9} |\n",
             "config", "budget", "max resident", "RSS-weights", "turn 2 ms",
             fmt::format("turn {} ms", turns), fmt::format("{}/2", turns),
             fmt::format("{} vs b", turns), fmt::format("TTFT {} vs b", turns), "prefilled",
             "identical", "agreement");
  fmt::print("| {:-<15} | {:->11} | {:->12} | {:->13} | {:->10} | {:->10} | {:->7} | {:->9} | {:->13} | {:->9} | {:->9} | {:->9} |\n",
             ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":", ":");
  for (const ConfigRun& run : runs) {
    const Summary s = Summarize(run, b);
    // A run that stopped early has no last turn to compare: it says where it stopped.
    const bool complete = static_cast<int32_t>(run.turns.size()) == turns;
    const std::string stopped = fmt::format("stop@{}", run.turns.size() + 1);
    fmt::print("| {:<15} | {:>11} | {:>12} | {:>13} | {:>10.1f} | {:>10} | {:>7} | {:>9} | {:>13} | {:>9} | {:>9} | {:>8.1f}% |\n",
               run.config.name, run.budget_bytes > 0 ? FormatBytes(run.budget_bytes) : "-",
               FormatBytes(s.resident_max), FormatBytes(s.rss_minus_weights_max), s.second_ms,
               complete ? fmt::format("{:.1f}", s.last_ms) : stopped,
               complete ? fmt::format("{:.2f}", s.last_over_second) : "-",
               complete ? fmt::format("{:.2f}", s.last_over_b) : "-",
               complete ? fmt::format("{:.2f}", s.last_ttft_over_b) : "-", s.prefilled,
               fmt::format("{}/{}", s.identical, turns), 100 * s.agreement_mean);
  }
}

// What the tiers cost over the whole conversation: the bytes moved, and the time beyond keep-all's
// that they may explain, as a read rate to set beside the device's bandwidth.
void PrintTierCosts(const std::vector<ConfigRun>& runs) {
  const ConfigRun& b = runs.front();
  bool any = false;
  for (const ConfigRun& run : runs) {
    const Summary s = Summarize(run, b);
    int64_t in = 0, out = 0;
    for (const TurnRecord& r : run.turns) {
      for (const TierTurn& t : r.tiers) {
        in += t.bytes_in;
        out += t.bytes_out;
      }
    }
    if (in + out == 0) continue;
    if (!any) {
      fmt::print("\n| {:<15} | {:>13} | {:>13} | {:>12} | {:>13} | {:>22} | {:>13} |\n",
                 "config", "tiers written", "tiers read", "all turns s", "beyond b s",
                 "read / time beyond b", "stream wait s");
      fmt::print("| {:-<15} | {:->13} | {:->13} | {:->12} | {:->13} | {:->22} | {:->13} |\n", ":",
                 ":", ":", ":", ":", ":", ":");
      any = true;
    }
    const double beyond_s = (s.total_ms - s.b_total_ms) / 1000.0;
    // The time the steps waited for streamed layers (KvLayerStreamer: reads not hidden behind
    // the layer before's compute).
    double wait_ms = 0;
    for (const TurnRecord& r : run.turns) wait_ms += r.stream_wait_ms;
    fmt::print("| {:<15} | {:>13} | {:>13} | {:>12.2f} | {:>13.2f} | {:>22} | {:>13.2f} |\n",
               run.config.name, FormatBytes(in), FormatBytes(out), s.total_ms / 1000.0, beyond_s,
               beyond_s > 0 ? fmt::format("{:.0f} MB/s", static_cast<double>(out) / beyond_s / 1e6)
                            : "-",
               wait_ms / 1000.0);
  }
}

nlohmann::json TurnJson(const TurnRecord& r) {
  const nlohmann::json actions = ActionPagesJson(r.action_pages);
  nlohmann::json tiers = nlohmann::json::array();
  for (const TierTurn& t : r.tiers) {
    tiers.push_back({{"name", t.name}, {"bytes_used", t.bytes_used}, {"pages", t.pages},
                     {"lookups", t.lookups}, {"hit_blocks", t.hit_blocks},
                     {"blocks_promoted", t.blocks_promoted}, {"promote_ms", t.promote_ms},
                     {"pages_in", t.pages_in}, {"bytes_in", t.bytes_in},
                     {"pages_out", t.pages_out}, {"bytes_out", t.bytes_out},
                     {"evictions", t.evictions}, {"errors", t.errors},
                     {"checksum_failures", t.checksum_failures}});
  }
  return {{"turn", r.turn}, {"prompt_tokens", r.prompt_tokens},
          {"cached_tokens", r.cached_tokens}, {"prefilled_tokens", r.prefilled_tokens},
          {"promoted_tokens", r.promoted_tokens}, {"wall_ms", r.wall_ms},
          {"ttft_ms", r.ttft_ms}, {"decode_tok_s", r.decode_tok_s},
          {"pool_bytes_peak", r.pool_bytes_peak}, {"resident_bytes", r.resident_bytes},
          {"resident_peak_so_far", r.resident_peak_so_far},
          {"rss_anon_peak_bytes", r.rss_anon_peak_bytes}, {"rss_file_bytes", r.rss_file_bytes},
          {"rss_peak_bytes", r.rss_peak_bytes},
          {"rss_minus_weights_peak_bytes", r.rss_minus_weights_peak_bytes},
          {"weights_resident_bytes", r.weights_resident_bytes},
          {"layers_streamed", r.layers_streamed}, {"stream_wait_ms", r.stream_wait_ms},
          {"preemptions", r.preemptions}, {"actions", actions}, {"tiers", tiers},
          {"finish_reason", r.finish_reason}, {"identical", r.identical},
          {"agreement", r.agreement}, {"reply", r.reply}};
}

nlohmann::json RunJson(const ConfigRun& run, const ConfigRun& b) {
  const Summary s = Summarize(run, b);
  nlohmann::json turns = nlohmann::json::array();
  for (const TurnRecord& r : run.turns) turns.push_back(TurnJson(r));
  return {{"name", run.config.name},
          {"description", run.config.description},
          {"lossless", run.config.lossless},
          {"prefix_cache", run.options.prefix_cache},
          {"kv_policy", run.options.kv_policy},
          {"kv_quality", run.options.kv_quality},
          {"kv_tiers", run.options.kv_tiers},
          {"budget_bytes", run.budget_bytes},
          {"pool_bytes", run.pool_bytes},
          {"staging_bytes", run.staging_bytes},
          {"resident_peak", run.resident_peak},
          {"rss_anon_start_bytes", run.rss_anon_start_bytes},
          {"packed_weight_bytes", run.packed_weight_bytes},
          {"rss_minus_weights_start_bytes", run.rss_minus_weights_start_bytes},
          {"model_file_bytes", run.model_file_bytes},
          {"step_tokens", run.step_tokens},
          {"rss_minus_weights_end_bytes", run.rss_minus_weights_end_bytes},
          {"rss_minus_weights_end_trimmed_bytes", run.rss_minus_weights_end_trimmed_bytes},
          {"error", run.error},
          {"summary",
           {{"turn1_ms", s.first_ms}, {"turn2_ms", s.second_ms}, {"last_ms", s.last_ms},
            {"last_over_turn2", s.last_over_second}, {"last_over_b", s.last_over_b},
            {"last_ttft_over_b", s.last_ttft_over_b},
            {"resident_max", s.resident_max},
            {"rss_minus_weights_max", s.rss_minus_weights_max}, {"prefilled_tokens", s.prefilled},
            {"replies_identical", s.identical}, {"agreement_mean", s.agreement_mean},
            {"total_ms", s.total_ms}}},
          {"turns", turns}};
}

// scripts/plot_turns.py: --plot-script, else beside the build directory (build/kvl ->
// scripts/), else under the working directory.
std::string FindPlotScript(const BenchTurnsArgs& args) {
  if (!args.plot_script.empty()) return args.plot_script;
  std::vector<std::filesystem::path> candidates;
  if (StatusOr<std::string> self = SelfExecutable(); self.ok()) {
    const std::filesystem::path dir = std::filesystem::path(*self).parent_path();
    candidates.push_back(dir.parent_path() / "scripts" / "plot_turns.py");
    candidates.push_back(dir / "scripts" / "plot_turns.py");
  }
  candidates.push_back(std::filesystem::path("scripts") / "plot_turns.py");
  for (const std::filesystem::path& p : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

// Draws the PNG; a missing python3, matplotlib or script is a note, never a failure. The python3
// on PATH first, then Debian's own, where python3-matplotlib installs (PATH may name another,
// a pyenv's say).
void DrawPlot(const BenchTurnsArgs& args, const std::string& json_path) {
  const std::string script = FindPlotScript(args);
  if (script.empty()) {
    fmt::print(stderr, "kvl: plot skipped: scripts/plot_turns.py not found (give --plot-script)\n");
    return;
  }
  std::string why = "no python3 found";
  for (const char* python : {"python3", "/usr/bin/python3"}) {
    std::string out;
    StatusOr<int> rc =
        RunChildProcess({python, script, args.plot_path, json_path}, &out, /*with_stderr=*/true);
    if (rc.ok() && *rc == 0) {
      fmt::print(stderr, "kvl: plot written to {}\n", args.plot_path);
      return;
    }
    if (!rc.ok()) continue;  // no such interpreter
    if (*rc == 3) {
      why = "python3 has no matplotlib (Debian: apt-get install python3-matplotlib)";
    } else {
      why = fmt::format("{} {} exited with {}: {}", python, script, *rc, out);
      break;
    }
  }
  fmt::print(stderr, "kvl: plot skipped: {}\n", why);
}

}  // namespace

Conversation ScriptConversation(const Tokenizer& tokenizer, const ConversationScript& args) {
  Conversation c;
  const std::vector<int32_t> head = tokenizer.Encode("User:", false);
  const std::vector<int32_t> tail = tokenizer.Encode("\nAssistant:", false);
  for (int32_t t = 0; t < args.turns; ++t) {
    std::mt19937_64 rng(args.seed * 1000003u + static_cast<uint64_t>(t));
    std::uniform_int_distribution<int32_t> length(args.user_min, args.user_max);
    const int64_t n = length(rng);
    std::vector<int32_t> ids;
    if (t == 0) ids.push_back(tokenizer.bos());
    ids.insert(ids.end(), head.begin(), head.end());
    const int64_t words = std::max<int64_t>(1, n - static_cast<int64_t>(head.size() + tail.size()));
    const std::vector<int32_t> body = ScriptedTokens(tokenizer, words, &rng);
    ids.insert(ids.end(), body.begin(), body.end());
    ids.insert(ids.end(), tail.begin(), tail.end());
    c.total_tokens += static_cast<int64_t>(ids.size()) + args.reply_tokens;
    c.user.push_back(std::move(ids));
  }
  return c;
}

std::vector<int32_t> ScriptedTokens(const Tokenizer& tokenizer, int64_t num_tokens,
                                    std::mt19937_64* rng) {
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(num_tokens) + 8);
  while (static_cast<int64_t>(ids.size()) < num_tokens) {
    // Each word with its leading space, as it reads inside a sentence.
    const std::vector<int32_t> word = tokenizer.Encode(std::string(" ") + kWords[pick(*rng)], false);
    ids.insert(ids.end(), word.begin(), word.end());
  }
  ids.resize(static_cast<size_t>(num_tokens));
  return ids;
}

int BenchTurnsCommand(const BenchTurnsArgs& args) {
  if (!args.restart_phase.empty()) return BenchRestartPhase(args);
  if (args.restart) return BenchRestart(args);

  // The model once here, for its tokenizer and shape; each config loads its own engine.
  StatusOr<BenchModel> loaded = LoadBenchModel(args.engine.model_path);
  if (!loaded.ok()) {
    fmt::print(stderr, "kvl: {}\n", loaded.status().ToString());
    return 1;
  }
  const ModelConfig mc = loaded->model->config();
  const Conversation conv = ScriptConversation(
      *loaded->tokenizer, {args.turns, args.user_min, args.user_max, args.reply_tokens, args.seed});
  // Let go before any engine runs: the process's memory per turn is the engine's alone.
  *loaded = BenchModel{};
  const int64_t block = args.engine.block_tokens;
  const int64_t context = args.engine.context_length > 0
                              ? args.engine.context_length
                              : RoundUp(conv.total_tokens + 1, block);
  if (context < conv.total_tokens) {
    fmt::print(stderr, "kvl: the conversation needs {} tokens of context, -c gives {}\n",
               conv.total_tokens, context);
    return 1;
  }
  std::string context_note;
  if (mc.context_length > 0 && context > mc.context_length) {
    context_note = fmt::format(" (beyond the {} tokens {} was trained on: the replies still "
                               "compare exactly, their text means less)",
                               mc.context_length, mc.name);
  }
  int64_t user_tokens = 0;
  for (const auto& u : conv.user) user_tokens += static_cast<int64_t>(u.size());
  fmt::print("model {} ({}, {} layers, kv_dim {}), {} turns: user messages {}-{} tokens ({} in "
             "all), replies {} greedy tokens; the last prompt {} tokens, context {}{}\n",
             std::filesystem::path(args.engine.model_path).filename().string(), mc.name,
             mc.num_layers, mc.kv_dim(), args.turns, args.user_min, args.user_max,
             user_tokens, args.reply_tokens, conv.total_tokens - args.reply_tokens, context,
             context_note);
  (void)FlushStdout();

  std::vector<ConfigRun> runs;
  int64_t budget = 0;
  for (const TurnsConfig& config : ExpandConfigs(args.configs)) {
    const EngineOptions options =
        OptionsFor(config, args, mc, context, budget, conv.total_tokens);
    StatusOr<ConfigRun> run = RunConfig(config, options, conv, args.reply_tokens,
                                        runs.empty() ? nullptr : &runs.front());
    if (!run.ok()) {
      fmt::print(stderr, "kvl: config {}: {}\n", config.name, run.status().ToString());
      return 1;
    }
    if (config.name == "b") {
      if (!run->error.empty()) {
        fmt::print(stderr, "kvl: the reference (b) failed: {}\n", run->error);
        return 1;
      }
      budget = static_cast<int64_t>(static_cast<double>(run->resident_peak) * args.budget_fraction);
      fmt::print("b's resident peak {}; (c) and (d) run at a budget of {} ({} of it)\n",
                 FormatBytes(run->resident_peak), FormatBytes(budget), args.budget_fraction);
    }
    runs.push_back(std::move(*run));
  }
  PrintSummary(runs, args.turns);
  PrintTierCosts(runs);

  nlohmann::json out = {{"model", args.engine.model_path},
                        {"model_name", mc.name},
                        {"num_layers", mc.num_layers},
                        {"kv_dim", mc.kv_dim()},
                        {"turns", args.turns},
                        {"reply_tokens", args.reply_tokens},
                        {"user_tokens", user_tokens},
                        {"conversation_tokens", conv.total_tokens},
                        {"context", context},
                        {"budget_fraction", args.budget_fraction},
                        {"budget_bytes", budget},
                        {"b_resident_peak", runs.front().resident_peak},
                        {"configs", nlohmann::json::array()}};
  for (const ConfigRun& run : runs) out["configs"].push_back(RunJson(run, runs.front()));
  std::string json_path = args.json_path;
  if (json_path.empty() && !args.plot_path.empty()) {
    json_path = (std::filesystem::temp_directory_path() /
                 fmt::format("kvl-bench-turns-{}.json", getpid())).string();
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(1) << "\n";
    if (!f.good()) {
      fmt::print(stderr, "kvl: cannot write {}\n", json_path);
      return 1;
    }
  }
  if (!args.plot_path.empty()) {
    DrawPlot(args, json_path);
    if (args.json_path.empty()) std::filesystem::remove(json_path);
  }
  for (const ConfigRun& run : runs) {
    if (!run.error.empty()) return 1;  // the tables show where it stopped
  }
  return 0;
}

}  // namespace kvl::cli
