// Engine lifecycle and public API: creation, request validation and submission, the loops that
// drive Step, metrics and the one-request Generate convenience.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "engine_impl.h"
#include "kvl/checkpoint_depth.h"
#include "kvl/cost_profile.h"
#include "kvl/kv_quality.h"

namespace kvl {
namespace {

// The default KV budget when none is given: every sequence's context, up to this.
constexpr int64_t kDefaultKvBudgetBytes = 1ll << 30;
// `auto` keeps residual checkpoints in the pool's blocks only where the pool still holds this
// many blocks with them.
constexpr int64_t kMinBlocksWithCheckpoints = 16;
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

// --kv-policy, --kv-quality and --kv-tier, parsed once before the pool's layout is decided.
struct KvSettings {
  KvPolicyChoice policy;
  KvQuality quality = KvQuality::kLossless;
  std::vector<TierSpec> tiers;

  bool has_tier(std::string_view kind) const {
    return std::any_of(tiers.begin(), tiers.end(),
                       [kind](const TierSpec& t) { return t.kind == kind; });
  }
};

StatusOr<KvSettings> ParseKvSettings(const EngineOptions& options) {
  KvSettings s;
  KVL_ASSIGN_OR_RETURN(s.policy, ParseKvPolicy(options.kv_policy));
  KVL_ASSIGN_OR_RETURN(s.quality, ParseKvQuality(options.kv_quality));
  for (const std::string& text : options.kv_tiers) {
    KVL_ASSIGN_OR_RETURN(TierSpec spec, ParseTierSpec(text));
    s.tiers.push_back(std::move(spec));
  }
  return s;
}

Status LoadModel(Engine::Impl& e) {
  const EngineOptions& options = e.options;
  KVL_ASSIGN_OR_RETURN(ops::Isa isa, ChooseIsa(options.isa));
  KVL_ASSIGN_OR_RETURN(e.model, Model::Load(options.model_path));
  KVL_ASSIGN_OR_RETURN(e.tokenizer, Tokenizer::FromGguf(e.model->file()));
  const ModelConfig& c = e.model->config();
  for (int32_t id = 0; id < e.tokenizer->vocab_size(); ++id) {
    e.max_piece_bytes = std::max<int64_t>(e.max_piece_bytes,
                                          static_cast<int64_t>(e.tokenizer->token_text(id).size()));
  }
  if (e.tokenizer->vocab_size() != c.vocab_size) {
    return DataLossError(fmt::format("{}: the tokenizer has {} tokens but token_embd.weight has {}",
                                     options.model_path, e.tokenizer->vocab_size(), c.vocab_size));
  }
  e.context_length = options.context_length > 0 ? options.context_length
                                                : std::min<int64_t>(c.context_length, 4096);
  int threads = options.num_threads;
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  KVL_ASSIGN_OR_RETURN(e.pool, ThreadPool::Create(threads));
  e.ops = std::make_unique<ops::OpsContext>(isa, e.pool.get());
  return Status::Ok();
}

// How the budget splits between the pool and the pager's buffers outside it.
struct KvPoolSizing {
  int64_t budget_bytes = 0;   // all of it
  int64_t staged_pages = 0;   // pages that can be streamed or rebuilt at once
  int64_t staging_bytes = 0;  // the pager's buffers: out of the budget
  bool compresses = false;    // pages may be compressed: the codec's scratch is reserved
};

// The budget covers what the pager holds outside the pool too: its fixed buffers whenever pages
// can leave the pool, and the staging of pages streamed from tiers (or rebuilt from checkpoints)
// every step, a fraction of the budget, where running pages can go to a tier.
KvPoolSizing SizeKvPool(const Engine::Impl& e, const KvSettings& kv, const KvBlockLayout& layout) {
  const EngineOptions& options = e.options;
  KvPoolSizing z;
  z.budget_bytes = options.kv_budget_bytes;
  if (z.budget_bytes == 0) {
    const int64_t per_context =
        layout.block_bytes() *
        ((e.context_length + options.block_tokens - 1) / options.block_tokens);
    // Room for every sequence's whole context, within kDefaultKvBudgetBytes: a longer context
    // pages (or is refused with the budget named), it never reserves memory for what it may use.
    z.budget_bytes = std::min<int64_t>(per_context * options.max_seqs, kDefaultKvBudgetBytes);
  }
  const KvStagingCost staging = KvPager::StagingCost(layout);
  z.compresses =
      kv.quality != KvQuality::kLossless || (!kv.policy.automatic && !IsLossless(kv.policy.fixed));
  const bool streams = kv.policy.automatic ? kv.has_tier("ram") || kv.has_tier("disk")
                                           : kv.policy.fixed == KvAction::kDemoteRam ||
                                                 kv.policy.fixed == KvAction::kDemoteDisk ||
                                                 kv.policy.fixed == KvAction::kRecomputeResidual;
  const int64_t fixed_bytes = (z.compresses ? staging.fixed : 0) + staging.restore;
  if (streams) {
    double fraction = options.kv_stream_reserve;
    if (fraction == 0) {
      // Auto. Without a RAM tier every page a running sequence keeps outside the pool is staged
      // at every step (a disk tier with O_DIRECT, checkpoints), so one full-context sequence
      // needs about one staged page per page of its context: a fixed quarter of a small budget
      // stopped such a sequence long before the pool and the disk were full.
      const int64_t context_pages =
          (e.context_length + layout.block_tokens - 1) / layout.block_tokens;
      const double wanted = static_cast<double>(context_pages * staging.per_page + fixed_bytes) /
                            static_cast<double>(z.budget_bytes);
      fraction = kv.has_tier("ram")
                     ? kDefaultStreamReserve
                     : std::clamp(wanted, kDefaultStreamReserve, kMaxAutoStreamReserve);
    }
    const double reserve = static_cast<double>(z.budget_bytes) * fraction;
    z.staged_pages = std::max<int64_t>(
        1, static_cast<int64_t>(reserve - static_cast<double>(fixed_bytes)) / staging.per_page);
  }
  z.staging_bytes = fixed_bytes + z.staged_pages * staging.per_page;
  return z;
}

// The per-page prices of the measured machine (kvl/cost_profile.h): the calibration profile of
// this model on this machine; without one, a quick calibration on the engine's own model and
// pool, announced on stderr and saved where it says; with --no-calibrate, analytic defaults.
Status LoadCostProfile(Engine::Impl& e, const KvSettings& kv, const std::string& disk_dir,
                       PageCostProfile* prices) {
  PagePriceOptions price_options;
  price_options.block_tokens =
      e.options.block_tokens;  // before the pool exists (--kv-checkpoint-every)
  price_options.layers = e.model->config().num_layers;
  for (const TierSpec& spec : kv.tiers) {
    if (spec.kind == "disk") price_options.disk_direct = spec.direct_io;
    if (spec.kind == "ram") price_options.ram_compressed = spec.compress;
  }
  // A resumed sequence recomputes its dropped pages in forward calls of the engine's batch size.
  price_options.recompute_batch_tokens = std::min<int64_t>(e.options.batch_size, e.context_length);
  // Between a page's leaving and its return the steps stream the weights and read the pool:
  // where those fit in the last-level cache, a tier page is still there when it is read back.
  // (The checkpoint spacing is chosen before the pool exists: its budget stands for it.)
  const int64_t pool_bytes = e.storage ? e.storage->num_blocks() * e.storage->layout().block_bytes()
                                       : e.options.kv_budget_bytes;
  price_options.working_set_bytes = e.model->weight_bytes() + pool_bytes;
  if (e.options.cost_profile) {
    FillPagePrices(*e.options.cost_profile, price_options, prices);
    return Status::Ok();
  }
  ProfileOptions profile_options;
  profile_options.path = e.options.profile_path;
  profile_options.calibrate = e.options.calibrate;
  profile_options.calibration.disk_dir = disk_dir;  // empty (the temp dir) without a disk tier
  // The page KLDs are measured on the built-in text in this model's tokens.
  profile_options.calibration.quality_tokens =
      e.tokenizer->Encode(kKvQualityText, /*add_bos=*/true);
  profile_options.explain = e.options.explain;
  KVL_ASSIGN_OR_RETURN(const MachineProfile profile,
                       ObtainProfile(*e.model, *e.ops, profile_options));
  FillPagePrices(profile, price_options, prices);
  return Status::Ok();
}

// The prices of checkpoints every s layers for one page of this model (kvl/checkpoint_depth.h).
CheckpointDepthPrices CheckpointPrices(const KvBlockLayout& layout, int64_t dim,
                                       const PageCostProfile& prices) {
  CheckpointDepthPrices p;
  p.num_layers = layout.num_layers;
  p.page_residual_bytes = static_cast<int64_t>(layout.block_tokens) * layout.num_layers * dim *
                          static_cast<int64_t>(sizeof(float));
  p.rebuild_kv_ms = prices.recompute_residual_ms;
  p.recompute_tokens_ms = prices.recompute_tokens_ms;
  return p;
}

// --kv-checkpoint-every: the stride given, or (auto) the one the cost model prices cheapest. A
// page kept as checkpoints is rebuilt at every step that reads it, so `auto` prices one rebuild
// against the memory the checkpoints hold, at what a MiB of the pool saves per step when it holds
// a page (K/V and checkpoints) instead of that page being rebuilt from checkpoints.
StatusOr<int64_t> ChooseCheckpointEvery(Engine::Impl& e, const KvSettings& kv,
                                        const KvBlockLayout& layout) {
  const int64_t given = e.options.kv_checkpoint_every;
  if (given > layout.num_layers) {
    return InvalidArgumentError(
        fmt::format("--kv-checkpoint-every {}: the model has {} layers (use 1 to {}, or auto)",
                    given, layout.num_layers, layout.num_layers));
  }
  if (layout.residual_dim == 0) return 1;  // no checkpoints are kept: nothing to space out
  if (given > 0) return given;
  PageCostProfile prices;
  KVL_RETURN_IF_ERROR(LoadCostProfile(e, kv, /*disk_dir=*/"", &prices));
  CheckpointDepthPrices p = CheckpointPrices(layout, e.model->config().dim, prices);
  const double page_mib =
      static_cast<double>(layout.kv_bytes() + p.page_residual_bytes) / static_cast<double>(1 << 20);
  p.memory_price_ms_per_mib = p.rebuild_kv_ms / page_mib;
  p.rebuilds = 1;
  KVL_ASSIGN_OR_RETURN(const CheckpointDepthChoice choice, ChooseCheckpointDepth(p));
  if (e.options.explain)
    fmt::print(stderr, "kvl: --kv-checkpoint-every auto:\n{}", choice.Explain());
  return choice.every;
}

// The paged pool sized from the budget, its storage, the pager and the forward pass's view.
Status CreateKvPool(Engine::Impl& e, const KvSettings& kv) {
  const EngineOptions& options = e.options;
  const ModelConfig& c = e.model->config();
  KvManagerOptions kvo;
  kvo.layout.block_tokens = options.block_tokens;
  kvo.layout.num_layers = c.num_layers;
  kvo.layout.kv_dim = c.kv_dim();
  KVL_ASSIGN_OR_RETURN(kvo.layout.k_type, ParseKvCacheType(options.cache_type_k));
  KVL_ASSIGN_OR_RETURN(kvo.layout.v_type, ParseKvCacheType(options.cache_type_v));
  if (KeepsResidualCheckpoints(kv.policy, kv.has_tier("ram"), c.dim, c.kv_dim())) {
    kvo.layout.residual_dim = c.dim;
  }
  KVL_ASSIGN_OR_RETURN(kvo.layout.checkpoint_every, ChooseCheckpointEvery(e, kv, kvo.layout));
  KvPoolSizing z = SizeKvPool(e, kv, kvo.layout);
  if (kv.policy.automatic && kvo.layout.residual_dim > 0 &&
      (z.budget_bytes - z.staging_bytes) / kvo.layout.block_bytes() < kMinBlocksWithCheckpoints) {
    // Checkpoints are an option `auto` may take, never a reason for a budget to stop working:
    // where they would leave the pool too few blocks, the pool keeps K/V only.
    kvo.layout.residual_dim = 0;
    kvo.layout.checkpoint_every = 1;
    z = SizeKvPool(e, kv, kvo.layout);
  }
  if (z.budget_bytes - z.staging_bytes < kvo.layout.block_bytes()) {
    return ResourceExhaustedError(fmt::format(
        "--kv-budget {} bytes holds no KV block of {} bytes once {} bytes are set aside for the "
        "pages that leave the pool ({} staged pages; --kv-stream-reserve {})",
        z.budget_bytes, kvo.layout.block_bytes(), z.staging_bytes, z.staged_pages,
        options.kv_stream_reserve == 0 ? std::string("auto")
                                       : fmt::format("{}", options.kv_stream_reserve)));
  }
  kvo.budget_bytes = z.budget_bytes - z.staging_bytes;
  kvo.model_identity = ModelIdentity(*e.model);
  kvo.enable_prefix_cache = options.prefix_cache;
  kvo.max_seqs = options.max_seqs;
  // Tables reserved at admission, so steps never grow them (up to a bound: a longer sequence
  // grows its tables by doubling, not one reservation for a huge -c).
  kvo.max_seq_tokens = std::min<int64_t>(e.context_length, kReservedSequenceTokens);
  KVL_ASSIGN_OR_RETURN(e.kv, KvManager::Create(kvo));
  KVL_ASSIGN_OR_RETURN(e.storage, KvBlockStorage::Create(kvo.layout, e.kv->num_blocks()));
  e.pager = std::make_unique<KvPager>(*e.kv, *e.storage, options.max_seqs, e.context_length);
  e.pager->ReserveStaging(z.staged_pages, z.compresses);
  e.cache = std::make_unique<PagedKvCache>(*e.kv, *e.storage, e.pager.get());
  return Status::Ok();
}

// What a persistent tier's pages belong to: pages written for another model, layout or cache
// type read as a miss in the next run, never as K/V of this one.
std::string TierIdentity(const Engine::Impl& e) {
  const KvBlockLayout& l = e.storage->layout();
  return fmt::format("model {:016x} block_tokens {} layers {} kv_dim {} residual_dim {} k {} v {}",
                     ModelIdentity(*e.model), l.block_tokens, l.num_layers, l.kv_dim,
                     l.residual_dim, DTypeName(l.k_type), DTypeName(l.v_type));
}

// The price of promoting one page from the Redis tier: the server is measured now, through a
// tier of its own (its own key scope, erased after), as calibration measures RAM and disk; a
// profile cannot hold it (the server may be another machine, and another one next run). Where
// the measurement fails, the tier is priced like the slowest local one and the engine says so.
double MeasureRemotePromoteMs(const TierSpec& spec, const KvBlockLayout& layout,
                              int64_t layer_page_bytes, double fallback_ms) {
  const auto started = std::chrono::steady_clock::now();
  StatusOr<std::unique_ptr<KvTier>> scratch =
      MakeTier(spec, /*page_bytes=*/0, fmt::format("kvl measure {}", ::getpid()));
  StatusOr<TierCurves> curves = scratch.ok()
                                    ? MeasureTierCurves(**scratch, layer_page_bytes,
                                                        layout.num_layers, QuickCalibrateOptions())
                                    : StatusOr<TierCurves>(scratch.status());
  if (!curves.ok()) {
    fmt::print(stderr,
               "kvl: the redis tier could not be measured ({}); priced at {:.3f} ms a page\n",
               curves.status().ToString(), fallback_ms);
    return fallback_ms;
  }
  const double ms = curves->read.Ms(layout.num_layers, layer_page_bytes);
  fmt::print(stderr,
             "kvl: redis tier measured in {:.2f} s: a page ({} x {} bytes) read in {:.3f} ms "
             "({:.3f} ms + {:.2f} GB/s)\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
             layout.num_layers, layer_page_bytes, ms,
             curves->read.call_ms + curves->read.page_ms * static_cast<double>(layout.num_layers),
             curves->read.EffectiveGbps(layout.num_layers * layer_page_bytes));
  return ms;
}

// The KV store over every tier, fastest first, each with its price per page brought back. Off
// without the prefix cache (there is no prefix identity to file pages under).
void SetUpKvStore(Engine::Impl& e, const KvSettings& kv, const PageCostProfile& prices) {
  const KvBlockLayout& layout = e.storage->layout();
  if (!e.options.prefix_cache || !KvStore::Fits(layout, e.pager->layer_page_bytes())) return;
  const double bytes = static_cast<double>(prices.kv_bytes);
  auto ms = [&](double gbps, double latency_ms) {
    return latency_ms + (gbps > 0 ? bytes / (gbps * 1e6) : 0.0);
  };
  std::vector<KvStoreTier> tiers;
  if (e.ram_tier) {
    tiers.push_back({e.ram_tier.get(), false, ms(prices.ram_gbps, prices.ram_latency_ms)});
  }
  if (e.disk_tier) {
    bool persistent = true;
    for (const TierSpec& spec : kv.tiers) {
      if (spec.kind == "disk") persistent = spec.persistent;
    }
    tiers.push_back(
        {e.disk_tier.get(), persistent, ms(prices.disk_read_gbps, prices.disk_latency_ms)});
  }
  if (e.redis_tier) {
    for (const TierSpec& spec : kv.tiers) {
      if (spec.kind != "redis") continue;
      const double slowest_local = std::max(ms(prices.ram_gbps, prices.ram_latency_ms),
                                            ms(prices.disk_read_gbps, prices.disk_latency_ms));
      tiers.push_back(
          {e.redis_tier.get(), true,
           MeasureRemotePromoteMs(spec, layout, e.pager->layer_page_bytes(), slowest_local)});
    }
  }
  if (tiers.empty()) return;
  e.store = std::make_unique<KvStore>(layout, e.pager->layer_page_bytes(), std::move(tiers));
  e.pager->set_store(e.store.get());
}

// The lattice: tiers, what may be done to a page and at what price, the planner that decides.
Status SetUpKvLattice(Engine::Impl& e, const KvSettings& kv) {
  std::string disk_dir;
  for (const TierSpec& spec : kv.tiers) {
    // Tier pages are one layer of K and V (KvPager), so a step streams exactly one layer.
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTier> tier,
                         MakeTier(spec, e.pager->layer_page_bytes(), TierIdentity(e)));
    if (const auto* disk = dynamic_cast<const DiskKvTier*>(tier.get())) {
      fmt::print(stderr, "kvl: disk tier {}: {}\n", spec.path, disk->open_note());
    }
    (spec.kind == "disk"    ? e.disk_tier
     : spec.kind == "redis" ? e.redis_tier
                            : e.ram_tier) = std::move(tier);
    if (spec.kind == "disk") disk_dir = std::filesystem::path(spec.path).parent_path().string();
  }
  e.pager->set_tiers({e.ram_tier.get(), e.disk_tier.get()});
  e.pager->set_rebuilder(e.forward.get(), e.cache.get());

