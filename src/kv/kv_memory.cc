// KvMemory's creation: the pool sized from the budget, the checkpoint spacing, the tiers, the
// prices, the KV store and the planner, each decided once here (kvl/kv_memory.h).
#include "kvl/kv_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "tiers/disk_tier.h"
#include "kvl/checkpoint_depth.h"

namespace kvl {
namespace {

// `auto` keeps residual checkpoints in the pool's blocks only where the pool still holds this
// many blocks with them.
constexpr int64_t kMinBlocksWithCheckpoints = 16;

// How the budget splits between the pool and the pager's buffers outside it.
struct KvPoolSizing {
  int64_t budget_bytes = 0;   // all of it
  int64_t staged_pages = 0;   // pages that can be streamed or rebuilt at once
  int64_t staging_bytes = 0;  // the pager's buffers: out of the budget
  bool compresses = false;    // pages may be compressed: the codec's scratch is reserved
};

bool HasTier(const KvMemoryOptions& o, TierKind kind) {
  return std::any_of(o.tiers.begin(), o.tiers.end(),
                     [kind](const TierSpec& t) { return t.kind == kind; });
}

// The budget covers what the pager holds outside the pool too: its fixed buffers whenever pages
// can leave the pool, and the staging of pages streamed from tiers (or rebuilt from checkpoints)
// every step, a fraction of the budget, where running pages can go to a tier.
// `ring_bytes`: the window rings, set aside beside the pool (counted in staging_bytes by the
// caller).
KvPoolSizing SizeKvPool(const KvMemoryOptions& o, const KvBlockLayout& layout,
                        int64_t ring_bytes) {
  KvPoolSizing z;
  z.budget_bytes = o.budget_bytes;
  if (z.budget_bytes == 0) {
    const int64_t per_context =
        layout.block_bytes() * ((o.context_length + o.block_tokens - 1) / o.block_tokens);
    // Room for every sequence's whole context, within kDefaultKvBudgetBytes: a longer context
    // pages (or is refused with the budget named), it never reserves memory for what it may use.
    z.budget_bytes =
        std::min<int64_t>(per_context * o.max_seqs + ring_bytes, kDefaultKvBudgetBytes);
  }
  const KvStagingCost staging = KvPager::StagingCost(layout);
  z.compresses =
      o.quality != KvQuality::kLossless || (!o.policy.automatic && !IsLossless(o.policy.fixed));
  const bool has_ram = HasTier(o, TierKind::kRam);
  const bool streams = o.policy.automatic ? has_ram || HasTier(o, TierKind::kDisk)
                                          : o.policy.fixed == KvAction::kDemoteRam ||
                                                o.policy.fixed == KvAction::kDemoteDisk ||
                                                o.policy.fixed == KvAction::kRecomputeResidual;
  const int64_t fixed_bytes = (z.compresses ? staging.fixed : 0) + staging.restore;
  if (streams) {
    double fraction = o.stream_reserve;
    if (fraction == 0) {
      // Auto. Without a RAM tier every page a running sequence keeps outside the pool is staged
      // at every step (a disk tier with O_DIRECT, checkpoints), so one full-context sequence
      // needs about one staged page per page of its context: a fixed quarter of a small budget
      // stopped such a sequence long before the pool and the disk were full.
      const int64_t context_pages =
          (o.context_length + layout.block_tokens - 1) / layout.block_tokens;
      const double wanted = static_cast<double>(context_pages * staging.per_page + fixed_bytes) /
                            static_cast<double>(z.budget_bytes);
      fraction = has_ram ? kDefaultStreamReserve
                         : std::clamp(wanted, kDefaultStreamReserve, kMaxAutoStreamReserve);
    }
    const double reserve = static_cast<double>(z.budget_bytes - ring_bytes) * fraction;
    z.staged_pages = std::max<int64_t>(
        1, static_cast<int64_t>(reserve - static_cast<double>(fixed_bytes)) / staging.per_page);
  }
  z.staging_bytes = fixed_bytes + z.staged_pages * staging.per_page;
  return z;
}

// Salt of a windowed pool's model identity (KvMemory::CreatePool).
constexpr uint64_t kWindowedIdentitySalt = 0x57494e444f57ull;  // "WINDOW"

// Whether the pool's local layers go to window rings: a window, local layers, release on, and
// no partial-depth checkpoints (rebuilding the layers between two of them reads old windows).
bool ReleasesWindow(const KvMemoryOptions& o, const KvBlockLayout& layout) {
  if (!o.window_release || !o.window.releases()) return false;
  return layout.residual_dim == 0 || layout.checkpoint_every == 1;
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

}  // namespace

StatusOr<std::unique_ptr<KvMemory>> KvMemory::Create(const KvMemoryOptions& options,
                                                     KvPriceSource* prices) {
  std::unique_ptr<KvMemory> memory(new KvMemory());
  memory->options_ = options;
  KVL_RETURN_IF_ERROR(memory->CreatePool(prices));
  KVL_RETURN_IF_ERROR(memory->CreateLattice(prices));
  KVL_RETURN_IF_ERROR(memory->OpenTrace());
  return memory;
}

KvMemory::~KvMemory() = default;

bool KvMemory::has_tier(TierKind kind) const { return HasTier(options_, kind); }

Status KvMemory::LoadPrices(KvPriceSource* source, const std::string& disk_dir,
                            PageCostProfile* prices) {
  if (source == nullptr) {
    return InternalError("the KV policy needs the machine's prices, and no price source was given");
  }
  KvPriceSource::Query query;
  query.block_tokens = options_.block_tokens;  // before the pool exists (--kv-checkpoint-every)
  for (const TierSpec& spec : options_.tiers) {
    if (spec.kind == TierKind::kDisk) query.disk_direct = spec.direct_io;
    if (spec.kind == TierKind::kRam) query.ram_compressed = spec.compress;
  }
  // Between a page's leaving and its return the steps stream the weights and read the pool:
  // where those fit in the last-level cache, a tier page is still there when it is read back.
  // (The checkpoint spacing is chosen before the pool exists: its budget stands for it.)
  query.pool_bytes =
      storage_ ? storage_->num_blocks() * storage_->layout().block_bytes() : options_.budget_bytes;
  query.disk_dir = disk_dir;
  return source->PagePrices(query, prices);
}

// --kv-checkpoint-every: the stride given, or (auto) the one the cost model prices cheapest. A
// page kept as checkpoints is rebuilt at every step that reads it, so `auto` prices one rebuild
// against the memory the checkpoints hold, at what a MiB of the pool saves per step when it holds
// a page (K/V and checkpoints) instead of that page being rebuilt from checkpoints.
StatusOr<int64_t> KvMemory::ChooseCheckpointEvery(KvPriceSource* source,
                                                  const KvBlockLayout& layout) {
  const int64_t given = options_.checkpoint_every;
  if (given > layout.num_layers) {
    return InvalidArgumentError(
        fmt::format("--kv-checkpoint-every {}: the model has {} layers (use 1 to {}, or auto)",
                    given, layout.num_layers, layout.num_layers));
  }
  if (layout.residual_dim == 0) return 1;  // no checkpoints are kept: nothing to space out
  if (given > 0) return given;
  // A windowed pool rebuilds from checkpoints of every layer only (ReleasesWindow).
  if (options_.window_release && options_.window.releases()) return 1;
  PageCostProfile prices;
  KVL_RETURN_IF_ERROR(LoadPrices(source, /*disk_dir=*/"", &prices));
  CheckpointDepthPrices p = CheckpointPrices(layout, options_.dim, prices);
  const double page_mib =
      static_cast<double>(layout.kv_bytes() + p.page_residual_bytes) / static_cast<double>(1 << 20);
  p.memory_price_ms_per_mib = p.rebuild_kv_ms / page_mib;
  p.rebuilds = 1;
  KVL_ASSIGN_OR_RETURN(const CheckpointDepthChoice choice, ChooseCheckpointDepth(p));
  if (options_.explain) fmt::print(stderr, "kvl: --kv-checkpoint-every auto:\n{}", choice.Explain());
  return choice.every;
}

// The paged pool sized from the budget, its storage, the pager and the forward pass's view.
Status KvMemory::CreatePool(KvPriceSource* prices) {
  const KvMemoryOptions& o = options_;
  KvManagerOptions kvo;
  kvo.layout.block_tokens = o.block_tokens;
  kvo.layout.num_layers = o.num_layers;
  kvo.layout.kv_dim = o.kv_dim;
  kvo.layout.k_type = o.k_type;
  kvo.layout.v_type = o.v_type;
  if (KeepsResidualCheckpoints(o.policy, has_tier(TierKind::kRam), o.dim, o.kv_dim)) {
    kvo.layout.residual_dim = o.dim;
    // `auto` keeps them only where its prices would ever rebuild a page from them rather than
    // demote it: else they only take pool room (kvl/kv_pressure.h).
    if (o.policy.automatic && prices != nullptr) {
      PageCostProfile p;
      KVL_RETURN_IF_ERROR(LoadPrices(prices, /*disk_dir=*/"", &p));
      p.kv_bytes = kvo.layout.kv_bytes();
      p.residual_bytes = kvo.layout.residual_bytes();
      if (!ResidualRebuildBeatsDemotion(p)) kvo.layout.residual_dim = 0;
    }
  }
  KVL_ASSIGN_OR_RETURN(kvo.layout.checkpoint_every, ChooseCheckpointEvery(prices, kvo.layout));
  // Hook (issue 25): the local layers leave the blocks for the window rings.
  const bool windowed = ReleasesWindow(o, kvo.layout);
  if (windowed) kvo.layout.SetWindowedLayers(o.window.layer_is_local);
  const int64_t ring_bytes = windowed ? WindowRingBytes(o.window, kvo.layout, o.max_seqs) : 0;
  KvPoolSizing z = SizeKvPool(o, kvo.layout, ring_bytes);
  if (o.pool_blocks > 0) {
    const KvStagingCost staging = KvPager::StagingCost(kvo.layout);
    z.staged_pages = o.staged_pages;
    z.staging_bytes = (z.compresses ? staging.fixed : 0) + staging.restore +
                      z.staged_pages * staging.per_page;
    z.budget_bytes = o.pool_blocks * kvo.layout.block_bytes() + z.staging_bytes + ring_bytes;
  }
  z.staging_bytes += ring_bytes;  // outside the pool, within the budget, as the pager's buffers
  if (o.policy.automatic && kvo.layout.residual_dim > 0 &&
      (z.budget_bytes - z.staging_bytes) / kvo.layout.block_bytes() < kMinBlocksWithCheckpoints) {
    // Checkpoints are an option `auto` may take, never a reason for a budget to stop working:
    // where they would leave the pool too few blocks, the pool keeps K/V only.
    kvo.layout.residual_dim = 0;
    kvo.layout.checkpoint_every = 1;
    z = SizeKvPool(o, kvo.layout, ring_bytes);
    z.staging_bytes += ring_bytes;
  }
  if (z.budget_bytes - z.staging_bytes < kvo.layout.block_bytes()) {
    return ResourceExhaustedError(fmt::format(
        "--kv-budget {} bytes holds no KV block of {} bytes once {} bytes are set aside for the "
        "pages that leave the pool ({} staged pages; --kv-stream-reserve {}){}",
        z.budget_bytes, kvo.layout.block_bytes(), z.staging_bytes - ring_bytes, z.staged_pages,
        o.stream_reserve == 0 ? std::string("auto") : fmt::format("{}", o.stream_reserve),
        ring_bytes == 0
            ? std::string()
            : fmt::format(" and {} bytes for the sliding-window layers' rings ({} sequences x "
                          "{} rows: window - 1 + -b {})",
                          ring_bytes, o.max_seqs, o.window.ring_tokens(),
                          o.window.max_run_tokens)));
  }
  kvo.budget_bytes = z.budget_bytes - z.staging_bytes;
  // A page of a windowed pool carries scratch local layers: its content ids (and the store's and
  // a persistent tier's pages) are never those of a pool that keeps every layer.
  if (windowed) options_.model_identity ^= kWindowedIdentitySalt;
  kvo.model_identity = options_.model_identity;
  kvo.enable_prefix_cache = o.prefix_cache;
  kvo.max_seqs = o.max_seqs;
  kvo.max_seq_tokens = o.max_seq_tokens;
  KVL_ASSIGN_OR_RETURN(manager_, KvManager::Create(kvo));
  KVL_ASSIGN_OR_RETURN(storage_, KvBlockStorage::Create(kvo.layout, manager_->num_blocks()));
  pager_ = std::make_unique<KvPager>(*manager_, *storage_, o.max_seqs, o.context_length);
  pager_->ReserveStaging(z.staged_pages, z.compresses);
  compresses_ = z.compresses;
  cache_ = std::make_unique<PagedKvCache>(*manager_, *storage_, pager_.get());
  if (windowed) {
    KVL_ASSIGN_OR_RETURN(window_, KvWindowRelease::Create(o.window, kvo.layout, o.max_seqs));
    cache_->set_window(window_.get());
  }
  return Status::Ok();
}

// What a persistent tier's pages belong to: pages written for another model, layout or cache
// type read as a miss in the next run, never as K/V of this one.
std::string KvMemory::TierIdentity() const {
  const KvBlockLayout& l = storage_->layout();
  return fmt::format("model {:016x} block_tokens {} layers {} kv_dim {} residual_dim {} k {} v {}",
                     options_.model_identity, l.block_tokens, l.num_layers, l.kv_dim,
                     l.residual_dim, DTypeName(l.k_type), DTypeName(l.v_type));
}

// The lattice: tiers, what may be done to a page and at what price, the planner that decides.
Status KvMemory::CreateLattice(KvPriceSource* source) {
  std::string disk_dir;
  for (const TierSpec& spec : options_.tiers) {
    // Tier pages are one layer of K and V (KvPager), so a step streams exactly one layer.
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<KvTier> tier,
                         MakeTier(spec, pager_->layer_page_bytes(), TierIdentity()));
    if (const auto* disk = dynamic_cast<const DiskKvTier*>(tier.get())) {
      // How it reads, too: io_uring, or preadv and why (a container may forbid io_uring).
      const auto* info = dynamic_cast<const kv_internal::DiskTierInfo*>(tier.get());
      fmt::print(stderr, "kvl: disk tier {}: {}; reads: {}\n", spec.path, disk->open_note(),
                 info != nullptr ? info->read_path() : "preadv");
    }
    switch (spec.kind) {
      case TierKind::kRam:
        ram_tier_ = std::move(tier);
        break;
      case TierKind::kDisk:
        disk_tier_ = std::move(tier);
        disk_dir = std::filesystem::path(spec.path).parent_path().string();
        break;
      case TierKind::kRedis:
        redis_tier_ = std::move(tier);
        break;
    }
  }
  pager_->set_tiers({ram_tier_.get(), disk_tier_.get()});

