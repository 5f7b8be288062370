// The Redis KV tier against a real redis-server started by each test on a free loopback port:
// bit-exact round trips, pages shared by two tiers of one identity and hidden from any other,
// damaged values read as DATA_LOSS, the server killed or hung mid-run (operations fail fast,
// then the tier reconnects), TTL, the server's maxmemory, and the redis:// tier spec.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "kvl/kv_tier.h"
#include "redis_test_server.h"
#include "tier_test_util.h"

namespace kvl {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kPageBytes = 4032;
constexpr int64_t kValueHeaderBytes = 40;  // see kvl/kv_tier.h

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Pages with keys that look like chain hashes, and their bytes.
struct PageSet {
  std::vector<PageKey> keys;
  std::vector<std::vector<uint8_t>> bytes;

  PageSet(int count, size_t size, uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < count; ++i) {
      keys.push_back(rng());
      bytes.push_back(PageBytes(keys.back(), size));
    }
  }
  std::vector<PageWrite> Writes() const {
    std::vector<PageWrite> writes;
    for (size_t i = 0; i < keys.size(); ++i) writes.push_back({keys[i], bytes[i]});
    return writes;
  }
};

// Buffers to read a PageSet into, filled with a pattern that no page has.
struct ReadBuffers {
  std::vector<std::vector<uint8_t>> outs;
  std::vector<PageRead> reads;

  explicit ReadBuffers(const PageSet& pages) {
    for (const auto& bytes : pages.bytes) outs.emplace_back(bytes.size(), 0xCD);
    for (size_t i = 0; i < pages.keys.size(); ++i) reads.push_back({pages.keys[i], outs[i]});
  }
};

bool AllZero(const std::vector<uint8_t>& bytes) {
  for (uint8_t b : bytes)
    if (b != 0) return false;
  return true;
}

std::string Hex16(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RedisServerProcess::FindBinary().empty()) {
      GTEST_SKIP() << "redis-server is not installed (Debian: apt-get install redis-server, or "
                      "scripts/install-deps.sh)";
    }
    ASSERT_TRUE(server_.Start(FreeLoopbackPort())) << server_.why();
  }

  RedisTierOptions Options(std::string identity = "model A") const {
    return {.port = server_.port(), .identity = std::move(identity), .page_bytes = kPageBytes};
  }

  std::unique_ptr<KvTier> Tier(const RedisTierOptions& options) {
    auto tier = MakeRedisTier(options);
    EXPECT_TRUE(tier.ok()) << tier.status().ToString();
    return tier.ok() ? std::move(tier).value() : nullptr;
  }

  RedisServerProcess server_;
};

TEST_F(RedisTierTest, RoundTripsManyPagesBitExactInOneRoundTripEach) {
  auto tier = Tier(Options());
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->name(), "redis");
  const PageSet pages(200, kPageBytes, 1);
  ASSERT_TRUE(tier->Put(pages.Writes()).ok());
  ReadBuffers buffers(pages);
  const std::vector<Status> results = tier->Get(buffers.reads);
  ASSERT_EQ(results.size(), 200u);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].ToString();
    ASSERT_EQ(buffers.outs[i], pages.bytes[i]) << "page " << i;
  }
  TierStats stats = tier->stats();
  EXPECT_EQ(stats.puts, 200);
  EXPECT_EQ(stats.gets, 200);
  EXPECT_EQ(stats.write_ops, 1);  // one pipeline for the Put
  EXPECT_EQ(stats.read_ops, 1);   // and one for the Get
  EXPECT_EQ(stats.pages, 200);
  EXPECT_EQ(stats.bytes_used, 200 * (kValueHeaderBytes + kPageBytes));
  EXPECT_EQ(stats.bytes_written, 200 * kPageBytes);
  EXPECT_EQ(stats.bytes_read, 200 * kPageBytes);
  EXPECT_EQ(stats.errors, 0);
  EXPECT_EQ(stats.capacity_bytes, 0);  // the test server has no maxmemory

  // The background path, on its own connection.
  ReadBuffers async_buffers(pages);
  const std::vector<Status> async_results = tier->GetAsync(async_buffers.reads).get();
  for (size_t i = 0; i < async_results.size(); ++i) {
    ASSERT_TRUE(async_results[i].ok()) << async_results[i].ToString();
    ASSERT_EQ(async_buffers.outs[i], pages.bytes[i]) << "page " << i;
  }
  EXPECT_EQ(tier->stats().read_ops, 2);
}

