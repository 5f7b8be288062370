// Engine lifecycle and public API: creation, request validation and submission, the loops that
// drive Step, metrics and the one-request Generate convenience.
#include <fmt/format.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <thread>

#include "engine_impl.h"
#include "kvl/cost_profile.h"
#include "kvl/kv_quality.h"
#include "kvl/machine_load.h"
#include "kvl/process_memory.h"

namespace kvl {
namespace {

// Tokens a sequence's vectors are reserved for up front (tables, token ids).
constexpr int64_t kReservedSequenceTokens = 1 << 16;

StatusOr<ops::Isa> ChooseIsa(const std::string& name) {
  const ops::Isa best = ops::BestIsa();
  if (name == "auto") return best;
  for (ops::Isa isa : ops::RunnableIsas()) {
    if (ops::IsaName(isa) == name) return isa;
  }
  return InvalidArgumentError(fmt::format(
      "ISA '{}' is not available on this CPU/build (best here: {})", name, ops::IsaName(best)));
}

// Seeds the prefix cache's hash chain so blocks never match across different models.
uint64_t ModelIdentity(const Model& model) {
  uint64_t h = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(model.file().file_size());
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0x100000001b3ull;
  };
  for (const GgufTensorInfo& t : model.file().tensors()) {
    for (char c : t.name) mix(static_cast<uint8_t>(c));
    mix(static_cast<uint64_t>(t.type));
    mix(t.offset);
    // A few bytes of every tensor: two files of the same shape with different weights differ.
    if (t.num_bytes >= 8) {
      uint64_t v;
      __builtin_memcpy(&v, t.data, 8);
      mix(v);
    }
  }
  return h;
}

Status LoadModel(Engine::Impl& e) {
  const EngineOptions& options = e.options;
  KVL_ASSIGN_OR_RETURN(ops::Isa isa, ChooseIsa(options.isa));
  KVL_ASSIGN_OR_RETURN(e.model.weights, Model::Load(options.model_path));
  KVL_ASSIGN_OR_RETURN(e.model.tokenizer, Tokenizer::FromGguf(e.model.weights->file()));
  const ModelConfig& c = e.model.weights->config();
  for (int32_t id = 0; id < e.model.tokenizer->vocab_size(); ++id) {
    e.model.max_piece_bytes = std::max<int64_t>(
        e.model.max_piece_bytes, static_cast<int64_t>(e.model.tokenizer->token_text(id).size()));
  }
  if (e.model.tokenizer->vocab_size() != c.vocab_size) {
    return DataLossError(fmt::format("{}: the tokenizer has {} tokens but token_embd.weight has {}",
                                     options.model_path, e.model.tokenizer->vocab_size(),
                                     c.vocab_size));
  }
  if (options.context_length > 0) {
    e.model.context_length = options.context_length;
  } else if (options.whole_model_context) {
    e.model.context_length = std::min(c.context_length, kMaxContextTokens);
  } else {
    e.model.context_length = std::min<int64_t>(c.context_length, 4096);
  }
  int threads = options.num_threads;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  KVL_ASSIGN_OR_RETURN(e.model.pool, ThreadPool::Create(threads));
  e.model.ops = std::make_unique<ops::OpsContext>(isa, e.model.pool.get());
  return Status::Ok();
}

// The machine's prices for the KV layer (kvl/cost_profile.h): the calibration profile of this
// model on this machine; without one, a quick calibration on the engine's own model and pool,
// announced on stderr and saved where it says; with --no-calibrate, analytic defaults. Obtained
// once, at the first decision that needs it, and kept in the engine (e.profile) for the rest,
// and for ProfileKeeper, which may replace it.
class EnginePriceSource final : public KvPriceSource {
 public:
  explicit EnginePriceSource(Engine::Impl& e) : e_(e) {}

  Status PagePrices(const Query& query, PageCostProfile* prices) override {
    PagePriceOptions price_options;
    price_options.block_tokens = query.block_tokens;
    price_options.layers = e_.model.weights->config().num_layers;
    price_options.disk_direct = query.disk_direct;
    price_options.ram_compressed = query.ram_compressed;
    // A resumed sequence recomputes its dropped pages in forward calls of the engine's batch
    // size.
    price_options.recompute_batch_tokens =
        std::min<int64_t>(e_.options.batch_size, e_.model.context_length);
    price_options.working_set_bytes = e_.model.weights->weight_bytes() + query.pool_bytes;
    if (e_.options.cost_profile) {
      FillPagePrices(*e_.options.cost_profile, price_options, prices);
      return Status::Ok();
    }
    if (!e_.profile) {
      ProfileOptions profile_options;
      profile_options.path = e_.options.profile_path;
      profile_options.calibrate = e_.options.calibrate;
      profile_options.calibration.disk_dir = query.disk_dir;
      // The page KLDs are measured on the built-in text in this model's tokens.
      profile_options.calibration.quality_tokens =
          e_.model.tokenizer->Encode(kKvQualityText, /*add_bos=*/true);
      profile_options.explain = e_.options.explain;
      KVL_ASSIGN_OR_RETURN(e_.profile,
                           ObtainProfile(*e_.model.weights, *e_.model.ops, profile_options));
      e_.profile_path = ProfilePath(*e_.model.weights, *e_.model.ops, profile_options);
      e_.profile_disk_dir = query.disk_dir;
      // Analytic defaults are never written, so there is nothing to keep.
      e_.profile_at_default_path = e_.options.profile_path.empty() && e_.options.calibrate &&
                                   e_.profile->source == kProfileSourceMeasured;
    }
    FillPagePrices(*e_.profile, price_options, prices);
    return Status::Ok();
  }

