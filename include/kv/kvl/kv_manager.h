// kvlattice's KV memory manager: a pool of fixed-size blocks sized from a byte budget, a block
// table per sequence, a prefix cache over full blocks, and copy-on-write forks. It only does the
// bookkeeping and describes work (which blocks to copy); its owner carries the work out (KvMemory,
// or the speculative draft model's own pool) and the forward pass reads K/V through
// PagedKvCache. Nothing here knows about the model or the forward pass, so it is unit-testable
// with zero model bytes.
//
// Memory is planned, then committed (as llama.cpp's memory interface does): Plan() says what a
// step needs (blocks to allocate, cached blocks to reuse, blocks to copy) without changing
// anything, and Commit() applies exactly that plan. "Not enough blocks" is a normal plan result
// (fits == false) that the caller answers (the engine's scheduler, through KvMemory::PlanStep),
// never an error or a crash.
//
// Blocks (vLLM's block pool):
//  - A block holds K and V of block_tokens consecutive tokens of one sequence for every layer.
//  - Full blocks are immutable and identified by a hash chain: hash(parent block's hash, the
//    block's token ids, model identity). A full block's hash enters the prefix index when its
//    tokens are committed, and stays findable after its last reference goes (lazy eviction) until
//    the block is reused for something else.
//  - Free blocks sit in an intrusive doubly linked list: blocks that hold no cached prefix are
//    taken first (front), then cached ones (back, least recently freed first). Among the cached
//    ones (idle pages of the prefix cache) the reuse forecast chooses (KvIdleBlockOrder): the
//    block least likely to be read again by a prefix hit, judged by the pool's own history of
//    idle blocks and their revivals (kvl/kv_reuse_forecast.h), leaves first. The step clock it
//    counts in is the number of Commits.
//  - A block shared by several sequences (prefix hit or Fork) is copied before a sequence writes
//    into it (copy-on-write); only a partially filled last block can ever be written.
//
// Thread-safety: not thread-safe; its owner (KvMemory) calls it from the step loop. PagedKvCache::RowsAt
// may be called from many threads at once while nothing mutates the manager (during a forward).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kvl/dtype.h"
#include "kvl/kv_cache.h"
#include "kvl/status.h"

namespace kvl {

class KvBlockObserver;  // kvl/kv_block_observer.h

using BlockId = int32_t;
using SeqId = int32_t;
class KvWindowRelease;  // kvl/kv_window_release.h
inline constexpr BlockId kNoBlock = -1;

// Hash of one full block given its parent's hash (model_identity for the first block) and its
// block_tokens token ids. Only tests replace the default (to force collisions).
using KvBlockHashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> tokens);

// What one block holds: K and V, each [num_layers][block_tokens][kv_dim] at the cache's element
// types (f32, f16, bf16, or the block formats q8_0 / q4_0 of kvl/quant.h; -ctk / -ctv), and
// optionally the residual-stream checkpoints of its tokens at every checkpoint_every-th layer
// (layers 0, s, 2s, ...), [checkpoint_layers][block_tokens][residual_dim] f32, from which K and V
// can be rebuilt exactly: a checkpoint layer's directly, the layers after it by running them.
struct KvBlockLayout {
  int32_t block_tokens = 16;
  int64_t num_layers = 0;
  int64_t kv_dim = 0;
  int64_t residual_dim = 0;  // 0: no checkpoints kept
  DType k_type = DType::kF32;
  DType v_type = DType::kF32;
  int64_t checkpoint_every = 1;  // s: checkpoints at layers 0, s, 2s, ... (1: every layer)
  // Where each layer's K/V sits in a block: [layer] -> its index among the block's layers, or -1
  // for a sliding-window layer whose rows a KvWindowRelease ring keeps instead (its K/V in a
  // block, a tier page or the KV store is a scratch layer nobody reads). Empty: every layer, in
  // order. Set by SetWindowedLayers.
  std::vector<int32_t> block_layer = {};

