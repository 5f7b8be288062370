// KvManager's state, shared by kv_manager.cc (operations) and kv_manager_invariants.cc (the
// from-scratch cross-check). Not part of the public API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "block_pool.h"
#include "prefix_index.h"
#include "kvl/kv_manager.h"
#include "kvl/kv_reuse_forecast.h"

namespace kvl {

namespace kv_internal {

// Why an idle cached block went idle, which decides the history that judges it
// (kvl/kv_reuse_forecast.h): who reads it again differs, and so do how likely and how soon.
enum class IdleKind : uint8_t {
  // A finished request's page: read again only if a later request shares it (an opening, a
  // document), which may come any time or never.
  kOther,
  // A finished request that continued an earlier one's whole chain (a chat's next turn, which
  // resubmits the history): read again by its own next turn, when its user answers.
  kConversation,
  // A preempted sequence's page: read again, for certain, when it resumes.
  kResumes,
};
inline constexpr size_t kNumIdleKinds = 3;

// Names one block instance: a block id plus how many times it had been allocated. A reference
// to an instance that has since been reallocated no longer matches the block's generation, so it
// can never be confused with the block's new contents.
struct BlockRef {
  BlockId block = kNoBlock;
  uint64_t generation = 0;
  bool operator==(const BlockRef&) const = default;
};

// What a block holds beyond its K/V rows. Only full blocks have an identity (hash, parent,
// token ids); a partial block can still be written and so has none.
struct BlockMeta {
  uint64_t generation = 0;  // bumped each time the block is allocated
  bool full = false;        // the identity fields below are set
  bool indexed = false;     // the prefix index maps `hash` to this block
  uint64_t hash = 0;
  uint64_t parent_hash = 0;
  // The block instance whose token prefix precedes this block (the canonical, indexed one when
  // there is one); {kNoBlock, 0} for the first block. Matching this, not just parent_hash, makes
  // a hit exact even when two different prefixes collide.
  BlockRef parent;
  // The page's content id, when it has one (set even where the block is not in the index, e.g.
  // when its parent left the pool): the KV store saves the page under it before the block is
  // reused. Reset when the block is allocated.
  KvContentId content;
  // Its K/V came back from a tier without the residual checkpoints: whoever uses the block
  // (a later prefix hit included) must not rebuild from them.
  bool checkpoints_missing = false;
  // Its place in its sequence (block k of the chain): among idle blocks the forecast leaves a
  // tie to the deeper one, whose loss breaks no other block's chain.
  int32_t chain_index = 0;
  // Its record as an idle cached block (free, still findable by prefix), for the reuse forecast:
  // the Commit count when it last went idle, how many times it did, and how many of those ended
  // in a prefix hit (a preempted sequence's blocks waiting for its resume count in none).
  int64_t idle_since = 0;
  int32_t idle_periods = 0;
  int32_t revivals = 0;
  int64_t revival_gap_steps = 0;  // the pauses those revivals ended, summed
  // Admissions whose prefix hit found it held by a running sequence (an opening shared by
  // requests run together): reads again it had without going idle, counted as revivals by the
  // forecast, so that such a page idle for the first time is told from a one-off prompt's.
  int32_t shared_reads = 0;
  IdleKind idle_kind = IdleKind::kOther;  // the history its current idle period is counted in
  // The last full block of a finished sequence: a request whose prefix hit reaches it continues
  // that whole chain (a conversation's next turn).
  bool chain_end = false;
};

struct SeqState {
  bool present = false;
  bool paged = false;  // some full block was detached (KvManager::Detach)
  bool lossy = false;  // some block was detached without keeping its exact bytes
  // Speculative decoding: the last tokens are a draft not yet verified (KvSeqStep::unverified);
  // the blocks holding them have no identity until TruncateTail.
  int64_t unverified = 0;
  // Its prefix hit took the whole chain of a finished sequence (a block with chain_end): its
  // blocks are a conversation's when it finishes.
  bool conversation = false;
  int64_t admitted_at = 0;  // the step clock at its admission
  std::vector<BlockId> table;
  std::vector<int32_t> tokens;
  std::vector<KvContentId> content;  // [full blocks]: each one's content id ({} when none)
};

}  // namespace kv_internal

// The revivals the idle history keeps (the latest): enough to learn a workload's pauses, few
// enough that recording one stays cheap in a server that runs for weeks.
inline constexpr size_t kMaxIdleRevivalsKept = 4096;

struct KvManager::State {
  explicit State(const KvManagerOptions& opts, int32_t num_blocks);

  uint64_t Hash(uint64_t parent_hash, std::span<const int32_t> tokens) const;
  std::span<const int32_t> BlockTokens(BlockId block) const {
    return {block_token_ids.data() + static_cast<size_t>(block) * block_tokens,
            static_cast<size_t>(block_tokens)};
  }
  kv_internal::BlockRef RefOf(BlockId block) const { return {block, meta[block].generation}; }
  // How many leading full blocks of `tokens` an admission would reuse (a verified chain through
  // the index); the blocks themselves go to *blocks unless it is null.
  size_t MatchBlocks(std::span<const int32_t> tokens, std::vector<BlockId>* blocks) const;