  // Measured through a tier of its own (its own key scope, erased after), as calibration
  // measures RAM and disk.
  Status PriceRemoteTier(const TierSpec& spec, int64_t layer_page_bytes, int64_t layers,
                         PageCostProfile* prices) override {
    const auto started = std::chrono::steady_clock::now();
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTier> scratch,
                         MakeTier(spec, /*page_bytes=*/0, fmt::format("kvl measure {}", ::getpid())));
    KVL_ASSIGN_OR_RETURN(const RemoteTierMeasurement measured,
                         MeasureRemoteTier(*scratch, layer_page_bytes, layers,
                                           QuickCalibrateOptions()));
    FillRemoteTierPrices(measured, layer_page_bytes, layers, prices);
    const double page_bytes = static_cast<double>(layers * layer_page_bytes);
    fmt::print(stderr,
               "kvl: redis tier measured in {:.2f} s: a page ({} x {} bytes) read in {:.3f} ms "
               "({:.3f} ms + {:.3f} GB/s; {} reads: median {:.3f} ms, mean {:.3f} ms, p99 {:.3f} "
               "ms), written in {:.3f} ms\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
               layers, layer_page_bytes,
               TransferMs(page_bytes, prices->redis_read_gbps, prices->redis_latency_ms),
               prices->redis_latency_ms, prices->redis_read_gbps, measured.page_reads,
               measured.page_read_median_ms, measured.page_read_mean_ms,
               measured.page_read_p99_ms,
               TransferMs(page_bytes, prices->redis_write_gbps, prices->redis_write_latency_ms));
    return Status::Ok();
  }

 private:
  Engine::Impl& e_;
};

// Calibrate on a pool of its own (the engine's keeps serving), as the engine's quick
// calibration measures: ProfileKeeper's measurement, on its worker thread.
StatusOr<MachineProfile> MeasureOnOwnPool(const Engine::Impl& e,
                                          const std::vector<int32_t>& quality_tokens,
                                          const std::atomic<bool>& stop) {
  KVL_ASSIGN_OR_RETURN(std::unique_ptr<ThreadPool> pool,
                       ThreadPool::Create(e.model.pool->num_threads()));
  ops::OpsContext ctx(e.model.ops->isa(), pool.get());
  CalibrateOptions o = QuickCalibrateOptions();
  o.disk_dir = e.profile_disk_dir;
  o.quality_tokens = quality_tokens;
  o.stop = &stop;
  return Calibrate(*e.model.weights, ctx, o, {});
}

// The keeper of a profile found or saved at a default path (engine_impl.h).
void CreateProfileKeeper(Engine::Impl& e) {
  if (!e.profile || !e.profile_at_default_path) return;
  ProfileKeeperOptions o;
  o.path = e.profile_path;
  o.drift_bound = e.options.kv_profile_drift;
  ProfileKeeperHooks hooks;
  KvMemory* memory = e.memory.get();
  hooks.feedback = memory->view().corrections();
  hooks.seed = [memory](size_t key, double scale) { memory->SeedCorrection(key, scale); };
  hooks.measure = [&e, tokens = e.model.tokenizer->Encode(kKvQualityText, /*add_bos=*/true)](
                      const std::atomic<bool>& stop) { return MeasureOnOwnPool(e, tokens, stop); };
  hooks.others_cpu_share = [] { return MeasureOthersCpuShare(0.25); };
  hooks.apply = [&e](const MachineProfile& profile) {
    e.profile = profile;
    return e.memory->Reprice(e.prices.get());
  };
  hooks.wake = [&e] { e.inbox.Wake(); };
  e.keeper = std::make_unique<ProfileKeeper>(std::move(o), std::move(hooks), *e.profile);
}