  // Takes the layers `windowed` marks ([layer]) out of the blocks.
  void SetWindowedLayers(const std::vector<bool>& windowed);
  bool in_block(int64_t layer) const {
    return block_layer.empty() || block_layer[static_cast<size_t>(layer)] >= 0;
  }
  // The layers a block holds K/V of.
  int64_t block_layers() const;

  // Layers whose input is kept as a checkpoint: ceil(num_layers / s).
  int64_t checkpoint_layers() const { return (num_layers + checkpoint_every - 1) / checkpoint_every; }
  bool is_checkpoint_layer(int64_t layer) const { return layer % checkpoint_every == 0; }

  int64_t elems_per_tensor() const { return num_layers * block_tokens * kv_dim; }
  // One token's K (or V) row of one layer: kv_dim elements, or kv_dim / 32 blocks of 32 with one
  // scale each for q8_0 / q4_0 (kv_dim a multiple of 32; KvManager::Create checks).
  int64_t k_row_bytes() const { return RowBytes(k_type, kv_dim); }
  int64_t v_row_bytes() const { return RowBytes(v_type, kv_dim); }
  // K (or V) rows of one layer of one block.
  int64_t layer_k_bytes() const { return block_tokens * k_row_bytes(); }
  int64_t layer_v_bytes() const { return block_tokens * v_row_bytes(); }
  int64_t residual_floats() const { return checkpoint_layers() * block_tokens * residual_dim; }
  int64_t kv_bytes() const { return block_layers() * (layer_k_bytes() + layer_v_bytes()); }
  int64_t residual_bytes() const { return residual_floats() * static_cast<int64_t>(sizeof(float)); }
  int64_t block_bytes() const { return kv_bytes() + residual_bytes(); }
};

// A full block's content identity: a 128-bit hash chain (XXH3-128) over the model identity and
// every token from the sequence's start to the block's end. Lossless paths are bit-exact, so two
// blocks with the same id hold the same K/V bytes wherever they are: it is the key the KV store
// files a page under in every tier, across requests, restarts and processes. {0, 0}: no identity
// (a partial block, or one computed while part of its context was lossy).
struct KvContentId {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool valid() const { return (lo | hi) != 0; }
  bool operator==(const KvContentId&) const = default;
};
// The id of a block given its parent's ({} for the first block) and its tokens.
KvContentId ChainContentId(KvContentId parent, std::span<const int32_t> tokens,
                           uint64_t model_identity);

// The cache element types -ctk / -ctv name: f32, f16, bf16, q8_0, q4_0, or the rotated q8_0r,
// q4_0r (kvl/dtype.h).
StatusOr<DType> ParseKvCacheType(std::string_view text);


// The order free cached blocks (idle prefix-cache pages) are reused in.
enum class KvIdleBlockOrder {
  // The reuse forecast's (KvPageLeavesFirst over ForecastReuse of each idle block): the one read
  // again farthest ahead, then the least likely; ties to the deeper block of its chain, then the
  // least recently freed.
  kForecast,
  kLeastRecentlyFreed,  // as vLLM's block pool (the comparison in `kvl bench replay`)
};

struct KvManagerOptions {
  KvBlockLayout layout;
  int64_t budget_bytes = 512ll << 20;  // the pool holds budget_bytes / block_bytes blocks
  uint64_t model_identity = 0;         // seeds every hash chain: no match across models
  bool enable_prefix_cache = true;
  KvIdleBlockOrder idle_block_order = KvIdleBlockOrder::kForecast;
  int32_t max_seqs = 256;              // sequence ids are 0..max_seqs-1
  // The most tokens one sequence is expected to hold (the engine's max context). An admission
  // reserves its sequence's block table and token list for that many, so the decode steps that
  // follow never grow them (no heap allocation in the per-token step). 0: they grow as needed.
  int64_t max_seq_tokens = 0;
  // Test-only: replaces the block hash, e.g. with one that always collides, to show that a hit is
  // verified by content and never trusted from the hash alone. nullptr: the built-in 64-bit hash.
  KvBlockHashFn block_hash_for_testing = nullptr;
  // Told of every prefix-index change (kvl/kv_block_observer.h); not owned. nullptr: no one.
  KvBlockObserver* block_observer = nullptr;
};