  // Mutations that keep refcounts, the free list, the index and num_cached in step (see
  // kv_manager.cc). Every operation that changes the pool goes through them.
  // `by_conversation`: an admission that continues a finished sequence's whole chain.
  void RefBlock(BlockId block, bool by_conversation = false);
  void UnrefBlock(BlockId block);
  void Unindex(BlockId block);
  void IndexContent(BlockId block);
  void UnindexContent(BlockId block);
  void AllocateBlock(BlockId block);
  void RegisterFullBlock(const kv_internal::SeqState& seq, size_t k);
  // Speculative decoding: identities of the full blocks within the verified tokens (Commit,
  // TruncateTail).
  void IdentifyFullBlocks(kv_internal::SeqState& seq, int64_t verified_tokens,
                          size_t first_unregistered);
  bool SameIdentity(BlockId a, BlockId b) const;
  // Free of a conversation's turn: its new pages take the record of the pages it continued.
  void InheritChainRecord(const kv_internal::SeqState& seq);
  // Block `block_index` of the present sequence `seq`: its table entry, checked to be a full
  // block other than the last, the only ones that leave the pool and come back while it runs.
  BlockId& PageableEntry(SeqId seq, int64_t block_index);
  kv_internal::BlockRef CanonicalRef(BlockId block) const;
  bool IsStale(BlockId block) const;

  // The reuse forecast of a free cached block (kvl/kv_reuse_forecast.h): an idle page, read
  // again only by a prefix hit, judged by the survival table of the pool's idle blocks.
  KvReuseForecast IdleForecast(BlockId block) const;
  // The next `count` free blocks an allocation takes, skipping those marked in this plan's
  // `epoch` (revived by its prefix hits), into `victims` (its room reserved: no allocation):
  // blocks holding no cached prefix first, then the cached ones in options.idle_block_order.
  // Fewer when fewer are free.
  void TakeOrder(int64_t count, uint64_t epoch, std::vector<BlockId>* victims) const;
  // Gives every idle candidate's idle ancestors a forecast at least as good as its own.
  void LiftParents() const;
  // The block the next single allocation takes (Reattach, AcquireRawBlock), or kNoBlock.
  BlockId NextFreeBlock() const;

  KvManagerOptions options;
  int32_t block_tokens;
  kv_internal::BlockPool pool;
  std::vector<kv_internal::BlockMeta> meta;  // [block]
  std::vector<int32_t> block_token_ids;      // [block][block_tokens], valid when meta.full
  kv_internal::PrefixIndex index;
  // Content id (low 64 bits) -> a block holding that page, whether or not the prefix index can
  // reach it; a hit is confirmed against the block's full id. Lets the KV store find a page
  // that is still in the pool though its chain passes through a tier.
  kv_internal::PrefixIndex content_index;
  int64_t num_cached = 0;                   // free blocks that are indexed
  // Commits so far: the step clock the idle blocks' records and their history count in.
  int64_t clock = 0;
  // The most steps a sequence ran from its admission to its Free (not a preemption): how long a
  // preempted one may wait for running ones to finish.
  int64_t longest_run = 0;
  // Every cached block that went idle and every prefix hit that revived one: how likely an idle
  // block is to be read again after the pause it has had. One history per kind of idle block
  // (their idle_pages() sum to num_cached).
  KvIdleReuseHistory& history(kv_internal::IdleKind kind) {
    return idle_histories[static_cast<size_t>(kind)];
  }
  const KvIdleReuseHistory& history(kv_internal::IdleKind kind) const {
    return idle_histories[static_cast<size_t>(kind)];
  }
  KvIdleReuseHistory idle_histories[kv_internal::kNumIdleKinds] = {
      KvIdleReuseHistory(kMaxIdleRevivalsKept), KvIdleReuseHistory(kMaxIdleRevivalsKept),
      KvIdleReuseHistory(kMaxIdleRevivalsKept)};
  // The kind the blocks that go idle now get: set by Free for its sequence's blocks.
  kv_internal::IdleKind freeing_kind = kv_internal::IdleKind::kOther;
  // Scratch of TakeOrder, reserved for every block.
  struct IdleCandidate {
    KvReuseForecast forecast;
    int32_t rank = 0;  // its place in the free list (least recently freed first)
    BlockId block = kNoBlock;
  };
  mutable std::vector<IdleCandidate> idle_candidates;
  // [block]: its index in idle_candidates, valid where that entry names the block.
  mutable std::vector<int32_t> candidate_of_block;
  mutable std::vector<BlockId> take_order;
  std::vector<uint8_t> raw;                 // [block]: lent out by AcquireRawBlock
  int64_t num_raw = 0;
  int64_t peak_used = 0;  // the most blocks in use at once (NotePeak)
  void NotePeak() { peak_used = std::max<int64_t>(peak_used, pool.num_blocks() - pool.num_free()); }
  std::vector<kv_internal::SeqState> seqs;  // [max_seqs]
  int64_t num_seqs = 0;
  uint64_t version = 1;  // a default KvPlan (version 0) never matches
  int64_t prefix_queries = 0;
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  uint64_t index_changes = 0;  // inserts and erases of `index` (KvManager::index_changes)

  // Plan() is const but needs per-call marks; an epoch number makes clearing them free.
  mutable uint64_t plan_epoch = 0;
  mutable std::vector<uint64_t> block_plan_mark;  // [block]: == epoch when revived by the plan
  mutable std::vector<uint64_t> seq_plan_mark;    // [seq]: == epoch when already in the plan
};

}  // namespace kvl
