// Helpers shared by the KV manager tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <tuple>
#include <vector>

#include "kvl/kv_manager.h"

namespace kvl::testing_kv {

inline KvManagerOptions Options(int32_t block_tokens, int64_t num_blocks,
                                bool prefix_cache = true) {
  KvManagerOptions options;
  options.layout = KvBlockLayout{block_tokens, /*num_layers=*/2, /*kv_dim=*/4};
  options.budget_bytes = num_blocks * options.layout.block_bytes();
  options.model_identity = 0x1234;
  options.enable_prefix_cache = prefix_cache;
  options.max_seqs = 16;
  return options;
}

inline std::unique_ptr<KvManager> Make(const KvManagerOptions& options) {
  auto manager = KvManager::Create(options);
  EXPECT_TRUE(manager.ok()) << manager.status().ToString();
  return std::move(manager).value();
}

// n consecutive token ids starting at `first`.
inline std::vector<int32_t> Range(int32_t first, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every field of a plan, for comparing plans whole.
inline auto PlanFields(const KvPlan& p) {
  return std::tie(p.fits, p.blocks_needed, p.blocks_free, p.blocks_reused_free, p.state_version);
}
inline auto SeqPlanFields(const KvPlan::SeqPlan& s) {
  return std::tie(s.seq, s.admit, s.first_new_pos, s.num_cached_tokens, s.reused, s.allocated,
                  s.cow_src, s.cow_dst, s.blocks_needed, s.tokens);
}

inline void ExpectSamePlan(const KvPlan& a, const KvPlan& b) {
  EXPECT_EQ(PlanFields(a), PlanFields(b));
  ASSERT_EQ(a.copies.size(), b.copies.size());
  for (size_t i = 0; i < a.copies.size(); ++i) {
    EXPECT_EQ(std::tie(a.copies[i].src, a.copies[i].dst),
              std::tie(b.copies[i].src, b.copies[i].dst));
  }
  ASSERT_EQ(a.seqs.size(), b.seqs.size());
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    EXPECT_EQ(SeqPlanFields(a.seqs[i]), SeqPlanFields(b.seqs[i])) << "seq plan " << i;
  }
}

inline KvPlan PlanOne(const KvManager& m, SeqId seq, const std::vector<int32_t>& tokens) {
  const KvSeqStep step{seq, tokens};
  return m.Plan(std::span(&step, 1));
}

// Plans and commits one step for one sequence; the plan must fit.
inline KvPlan Step(KvManager& m, SeqId seq, const std::vector<int32_t>& tokens) {
  KvPlan plan = PlanOne(m, seq, tokens);
  EXPECT_TRUE(plan.fits);
  if (plan.fits) m.Commit(plan);
  const Status status = m.CheckInvariants();
  EXPECT_TRUE(status.ok()) << status.ToString();
  return plan;
}

}  // namespace kvl::testing_kv