// One sequence's part of a step.
//  - For a sequence not yet in the manager (admission): `tokens` are its first tokens (a prompt,
//    or prompt + generated tokens when a preempted sequence comes back). The plan reuses the
//    longest cached prefix of full blocks (never all of `tokens`: the last token is always
//    computed, so the step has logits to sample from) and allocates blocks for the rest.
//  - For a sequence already present: `tokens` are appended after its current tokens.
struct KvSeqStep {
  SeqId seq = 0;
  std::span<const int32_t> tokens;
  // Admission only: right after the cached prefix, this many full blocks stay outside the pool
  // (pages read where a tier holds them): holes in the block table from the start, taking no
  // block, as if detached losslessly. Never the block holding the last token.
  int64_t in_place_blocks = 0;
  // Speculative decoding (issue 26): the last `unverified` tokens are a draft the step checks.
  // Their K/V is written, but a block holding any of them gets no identity (content id, prefix
  // index) until TruncateTail says how many were verified.
  int64_t unverified = 0;
  // The first `restore_tokens` of `tokens` (whole pages) are not computed: pages kept at a
  // preemption or found in the KV store are promoted into their blocks (KvMemory::Apply). The
  // manager only carries the number through to the plan.
  int64_t restore_tokens = 0;
};

struct KvBlockCopy {
  BlockId src = kNoBlock;
  BlockId dst = kNoBlock;
};

// Everything Commit will do, decided without mutating anything.
struct KvPlan {
  struct SeqPlan {
    SeqId seq = 0;
    bool admit = false;               // the sequence enters the manager with this step
    int64_t first_new_pos = 0;        // position of the first token the forward pass must compute
    int64_t num_cached_tokens = 0;    // admission: leading tokens found in the prefix cache
    std::vector<BlockId> reused;      // admission: cached blocks taken (refcount + 1)
    int64_t in_place_blocks = 0;      // admission: holes after them (KvSeqStep::in_place_blocks)
    int64_t restore_tokens = 0;       // KvSeqStep::restore_tokens: promoted, not computed
    std::vector<BlockId> allocated;   // fresh blocks appended to the block table, in order
    BlockId cow_src = kNoBlock;       // the shared last block that is replaced by a copy...
    BlockId cow_dst = kNoBlock;       // ...into this fresh block (also listed in `copies`)
    int64_t blocks_needed = 0;        // fresh blocks this sequence takes: allocated + the COW copy
    std::vector<int32_t> tokens;      // the step's tokens (a copy: Commit appends these)
    int64_t unverified = 0;           // KvSeqStep::unverified (speculative decoding)
  };

  bool fits = false;                  // false: not enough blocks; Commit must not be called
  int64_t blocks_needed = 0;          // fresh blocks the plan takes from the free list
  int64_t blocks_free = 0;            // free blocks (cached or not) when planned
  // Free cached blocks that prefix hits revive; they leave the free list too, so the plan fits
  // iff blocks_needed + blocks_reused_free <= blocks_free.
  int64_t blocks_reused_free = 0;
  // One per KvSeqStep, same order. When fits is false, `allocated`, `cow_dst` and `copies` are
  // left empty; everything else (blocks_needed included) is filled in.
  std::vector<SeqPlan> seqs;
  std::vector<KvBlockCopy> copies;    // the owner copies these (src -> dst) before the forward
  uint64_t state_version = 0;         // Commit checks the manager has not changed since
};

struct KvStats {
  int64_t blocks_total = 0;
  int64_t blocks_used = 0;     // referenced by at least one sequence
  int64_t blocks_free = 0;     // total - used (includes cached ones)
  int64_t blocks_cached = 0;   // free blocks still findable by prefix
  int64_t blocks_raw = 0;      // lent out (compressed-page slabs), included in blocks_used
  int64_t kv_bytes_used = 0;   // blocks_used * block_bytes
  int64_t kv_bytes_total = 0;
  int64_t blocks_used_peak = 0;  // the most blocks ever in use at once
  int64_t kv_bytes_peak = 0;     // blocks_used_peak * block_bytes
  int64_t prefix_queries = 0;  // admissions that looked up the prefix cache
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t num_seqs = 0;
};

