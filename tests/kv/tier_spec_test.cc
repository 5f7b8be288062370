// --kv-tier specs and byte sizes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kvl/kv_tier.h"

namespace kvl {
namespace {

TEST(ParseByteSizeTest, Units) {
  EXPECT_EQ(*ParseByteSize("512"), 512);
  EXPECT_EQ(*ParseByteSize("512B"), 512);
  EXPECT_EQ(*ParseByteSize("4KiB"), 4096);
  EXPECT_EQ(*ParseByteSize("4k"), 4096);
  EXPECT_EQ(*ParseByteSize("256MiB"), 256ll << 20);
  EXPECT_EQ(*ParseByteSize("256mib"), 256ll << 20);
  EXPECT_EQ(*ParseByteSize("3M"), 3ll << 20);
  EXPECT_EQ(*ParseByteSize("4GiB"), 4ll << 30);
  EXPECT_EQ(*ParseByteSize("4G"), 4ll << 30);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ll << 29);
  EXPECT_EQ(*ParseByteSize("2TiB"), 2ll << 40);
  EXPECT_EQ(*ParseByteSize("2GB"), 2000000000ll);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("GiB").ok());
  EXPECT_FALSE(ParseByteSize("12XiB").ok());
  EXPECT_FALSE(ParseByteSize("-1GiB").ok());
  EXPECT_FALSE(ParseByteSize("99999999999999999999999").ok());
  EXPECT_FALSE(ParseByteSize("9000000TiB").ok());
  EXPECT_NE(ParseByteSize("12XiB").status().message().find("'XiB'"), std::string::npos);
}

TEST(ParseTierSpecTest, GoodSpecs) {
  auto ram = ParseTierSpec("ram:256MiB");
  ASSERT_TRUE(ram.ok()) << ram.status().ToString();
  EXPECT_EQ(ram->kind, TierKind::kRam);
  EXPECT_EQ(ram->capacity_bytes, 256ll << 20);
  EXPECT_FALSE(ram->compress);

  auto zstd = ParseTierSpec("ram:1GiB:zstd");
  ASSERT_TRUE(zstd.ok());
  EXPECT_EQ(zstd->capacity_bytes, 1ll << 30);
  EXPECT_TRUE(zstd->compress);

  auto disk = ParseTierSpec("disk:/tmp/kv.pages:4GiB");
  ASSERT_TRUE(disk.ok()) << disk.status().ToString();
  EXPECT_EQ(disk->kind, TierKind::kDisk);
  EXPECT_EQ(disk->path, "/tmp/kv.pages");
  EXPECT_EQ(disk->capacity_bytes, 4ll << 30);
  EXPECT_FALSE(disk->direct_io);

  auto direct = ParseTierSpec("disk:/tmp/kv.pages:4GiB:direct");
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(direct->path, "/tmp/kv.pages");
  EXPECT_TRUE(direct->direct_io);

  EXPECT_TRUE(direct->persistent);

  for (const char* text : {"disk:/tmp/kv.pages:4GiB:scratch", "disk:/tmp/kv.pages:4GiB:direct:scratch",
                           "disk:/tmp/kv.pages:4GiB:SCRATCH:direct"}) {
    auto scratch = ParseTierSpec(text);
    ASSERT_TRUE(scratch.ok()) << text << ": " << scratch.status().ToString();
    EXPECT_EQ(scratch->path, "/tmp/kv.pages") << text;
    EXPECT_EQ(scratch->capacity_bytes, 4ll << 30) << text;
    EXPECT_FALSE(scratch->persistent) << text;
    EXPECT_EQ(scratch->direct_io, std::string_view(text).find("direct") != std::string_view::npos);
  }

  auto colon = ParseTierSpec("disk:/mnt/a:b/kv.pages:1G");
  ASSERT_TRUE(colon.ok()) << colon.status().ToString();
  EXPECT_EQ(colon->path, "/mnt/a:b/kv.pages");

  auto upper = ParseTierSpec("RAM:2g:ZSTD");
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(upper->capacity_bytes, 2ll << 30);
}

TEST(ParseTierSpecTest, BadSpecsNameTheBadPart) {
  struct Case {
    const char* spec;
    const char* mentions;
  };
  const Case cases[] = {
      {"", "unknown tier kind"},
      {"redis:localhost:6379", "a redis tier is a URL starting with redis://"},
      {"ram", "expected ram:SIZE"},
      {"ram:", "does not start with a number"},
      {"ram:lots", "'lots'"},
      {"ram:0", "positive"},
      {"ram:1GiB:lz4", "unknown ram option 'lz4'"},
      {"ram:1GiB:zstd:x", "expected ram:SIZE"},
      {"ram:12QB", "unknown unit 'QB'"},
      {"disk:/tmp/kv.pages", "expected disk:PATH:SIZE"},
      {"disk:4GiB", "expected disk:PATH:SIZE"},
      {"disk::4GiB", "path is empty"},
      {"disk:/tmp/kv.pages:big", "'big'"},
      {"disk:/tmp/kv.pages:4GiB:fast", "'fast'"},
      {"disk:/tmp/kv.pages:scratch", "expected disk:PATH:SIZE[:direct][:scratch]"},
  };
  for (const Case& c : cases) {
    auto spec = ParseTierSpec(c.spec);
    ASSERT_FALSE(spec.ok()) << c.spec;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << c.spec;
    EXPECT_NE(spec.status().message().find(c.mentions), std::string::npos)
        << c.spec << " -> " << spec.status().message();
  }
}

TEST(MakeTierTest, BuildsTheTierASpecNames) {
  auto ram = MakeTier(*ParseTierSpec("ram:1MiB:zstd"), 0);
  ASSERT_TRUE(ram.ok());
  EXPECT_EQ((*ram)->name(), "ram:zstd");
  EXPECT_EQ((*ram)->stats().capacity_bytes, 1 << 20);
  const std::string path =
      ::testing::TempDir() + "kvl_make_tier_" + std::to_string(::getpid()) + ".pages";
  {
    auto disk = MakeTier(*ParseTierSpec("disk:" + path + ":1MiB"), 4032, "model A");
    ASSERT_TRUE(disk.ok()) << disk.status().ToString();
    EXPECT_EQ((*disk)->name(), "disk");
    EXPECT_EQ((*disk)->stats().capacity_bytes, 1 << 20);
    const std::vector<uint8_t> page(4032, 7);
    const PageWrite write{99, page};
    ASSERT_TRUE((*disk)->Put(std::span(&write, 1)).ok());
  }
  // Persistent by default: the page is there for the next tier of the same identity.
  {
    auto disk = MakeTier(*ParseTierSpec("disk:" + path + ":1MiB"), 4032, "model A");
    ASSERT_TRUE(disk.ok()) << disk.status().ToString();
    EXPECT_TRUE((*disk)->Contains(99));
  }
  {
    auto scratch = MakeTier(*ParseTierSpec("disk:" + path + ":1MiB:scratch"), 4032, "model A");
    ASSERT_TRUE(scratch.ok()) << scratch.status().ToString();
    EXPECT_FALSE((*scratch)->Contains(99));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace kvl