TEST_F(RedisTierTest, LargePutsGoInChunksOfAFewMiB) {
  RedisTierOptions options = Options();
  options.page_bytes = 1 << 20;
  auto tier = Tier(options);
  ASSERT_NE(tier, nullptr);
  const PageSet pages(20, 1 << 20, 2);
  ASSERT_TRUE(tier->Put(pages.Writes()).ok());
  EXPECT_EQ(tier->stats().write_ops, 3);  // 8 + 8 + 4 pages of 1 MiB
  ReadBuffers buffers(pages);
  for (const Status& s : tier->Get(buffers.reads)) ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < pages.keys.size(); ++i) ASSERT_EQ(buffers.outs[i], pages.bytes[i]);
}

TEST_F(RedisTierTest, MissingPageIsNotFoundAndOutIsZeroed) {
  auto tier = Tier(Options());
  ASSERT_NE(tier, nullptr);
  const PageSet stored(1, kPageBytes, 3);
  ASSERT_TRUE(tier->Put(stored.Writes()).ok());
  std::vector<uint8_t> out(kPageBytes, 0xCD), hit(kPageBytes, 0xCD);
  const PageRead reads[] = {{stored.keys[0] + 1, out}, {stored.keys[0], hit}};
  const std::vector<Status> results = tier->Get(reads);
  EXPECT_EQ(results[0].code(), StatusCode::kNotFound) << results[0].ToString();
  EXPECT_TRUE(AllZero(out));
  EXPECT_TRUE(results[1].ok()) << results[1].ToString();
  EXPECT_EQ(hit, stored.bytes[0]);
  EXPECT_FALSE(tier->Contains(stored.keys[0] + 1));
  EXPECT_TRUE(tier->Contains(stored.keys[0]));

  // A read of the wrong size is refused before it reaches the server.
  std::vector<uint8_t> small(100, 0xCD);
  EXPECT_EQ(GetOne(*tier, stored.keys[0], small).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PutOne(*tier, 5, small).code(), StatusCode::kInvalidArgument);
}

TEST_F(RedisTierTest, TwoTiersOfOneIdentitySharePages) {
  // As two processes serving one model would.
  auto first = Tier(Options());
  auto second = Tier(Options());
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  const PageSet pages(50, kPageBytes, 4);
  ASSERT_TRUE(first->Put(pages.Writes()).ok());
  EXPECT_EQ(second->ContainsAll(pages.keys), std::vector<bool>(50, true));
  ReadBuffers buffers(pages);
  for (const Status& s : second->Get(buffers.reads)) ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < pages.keys.size(); ++i) EXPECT_EQ(buffers.outs[i], pages.bytes[i]);
  EXPECT_EQ(second->stats().pages, 0);  // it stored none of them itself
  second->Erase(std::span(pages.keys).first(10));
  std::vector<uint8_t> out(kPageBytes);
  EXPECT_EQ(GetOne(*first, pages.keys[0], out).code(), StatusCode::kNotFound);
  EXPECT_TRUE(GetOne(*first, pages.keys[10], out).ok());
}

TEST_F(RedisTierTest, AnotherIdentityPageSizeOrNamespaceSeesNothing) {
  auto tier = Tier(Options("model A"));
  ASSERT_NE(tier, nullptr);
  const PageSet pages(5, kPageBytes, 5);
  ASSERT_TRUE(tier->Put(pages.Writes()).ok());

  RedisTierOptions other_model = Options("model B");
  RedisTierOptions other_size = Options("model A");
  other_size.page_bytes = kPageBytes / 2;
  RedisTierOptions other_namespace = Options("model A");
  other_namespace.name_space = "elsewhere";
  for (const RedisTierOptions& options : {other_model, other_size, other_namespace}) {
    auto other = Tier(options);
    ASSERT_NE(other, nullptr);
    EXPECT_EQ(other->ContainsAll(pages.keys), std::vector<bool>(5, false)) << options.identity;
    std::vector<uint8_t> out(options.page_bytes, 0xCD);
    EXPECT_EQ(GetOne(*other, pages.keys[0], out).code(), StatusCode::kNotFound);
    EXPECT_TRUE(AllZero(out));
  }
  RawRedis raw(server_.port());
  EXPECT_EQ(raw.Keys("*").size(), 5u);  // the other tiers wrote nothing
}