class KvManager {
 public:
  // INVALID_ARGUMENT when the layout is empty; RESOURCE_EXHAUSTED when the budget holds no block.
  static StatusOr<std::unique_ptr<KvManager>> Create(const KvManagerOptions& options);
  ~KvManager();

  const KvManagerOptions& options() const;
  int64_t num_blocks() const;

  // Leading tokens of `tokens` that an admission would find cached (a multiple of block_tokens,
  // at most tokens.size() - 1). No mutation.
  int64_t MatchPrefix(std::span<const int32_t> tokens) const;
  // Whether an admission of `tokens` beside `admitted` (a step's admissions so far) would compute
  // a whole page that one of them computes in the same step: a page the pool does not hold yet,
  // which each would compute into a block of its own, and which it finds cached if it is admitted
  // a step later (the engine's scheduler waits so; `kvl bench replay` replays it so). No mutation.
  bool SharesPagesComputedInStep(std::span<const int32_t> tokens,
                                 std::span<const KvSeqStep> admitted) const;
  // The content ids of the first `num_blocks` full blocks of `tokens` (the chain an admission of
  // those tokens would give them), into *out.
  void ContentChain(std::span<const int32_t> tokens, int64_t num_blocks,
                    std::vector<KvContentId>* out) const;

  // Fills *out with the plan for `steps`, reusing its vectors (those of its SeqPlans too): once a
  // plan object has seen a step of the same shape, planning it again allocates nothing. What *out
  // held before is discarded.
  void Plan(std::span<const KvSeqStep> steps, KvPlan* out) const;
  // The same into a fresh KvPlan (allocates; fine outside the per-token step).
  KvPlan Plan(std::span<const KvSeqStep> steps) const;
  // Applies a plan with fits == true made against the current state (both checked).
  void Commit(const KvPlan& plan);

  // Drops a sequence (finished, cancelled or preempted): its blocks lose a reference; blocks
  // nobody holds become free, cached full blocks stay findable until reused. `resumes`: it was
  // preempted and comes back (its blocks are read again at its resume, so the reuse forecast
  // keeps them over a finished request's); otherwise its last full block ends a chain, and a
  // request whose prefix hit takes that chain whole is a conversation's next turn (its blocks
  // are judged by the conversations' history once it finishes).
  void Free(SeqId seq, bool resumes = false);
  // Makes `child` share all of `parent`'s blocks (copy-on-write). `child` must be absent, and
  // `parent` must not be paged.
  void Fork(SeqId parent, SeqId child);
  // Cuts `seq` back to its first `num_tokens` tokens (a multiple of the block size, at most its
  // length): the blocks after them lose this sequence's reference, as in Free. A session a new
  // request continues only as far as their tokens agree (Scheduler's lossy sessions).
  void Truncate(SeqId seq, int64_t num_tokens);
  // Speculative decoding's rollback (issue 26): `seq` keeps its first `num_tokens` tokens (any
  // count, at least the tokens it had before the draft), the rejected draft tokens after them
  // are cut off (blocks past them freed, the last block shortened), and the full blocks within
  // the verified tokens get their identity (content id, prefix index) as a Commit gives it.
  void TruncateTail(SeqId seq, int64_t num_tokens);

