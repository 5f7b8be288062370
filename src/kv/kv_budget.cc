// The one KV budget's split (kvl/kv_budget.h, src/kv/kv_budget_split.h): how it is described,
// the tiers' index, the ram:auto rule and the errors of a split that does not fit.
#include <fmt/format.h>

#include <algorithm>

#include "kv_budget_split.h"
#include "tiers/disk_tier.h"

namespace kvl {
namespace {

std::string Bytes(int64_t n) {
  const double v = static_cast<double>(n);
  if (n >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", v / (1 << 30));
  if (n >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", v / (1 << 20));
  if (n >= (int64_t{1} << 10)) return fmt::format("{:.2f} KiB", v / (1 << 10));
  return fmt::format("{} B", n);
}

// What the budget holds beside the RAM tier and the pool, for an error's text.
std::string CarvedParts(const KvBudgetSplit& s) {
  std::string out;
  if (s.draft_bytes > 0) out += fmt::format(", the draft model's pool {} bytes", s.draft_bytes);
  return out;
}

std::string BudgetName(const KvBudgetSplit& s) {
  return s.given ? fmt::format("--kv-budget {} bytes", s.budget_bytes)
                 : fmt::format("the default KV budget ({} bytes at most)", s.budget_bytes);
}

}  // namespace

std::string KvBudgetSplit::Describe() const {
  return fmt::format(
      "budget {} ({}) = pool {} + ram tier {}{} + staging {} + rings {} + draft {}; beside it a "
      "disk index of {} at most",
      Bytes(budget_bytes), given ? "--kv-budget" : "default", Bytes(pool_bytes),
      Bytes(ram_tier_bytes), ram_tier_auto ? " (auto)" : "", Bytes(staging_bytes),
      Bytes(ring_bytes), Bytes(draft_bytes), Bytes(index_bytes));
}

namespace kv_internal {

int64_t RamTierDramBytes(int64_t capacity_bytes, int64_t layer_page_bytes) {
  if (layer_page_bytes <= 0) return capacity_bytes;
  return capacity_bytes + capacity_bytes / layer_page_bytes * kRamTierBytesPerPage;
}

int64_t RamTierCapacityIn(int64_t dram_bytes, int64_t layer_page_bytes) {
  if (layer_page_bytes <= 0) return dram_bytes;
  // Whole pages with their bookkeeping; what is left over holds no page.
  return dram_bytes / (layer_page_bytes + kRamTierBytesPerPage) * layer_page_bytes;
}

int64_t TierIndexBytes(const std::vector<TierSpec>& tiers, int64_t layer_page_bytes) {
  int64_t bytes = 0;
  for (const TierSpec& spec : tiers) {
    if (spec.kind != TierKind::kDisk || layer_page_bytes <= 0) continue;
    bytes += spec.capacity_bytes / DiskSlotBytes(layer_page_bytes) * kDiskIndexBytesPerSlot;
  }
  return bytes;
}

// On a CPU the pool and a RAM tier are the same DRAM. A page in the pool is read where it lies;
// one in an uncompressed tier is read in place too, but cost a copy to get there and another to
// come back, and a compressed tier holds more pages a byte at a decompression each read. So the
// pool keeps what never leaves it (each running sequence's sinks, recent window and the page it
// writes, with the staging and rings: pool_keep_bytes), and beyond that neither side is always
// right: cached prefixes and new pages want the pool, pages of preempted and finished sequences
// the tier. An even split of the rest starves neither use whatever the workload, and the cost
// model then moves each page to the side its prices choose.
int64_t AutoRamTierBytes(int64_t shared_bytes, int64_t pool_keep_bytes) {
  return std::max<int64_t>(0, shared_bytes - pool_keep_bytes) / 2;
}

Status RamTierDoesNotFit(const KvBudgetSplit& s, int64_t size_bytes, int64_t pool_min_bytes,
                         int64_t block_bytes) {
  const int64_t carved = s.draft_bytes;
  return InvalidArgumentError(fmt::format(
      "--kv-tier ram: the RAM tier's {} bytes do not fit in {}: with its map of pages ({} "
      "bytes) the pool beside it needs at least {} bytes (a KV block of {} bytes with its "
      "staging and rings){}; give --kv-budget at least {} bytes, a smaller RAM tier, or ram:auto "
      "to split the budget",
      size_bytes, BudgetName(s), s.ram_tier_bytes - size_bytes, pool_min_bytes, block_bytes,
      CarvedParts(s), s.ram_tier_bytes + pool_min_bytes + carved));
}

Status CarvedPartsDoNotFit(const KvBudgetSplit& s, int64_t pool_min_bytes) {
  return ResourceExhaustedError(fmt::format(
      "{} leaves the pool {} bytes once it holds{}, and the pool needs at least {}; give "
      "--kv-budget at least {} bytes",
      BudgetName(s), s.budget_bytes - s.draft_bytes, CarvedParts(s).substr(1), pool_min_bytes,
      pool_min_bytes + s.draft_bytes));
}

}  // namespace kv_internal
}  // namespace kvl