  const KvBlockLayout& layout = storage_->layout();
  const CompressedSlabs& slabs = pager_->slabs();
  KvPagingSetup setup;
  setup.policy = options_.policy;
  setup.quality = options_.quality;
  setup.has_ram_tier = ram_tier_ != nullptr;
  setup.has_disk_tier = disk_tier_ != nullptr;
  setup.has_checkpoints = layout.residual_dim > 0;
  setup.int8_fits = slabs.slots_per_slab(KvCodecType::kInt8) >= layout.num_layers;
  setup.int4_fits = slabs.slots_per_slab(KvCodecType::kInt4) >= layout.num_layers;
  setup.block_tokens = layout.block_tokens;
  setup.sink_tokens = options_.sink_tokens;
  setup.recent_tokens = options_.recent_tokens;
  setup.explain = options_.explain;
  setup.quality_prices = options_.quality_prices;
  if (options_.explain) fmt::print(stderr, "kvl: explain: {}\n", setup.quality_prices.Describe());
  PageCostProfile prices;
  prices.kv_bytes = layout.kv_bytes();
  // Checkpoints of every checkpoint_every-th layer (--kv-checkpoint-every).
  prices.residual_bytes = static_cast<int64_t>(layout.block_tokens) *
                          CheckpointLayersKept(layout.num_layers, layout.checkpoint_every) *
                          options_.dim * static_cast<int64_t>(sizeof(float));
  prices.int8_page_bytes = slabs.slot_bytes(KvCodecType::kInt8) * layout.num_layers;
  prices.int4_page_bytes = slabs.slot_bytes(KvCodecType::kInt4) * layout.num_layers;
  // The rules are checked before anything is measured: a policy that cannot run fails at once.
  KVL_ASSIGN_OR_RETURN(KvPagingRules rules, MakeKvPagingRules(setup, prices));
  // Without a tier only recompute-from-tokens needs a price (to report its prediction); the other
  // policies have nothing to choose among.
  const bool needs_profile =
      ram_tier_ || disk_tier_ || redis_tier_ ||
      (!options_.policy.automatic && options_.policy.fixed == KvAction::kRecomputeTokens);
  if (needs_profile) {
    KVL_RETURN_IF_ERROR(LoadPrices(source, disk_dir, &rules.prices));
    // A page rebuilt from checkpoints every s layers also runs the layers between them.
    rules.prices.recompute_residual_ms =
        PriceCheckpointDepth(CheckpointPrices(layout, options_.dim, rules.prices),
                             layout.checkpoint_every)
            .rebuild_ms;
  }
  priced_ = needs_profile;
  prices_disk_dir_ = disk_dir;
  pager_->set_track_attention(rules.pages_running_sequences);
  CreateStore(rules.prices, source);
  planner_ = std::make_unique<KvPressurePlanner>(rules, *manager_, *pager_);
  if (options_.feedback) planner_->set_feedback(&feedback_);
  return Status::Ok();
}

Status KvMemory::Reprice(KvPriceSource* source) {
  if (!priced_) return Status::Ok();
  const KvBlockLayout& layout = storage_->layout();
  // The bytes and the actions allowed stay; LoadPrices replaces the times.
  PageCostProfile prices = rules().prices;
  KVL_RETURN_IF_ERROR(LoadPrices(source, prices_disk_dir_, &prices));
  prices.recompute_residual_ms =
      PriceCheckpointDepth(CheckpointPrices(layout, options_.dim, prices), layout.checkpoint_every)
          .rebuild_ms;
  planner_->set_prices(prices);
  if (store_) {
    // The local tiers as CreateStore prices them; a Redis tier keeps the price measured of it.
    const double bytes = static_cast<double>(prices.kv_bytes);
    auto ms = [&](double gbps, double latency_ms) {
      return latency_ms + (gbps > 0 ? bytes / (gbps * 1e6) : 0.0);
    };
    for (size_t i = 0; i < store_->tiers().size(); ++i) {
      const KvTier* tier = store_->tiers()[i].tier;
      if (tier == ram_tier_.get()) store_->set_promote_ms(i, ms(prices.ram_gbps, prices.ram_latency_ms));
      if (tier == disk_tier_.get()) {
        store_->set_promote_ms(i, ms(prices.disk_read_gbps, prices.disk_latency_ms));
      }
    }
  }
  feedback_ = BringBackFeedback(kNumFeedbackKeys);
  return Status::Ok();
}

// The KV store over every tier, fastest first, each with its price per page brought back. Off
// without the prefix cache (there is no prefix identity to file pages under).
void KvMemory::CreateStore(const PageCostProfile& prices, KvPriceSource* source) {
  const KvBlockLayout& layout = storage_->layout();
  if (!options_.prefix_cache || !KvStore::Fits(layout, pager_->layer_page_bytes())) return;
  const double bytes = static_cast<double>(prices.kv_bytes);
  auto ms = [&](double gbps, double latency_ms) {
    return latency_ms + (gbps > 0 ? bytes / (gbps * 1e6) : 0.0);
  };
  std::vector<KvStoreTier> tiers;
  // A tier is durable where it outlives the process: a persistent disk file, a Redis server.
  if (ram_tier_) {
    tiers.push_back({ram_tier_.get(), false, ms(prices.ram_gbps, prices.ram_latency_ms)});
  }
  if (disk_tier_) {
    bool persistent = true;
    for (const TierSpec& spec : options_.tiers) {
      if (spec.kind == TierKind::kDisk) persistent = spec.persistent;
    }
    tiers.push_back(
        {disk_tier_.get(), persistent, ms(prices.disk_read_gbps, prices.disk_latency_ms)});
  }
  if (redis_tier_) {
    for (const TierSpec& spec : options_.tiers) {
      if (spec.kind != TierKind::kRedis) continue;
      // The server is measured now (a profile cannot hold it: it may be another machine, and
      // another one next run); where that fails it is priced like the slowest local tier.
      const double slowest_local = std::max(ms(prices.ram_gbps, prices.ram_latency_ms),
                                            ms(prices.disk_read_gbps, prices.disk_latency_ms));
      StatusOr<double> measured =
          source != nullptr
              ? source->MeasureRemoteReadMs(spec, pager_->layer_page_bytes(), layout.num_layers)
              : StatusOr<double>(InternalError("no price source"));
      if (!measured.ok()) {
        fmt::print(stderr,
                   "kvl: the redis tier could not be measured ({}); priced at {:.3f} ms a page\n",
                   measured.status().ToString(), slowest_local);
      }
      tiers.push_back({redis_tier_.get(), true, measured.ok() ? *measured : slowest_local});
    }
  }
  if (tiers.empty()) return;
  store_ = std::make_unique<KvStore>(layout, pager_->layer_page_bytes(), std::move(tiers));
  pager_->set_store(store_.get());
}

// --kv-trace: the trace file, its header carrying the pool's size and the cost model's price of
// bringing one page back per action (as a resumed sequence's prefill pays it), so that a replay
// prices misses as the engine would.
Status KvMemory::OpenTrace() {
  if (options_.trace_path.empty()) return Status::Ok();
  if (!options_.trace_opener) {
    return InvalidArgumentError(fmt::format(
        "--kv-trace {}: this program records no traces (it was given no trace recorder)",
        options_.trace_path));
  }
  const KvPagingRules& r = rules();
  KvTraceHeader header;
  header.block_tokens = r.block_tokens;
  header.pool_blocks = manager_->num_blocks();
  header.sink_tokens = r.sink_tokens;
  header.recent_tokens = r.recent_tokens;
  KvPolicyOptions po;
  po.quality = r.quality;
  po.phase = Phase::kPrefill;
  const KvDecision d = ChooseKvAction(PageHistory{}, r.prices, po);
  for (int a = 0; a < kNumKvActions; ++a) {
    const bool available = (r.prices.available_actions >> a) & 1u;
    header.price_ms[static_cast<size_t>(a)] =
        available ? d.costs[static_cast<size_t>(a)].bring_back_ms : -1.0;
  }
  KVL_ASSIGN_OR_RETURN(trace_, options_.trace_opener(options_.trace_path, header));
  return Status::Ok();
}

Status KvMemory::CloseTrace() { return trace_ ? trace_->Close() : Status::Ok(); }

std::vector<const KvTier*> KvMemory::tiers() const {
  std::vector<const KvTier*> out;
  for (const KvTier* tier : {ram_tier_.get(), disk_tier_.get(), redis_tier_.get()}) {
    if (tier != nullptr) out.push_back(tier);
  }
  return out;
}

void KvMemory::FindInStore(std::span<const int32_t> tokens, int64_t cached_tokens,
                           KvSequencePages* sequence_pages) {
  if (!store_) return;
  const int64_t block_tokens = layout().block_tokens;
  std::vector<KvPage>& pages = sequence_pages->pages;
  const int64_t len = static_cast<int64_t>(tokens.size());
  const int64_t first = cached_tokens / block_tokens;
  int64_t last = (len - 1) / block_tokens;  // the page with the last token is computed
  // A resumed sequence brings back what its preemption kept; the store is asked for the pages
  // before the first of those.
  for (int64_t b = first; b < last && static_cast<size_t>(b) < pages.size(); ++b) {
    if (pages[static_cast<size_t>(b)].awaiting_restore) {
      last = b;
      break;
    }
  }
  if (first >= last) return;
  manager_->ContentChain(tokens, last, &content_ids_);
  // Pages still in the pool but out of the prefix index's reach (an earlier page of the chain
  // went to a tier) join the store first, so the walk through the tiers finds them.
  for (int64_t b = first; b < last; ++b) {
    const BlockId block = manager_->FindContent(content_ids_[static_cast<size_t>(b)]);
    if (block != kNoBlock) pager_->SaveBlockToStore(block, content_ids_[static_cast<size_t>(b)]);
  }
  const int64_t found =
      store_->Lookup(std::span(content_ids_).subspan(static_cast<size_t>(first)),
                     tokens.subspan(static_cast<size_t>(first * block_tokens)), &found_in_);
  const BringBackFeedback* corrections = feedback();
  for (int64_t i = 0; i < found; ++i) {
    KvTier* tier = found_in_[static_cast<size_t>(i)];
    const int64_t tier_index = store_->TierIndex(tier);
    // Named by where the page is (a zstd RAM tier is RAM too); Redis has no action of its own.
    const KvAction action =
        tier->kind() == TierKind::kRam ? KvAction::kDemoteRam : KvAction::kDemoteDisk;
    const BringBackPrice promote =
        CorrectedPrice(corrections, FeedbackKey(action, tier),
                       store_->tiers()[static_cast<size_t>(tier_index)].promote_ms);
    const BringBackPrice recompute =
        CorrectedPrice(corrections, static_cast<size_t>(KvAction::kRecomputeTokens),
                       RecomputeTokensMs(rules().prices, (first + i) * block_tokens));
    // The cheapest way back: a tier slower than recomputing the page from its tokens is not used
    // (nor anything after it: the pages after a recomputed one are computed with it).
    if (promote.predicted_ms >= recompute.predicted_ms) break;
    const size_t b = static_cast<size_t>(first + i);
    if (pages.size() <= b) pages.resize(b + 1);
    KvPage& page = pages[b];
    page.fate = KvPageFate::kInTier;
    page.action = action;
    page.predicted_ms = promote.predicted_ms;
    page.model_ms = promote.model_ms;
    page.tier = tier;
    page.content = content_ids_[b];
    page.awaiting_restore = true;
    // Held until it is promoted: the tier must not evict it for another page meanwhile.
    store_->Pin(tier, page.content);
    page.store_pin = true;
  }
}

void KvMemory::CommitStep(const KvPlan& plan) {
  for (const KvPlan::SeqPlan& sp : plan.seqs) {
    for (BlockId block : sp.allocated) {
      if (trace_) trace_->LeaveReused(manager_->FreeBlockContent(block));
      pager_->SpillFreeBlock(block);
    }
    if (sp.cow_dst != kNoBlock) {
      if (trace_) trace_->LeaveReused(manager_->FreeBlockContent(sp.cow_dst));
      pager_->SpillFreeBlock(sp.cow_dst);
    }
  }
  manager_->Commit(plan);
  for (const KvBlockCopy& copy : plan.copies) storage_->CopyBlock(copy.src, copy.dst);
}

int64_t KvMemory::InPlaceBlocks(const KvSequencePages& sequence_pages, int64_t len,
                                int64_t from, int64_t* streamed) const {
  *streamed = 0;
  const int64_t block_tokens = layout().block_tokens;
  if (from % block_tokens != 0) return 0;
  const std::vector<KvPage>& pages = sequence_pages.pages;
  // A prompt the pool cannot hold: its store pages on a disk tier stay where they lie and are
  // streamed like a demoted page, each layer's reads in flight on the tier's worker while the
  // layer before computes, from the prefill's first step on. Promoted instead, they would all be
  // read before the prefill starts and most of them demoted again, written back, as it fills
  // the pool. The staging for streamed pages bounds how many.
  const int64_t prompt_blocks = (len - from + block_tokens - 1) / block_tokens;
  const int64_t pool_blocks = manager_->stats().blocks_free - from / block_tokens;
  int64_t stream_room = 0;
  if (prompt_blocks > pool_blocks) {
    stream_room = pager_->staging_capacity_pages() - pager_->staged_pages_held() -
                  stream_pages_promised_;
  }
  int64_t blocks = 0;
  for (size_t b = static_cast<size_t>(from / block_tokens); b < pages.size(); ++b) {
    const KvPage& page = pages[b];
    if (!page.awaiting_restore || !page.content.valid() || !page.store_pin ||
        page.fate != KvPageFate::kInTier || from + (blocks + 1) * block_tokens > len - 1) {
      break;
    }
    if (!page.tier->reads_in_place()) {
      if (page.tier->kind() != TierKind::kDisk || *streamed >= stream_room) break;
      ++*streamed;
    }
    ++blocks;
  }
  return blocks;
}

int64_t KvMemory::RestorableTokens(const KvSequencePages& sequence_pages, int64_t len, int64_t from,
                                   int64_t cap) const {
  const int64_t block_tokens = layout().block_tokens;
  if (from % block_tokens != 0) return 0;
  const std::vector<KvPage>& pages = sequence_pages.pages;
  int64_t restore = 0;
  for (size_t b = static_cast<size_t>(from / block_tokens); b < pages.size(); ++b) {
    if (!pages[b].awaiting_restore || from + restore + block_tokens > len - 1 ||
        restore + block_tokens > cap) {
      break;
    }
    restore += block_tokens;
  }
  return restore;
}

bool KvMemory::HoldsPagesOutsidePool() const {
  const KvPagerStats pages = pager_->stats();
  return pages.streamed_pages + pages.rebuilt_pages > 0;
}

KvAdmission KvMemory::PlanAdmission(std::span<const int32_t> tokens, KvSequencePages* pages,
                                    bool ask_store, int64_t restore_cap) {
  KvAdmission a;
  const int64_t len = static_cast<int64_t>(tokens.size());
  a.cached_tokens = manager_->MatchPrefix(tokens);
  if (ask_store) FindInStore(tokens, a.cached_tokens, pages);
  int64_t streamed = 0;
  a.in_place_blocks = InPlaceBlocks(*pages, len, a.cached_tokens, &streamed);
  stream_pages_promised_ += streamed;
  a.restore_tokens = RestorableTokens(
      *pages, len, a.cached_tokens + a.in_place_blocks * layout().block_tokens, restore_cap);
  return a;
}

void KvMemory::Apply(const KvPlan& plan, std::span<const KvStepSeq> seqs, KvApplied* out) {
  KVL_CHECK_MSG(seqs.size() == plan.seqs.size(), "one KvStepSeq per sequence of the plan");
  CommitStep(plan);
  out->Clear();
  const int64_t block_tokens = layout().block_tokens;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const KvPlan::SeqPlan& sp = plan.seqs[i];
    const KvStepSeq& seq = seqs[i];
    int64_t computed = sp.admit ? sp.num_cached_tokens : sp.first_new_pos;
    if (sp.admit) {
      pager_->StartSequence(sp.seq, seq.pages);
      if (window_) window_->StartSequence(sp.seq);  // the slot's new occupant holds no rows yet
      // Pages dropped at the preemption are recomputed from their tokens, by this step and the
      // prefill chunks after it: each priced as the step that computes it will be measured.
      for (size_t b = 0; b < seq.pages->pages.size(); ++b) {
        const KvPage& page = seq.pages->pages[b];
        if (page.fate != KvPageFate::kDropped) continue;
        out->recomputed.push_back(
            {seq.request, static_cast<int64_t>(b),
             CorrectedPrice(feedback(), static_cast<size_t>(KvAction::kRecomputeTokens),
                            page.model_ms)});
      }
      if (sp.in_place_blocks > 0) {
        // Store pages read where the RAM tier holds them, or streamed from the disk tier where
        // they lie: part of the sequence, never copied into the pool.
        const int64_t first = computed / block_tokens;
        pager_->ReadInPlace(sp.seq, first, sp.in_place_blocks);
        computed += sp.in_place_blocks * block_tokens;
        // Counted per tier: a RAM tier's pages, then a disk tier's.
        for (int64_t b = first; store_ && b < first + sp.in_place_blocks; ++b) {
          store_->CountInPlace(seq.pages->pages[static_cast<size_t>(b)].tier, 1);
        }
      }
    }
    int64_t restored = 0;
    if (sp.restore_tokens > 0) {
      restored = RestorePages(sp.seq, seq, computed / block_tokens,
                              sp.restore_tokens / block_tokens, out) *
                 block_tokens;
      computed += restored;
    }
    // Pages restored, or computed where a restore stopped or the prefix cache held them, are let
    // go from their tier at once: a page awaiting restore is never also in the pool.
    pager_->SettleRestoredPages(sp.seq);
    out->computed_from.push_back(computed);
    out->restored_tokens.push_back(restored);
  }
  if (trace_) TraceReads(plan, seqs, *out);
}