  // Paging a running sequence (the action lattice on live pages). Block `block_index` of `seq`,
  // a full block other than the last, leaves the pool while the sequence goes on: its reference
  // is dropped (a block others share stays theirs; a cached one stays findable) and the table
  // entry becomes kNoBlock. The pager keeps the page elsewhere (compressed, in a slower tier, or
  // nowhere when evicted). A sequence with such a hole is "paged". `lossless`: the page's exact
  // bytes stay readable (a tier, checkpoints), so blocks filled later keep their identity (their
  // content id; in the prefix index too when their parent is still in the pool). Otherwise the
  // sequence becomes lossy: blocks filled from then on get no identity, because what was
  // computed against a lossy context is not what the index promises for those tokens.
  void Detach(SeqId seq, int64_t block_index, bool lossless = false);
  // The inverse of a lossless Detach while the sequence goes on: hole `block_index` of `seq` is
  // filled with a block taken from the free list (next_free_block(); a cached prefix it held is
  // evicted) for the caller to put the page's exact bytes in. It has no identity until
  // RestoreIdentity: a read that fails leaves it with bytes nobody may find, and a Detach gives
  // it back. The sequence stays paged (blocks filled while the page was out keep no identity).
  // kNoBlock, and nothing changes, when no block is free.
  BlockId Reattach(SeqId seq, int64_t block_index);
  // The reattached block `block_index` of `seq` holds the page's exact bytes again: it gets the
  // identity the page left with (its content id, and its place in the prefix index when its
  // parent is in the pool). Nothing, for a page that left without one (computed against a lossy
  // context, or after a failed read).
  void RestoreIdentity(SeqId seq, int64_t block_index);
  // The block the next allocation (Reattach, AcquireRawBlock) takes, or kNoBlock when none is
  // free: an uncached free block, else the idle cached block the forecast gives up first.
  BlockId next_free_block() const;
  bool IsPaged(SeqId seq) const;
  // The step that filled blocks [first_block, ...) of `seq` was thrown away (a page it read did
  // not come back intact): those blocks lose their identity (prefix index, content id), and the
  // sequence counts as lossy, so nothing computed from them is ever found by another request.
  void DropIdentity(SeqId seq, int64_t first_block);
  // Some page left without its exact bytes kept: blocks filled since have no identity.
  bool IsLossy(SeqId seq) const;
  // Block `block_index` of `seq`'s content id ({} when it has none).
  KvContentId ContentOf(SeqId seq, int64_t block_index) const;
  // A free block's content id and tokens, when it holds a full page with an identity: what a
  // reuse of the block is about to overwrite ({} otherwise, and for blocks in use).
  KvContentId FreeBlockContent(BlockId block) const;
  // A block of the pool holding the page with this content id (in use or cached, reachable by
  // the prefix index or not), or kNoBlock. Valid until the next Commit.
  BlockId FindContent(KvContentId id) const;
  std::span<const int32_t> BlockTokens(BlockId block) const;
  // A block whose K/V was promoted without its residual checkpoints (they hold stale values):
  // recorded with the block until it is reused, so every sequence that shares it knows.
  void MarkCheckpointsMissing(BlockId block);
  bool CheckpointsMissing(BlockId block) const;
  // Changes with every mutation: plans (KvPlan, KvPagePlan) record it and are refused when stale.
  uint64_t state_version() const;
  // How many sequences hold a block (0: free).
  int32_t refcount(BlockId block) const;

  // Blocks lent out of the pool for other uses (slabs of compressed pages): taken from the free
  // list like an allocation, counted as used, invisible to sequences. kNoBlock when none is free.
  BlockId AcquireRawBlock();
  void ReleaseRawBlock(BlockId block);

  bool Contains(SeqId seq) const;
  int64_t num_tokens(SeqId seq) const;
  const std::vector<BlockId>& block_table(SeqId seq) const;
  const std::vector<int32_t>& tokens(SeqId seq) const;
  // Blocks a sequence of n tokens occupies.
  int64_t BlocksFor(int64_t num_tokens) const;

  KvStats stats() const;
  // Every hash of the prefix index into *out (its room reserved once: no allocation after the
  // first call), and how many times the index has changed so far (a cheap "did it change").
  void IndexedHashes(std::vector<uint64_t>* out) const;
  uint64_t index_changes() const;
  // Cross-checks every internal invariant (refcounts, free list, prefix index, tables); used by
  // the property tests. Returns a description of the first violation.
  Status CheckInvariants() const;

 private:
  KvManager() = default;
  struct State;
  std::unique_ptr<State> s_;
};