// The KV layer, from the engine's options and the model's shape.
Status CreateKvMemory(Engine::Impl& e, int64_t draft_pool_bytes) {
  const EngineOptions& options = e.options;
  const ModelConfig& c = e.model.weights->config();
  KvMemoryOptions o;
  o.block_tokens = options.block_tokens;
  o.num_layers = c.num_layers;
  o.kv_dim = c.kv_dim();
  o.dim = c.dim;
  KVL_ASSIGN_OR_RETURN(o.k_type, ParseKvCacheType(options.cache_type_k));
  KVL_ASSIGN_OR_RETURN(o.v_type, ParseKvCacheType(options.cache_type_v));
  KVL_RETURN_IF_ERROR(CheckKvCacheTypes(c, o.k_type, o.v_type));
  o.model_identity = ModelIdentity(*e.model.weights);
  o.context_length = e.model.context_length;
  o.max_seqs = options.max_seqs;
  // Tables reserved at admission, so steps never grow them (up to a bound: a longer sequence
  // grows its tables by doubling, not one reservation for a huge -c).
  o.max_seq_tokens = std::min<int64_t>(e.model.context_length, kReservedSequenceTokens);
  o.budget_bytes = options.kv_budget_bytes;
  o.draft_pool_bytes = draft_pool_bytes;
  o.stream_reserve = options.kv_stream_reserve;
  o.checkpoint_every = options.kv_checkpoint_every;
  o.prefix_cache = options.prefix_cache;
  KVL_ASSIGN_OR_RETURN(o.policy, ParseKvPolicy(options.kv_policy));
  KVL_ASSIGN_OR_RETURN(o.quality, ParseKvQuality(options.kv_quality));
  o.quality_prices = options.kv_quality_prices;
  for (const std::string& text : options.kv_tiers) {
    KVL_ASSIGN_OR_RETURN(TierSpec spec, ParseTierSpec(text));
    o.tiers.push_back(std::move(spec));
  }
  o.sink_tokens = options.kv_sink_tokens;
  o.recent_tokens = options.kv_recent_tokens;
  o.feedback = options.kv_feedback;
  o.explain = options.explain;
  o.trace_path = options.kv_trace_path;
  o.trace_opener = options.kv_trace_opener;
  o.block_observer = options.kv_block_observer;
  // Sliding-window layers: one forward run writes at most a batch of one sequence's tokens.
  o.window.window = c.arch.sliding_window;
  for (int64_t l = 0; l < c.num_layers; ++l) o.window.layer_is_local.push_back(c.IsLocal(l));
  o.window.max_run_tokens = std::min(options.batch_size, e.model.context_length);
  o.window_release = options.kv_window_release;
  e.prices = std::make_unique<EnginePriceSource>(e);
  KVL_ASSIGN_OR_RETURN(e.memory, KvMemory::Create(o, e.prices.get()));
  return Status::Ok();
}

// The forward pass's scratch may take at most this share of a KV budget (see StepTokens).
constexpr int64_t kBudgetShareForScratch = 4;  // a quarter
// The draft model's pool (--spec draft) may take at most this share of a given KV budget.
constexpr int64_t kBudgetShareForDraftPool = 4;  // a quarter
// The fewest rows a budget cuts a step to. Each prefill chunk reads every weight once and, where
// the history's pages are on disk, streams all of them once: a chat turn's new tokens (40-90 in
// `kvl bench turns`, about 100 in the engine tests' prompts) stay one chunk. On TinyLlama's
// shape 128 rows hold 11.6 MiB of scratch (512: 46 MiB).
constexpr int64_t kMinBudgetStepTokens = 128;

// The rows of one forward step: -b, the prefill chunk. Under a KV budget the user holds the
// process to a memory figure, and the forward pass's scratch grows with these rows (512 rows of
// TinyLlama's shape hold 45 MiB: more than a quarter of keep-all's KV over 2,400 tokens), so
// the rows are cut until the scratch fits a quarter of the budget, in whole blocks, never below
// kMinBudgetStepTokens nor below a decode step of every sequence with its drafts. The kernels are
// batch-invariant: a smaller chunk computes the same tokens. A RAM tier of a given size is
// carved from the budget (kvl/kv_budget.h): the quarter is of the rest, the pool's side, so that
// a tier sized beside a pool leaves the steps as they were.
int64_t StepTokens(const EngineOptions& options, const ModelConfig& c, int64_t context) {
  const int64_t rows = std::min(options.batch_size, context);
  if (options.kv_budget_bytes <= 0) return rows;
  const int64_t decode_rows =
      options.max_seqs * (1 + (options.spec == "off" ? 0 : options.draft_max));
  const int64_t block = options.block_tokens;
  int64_t pool_side = options.kv_budget_bytes;
  for (const std::string& text : options.kv_tiers) {
    const StatusOr<TierSpec> spec = ParseTierSpec(text);  // validated already
    if (spec.ok() && spec->kind == TierKind::kRam) pool_side -= spec->capacity_bytes;
  }
  const int64_t fit = std::max<int64_t>(0, pool_side) / kBudgetShareForScratch /
                      Forward::ScratchBytesPerRow(c) / block * block;
  return std::min(rows, std::max({fit, kMinBudgetStepTokens, decode_rows}));
}

}  // namespace