  const KvBlockLayout& layout = e.storage->layout();
  const CompressedSlabs& slabs = e.pager->slabs();
  KvPagingSetup setup;
  setup.policy = kv.policy;
  setup.quality = kv.quality;
  setup.has_ram_tier = e.ram_tier != nullptr;
  setup.has_disk_tier = e.disk_tier != nullptr;
  setup.has_checkpoints = layout.residual_dim > 0;
  setup.int8_fits = slabs.slots_per_slab(KvCodecType::kInt8) >= layout.num_layers;
  setup.int4_fits = slabs.slots_per_slab(KvCodecType::kInt4) >= layout.num_layers;
  setup.block_tokens = layout.block_tokens;
  setup.sink_tokens = e.options.kv_sink_tokens;
  setup.recent_tokens = e.options.kv_recent_tokens;
  setup.explain = e.options.explain;
  PageCostProfile prices;
  prices.kv_bytes = layout.kv_bytes();
  // Checkpoints of every checkpoint_every-th layer (--kv-checkpoint-every).
  prices.residual_bytes = static_cast<int64_t>(layout.block_tokens) *
                          CheckpointLayersKept(layout.num_layers, layout.checkpoint_every) *
                          e.model->config().dim * static_cast<int64_t>(sizeof(float));
  prices.int8_page_bytes = slabs.slot_bytes(KvCodecType::kInt8) * layout.num_layers;
  prices.int4_page_bytes = slabs.slot_bytes(KvCodecType::kInt4) * layout.num_layers;
  // The rules are checked before anything is measured: a policy that cannot run fails at once.
  KVL_ASSIGN_OR_RETURN(KvPagingRules rules, MakeKvPagingRules(setup, prices));
  // Without a tier only recompute-from-tokens needs a price (to report its prediction); the other
  // policies have nothing to choose among.
  const bool needs_profile =
      e.ram_tier || e.disk_tier || e.redis_tier ||
      (!kv.policy.automatic && kv.policy.fixed == KvAction::kRecomputeTokens);
  if (needs_profile) {
    KVL_RETURN_IF_ERROR(LoadCostProfile(e, kv, disk_dir, &rules.prices));
    // A page rebuilt from checkpoints every s layers also runs the layers between them.
    rules.prices.recompute_residual_ms =
        PriceCheckpointDepth(CheckpointPrices(layout, e.model->config().dim, rules.prices),
                             layout.checkpoint_every)
            .rebuild_ms;
  }
  e.pager->set_track_attention(rules.pages_running_sequences);
  SetUpKvStore(e, kv, rules.prices);
  e.planner = std::make_unique<KvPressurePlanner>(rules, *e.kv, *e.pager);
  return Status::Ok();
}

// --kv-trace: the trace file, its header carrying the pool's size and the cost model's price of
// bringing one page back per action (as a resumed sequence's prefill pays it), so that a replay
// prices misses as the engine would.
Status OpenKvTrace(Engine::Impl& e) {
  if (e.options.kv_trace_path.empty()) return Status::Ok();
  const KvPagingRules& rules = e.planner->rules();
  KvTraceHeader header;
  header.block_tokens = rules.block_tokens;
  header.pool_blocks = e.kv->num_blocks();
  header.sink_tokens = rules.sink_tokens;
  header.recent_tokens = rules.recent_tokens;
  KvPolicyOptions po;
  po.quality = rules.quality;
  po.phase = Phase::kPrefill;
  const KvDecision d = ChooseKvAction(PageHistory{}, rules.prices, po);
  for (int a = 0; a < kNumKvActions; ++a) {
    const bool available = (rules.prices.available_actions >> a) & 1u;
    header.price_ms[static_cast<size_t>(a)] =
        available ? d.costs[static_cast<size_t>(a)].bring_back_ms : -1.0;
  }
  KVL_ASSIGN_OR_RETURN(e.trace, KvTraceWriter::Open(e.options.kv_trace_path, header));
  return Status::Ok();
}

}  // namespace