TEST_F(RedisTierTest, KeyNamesAndValuesFollowTheDocumentedLayout) {
  auto tier = Tier(Options());
  ASSERT_NE(tier, nullptr);
  const std::vector<uint8_t> page = PageBytes(7, kPageBytes);
  ASSERT_TRUE(PutOne(*tier, 0x0123456789abcdefull, page).ok());
  RawRedis raw(server_.port());
  const std::vector<std::string> keys = raw.Keys("*");
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_TRUE(std::regex_match(keys[0], std::regex("kvl:[0-9a-f]{16}:0123456789abcdef")))
      << keys[0];
  const std::string value = raw.String({"GET", keys[0]});
  ASSERT_EQ(value.size(), static_cast<size_t>(kValueHeaderBytes + kPageBytes));
  EXPECT_EQ(value.substr(0, 4), "KVLR");
  EXPECT_EQ(0, std::memcmp(value.data() + kValueHeaderBytes, page.data(), page.size()));
}

TEST_F(RedisTierTest, DamagedValuesReadAsDataLossNeverAsWrongBytes) {
  auto tier = Tier(Options());
  ASSERT_NE(tier, nullptr);
  const PageSet pages(6, kPageBytes, 6);
  ASSERT_TRUE(tier->Put(pages.Writes()).ok());
  RawRedis raw(server_.port());
  auto name_of = [&](PageKey key) {
    const std::vector<std::string> names = raw.Keys("kvl:*:" + Hex16(key));
    return names.size() == 1 ? names[0] : std::string();
  };
  std::vector<std::string> names, values;
  for (PageKey key : pages.keys) {
    names.push_back(name_of(key));
    ASSERT_FALSE(names.back().empty());
    values.push_back(raw.String({"GET", names.back()}));
    ASSERT_EQ(values.back().size(), static_cast<size_t>(kValueHeaderBytes + kPageBytes));
  }
  std::string flipped = values[0];
  flipped[kValueHeaderBytes + 1000] ^= 0x10;  // one bit of the page
  std::string truncated = values[1].substr(0, values[1].size() - 1);
  std::string bad_magic = values[3];
  bad_magic[0] ^= 0x01;
  EXPECT_EQ(raw.String({"SET", names[0], flipped}), "OK");
  EXPECT_EQ(raw.String({"SET", names[1], truncated}), "OK");
  EXPECT_EQ(raw.String({"SET", names[2], values[5]}), "OK");  // another page under this key
  EXPECT_EQ(raw.String({"SET", names[3], bad_magic}), "OK");
  EXPECT_EQ(raw.Integer({"DEL", names[4]}), 1);
  EXPECT_EQ(raw.Integer({"HSET", names[4], "field", "value"}), 1);  // not a string at all

  ReadBuffers buffers(pages);
  const std::vector<Status> results = tier->Get(buffers.reads);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(results[i].code(), StatusCode::kDataLoss) << i << ": " << results[i].ToString();
    EXPECT_TRUE(AllZero(buffers.outs[i])) << i;
  }
  EXPECT_TRUE(results[5].ok()) << results[5].ToString();  // the intact page still reads
  EXPECT_EQ(buffers.outs[5], pages.bytes[5]);
  EXPECT_EQ(tier->stats().checksum_failures, 5);
  EXPECT_EQ(tier->stats().gets, 1);
}

