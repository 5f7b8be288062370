// A page's life through the door (KvMemory's plans, and each step opened, run and closed as the
// engine does: KvMemory::Open, KvStep::Forward, KvStep::Close), against a small reference
// model, over random steps: random prompts sharing prefixes, chunked prefill, random pressure
// (relief beyond what the step needs), preemptions and resumes, promotions back between steps,
// cancellations, and tier failures (a RAM tier too small for every page, a disk tier whose file
// is corrupted behind its back, so reads fail their checksums). The "forward pass" here writes
// each position's K/V as a function of the tokens up to it and reads every position back in
// every step, so after every step:
//   - every lossless page reads back bit-identical to what was computed for it (in the pool,
//     streamed from a tier, read in place, restored after a preemption or found in the store);
//     a step whose streamed read failed is thrown away and the sequence recomputed, as the
//     engine does, and never counted as read;
//   - every page is in exactly one place: a full page of a running sequence has a pool block iff
//     its fate is resident, it is never awaiting restore once computed, the pager's counts of
//     pages held in tiers are the page tables' counts;
//   - every byte is counted: the pool's used blocks are the distinct blocks of the running
//     sequences' tables, and once every request is done the pool, the pager and (without the
//     KV store, which keeps pages on purpose) every tier hold nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "kvl/kv_memory.h"
#include "tier_test_util.h"

namespace kvl {
namespace {

constexpr int32_t kBlock = 4;
constexpr int64_t kLayers = 2;
constexpr int64_t kKvDim = 4;
constexpr int32_t kMaxSeqs = 4;

class FixedPrices final : public KvPriceSource {
 public:
  Status PagePrices(const Query&, PageCostProfile* prices) override {
    prices->ram_gbps = 10;
    prices->disk_read_gbps = 1;
    prices->disk_write_gbps = 1;
    prices->disk_latency_ms = 0.05;
    prices->recompute_tokens_ms = 1;
    return Status::Ok();
  }
  Status PriceRemoteTier(const TierSpec&, int64_t, int64_t, PageCostProfile*) override {
    return UnimplementedError("no remote tier here");
  }
};

// What the forward pass writes for one position: a function of every token up to it (so a page
// found by prefix or in the store holds exactly these values) and of the layer.
float Expected(uint64_t prefix_hash, int64_t layer, int64_t d, bool v) {
  const uint64_t h = prefix_hash ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(layer + 1));
  const auto byte = static_cast<float>((h >> (8 * d)) & 0xff);
  return byte + static_cast<float>(layer) * 1000.0f + (v ? 0.5f : 0.0f);
}

struct Req {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // every token it will have (prompt, then "generated")
  std::vector<uint64_t> prefix_hash;
  int64_t prompt = 0;
  int64_t known = 0;  // tokens it has so far: the prompt, then one more per completed step
  int64_t computed = 0;
  SeqId slot = -1;
  KvSequencePages pages;
  bool store_checked = false;
  int preemptions = 0;
  bool finished = false;  // within the step being run (KvStepRequest::finished)
};

struct LifeSetup {
  bool prefix_cache = true;
  bool ram_zstd = false;
  int64_t ram_pages = 8;  // RAM tier capacity, in pages of every layer (0: no RAM tier)
  bool corrupt_disk = false;
};

class PageLife {
 public:
  PageLife(uint32_t seed, const LifeSetup& s) : rng_(seed), setup_(s) {
    disk_path_ = TempPath("page_life_" + std::to_string(seed));
    KvMemoryOptions o;
    o.block_tokens = kBlock;
    o.num_layers = kLayers;
    o.kv_dim = kKvDim;
    o.dim = 64;  // wider than K+V: no residual checkpoints
    o.context_length = 256;
    o.max_seqs = kMaxSeqs;
    o.pool_blocks = 14;
    o.staged_pages = 12;
    o.prefix_cache = s.prefix_cache;
    o.policy = ParseKvPolicy("auto").value();
    o.quality = KvQuality::kLossless;
    o.sink_tokens = 0;
    o.recent_tokens = 0;
    const int64_t page_bytes = 2 * kLayers * kBlock * kKvDim * static_cast<int64_t>(sizeof(float));
    if (s.ram_pages > 0) {
      TierSpec ram;
      ram.kind = TierKind::kRam;
      ram.capacity_bytes = s.ram_pages * page_bytes;
      ram.compress = s.ram_zstd;
      o.tiers.push_back(ram);
    }
    TierSpec disk;
    disk.kind = TierKind::kDisk;
    disk.path = disk_path_;
    disk.capacity_bytes = 4 << 20;
    disk.persistent = false;
    o.tiers.push_back(disk);
    FixedPrices prices;
    StatusOr<std::unique_ptr<KvMemory>> memory = KvMemory::Create(o, &prices);
    EXPECT_TRUE(memory.ok()) << memory.status().ToString();
    memory_ = std::move(memory).value();
  }
  ~PageLife() {
    memory_.reset();
    ::unlink(disk_path_.c_str());
  }