Engine::Engine() : impl_(std::make_unique<Impl>()) {}

Engine::~Engine() {
  Stop();
  if (impl_->scheduler) impl_->scheduler->ReleaseParkedSessions();  // the step loop has stopped
  if (impl_->trace) {
    // The one place a failed trace write surfaces: the run itself went on without it.
    const Status s = impl_->trace->Close();
    if (!s.ok()) fmt::print(stderr, "kvl: {}\n", s.message());
  }
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  KVL_RETURN_IF_ERROR(ValidateEngineOptions(options));  // engine_options.cc
  std::unique_ptr<Engine> engine(new Engine());
  Impl& e = *engine->impl_;
  e.options = options;
  KVL_RETURN_IF_ERROR(LoadModel(e));
  KVL_ASSIGN_OR_RETURN(KvSettings kv, ParseKvSettings(options));
  KVL_RETURN_IF_ERROR(CreateKvPool(e, kv));

  ForwardOptions fo;
  fo.max_batch_tokens = std::min(options.batch_size, e.context_length);
  // --- speculative decoding (issue 26): a decode's draft rows all ask for logits ---
  KVL_ASSIGN_OR_RETURN(const SpecMode spec_mode, ParseSpecMode(options.spec));
  if (spec_mode == SpecMode::kDraftModel) {
    return UnimplementedError("--spec draft (-md): the draft-model drafter is not built yet; "
                              "use --spec ngram or --spec suffix");
  }
  if (spec_mode != SpecMode::kOff) {
    SpecOptions so;
    so.mode = spec_mode;
    so.draft_max = options.draft_max;
    so.context_length = e.context_length;
    so.max_batch_tokens = std::min(options.batch_size, e.context_length);
    so.max_seqs = options.max_seqs;
    so.force = options.spec_force;
    e.speculator = std::make_unique<Speculator>(so);
  }
  // --- end speculative decoding ---
  fo.max_logit_rows =
      options.max_seqs + (e.speculator ? std::min(e.speculator->max_draft_rows(),
                                                  std::min(options.batch_size, e.context_length))
                                       : 0);
  fo.max_context = e.context_length;
  e.forward = std::make_unique<Forward>(*e.model, *e.ops, fo);
  KVL_RETURN_IF_ERROR(SetUpKvLattice(e, kv));

  KVL_RETURN_IF_ERROR(OpenKvTrace(e));

  SchedulerOptions so;
  so.max_batch_tokens = fo.max_batch_tokens;
  so.max_seqs = options.max_seqs;
  so.keep_lossy_sessions = options.prefix_cache;
  so.context_length = e.context_length;
  so.promote_back = options.kv_promote_back;
  e.scheduler = std::make_unique<Scheduler>(so, *e.kv, *e.pager, *e.planner, e.metrics);
  if (e.store) e.scheduler->set_store(e.store.get(), e.planner->rules().prices);
  e.scheduler->set_trace(e.trace.get());
  if (options.kv_feedback) {
    e.planner->set_feedback(&e.feedback);
    e.scheduler->set_feedback(&e.feedback);
  }
  StepRunnerParts parts;
  parts.scheduler = e.scheduler.get();
  parts.kv = e.kv.get();
  parts.storage = e.storage.get();
  parts.pager = e.pager.get();
  parts.store = e.store.get();
  parts.cache = e.cache.get();
  parts.forward = e.forward.get();
  parts.tokenizer = e.tokenizer.get();
  parts.metrics = &e.metrics;
  parts.trace = e.trace.get();
  if (options.kv_feedback) {
    parts.feedback = &e.feedback;
  }
  parts.prices = &e.planner->rules().prices;
  parts.context_length = e.context_length;
  parts.speculator = e.speculator.get();
  e.runner = std::make_unique<StepRunner>(parts);
  e.step_plan.steps.reserve(static_cast<size_t>(options.max_seqs));
  e.step_plan.seqs.reserve(static_cast<size_t>(options.max_seqs));
  if (e.speculator) {
    // Speculative decoding: a decode may carry 1 + draft_max tokens over new blocks; the reused
    // plan has room for that from the start, so a longer draft than before allocates nothing.
    const int64_t step_tokens = int64_t{options.draft_max} + 1;
    e.step_plan.kv.seqs.resize(static_cast<size_t>(options.max_seqs));
    for (KvPlan::SeqPlan& sp : e.step_plan.kv.seqs) {
      sp.tokens.reserve(static_cast<size_t>(step_tokens));
      sp.allocated.reserve(static_cast<size_t>(e.kv->BlocksFor(step_tokens) + 1));
    }
  }
  e.metrics.SetGauges(e.kv->stats(), e.pager->stats(), 0, 0);
  const int64_t block_tokens = e.storage->layout().block_tokens;
  e.metrics.ReservePageMaps(options.max_seqs, e.context_length / block_tokens + 1, block_tokens);
  return engine;
}