TEST_F(RedisTierTest, ServerKilledMidRunFailsFastThenTheTierReconnects) {
  RedisTierOptions options = Options();
  auto tier = Tier(options);
  ASSERT_NE(tier, nullptr);
  const PageSet before(32, kPageBytes, 7);
  ASSERT_TRUE(tier->Put(before.Writes()).ok());
  server_.Kill();

  // Every kind of operation fails, and none waits for a server that is gone.
  const auto start = Clock::now();
  const Status put = tier->Put(before.Writes());
  EXPECT_EQ(put.code(), StatusCode::kIoError) << put.ToString();
  EXPECT_NE(put.message().find("127.0.0.1:" + std::to_string(server_.port())), std::string::npos)
      << put.message();
  ReadBuffers buffers(before);
  for (const Status& s : tier->Get(buffers.reads)) {
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  }
  for (const auto& out : buffers.outs) EXPECT_TRUE(AllZero(out));
  EXPECT_FALSE(tier->Contains(before.keys[0]));
  EXPECT_EQ(tier->ContainsAll(before.keys), std::vector<bool>(32, false));
  ReadBuffers async_buffers(before);
  for (const Status& s : tier->GetAsync(async_buffers.reads).get()) {
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  }
  tier->Erase(std::span(before.keys).first(1));
  const double failing_seconds = SecondsSince(start);
  EXPECT_LT(failing_seconds, 2.0);
  EXPECT_EQ(tier->stats().errors, 6);  // Put, Get, Contains, ContainsAll, GetAsync, Erase
  EXPECT_EQ(tier->stats().reconnects, 0);

  ASSERT_TRUE(server_.Start(server_.port())) << server_.why();
  // The tier reconnects at the first operation whose time has come (at most 2 s of backoff).
  const PageSet after(16, kPageBytes, 9);
  const auto restarted = Clock::now();
  Status put_again = IoError("not tried");
  while (!put_again.ok() && SecondsSince(restarted) < 5.0) {
    put_again = tier->Put(after.Writes());
    if (!put_again.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(put_again.ok()) << put_again.ToString();
  EXPECT_LT(SecondsSince(restarted), 2.5);
  EXPECT_EQ(tier->stats().reconnects, 1);
  ReadBuffers after_buffers(after);
  for (const Status& s : tier->GetAsync(after_buffers.reads).get()) {
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  for (size_t i = 0; i < after.keys.size(); ++i) EXPECT_EQ(after_buffers.outs[i], after.bytes[i]);
  // The restarted server kept nothing (no persistence): the old pages are misses, not errors.
  std::vector<uint8_t> out(kPageBytes);
  EXPECT_EQ(GetOne(*tier, before.keys[1], out).code(), StatusCode::kNotFound);
  EXPECT_TRUE(tier->Contains(after.keys[0]));
}

TEST_F(RedisTierTest, BigPutIntoAKilledServerIsAnErrorNotASigpipe) {
  RedisTierOptions options = Options();
  options.page_bytes = 1 << 20;
  auto tier = Tier(options);
  ASSERT_NE(tier, nullptr);
  const PageSet pages(8, 1 << 20, 10);
  ASSERT_TRUE(tier->Put(pages.Writes()).ok());
  server_.Kill();
  // 8 MiB is more than the socket takes in one write: hiredis writes into the dead connection
  // again after the peer's reset, which raises SIGPIPE (fatal by default) unless it is blocked.
  const auto start = Clock::now();
  const Status put = tier->Put(pages.Writes());
  EXPECT_EQ(put.code(), StatusCode::kIoError) << put.ToString();
  EXPECT_LT(SecondsSince(start), 2.0);
}

TEST_F(RedisTierTest, HungServerCostsAtMostTheIoTimeout) {
  RedisTierOptions options = Options();
  options.io_timeout_ms = 300;
  auto tier = Tier(options);
  ASSERT_NE(tier, nullptr);
  const PageSet pages(8, kPageBytes, 11);
  ASSERT_TRUE(tier->Put(pages.Writes()).ok());
  server_.Pause();  // the kernel still accepts connections; nothing answers
  // Should the timeout not work, the watchdog wakes the server after 5 s so that the test fails
  // on the time below instead of hanging.
  std::promise<void> done;
  std::thread watchdog([&, finished = done.get_future()] {
    if (finished.wait_for(std::chrono::seconds(5)) == std::future_status::timeout) {
      server_.Resume();
    }
  });
  const auto start = Clock::now();
  ReadBuffers buffers(pages);
  const std::vector<Status> results = tier->Get(buffers.reads);
  const double seconds = SecondsSince(start);
  done.set_value();
  watchdog.join();
  server_.Resume();
  for (const Status& s : results) EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(results[0].message().find("I/O timeout (300 ms)"), std::string::npos)
      << results[0].message();
  EXPECT_GE(seconds, 0.25);  // it did wait for the server, about the timeout
  EXPECT_LT(seconds, 1.5);

  const auto resumed = Clock::now();
  std::vector<Status> again = {IoError("not tried")};
  while (!again[0].ok() && SecondsSince(resumed) < 5.0) {
    again = tier->Get(buffers.reads);
    if (!again[0].ok()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const Status& s : again) ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < pages.keys.size(); ++i) EXPECT_EQ(buffers.outs[i], pages.bytes[i]);
  EXPECT_EQ(tier->stats().reconnects, 1);
}

TEST_F(RedisTierTest, CreationAgainstAClosedPortNamesHostAndPort) {
  const int closed = FreeLoopbackPort();
  ASSERT_NE(closed, 0);
  RedisTierOptions options = Options();
  options.port = closed;
  const auto start = Clock::now();
  auto tier = MakeRedisTier(options);
  EXPECT_LT(SecondsSince(start), 2.0);
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kIoError);
  EXPECT_NE(tier.status().message().find("127.0.0.1:" + std::to_string(closed) +
                                         " is unavailable"),
            std::string::npos)
      << tier.status().message();
}

TEST(RedisTierOptionsTest, BadOptionsAreInvalidArgument) {
  RedisTierOptions no_host{.host = ""};
  RedisTierOptions port_zero{.port = 0};
  RedisTierOptions big_port{.port = 70000};
  RedisTierOptions no_namespace{.name_space = ""};
  RedisTierOptions negative_ttl{.ttl_seconds = -1};
  RedisTierOptions zero_timeout{.io_timeout_ms = 0};
  for (const RedisTierOptions& options :
       {no_host, port_zero, big_port, no_namespace, negative_ttl, zero_timeout}) {
    auto tier = MakeRedisTier(options);
    ASSERT_FALSE(tier.ok());
    EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument) << tier.status().ToString();
  }
}

TEST_F(RedisTierTest, TtlSetsAnExpiryThatEachGetRefreshes) {
  RedisTierOptions with_ttl = Options();
  with_ttl.ttl_seconds = 100;
  auto tier = Tier(with_ttl);
  auto plain = Tier(Options("model B"));
  ASSERT_NE(tier, nullptr);
  ASSERT_NE(plain, nullptr);
  const std::vector<uint8_t> page = PageBytes(1, kPageBytes);
  ASSERT_TRUE(PutOne(*tier, 1, page).ok());
  ASSERT_TRUE(PutOne(*plain, 1, page).ok());
  RawRedis raw(server_.port());
  const std::vector<std::string> names = raw.Keys("kvl:*");
  ASSERT_EQ(names.size(), 2u);
  int with_expiry = 0;
  for (const std::string& name : names) {
    const int64_t ttl = raw.Integer({"TTL", name});
    if (ttl == -1) continue;  // the plain tier's page: no expiry
    ++with_expiry;
    EXPECT_GT(ttl, 90);
    EXPECT_LE(ttl, 100);
    EXPECT_EQ(raw.Integer({"EXPIRE", name, "5"}), 1);
    std::vector<uint8_t> out(kPageBytes);
    ASSERT_TRUE(GetOne(*tier, 1, out).ok());
    EXPECT_EQ(out, page);
    EXPECT_GT(raw.Integer({"TTL", name}), 90);  // the read gave the page its TTL again
  }
  EXPECT_EQ(with_expiry, 1);
}

TEST_F(RedisTierTest, ContainsAllAnswersEachKeyAndEraseDeletes) {
  auto tier = Tier(Options());
  ASSERT_NE(tier, nullptr);
  const PageSet pages(40, kPageBytes, 12);
  std::vector<PageWrite> writes;
  std::vector<bool> expected;
  for (size_t i = 0; i < pages.keys.size(); ++i) {
    if (i % 3 == 0) writes.push_back({pages.keys[i], pages.bytes[i]});
    expected.push_back(i % 3 == 0);
  }
  ASSERT_TRUE(tier->Put(writes).ok());
  EXPECT_EQ(tier->ContainsAll(pages.keys), expected);
  EXPECT_EQ(tier->stats().pages, 14);

  std::vector<PageKey> erased;
  for (size_t i = 0; i < pages.keys.size(); i += 6) {
    erased.push_back(pages.keys[i]);
    expected[i] = false;
  }
  tier->Erase(erased);
  EXPECT_EQ(tier->ContainsAll(pages.keys), expected);
  EXPECT_EQ(tier->stats().pages, 7);
  EXPECT_EQ(tier->stats().bytes_used, 7 * (kValueHeaderBytes + kPageBytes));
  RawRedis raw(server_.port());
  EXPECT_EQ(raw.Keys("kvl:*").size(), 7u);
  EXPECT_TRUE(tier->ContainsAll({}).empty());
}

TEST(TierContainsAllTest, TheDefaultAsksKeyByKey) {
  auto ram = MakeRamTier({.capacity_bytes = 1 << 20});
  const std::vector<uint8_t> page(64, 1);
  ASSERT_TRUE(PutOne(*ram, 1, page).ok());
  ASSERT_TRUE(PutOne(*ram, 3, page).ok());
  const PageKey keys[] = {1, 2, 3, 4};
  EXPECT_EQ(ram->ContainsAll(keys), (std::vector<bool>{true, false, true, false}));
}

TEST_F(RedisTierTest, CapacityIsTheServersMaxmemory) {
  ASSERT_TRUE(server_.Start(FreeLoopbackPort(), {"--maxmemory", "64mb"})) << server_.why();
  auto tier = Tier(Options());
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().capacity_bytes, 64ll << 20);
}