int64_t KvMemory::RestorePages(SeqId slot, const KvStepSeq& seq, int64_t first_block, int64_t count,
                               KvApplied* out) {
  // The bring-back time checked is the one expected as the page comes back: the price the model
  // gave when the page left, corrected by what restores measured since (a sequence preempted
  // early was priced before anything had been measured).
  for (int64_t b = first_block; b < first_block + count; ++b) {
    KvPage& page = seq.pages->pages[static_cast<size_t>(b)];
    page.predicted_ms =
        CorrectedPrice(feedback(), FeedbackKey(page.action, page.tier), page.model_ms).predicted_ms;
  }
  // Each page is timed on its own: one restore may read pages of several tiers.
  const int64_t restored = pager_->RestorePages(slot, first_block, count, &restore_page_ms_);
  if (restored < count) out->read_failures.push_back(count - restored);
  for (int64_t b = first_block; b < first_block + restored; ++b) {
    const KvPage& page = seq.pages->pages[static_cast<size_t>(b)];
    const double page_ms = restore_page_ms_[static_cast<size_t>(b - first_block)];
    // A store page found by the admission's lookup: one of the tier's hits, promoted.
    int64_t store_tier = -1;
    if (page.content.valid() && store_) {
      store_->CountPromoted(page.tier, 1, page.predicted_ms, page_ms);
      store_tier = store_->TierIndex(page.tier);
    }
    CountBroughtBack(seq.request, b, page, page_ms, store_tier, out);
  }
  restored_.FeedTo(feedback());
  return restored;
}

