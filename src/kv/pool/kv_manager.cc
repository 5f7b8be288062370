// KvManager: plan and commit over the block pool, the prefix index and the block tables.
#include "kvl/kv_manager.h"

#include <fmt/format.h>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack: no allocation per block
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "block_hash.h"
#include "kv_manager_state.h"
#include "kvl/kv_block_observer.h"

namespace kvl {
namespace {

// An epoch no plan has (plan epochs count from 1 up): TakeOrder outside a plan skips no block.
constexpr uint64_t kNoPlanEpoch = std::numeric_limits<uint64_t>::max();
// A preempted sequence that has waited this many times the longest it may take to come back is
// taken for cancelled: its blocks are judged as a finished request's. A named default, not a
// measurement. A resume comes once running sequences free blocks, so a wait is bounded by how
// long sequences run: the longest wait for a resume seen, the longest a finished sequence ran,
// or the default pause before either.
constexpr double kResumeWaitLimit = 4;

}  // namespace

using kv_internal::BlockMeta;
using kv_internal::BlockRef;
using kv_internal::IdleKind;
using kv_internal::SeqState;

KvContentId ChainContentId(KvContentId parent, std::span<const int32_t> tokens,
                           uint64_t model_identity) {
  XXH3_state_t state;
  XXH3_128bits_reset_withSeed(&state, model_identity);
  XXH3_128bits_update(&state, &parent, sizeof(parent));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  KvContentId id{h.low64, h.high64};
  if (!id.valid()) id.lo = 1;  // {0, 0} means "no identity"
  return id;
}

KvManager::State::State(const KvManagerOptions& opts, int32_t num_blocks)
    : options(opts),
      block_tokens(opts.layout.block_tokens),
      pool(num_blocks),
      meta(static_cast<size_t>(num_blocks)),
      block_token_ids(static_cast<size_t>(num_blocks) * opts.layout.block_tokens, 0),
      index(num_blocks),
      content_index(num_blocks),
      raw(static_cast<size_t>(num_blocks), 0),
      seqs(static_cast<size_t>(opts.max_seqs)),
      block_plan_mark(static_cast<size_t>(num_blocks), 0),
      seq_plan_mark(static_cast<size_t>(opts.max_seqs), 0) {
  idle_candidates.reserve(static_cast<size_t>(num_blocks));
  candidate_of_block.assign(static_cast<size_t>(num_blocks), -1);
  take_order.reserve(static_cast<size_t>(num_blocks));
}

uint64_t KvManager::State::Hash(uint64_t parent_hash, std::span<const int32_t> tokens) const {
  if (options.block_hash_for_testing != nullptr) {
    return options.block_hash_for_testing(parent_hash, tokens);
  }
  return kv_internal::DefaultBlockHash(parent_hash, tokens);
}

size_t KvManager::State::MatchBlocks(std::span<const int32_t> tokens,
                                     std::vector<BlockId>* blocks) const {
  if (blocks != nullptr) blocks->clear();
  if (!options.enable_prefix_cache || tokens.empty()) return 0;
  // The last token is always computed, so at most tokens.size() - 1 tokens can be reused.
  const size_t max_blocks = (tokens.size() - 1) / static_cast<size_t>(block_tokens);
  uint64_t parent_hash = options.model_identity;
  BlockRef parent;
  size_t k = 0;
  for (; k < max_blocks; ++k) {
    const std::span<const int32_t> block_tokens_k = tokens.subspan(k * block_tokens, block_tokens);
    const uint64_t hash = Hash(parent_hash, block_tokens_k);
    const BlockId block = index.Find(hash);
    if (block == kNoBlock) break;
    const BlockMeta& m = meta[block];
    // The hash only names a candidate: the same parent instance and the same token ids make the
    // block's prefix exactly ours, whatever collisions the hash has.
    if (m.parent != parent || m.parent_hash != parent_hash ||
        !std::equal(block_tokens_k.begin(), block_tokens_k.end(), BlockTokens(block).begin())) {
      break;
    }
    if (blocks != nullptr) blocks->push_back(block);
    parent = RefOf(block);
    parent_hash = hash;
  }
  return k;
}

// Mutations of the state that keep the refcounts, the free list, the index and num_cached in
// step. Every operation that changes the pool goes through them.
void KvManager::State::RefBlock(BlockId block, bool by_conversation) {
  if (pool.refcount(block) > 0) {
    pool.Ref(block);
    if (meta[block].full) ++meta[block].shared_reads;
    return;
  }
  pool.Acquire(block);  // a cached block revived by a prefix hit
  BlockMeta& m = meta[block];
  if (m.indexed) {
    --num_cached;
    if (by_conversation && m.idle_kind == IdleKind::kOther) {
      // A finished request's page that a conversation's next turn read: its pause was the
      // time its user took to answer, and belongs to the conversations' history.
      history(IdleKind::kOther).ForgetIdlePage(m.idle_since);
      history(IdleKind::kConversation).PageWentIdle(m.idle_since);
      m.idle_kind = IdleKind::kConversation;
    }
    history(m.idle_kind).PageRevived(m.idle_since, clock);
    if (m.idle_kind != IdleKind::kResumes) {
      // A resume is its own sequence coming back, not a reuse: the page's record is of reuses.
      ++m.revivals;
      m.revival_gap_steps += clock - m.idle_since;
    }
  }
}

void KvManager::State::UnrefBlock(BlockId block) {
  // Blocks nobody holds go to the front (reused first) unless they hold a cached prefix; those go
  // to the back (least recently freed last), and become idle pages of the reuse forecast.
  BlockMeta& m = meta[block];
  const bool cached = m.indexed;
  if (pool.Unref(block, /*keep_longer=*/cached) && cached) {
    ++num_cached;
    m.idle_since = clock;
    m.idle_kind = freeing_kind;
    if (m.idle_kind != IdleKind::kResumes) ++m.idle_periods;
    history(m.idle_kind).PageWentIdle(clock);
  }
}

KvReuseForecast KvManager::State::IdleForecast(BlockId block) const {
  const BlockMeta& m = meta[block];
  KvReuseInput in;
  in.step = clock;
  in.idle_steps = clock - m.idle_since;
  in.idle_periods = m.idle_periods;
  in.revivals = m.revivals;
  in.revival_gap_steps = m.revival_gap_steps;
  in.shared_reads = m.shared_reads;
  in.order_in_step = m.chain_index;
  if (IsStale(block)) {
    // Its parent's block holds something else now: no prefix walk reaches it again.
    KvReuseForecast never;
    never.next_read_steps = std::numeric_limits<double>::infinity();
    never.reads_left = 0;
    never.order_in_step = m.chain_index;
    return never;
  }
  if (m.idle_kind == IdleKind::kResumes) {
    // Read at the resume of the sequence it was taken from, as soon as the sequences preempted
    // before it came back; a preempted request that never comes back (cancelled) is judged as a
    // finished one's page once it has waited well past every resume seen.
    const KvIdleReuseHistory& resumes = history(IdleKind::kResumes);
    const double longest =
        std::max({static_cast<double>(resumes.longest_gap()), static_cast<double>(longest_run),
                  KvIdleReuseHistory::kDefaultIdleGapSteps});
    if (static_cast<double>(in.idle_steps) <= kResumeWaitLimit * longest) {
      in.waiting_reader = true;
      in.reads_left = -1;  // its steps left are the scheduler's, not the manager's
      in.steps_to_resume =
          static_cast<int64_t>(std::ceil(resumes.RemainingGapSteps(in.idle_steps)));
      return ForecastReuse(in, resumes);
    }
    return ForecastReuse(in, history(IdleKind::kOther));
  }
  return ForecastReuse(in, history(m.idle_kind));
}

void KvManager::State::TakeOrder(int64_t count, uint64_t epoch,
                                 std::vector<BlockId>* victims) const {
  victims->clear();
  if (count <= 0) return;
  // The free list holds the uncached blocks first: they cost nothing to take.
  BlockId b = pool.free_front();
  for (; b != kNoBlock && !meta[b].indexed; b = pool.next_free(b)) {
    if (block_plan_mark[b] == epoch) continue;
    victims->push_back(b);
    if (static_cast<int64_t>(victims->size()) == count) return;
  }
  // Then idle cached blocks, each of which loses a prefix someone may ask for again.
  const bool forecast = options.idle_block_order == KvIdleBlockOrder::kForecast;
  idle_candidates.clear();
  int32_t rank = 0;
  for (; b != kNoBlock; b = pool.next_free(b), ++rank) {
    if (block_plan_mark[b] == epoch) continue;
    IdleCandidate c;
    c.rank = rank;
    c.block = b;
    if (forecast) c.forecast = IdleForecast(b);
    candidate_of_block[b] = static_cast<int32_t>(idle_candidates.size());
    idle_candidates.push_back(c);
  }
  const size_t take = std::min(idle_candidates.size(),
                               static_cast<size_t>(count) - victims->size());
  if (forecast) {
    LiftParents();
    // The least likely to be read again, and the latest, first (KvPageLeavesFirst); a tie goes
    // to the least recently freed. A total order: std::partial_sort needs no buffer.
    std::partial_sort(idle_candidates.begin(),
                      idle_candidates.begin() + static_cast<std::ptrdiff_t>(take),
                      idle_candidates.end(), [](const IdleCandidate& x, const IdleCandidate& y) {
                        if (KvPageLeavesFirst(x.forecast, y.forecast)) return true;
                        if (KvPageLeavesFirst(y.forecast, x.forecast)) return false;
                        return x.rank < y.rank;
                      });
  }
  for (size_t i = 0; i < take; ++i) victims->push_back(idle_candidates[i].block);
}

void KvManager::State::LiftParents() const {
  // A prefix hit walks a chain from its first block: a block is read again only with its parent,
  // so its parent is at least as likely to be, and as soon. Each candidate lifts its idle
  // ancestors to its own forecast where theirs is worse (they keep their place in the chain, so
  // a tie still takes the deeper block first); a walk stops at an ancestor already as good.
  for (size_t i = 0; i < idle_candidates.size(); ++i) {
    size_t child = i;
    for (;;) {
      const BlockRef parent = meta[idle_candidates[child].block].parent;
      if (parent.block == kNoBlock || meta[parent.block].generation != parent.generation) break;
      const int32_t p = candidate_of_block[parent.block];
      if (p < 0 || static_cast<size_t>(p) >= idle_candidates.size() ||
          idle_candidates[static_cast<size_t>(p)].block != parent.block) {
        break;  // in use (or revived by this plan): not a candidate
      }
      if (IsStale(parent.block)) break;  // unreachable itself: nothing to keep it for
      KvReuseForecast& up = idle_candidates[static_cast<size_t>(p)].forecast;
      const KvReuseForecast& down = idle_candidates[child].forecast;
      KvReuseForecast lifted = down;
      lifted.order_in_step = up.order_in_step;
      if (!KvPageLeavesFirst(up, lifted)) break;
      up = lifted;
      child = static_cast<size_t>(p);
    }
  }
}

BlockId KvManager::State::NextFreeBlock() const {
  const BlockId front = pool.free_front();
  if (front == kNoBlock || !meta[front].indexed ||
      options.idle_block_order != KvIdleBlockOrder::kForecast) {
    return front;
  }
  TakeOrder(1, kNoPlanEpoch, &take_order);
  return take_order.front();
}

// Drops an index entry; a free block that loses it no longer deserves its place at the back.
void KvManager::State::Unindex(BlockId block) {
  BlockMeta& m = meta[block];
  KVL_CHECK(m.indexed);
  KVL_CHECK(index.Find(m.hash) == block);
  index.Erase(m.hash);
  ++index_changes;
  if (options.block_observer != nullptr) options.block_observer->BlockRemoved(m.hash);
  m.indexed = false;
  if (pool.refcount(block) == 0) {
    --num_cached;
    history(m.idle_kind).ForgetIdlePage(m.idle_since);  // never read again as this prefix
    pool.MoveToFront(block);
  }
}

void KvManager::State::IndexContent(BlockId block) {
  const KvContentId id = meta[block].content;
  if (id.valid() && content_index.Find(id.lo) == kNoBlock) content_index.Insert(id.lo, block);
}

void KvManager::State::UnindexContent(BlockId block) {
  const KvContentId id = meta[block].content;
  if (id.valid() && content_index.Find(id.lo) == block) content_index.Erase(id.lo);
}

// Takes a free block for new contents; a cached prefix it held is evicted now (lazily).
void KvManager::State::AllocateBlock(BlockId block) {
  KVL_CHECK(pool.refcount(block) == 0);
  BlockMeta& m = meta[block];
  UnindexContent(block);
  if (m.indexed) Unindex(block);
  pool.Acquire(block);
  const uint64_t generation = m.generation + 1;
  m = BlockMeta{};
  m.generation = generation;
}

bool KvManager::State::SameIdentity(BlockId a, BlockId b) const {
  const BlockMeta& ma = meta[a];
  const BlockMeta& mb = meta[b];
  if (!ma.full || !mb.full || ma.hash != mb.hash || ma.parent != mb.parent) return false;
  const auto ta = BlockTokens(a), tb = BlockTokens(b);
  return std::equal(ta.begin(), ta.end(), tb.begin());
}

// The instance that stands for a full block's prefix: the indexed block with the same identity
// when there is one, so that children registered later chain to what MatchBlocks walks.
BlockRef KvManager::State::CanonicalRef(BlockId block) const {
  const BlockMeta& m = meta[block];
  KVL_CHECK(m.full);
  if (!m.indexed) {
    const BlockId holder = index.Find(m.hash);
    if (holder != kNoBlock && SameIdentity(holder, block)) return RefOf(holder);
  }
  return RefOf(block);
}

// An index entry whose parent instance was reallocated can never be matched again (the chain
// through it is gone), so it gives its slot to a block that can.
bool KvManager::State::IsStale(BlockId block) const {
  const BlockRef& parent = meta[block].parent;
  return parent.block != kNoBlock && meta[parent.block].generation != parent.generation;
}

// Block k of `seq` has just been filled: give it its identity and index it.
void KvManager::State::RegisterFullBlock(const SeqState& seq, size_t k) {
  const BlockId block = seq.table[k];
  BlockMeta& m = meta[block];
  KVL_CHECK(!m.full && !m.indexed);
  const size_t bt = static_cast<size_t>(block_tokens);
  const std::span<const int32_t> tokens = std::span(seq.tokens).subspan(k * bt, bt);
  std::copy(tokens.begin(), tokens.end(),
            block_token_ids.begin() + static_cast<ptrdiff_t>(block * bt));
  m.content = seq.content[k];
  m.chain_index = static_cast<int32_t>(k);
  IndexContent(block);
  // A parent that left the pool (a lossless detach) gives no instance to chain to: the block is
  // found through the KV store by its content id instead.
  if (k > 0 && (seq.table[k - 1] == kNoBlock || !meta[seq.table[k - 1]].full)) return;
  m.parent_hash = k == 0 ? options.model_identity : meta[seq.table[k - 1]].hash;
  m.parent = k == 0 ? BlockRef{} : CanonicalRef(seq.table[k - 1]);
  m.hash = Hash(m.parent_hash, tokens);
  m.full = true;
  if (!options.enable_prefix_cache) return;
  const BlockId holder = index.Find(m.hash);
  if (holder != kNoBlock) {
    // Another block already holds this hash (the same prefix computed twice, or a collision):
    // keep it, and leave this block unindexed; unless the holder is unreachable.
    if (!IsStale(holder)) return;
    Unindex(holder);
  }
  index.Insert(m.hash, block);
  m.indexed = true;
  ++index_changes;
  if (options.block_observer != nullptr) {
    options.block_observer->BlockStored(m.hash, m.parent_hash, k == 0, tokens);
  }
}

StatusOr<std::unique_ptr<KvManager>> KvManager::Create(const KvManagerOptions& options) {
  const KvBlockLayout& layout = options.layout;
  if (layout.block_tokens <= 0 || layout.num_layers <= 0 || layout.kv_dim <= 0) {
    return InvalidArgumentError(
        fmt::format("KV block layout must be positive: block_tokens {}, num_layers {}, kv_dim {}",
                    layout.block_tokens, layout.num_layers, layout.kv_dim));
  }
  if (layout.checkpoint_every < 1 || layout.checkpoint_every > layout.num_layers) {
    return InvalidArgumentError(
        fmt::format("residual checkpoints every {} layers: use 1 to {} (the model's layers)",
                    layout.checkpoint_every, layout.num_layers));
  }
  for (DType type : {layout.k_type, layout.v_type}) {
    if (type != DType::kF32 && type != DType::kF16 && type != DType::kBF16 && !IsQuantKvType(type)) {
      return InvalidArgumentError(
          fmt::format("KV cache type {} is not one of f32, f16, bf16, q8_0, q4_0, q8_0r, q4_0r", DTypeName(type)));
    }
    if (IsQuantKvType(type) && layout.kv_dim % 32 != 0) {
      return InvalidArgumentError(fmt::format(
          "KV cache type {} needs kv_dim a multiple of 32 (blocks of 32 values), got {}",
          DTypeName(type), layout.kv_dim));
    }
  }
  if (options.max_seqs <= 0) {
    return InvalidArgumentError(fmt::format("max_seqs must be positive, got {}", options.max_seqs));
  }
  const int64_t block_bytes = layout.block_bytes();
  const int64_t num_blocks = options.budget_bytes > 0 ? options.budget_bytes / block_bytes : 0;
  if (num_blocks == 0) {
    return ResourceExhaustedError(fmt::format(
        "a KV budget of {} bytes holds no block of {} bytes ({} tokens x {} layers x {} values x "
        "K,V); raise the budget or lower the block size",
        options.budget_bytes, block_bytes, layout.block_tokens, layout.num_layers, layout.kv_dim));
  }
  if (num_blocks > INT32_MAX - 1) {
    return InvalidArgumentError(
        fmt::format("{} KV blocks is more than block ids can name", num_blocks));
  }
  std::unique_ptr<KvManager> manager(new KvManager());
  manager->s_ = std::make_unique<State>(options, static_cast<int32_t>(num_blocks));
  return manager;
}

KvManager::~KvManager() = default;

const KvManagerOptions& KvManager::options() const { return s_->options; }
int64_t KvManager::num_blocks() const { return s_->pool.num_blocks(); }

int64_t KvManager::BlocksFor(int64_t num_tokens) const {
  return (num_tokens + s_->block_tokens - 1) / s_->block_tokens;
}

int64_t KvManager::MatchPrefix(std::span<const int32_t> tokens) const {
  return static_cast<int64_t>(s_->MatchBlocks(tokens, nullptr)) * s_->block_tokens;
}

bool KvManager::SharesPagesComputedInStep(std::span<const int32_t> tokens,
                                          std::span<const KvSeqStep> admitted) const {
  if (!s_->options.enable_prefix_cache || tokens.empty()) return false;
  const auto bt = static_cast<int64_t>(s_->block_tokens);
  // The pages an admission can take from the pool: whole ones, never the last token's.
  const int64_t usable = (static_cast<int64_t>(tokens.size()) - 1) / bt;
  int64_t shared = 0;
  for (const KvSeqStep& step : admitted) {
    const size_t limit = std::min(step.tokens.size(), tokens.size());
    const auto agree = static_cast<int64_t>(
        std::mismatch(step.tokens.begin(), step.tokens.begin() + static_cast<ptrdiff_t>(limit),
                      tokens.begin())
            .first -
        step.tokens.begin());
    shared = std::max(shared, std::min(agree / bt, usable));
  }
  return shared > 0 && shared * bt > MatchPrefix(tokens);
}

void KvManager::ContentChain(std::span<const int32_t> tokens, int64_t num_blocks,
                             std::vector<KvContentId>* out) const {
  const size_t bt = static_cast<size_t>(s_->block_tokens);
  KVL_CHECK(num_blocks >= 0 && static_cast<size_t>(num_blocks) * bt <= tokens.size());
  out->clear();
  KvContentId parent;
  for (int64_t k = 0; k < num_blocks; ++k) {
    parent = ChainContentId(parent, tokens.subspan(static_cast<size_t>(k) * bt, bt),
                            s_->options.model_identity);
    out->push_back(parent);
  }
}

KvPlan KvManager::Plan(std::span<const KvSeqStep> steps) const {
  KvPlan plan;
  Plan(steps, &plan);
  return plan;
}

void KvManager::Plan(std::span<const KvSeqStep> steps, KvPlan* out) const {
  const State& s = *s_;
  KvPlan& plan = *out;
  plan.fits = false;
  plan.blocks_needed = 0;
  plan.blocks_reused_free = 0;
  plan.state_version = s.version;
  plan.blocks_free = s.pool.num_free();
  plan.copies.clear();
  // Every SeqPlan is reset field by field rather than replaced, so its vectors keep their room.
  plan.seqs.resize(steps.size());
  for (KvPlan::SeqPlan& sp : plan.seqs) {
    sp.admit = false;
    sp.num_cached_tokens = 0;
    sp.in_place_blocks = 0;
    sp.reused.clear();
    sp.allocated.clear();
    sp.cow_src = kNoBlock;
    sp.cow_dst = kNoBlock;
    sp.blocks_needed = 0;
  }
  const uint64_t epoch = ++s.plan_epoch;

  // Pass 1: what each sequence needs. Prefix hits are decided before any fresh block is picked,
  // so a block revived here is never also handed out as a fresh one.
  for (size_t i = 0; i < steps.size(); ++i) {
    const KvSeqStep& step = steps[i];
    KvPlan::SeqPlan& sp = plan.seqs[i];
    KVL_CHECK_MSG(step.seq >= 0 && step.seq < s.options.max_seqs, "sequence id out of range");
    KVL_CHECK_MSG(!step.tokens.empty(), "a plan step must add tokens");
    KVL_CHECK_MSG(s.seq_plan_mark[step.seq] != epoch, "a sequence appears twice in one plan");
    s.seq_plan_mark[step.seq] = epoch;
    sp.seq = step.seq;
    sp.tokens.assign(step.tokens.begin(), step.tokens.end());
    sp.unverified = step.unverified;
    sp.restore_tokens = step.restore_tokens;
    const SeqState& seq = s.seqs[step.seq];
    if (!seq.present) {
      sp.admit = true;
      s.MatchBlocks(step.tokens, &sp.reused);
      for (BlockId block : sp.reused) {
        if (s.pool.refcount(block) == 0 && s.block_plan_mark[block] != epoch) {
          s.block_plan_mark[block] = epoch;
          ++plan.blocks_reused_free;
        }
      }
      sp.num_cached_tokens = static_cast<int64_t>(sp.reused.size()) * s.block_tokens;
      sp.in_place_blocks = step.in_place_blocks;
      sp.first_new_pos = sp.num_cached_tokens + sp.in_place_blocks * s.block_tokens;
      KVL_CHECK_MSG(sp.first_new_pos < static_cast<int64_t>(step.tokens.size()),
                    "blocks read in place must leave the block with the last token in the pool");
      sp.blocks_needed = BlocksFor(static_cast<int64_t>(step.tokens.size())) -
                         static_cast<int64_t>(sp.reused.size()) - sp.in_place_blocks;
      continue;
    }
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    sp.first_new_pos = n;
    sp.blocks_needed = BlocksFor(n + static_cast<int64_t>(step.tokens.size())) - BlocksFor(n);
    if (n % s.block_tokens != 0) {
      // The new tokens start inside the last block. If others hold it too, this sequence writes
      // into a private copy. The last of its holders in this plan keeps the original, since the
      // engine makes every copy before the forward pass writes anything.
      const BlockId last = seq.table.back();
      int64_t holders = s.pool.refcount(last);
      for (size_t j = 0; j < i; ++j) holders -= plan.seqs[j].cow_src == last ? 1 : 0;
      if (holders > 1) {
        sp.cow_src = last;
        ++sp.blocks_needed;
      }
    }
  }
  for (const KvPlan::SeqPlan& sp : plan.seqs) plan.blocks_needed += sp.blocks_needed;
  plan.fits = plan.blocks_needed + plan.blocks_reused_free <= plan.blocks_free;
  if (!plan.fits) {
    for (KvPlan::SeqPlan& sp : plan.seqs) sp.cow_src = kNoBlock;
    return;
  }

  // Pass 2: the fresh blocks, uncached ones first, then the idle cached blocks in the reuse
  // forecast's order (State::TakeOrder).
  s.TakeOrder(plan.blocks_needed, epoch, &s.take_order);
  size_t taken = 0;
  auto next_fresh = [&]() {
    KVL_CHECK(taken < s.take_order.size());
    return s.take_order[taken++];
  };
  for (KvPlan::SeqPlan& sp : plan.seqs) {
    int64_t fresh = sp.blocks_needed;
    if (sp.cow_src != kNoBlock) {
      sp.cow_dst = next_fresh();
      plan.copies.push_back({sp.cow_src, sp.cow_dst});
      --fresh;
    }
    sp.allocated.reserve(static_cast<size_t>(fresh));
    for (int64_t j = 0; j < fresh; ++j) sp.allocated.push_back(next_fresh());
  }
}

void KvManager::Commit(const KvPlan& plan) {
  State& s = *s_;
  KVL_CHECK_MSG(plan.fits, "Commit of a plan that does not fit");
  KVL_CHECK_MSG(plan.state_version == s.version, "Commit of a plan made against an older state");
  // Copies first: a sequence that keeps a shared block in place (the last of its holders) must
  // not see the others' references while it appends.
  for (const KvPlan::SeqPlan& sp : plan.seqs) {
    if (sp.cow_src == kNoBlock) continue;
    SeqState& seq = s.seqs[sp.seq];
    KVL_CHECK(seq.present && seq.table.back() == sp.cow_src);
    s.AllocateBlock(sp.cow_dst);
    s.UnrefBlock(sp.cow_src);
    seq.table.back() = sp.cow_dst;
  }
  for (const KvPlan::SeqPlan& sp : plan.seqs) {
    SeqState& seq = s.seqs[sp.seq];
    if (sp.admit) {
      KVL_CHECK(!seq.present);
      seq.present = true;
      seq.table.clear();
      seq.tokens.clear();
      // Room for the whole context now, so appending decode tokens never reallocates. The slot
      // keeps it after Free, for the next sequence with this id.
      const int64_t max_tokens = std::max<int64_t>(s.options.max_seq_tokens,
                                                   static_cast<int64_t>(sp.tokens.size()));
      seq.tokens.reserve(static_cast<size_t>(max_tokens));
      seq.table.reserve(static_cast<size_t>(BlocksFor(max_tokens)));
      seq.content.clear();
      seq.content.reserve(static_cast<size_t>(BlocksFor(max_tokens)));
      ++s.num_seqs;
      seq.admitted_at = s.clock;
      // A prefix hit that takes a finished sequence's whole chain: a conversation's next turn.
      seq.conversation = std::any_of(sp.reused.begin(), sp.reused.end(),
                                     [&](BlockId block) { return s.meta[block].chain_end; });
      for (BlockId block : sp.reused) {
        s.RefBlock(block, seq.conversation);
        seq.table.push_back(block);
      }
      for (int64_t d = 0; d < sp.in_place_blocks; ++d) seq.table.push_back(kNoBlock);
      if (sp.in_place_blocks > 0) seq.paged = true;  // lossless: identities are kept
      if (s.options.enable_prefix_cache) {
        ++s.prefix_queries;
        s.prefix_query_tokens += static_cast<int64_t>(sp.tokens.size());
        s.prefix_hit_tokens += sp.num_cached_tokens;
      }
    } else {
      KVL_CHECK(seq.present);
    }
    KVL_CHECK_MSG(sp.admit || seq.unverified == 0,
                  "a step after a draft that TruncateTail did not settle");
    seq.unverified = sp.unverified;
    const size_t old_tokens = seq.tokens.size();
    // Only the sequence itself may write into its last block.
    KVL_CHECK(old_tokens % s.block_tokens == 0 || s.pool.refcount(seq.table.back()) == 1);
    for (BlockId block : sp.allocated) {
      s.AllocateBlock(block);
      seq.table.push_back(block);
    }
    if (sp.admit) {
      // The cached prefix is already in the reused blocks; only the rest is new.
      seq.tokens.assign(sp.tokens.begin(), sp.tokens.end());
    } else {
      seq.tokens.insert(seq.tokens.end(), sp.tokens.begin(), sp.tokens.end());
    }
    KVL_CHECK(static_cast<int64_t>(seq.table.size()) ==
              BlocksFor(static_cast<int64_t>(seq.tokens.size())));
    // Blocks with identity already (reused ones carry theirs) are not registered again.
    const size_t first_unfilled = std::max(
        seq.content.size(), sp.reused.size() + static_cast<size_t>(sp.in_place_blocks));
    s.IdentifyFullBlocks(seq, static_cast<int64_t>(seq.tokens.size()) - sp.unverified,
                         first_unfilled);
  }
  s.NotePeak();
  ++s.version;
  ++s.clock;  // a step ran: idle blocks age by one
}

void KvManager::Free(SeqId seq_id, bool resumes) {
  State& s = *s_;
  KVL_CHECK(Contains(seq_id));
  SeqState& seq = s.seqs[seq_id];
  if (!resumes) {
    // A request that finished: its last full block ends a chain a next turn may continue. Its
    // indexed instance is the one a prefix hit finds.
    for (auto it = seq.table.rbegin(); it != seq.table.rend(); ++it) {
      if (*it == kNoBlock) break;  // detached: the chain is not in the pool whole
      if (!s.meta[*it].full) continue;
      const BlockId end = s.CanonicalRef(*it).block;
      if (s.meta[end].indexed) s.meta[end].chain_end = true;
      break;
    }
  }
  if (!resumes) s.longest_run = std::max(s.longest_run, s.clock - seq.admitted_at);
  if (!resumes && seq.conversation) s.InheritChainRecord(seq);
  // Its blocks nobody else holds go idle, judged by the history of their kind.
  s.freeing_kind = resumes ? IdleKind::kResumes
                           : (seq.conversation ? IdleKind::kConversation : IdleKind::kOther);
  // Last to first: the tail lands nearer the front of the free list than the prefix, so a
  // sequence's tail is evicted before the prefix other requests are likelier to share.
  for (auto it = seq.table.rbegin(); it != seq.table.rend(); ++it) {
    if (*it != kNoBlock) s.UnrefBlock(*it);
  }
  s.freeing_kind = IdleKind::kOther;
  seq.present = false;
  seq.conversation = false;
  seq.paged = false;
  seq.lossy = false;
  seq.unverified = 0;
  seq.table.clear();
  seq.tokens.clear();
  seq.content.clear();
  --s.num_seqs;
  ++s.version;
}

// A conversation's next turn resubmits its whole history, so the pages this turn added (its
// user's line, its reply) are read again exactly when the pages it continued are: idle for the
// first time, with no record of their own, they take the record of the deepest page it
// continued (its pauses, its revivals), rather than look like a one-off prompt's.
void KvManager::State::InheritChainRecord(const kv_internal::SeqState& seq) {
  const BlockMeta* record = nullptr;
  for (BlockId block : seq.table) {
    if (block == kNoBlock) continue;
    BlockMeta& m = meta[block];
    if (m.idle_periods > 0 || m.revivals > 0) {
      record = &m;  // a page that was idle before: one this turn continued
    } else if (record != nullptr && m.full && pool.refcount(block) == 1) {
      m.idle_periods = record->idle_periods;
      m.revivals = record->revivals;
      m.revival_gap_steps = record->revival_gap_steps;
    }
  }
}

// Content ids of the full blocks among the first `verified_tokens` that have none yet; the ones
// from `first_unregistered` on enter the prefix index. None once lossy.
void KvManager::State::IdentifyFullBlocks(kv_internal::SeqState& seq, int64_t verified_tokens,
                                          size_t first_unregistered) {
  const size_t full_blocks = static_cast<size_t>(verified_tokens / block_tokens);
  for (size_t k = seq.content.size(); k < full_blocks; ++k) {
    const KvContentId parent = k == 0 ? KvContentId{} : seq.content[k - 1];
    seq.content.push_back(
        seq.lossy || (k > 0 && !parent.valid())
            ? KvContentId{}
            : ChainContentId(parent, std::span(seq.tokens).subspan(k * block_tokens, block_tokens),
                             options.model_identity));
  }
  if (!seq.lossy) {
    for (size_t k = first_unregistered; k < full_blocks; ++k) RegisterFullBlock(seq, k);
  }
}

void KvManager::TruncateTail(SeqId seq_id, int64_t num_tokens) {
  State& s = *s_;
  KVL_CHECK(Contains(seq_id));
  SeqState& seq = s.seqs[seq_id];
  KVL_CHECK_MSG(num_tokens >= static_cast<int64_t>(seq.content.size()) * s.block_tokens &&
                    num_tokens <= static_cast<int64_t>(seq.tokens.size()),
                "TruncateTail cuts only unverified tokens");
  const size_t keep = static_cast<size_t>(BlocksFor(num_tokens));
  for (size_t k = seq.table.size(); k > keep; --k) {  // last to first, as in Free
    if (seq.table[k - 1] != kNoBlock) s.UnrefBlock(seq.table[k - 1]);
  }
  seq.table.resize(std::min(seq.table.size(), keep));
  seq.tokens.resize(static_cast<size_t>(num_tokens));
  seq.unverified = 0;
  s.IdentifyFullBlocks(seq, num_tokens, seq.content.size());
  ++s.version;
}

void KvManager::Truncate(SeqId seq_id, int64_t num_tokens) {
  State& s = *s_;
  KVL_CHECK(Contains(seq_id));
  SeqState& seq = s.seqs[seq_id];
  KVL_CHECK_MSG(num_tokens >= 0 && num_tokens % s.block_tokens == 0 &&
                    num_tokens <= static_cast<int64_t>(seq.tokens.size()),
                "Truncate to a block boundary within the sequence");
  const size_t keep = static_cast<size_t>(num_tokens / s.block_tokens);
  // Last to first, as in Free.
  for (size_t k = seq.table.size(); k > keep; --k) {
    if (seq.table[k - 1] != kNoBlock) s.UnrefBlock(seq.table[k - 1]);
  }
  seq.table.resize(std::min(seq.table.size(), keep));
  seq.tokens.resize(static_cast<size_t>(num_tokens));
  seq.content.resize(std::min(seq.content.size(), keep));
  ++s.version;
}

void KvManager::Fork(SeqId parent, SeqId child) {
  State& s = *s_;
  KVL_CHECK(Contains(parent));
  KVL_CHECK(child >= 0 && child < s.options.max_seqs && !s.seqs[child].present);
  const SeqState& from = s.seqs[parent];
  KVL_CHECK_MSG(!from.paged, "Fork of a paged sequence");
  SeqState& to = s.seqs[child];
  to.present = true;
  to.table = from.table;
  to.tokens = from.tokens;
  to.content = from.content;
  to.conversation = from.conversation;
  to.admitted_at = s.clock;
  for (BlockId block : to.table) s.pool.Ref(block);
  ++s.num_seqs;
  ++s.version;
}

BlockId& KvManager::State::PageableEntry(SeqId seq_id, int64_t block_index) {
  KVL_CHECK(seq_id >= 0 && seq_id < options.max_seqs && seqs[seq_id].present);
  std::vector<BlockId>& table = seqs[seq_id].table;
  KVL_CHECK_MSG(block_index >= 0 && block_index + 1 < static_cast<int64_t>(table.size()),
                "only a full block other than the last can leave the pool or come back");
  return table[static_cast<size_t>(block_index)];
}

void KvManager::Detach(SeqId seq_id, int64_t block_index, bool lossless) {
  State& s = *s_;
  BlockId& entry = s.PageableEntry(seq_id, block_index);
  KVL_CHECK_MSG(entry != kNoBlock, "block already detached");
  s.UnrefBlock(entry);
  entry = kNoBlock;
  SeqState& seq = s.seqs[seq_id];
  seq.paged = true;
  if (!lossless) seq.lossy = true;
  ++s.version;
}

BlockId KvManager::Reattach(SeqId seq_id, int64_t block_index) {
  State& s = *s_;
  BlockId& entry = s.PageableEntry(seq_id, block_index);
  KVL_CHECK_MSG(entry == kNoBlock, "block is not detached");
  const BlockId block = s.NextFreeBlock();
  if (block == kNoBlock) return kNoBlock;
  s.AllocateBlock(block);
  entry = block;
  s.NotePeak();
  ++s.version;
  return block;
}

void KvManager::RestoreIdentity(SeqId seq_id, int64_t block_index) {
  State& s = *s_;
  const BlockId block = s.PageableEntry(seq_id, block_index);
  KVL_CHECK_MSG(block != kNoBlock && !s.meta[block].full,
                "only a reattached block gets its identity back");
  const SeqState& seq = s.seqs[seq_id];
  const size_t k = static_cast<size_t>(block_index);
  if (k >= seq.content.size() || !seq.content[k].valid()) return;
  s.RegisterFullBlock(seq, k);
  ++s.version;
}

BlockId KvManager::next_free_block() const { return s_->NextFreeBlock(); }

void KvManager::DropIdentity(SeqId seq_id, int64_t first_block) {
  State& s = *s_;
  KVL_CHECK(Contains(seq_id));
  SeqState& seq = s.seqs[seq_id];
  for (size_t k = static_cast<size_t>(std::max<int64_t>(0, first_block)); k < seq.table.size(); ++k) {
    if (k < seq.content.size()) seq.content[k] = {};
    const BlockId block = seq.table[k];
    if (block == kNoBlock) continue;
    BlockMeta& m = s.meta[block];
    s.UnindexContent(block);
    if (m.indexed) s.Unindex(block);
    const uint64_t generation = m.generation;
    m = BlockMeta{};
    m.generation = generation;
  }
  seq.paged = true;  // blocks without identity: allowed only in a paged sequence
  seq.lossy = true;
  ++s.version;
}

KvContentId KvManager::ContentOf(SeqId seq, int64_t block_index) const {
  KVL_CHECK(Contains(seq));
  const std::vector<KvContentId>& content = s_->seqs[seq].content;
  return block_index >= 0 && static_cast<size_t>(block_index) < content.size()
             ? content[static_cast<size_t>(block_index)]
             : KvContentId{};
}

BlockId KvManager::FindContent(KvContentId id) const {
  const State& s = *s_;
  if (!id.valid()) return kNoBlock;
  const BlockId block = s.content_index.Find(id.lo);
  return block != kNoBlock && s.meta[block].content == id ? block : kNoBlock;
}

KvContentId KvManager::FreeBlockContent(BlockId block) const {
  const State& s = *s_;
  KVL_CHECK(block >= 0 && block < s.pool.num_blocks());
  if (s.pool.refcount(block) != 0 || s.raw[block]) return {};
  return s.meta[block].content;
}

void KvManager::MarkCheckpointsMissing(BlockId block) {
  KVL_CHECK(block >= 0 && block < s_->pool.num_blocks());
  s_->meta[block].checkpoints_missing = true;
}

bool KvManager::CheckpointsMissing(BlockId block) const {
  KVL_CHECK(block >= 0 && block < s_->pool.num_blocks());
  return s_->meta[block].checkpoints_missing;
}

std::span<const int32_t> KvManager::BlockTokens(BlockId block) const {
  KVL_CHECK(block >= 0 && block < s_->pool.num_blocks());
  return s_->BlockTokens(block);
}

uint64_t KvManager::state_version() const { return s_->version; }

bool KvManager::IsLossy(SeqId seq) const {
  KVL_CHECK(Contains(seq));
  return s_->seqs[seq].lossy;
}

bool KvManager::IsPaged(SeqId seq) const {
  KVL_CHECK(Contains(seq));
  return s_->seqs[seq].paged;
}

int32_t KvManager::refcount(BlockId block) const {
  KVL_CHECK(block >= 0 && block < s_->pool.num_blocks());
  return s_->pool.refcount(block);
}

BlockId KvManager::AcquireRawBlock() {
  State& s = *s_;
  const BlockId block = s.NextFreeBlock();
  if (block == kNoBlock) return kNoBlock;
  s.AllocateBlock(block);  // evicts a cached prefix it held
  s.raw[block] = 1;
  ++s.num_raw;
  s.NotePeak();
  ++s.version;
  return block;
}

void KvManager::ReleaseRawBlock(BlockId block) {
  State& s = *s_;
  KVL_CHECK(block >= 0 && block < s.pool.num_blocks() && s.raw[block]);
  s.raw[block] = 0;
  --s.num_raw;
  s.UnrefBlock(block);
  ++s.version;
}

bool KvManager::Contains(SeqId seq) const {
  return seq >= 0 && seq < s_->options.max_seqs && s_->seqs[seq].present;
}

int64_t KvManager::num_tokens(SeqId seq) const {
  KVL_CHECK(Contains(seq));
  return static_cast<int64_t>(s_->seqs[seq].tokens.size());
}

const std::vector<BlockId>& KvManager::block_table(SeqId seq) const {
  KVL_CHECK(Contains(seq));
  return s_->seqs[seq].table;
}

const std::vector<int32_t>& KvManager::tokens(SeqId seq) const {
  KVL_CHECK(Contains(seq));
  return s_->seqs[seq].tokens;
}

KvStats KvManager::stats() const {
  const State& s = *s_;
  KvStats st;
  st.blocks_total = s.pool.num_blocks();
  st.blocks_free = s.pool.num_free();
  st.blocks_used = st.blocks_total - st.blocks_free;
  st.blocks_cached = s.num_cached;
  st.blocks_raw = s.num_raw;
  st.blocks_used_peak = s.peak_used;
  st.kv_bytes_peak = s.peak_used * s.options.layout.block_bytes();
  st.kv_bytes_used = st.blocks_used * s.options.layout.block_bytes();
  st.kv_bytes_total = st.blocks_total * s.options.layout.block_bytes();
  st.prefix_queries = s.prefix_queries;
  st.prefix_query_tokens = s.prefix_query_tokens;
  st.prefix_hit_tokens = s.prefix_hit_tokens;
  st.num_seqs = s.num_seqs;
  return st;
}

void KvManager::IndexedHashes(std::vector<uint64_t>* out) const {
  out->clear();
  out->reserve(static_cast<size_t>(s_->pool.num_blocks()));
  s_->index.ForEach([out](uint64_t hash, BlockId) { out->push_back(hash); });
}

uint64_t KvManager::index_changes() const { return s_->index_changes; }

}  // namespace kvl