TEST_F(RedisTierTest, PutOverMaxmemoryWithoutEvictionStoresNone) {
  ASSERT_TRUE(server_.Start(FreeLoopbackPort(), {"--maxmemory", "20mb", "--maxmemory-policy",
                                                 "noeviction"}))
      << server_.why();
  RedisTierOptions options = Options();
  options.page_bytes = 1 << 20;
  auto tier = Tier(options);
  ASSERT_NE(tier, nullptr);
  const PageSet fits(2, 1 << 20, 13);
  ASSERT_TRUE(tier->Put(fits.Writes()).ok());
  const PageSet too_many(40, 1 << 20, 14);
  const Status put = tier->Put(too_many.Writes());
  EXPECT_EQ(put.code(), StatusCode::kResourceExhausted) << put.ToString();
  EXPECT_NE(put.message().find("OOM"), std::string::npos) << put.message();
  EXPECT_EQ(tier->ContainsAll(too_many.keys), std::vector<bool>(40, false));
  EXPECT_EQ(tier->ContainsAll(fits.keys), std::vector<bool>(2, true));  // earlier pages stay
  EXPECT_EQ(tier->stats().pages, 2);
  // Some of that Put's SETs were carried out before the server ran out: the tier deleted them.
  RawRedis raw(server_.port());
  RawReply info = raw.Command({"INFO", "commandstats"});
  ASSERT_NE(info, nullptr);
  const std::string text(info->str, info->len);
  std::smatch match;
  ASSERT_TRUE(std::regex_search(text, match, std::regex("cmdstat_set:calls=([0-9]+)"))) << text;
  EXPECT_GT(std::stoi(match[1]), 2);
  EXPECT_EQ(raw.Integer({"DBSIZE"}), 2);
}