Engine::Engine() : impl_(std::make_unique<Impl>()) {}

Engine::~Engine() {
  Stop();
  if (impl_->keeper) impl_->keeper->AtStop();  // the corrections written back
  if (impl_->scheduler) impl_->scheduler->ReleaseParkedSessions();  // the step loop has stopped
  if (impl_->memory) {
    // The one place a failed trace write surfaces: the run itself went on without it.
    const Status s = impl_->memory->CloseTrace();
    if (!s.ok()) fmt::print(stderr, "kvl: {}\n", s.message());
  }
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  KVL_RETURN_IF_ERROR(ValidateEngineOptions(options));  // engine_options.cc
  std::unique_ptr<Engine> engine(new Engine());
  Impl& e = *engine->impl_;
  e.options = options;
  KVL_RETURN_IF_ERROR(LoadModel(e));

  ForwardOptions fo;
  fo.max_batch_tokens = StepTokens(options, e.model.weights->config(), e.model.context_length);
  // --- speculative decoding (issue 26): a decode's draft rows all ask for logits ---
  // Before the KV memory: the draft model's pool comes out of the one KV budget.
  int64_t draft_pool_bytes = 0;
  KVL_ASSIGN_OR_RETURN(const SpecMode spec_mode, ParseSpecMode(options.spec));
  if (spec_mode != SpecMode::kOff) {
    SpecOptions so;
    so.mode = spec_mode;
    so.draft_max = options.draft_max;
    so.context_length = e.model.context_length;
    so.max_batch_tokens = fo.max_batch_tokens;
    so.max_seqs = options.max_seqs;
    so.force = options.spec_force;
    std::unique_ptr<Drafter> drafter;  // null: the speculator's own lookup drafter
    if (spec_mode == SpecMode::kDraftModel) {
      DraftModelOptions dm;
      dm.path = options.draft_model_path;
      dm.max_seqs = options.max_seqs;
      dm.context_length = e.model.context_length;
      dm.draft_max = options.draft_max;
      dm.max_batch_tokens = so.max_batch_tokens;
      // Under a given budget the draft pool takes at most a share of it: the target's pool is
      // what the budget is for.
      if (options.kv_budget_bytes > 0) {
        dm.budget_bytes =
            std::min(dm.budget_bytes, options.kv_budget_bytes / kBudgetShareForDraftPool);
      }
      KVL_ASSIGN_OR_RETURN(std::unique_ptr<DraftModelDrafter> draft_model,
                           DraftModelDrafter::Create(dm, *e.model.tokenizer, *e.model.ops));
      draft_pool_bytes = draft_model->pool_bytes();
      drafter = std::move(draft_model);
    }
    e.speculator = std::make_unique<Speculator>(so, std::move(drafter));
  }
  // --- end speculative decoding ---
  KVL_RETURN_IF_ERROR(CreateKvMemory(e, draft_pool_bytes));
  KvMemory& memory = *e.memory;
  const KvMemoryView kv = memory.view();
  CreateProfileKeeper(e);
  fo.max_logit_rows = options.max_seqs +
                      (e.speculator ? std::min(e.speculator->max_draft_rows(), fo.max_batch_tokens)
                                    : 0);
  fo.max_context = e.model.context_length;
  // Pages kept as checkpoints are rebuilt inside each step that reads them, as extra rows of its
  // run: at most the pages the pager can stage at once.
  if (kv.layout().residual_dim > 0) {
    fo.max_rebuild_rows = kv.staging_capacity_pages() * kv.layout().block_tokens;
  }
  e.forward = std::make_unique<Forward>(*e.model.weights, *e.model.ops, fo);
  memory.set_rebuilder(e.forward.get());

  SchedulerOptions so;
  so.max_batch_tokens = fo.max_batch_tokens;
  so.max_seqs = options.max_seqs;
  so.keep_lossy_sessions = options.prefix_cache;
  so.context_length = e.model.context_length;
  so.promote_back = options.kv_promote_back;
  so.interrupt = e.inbox.interrupt();  // a cancel or a stop reaches a step being planned
  e.scheduler = std::make_unique<Scheduler>(so, memory, e.metrics);
  e.watchdog = std::make_unique<StepWatchdog>(options.watchdog_seconds);
  StepRunnerParts parts;
  parts.scheduler = e.scheduler.get();
  parts.memory = &memory;
  parts.forward = e.forward.get();
  parts.tokenizer = e.model.tokenizer.get();
  parts.metrics = &e.metrics;
  parts.context_length = e.model.context_length;
  parts.speculator = e.speculator.get();
  parts.max_seqs = options.max_seqs;
  parts.draft_max = e.speculator ? options.draft_max : 0;
  e.runner = std::make_unique<StepRunner>(parts);
  const KvMemoryStats stats = kv.stats();
  e.metrics.SetGauges(stats.pool, stats.pages, 0, 0);
  if (stats.window != nullptr) e.metrics.SetWindowGauges(*stats.window);
  const int64_t block_tokens = kv.layout().block_tokens;
  e.metrics.ReservePageMaps(options.max_seqs, e.model.context_length / block_tokens + 1,
                            block_tokens);
  // The fixed part: every buffer above is allocated and touched (the forward pass's scratch for
  // its largest step, the pool), the threads and the tokenizer exist; what the process holds
  // beyond the weights and the KV is what no budget moves. Measured again after the first step.
  e.MeasureFixedBytes();
  return engine;
}

