// The engine: serves many requests at once over one model. Requests are submitted from any thread;
// a step loop (the caller's thread in RunUntilIdle, or a background thread after Start) owns the
// model, the KV memory (kvl/kv_memory.h: the paged pool, its tiers and store, and what decides)
// and the forward pass, and each step runs one batched forward over the decodes of every running
// sequence plus chunks of prompts (continuous batching with chunked prefill). When the KV budget
// runs out, the running sequences' coldest pages leave the pool as the KV policy prices them
// (compressed, kept in a tier, kept as checkpoints, evicted); only then is the most recently
// admitted sequence preempted, its pages kept or dropped, and it resumes later with the kept
// ones brought back and the rest recomputed.
//
// Thread-safety: Submit, Cancel and Metrics may be called from any thread. Step/RunUntilIdle must
// not run concurrently with each other or with a background loop. Event callbacks run on the step
// loop's thread and must not call back into Step.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvl/calibration.h"
#include "kvl/profile_corrections.h"  // kDefaultProfileDriftBound
#include "kvl/kv_manager.h"
#include "kvl/kv_block_observer.h"
#include "kvl/kv_budget.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_tier.h"  // ParseByteSize, tier specs
#include "kvl/kv_trace_recorder.h"  // KvTraceOpener
#include "kvl/model.h"
#include "kvl/ops.h"
#include "kvl/sampling.h"
#include "kvl/status.h"
#include "kvl/tokenizer.h"

namespace kvl {

struct EngineOptions {
  std::string model_path;
  int num_threads = 0;              // 0: every core
  int64_t context_length = 0;       // per sequence; 0: the model's, capped at 4096 (as
                                    // llama.cpp's default) unless whole_model_context
  bool whole_model_context = false;  // -c 0: with context_length 0, all of the model's
  int64_t batch_size = 512;         // tokens per forward step (-b)
  std::string isa = "auto";         // auto | avx512 | avx2 | scalar
  // Every byte of KV state the process holds in DRAM (kvl/kv_budget.h): the pool, a RAM tier's
  // pages, the staging and window rings and the draft model's pool (a disk tier's index is
  // counted beside it). 0: room for max_seqs full contexts, capped at 1 GiB (a RAM tier or a
  // draft pool then comes out of that cap).
  int64_t kv_budget_bytes = 0;
  int32_t block_tokens = 16;
  int32_t max_seqs = 16;            // sequences running at once
  // Full blocks are found again by their tokens (a prefix index), and pages are kept across
  // requests in the tiers (the KV store); off: every prompt is computed.
  bool prefix_cache = true;
  // Element type of cached keys / values (-ctk / -ctv): f32 | f16 | bf16. f16 by default, as
  // llama.cpp's: f32 doubles every KV byte the budget pays for; attention widens half types in
  // registers.
  std::string cache_type_k = "f16";
  std::string cache_type_v = "f16";