void KvMemory::CountBroughtBack(int64_t request, int64_t block, const KvPage& page,
                                double measured_ms, int64_t store_tier, KvApplied* out) {
  if (trace_) {
    trace_->Back(request, block, static_cast<int>(page.action), page.predicted_ms, measured_ms);
  }
  restored_.Add(FeedbackKey(page.action, page.tier), page.model_ms, measured_ms);
  out->brought_back.push_back({page.action, page.predicted_ms, measured_ms, store_tier});
}

void KvMemory::TraceReads(const KvPlan& plan, std::span<const KvStepSeq> seqs,
                          const KvApplied& applied) {
  const int64_t block_tokens = layout().block_tokens;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqId slot = plan.seqs[i].seq;
    if (!manager_->Contains(slot)) continue;
    const int64_t full_blocks = manager_->num_tokens(slot) / block_tokens;
    trace_contents_.clear();
    trace_outside_.clear();
    trace_evicted_.clear();
    for (int64_t b = 0; b < full_blocks; ++b) {
      trace_contents_.push_back(manager_->ContentOf(slot, b));
      switch (pager_->FateOf(slot, b)) {
        case KvPageFate::kInTier:
        case KvPageFate::kCheckpointed:
          trace_outside_.push_back(b);  // streamed, read in place, or rebuilt
          break;
        case KvPageFate::kEvicted:
          trace_evicted_.push_back(b);
          break;
        default:
          break;  // in the pool, compressed or not
      }
    }
    trace_->Read(seqs[i].request, trace_contents_, applied.computed_from[i] / block_tokens,
                 trace_outside_, trace_evicted_, seqs[i].steps_left);
  }
}