void Engine::Impl::MeasureFixedBytes() {
  // The heap's free memory (a calibration's buffers, an engine before this one) is no part of
  // what this engine holds: handed back first, so that it does not pass for the fixed part and
  // then, reused for KV, hide what the KV takes.
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  const std::optional<ProcessMemory> m = ReadProcessMemory();
  if (!m) return;
  const int64_t weights = static_cast<int64_t>(forward->packed_bytes()) +
                          ReadMappedFileResidentBytes(options.model_path).value_or(0);
  const int64_t fixed = std::max<int64_t>(0, m->rss_bytes - weights - memory->view().held_bytes());
  if (fixed > kv_fixed_bytes.load()) kv_fixed_bytes.store(fixed);
}

std::optional<int64_t> Engine::RssMinusWeightsBytes() const {
  const std::optional<ProcessMemory> m = ReadProcessMemory();
  if (!m) return std::nullopt;
  return m->rss_bytes - packed_weight_bytes() -
         ReadMappedFileResidentBytes(impl_->options.model_path).value_or(0);
}

bool Engine::Impl::StepImpl() {
  inbox.Drain(*scheduler);
  // A measurement of the machine running while idle would time this work: it stops.
  if (keeper && !scheduler->idle()) keeper->WorkArrived();
  scheduler->ReleaseFinished();
  if (speculator) speculator->Propose(scheduler->running());  // drafts for this step
  // The step's cost by its rows, drafting aside: what a draft's extra rows cost, the engine's
  // own work included (on a small model it outweighs the forward pass).
  const auto step_start = std::chrono::steady_clock::now();
  const bool has_work = runner->Step();
  const KvMemoryStats kv = memory->view().stats();
  metrics.SetGauges(kv.pool, kv.pages, scheduler->num_running(), scheduler->num_waiting());
  if (kv.window != nullptr) metrics.SetWindowGauges(*kv.window);
  metrics.SetPageMaps(scheduler->running());
  if (speculator && has_work && runner->last_rows() > 0) {
    speculator->ObserveStep(runner->last_rows(),
                            std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - step_start).count());
  }
  if (keeper) keeper->AfterStep();
  if (!kv_fixed_warmed && runner->last_rows() > 0) {
    kv_fixed_warmed = true;  // the warm-up: once, after the first run of the forward pass
    MeasureFixedBytes();
  }
  return has_work || !scheduler->idle();
}

// A request whose pages can never all be in the pool at once, where no page of a running
// sequence may leave it, is refused before any work: it would otherwise run until the pool is
// outgrown and end late (and an SDK retries a 5xx twice, wasting the work three times). Where the
// lattice pages running sequences, the pool bounds nothing up front; a sequence that still
// outgrows it ends with its text so far and finish reason "kv_pressure" (Scheduler::FinishTooBig).
//
// Where pages of running sequences move losslessly, a sequence still has to reach every page at
// each step: in the pool, streamed from a tier through the staging buffers, or read in place from
// an uncompressed RAM tier. A request longer than all of that together is refused as well. A
// lossy policy may evict pages, so nothing bounds a sequence there.
Status Engine::Impl::CheckFitsBudget(int64_t prompt_tokens, int32_t max_new_tokens) const {
  const KvMemoryView kv = memory->view();
  const KvSequenceCapacity most = kv.MaxSequenceTokens();
  if (most.unbounded) return Status::Ok();
  const int64_t capacity = most.tokens;
  std::string beyond_pool;
  if (kv.pages_running_sequences()) {
    beyond_pool =
        fmt::format(", {} pages streamed from tiers at once and {} read in place from RAM",
                    most.staged_pages, most.in_place_pages);
  }
  const std::string budget = fmt::format(
      "the KV budget ({}: a pool of {} blocks of {} tokens{}, at most {} tokens of one "
      "sequence)",
      options.kv_budget_bytes > 0 ? fmt::format("--kv-budget {} bytes", options.kv_budget_bytes)
                                  : std::string("the default"),
      kv.num_blocks(), kv.layout().block_tokens, beyond_pool, capacity);
  if (prompt_tokens > capacity) {
    return InvalidArgumentError(fmt::format(
        "the prompt has {} tokens but {} cannot hold them; raise --kv-budget, or let pages of "
        "running sequences move (--kv-policy auto with --kv-tier ram:SIZE)",
        prompt_tokens, budget));
  }
  if (max_new_tokens >= 0 && prompt_tokens + max_new_tokens > capacity) {
    return InvalidArgumentError(fmt::format(
        "the prompt ({} tokens) and max_tokens ({}) need {} tokens but {} cannot hold them; ask "
        "for at most {} tokens, or raise --kv-budget",
        prompt_tokens, max_new_tokens, prompt_tokens + max_new_tokens, budget,
        capacity - prompt_tokens));
  }
  return Status::Ok();
}

