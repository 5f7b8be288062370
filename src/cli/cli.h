// The kvl command line: `kvl run | chat | serve | inspect | synth | bench | calibrate`. Flags follow llama.cpp
// where one exists. Each subcommand lives in its own file; this header is what main() needs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "kvl/engine.h"
#include "kvl/sampling.h"
#include "kvl/server.h"

namespace kvl::cli {

// A command's -t: the threads asked for, or every core for 0.
inline int ThreadsOrEveryCore(int requested) {
  return requested > 0 ? requested
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int Main(int argc, char** argv);

// Flushes stdout: an error (naming the cause, e.g. EPIPE or ENOSPC) when anything written to it
// was not delivered. Output that was not delivered makes the command fail.
Status FlushStdout();

inline constexpr const char* kDefaultPrompt = "Once upon a time";

struct RunArgs {
  EngineOptions engine;
  std::vector<std::string> prompts;  // -p, repeatable; neither -p nor -f: kDefaultPrompt
  std::string prompt_file;          // -f: one prompt per line with -np > 1, else the whole file
  int32_t parallel = 1;             // -np: sequences generated at once
  std::string kv_budget;            // --kv-budget 512MiB
  std::vector<std::string> stop;    // --stop
  int32_t num_predict = 128;  // -n: -1 = until EOS or the context is full; 0 = none
  SamplingParams sampling;
  bool no_bos = false;
};
int RunCommand(const RunArgs& args);

struct ServeArgs {
  ServeOptions serve;
  int32_t parallel = 4;            // -np: sequences served at once
  std::string kv_budget;           // --kv-budget
  std::string max_body = "8MiB";   // --max-body
  std::string kv_events;           // --kv-events ADDRESS: vLLM's KV events on a ZeroMQ PUB socket
  std::string kv_events_replay;    // --kv-events-replay ADDRESS: their replay (ROUTER, bound)
  std::string kv_events_topic;     // --kv-events-topic: each message's first frame
};
int ServeCommand(const ServeArgs& args);

struct ChatArgs {
  EngineOptions engine;
  std::string kv_budget;          // --kv-budget
  std::string chat_template;      // --chat-template NAME (default: the model's Jinja template)
  std::string chat_template_file;  // --chat-template-file FILE
  jinja::RenderOptions chat_template_limits;  // --chat-template-steps, --chat-template-timeout
  std::string system;             // --system TEXT: a system message first in every prompt
  std::string turns_file;         // -f: one user turn per line, then exit (non-interactive)
  int32_t num_predict = 256;      // -n: tokens per reply at most; -1 = until EOS or the context
  SamplingParams sampling;
};
int ChatCommand(const ChatArgs& args);

struct InspectArgs {
  std::string model_path;
  bool show_tensors = false;
  bool json = false;
};
int InspectCommand(const InspectArgs& args);

// kvl tokenize: text to ids with a model's vocabulary alone, in the shape of llama-tokenize.
struct TokenizeArgs {
  std::string model_path;   // -m
  std::string prompt;       // -p
  std::string prompt_file;  // -f
  bool ids = false;            // --ids: [1, 2, 3]
  bool pieces = false;         // --pieces: the pieces as a JSON array (with --ids: id and piece)
  bool parse_special = false;  // --parse-special: control-token texts become those tokens
  bool no_bos = false;         // --no-bos: no BOS / EOS even where the vocabulary asks for them
  bool show_count = false;     // --show-count
  // -e/--escape (default) and --no-escape: \n \r \t \' \" \\ \xNN in the text (from -p or -f)
  // become those characters, as llama-tokenize does.
  bool escape = true;
};
int TokenizeCommand(const TokenizeArgs& args);

// kvl perplexity: a text's perplexity, chunked and scored as llama-perplexity does
// (cmd_perplexity.cc); the last line printed is "perplexity: X".
struct PerplexityArgs {
  std::string model_path;            // -m
  std::string text_path;             // -f
  int64_t context_length = 0;        // -c: tokens per chunk; 0 = min(512, the model's context)
  int64_t batch_size = 512;          // -b: tokens per forward step
  int num_threads = 0;               // -t: 0 = every core
  std::string cache_type_k = "f16";  // -ctk, llama-perplexity's default
  std::string cache_type_v = "f16";  // -ctv
};
int PerplexityCommand(const PerplexityArgs& args);

struct SynthArgs {
  std::string shape;
  std::string type = "q8_0";
  std::string output;
  uint64_t seed = 1234;
  bool list = false;
  std::string vocab;  // a vocab-only GGUF whose tokenizer is copied (--vocab)
};
int SynthCommand(const SynthArgs& args);

struct BenchArgs {
  std::vector<std::string> model_paths;
  std::vector<int64_t> prompt_lengths = {512};  // -p
  std::vector<int64_t> gen_lengths = {128};     // -n
  std::vector<int64_t> depths = {0};            // -d: context already cached before each test
  int repetitions = 5;                          // -r
  std::vector<int> threads;                     // -t (empty: every core)
  int64_t batch_size = 512;                     // -b
  std::string output = "md";                    // -o md|json
  std::string isa = "auto";
  std::vector<int> parallel = {1};              // -np: sequences decoding together in tg tests
  int64_t prefix_tokens = 0;                    // --prefix P: shared prompt for the TTFT test
  int64_t suffix_tokens = 32;                   // --suffix S: unique part after it
  std::vector<std::string> cache_types_k = {"f32"};  // -ctk f32,f16: KV element types
  std::vector<std::string> cache_types_v = {"f32"};  // -ctv
};
int BenchCommand(const BenchArgs& args);

// `kvl bench serve`: a load generator against a running OpenAI-compatible server (vllm bench
// serve style). N requests to POST /v1/completions at a concurrency or a Poisson rate.
struct BenchServeArgs {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int num_requests = 100;      // -n
  int concurrency = 0;         // --concurrency C (0: unset; default 1 when --rate is unset too)
  double rate = 0;             // --rate R requests/s, Poisson arrivals (0: unset)
  int prompt_tokens = 64;      // --prompt-tokens P: words per prompt (about a token each)
  int shared_prefix = 0;       // --shared-prefix T: the first ~T words are the same in every prompt
  // --random-ids: prompts as random token ids (vllm bench's random dataset), so P and T count
  // tokens exactly.
  bool random_ids = false;
  int max_tokens = 64;         // --max-tokens M
  bool stream = false;         // --stream: SSE, TTFT = first token frame, ITL between frames
  std::string output = "md";   // -o md|json
  std::string model;           // --model NAME (default: the server's)
  double timeout_s = 60;       // --timeout: per-request limit in seconds
  uint64_t seed = 1;           // prompt words and arrival times
};
int BenchServeCommand(const BenchServeArgs& args);

// `kvl bench replay TRACE`: a --kv-trace replayed through resident sets of N pages under the
// engine's reuse forecast, LRU, LFU and Belady's optimal, and the engine's own recorded decisions;
// misses priced per page. No model.
struct BenchReplayArgs {
  std::string trace_path;
  std::vector<int64_t> capacity_pages;  // --capacity-pages N,... (empty: from the trace)
  double miss_ms = 0;                   // --miss-ms (0: from the trace's prices)
  std::string miss_action;              // --miss-action NAME: the trace's price of that action
  std::string output = "md";            // -o md|json
};
int BenchReplayCommand(const BenchReplayArgs& args);
// `kvl bench turns`: one scripted multi-turn conversation (the whole history resubmitted every
// turn, as a chat client does) under KV configurations, each in a fresh engine: (a) no reuse,
// (b) keep-all, (c) a budget of (b)'s peak x --budget-fraction with the lossless hierarchy (RAM +
// disk tiers, or a direct-I/O disk tier alone), (d) the same budget with lossy policies. With
// --restart: the TTFT of one long prompt cold, then in a fresh process reusing the first one's
// persistent disk tier (and Redis tier, with --redis).
struct BenchTurnsArgs {
  EngineOptions engine;        // model, threads, -c, -b, --isa, -ctk/-ctv, profile, sink, recent
  int32_t turns = 20;          // --turns
  int32_t reply_tokens = 64;   // --reply: greedy tokens per reply, EOS ignored
  int32_t user_min = 40;       // --user-min / --user-max: tokens per user message
  int32_t user_max = 80;
  std::vector<std::string> configs = {"a", "b", "c-ram", "c-disk", "d"};  // --configs
  double budget_fraction = 0.25;  // --budget-fraction: (c)/(d)'s budget against (b)'s peak
  std::string json_path;       // --json FILE
  std::string plot_path;       // --plot FILE.png (through scripts/plot_turns.py)
  std::string plot_script;     // --plot-script: default found beside the binary or in ./scripts
  std::string disk_dir = "/tmp";  // --disk-dir: the disk tiers' files
  uint64_t seed = 1;           // --seed: the user messages
  bool restart = false;        // --restart: the restart measurement instead of the turns
  int32_t restart_tokens = 1500;  // --restart-tokens: the long prompt's length
  std::string redis;           // --redis redis://HOST:PORT[/NS] | auto (start a redis-server)
  std::string restart_phase;   // internal (--restart-phase): run one phase in this process
  std::string restart_tier;    // internal (--restart-tier): that phase's tier spec
};
int BenchTurnsCommand(const BenchTurnsArgs& args);

// `kvl bench frontier`: recompute (from residual checkpoints, from tokens) against transfer from
// each tier, per page tokens x depth x phase, measured with the engine's code paths, beside the
// cost model's prediction; the crossover points (cmd_bench_frontier.cc).
struct BenchFrontierArgs {
  std::string model_path;                                  // -m
  int num_threads = 0;                                     // -t: 0 = every core
  std::vector<std::string> tiers = {"ram", "disk"};        // --tiers ram,disk[:DIR],redis://...
  std::vector<int64_t> page_tokens = {16, 64, 256, 1024};  // --page-tokens
  std::vector<int64_t> depths;                             // --depths (empty: 1, L/4, L/2, L)
  int64_t position = 512;       // --position: tokens of context before the page
  int repetitions = 5;          // -r: runs per timing (median)
  std::string output = "table"; // -o table|json
  std::string json_path;        // --json FILE
  std::string profile_path;     // --kv-profile (default: the engine's)
  bool calibrate = true;        // --no-calibrate: analytic defaults when no profile is found
};
int BenchFrontierCommand(const BenchFrontierArgs& args);

// `kvl bench quality`: each lossy KV representation (cache types, compressed pages) against the
// f32 cache, teacher-forced over a text: quality against the bytes it keeps (cmd_bench_quality.cc).
struct BenchQualityArgs {
  std::string model_path;        // -m
  int num_threads = 0;           // -t: 0 = every core
  std::string text_path;         // -f: the text (default: the built-in one calibration uses)
  int64_t ctx = 0;               // --ctx: tokens per chunk; 0 = 512 and the model's context
  int64_t chunks = 4;            // --chunks: chunks of the text per context; 0 = every one
  std::string output = "table";  // -o table|json
  std::string json_path;         // --json FILE
};
int BenchQualityCommand(const BenchQualityArgs& args);

// `kvl bench spec`: speculative decoding against plain decoding on workloads that repeat their
// input and on open prose, and the verify step's cost (cmd_bench_spec.cc).
struct BenchSpecArgs {
  std::string model_path;        // -m
  int num_threads = 0;           // -t: 0 = every core
  std::string spec = "auto";     // --spec: the drafter(s) compared with plain decoding, a,b,...
  std::string draft_model;       // -md: rows of --spec draft with this draft model beside them
  int32_t draft_max = 8;         // --draft-max
  int32_t n_gen = 128;           // -n: tokens per workload
  int64_t depth = 256;           // --depth: context of the step-cost measurement
  int64_t context_length = 1024; // -c
  int repetitions = 9;           // -r: step-cost timings (the median is kept)
  int runs = 3;                  // --runs: runs of each workload, plain and speculative in turn
  bool steps_only = false;       // --steps-only: the step cost alone, no workloads
  std::string workloads;         // --workloads a,b,...: only these (empty: every one)
  bool spec_force = false;       // --spec-force: every offered draft sent (no cost model)
  std::string output = "table";  // -o table|json
  std::string json_path;         // --json FILE
};
int BenchSpecCommand(const BenchSpecArgs& args);
// --spec's list "a,b,..." as its modes, in order.
std::vector<std::string> SpecModesOf(const std::string& list);
// Whether `name` is one of `kvl bench spec`'s workloads (--workloads).
bool IsBenchSpecWorkload(const std::string& name);

struct CalibrateArgs {
  std::string model_path;  // -m: the profile is measured at this model's shapes
  int num_threads = 0;     // -t: 0 = every core
  std::string disk_dir;    // --disk: directory for the scratch file (default: temp dir)
  bool quick = false;      // --quick: a few seconds instead of ~30
  std::string output;      // -o: profile path (default: DefaultProfilePath(model name))
  bool explain = false;    // --explain: how each cost-model input was measured, or its default
};
int CalibrateCommand(const CalibrateArgs& args);

// "1.10 B", "1.09 GiB": the units llama-bench prints.
std::string FormatParams(int64_t n);
std::string FormatBytes(int64_t n);

}  // namespace kvl::cli