int64_t KvMemory::RestoreWindow(SeqId slot, int64_t n) {
  if (!window_ || window_->HoldsWindow(slot, n)) return n;
  KvWindowRebuildPrices prices;
  prices.residual_page_ms = rules().prices.recompute_residual_ms;
  prices.tokens_page_ms = rules().prices.recompute_tokens_ms;
  prices.block_tokens = layout().block_tokens;
  prices.num_layers = layout().num_layers;
  const bool residuals = rebuilder_ != nullptr &&
                         window_->ResidualsCover(*manager_, *storage_, slot, n);
  if (window_->ChooseWindowRebuild(n, residuals, prices) == KvWindowRebuild::kFromResiduals) {
    window_->RebuildFromResiduals(*manager_, *storage_, *rebuilder_, slot, n);
    return n;
  }
  const int64_t from = window_->RebuildStart(n);
  window_->CountTokenRebuild(n - from);
  return from;
}

void KvMemory::ClaimWindowRows(SeqId slot, int64_t begin, int64_t end) {
  if (window_) window_->ClaimRun(slot, begin, end);
}

void KvMemory::BeginForward(std::span<const SeqId> slots) { pager_->BeginStep(slots); }

std::span<const SeqId> KvMemory::EndForward() { return pager_->EndStep(); }