  // The KV action lattice. When the pool is short, the coldest pages of running sequences
  // (least attention mass; never the sinks or the recent window) are compressed to int8/int4,
  // demoted to a tier and streamed back layer by layer, or evicted, as the policy chooses; only
  // then is a sequence preempted, and each of its pages demoted (promoted back, checksum-verified,
  // at resume), checkpointed as residuals, or dropped to be recomputed from its tokens. Pages of
  // running sequences in a tier or as checkpoints come back into the pool once it has room
  // (kv_promote_back).
  // --kv-tier: "ram:1GiB[:zstd]" (carved from kv_budget_bytes; "ram:auto": the engine splits
  // the budget), "disk:PATH:SIZE[:direct]", "redis://HOST[:PORT]".
  std::vector<std::string> kv_tiers;
  std::string kv_policy = "auto";     // auto | keep | compress | compress-int4 | demote |
                                      // demote-disk | recompute-residual | recompute-tokens | evict
  // lossless | balanced | aggressive; empty: lossless, unless a fixed lossy --kv-policy asks for
  // more (an explicit "lossless" with a lossy policy is a contradiction and an error).
  std::string kv_quality;
  // What a lossy action costs per preset (--kv-price-kld-balanced, ...; kvl/kv_policy.h): named
  // defaults, validated at Create, printed by --explain.
  KvQualityPrices kv_quality_prices;
  std::string profile_path;           // calibration profile; empty: the default path
  // When the KV cost model needs a profile and none is usable at a default path (or none exists
  // at profile_path): true measures this machine now (a few seconds, announced on stderr) and
  // saves the profile there; false prices actions with analytic defaults from the model's shape
  // and writes nothing (--no-calibrate). See ObtainProfile in kvl/cost_profile.h.
  bool calibrate = true;
  // A cost profile the caller already has (a server that calibrated once, a test): used as it is,
  // with no file read and nothing measured. Empty: found, measured or assumed as above.
  std::optional<MachineProfile> cost_profile;
  // The profile's bring-back times corrected by what this engine measures as it brings pages
  // back (kvl/kv_price_feedback.h): per action and per KV store tier, the median of measured /
  // predicted over the last pages. false (--no-kv-feedback): the profile's prices alone, so that
  // the same profile makes the same decisions whatever the machine's load.
  bool kv_feedback = true;
  // --kv-profile-drift: a profile at a default path whose measured correction of some action
  // passes this factor either way is measured again (kvl/profile_corrections.h): while idle in
  // `kvl serve` (Engine::Start), else at the next start. The corrections themselves are written
  // back into it as they are measured. 0: never measured again for a drift. Otherwise > 1.
  double kv_profile_drift = kDefaultProfileDriftBound;
  // A running sequence's pages held in a tier (streamed, or read in place) or as residual
  // checkpoints come back into the pool between steps once it has blocks to spare after what
  // the running sequences need next, read at the most steps still to come first (lossless:
  // checksum-verified, a failed read leaves the page where it was). false
  // (--no-kv-promote-back): a page that left stays out until its sequence ends.
  bool kv_promote_back = true;
  // The watchdog (--watchdog-seconds): the step loop started by Start is stalled when a step has
  // run this long, or work has waited this long with no step ending; Health() then says so and
  // the metrics count it. 0: no watchdog. A prefill chunk of -b tokens on a large model on a
  // slow CPU is the longest honest step: a minute leaves it room.
  double watchdog_seconds = 60;
  bool explain = false;               // print every KV decision with its cost terms to stderr
  // --kv-trace: a page-access trace written here (kvl/kv_trace.h), replayed offline by
  // `kvl bench replay`; empty: none (the step loop only tests a null pointer).
  std::string kv_trace_path;
  // What records it: the trace library's OpenKvTraceFile (kvl/kv_trace.h), which only programs
  // that link kvl_kv_trace can give (the CLI does for --kv-trace); none with a path is an error.
  KvTraceOpener kv_trace_opener;
  // --kv-events: told of every change of the pool's prefix index (kvl/kv_block_observer.h; the
  // CLI gives the events library's publisher); not owned, must outlive the engine. nullptr: none.
  KvBlockObserver* kv_block_observer = nullptr;
  int64_t kv_sink_tokens = 4;         // first tokens never acted on (attention sinks)
  int64_t kv_recent_tokens = 64;      // newest tokens kept resident at full precision
  // The fraction of kv_budget_bytes set aside for staging pages of running sequences that live in
  // a tier (streamed back layer by layer, or rebuilt from checkpoints) at every step: about
  // 2 / num_layers of a page each. The pool gets the rest. Used only where pages can be streamed.
  // 0 (auto): kDefaultStreamReserve (kvl/kv_memory.h) where a RAM tier holds pages attention
  // reads in place; with no RAM tier every page that leaves the pool is staged, so enough for the
  // pages of one full-context sequence, between kDefaultStreamReserve and kMaxAutoStreamReserve.
  double kv_stream_reserve = 0;
  // --kv-checkpoint-every: where pages are kept as residual checkpoints, the input of every s-th
  // layer is kept (layers 0, s, 2s, ...; 1: every layer); the layers between two checkpoints are
  // rebuilt by running them for the page's tokens, bit-identical. 0 (`auto`): the s the cost
  // model prices cheapest for this model (kvl/checkpoint_depth.h). At most the model's layers.
  int64_t kv_checkpoint_every = 1;
  // Sliding-window models (Gemma-2/3): the pool's blocks keep the global layers' K/V only and
  // each sequence its local layers' last window (kvl/kv_window_release.h), lossless; a cached
  // prefix gets its last window rebuilt exactly. false: every layer's K/V stays in the blocks.
  bool kv_window_release = true;
  // Speculative decoding (issue 26; src/engine/speculator.h): where drafts come from (--spec):
  // ngram (prompt lookup), suffix (that, then recent requests' tokens), draft (a small model,
  // -md), auto (the engine's choice: today suffix) or off. The cost model sends a draft only where
  // it pays, and a sequence whose drafts lose is held off for doubling spans, so unpredictable
  // prose runs as plain decoding; outputs are plain decoding's tokens (each row sampled in order).
  // Off by default: under load 11-12 on 2 vCPUs plain decoding's own tok/s moved 2x between runs
  // and prose with auto read 0.70-1.72x, so the 0.97x floor is shown by the cost model's tests
  // (SpeculatorTest), not a benchmark (docs/BENCHMARKS.md); auto is the default-to-be.
  std::string spec = "off";
  int32_t draft_max = 8;              // --draft-max: draft tokens a sequence's step may carry
  std::string draft_model_path;       // -md
  // --spec-force: every draft the drafter offers is sent, whatever the cost model says (to
  // measure acceptance and step costs; tests).
  bool spec_force = false;
};

// Limits of what EngineOptions may ask for: positions are int32, and a thread or a sequence slot
// costs memory whether used or not.
inline constexpr int64_t kMaxContextTokens = (1ll << 31) - 1;
inline constexpr int kMaxThreads = 1024;
inline constexpr int32_t kMaxSeqs = 4096;
inline constexpr int32_t kMaxBlockTokens = 4096;
inline constexpr int64_t kMaxCheckpointEvery = 1 << 16;
inline constexpr int32_t kMaxDraftTokens = 32;  // the model's layers bound it further

// Every field in range and consistent with the others (policy vs quality, one tier per kind,
// known cache types), without loading anything: the one check of engine options, made by
// Engine::Create and by front ends before they start work. INVALID_ARGUMENT naming the flag.
Status ValidateEngineOptions(const EngineOptions& options);

using RequestId = int64_t;

// The most alternatives a request may ask log-probabilities for (OpenAI's and vLLM's limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

// A token and its log-probability under the model at one step.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

struct Request {
  std::string prompt;               // used when prompt_ids is empty
  std::vector<int32_t> prompt_ids;  // taken as they are (no BOS added)
  bool add_bos = true;              // for a text prompt
  // Control-token texts in a text prompt become those tokens: on for a rendered chat template,
  // off for plain completion text (as llama.cpp).
  bool parse_special = false;
  int32_t max_new_tokens = 128;     // < 0: until a stop or the context is full
  SamplingParams sampling;
  std::vector<std::string> stop_strings;  // generation ends before any of these texts
  std::vector<int32_t> stop_ids;          // ... or at any of these tokens (not emitted)
  // A GBNF grammar (llama.cpp's syntax; kvl/grammar.h) the output must follow: each token is
  // sampled among the tokens that keep the output a prefix of the grammar's language, and the
  // end of generation is allowed only where the grammar may end. Empty: unconstrained. Submit
  // refuses one that does not parse (INVALID_ARGUMENT naming line and column); a JSON schema
  // becomes one with JsonSchemaToGbnf (kvl/json_schema_grammar.h).
  std::string grammar;
  bool ignore_eos = false;
  // Log-probabilities of each generated token: the log-softmax of the step's raw logits (before
  // the repetition penalty, temperature and filtering, as OpenAI and vLLM report them), computed
  // in double, with this many most likely tokens beside it (0 to kMaxTopLogprobs). -1: none,
  // and the step computes nothing for this request.
  int32_t top_logprobs = -1;
  // This request's tolerance for loss in its KV pages; unset: the engine's (--kv-quality, or
  // what a fixed lossy --kv-policy implies). Under pressure a lossless request's pages are never
  // compressed or evicted, whatever runs beside it; a balanced or aggressive one's may be. A page
  // shared through the prefix cache never leaves the pool while more than one request holds it,
  // so the strictest holder wins. A lossy quality needs an engine that reserved the codec's
  // buffers (accepts_lossy_kv()); an engine started lossless refuses it (INVALID_ARGUMENT).
  std::optional<KvQuality> kv_quality;
};

// One event per generated token; the last event of a request has finished = true (and may carry
// no token, e.g. at EOS or on an error).
struct TokenEvent {
  RequestId request = 0;
  int32_t token = -1;
  std::string text;              // printable text released by this token (held back near stops)
  bool finished = false;
  // "eos" | "length" | "stop" | "context" | "cancelled" | "error" | "kv_pressure" (stopped where
  // it got to when it outgrew what the KV budget and tiers hold; its tokens so far were sent)
  std::string finish_reason;
  Status error;                  // set when finish_reason == "error"
  double time_to_first_token_ms = 0;  // on the finished event
  int64_t prompt_tokens = 0;          // on the finished event
  int64_t cached_prompt_tokens = 0;   // prompt tokens found in the prefix cache (first admission)
  int64_t generated_tokens = 0;       // on the finished event
  // On the finished event: this request's pages compressed or evicted while it ran (0 for a
  // lossless request).
  int64_t kv_lossy_pages = 0;
  // When the request asked for them (top_logprobs >= 0), on each event with a token: its
  // log-probability and the request's number of most likely tokens, most likely first.
  float logprob = 0;
  std::vector<TokenLogprob> top_logprobs;
};
using EventCallback = std::function<void(const TokenEvent&)>;

// How far the cost model's bring-back predictions were from the measured times, over the last
// (up to 4096) pages brought back: the absolute error |measured - predicted| / measured, in
// percent (nearest-rank percentiles). Pages measured as 0 ms are left out.
struct KvPredictionError {
  int64_t samples = 0;       // (predicted, measured) pairs in the window
  double median_pct = 0;
  double p90_pct = 0;
  double median_ratio = 0;   // median of measured / predicted: above 1, the model is optimistic
};

// What the KV action lattice did: pages and bytes per action, the time the cost model predicted
// for bringing them back, and the time it really took.
struct KvActionCounter {
  int64_t pages = 0;
  int64_t bytes = 0;
  int64_t pages_restored = 0;       // brought back (promoted, or recomputed at resume)
  double predicted_ms = 0;          // bring-back time the cost model expected, summed
  double measured_ms = 0;           // bring-back time measured, summed (restored pages only)
  KvPredictionError error;          // per restored page, over the last 4096
};

// One KV tier's contents and traffic. `kvl run` prints them at the end; /metrics labels them
// tier="<name>".
struct KvTierMetrics {
  std::string name;             // KvTier::name(): "ram", "ram:zstd", "disk", "disk:direct", "redis"
  int64_t capacity_bytes = 0;
  int64_t bytes_used = 0;
  int64_t pages = 0;            // layer pages held now
  // Prefix lookups that reached this tier (the pool did not hold the whole prefix), the blocks
  // found in it, and their tokens.
  int64_t lookups = 0;
  int64_t hit_blocks = 0;
  int64_t hit_tokens = 0;
  int64_t pages_in = 0;         // layer pages written to the tier, total
  int64_t bytes_in = 0;
  int64_t pages_out = 0;        // layer pages read from it, total
  int64_t bytes_out = 0;
  int64_t checksum_failures = 0;
  int64_t evictions = 0;        // pages the tier dropped to make room
  int64_t errors = 0;           // transfers that failed with an I/O or connection error
  // Blocks promoted from this tier into the pool, and the cost model's predicted time for them
  // beside the measured one.
  int64_t blocks_promoted = 0;
  // Taken where the tier holds them: read in place (an uncompressed RAM tier), or streamed at
  // each step from a disk tier, for a prompt the pool cannot hold.
  int64_t blocks_in_place = 0;
  double promote_ms_predicted = 0;
  double promote_ms_measured = 0;
  KvPredictionError promote_error;  // per promoted block, over the last 4096
};

// Where one page of a running request lives now (by block index), for views of the KV memory
// (`kvl serve`'s /v1/kv/state): the pool, its compressed slabs, a tier, residual checkpoints, or
// gone (evicted: attention skips it; dropped: recomputed from its tokens at resume).
enum class KvPageLocation : uint8_t {
  kPool,
  kCompressed,
  kRamTier,
  kDiskTier,
  kRedisTier,
  kCheckpointed,
  kEvicted,
  kDropped,
};
std::string_view KvPageLocationName(KvPageLocation location);  // "pool", "compressed", "ram"...

inline constexpr int32_t kKvEndedPageMaps = 16;

// One running request's pages, as of the last step.
struct KvSequencePageMap {
  RequestId request = 0;
  int64_t prompt_tokens = 0;
  int64_t tokens = 0;                  // prompt and generated so far
  int64_t cached_prompt_tokens = 0;    // found in the prefix cache at its first admission
  std::vector<KvPageLocation> pages;   // by block index
};

struct EngineMetrics {
  // The cost profile measured again while the engine was idle (EngineOptions::kv_profile_drift,
  // or a profile measured on a busy machine): started, replaced the profile, stopped by a request
  // or thrown away; and whether one runs now.
  int64_t profile_measures_started = 0;
  int64_t profile_measures_finished = 0;
  int64_t profile_measures_abandoned = 0;
  bool profile_measuring = false;
  KvStats kv;
  std::vector<KvTierMetrics> kv_tiers;  // one per --kv-tier, in the order given
  std::array<KvActionCounter, kNumKvActions> kv_actions;  // indexed by KvAction
  // Pages of running sequences rebuilt from residual checkpoints inside decode steps (their rows
  // ride in the step's K and V matmuls), one count per page and step (pages and pages_restored
  // alike): what the policy priced them at in the step against the step's time less its
  // calibrated time without them, split over its pages (decode steps of one forward run only).
  KvActionCounter kv_rebuilt_in_step;
  // Of the pages recomputed from their tokens (kv_actions[recompute-tokens].pages_restored),
  // those whose step also carried decode rows: the recompute rode in the step as a prefill chunk
  // does, rows of the same forward run.
  int64_t kv_recomputed_pages_beside_decode = 0;
  // Reads from a tier that failed their checksum or I/O (a resume's promotion, or a step's
  // streamed page), and the pages recomputed from their tokens because of them.
  int64_t kv_checksum_failures = 0;
  int64_t kv_pages_recomputed_after_failure = 0;
  // Pages of running sequences outside the pool, now, and their streaming.
  int64_t kv_pages_compressed = 0;
  int64_t kv_pages_streamed = 0;
  int64_t kv_pages_evicted = 0;
  int64_t kv_pages_rebuilt = 0;      // held as residual checkpoints, rebuilt at every step
  // Of such pages (streamed or rebuilt), those brought back into the pool while their sequence
  // ran, once it had blocks to spare (EngineOptions::kv_promote_back), total.
  int64_t kv_pages_promoted_back = 0;
  int64_t kv_layers_rebuilt = 0;     // page layers rebuilt from checkpoints for attention, total
  // Of those, layers run whole for a page (no checkpoint at the layer: --kv-checkpoint-every).
  int64_t kv_layers_advanced = 0;
  int64_t kv_checkpoint_every = 1;   // the stride the pool keeps checkpoints at (chosen or given)
  double kv_rebuild_ms = 0;          // time spent rebuilding them, total
  int64_t kv_compressed_bytes = 0;   // slab slots in use (inside kv.kv_bytes_used)
  int64_t kv_stream_staging_bytes = 0;  // buffers outside the pool, reserved from the budget
  // Sliding-window layers (EngineOptions::kv_window_release): the local layers' rings (outside
  // the pool, within the budget and kv_resident_bytes_peak; 0: none), and the windows a cached
  // prefix had rebuilt: from checkpoints, or from tokens (tokens run for it, total).
  int64_t kv_window_ring_bytes = 0;
  int64_t kv_window_rebuilds_from_residuals = 0;
  int64_t kv_window_rebuilds_from_tokens = 0;
  int64_t kv_window_tokens_rebuilt = 0;
  int64_t kv_staging_capacity_pages = 0;  // pages that can be streamed or rebuilt at once
  // The most resident KV at any time: pool blocks in use (compressed slabs included) plus every
  // buffer outside the pool. Within kv_budget_bytes.
  int64_t kv_resident_bytes_peak = 0;
  // The one budget (EngineOptions::kv_budget_bytes) and what the process holds against it.
  // kv_budget_bytes: the whole budget in effect (given, or the default) and its split.
  // kv_fixed_bytes: the process's memory that is neither weights nor KV (activations and scratch
  // for the largest step, stacks, tokenizer, libraries), measured at Create as RSS less the
  // resident weights less the KV held then. kv_held_bytes: KV bytes held in DRAM now, every part
  // of the split (a RAM tier by its pages held, the rest as reserved). rss_minus_weights_bytes:
  // VmRSS less the resident weights, sampled when Metrics() is called (0 where /proc cannot be
  // read). The bound the budget keeps: rss_minus_weights_bytes - kv_fixed_bytes <=
  // kv_budget_bytes, up to the heap's slack.
  int64_t kv_budget_bytes = 0;
  int64_t kv_fixed_bytes = 0;
  int64_t kv_held_bytes = 0;
  int64_t rss_minus_weights_bytes = 0;
  KvBudgetSplit kv_budget_split;
  int64_t kv_layers_streamed = 0;    // layer pages read back for attention, total
  double kv_stream_wait_ms = 0;      // time attention waited for them, total
  int64_t requests_submitted = 0;
  int64_t requests_finished = 0;
  int64_t requests_running = 0;
  int64_t requests_waiting = 0;
  // The watchdog (EngineOptions::watchdog_seconds): times the step loop was seen stalled, and
  // the seconds it spent stalled, in all.
  int64_t watchdog_trips = 0;
  double watchdog_stalled_seconds = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t tokens_prefilled = 0;     // prompt tokens computed (hits excluded, recompute included)
  int64_t tokens_generated = 0;
  // Speculative decoding (--spec): sequence steps that sampled (one per sequence per step), those
  // that carried a draft, the draft tokens sent and those verified. Tokens per step is
  // tokens_generated / spec_seq_steps; the acceptance rate spec_accepted / spec_drafted.
  int64_t spec_seq_steps = 0;
  int64_t spec_draft_steps = 0;
  int64_t spec_drafted = 0;
  int64_t spec_accepted = 0;
  double mean_batch_tokens = 0;     // tokens per forward step
  double mean_batch_seqs = 0;       // sequences per forward step
  int64_t last_batch_tokens = 0;
  int64_t last_batch_seqs = 0;
  // Over the last (up to 4096) finished requests / generated tokens, in milliseconds.
  double ttft_mean_ms = 0, ttft_p50_ms = 0, ttft_p99_ms = 0;
  double itl_mean_ms = 0, itl_p50_ms = 0, itl_p99_ms = 0;
  // The running requests' pages, in admission order, as of the last step; and those of the last
  // requests that stopped running (up to kKvEndedPageMaps, oldest first), as of their last step.
  std::vector<KvSequencePageMap> kv_sequences;
  std::vector<KvSequencePageMap> kv_sequences_ended;
};

// Engine::Health: the step loop's watchdog.
struct EngineHealth {
  bool stalled = false;
  std::string reason;             // why, when stalled (what waits and for how long)
  double seconds_since_step = 0;  // since a step last ended
};

// The single-request convenience API (kvl run, tests).
struct GenerateRequest {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  bool add_bos = true;
  bool parse_special = false;  // as Request::parse_special
  int32_t max_new_tokens = 128;
  SamplingParams sampling;
  bool stop_at_eos = true;
  std::vector<std::string> stop_strings;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  double prompt_ms = 0;     // submit to first token
  int64_t generated_tokens = 0;
  double generate_ms = 0;   // first token to last
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  std::string text;
  std::string stop_reason;
  GenerateStats stats;
};

// Called once per generated token with its id and printable text; return false to stop.
using TokenCallback = std::function<bool(int32_t id, std::string_view piece)>;

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();

