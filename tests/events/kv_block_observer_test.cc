// The KV layer's block observer (kvl/kv_block_observer.h): every change of the prefix index is
// told, in order, with the block's tokens and parent, so that an index rebuilt from the calls
// alone equals the manager's own (KvManager::IndexedHashes), through stores, prefix hits,
// evictions and a stale block's replacement.
#include "kvl/kv_block_observer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "kv/kv_test_util.h"
#include "kvl/kv_manager.h"

namespace kvl {
namespace {

using testing_kv::Concat;
using testing_kv::Make;
using testing_kv::Options;
using testing_kv::Range;
using testing_kv::Step;

// Rebuilds the index from the calls, and fails on a store of a held hash or a removal of one
// not held (what a router's index would trip on).
class RecordingObserver : public KvBlockObserver {
 public:
  void BlockStored(uint64_t hash, uint64_t parent_hash, bool first_in_chain,
                   std::span<const int32_t> tokens) override {
    EXPECT_TRUE(held.insert(hash).second) << "stored twice: " << hash;
    tokens_of[hash].assign(tokens.begin(), tokens.end());
    if (!first_in_chain) parents[hash] = parent_hash;
    ++stored;
  }
  void BlockRemoved(uint64_t hash) override {
    EXPECT_EQ(held.erase(hash), 1u) << "removed without a store: " << hash;
    ++removed;
  }
  void IndexSnapshot(std::span<const uint64_t> hashes) override {
    snapshot.assign(hashes.begin(), hashes.end());
  }

  std::set<uint64_t> held;
  std::map<uint64_t, std::vector<int32_t>> tokens_of;
  std::map<uint64_t, uint64_t> parents;
  std::vector<uint64_t> snapshot;
  int stored = 0;
  int removed = 0;
};

std::set<uint64_t> Indexed(const KvManager& m) {
  std::vector<uint64_t> hashes;
  m.IndexedHashes(&hashes);
  return {hashes.begin(), hashes.end()};
}

TEST(KvBlockObserverTest, CallsRebuildTheIndexThroughStoresHitsAndEvictions) {
  RecordingObserver observer;
  KvManagerOptions options = Options(4, 6);
  options.block_observer = &observer;
  auto m = Make(options);
  const std::vector<int32_t> a = Range(100, 9), b = Range(200, 9), c = Range(300, 9);
  Step(*m, 0, a);  // two full blocks of a
  EXPECT_EQ(observer.stored, 2);
  EXPECT_EQ(observer.held, Indexed(*m));
  // Block 1 of a chains to block 0 by its hash; block 0 has no parent (vLLM's None).
  ASSERT_EQ(observer.parents.size(), 1u);
  EXPECT_EQ(observer.held.count(observer.parents.begin()->second), 1u);
  for (const auto& [hash, tokens] : observer.tokens_of) {
    EXPECT_EQ(tokens.size(), 4u);
    EXPECT_TRUE(tokens == Range(100, 4) || tokens == Range(104, 4));
  }
  Step(*m, 1, b);
  m->Free(0);
  m->Free(1);
  // Freed blocks stay cached and indexed: nothing removed yet.
  EXPECT_EQ(observer.removed, 0);
  EXPECT_EQ(observer.held, Indexed(*m));
  const uint64_t changes_before = m->index_changes();
  Step(*m, 2, c);  // takes a cached block of a: its eviction is a removal
  EXPECT_EQ(observer.removed, 1);
  EXPECT_GT(m->index_changes(), changes_before);
  EXPECT_EQ(observer.held, Indexed(*m));
  // A prefix hit revives blocks without changing the index.
  const int stored_before = observer.stored;
  Step(*m, 3, Concat(Range(200, 8), Range(7, 1)));
  EXPECT_EQ(observer.stored, stored_before);
  EXPECT_EQ(observer.held, Indexed(*m));
  EXPECT_TRUE(m->CheckInvariants().ok());
}

TEST(KvBlockObserverTest, NoObserverNoCallsAndTheIndexStillListed) {
  auto m = Make(Options(4, 6));
  Step(*m, 0, Range(0, 9));
  EXPECT_EQ(Indexed(*m).size(), 2u);
  EXPECT_EQ(m->index_changes(), 2u);
}

}  // namespace
}  // namespace kvl