void KvMemory::DiscardWrites(SeqId slot, int64_t first_block) {
  manager_->DropIdentity(slot, first_block);
}

void KvMemory::FileUnreachablePages(SeqId slot, int64_t first_block) {
  if (!store_ || !manager_->Contains(slot) || !manager_->IsPaged(slot)) {
    return;  // a sequence with no page outside the pool is all within the index's reach
  }
  const int64_t block_tokens = layout().block_tokens;
  const int64_t full = manager_->num_tokens(slot) / block_tokens;
  if (full <= first_block) return;
  // The blocks the pool's prefix index reaches (at most all but the last token's).
  const std::vector<int32_t>& tokens = manager_->tokens(slot);
  const int64_t reachable =
      manager_->MatchPrefix(std::span(tokens).first(static_cast<size_t>(
          std::min<int64_t>(static_cast<int64_t>(tokens.size()), full * block_tokens + 1)))) /
      block_tokens;
  pager_->SaveUnreachablePages(slot, std::max(first_block, reachable), full);
}

void KvMemory::TruncateTail(SeqId slot, int64_t tokens) {
  if (manager_->Contains(slot)) manager_->TruncateTail(slot, tokens);
}

void KvMemory::PlanRelief(std::span<const KvPlannedSeq> running, int64_t blocks_short, Phase phase,
                          KvPagePlan* plan) {
  planner_->PlanRelief(running, blocks_short, phase, plan);
  plan->kind = KvPagePlanKind::kRelief;
  NameOwners(running, plan);
}