  // Validates and queues a request; errors (bad ids, empty prompt, prompt longer than the
  // context, bad sampling params) come back here, not as events.
  StatusOr<RequestId> Submit(Request request, EventCallback on_event);
  // The request finishes with "cancelled" at the next step (no-op if it already finished).
  void Cancel(RequestId id);

  // Runs one scheduling step; false when there was nothing to do.
  bool Step();
  // Steps until every submitted request has finished.
  void RunUntilIdle();
  // A background step loop, for servers. Stop reaches a step in progress (its planning returns
  // at once) and waits for the loop to exit (pending requests stay queued).
  void Start();
  void Stop();
  // Whether the background step loop makes progress (the watchdog; any thread): never stalled
  // without Start or with watchdog_seconds 0.
  EngineHealth Health() const;

  EngineMetrics Metrics() const;

  // Submits one request and runs the loop until it finishes (no background loop may be running).
  StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                    const TokenCallback& on_token = {});

  const Model& model() const;
  // VmRSS less the weights held resident (the packed copies and the model file's resident
  // pages): the process's own memory, for the budget's bound. nullopt where /proc cannot be read.
  // Reads /proc/self/smaps: sample it, do not call it per step.
  std::optional<int64_t> RssMinusWeightsBytes() const;
  // The weights the forward pass repacked at load for the ISA's GEMM: anonymous memory that
  // replaces those tensors' pages of the mapped file (0 where the ISA reads the file's layout).
  int64_t packed_weight_bytes() const;
  const Tokenizer& tokenizer() const;
  const EngineOptions& options() const;
  int64_t context_length() const;
  // Tokens one forward step runs at most (the prefill chunk): -b, or fewer under a KV budget, so
  // that the forward pass's scratch (its rows x Forward::ScratchBytesPerRow) fits a quarter of it.
  int64_t step_tokens() const;
  // Whether a request may ask for a lossy kv_quality (Request::kv_quality).
  bool accepts_lossy_kv() const;
  ops::Isa isa() const;
  int num_threads() const;
  const KvManager& kv_manager() const;

  // The engine's parts; defined and used only inside the engine library.
  struct Impl;

 private:
  Engine();
  std::unique_ptr<Impl> impl_;
};


}  // namespace kvl
