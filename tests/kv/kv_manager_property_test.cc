// Property test: long random operation sequences (admit, append, multi-sequence steps, fork,
// free, fills that run out of blocks) applied to KvManager and to a reference model in which a
// sequence is a plain vector of tokens. After every operation the manager's invariants, the
// reference's tokens and the K/V contents read through PagedKvCache must agree. The K/V check is
// what catches sharing bugs: every row holds a value derived from the tokens up to its position,
// written as the forward pass would (after the plan's copies), so a block wrongly shared, reused
// or not copied on write shows up as a wrong value in some sequence.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "kv/pool/block_hash.h"
#include "kv_test_util.h"
#include "kvl/kv_manager.h"

namespace kvl {
namespace {

using kv_internal::Mix64;

enum class HashMode { kDefault, kTwoBits, kPrefixCacheOff };

struct Config {
  int32_t block_tokens;
  int64_t num_blocks;
  HashMode hash_mode;
  uint32_t seed;
};

// A two-bit hash: almost every lookup collides, so only the verification keeps hits honest.
uint64_t TwoBitHash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  return kv_internal::DefaultBlockHash(parent_hash, tokens) & 3;
}

class PropertyRun {
 public:
  explicit PropertyRun(const Config& config) : config_(config), rng_(config.seed) {
    KvManagerOptions options = testing_kv::Options(config.block_tokens, config.num_blocks,
                                                   config.hash_mode != HashMode::kPrefixCacheOff);
    options.max_seqs = kMaxSeqs;
    if (config.hash_mode == HashMode::kTwoBits) options.block_hash_for_testing = &TwoBitHash;
    manager_ = testing_kv::Make(options);
    storage_ = std::move(KvBlockStorage::Create(options.layout, manager_->num_blocks())).value();
    cache_ = std::make_unique<PagedKvCache>(*manager_, *storage_);
    // A few shared prefixes (some shorter than a block, some several blocks long) so that
    // admissions hit the prefix cache.
    for (int i = 0; i < 4; ++i)
      prefixes_.push_back(RandomTokens(Uniform(0, 3 * config.block_tokens + 2)));
  }

