// PrefixIndex (the open-addressing block-hash table) against std::unordered_map under random
// inserts and erases, with hashes drawn from a small set so probe chains overlap and wrap around
// the end of the table, which is where backward-shift deletion can go wrong.
#include "kv/pool/prefix_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace kvl::kv_internal {
namespace {

TEST(PrefixIndexTest, MatchesAMapUnderRandomInsertsAndErases) {
  for (int32_t max_entries : {1, 3, 16, 100}) {
    PrefixIndex index(max_entries);
    std::unordered_map<uint64_t, BlockId> model;
    std::mt19937_64 rng(static_cast<uint64_t>(max_entries));
    // Few distinct hashes, some of them multiples of large powers of two (their Fibonacci homes
    // cluster), so that inserts collide and erases shift entries back across the wrap.
    std::vector<uint64_t> hashes;
    for (int i = 0; i < 3 * max_entries + 2; ++i) {
      hashes.push_back(i % 2 == 0 ? rng() : static_cast<uint64_t>(i) << 60);
    }
    BlockId next_block = 0;
    for (int op = 0; op < 20000; ++op) {
      const uint64_t hash = hashes[rng() % hashes.size()];
      const auto it = model.find(hash);
      if (it != model.end()) {
        index.Erase(hash);
        model.erase(it);
      } else if (static_cast<int32_t>(model.size()) < max_entries) {
        index.Insert(hash, next_block);
        model.emplace(hash, next_block);
        next_block = (next_block + 1) % 1000;
      }
      ASSERT_EQ(index.size(), static_cast<int64_t>(model.size()));
      for (uint64_t h : hashes) {
        const auto found = model.find(h);
        ASSERT_EQ(index.Find(h), found == model.end() ? kNoBlock : found->second)
            << "max_entries " << max_entries << " op " << op;
      }
    }
    int64_t visited = 0;
    index.ForEach([&](uint64_t hash, BlockId block) {
      ++visited;
      EXPECT_EQ(model.at(hash), block);
    });
    EXPECT_EQ(visited, static_cast<int64_t>(model.size()));
  }
}

}  // namespace
}  // namespace kvl::kv_internal