TEST_F(RedisTierTest, TheServersLruEvictsAndEvictedPagesAreMisses) {
  ASSERT_TRUE(server_.Start(FreeLoopbackPort(), {"--maxmemory", "8mb", "--maxmemory-policy",
                                                 "allkeys-lru"}))
      << server_.why();
  RedisTierOptions options = Options();
  options.page_bytes = 64 << 10;
  auto tier = Tier(options);
  ASSERT_NE(tier, nullptr);
  const PageSet pages(400, 64 << 10, 15);  // 25 MiB through an 8 MiB server
  const std::vector<PageWrite> writes = pages.Writes();
  for (size_t begin = 0; begin < writes.size(); begin += 20) {
    ASSERT_TRUE(tier->Put(std::span(writes).subspan(begin, 20)).ok());
  }
  ReadBuffers buffers(pages);
  const std::vector<Status> results = tier->Get(buffers.reads);
  int found = 0, missing = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].ok()) {
      ++found;
      EXPECT_EQ(buffers.outs[i], pages.bytes[i]) << i;
    } else {
      ++missing;
      EXPECT_EQ(results[i].code(), StatusCode::kNotFound) << results[i].ToString();
    }
  }
  EXPECT_GT(found, 0);
  EXPECT_GT(missing, 200);
  // The misses were taken out of what it believes held, and so were the pages past maxmemory
  // it wrote least recently; the server's LRU is approximate, so a few of those may still be
  // there (found, but no longer counted).
  EXPECT_GT(tier->stats().pages, 0);
  EXPECT_LE(tier->stats().pages, found);
}