  void Run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int kind = Uniform(0, 99);
      if (kind < 45) {
        RandomStep();
      } else if (kind < 55) {
        RandomFork();
      } else if (kind < 75) {
        RandomFree();
      } else if (kind < 85) {
        Fill();
      } else {
        Readmit();
      }
      CheckAll(op);
      if (::testing::Test::HasFailure()) return;
    }
  }

  const KvStats stats() const { return manager_->stats(); }
  int64_t plans_not_fitting() const { return plans_not_fitting_; }

 private:
  static constexpr int32_t kMaxSeqs = 8;

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::vector<int32_t> RandomTokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = Uniform(0, 5);  // a tiny vocabulary: repeats and near-collisions
    return t;
  }
  int64_t MaxTokens() const { return 6 * config_.block_tokens + 12; }

  std::vector<SeqId> Present() const {
    std::vector<SeqId> ids;
    for (const auto& [id, tokens] : ref_) ids.push_back(id);
    return ids;
  }
  SeqId AbsentId() {
    std::vector<SeqId> ids;
    for (SeqId id = 0; id < kMaxSeqs; ++id) {
      if (!ref_.contains(id)) ids.push_back(id);
    }
    return ids.empty() ? kNoBlock : ids[Uniform(0, static_cast<int>(ids.size()) - 1)];
  }

  std::vector<int32_t> NewPrompt() {
    std::vector<int32_t> prompt = prefixes_[Uniform(0, static_cast<int>(prefixes_.size()) - 1)];
    const std::vector<int32_t> suffix = RandomTokens(Uniform(1, 2 * config_.block_tokens + 1));
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    return prompt;
  }

  // Plans and, when it fits, commits a step and writes the new rows. A plan that does not fit
  // must leave everything as it was.
  bool Apply(const std::vector<KvSeqStep>& steps) {
    const KvStats before = manager_->stats();
    const KvPlan plan = manager_->Plan(steps);
    const KvStats after_plan = manager_->stats();
    EXPECT_EQ(before.blocks_free, after_plan.blocks_free);
    EXPECT_EQ(before.blocks_cached, after_plan.blocks_cached);
    EXPECT_EQ(before.prefix_queries, after_plan.prefix_queries);
    EXPECT_EQ(plan.blocks_free, before.blocks_free);
    EXPECT_EQ(plan.fits, plan.blocks_needed + plan.blocks_reused_free <= plan.blocks_free);
    int64_t needed = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      const KvPlan::SeqPlan& sp = plan.seqs[i];
      EXPECT_EQ(sp.seq, steps[i].seq);
      EXPECT_EQ(sp.admit, !ref_.contains(steps[i].seq));
      if (sp.admit) {
        EXPECT_LT(sp.num_cached_tokens, static_cast<int64_t>(steps[i].tokens.size()));
        EXPECT_EQ(sp.num_cached_tokens % config_.block_tokens, 0);
      }
      needed += sp.blocks_needed;
    }
    EXPECT_EQ(needed, plan.blocks_needed);
    if (!plan.fits) {
      ++plans_not_fitting_;
      return false;
    }
    manager_->Commit(plan);
    EXPECT_EQ(manager_->stats().blocks_free,
              before.blocks_free - plan.blocks_needed - plan.blocks_reused_free);
    // The engine's order: copies first, then the forward pass writes the new rows.
    for (const KvBlockCopy& copy : plan.copies) storage_->CopyBlock(copy.src, copy.dst);
    for (size_t i = 0; i < steps.size(); ++i) {
      std::vector<int32_t>& tokens = ref_[steps[i].seq];
      tokens.insert(tokens.end(), steps[i].tokens.begin(), steps[i].tokens.end());
      WriteRows(steps[i].seq, plan.seqs[i].first_new_pos);
    }
    return true;
  }

  // Mixes of admissions and appends in one plan, distinct sequences.
  void RandomStep() {
    std::vector<std::vector<int32_t>> token_lists;
    std::vector<SeqId> seqs;
    const int n = Uniform(1, 3);
    token_lists.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      const std::vector<SeqId> present = Present();
      SeqId seq;
      if (!present.empty() && Uniform(0, 2) > 0) {
        seq = present[Uniform(0, static_cast<int>(present.size()) - 1)];
        if (static_cast<int64_t>(ref_[seq].size()) > MaxTokens()) continue;
        token_lists.push_back(
            RandomTokens(Uniform(0, 3) == 0 ? Uniform(1, 2 * config_.block_tokens) : 1));
      } else {
        seq = AbsentId();
        if (seq == kNoBlock) continue;
        token_lists.push_back(NewPrompt());
      }
      if (std::find(seqs.begin(), seqs.end(), seq) != seqs.end()) {
        token_lists.pop_back();
        continue;
      }
      seqs.push_back(seq);
    }
    std::vector<KvSeqStep> steps;
    for (size_t i = 0; i < seqs.size(); ++i) steps.push_back({seqs[i], token_lists[i]});
    if (!steps.empty()) Apply(steps);
  }

  void RandomFork() {
    const std::vector<SeqId> present = Present();
    const SeqId child = AbsentId();
    if (present.empty() || child == kNoBlock) return;
    const SeqId parent = present[Uniform(0, static_cast<int>(present.size()) - 1)];
    manager_->Fork(parent, child);
    ref_[child] = ref_[parent];
  }

  // `resumes`: a preemption (its blocks wait for the resume in the reuse forecast).
  void RandomFree(bool resumes = false) {
    const std::vector<SeqId> present = Present();
    if (present.empty()) return;
    const SeqId seq = present[Uniform(0, static_cast<int>(present.size()) - 1)];
    finished_.push_back(ref_[seq]);
    manager_->Free(seq, resumes);
    ref_.erase(seq);
  }

  // Appends big chunks until the pool runs out, then preempts (frees) one sequence, as the
  // scheduler would.
  void Fill() {
    const std::vector<SeqId> present = Present();
    if (present.empty()) return;
    const SeqId seq = present[Uniform(0, static_cast<int>(present.size()) - 1)];
    for (int i = 0; i < 8; ++i) {
      const std::vector<int32_t> chunk = RandomTokens(2 * config_.block_tokens + 1);
      const KvSeqStep step{seq, chunk};
      if (!Apply({step})) {
        RandomFree(/*resumes=*/true);
        return;
      }
      CheckAll(-1);
    }
  }

  // A preempted or finished sequence comes back (or a follow-up turn): its whole history as
  // the prompt, which the prefix cache should largely hold.
  void Readmit() {
    const SeqId seq = AbsentId();
    if (finished_.empty() || seq == kNoBlock) return;
    std::vector<int32_t> prompt = finished_[Uniform(0, static_cast<int>(finished_.size()) - 1)];
    if (Uniform(0, 1) == 0) prompt.push_back(Uniform(0, 5));
    Apply({KvSeqStep{seq, prompt}});
  }

  // The value the forward pass would store at (position, layer, element) of K or V: a function
  // of every token up to and including the position, so equal prefixes give equal rows.
  static float RowValue(uint64_t prefix_hash, int64_t layer, int64_t d, int kv) {
    const uint64_t h = Mix64(prefix_hash + 0x100 * static_cast<uint64_t>(layer) + 8 * d + kv);
    return static_cast<float>(h >> 40);  // 24 bits: exact in a float
  }

  static std::vector<uint64_t> PrefixHashes(const std::vector<int32_t>& tokens) {
    std::vector<uint64_t> hashes(tokens.size());
    uint64_t h = 0x5eed;
    for (size_t i = 0; i < tokens.size(); ++i)
      hashes[i] = h = Mix64(h ^ (static_cast<uint64_t>(tokens[i]) + 1));
    return hashes;
  }

  void WriteRows(SeqId seq, int64_t first_pos) {
    const std::vector<int32_t>& tokens = ref_[seq];
    const std::vector<uint64_t> hashes = PrefixHashes(tokens);
    for (int64_t layer = 0; layer < cache_->num_layers(); ++layer) {
      for (int64_t pos = first_pos; pos < static_cast<int64_t>(tokens.size()); ++pos) {
        const KvCache::Rows rows = cache_->RowsAt(seq, layer, pos);
        for (int64_t d = 0; d < cache_->kv_dim(); ++d) {
          rows.k[d] = RowValue(hashes[pos], layer, d, 0);
          rows.v[d] = RowValue(hashes[pos], layer, d, 1);
        }
      }
    }
  }

  void CheckAll(int op) {
    SCOPED_TRACE(fmt::format("op {} (block_tokens {}, blocks {}, seed {})", op,
                             config_.block_tokens, config_.num_blocks, config_.seed));
    // Refcounts never negative, no block both free and used, a consistent free list, every
    // cached hash naming a block that holds exactly its tokens: all part of CheckInvariants.
    const Status status = manager_->CheckInvariants();
    ASSERT_TRUE(status.ok()) << status.ToString();
    const KvStats st = manager_->stats();
    EXPECT_EQ(st.num_seqs, static_cast<int64_t>(ref_.size()));
    // The used count is what the block tables reference (each shared block once), not just
    // total - free: stats() derives it that way, so comparing those two would test nothing.
    int64_t unshared_blocks = 0;
    std::set<BlockId> referenced;
    for (SeqId id = 0; id < kMaxSeqs; ++id) EXPECT_EQ(manager_->Contains(id), ref_.contains(id));
    for (const auto& [seq, tokens] : ref_) {
      ASSERT_EQ(manager_->tokens(seq), tokens) << "seq " << seq;
      referenced.insert(manager_->block_table(seq).begin(), manager_->block_table(seq).end());
      ASSERT_EQ(static_cast<int64_t>(manager_->block_table(seq).size()),
                manager_->BlocksFor(static_cast<int64_t>(tokens.size())));
      unshared_blocks += manager_->BlocksFor(static_cast<int64_t>(tokens.size()));
      const std::vector<uint64_t> hashes = PrefixHashes(tokens);
      for (int64_t layer = 0; layer < cache_->num_layers(); ++layer) {
        for (int64_t pos = 0; pos < static_cast<int64_t>(tokens.size());) {
          const KvCache::Rows rows = cache_->RowsAt(seq, layer, pos);
          for (int64_t i = 0; i < rows.count && pos < static_cast<int64_t>(tokens.size());
               ++i, ++pos) {
            for (int64_t d = 0; d < cache_->kv_dim(); ++d) {
              ASSERT_EQ(rows.k[i * rows.stride + d], RowValue(hashes[pos], layer, d, 0))
                  << "K of seq " << seq << " pos " << pos << " layer " << layer;
              ASSERT_EQ(rows.v[i * rows.stride + d], RowValue(hashes[pos], layer, d, 1))
                  << "V of seq " << seq << " pos " << pos << " layer " << layer;
            }
          }
        }
      }
    }
    EXPECT_EQ(st.blocks_used, static_cast<int64_t>(referenced.size()) + st.blocks_raw);
    // Sharing can only save blocks.
    EXPECT_LE(st.blocks_used, unshared_blocks);
  }

  Config config_;
  std::mt19937 rng_;
  std::unique_ptr<KvManager> manager_;
  std::unique_ptr<KvBlockStorage> storage_;
  std::unique_ptr<PagedKvCache> cache_;
  std::map<SeqId, std::vector<int32_t>> ref_;
  std::vector<std::vector<int32_t>> prefixes_;
  std::vector<std::vector<int32_t>> finished_;
  int64_t plans_not_fitting_ = 0;
};

