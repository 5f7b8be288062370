// KvManager::CheckInvariants: recomputes everything the manager keeps incrementally (refcounts,
// the free list, the prefix index, the block tables) from scratch and compares. The property
// tests call it after every operation.
#include <fmt/format.h>

#include <algorithm>

#include "kv_manager_state.h"
#include "kvl/kv_manager.h"

namespace kvl {

Status KvManager::CheckInvariants() const {
  const State& s = *s_;
  const int32_t num_blocks = s.pool.num_blocks();
  const size_t bt = static_cast<size_t>(s.block_tokens);

  // Refcounts equal the table entries that reference each block, over all sequences.
  std::vector<int32_t> expected_refs(static_cast<size_t>(num_blocks), 0);
  int64_t num_present = 0;
  for (SeqId id = 0; id < s.options.max_seqs; ++id) {
    const kv_internal::SeqState& seq = s.seqs[id];
    if (!seq.present) {
      if (!seq.table.empty() || !seq.tokens.empty()) {
        return InternalError(fmt::format("absent seq {} still has blocks or tokens", id));
      }
      continue;
    }
    ++num_present;
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    if (n == 0) return InternalError(fmt::format("seq {} has no tokens", id));
    if (static_cast<int64_t>(seq.table.size()) != BlocksFor(n)) {
      return InternalError(fmt::format("seq {}: {} tokens in {} blocks, expected {}", id, n,
                                       seq.table.size(), BlocksFor(n)));
    }
    uint64_t chain_hash = s.options.model_identity;
    for (size_t k = 0; k < seq.table.size(); ++k) {
      const BlockId block = seq.table[k];
      if (block == kNoBlock) {
        // A detached page: only a full block other than the last, only in a paged sequence.
        if (!seq.paged || k + 1 >= seq.table.size()) {
          return InternalError(fmt::format("seq {}: block #{} detached wrongly", id, k));
        }
        chain_hash = s.Hash(chain_hash, std::span(seq.tokens).subspan(k * bt, bt));
        continue;
      }
      if (block < 0 || block >= num_blocks) {
        return InternalError(fmt::format("seq {} block {} has bad id {}", id, k, block));
      }
      ++expected_refs[block];
      const kv_internal::BlockMeta& m = s.meta[block];
      // (Blocks holding unverified draft tokens are not full yet: speculative decoding.)
      const bool full =
          (k + 1) * bt <= seq.tokens.size() - static_cast<size_t>(seq.unverified);
      if (!full) {
        // A partial block can still be written, so it must not be findable by prefix.
        if (m.full || m.indexed) {
          return InternalError(fmt::format("seq {}: partial block {} has an identity", id, block));
        }
        continue;
      }
      const std::span<const int32_t> tokens = std::span(seq.tokens).subspan(k * bt, bt);
      const uint64_t hash = s.Hash(chain_hash, tokens);
      if (!m.full && seq.paged) {
        // Filled after the sequence became paged: deliberately without an identity.
        if (m.indexed) return InternalError(fmt::format("seq {}: block {} indexed", id, block));
        chain_hash = hash;
        continue;
      }
      if (!m.full || m.hash != hash || m.parent_hash != chain_hash) {
        return InternalError(
            fmt::format("seq {}: full block {} (#{}) has a wrong hash", id, block, k));
      }
      const auto held = s.BlockTokens(block);
      if (!std::equal(tokens.begin(), tokens.end(), held.begin())) {
        return InternalError(fmt::format(
            "seq {}: block {} (#{}) holds other tokens than the sequence", id, block, k));
      }
      // A live parent instance must hold the sequence's previous block.
      const kv_internal::BlockRef& parent = m.parent;
      if (k == 0 ? parent != kv_internal::BlockRef{} : parent.block == kNoBlock) {
        return InternalError(
            fmt::format("seq {}: block {} (#{}) has a wrong parent", id, block, k));
      }
      if (k > 0 && s.meta[parent.block].generation == parent.generation) {
        const auto parent_tokens = s.BlockTokens(parent.block);
        if (!s.meta[parent.block].full || s.meta[parent.block].hash != chain_hash ||
            !std::equal(parent_tokens.begin(), parent_tokens.end(),
                        seq.tokens.begin() + (k - 1) * bt)) {
          return InternalError(
              fmt::format("seq {}: block {} (#{}) chains to a different prefix", id, block, k));
        }
      }
      chain_hash = hash;
    }
  }
  if (num_present != s.num_seqs) {
    return InternalError(
        fmt::format("{} sequences present, counter says {}", num_present, s.num_seqs));
  }
  int64_t num_raw = 0;
  for (BlockId b = 0; b < num_blocks; ++b) {
    if (s.raw[b]) {
      ++expected_refs[b];
      ++num_raw;
    }
  }
  if (num_raw != s.num_raw) {
    return InternalError(fmt::format("{} raw blocks, counter says {}", num_raw, s.num_raw));
  }
  for (BlockId b = 0; b < num_blocks; ++b) {
    if (s.pool.refcount(b) != expected_refs[b]) {
      return InternalError(fmt::format("block {}: refcount {} but {} table entries", b,
                                       s.pool.refcount(b), expected_refs[b]));
    }
  }
  KVL_RETURN_IF_ERROR(s.pool.CheckFreeList());

  // Every index entry names a block that holds exactly what it was registered with.
  int64_t num_indexed = 0, num_cached = 0;
  Status entries;
  s.index.ForEach([&](uint64_t hash, BlockId block) {
    if (!entries.ok()) return;
    if (block < 0 || block >= num_blocks) {
      entries = InternalError(fmt::format("index maps {:#x} to bad block {}", hash, block));
      return;
    }
    const kv_internal::BlockMeta& m = s.meta[block];
    if (!m.indexed || !m.full || m.hash != hash ||
        s.Hash(m.parent_hash, s.BlockTokens(block)) != hash) {
      entries = InternalError(
          fmt::format("index maps {:#x} to block {} holding something else", hash, block));
    }
  });
  KVL_RETURN_IF_ERROR(entries);
  for (BlockId b = 0; b < num_blocks; ++b) {
    if (!s.meta[b].indexed) continue;
    ++num_indexed;
    // An entry a lookup cannot reach (a broken probe chain) is as good as missing.
    if (s.index.Find(s.meta[b].hash) != b) {
      return InternalError(fmt::format("block {} is indexed but its hash does not find it", b));
    }
    if (s.pool.refcount(b) == 0) ++num_cached;
  }
  if (num_indexed != static_cast<int64_t>(s.index.size())) {
    return InternalError(
        fmt::format("{} blocks flagged indexed, index has {}", num_indexed, s.index.size()));
  }
  if (num_cached != s.num_cached) {
    return InternalError(
        fmt::format("{} cached free blocks, counter says {}", num_cached, s.num_cached));
  }
  // Every idle cached block is one idle page of the reuse forecast's histories (the one of its
  // kind), and no other.
  int64_t idle_pages = 0;
  for (const KvIdleReuseHistory& h : s.idle_histories) idle_pages += h.idle_pages();
  if (idle_pages != s.num_cached) {
    return InternalError(fmt::format("{} idle pages in the reuse histories, {} cached free blocks",
                                     idle_pages, s.num_cached));
  }
  // The forecast's order never gives up an idle block before an idle child that a prefix walk
  // can still reach through it (State::LiftParents): the next block taken is no such parent.
  if (s.options.idle_block_order == KvIdleBlockOrder::kForecast) {
    const BlockId next = s.NextFreeBlock();
    if (next != kNoBlock && s.meta[next].indexed && !s.IsStale(next)) {
      for (BlockId b = 0; b < num_blocks; ++b) {
        const kv_internal::BlockMeta& m = s.meta[b];
        if (b == next || !m.indexed || s.pool.refcount(b) != 0 || s.IsStale(b)) continue;
        if (m.parent == s.RefOf(next)) {
          return InternalError(fmt::format(
              "idle block {} is taken next though its idle child {} can still be found", next, b));
        }
      }
    }
  }
  if (!s.options.enable_prefix_cache && num_indexed != 0) {
    return InternalError("prefix cache disabled but the index is not empty");
  }

  // Eviction order: uncached free blocks all come before cached ones.
  bool seen_cached = false;
  for (BlockId b = s.pool.free_front(); b != kNoBlock; b = s.pool.next_free(b)) {
    if (s.meta[b].indexed) {
      seen_cached = true;
    } else if (seen_cached) {
      return InternalError(fmt::format("uncached free block {} sits behind a cached one", b));
    }
  }

  const KvStats st = stats();
  if (st.blocks_used + st.blocks_free != st.blocks_total) {
    return InternalError("used + free != total blocks");
  }
  if (st.kv_bytes_used > s.options.budget_bytes) {
    return InternalError(
        fmt::format("{} KV bytes used, budget {}", st.kv_bytes_used, s.options.budget_bytes));
  }
  return Status::Ok();
}

}  // namespace kvl