void Engine::Impl::TakeInbox() {
  std::lock_guard<std::mutex> lock(inbox_mutex);
  while (!inbox.empty()) {
    scheduler->Enqueue(std::move(inbox.front()));
    inbox.pop_front();
  }
  cancels.swap(cancel_requests);
}

bool Engine::Impl::StepImpl() {
  TakeInbox();
  if (!cancels.empty()) {
    scheduler->Cancel(cancels);
    cancels.clear();
  }
  scheduler->ReleaseFinished();
  if (trace) trace->Step();
  if (speculator) speculator->Propose(scheduler->running());  // drafts for this step
  const bool has_work = scheduler->Schedule(&step_plan);
  if (has_work) {
    runner->Run(step_plan);
    scheduler->ReleaseFinished();
    // Between steps: pages that left the pool come back while it has blocks to spare.
    scheduler->PlanPromotions(&promotion_plan);
    runner->PromoteBack(promotion_plan);
  }
  metrics.SetGauges(kv->stats(), pager->stats(), scheduler->num_running(),
                    scheduler->num_waiting());
  metrics.SetPageMaps(scheduler->running());
  if (store) {
    std::lock_guard<std::mutex> lock(store_stats_mutex);
    store_stats.resize(store->tiers().size());
    for (size_t t = 0; t < store_stats.size(); ++t) store_stats[t] = store->stats(t);
  }
  return has_work || !scheduler->idle();
}