// Pages the server's LRU evicted and nobody reads again are never found gone: without a bound,
// what the tier believes stored grew with every page it ever wrote (a server writing through to
// Redis grew by some 64 bytes for each; scripts/soak saw its RSS climb in a straight line).
TEST_F(RedisTierTest, WhatItBelievesStoredStaysWithinTheServersMaxmemory) {
  ASSERT_TRUE(server_.Start(FreeLoopbackPort(), {"--maxmemory", "8mb", "--maxmemory-policy",
                                                 "allkeys-lru"}))
      << server_.why();
  RedisTierOptions options = Options();
  options.page_bytes = 64 << 10;
  auto tier = Tier(options);
  ASSERT_NE(tier, nullptr);
  const PageSet pages(400, 64 << 10, 16);  // 25 MiB through an 8 MiB server, never read back
  const std::vector<PageWrite> writes = pages.Writes();
  for (int round = 0; round < 2; ++round) {  // the second round writes every page again
    for (size_t begin = 0; begin < writes.size(); begin += 20) {
      ASSERT_TRUE(tier->Put(std::span(writes).subspan(begin, 20)).ok());
    }
  }
  const TierStats stats = tier->stats();
  EXPECT_EQ(stats.puts, 800);
  EXPECT_LE(stats.bytes_used, 8 << 20);
  EXPECT_LE(stats.pages, (8 << 20) / (64 << 10));
  // The newest pages are the ones it still counts, and the server does hold the newest one.
  EXPECT_GT(stats.pages, 0);
  const std::vector<PageKey> newest = {pages.keys.back()};
  EXPECT_EQ(tier->ContainsAll(newest), std::vector<bool>{true});
}