void KvMemory::PlanCompressedEviction(std::span<const KvPlannedSeq> running, int64_t blocks_short,
                                      KvPagePlan* plan) {
  planner_->PlanCompressedEviction(running, blocks_short, plan);
  plan->kind = KvPagePlanKind::kCompressedEviction;
  NameOwners(running, plan);
}

void KvMemory::PlanPreemption(const KvPlannedSeq& seq, int64_t num_computed, Phase phase,
                              KvPagePlan* plan) {
  planner_->PlanPreemption(seq, num_computed, phase, plan);
  plan->kind = KvPagePlanKind::kPreemption;
  plan->preempted = seq.slot;
  NameOwners(std::span(&seq, 1), plan);
}

void KvMemory::PlanPromotion(std::span<const KvPlannedSeq> running, int64_t blocks_to_spare,
                             int64_t max_pages, KvPagePlan* plan) {
  planner_->PlanPromotion(running, blocks_to_spare, max_pages, plan);
  plan->kind = KvPagePlanKind::kPromotion;
  NameOwners(running, plan);
}

void KvMemory::NameOwners(std::span<const KvPlannedSeq> seqs, KvPagePlan* plan) {
  for (KvPageAction& a : plan->actions) {
    for (const KvPlannedSeq& s : seqs) {
      if (s.slot == a.seq) a.request = s.request_id;
    }
  }
}

int64_t KvMemory::Apply(KvPagePlan& plan, KvApplied* out) {
  if (out != nullptr) out->Clear();
  int64_t applied = 0;
  switch (plan.kind) {
    case KvPagePlanKind::kRelief:
    case KvPagePlanKind::kCompressedEviction:
      applied = pager_->Apply(plan);
      // Planned again, a failed page takes another action.
      if (plan.kind == KvPagePlanKind::kRelief) planner_->NoteFailedActions(plan);
      if (trace_) TraceLeaving(plan);
      if (plan.kind == KvPagePlanKind::kCompressedEviction && rules().explain) {
        for (const KvPageAction& a : plan.actions) {
          if (!a.applied) continue;
          fmt::print(stderr,
                     "kvl: explain: request {} compressed page {} -> evict (the pool holds only "
                     "compressed pages)\n",
                     a.request, a.block_index);
        }
      }
      break;
    case KvPagePlanKind::kPreemption:
      pager_->Preempt(plan.preempted, plan);
      planner_->NoteFailedActions(plan);
      for (const KvPageAction& a : plan.actions) applied += a.applied ? 1 : 0;
      if (trace_) TraceLeaving(plan);
      manager_->Free(plan.preempted, /*resumes=*/true);  // its blocks are read at its resume
      break;
    case KvPagePlanKind::kPromotion: {
      if (plan.actions.empty()) break;
      // The pager makes each page resident: what it was (its tier, its prices) is kept for the
      // count.
      promoting_.clear();
      for (const KvPageAction& a : plan.actions) {
        promoting_.push_back(pager_->pages(a.seq).pages[static_cast<size_t>(a.block_index)]);
        promoting_.back().predicted_ms = a.predicted_ms;  // corrected as it is brought back
      }
      applied = pager_->PromoteBack(plan);
      for (size_t i = 0; i < plan.actions.size(); ++i) {
        const KvPageAction& a = plan.actions[i];
        // A failed read leaves the page in its tier: nothing is recomputed.
        if (a.failed && out != nullptr) out->read_failures.push_back(0);
        if (!a.applied || out == nullptr) continue;
        CountBroughtBack(a.request, a.block_index, promoting_[i], a.measured_ms, -1, out);
      }
      restored_.FeedTo(feedback());
      break;
    }
  }
  return applied;
}