  void Submit() {
    auto r = std::make_unique<Req>();
    r->id = next_id_++;
    // A few shared openings, so prefixes are found in the pool and in the store.
    const int32_t opening = static_cast<int32_t>(rng_() % 3);
    const int64_t shared = static_cast<int64_t>(rng_() % 13);
    for (int64_t i = 0; i < shared; ++i)
      r->tokens.push_back(opening * 100 + static_cast<int32_t>(i));
    const int64_t own = 1 + static_cast<int64_t>(rng_() % 14);
    for (int64_t i = 0; i < own; ++i) r->tokens.push_back(1000 + static_cast<int32_t>(rng_() % 50));
    r->prompt = static_cast<int64_t>(r->tokens.size());
    const int64_t generate = 1 + static_cast<int64_t>(rng_() % 24);
    for (int64_t i = 0; i < generate; ++i) r->tokens.push_back(static_cast<int32_t>(rng_() % 50));
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t t : r->tokens) {
      h = (h ^ static_cast<uint64_t>(t)) * 0x100000001b3ull;
      r->prefix_hash.push_back(h);
    }
    r->known = r->prompt;
    waiting_.push_back(std::move(r));
  }

  // One step: plan (relief and preemption until it fits), apply, the forward pass, the checks.
  void Step() {
    memory_->StartStep();
    MaybeCancel();
    if (rng_() % 4 == 0) RandomPressure();
    bool admit = !waiting_.empty() && running_.size() < static_cast<size_t>(kMaxSeqs);
    for (;;) {
      FillSteps(admit);
      if (steps_.empty()) return;
      memory_->PlanStep(steps_, &plan_);
      if (plan_.fits) break;
      const int64_t short_by = plan_.blocks_needed + plan_.blocks_reused_free - plan_.blocks_free;
      if (admit && !running_.empty()) {
        admit = false;
        continue;
      }
      if (Relieve(short_by)) continue;
      if (running_.size() > 1) {
        Preempt(running_.size() - 1);
        admit = false;
        continue;
      }
      // Alone and still too big for the pool: it can never run here.
      Req& r = admit ? *waiting_.front() : *running_.front();
      ++cancelled_;
      if (admit) {
        memory_->ReleaseWaiting(r.pages);
        waiting_.pop_front();
      } else {
        memory_->Release(r.slot);
        FreeSlot(r.slot);
        running_.erase(running_.begin());
      }
      admit = !waiting_.empty() && running_.empty();
    }
    if (admit) {
      std::unique_ptr<Req> r = std::move(waiting_.front());
      waiting_.pop_front();
      r->slot = free_slots_.back();
      free_slots_.pop_back();
      running_.push_back(std::move(r));
    }
    ApplyAndRun();
    CheckPlaces();
    if (rng_() % 3 == 0) Promote();
    CheckPlaces();
    if (setup_.corrupt_disk && rng_() % 6 == 0) CorruptDisk();
  }