StatusOr<RequestId> Engine::Submit(Request request, EventCallback on_event) {
  Impl& e = *impl_;
  KVL_RETURN_IF_ERROR(request.sampling.Validate());
  if (request.top_logprobs < -1 || request.top_logprobs > kMaxTopLogprobs) {
    return InvalidArgumentError(fmt::format("top_logprobs must be in [-1, {}], got {}",
                                            kMaxTopLogprobs, request.top_logprobs));
  }
  // Refused rather than served with buffers the budget never counted: compressing a page takes
  // the codec's scratch, reserved only where the engine itself may compress.
  const KvQuality kv_quality = request.kv_quality.value_or(e.memory->view().rules().quality);
  if (kv_quality != KvQuality::kLossless && !e.memory->view().accepts_lossy_requests()) {
    return InvalidArgumentError(fmt::format(
        "kv_quality '{}' lets this request's KV pages be compressed, but the engine was started "
        "lossless and reserved no buffers for compressed pages: start it with --kv-quality "
        "balanced or aggressive (a request may still ask for lossless there)",
        KvQualityName(kv_quality)));
  }
  // A text far longer than the context is refused before it is tokenized (eight 7 MiB prompts
  // grew the server by 600 MB of token ids only to be refused): every token covers at most
  // max_piece_bytes of the text, so the text has at least bytes / max_piece_bytes tokens.
  if (request.prompt_ids.empty() && static_cast<int64_t>(request.prompt.size()) >
                                        e.model.context_length * e.model.max_piece_bytes) {
    return OutOfRangeError(
        fmt::format("the prompt has {} bytes, at least {} tokens, but the context holds {} (-c)",
                    request.prompt.size(),
                    static_cast<int64_t>(request.prompt.size()) / e.model.max_piece_bytes,
                    e.model.context_length));
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt_ids.empty()
                    ? e.model.tokenizer->Encode(
                          request.prompt, EncodeOptions{request.add_bos, request.parse_special})
                    : request.prompt_ids;
  if (seq->tokens.empty())
    return InvalidArgumentError("the prompt is empty and no BOS was requested");
  const int64_t vocab = e.model.weights->config().vocab_size;
  for (size_t i = 0; i < seq->tokens.size(); ++i) {
    if (seq->tokens[i] < 0 || seq->tokens[i] >= vocab) {
      return InvalidArgumentError(fmt::format(
          "token id {} at index {} is outside the vocabulary [0, {})", seq->tokens[i], i, vocab));
    }
  }
  for (const auto& [id, bias] : request.sampling.logit_bias) {
    if (id >= vocab) {
      return InvalidArgumentError(
          fmt::format("logit_bias names token {}, outside the vocabulary [0, {})", id, vocab));
    }
  }
  if (static_cast<int64_t>(seq->tokens.size()) >= e.model.context_length) {
    return OutOfRangeError(fmt::format("the prompt has {} tokens but the context holds {} (-c)",
                                       seq->tokens.size(), e.model.context_length));
  }
  seq->num_prompt = static_cast<int64_t>(seq->tokens.size());
  seq->kv_quality = kv_quality;
  KVL_RETURN_IF_ERROR(e.CheckFitsBudget(seq->num_prompt, request.max_new_tokens));
  // Room for what this request can reach, so decode steps never grow it (an unlimited request
  // grows by doubling past kReservedSequenceTokens).
  const int64_t reach =
      seq->num_prompt +
      (request.max_new_tokens >= 0 ? request.max_new_tokens : kReservedSequenceTokens) + 1;
  seq->tokens.reserve(static_cast<size_t>(std::min(e.model.context_length, reach)));
  seq->prev_token = seq->tokens.back();
  // The prompt's length: OpenAI's frequency and presence penalties count only what follows it.
  seq->sampler = std::make_unique<Sampler>(request.sampling, static_cast<int32_t>(vocab),
                                           static_cast<size_t>(seq->num_prompt));
  if (!request.grammar.empty()) {
    auto grammar = CompileRequestGrammar(
        request.grammar,
        e.grammar_vocabulary.Get(*e.model.tokenizer, static_cast<int32_t>(vocab)));
    if (!grammar.ok()) return grammar.status();
    seq->grammar = std::move(*grammar);
  }
  if (e.speculator) e.speculator->Prepare(*seq);  // speculative decoding (issue 26)
  seq->stop_filter = StopTextFilter(request.stop_strings);
  seq->request = std::move(request);
  seq->on_event = std::move(on_event);
  seq->submitted = Clock::now();
  return e.inbox.Push(std::move(seq));
}

void Engine::Cancel(RequestId id) { impl_->inbox.Cancel(id); }  // wakes an idle step loop

bool Engine::Step() { return impl_->StepImpl(); }

void Engine::RunUntilIdle() {
  while (Step()) {
  }
}

void Engine::Start() {
  Impl& e = *impl_;
  if (e.loop.running.exchange(true)) return;
  e.inbox.Resume();
  if (e.keeper) e.keeper->EnableIdleMeasuring();  // before the loop's first step
  e.watchdog->LoopStarted(Clock::now());
  e.loop.thread = std::thread([&e] {
    while (e.loop.running.load()) {
      e.watchdog->StepStarted(Clock::now());
      const bool work_left = e.StepImpl();
      e.watchdog->StepEnded(Clock::now(), work_left);
      if (work_left) continue;
      // Idle: asleep until Submit, Cancel or Stop wakes it (no poll to wait out), unless the
      // profile's keeper has work for an idle moment: then after that long without work.
      const auto idle_work_in = e.keeper ? e.keeper->IdleWorkIn() : std::nullopt;
      if (!idle_work_in) {
        e.inbox.Wait();
      } else if (!e.inbox.WaitFor(*idle_work_in) && e.loop.running.load()) {
        e.keeper->AtIdle();
      }
    }
  });
  if (e.watchdog->limit_seconds() > 0) {
    // Checked four times per limit, at most once a second: a stall is counted within a quarter
    // of the limit of when it began, whoever asks.
    const auto period = std::chrono::duration<double>(
        std::clamp(e.watchdog->limit_seconds() / 4, 0.01, 1.0));
    e.loop.watchdog_thread = std::thread([&e, period] {
      std::unique_lock<std::mutex> lock(e.loop.watchdog_mutex);
      int64_t trips_logged = 0;
      while (e.loop.running.load()) {
        const StepWatchdogReport r = e.watchdog->Check(Clock::now(), e.inbox.HasQueued());
        if (r.trips > trips_logged) {
          fmt::print(stderr, "kvl: watchdog: the step loop is stalled: {}\n", r.reason);
          trips_logged = r.trips;
        }
        e.loop.watchdog_wake.wait_for(lock, period, [&e] { return !e.loop.running.load(); });
      }
    });
  }
}

void Engine::Stop() {
  Impl& e = *impl_;
  if (!e.loop.running.exchange(false)) return;
  // A step being planned returns at once, and an idle loop wakes (a wake before the loop's wait
  // is kept: the wait returns at once).
  e.inbox.Interrupt();
  {
    std::lock_guard<std::mutex> lock(e.loop.watchdog_mutex);
    e.loop.watchdog_wake.notify_all();
  }
  if (e.loop.thread.joinable()) e.loop.thread.join();
  if (e.loop.watchdog_thread.joinable()) e.loop.watchdog_thread.join();
  e.inbox.Resume();  // Step may be called by hand after Stop
}

EngineHealth Engine::Health() const {
  const Impl& e = *impl_;
  const StepWatchdogReport r = e.watchdog->Check(Clock::now(), e.inbox.HasQueued());
  return EngineHealth{r.stalled, r.reason, r.seconds_since_step};
}

EngineMetrics Engine::Metrics() const {
  const Impl& e = *impl_;
  EngineMetrics m;
  m.requests_submitted = e.inbox.requests_submitted();
  if (e.keeper) {
    const ProfileKeeper::Counts counts = e.keeper->counts();
    m.profile_measures_started = counts.started;
    m.profile_measures_finished = counts.finished;
    m.profile_measures_abandoned = counts.abandoned;
    m.profile_measuring = counts.running;
  }
  e.metrics.Snapshot(&m);
  const StepWatchdogReport watchdog = e.watchdog->Check(Clock::now(), e.inbox.HasQueued());
  m.watchdog_trips = watchdog.trips;
  m.watchdog_stalled_seconds = watchdog.stalled_seconds;
  const KvMemoryView kv = e.memory->view();
  m.kv_checkpoint_every = kv.layout().checkpoint_every;
  m.kv_budget_split = kv.budget_split();
  m.kv_budget_bytes = m.kv_budget_split.budget_bytes;
  m.kv_fixed_bytes = e.kv_fixed_bytes.load();
  m.kv_held_bytes = kv.held_bytes();
  m.rss_minus_weights_bytes = RssMinusWeightsBytes().value_or(0);
  const std::vector<KvStoreTierStats> store_stats = kv.StoreStats();
  for (const KvTier* tier : kv.tiers()) {
    const TierStats t = tier->stats();
    KvTierMetrics& tm = m.kv_tiers.emplace_back();
    tm.name = std::string(tier->name());
    tm.capacity_bytes = t.capacity_bytes;
    tm.bytes_used = t.bytes_used;
    tm.pages = t.pages;
    tm.pages_in = t.puts;
    tm.bytes_in = t.bytes_written;
    tm.pages_out = t.gets;
    tm.bytes_out = t.bytes_read;
    tm.checksum_failures = t.checksum_failures;
    tm.evictions = t.evictions;
    tm.errors = t.errors;
    // What the store did with this tier (lookups, hits, promotions), as of the last step.
    const int64_t index = kv.StoreTierIndex(tier);
    if (index >= 0 && static_cast<size_t>(index) < store_stats.size()) {
      const KvStoreTierStats& st = store_stats[static_cast<size_t>(index)];
      tm.lookups = st.lookups;
      tm.hit_blocks = st.hit_blocks;
      tm.hit_tokens = st.hit_blocks * kv.layout().block_tokens;
      tm.blocks_promoted = st.blocks_promoted;
      tm.blocks_in_place = st.blocks_in_place;
      tm.promote_ms_predicted = st.promote_ms_predicted;
      tm.promote_ms_measured = st.promote_ms_measured;
      tm.promote_error = e.metrics.PromotionError(index);
      tm.errors = std::max(tm.errors, st.errors);  // the same failures, seen from both sides
    }
  }
  return m;
}

StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request,
                                          const TokenCallback& on_token) {
  GenerateResult result;
  result.prompt_ids =
      request.prompt_ids.empty()
          ? impl_->model.tokenizer->Encode(request.prompt,
                                           EncodeOptions{request.add_bos, request.parse_special})
          : request.prompt_ids;
  Request r;
  r.prompt_ids = result.prompt_ids;  // tokenized once, here
  r.add_bos = request.add_bos;
  r.max_new_tokens = request.max_new_tokens;
  r.sampling = request.sampling;
  r.ignore_eos = !request.stop_at_eos;
  r.stop_strings = request.stop_strings;

  bool stopped_by_callback = false;
  Status error;
  const Clock::time_point start = Clock::now();
  Clock::time_point first = start, last = start;
  RequestId id = 0;
  auto on_event = [&](const TokenEvent& ev) {
    if (ev.token >= 0) {
      last = Clock::now();
      if (result.output_ids.empty()) first = last;
      result.output_ids.push_back(ev.token);
    }
    result.text += ev.text;
    if (ev.token >= 0 && on_token && !stopped_by_callback && !on_token(ev.token, ev.text)) {
      stopped_by_callback = true;
      Cancel(id);
    }
    if (ev.finished) {
      result.stop_reason = stopped_by_callback ? "callback" : ev.finish_reason;
      result.stats.cached_prompt_tokens = ev.cached_prompt_tokens;
      error = ev.error;
      if (ev.token < 0 && !ev.text.empty() && on_token && !stopped_by_callback)
        on_token(-1, ev.text);
    }
  };
  KVL_ASSIGN_OR_RETURN(id, Submit(std::move(r), on_event));
  RunUntilIdle();
  if (!error.ok()) return error;
  result.stats.prompt_tokens = static_cast<int64_t>(result.prompt_ids.size());
  result.stats.prompt_ms = MillisecondsBetween(start, first);
  result.stats.generated_tokens = static_cast<int64_t>(result.output_ids.size());
  result.stats.generate_ms = MillisecondsBetween(first, last);
  return result;
}

const Model& Engine::model() const { return *impl_->model.weights; }
int64_t Engine::packed_weight_bytes() const {
  return static_cast<int64_t>(impl_->forward->packed_bytes());
}
const Tokenizer& Engine::tokenizer() const { return *impl_->model.tokenizer; }
const EngineOptions& Engine::options() const { return impl_->options; }
int64_t Engine::context_length() const { return impl_->model.context_length; }

int64_t Engine::step_tokens() const { return impl_->forward->options().max_batch_tokens; }
bool Engine::accepts_lossy_kv() const {
  return impl_->memory->view().accepts_lossy_requests();
}
ops::Isa Engine::isa() const { return impl_->model.ops->isa(); }
int Engine::num_threads() const { return impl_->model.pool->num_threads(); }
const KvManager& Engine::kv_manager() const { return impl_->memory->view().manager(); }

}  // namespace kvl