// A request whose pages can never all be in the pool at once, where no page of a running
// sequence may leave it, is refused before any work: it would otherwise run until the pool is
// outgrown and end late (and an SDK retries a 5xx twice, wasting the work three times). Where the
// lattice pages running sequences, the pool bounds nothing up front; a sequence that still
// outgrows it ends with its text so far and finish reason "length" (Scheduler::FinishTooBig).
Status Engine::Impl::CheckFitsBudget(int64_t prompt_tokens, int32_t max_new_tokens) const {
  if (planner->rules().pages_running_sequences) return Status::Ok();
  const int64_t block_tokens = kv->options().layout.block_tokens;
  const int64_t capacity = kv->num_blocks() * block_tokens;
  const std::string budget = fmt::format(
      "the KV budget ({}: a pool of {} blocks of {} tokens, at most {} tokens of one sequence)",
      options.kv_budget_bytes > 0 ? fmt::format("--kv-budget {} bytes", options.kv_budget_bytes)
                                  : std::string("the default"),
      kv->num_blocks(), block_tokens, capacity);
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
  // A text far longer than the context is refused before it is tokenized (eight 7 MiB prompts
  // grew the server by 600 MB of token ids only to be refused): every token covers at most
  // max_piece_bytes of the text, so the text has at least bytes / max_piece_bytes tokens.
  if (request.prompt_ids.empty() &&
      static_cast<int64_t>(request.prompt.size()) > e.context_length * e.max_piece_bytes) {
    return OutOfRangeError(fmt::format(
        "the prompt has {} bytes, at least {} tokens, but the context holds {} (-c)",
        request.prompt.size(), static_cast<int64_t>(request.prompt.size()) / e.max_piece_bytes,
        e.context_length));
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = request.prompt_ids.empty()
                    ? e.tokenizer->Encode(request.prompt,
                                          EncodeOptions{request.add_bos, request.parse_special})
                    : request.prompt_ids;
  if (seq->tokens.empty())
    return InvalidArgumentError("the prompt is empty and no BOS was requested");
  const int64_t vocab = e.model->config().vocab_size;
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
  if (static_cast<int64_t>(seq->tokens.size()) >= e.context_length) {
    return OutOfRangeError(fmt::format("the prompt has {} tokens but the context holds {} (-c)",
                                       seq->tokens.size(), e.context_length));
  }
  seq->num_prompt = static_cast<int64_t>(seq->tokens.size());
  KVL_RETURN_IF_ERROR(e.CheckFitsBudget(seq->num_prompt, request.max_new_tokens));
  // Room for what this request can reach, so decode steps never grow it (an unlimited request
  // grows by doubling past kReservedSequenceTokens).
  const int64_t reach =
      seq->num_prompt +
      (request.max_new_tokens >= 0 ? request.max_new_tokens : kReservedSequenceTokens) + 1;
  seq->tokens.reserve(static_cast<size_t>(std::min(e.context_length, reach)));
  seq->prev_token = seq->tokens.back();
  seq->sampler = std::make_unique<Sampler>(request.sampling, static_cast<int32_t>(vocab));
  if (e.speculator) e.speculator->Prepare(*seq);  // speculative decoding (issue 26)
  seq->stop_filter = StopTextFilter(request.stop_strings);
  seq->request = std::move(request);
  seq->on_event = std::move(on_event);
  seq->submitted = Clock::now();
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(e.inbox_mutex);
    id = e.next_request_id++;
    seq->id = id;
    e.inbox.push_back(std::move(seq));
    ++e.requests_submitted;
  }
  e.inbox_cv.notify_one();
  return id;
}