// The pool's storage, one contiguous, 64-byte aligned region per block:
//   [layer]{K [token][kv_dim], V [token][kv_dim]} (at k_type / v_type), then the residual
//   checkpoints [checkpoint layer][token][residual_dim] f32 when kept. A layer's K and V rows are adjacent,
//   so one layer of a page moves to or from a tier as one contiguous span, with no staging copy.
// A block lent out raw (KvManager::AcquireRawBlock) is block_bytes of plain memory.
class KvBlockStorage {
 public:
  static StatusOr<std::unique_ptr<KvBlockStorage>> Create(const KvBlockLayout& layout,
                                                          int64_t num_blocks);
  // [block_tokens][kv_dim] of the layer, as bytes of the cache type; keys() / values() are the
  // same rows as floats and require the f32 type.
  uint8_t* key_bytes(BlockId block, int64_t layer);
  uint8_t* value_bytes(BlockId block, int64_t layer);
  float* keys(BlockId block, int64_t layer);
  float* values(BlockId block, int64_t layer);
  // [block_tokens][residual_dim] of a checkpoint layer (checked); a block's checkpoint layers are
  // contiguous. nullptr without checkpoints.
  float* residuals(BlockId block, int64_t layer);
  uint8_t* bytes(BlockId block);  // the whole block, block_bytes
  void CopyBlock(BlockId src, BlockId dst);
  const KvBlockLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }

 private:
  KvBlockStorage(const KvBlockLayout& layout, int64_t num_blocks);
  struct FreeAligned {
    void operator()(uint8_t* p) const;
  };
  KvBlockLayout layout_;
  int64_t num_blocks_;
  std::unique_ptr<uint8_t[], FreeAligned> data_;
  // One layer's K then V rows handed out for every windowed layer of every block (a page's
  // local layers written to or read from a tier land here; nothing reads them for attention).
  std::vector<uint8_t> windowed_scratch_;
};

// Rows of one layer of a block from row `offset` on, K at `k` and V at `v` (bytes laid out as the
// layout's cache types say).
KvCache::Rows DenseRows(const KvBlockLayout& layout, uint8_t* k, uint8_t* v, int64_t offset);

// Where the pages that left the pool live, for PagedKvCache: KvPager implements it.
class KvDetachedPages {
 public:
  virtual ~KvDetachedPages() = default;
  // Rows of block `block_index` of `seq` from row `offset` on (to the block's end).
  virtual KvCache::Rows RowsAt(int32_t seq, int64_t block_index, int64_t layer,
                               int64_t offset) = 0;
  // KvCache::BeginLayer.
  virtual KvLayerRebuild BeginLayer(int64_t layer) = 0;
  virtual float* AttentionMass(int32_t seq) = 0;
};

// The forward pass's view of the paged pool: rows of (seq, layer, pos) found through the block
// table; a detached block (a hole in the table) is asked of `detached`. A run of rows never
// crosses a block boundary.
class PagedKvCache final : public KvCache {
 public:
  PagedKvCache(const KvManager& manager, KvBlockStorage& storage,
               KvDetachedPages* detached = nullptr);
  // The ring that holds the windowed layers' rows (KvBlockLayout::block_layer), set before the
  // first step where the layout has any.
  void set_window(KvWindowRelease* window) { window_ = window; }
  int64_t kv_dim() const override;
  int64_t num_layers() const override;
  bool keys_rotated() const override;
  bool values_rotated() const override;
  Rows RowsAt(int32_t seq, int64_t layer, int64_t pos) override;
  float* ResidualAt(int32_t seq, int64_t layer, int64_t pos) override;
  KvLayerRebuild BeginLayer(int64_t layer) override;
  float* AttentionMass(int32_t seq) override;
  void set_detached_pages(KvDetachedPages* detached) { detached_ = detached; }

 private:
  const KvManager& manager_;
  KvBlockStorage& storage_;
  KvDetachedPages* detached_;
  KvWindowRelease* window_ = nullptr;
};

}  // namespace kvl
