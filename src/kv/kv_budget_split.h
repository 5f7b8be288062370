// The parts of the one KV budget's split that need no pool (kvl/kv_budget.h): the tiers' index,
// the ram:auto rule, and the error of a RAM tier that does not fit. KvMemory::CreatePool decides
// the split with them (private to the kv layer).
#pragma once

#include <cstdint>
#include <vector>

#include "kvl/kv_budget.h"
#include "kvl/kv_tier.h"
#include "kvl/status.h"

namespace kvl::kv_internal {

// What a disk tier's index holds in DRAM per slot: its hash map's node (the key, the slot's
// number, checksum and generation, its place in the LRU list, the node's own pointers and hash)
// and bucket, and the LRU list's node. An estimate from libstdc++'s layouts, on the high side.
inline constexpr int64_t kDiskIndexBytesPerSlot = 128;

// What a RAM tier holds in DRAM per page beside the page's bytes: its map's node (the key, the
// page's vector, checksum and flags, its place in the LRU list, the node's pointer and hash) and
// bucket, the LRU list's node, and the allocator's header of the page's bytes. An estimate from
// libstdc++'s and glibc's layouts, on the high side: 8% of a 2 KiB page (stories260K), 1% of
// TinyLlama's 16 KiB.
inline constexpr int64_t kRamTierBytesPerPage = 168;

// The DRAM a RAM tier of `capacity_bytes` of pages takes with its bookkeeping (pages of
// `layer_page_bytes`), and the capacity whose pages and bookkeeping fit in `dram_bytes`.
int64_t RamTierDramBytes(int64_t capacity_bytes, int64_t layer_page_bytes);
int64_t RamTierCapacityIn(int64_t dram_bytes, int64_t layer_page_bytes);

// The most the tiers' index holds in DRAM: a disk tier's slot map when every slot is used
// (pages of `layer_page_bytes`). Not carved from the budget (KvBudgetSplit::index_bytes). A RAM
// tier's map of its pages (about 100 bytes a page) is not counted; a Redis server's index is the
// server's.
int64_t TierIndexBytes(const std::vector<TierSpec>& tiers, int64_t layer_page_bytes);

// ram:auto: the RAM tier's share of `shared_bytes` (what the pool side and the tier split),
// where the pool keeps at least `pool_keep_bytes`.
int64_t AutoRamTierBytes(int64_t shared_bytes, int64_t pool_keep_bytes);

// INVALID_ARGUMENT: a ram:SIZE (`size_bytes`; split.ram_tier_bytes with its bookkeeping) that
// leaves the pool less than `pool_min_bytes`, naming the tier's size and the budget
// (split.budget_bytes), and what else the budget holds.
Status RamTierDoesNotFit(const KvBudgetSplit& split, int64_t size_bytes, int64_t pool_min_bytes,
                         int64_t block_bytes);

// RESOURCE_EXHAUSTED: a --kv-budget the draft pool leaves too little of.
Status CarvedPartsDoNotFit(const KvBudgetSplit& split, int64_t pool_min_bytes);

}  // namespace kvl::kv_internal
