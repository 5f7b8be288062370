// The KV events publisher (kvl/kv_events.h): the exact bytes of vLLM's array-like msgpack
// structs, the three-frame messages on the PUB socket with consecutive sequence numbers, the
// replay protocol (batches from a sequence number, then -1), and clear errors for bad addresses.
#include "kvl/kv_events.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "events/kv_event_encoding.h"

namespace kvl {
namespace {

using events_internal::EncodeKvEventBatch;
using events_internal::KvEvent;

std::string Hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

TEST(KvEventEncodingTest, BatchIsVllmsArrayLikeStructsByteForByte) {
  KvEventOptions options;
  const std::vector<int32_t> tokens = {1, 2};
  KvEvent stored;
  stored.kind = KvEvent::Kind::kStored;
  stored.hash = 0xfffffffffffffff0ull;  // past 2^63: a msgpack uint64, as msgspec's int
  stored.token_count = 2;
  KvEvent child = stored;
  child.hash = 42;
  child.has_parent = true;
  child.parent_hash = 0xfffffffffffffff0ull;
  KvEvent removed;
  removed.kind = KvEvent::Kind::kRemoved;
  removed.hash = 42;
  KvEvent cleared;
  cleared.kind = KvEvent::Kind::kAllCleared;
  const std::vector<KvEvent> events = {stored, child, removed, cleared};
  const std::string bytes = EncodeKvEventBatch(1.5, events, tokens, options);
  const std::string block_stored_tag = "ab" + Hex("BlockStored");
  const std::string expected =
      "93" "cb3ff8000000000000" "94"  // [ts 1.5, [4 events], ...
      "97" + block_stored_tag + "91cffffffffffffffff0" "c0" "920102" "10" "c0" "a3" + Hex("GPU") +
      "97" + block_stored_tag + "912a" "cffffffffffffffff0" "920102" "10" "c0" "a3" + Hex("GPU") +
      "93" "ac" + Hex("BlockRemoved") + "912a" "a3" + Hex("GPU") +
      "91" "b0" + Hex("AllBlocksCleared") +
      "00";  // data_parallel_rank 0]
  EXPECT_EQ(Hex(bytes), expected);
}

TEST(KvEventPublisherTest, BadAddressesAreErrorsNamingThem) {
  KvEventOptions options;
  options.endpoint = "tcp://*:notaport";
  auto bad = KvEventPublisher::Create(options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tcp://*:notaport"), std::string::npos);
  options.endpoint = "inproc://kv-events-bad-replay";
  options.replay_endpoint = "tcp://no-such-host.invalid:5558";
  auto bad_replay = KvEventPublisher::Create(options);
  ASSERT_FALSE(bad_replay.ok());
  EXPECT_NE(bad_replay.status().message().find("--kv-events-replay"), std::string::npos);
  options.replay_batches = 0;
  options.replay_endpoint.clear();
  EXPECT_FALSE(KvEventPublisher::Create(options).ok());
}

// A loopback port free now (the kernel's pick for a socket bound to port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

// Frames of one message, waiting up to 5 s.
std::vector<zmq::message_t> Receive(zmq::socket_t& socket) {
  std::vector<zmq::message_t> frames;
  socket.set(zmq::sockopt::rcvtimeo, 5000);
  EXPECT_TRUE(zmq::recv_multipart(socket, std::back_inserter(frames)));
  return frames;
}

uint64_t Seq(const zmq::message_t& m) {
  EXPECT_EQ(m.size(), 8u);
  uint64_t v = 0;
  for (size_t i = 0; i < m.size(); ++i) v = (v << 8) | static_cast<const uint8_t*>(m.data())[i];
  return v;
}

TEST(KvEventPublisherTest, PublishesStepBatchesAndReplaysFromASequenceNumber) {
  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  // The publisher connects, as engines connect to llm-d's indexer.
  const std::string sub_address = fmt::format("tcp://127.0.0.1:{}", FreePort());
  sub.bind(sub_address);
  KvEventOptions options;
  options.endpoint = sub_address;
  options.replay_endpoint = fmt::format("tcp://127.0.0.1:{}", FreePort());
  options.topic = "kv@test";
  options.replay_batches = 2;
  auto created = KvEventPublisher::Create(options);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  KvEventPublisher& publisher = **created;
  const std::vector<int32_t> tokens(16, 7);
  std::vector<uint64_t> index;
  auto step = [&] {  // one engine step that stores one block
    const uint64_t hash = index.size() + 1;
    publisher.BlockStored(hash, hash - 1, index.empty(), tokens);
    index.push_back(hash);
    publisher.IndexSnapshot(index);
  };
  // PUB drops what it sends before the subscription has joined (ZeroMQ's slow joiner): step
  // until a batch arrives, then every later step's batch arrives with the next number.
  sub.set(zmq::sockopt::rcvtimeo, 100);
  std::vector<zmq::message_t> frames;
  for (int tries = 0; tries < 100 && frames.empty(); ++tries) {
    step();
    (void)zmq::recv_multipart(sub, std::back_inserter(frames));
  }
  ASSERT_EQ(frames.size(), 3u) << "no batch arrived in 10 s";
  EXPECT_EQ(frames[0].to_string(), "kv@test");
  // The first to arrive may be batch 0 (the AllBlocksCleared sent at start) when the connection
  // was up in time, or a later one; batches already queued behind it (the publisher thread may
  // have put several steps in one) are read until none comes for half a second.
  uint64_t last = Seq(frames[1]);
  sub.set(zmq::sockopt::rcvtimeo, 500);
  for (;;) {
    std::vector<zmq::message_t> queued;
    if (!zmq::recv_multipart(sub, std::back_inserter(queued))) break;
    ASSERT_EQ(queued.size(), 3u);
    EXPECT_EQ(Seq(queued[1]), last + 1);
    last = Seq(queued[1]);
  }
  EXPECT_LE(last, index.size());  // at most one batch per step after the clear (batch 0)
  for (int i = 0; i < 2; ++i) {
    step();
    std::vector<zmq::message_t> next = Receive(sub);
    ASSERT_EQ(next.size(), 3u);
    EXPECT_EQ(Seq(next[1]), last + 1);
    last = Seq(next[1]);
  }
  const KvIndexState state = publisher.IndexState();
  EXPECT_EQ(state.hashes, index);
  EXPECT_EQ(state.events_through, static_cast<int64_t>(index.size()) + 1);  // and the clear
  // Replay from 0 with 2 batches kept: the last two, then the end marker.
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.connect(options.replay_endpoint);
  const uint64_t from = 0;
  std::string request(8, '\0');
  for (size_t b = 0; b < 8; ++b) request[b] = static_cast<char>(from >> (56 - 8 * b));
  dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(request), zmq::send_flags::none);
  std::vector<uint64_t> replayed;
  for (;;) {
    std::vector<zmq::message_t> frames = Receive(dealer);
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_EQ(frames[0].size(), 0u);
    if (Seq(frames[1]) == ~uint64_t{0}) {
      EXPECT_EQ(frames[2].size(), 0u);
      break;
    }
    replayed.push_back(Seq(frames[1]));
  }
  EXPECT_EQ(replayed, (std::vector<uint64_t>{last - 1, last}));
  // A malformed request is ignored and counted; the socket keeps answering.
  dealer.send(zmq::buffer(std::string("x")), zmq::send_flags::none);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(publisher.counts().replay_requests_refused, 1);
  EXPECT_EQ(publisher.counts().replays_served, 1);
  EXPECT_EQ(publisher.counts().batches_sent, static_cast<int64_t>(last) + 1);
}

}  // namespace
}  // namespace kvl