  void RunToEnd(int requests) {
    for (int i = 0; i < requests; ++i) Submit();
    for (int step = 0; step < 3000 && (!running_.empty() || !waiting_.empty()); ++step) {
      if (rng_() % 5 == 0 && submitted_more_ < requests) {
        Submit();
        ++submitted_more_;
      }
      Step();
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_TRUE(running_.empty() && waiting_.empty()) << "requests left after 3000 steps";
    CheckEmpty();
  }

  int64_t finished() const { return finished_; }
  int64_t restored_pages() const { return restored_pages_; }
  int64_t failed_reads() const { return failed_reads_; }
  int64_t preempted() const { return preempted_; }
  int64_t promoted_pages() const { return promoted_pages_; }
  int64_t pages_checked() const { return rows_checked_; }

 private:
  void FreeSlot(SeqId slot) { free_slots_.push_back(slot); }

  void FillSteps(bool admit) {
    steps_.clear();
    stepping_.clear();
    const int64_t any = std::numeric_limits<int64_t>::max();
    for (auto& r : running_) {
      if (r->computed >= r->known) continue;
      const int64_t restore = memory_->view().RestorableTokens(r->pages, r->known, r->computed, any);
      const int64_t chunk = 1 + static_cast<int64_t>(rng_() % 8);
      const int64_t n = restore + std::min(r->known - r->computed - restore, chunk);
      steps_.push_back({r->slot,
                        std::span<const int32_t>(r->tokens).subspan(
                            static_cast<size_t>(r->computed), static_cast<size_t>(n)),
                        0, 0, restore});
      stepping_.push_back(r.get());
    }
    if (!admit) return;
    Req& r = *waiting_.front();
    const std::span<const int32_t> known =
        std::span<const int32_t>(r.tokens).first(static_cast<size_t>(r.known));
    const KvAdmission a = memory_->PlanAdmission(known, &r.pages, !r.store_checked, any);
    r.store_checked = true;
    const int64_t attached = a.cached_tokens + a.in_place_blocks * kBlock;
    const int64_t chunk = 1 + static_cast<int64_t>(rng_() % 8);
    const int64_t n =
        attached + a.restore_tokens + std::min(r.known - attached - a.restore_tokens, chunk);
    steps_.push_back({free_slots_.back(), known.first(static_cast<size_t>(n)), a.in_place_blocks, 0,
                      a.restore_tokens});
    stepping_.push_back(&r);
  }

  std::vector<KvPlannedSeq> Planned() const {
    std::vector<KvPlannedSeq> planned;
    for (const auto& r : running_) {
      KvPlannedSeq seq{r->slot, r->id, -1, KvQuality::kLossless};
      seq.known_tokens = r->known;
      planned.push_back(seq);
    }
    return planned;
  }

  bool Relieve(int64_t blocks_short) {
    const std::vector<KvPlannedSeq> planned = Planned();
    const KvPagePlan* relief = memory_->Relieve(planned, blocks_short, Phase::kDecode);
    if (relief == nullptr) return false;
    for (const KvPageAction& a : relief->actions) {
      EXPECT_TRUE(IsLossless(a.action) || !a.applied) << "a lossless request's page went lossy";
    }
    return true;
  }

  void RandomPressure() {
    if (running_.empty()) return;
    Relieve(1 + static_cast<int64_t>(rng_() % 3));
    CheckPlaces();
  }

  void Preempt(size_t index) {
    std::unique_ptr<Req> r = std::move(running_[index]);
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
    memory_->Preempt({r->slot, r->id, -1, KvQuality::kLossless}, r->computed, Phase::kDecode);
    EXPECT_FALSE(memory_->view().Contains(r->slot)) << "a preempted sequence keeps its blocks";
    const int64_t full = r->computed / kBlock;
    FreeSlot(r->slot);
    r->slot = -1;
    r->computed = 0;
    r->store_checked = false;
    ++r->preemptions;
    ++preempted_;
    // Its full pages wait outside the pool: in a tier or dropped, never resident.
    for (int64_t b = 0; b < full && b < static_cast<int64_t>(r->pages.pages.size()); ++b) {
      const KvPage& page = r->pages.pages[static_cast<size_t>(b)];
      EXPECT_TRUE(page.fate == KvPageFate::kDropped || page.awaiting_restore)
          << "a preempted page is neither kept for restore nor dropped";
    }
    waiting_.push_front(std::move(r));
  }

  void MaybeCancel() {
    if (rng_() % 40 != 0) return;
    if (!running_.empty() && rng_() % 2 == 0) {
      const size_t i = rng_() % running_.size();
      memory_->Release(running_[i]->slot);
      FreeSlot(running_[i]->slot);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      ++cancelled_;
    } else if (!waiting_.empty()) {
      const size_t i = rng_() % waiting_.size();
      memory_->ReleaseWaiting(waiting_[i]->pages);
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      ++cancelled_;
    }
  }

  void Promote() {
    const std::vector<KvPlannedSeq> planned = Planned();
    if (memory_->Promote(planned, &promoted_) == 0) return;
    restored_pages_ += static_cast<int64_t>(promoted_.brought_back.size());
    promoted_pages_ += static_cast<int64_t>(promoted_.brought_back.size());
  }

  // One step as the engine runs it: opened, one forward run, the finished requests released,
  // closed, then the sequences whose streamed reads failed preempted.
  void ApplyAndRun() {
    kv_seqs_.clear();
    for (Req* r : stepping_) {
      r->finished = false;
      kv_seqs_.push_back({&r->pages, r->id, -1, r->computed, &r->finished});
    }
    KvStep& step = memory_->Open(plan_, kv_seqs_);
    restored_pages_ += static_cast<int64_t>(step.applied().brought_back.size());
    // The forward pass: per layer, the step's new rows written, then every row read back.
    std::vector<int64_t> mismatches(stepping_.size(), 0);
    row_slots_.clear();
    row_positions_.clear();
    for (size_t i = 0; i < stepping_.size(); ++i) {
      stepping_[i]->computed = step.computed_from(i);
      for (int64_t pos = step.computed_from(i); pos < step.computed_to(i); ++pos) {
        row_slots_.push_back(stepping_[i]->slot);
        row_positions_.push_back(pos);
      }
    }
    const std::span<const SeqId> failed_span =
        step.Forward(row_slots_, row_positions_, [&](KvCache& cache) {
          for (int64_t layer = 0; layer < kLayers; ++layer) {
            cache.BeginLayer(layer);
            for (size_t i = 0; i < stepping_.size(); ++i) {
              Req& r = *stepping_[i];
              for (int64_t pos = r.computed; pos < step.computed_to(i); ++pos) {
                const KvCache::Rows rows = cache.RowsAt(r.slot, layer, pos);
                ASSERT_EQ(rows.kind, KvCache::Rows::Kind::kDense);
                for (int64_t d = 0; d < kKvDim; ++d) {
                  rows.k[d] = Expected(r.prefix_hash[static_cast<size_t>(pos)], layer, d, false);
                  rows.v[d] = Expected(r.prefix_hash[static_cast<size_t>(pos)], layer, d, true);
                }
              }
              for (int64_t pos = 0; pos < step.computed_to(i); ++pos) {
                const KvCache::Rows rows = cache.RowsAt(r.slot, layer, pos);
                if (rows.kind != KvCache::Rows::Kind::kDense) {
                  ++mismatches[i];
                  continue;
                }
                for (int64_t d = 0; d < kKvDim; ++d) {
                  const uint64_t h = r.prefix_hash[static_cast<size_t>(pos)];
                  if (rows.k[d] != Expected(h, layer, d, false) ||
                      rows.v[d] != Expected(h, layer, d, true)) {
                    ++mismatches[i];
                  }
                }
                ++rows_checked_;
              }
            }
          }
        });
    // (Forward threw away what the step wrote for the sequences whose streamed reads failed.)
    const std::set<SeqId> failed(failed_span.begin(), failed_span.end());
    std::vector<Req*> to_recompute;
    for (size_t i = 0; i < stepping_.size(); ++i) {
      Req& r = *stepping_[i];
      r.computed = step.computed_to(i);
      if (failed.count(r.slot)) {
        // A streamed page did not come back intact: the step is thrown away, the sequence
        // recomputed from its tokens (and not from the store that just failed).
        to_recompute.push_back(&r);
        ++failed_reads_;
        continue;
      }
      EXPECT_EQ(mismatches[i], 0) << "request " << r.id << " read rows that differ from what was "
                                  << "computed for them (step " << steps_run_ << ")";
      if (r.computed == r.known && r.known < static_cast<int64_t>(r.tokens.size())) ++r.known;
    }
    ++steps_run_;
    // Finished requests leave (their pages written through to durable tiers), as sampling
    // finishes them before the step closes.
    for (size_t i = 0; i < running_.size();) {
      Req& r = *running_[i];
      if (r.computed == static_cast<int64_t>(r.tokens.size())) {
        r.finished = true;
        memory_->Release(r.slot);
        FreeSlot(r.slot);
        finished_reqs_.push_back(std::move(running_[i]));
        running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
        ++finished_;
        continue;
      }
      ++i;
    }
    // The others file the pages the prefix index cannot reach.
    step.Close({});
    finished_reqs_.clear();
    for (Req* r : to_recompute) {
      for (size_t i = 0; i < running_.size(); ++i) {
        if (running_[i].get() != r) continue;
        Preempt(i);
        waiting_.front()->store_checked = true;
        break;
      }
    }
  }

  // Every page in exactly one place, every pool block counted.
  void CheckPlaces() {
    const KvManager& m = memory_->view().manager();
    const Status invariants = m.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << invariants.ToString();
    std::set<BlockId> blocks;
    int64_t in_tier = 0;
    int64_t checkpointed = 0;
    for (const auto& r : running_) {
      ASSERT_TRUE(m.Contains(r->slot));
      const std::vector<BlockId>& table = m.block_table(r->slot);
      const int64_t full = m.num_tokens(r->slot) / kBlock;
      for (size_t b = 0; b < table.size(); ++b) {
        if (table[b] != kNoBlock) blocks.insert(table[b]);
      }
      for (int64_t b = 0; b < full; ++b) {
        const KvPage page = b < static_cast<int64_t>(r->pages.pages.size())
                                ? r->pages.pages[static_cast<size_t>(b)]
                                : KvPage{};
        const bool in_pool = table[static_cast<size_t>(b)] != kNoBlock;
        EXPECT_EQ(in_pool, page.fate == KvPageFate::kResident)
            << "request " << r->id << " page " << b << ": a pool block and fate "
            << static_cast<int>(page.fate) << " disagree";
        EXPECT_FALSE(page.awaiting_restore)
            << "request " << r->id << " page " << b << " is in its KV and awaiting restore";
        EXPECT_TRUE(page.fate == KvPageFate::kResident || page.fate == KvPageFate::kInTier ||
                    page.fate == KvPageFate::kCheckpointed)
            << "request " << r->id << " page " << b << " has a lossy fate";
        if (page.fate == KvPageFate::kInTier) {
          EXPECT_NE(page.tier, nullptr);
          ++in_tier;
        }
        if (page.fate == KvPageFate::kCheckpointed) ++checkpointed;
      }
    }
    const KvMemoryStats stats = memory_->view().stats();
    EXPECT_EQ(stats.pool.blocks_used - stats.pool.blocks_raw, static_cast<int64_t>(blocks.size()))
        << "pool blocks in use that no running sequence holds";
    EXPECT_EQ(stats.pages.streamed_pages, in_tier);
    EXPECT_EQ(stats.pages.rebuilt_pages, checkpointed);
    EXPECT_EQ(stats.pages.compressed_pages, 0);
    EXPECT_EQ(stats.pages.evicted_pages, 0);
    for (const auto& r : waiting_) {
      for (const KvPage& page : r->pages.pages) {
        EXPECT_TRUE(page.fate == KvPageFate::kResident || page.fate == KvPageFate::kDropped ||
                    (page.awaiting_restore && page.tier != nullptr))
            << "waiting request " << r->id << " holds a page that is neither kept nor dropped";
      }
    }
  }

  void CheckEmpty() {
    const KvMemoryStats stats = memory_->view().stats();
    EXPECT_EQ(stats.pool.blocks_used, 0);
    EXPECT_EQ(stats.pool.num_seqs, 0);
    EXPECT_EQ(stats.pages.streamed_pages, 0);
    EXPECT_EQ(stats.pages.rebuilt_pages, 0);
    if (setup_.prefix_cache) return;  // the KV store keeps finished requests' pages on purpose
    for (const KvTier* tier : memory_->view().tiers()) {
      EXPECT_EQ(tier->stats().pages, 0) << tier->name() << " holds pages nobody owns";
      EXPECT_EQ(tier->stats().bytes_used, 0) << tier->name();
    }
  }

  // Flips a few bytes of the disk tier's file: reads of the pages there fail their checksums.
  void CorruptDisk() {
    const int fd = ::open(disk_path_.c_str(), O_RDWR);
    if (fd < 0) return;
    const off_t size = ::lseek(fd, 0, SEEK_END);
    for (int i = 0; i < 4 && size > 4096; ++i) {
      const off_t at = 4096 + static_cast<off_t>(rng_() % static_cast<uint64_t>(size - 4096));
      char byte = 0;
      if (::pread(fd, &byte, 1, at) == 1) {
        byte = static_cast<char>(byte ^ 0x5A);
        EXPECT_EQ(::pwrite(fd, &byte, 1, at), 1);
      }
    }
    ::close(fd);
  }

  std::mt19937_64 rng_;
  LifeSetup setup_;
  std::string disk_path_;
  std::unique_ptr<KvMemory> memory_;
  std::deque<std::unique_ptr<Req>> waiting_;
  std::vector<std::unique_ptr<Req>> running_;
  std::vector<SeqId> free_slots_ = {3, 2, 1, 0};
  std::vector<KvSeqStep> steps_;
  std::vector<Req*> stepping_;
  std::vector<KvStepRequest> kv_seqs_;
  std::vector<SeqId> row_slots_;
  std::vector<int64_t> row_positions_;
  std::vector<std::unique_ptr<Req>> finished_reqs_;  // released this step, until it closes
  KvPlan plan_;
  KvApplied promoted_;
  int64_t next_id_ = 1;
  int submitted_more_ = 0;
  int64_t steps_run_ = 0;
  int64_t finished_ = 0;
  int64_t cancelled_ = 0;
  int64_t preempted_ = 0;
  int64_t restored_pages_ = 0;
  int64_t promoted_pages_ = 0;
  int64_t failed_reads_ = 0;
  int64_t rows_checked_ = 0;
};

TEST(KvPageLifePropertyTest, EveryLosslessPageReadsBackExactlyAndIsInOnePlace) {
  int64_t finished = 0, restored = 0, failed = 0, preempted = 0, promoted = 0;
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    LifeSetup s;
    s.prefix_cache = seed % 2 == 0;
    s.ram_zstd = seed % 3 == 0;
    // Where the disk is corrupted, it is the only tier: pages go there and come back from it.
    s.corrupt_disk = seed % 4 == 1;
    s.ram_pages = s.corrupt_disk ? 0 : 2 + seed % 7;
    PageLife life(seed, s);
    life.RunToEnd(12);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "seed " << seed;
    finished += life.finished();
    restored += life.restored_pages();
    failed += life.failed_reads();
    preempted += life.preempted();
    promoted += life.promoted_pages();
  }
  // The run went through the lives it is meant to check (not only pages that never left).
  EXPECT_GT(finished, 100);
  EXPECT_GT(preempted, 0);
  EXPECT_GT(restored, 0);
  EXPECT_GT(promoted, 0);  // as the engine promotes: KvMemory::Promote decides when and how many
  EXPECT_GT(failed, 0);
  std::printf(
      "finished %lld, preempted %lld, pages brought back %lld (promoted between steps %lld), "
      "failed reads %lld\n",
      static_cast<long long>(finished), static_cast<long long>(preempted),
      static_cast<long long>(restored), static_cast<long long>(promoted),
      static_cast<long long>(failed));
}

}  // namespace
}  // namespace kvl