void KvMemory::TraceLeaving(const KvPagePlan& plan) {
  const bool preempted = plan.kind == KvPagePlanKind::kPreemption;
  for (const KvPageAction& a : plan.actions) {
    if (!preempted && !a.applied) continue;
    // A preempted page another sequence shares stays in the pool for that one.
    const std::vector<BlockId>& table = manager_->block_table(a.seq);
    const size_t b = static_cast<size_t>(a.block_index);
    if (b < table.size() && table[b] != kNoBlock && manager_->refcount(table[b]) > 1) continue;
    trace_->Leave(a.request, a.block_index,
                  static_cast<int>(a.applied ? a.action : KvAction::kRecomputeTokens),
                  preempted ? KvTraceCause::kPreempt : KvTraceCause::kRelief, a.predicted_ms);
  }
}

void KvMemory::Continue(SeqId slot, int64_t tokens, KvSequencePages* pages) {
  if (tokens < manager_->num_tokens(slot)) {
    manager_->Truncate(slot, tokens);
    pager_->Truncate(slot, tokens / layout().block_tokens);
  }
  pager_->Rebind(slot, pages);
}

void KvMemory::ReleaseWaiting(KvSequencePages& pages) { pager_->ForgetPreemptedPages(pages); }

void KvMemory::NoteStep() {
  if (trace_) trace_->Step();
}

double KvMemory::TokenRecomputeMs(int64_t position) const {
  return RecomputeTokenMs(rules().prices, position);
}

KvInStepRebuilds KvMemory::InStepRebuilds() const {
  KvInStepRebuilds r;
  const PageCostProfile& prices = rules().prices;
  const double correction = InStepRebuildCorrection(corrections());
  for (SeqId seq : pager_->RebuiltInStep()) {
    const double model_ms = InStepRebuildMs(prices, manager_->num_tokens(seq));
    if (model_ms < 0) continue;
    ++r.pages;
    r.model_ms += model_ms;
    r.predicted_ms += model_ms * correction;
  }
  return r;
}

double KvMemory::PlainDecodeStepMs(std::span<const int64_t> contexts) const {
  const DecodeIdleCurve& curve = rules().prices.decode_idle;
  if (contexts.empty() || curve.num_points == 0) return 0;
  const int64_t deepest = *std::max_element(contexts.begin(), contexts.end());
  double ms = curve.PointAt(deepest).step_ms;
  bool deepest_counted = false;
  for (int64_t context : contexts) {
    if (context == deepest && !deepest_counted) {
      deepest_counted = true;
      continue;
    }
    ms += curve.PointAt(context).batch_ms_per_token;
  }
  return ms;
}

void KvMemory::FeedBack(BringBackBatch& batch) { batch.FeedTo(feedback()); }

std::string KvMemory::WhyTooBig(bool prompt_only, int64_t tokens) const {
  // What the budget holds, and why the pages that could have left the pool did not.
  const int64_t block_tokens = layout().block_tokens;
  std::string holds = fmt::format("{} blocks of {} tokens", num_blocks(), block_tokens);
  const KvPagerStats pages = pager_->stats();
  if (pages.staging_bytes > 0) {
    holds += fmt::format(" in the pool, and {:.1f} KiB of buffers for pages leaving it",
                         static_cast<double>(pages.staging_bytes) / 1024.0);
    if (pager_->staging_capacity_pages() > 0) {
      holds +=
          fmt::format(" ({} pages streamed from tiers at once)", pager_->staging_capacity_pages());
    }
  }
  std::string hint;
  if (!prompt_only && !rules().pages_running_sequences) {
    hint =
        ", or let its pages move: --kv-policy auto with --kv-tier ram:SIZE (lossless) or "
        "with --kv-quality balanced";
  } else if (!prompt_only && pager_->staging_capacity_pages() > 0 &&
             pager_->staged_pages_held() >= pager_->staging_capacity_pages()) {
    hint = fmt::format(
        "; its {} pages streamed from tiers fill the staging reserved for them (raise "
        "--kv-stream-reserve, or let pages be compressed: --kv-quality balanced)",
        pager_->staged_pages_held());
  } else if (!prompt_only) {
    hint =
        "; the attention sinks, the recent window and the page being written stay in the "
        "pool (--kv-sink, --kv-recent)";
  }
  if (!pager_->last_tier_error().ok()) {
    hint += "; the last page that could not go to a tier: " + pager_->last_tier_error().message();
  }
  return fmt::format("the KV budget ({}) cannot hold {} of {} tokens; raise --kv-budget{}", holds,
                     prompt_only ? "a prompt" : "a sequence", tokens, hint);
}

void KvMemory::Release(SeqId slot) {
  if (!manager_->Contains(slot)) return;
  if (store_) {
    for (const KvStoreTier& t : store_->tiers()) {
      if (t.durable) pager_->SaveToStore(slot, t.tier);
    }
  }
  pager_->DropSequence(slot);
  manager_->Free(slot);
}

void KvMemory::PublishStoreStats() {
  if (!store_) return;
  std::lock_guard<std::mutex> lock(store_stats_mutex_);
  store_stats_.resize(store_->tiers().size());
  for (size_t t = 0; t < store_stats_.size(); ++t) store_stats_[t] = store_->stats(t);
}

std::vector<KvStoreTierStats> KvMemory::StoreStats() const {
  std::lock_guard<std::mutex> lock(store_stats_mutex_);
  return store_stats_;
}

int64_t KvMemory::StoreTierIndex(const KvTier* tier) const {
  return store_ ? store_->TierIndex(tier) : -1;
}

}  // namespace kvl