class KvManagerPropertyTest : public ::testing::TestWithParam<std::tuple<int32_t, HashMode>> {};

TEST_P(KvManagerPropertyTest, RandomOperationsMatchTheReference) {
  const auto [block_tokens, hash_mode] = GetParam();
  for (const int64_t pool_tokens : {24, 64, 400}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      const int64_t num_blocks = std::max<int64_t>(2, pool_tokens / block_tokens);
      PropertyRun run(Config{block_tokens, num_blocks, hash_mode, seed});
      run.Run(1500);
      if (HasFailure()) return;
      const KvStats st = run.stats();
      if (hash_mode == HashMode::kPrefixCacheOff) {
        EXPECT_EQ(st.prefix_queries, 0);  // off: nothing looked up, so nothing can be shared
        EXPECT_EQ(st.prefix_hit_tokens, 0);
      } else {
        EXPECT_GT(st.prefix_queries, 0);
      }
      if (hash_mode == HashMode::kDefault) {
        EXPECT_GT(st.prefix_hit_tokens, 0) << "no prefix hits: the test would miss sharing bugs";
      }
      if (pool_tokens == 24) {
        EXPECT_GT(run.plans_not_fitting(), 0) << "no plan ran out of blocks";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSizesAndHashes, KvManagerPropertyTest,
                         ::testing::Combine(::testing::Values(1, 4, 16),
                                            ::testing::Values(HashMode::kDefault,
                                                              HashMode::kTwoBits,
                                                              HashMode::kPrefixCacheOff)));

}  // namespace
}  // namespace kvl