void Engine::Cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(impl_->inbox_mutex);
  impl_->cancel_requests.insert(id);
}

bool Engine::Step() { return impl_->StepImpl(); }

void Engine::RunUntilIdle() {
  while (Step()) {
  }
}

void Engine::Start() {
  Impl& e = *impl_;
  if (e.loop_running.exchange(true)) return;
  e.loop = std::thread([&e] {
    while (e.loop_running.load()) {
      if (e.StepImpl()) continue;
      std::unique_lock<std::mutex> lock(e.inbox_mutex);
      e.inbox_cv.wait_for(lock, std::chrono::milliseconds(50), [&e] {
        return !e.inbox.empty() || !e.cancel_requests.empty() || !e.loop_running.load();
      });
    }
  });
}

void Engine::Stop() {
  Impl& e = *impl_;
  if (!e.loop_running.exchange(false)) return;
  e.inbox_cv.notify_all();
  if (e.loop.joinable()) e.loop.join();
}

EngineMetrics Engine::Metrics() const {
  const Impl& e = *impl_;
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(e.inbox_mutex);
    m.requests_submitted = e.requests_submitted;
  }
  e.metrics.Snapshot(&m);
  m.kv_checkpoint_every = e.storage->layout().checkpoint_every;
  for (const KvTier* tier : {e.ram_tier.get(), e.disk_tier.get(), e.redis_tier.get()}) {
    if (tier == nullptr) continue;
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
    if (e.store) {
      // What the store did with this tier (lookups, hits, promotions), as of the last step.
      const int64_t index = e.store->TierIndex(tier);
      std::lock_guard<std::mutex> lock(e.store_stats_mutex);
      if (index >= 0 && static_cast<size_t>(index) < e.store_stats.size()) {
        const KvStoreTierStats& st = e.store_stats[static_cast<size_t>(index)];
        tm.lookups = st.lookups;
        tm.hit_blocks = st.hit_blocks;
        tm.hit_tokens = st.hit_blocks * e.storage->layout().block_tokens;
        tm.blocks_promoted = st.blocks_promoted;
        tm.blocks_in_place = st.blocks_in_place;
        tm.promote_ms_predicted = st.promote_ms_predicted;
        tm.promote_ms_measured = st.promote_ms_measured;
        tm.promote_error = e.metrics.PromotionError(index);
        tm.errors = std::max(tm.errors, st.errors);  // the same failures, seen from both sides
      }
    }
  }
  return m;
}

StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& request,
                                          const TokenCallback& on_token) {
  GenerateResult result;
  result.prompt_ids =
      request.prompt_ids.empty()
          ? impl_->tokenizer->Encode(request.prompt,
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

const Model& Engine::model() const { return *impl_->model; }
const Tokenizer& Engine::tokenizer() const { return *impl_->tokenizer; }
const EngineOptions& Engine::options() const { return impl_->options; }
int64_t Engine::context_length() const { return impl_->context_length; }
ops::Isa Engine::isa() const { return impl_->ops->isa(); }
int Engine::num_threads() const { return impl_->pool->num_threads(); }
const KvManager& Engine::kv_manager() const { return *impl_->kv; }

}  // namespace kvl
