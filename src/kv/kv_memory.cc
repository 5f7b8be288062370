// KvMemory's creation: the pool sized from the budget, the checkpoint spacing, the tiers, the
// prices, the KV store and the planner, each decided once here (kvl/kv_memory.h).
#include "kvl/kv_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "kv_budget_split.h"
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
// `pool_side_bytes`: what the budget leaves the pool, its staging and rings (SplitKvBudget).
KvPoolSizing SizeKvPool(const KvMemoryOptions& o, const KvBlockLayout& layout,
                        int64_t pool_side_bytes, int64_t ring_bytes) {
  KvPoolSizing z;
  z.budget_bytes = pool_side_bytes;
  const KvStagingCost staging = KvPager::StagingCost(layout);
  z.compresses =
      o.quality != KvQuality::kLossless || (!o.policy.automatic && !IsLossless(o.policy.fixed));
  const bool has_ram = HasTier(o, TierKind::kRam);
  const bool streams = o.policy.automatic ? has_ram || HasTier(o, TierKind::kDisk) ||
                                                HasTier(o, TierKind::kRedis)
                                          : o.policy.fixed == KvAction::kDemoteRam ||
                                                o.policy.fixed == KvAction::kDemoteDisk ||
                                                o.policy.fixed == KvAction::kDemoteRedis ||
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

// The default budget's pool side: room for every sequence's whole context, within
// kDefaultKvBudgetBytes: a longer context pages (or is refused with the budget named), it never
// reserves memory for what it may use.
int64_t DefaultPoolSideBytes(const KvMemoryOptions& o, const KvBlockLayout& layout,
                             int64_t ring_bytes) {
  const int64_t per_context =
      layout.block_bytes() * ((o.context_length + o.block_tokens - 1) / o.block_tokens);
  return std::min<int64_t>(per_context * o.max_seqs + ring_bytes, kDefaultKvBudgetBytes);
}

const TierSpec* FindRamTier(const KvMemoryOptions& o) {
  for (const TierSpec& spec : o.tiers) {
    if (spec.kind == TierKind::kRam) return &spec;
  }
  return nullptr;
}

// The one budget (kvl/kv_budget.h): the draft model's pool and a RAM tier (its pages, of
// *ram_capacity bytes, and its map of them) come out of it first, and the pool, its staging and
// rings get the rest (*pool_side_bytes; the split's pool, staging and ring figures are the
// caller's). Without --kv-budget, and with neither, the pool gets the
// default as before; with either, they come out of kDefaultKvBudgetBytes and the pool gets what
// is left, at most the default. A disk tier's index is named, not carved (index_bytes).
StatusOr<KvBudgetSplit> SplitKvBudget(const KvMemoryOptions& o, const KvBlockLayout& layout,
                                      int64_t ring_bytes, int64_t* pool_side_bytes,
                                      int64_t* ram_capacity) {
  KvBudgetSplit s;
  *ram_capacity = 0;
  s.given = o.budget_bytes > 0;
  s.draft_bytes = o.draft_pool_bytes;
  const int64_t layer_page = layout.layer_k_bytes() + layout.layer_v_bytes();
  s.index_bytes = kv_internal::TierIndexBytes(o.tiers, layer_page);
  const int64_t carved = s.draft_bytes;  // the index is counted beside (KvBudgetSplit)
  const TierSpec* ram = FindRamTier(o);
  // The least pool side that holds one block beside its staging and rings.
  const int64_t block = layout.block_bytes();
  const int64_t pool_min =
      SizeKvPool(o, layout, ring_bytes + block, ring_bytes).staging_bytes + ring_bytes + block;
  const int64_t default_side = DefaultPoolSideBytes(o, layout, ring_bytes);
  if (o.pool_blocks > 0) {
    // A pool sized by hand: the budget is what its parts add up to; ram:auto matches the pool.
    const KvStagingCost staging = KvPager::StagingCost(layout);
    *pool_side_bytes = o.pool_blocks * block + ring_bytes + staging.fixed + staging.restore +
                       o.staged_pages * staging.per_page;
    if (ram != nullptr) {
      s.ram_tier_auto = ram->capacity_bytes == 0;
      *ram_capacity = s.ram_tier_auto
                          ? kv_internal::RamTierCapacityIn(*pool_side_bytes, layer_page)
                          : ram->capacity_bytes;
      s.ram_tier_bytes = kv_internal::RamTierDramBytes(*ram_capacity, layer_page);
    }
    s.budget_bytes = *pool_side_bytes + s.ram_tier_bytes + carved;
    return s;
  }
  s.budget_bytes = s.given                              ? o.budget_bytes
                   : (ram == nullptr && carved == 0) ? default_side
                                                     : kDefaultKvBudgetBytes;
  int64_t shared = s.budget_bytes - carved;  // the pool side and the RAM tier
  if (ram != nullptr && ram->capacity_bytes == 0) {
    s.ram_tier_auto = true;
    // The default budget splits what every context needs, not its cap.
    if (!s.given) shared = std::min(shared, default_side);
    // The pool keeps each running sequence's sinks, recent window and the page it writes.
    const int64_t pinned_blocks =
        o.max_seqs * ((o.sink_tokens + o.recent_tokens + o.block_tokens - 1) / o.block_tokens + 1);
    *ram_capacity = kv_internal::RamTierCapacityIn(
        kv_internal::AutoRamTierBytes(
            shared, std::max(pool_min, pool_min - block + pinned_blocks * block)),
        layer_page);
  } else if (ram != nullptr) {
    *ram_capacity = ram->capacity_bytes;
  }
  // The tier's DRAM: its pages and its map of them.
  s.ram_tier_bytes = kv_internal::RamTierDramBytes(*ram_capacity, layer_page);
  if (shared - s.ram_tier_bytes < pool_min) {
    if (ram != nullptr && s.ram_tier_bytes > 0) {
      return kv_internal::RamTierDoesNotFit(s, *ram_capacity, pool_min, block);
    }
    if (carved > 0) return kv_internal::CarvedPartsDoNotFit(s, pool_min);
  }
  *pool_side_bytes = shared - s.ram_tier_bytes;
  if (!s.given) {
    *pool_side_bytes = std::min(*pool_side_bytes, default_side);
    s.budget_bytes = *pool_side_bytes + s.ram_tier_bytes + carved;
  }
  return s;
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

int64_t KvMemory::HeldBytes() const {
  const KvBudgetSplit& s = budget_split_;
  int64_t held = s.pool_bytes + s.staging_bytes + s.ring_bytes + s.draft_bytes;
  if (ram_tier_) {
    const TierStats ram = ram_tier_->stats();
    held += ram.bytes_used + ram.pages * kv_internal::kRamTierBytesPerPage;
  }
  if (disk_tier_) held += disk_tier_->stats().pages * kv_internal::kDiskIndexBytesPerSlot;
  return held;
}

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
  kvo.block_observer = o.block_observer;
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
  int64_t pool_side = 0, ram_capacity = 0;
  KVL_ASSIGN_OR_RETURN(budget_split_,
                       SplitKvBudget(o, kvo.layout, ring_bytes, &pool_side, &ram_capacity));
  for (TierSpec& spec : options_.tiers) {
    if (spec.kind == TierKind::kRam) spec.capacity_bytes = ram_capacity;
  }
  KvPoolSizing z = SizeKvPool(o, kvo.layout, pool_side, ring_bytes);
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
    z = SizeKvPool(o, kvo.layout, pool_side, ring_bytes);
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
  budget_split_.pool_bytes = manager_->num_blocks() * kvo.layout.block_bytes();
  budget_split_.staging_bytes = z.staging_bytes - ring_bytes;
  budget_split_.ring_bytes = ring_bytes;
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
  pager_->set_tiers({ram_tier_.get(), disk_tier_.get(), redis_tier_.get()});

  const KvBlockLayout& layout = storage_->layout();
  const CompressedSlabs& slabs = pager_->slabs();
  KvPagingSetup setup;
  setup.policy = options_.policy;
  setup.quality = options_.quality;
  setup.has_ram_tier = ram_tier_ != nullptr;
  setup.has_disk_tier = disk_tier_ != nullptr;
  setup.has_redis_tier = redis_tier_ != nullptr;
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
    if (redis_tier_) PriceRedisTier(source, &rules.prices);
  }
  priced_ = needs_profile;
  prices_disk_dir_ = disk_dir;
  pager_->set_track_attention(rules.pages_running_sequences);
  CreateStore(rules.prices);
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

// The Redis server is measured now, through whatever link reaches it (a profile cannot hold it:
// it may be another machine, and another one next run): its page read and write prices for
// demote-redis and the KV store. Where that fails, the tier stays unpriced (bandwidth 0): `auto`
// never demotes to it, a fixed demote-redis still does, and the store prices it like the slowest
// local tier.
void KvMemory::PriceRedisTier(KvPriceSource* source, PageCostProfile* prices) {
  for (const TierSpec& spec : options_.tiers) {
    if (spec.kind != TierKind::kRedis) continue;
    const Status measured = source->PriceRemoteTier(spec, pager_->layer_page_bytes(),
                                                    storage_->layout().num_layers, prices);
    if (!measured.ok()) {
      fmt::print(stderr, "kvl: the redis tier could not be measured ({}); auto will not demote to it\n",
                 measured.ToString());
      prices->redis_read_gbps = 0;
    }
  }
}

// The KV store over every tier, fastest first, each with its price per page brought back. Off
// without the prefix cache (there is no prefix identity to file pages under).
void KvMemory::CreateStore(const PageCostProfile& prices) {
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
    // Measured at creation (PriceRedisTier); where that failed, priced like the slowest local
    // tier.
    const double slowest_local = std::max(ms(prices.ram_gbps, prices.ram_latency_ms),
                                          ms(prices.disk_read_gbps, prices.disk_latency_ms));
    tiers.push_back({redis_tier_.get(), true,
                     prices.redis_read_gbps > 0
                         ? TransferMs(bytes, prices.redis_read_gbps, prices.redis_latency_ms)
                         : slowest_local});
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

}  // namespace kvl
