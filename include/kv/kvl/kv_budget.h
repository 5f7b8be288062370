// The one KV budget (--kv-budget) and how it splits. The budget bounds every byte of KV state the
// process holds in DRAM, whatever holds it: the paged pool (residual checkpoints and compressed
// slabs live in its blocks), a RAM tier's pages (compressed or not), the pager's staging, the
// sliding-window rings and the draft model's pool (a disk tier's index is counted beside it, see
// index_bytes). On a CPU the pool
// and a RAM tier are the same memory: a tier outside the budget would make demoting free, so it
// is carved from the budget like the rest. KvMemory decides the split (src/kv/kv_budget.cc).
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>

namespace kvl {

struct KvBudgetSplit {
  int64_t budget_bytes = 0;    // the whole budget in effect: given, or the default
  bool given = false;          // --kv-budget was given (else the default, see KvMemoryOptions)
  int64_t pool_bytes = 0;      // the pool's blocks
  // A RAM tier's DRAM: its capacity (pages, compressed or not) and its map of them.
  int64_t ram_tier_bytes = 0;
  bool ram_tier_auto = false;  // ram:auto: the size was chosen from the budget
  int64_t staging_bytes = 0;   // the pager's buffers for pages streamed, rebuilt or compressed
  int64_t ring_bytes = 0;      // the sliding-window layers' rings
  // A disk tier's slot index in DRAM when every slot is used (about 128 bytes a slot: 1.5% of
  // the tier's bytes at 8 KiB slots). Counted in what the engine holds (kv_held_bytes) as it
  // grows, but not carved from the budget: a 64 MiB disk tier's index alone would take a
  // 1 MiB budget, and the budget is for the pages.
  int64_t index_bytes = 0;
  int64_t draft_bytes = 0;     // the draft model's pool (--spec draft)
  // What the carved parts add up to (at most budget_bytes: the pool is cut in whole blocks).
  int64_t total() const {
    return pool_bytes + ram_tier_bytes + staging_bytes + ring_bytes + draft_bytes;
  }
  // "budget 4.00 MiB (given) = pool 2.50 MiB + ram tier 1.00 MiB + staging ... + draft 0 B".
  std::string Describe() const;
};

}  // namespace kvl