TEST_F(RedisTierTest, ConcurrentCallersEachGetTheirOwnPages) {
  auto tier = Tier(Options());
  ASSERT_NE(tier, nullptr);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        const PageSet pages(8, kPageBytes, 100 + t * 1000 + round);
        if (!tier->Put(pages.Writes()).ok()) ++failures;
        ReadBuffers sync(pages), async(pages);
        auto pending = tier->GetAsync(async.reads);
        for (const Status& s : tier->Get(sync.reads)) failures += !s.ok();
        for (const Status& s : pending.get()) failures += !s.ok();
        for (size_t i = 0; i < pages.keys.size(); ++i) {
          failures += sync.outs[i] != pages.bytes[i];
          failures += async.outs[i] != pages.bytes[i];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(tier->stats().puts, 4 * 10 * 8);
  EXPECT_EQ(tier->stats().gets, 4 * 10 * 8 * 2);
}

TEST_F(RedisTierTest, MakeTierBuildsARedisTierFromItsSpec) {
  auto spec = ParseTierSpec("redis://127.0.0.1:" + std::to_string(server_.port()) +
                            "/turns?ttl=50");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto tier = MakeTier(*spec, kPageBytes, "model A");
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_EQ((*tier)->name(), "redis");
  const std::vector<uint8_t> page = PageBytes(3, kPageBytes);
  ASSERT_TRUE(PutOne(**tier, 3, page).ok());
  RawRedis raw(server_.port());
  const std::vector<std::string> names = raw.Keys("turns:*");
  ASSERT_EQ(names.size(), 1u);
  const int64_t ttl = raw.Integer({"TTL", names[0]});
  EXPECT_GT(ttl, 40);
  EXPECT_LE(ttl, 50);
  // The same spec and identity from "another process" finds the page.
  auto again = MakeTier(*spec, kPageBytes, "model A");
  ASSERT_TRUE(again.ok());
  std::vector<uint8_t> out(kPageBytes);
  ASSERT_TRUE(GetOne(**again, 3, out).ok());
  EXPECT_EQ(out, page);
}

TEST(RedisTierSpecTest, GoodSpecs) {
  struct Case {
    const char* spec;
    const char* host;
    int port;
    const char* name_space;
    int64_t ttl_seconds;
  };
  const Case cases[] = {
      {"redis://127.0.0.1:6380/turns?ttl=60", "127.0.0.1", 6380, "turns", 60},
      {"redis://localhost", "localhost", 6379, "kvl", 0},
      {"redis://cache.internal:7000", "cache.internal", 7000, "kvl", 0},
      {"REDIS://Cache:1/ns", "Cache", 1, "ns", 0},
      {"redis://h/", "h", 6379, "kvl", 0},
      {"redis://h?TTL=3600", "h", 6379, "kvl", 3600},
      {"redis://[::1]:6390/a:b", "::1", 6390, "a:b", 0},
      {"redis://[::1]", "::1", 6379, "kvl", 0},
      {"redis://h:65535/x/y", "h", 65535, "x/y", 0},
  };
  for (const Case& c : cases) {
    auto spec = ParseTierSpec(c.spec);
    ASSERT_TRUE(spec.ok()) << c.spec << ": " << spec.status().ToString();
    EXPECT_EQ(spec->kind, TierKind::kRedis) << c.spec;
    EXPECT_EQ(spec->host, c.host) << c.spec;
    EXPECT_EQ(spec->port, c.port) << c.spec;
    EXPECT_EQ(spec->name_space, c.name_space) << c.spec;
    EXPECT_EQ(spec->ttl_seconds, c.ttl_seconds) << c.spec;
  }
  // The other kinds are unchanged.
  auto disk = ParseTierSpec("disk:/tmp/redis://x:1G");
  ASSERT_TRUE(disk.ok()) << disk.status().ToString();
  EXPECT_EQ(disk->kind, TierKind::kDisk);
  EXPECT_EQ(disk->path, "/tmp/redis://x");
}

TEST(RedisTierSpecTest, BadSpecsNameTheBadPart) {
  struct Case {
    const char* spec;
    const char* mentions;
  };
  const Case cases[] = {
      {"redis", "a redis tier is a URL starting with redis://"},
      {"redis:localhost:6379", "a redis tier is a URL starting with redis://"},
      {"redis:/localhost", "a redis tier is a URL starting with redis://"},
      {"redis://", "the host is empty"},
      {"redis://:6379", "the host is empty"},
      {"redis:///ns", "the host is empty"},
      {"redis://h:0", "the port '0' is not a number from 1 to 65535"},
      {"redis://h:65536", "the port '65536' is not"},
      {"redis://h:http", "the port 'http' is not"},
      {"redis://h:", "the port '' is not"},
      {"redis://h:-1", "the port '-1' is not"},
      {"redis://::1:6379", "an IPv6 address goes in brackets"},
      {"redis://[::1", "no closing ']'"},
      {"redis://[::1]x", "unexpected 'x' after the host"},
      {"redis://user:secret@h:6379", "a user name or password is not supported"},
      {"redis://h/my ns", "the namespace 'my ns' has a space"},
      {"redis://h?ttl=0", "the ttl '0' is not a positive whole number"},
      {"redis://h?ttl=1h", "the ttl '1h' is not"},
      {"redis://h?ttl=", "the ttl '' is not"},
      {"redis://h?ttl=99999999999999999999", "is not a positive whole number"},
      {"redis://h?db=2", "unknown option 'db=2'"},
  };
  for (const Case& c : cases) {
    auto spec = ParseTierSpec(c.spec);
    ASSERT_FALSE(spec.ok()) << c.spec;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << c.spec;
    EXPECT_NE(spec.status().message().find(c.mentions), std::string::npos)
        << c.spec << " -> " << spec.status().message();
    EXPECT_NE(spec.status().message().find("redis://HOST[:PORT][/NAMESPACE][?ttl=SECONDS]"),
              std::string::npos)
        << c.spec << " -> " << spec.status().message();
  }
}

}  // namespace
}  // namespace kvl
