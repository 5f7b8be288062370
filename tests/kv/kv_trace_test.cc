// The KV page-access trace: written and read back unchanged, malformed lines refused with their
// line number; and its replay: hand-made traces whose misses are known (a loop one page larger
// than the set, where LRU misses every read), Belady's optimal never beaten on random traces, the
// reuse forecast keeping a running sequence's pages, and the engine's recorded decisions priced.
#include "kvl/kv_trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "kvl/kv_trace_replay.h"

namespace kvl {
namespace {

using Kind = KvTraceEvent::Kind;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/kvl-trace-" + std::to_string(getpid()) + "-" + name;
}

KvTraceEvent Step(int64_t step) {
  KvTraceEvent e;
  e.kind = Kind::kStep;
  e.step = step;
  return e;
}
KvTraceEvent Page(int64_t page, int64_t request, int64_t block, KvContentId content = {}) {
  KvTraceEvent e;
  e.kind = Kind::kPage;
  e.page = page;
  e.request = request;
  e.block = block;
  e.content = content;
  return e;
}
KvTraceEvent Read(int64_t request, int64_t count, int64_t from, std::vector<int64_t> outside = {},
                  std::vector<int64_t> evicted = {}) {
  KvTraceEvent e;
  e.kind = Kind::kRead;
  e.request = request;
  e.block = count;
  e.from = from;
  e.outside = std::move(outside);
  e.evicted = std::move(evicted);
  return e;
}
KvTraceEvent Leave(int64_t page, int64_t request, KvAction action, KvTraceCause cause,
                   double predicted) {
  KvTraceEvent e;
  e.kind = Kind::kLeave;
  e.page = page;
  e.request = request;
  e.action = static_cast<int>(action);
  e.cause = cause;
  e.predicted_ms = predicted;
  return e;
}
KvTraceEvent Back(int64_t page, KvAction action, double predicted, double measured) {
  KvTraceEvent e;
  e.kind = Kind::kBack;
  e.page = page;
  e.action = static_cast<int>(action);
  e.predicted_ms = predicted;
  e.measured_ms = measured;
  return e;
}

TEST(KvTraceTest, RoundTripGivesTheSameEvents) {
  KvTraceHeader header;
  header.block_tokens = 16;
  header.pool_blocks = 40;
  header.sink_tokens = 4;
  header.recent_tokens = 64;
  header.price_ms = {0, 0.5, 0.25, 0.125, 2, -1, 1.5, 0};
  const KvContentId a{0x1111, 0xaaaa}, b{0x2222, 0xbbbb}, c{0x3333, 0xcccc};
  const std::string path = TempPath("roundtrip");
  {
    StatusOr<std::unique_ptr<KvTraceWriter>> w = KvTraceWriter::Open(path, header);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    KvTraceWriter& t = **w;
    t.Step();
    const std::vector<KvContentId> r7 = {a, b};
    t.Read(7, r7, 0);
    t.Step();
    // Request 8 shares request 7's first page (same content) and has one of its own with no id.
    const std::vector<KvContentId> r8 = {a, c, {}};
    t.Read(8, r8, 1);
    t.Leave(7, 1, static_cast<int>(KvAction::kDemoteRam), KvTraceCause::kPreempt, 0.125);
    t.Leave(8, 2, static_cast<int>(KvAction::kCompressInt8), KvTraceCause::kRelief, 0);
    t.LeaveReused(c);
    t.LeaveReused(KvContentId{9, 9});  // never read: not traced
    t.Leave(9, 0, static_cast<int>(KvAction::kEvict), KvTraceCause::kRelief, 0);  // unknown
    t.Step();
    t.Back(7, 1, static_cast<int>(KvAction::kDemoteRam), 0.125, 0.375);
    t.Read(7, r7, 2);
    const std::vector<int64_t> outside = {0, 2, 3, 4, 7}, evicted = {1};
    const std::vector<KvContentId> r9(8);
    t.Read(9, r9, 8, outside, evicted, /*steps_left=*/41);
    EXPECT_EQ(t.steps(), 2);
    ASSERT_TRUE(t.Close().ok());
  }
  StatusOr<KvTrace> trace = ReadKvTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  EXPECT_EQ(trace->header, header);
  EXPECT_EQ(trace->num_pages, 12);
  const std::vector<KvTraceEvent> expected = {
      Step(0),
      Page(0, 7, 0, a),
      Page(1, 7, 1, b),
      Read(7, 2, 0),
      Step(1),
      Page(0, 8, 0, a),
      Page(2, 8, 1, c),
      Page(3, 8, 2),
      Read(8, 3, 1),
      Leave(1, 7, KvAction::kDemoteRam, KvTraceCause::kPreempt, 0.125),
      Leave(3, 8, KvAction::kCompressInt8, KvTraceCause::kRelief, 0),
      [] {
        KvTraceEvent e = Leave(2, -1, KvAction::kKeep, KvTraceCause::kReuse, 0);
        e.action = kKvTracePoolReuse;
        return e;
      }(),
      Step(2),
      Back(1, KvAction::kDemoteRam, 0.125, 0.375),
      Read(7, 2, 2),
      Page(4, 9, 0),
      Page(5, 9, 1),
      Page(6, 9, 2),
      Page(7, 9, 3),
      Page(8, 9, 4),
      Page(9, 9, 5),
      Page(10, 9, 6),
      Page(11, 9, 7),
      [] {
        KvTraceEvent e = Read(9, 8, 8, {0, 2, 3, 4, 7}, {1});
        e.steps_left = 41;
        return e;
      }(),
  };
  EXPECT_EQ(trace->events, expected);

  // The reads expand to one access per page, in order; page 0 is shared by both requests.
  const std::vector<KvTraceAccess> accesses = KvTraceAccesses(*trace);
  std::vector<int64_t> pages;
  for (const KvTraceAccess& x : accesses) pages.push_back(x.page);
  EXPECT_EQ(pages, (std::vector<int64_t>{0, 1, 0, 2, 3, 0, 1, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_FALSE(accesses[2].computed);  // request 8 computed from block 1 on
  EXPECT_TRUE(accesses[3].computed);
}

TEST(KvTraceTest, MalformedTracesAreRefusedWithTheirLine) {
  const std::string header = "kvl-trace 1 block_tokens=16 pool_blocks=4\n";
  EXPECT_FALSE(ParseKvTrace("").ok());
  EXPECT_FALSE(ParseKvTrace("not a trace\n").ok());
  EXPECT_FALSE(ParseKvTrace("kvl-trace 2\n").ok());
  EXPECT_TRUE(ParseKvTrace(header + "S 0\nP 0 1 0 -\nR 1 1 0\n").ok());
  const Status unnamed = ParseKvTrace(header + "S 0\nP 0 1 0 -\nR 1 2 0\n").status();
  EXPECT_NE(unnamed.message().find("line 4"), std::string::npos) << unnamed.message();
  EXPECT_FALSE(ParseKvTrace(header + "P 0 1 1 -\n").ok());  // block 1 before block 0
  EXPECT_FALSE(ParseKvTrace(header + "P 5 1 0 -\n").ok());  // page ids skip
  EXPECT_TRUE(ParseKvTrace(header + "P 0 1 0 -\nL 0 1 evict relief 0\n").ok());
  EXPECT_FALSE(ParseKvTrace(header + "P 0 1 0 -\nL 0 1 fly relief 0\n").ok());
  EXPECT_FALSE(ParseKvTrace(header + "P 0 1 0 -\nL 0 1 evict sideways 0\n").ok());
  EXPECT_FALSE(ParseKvTrace(header + "P 0 1 0 -\nL 0 evict relief 0\n").ok());  // no request
  EXPECT_FALSE(ParseKvTrace(header + "P 0 1 0 -\nB 1 demote-ram 0 0\n").ok());  // page 1 unnamed
  EXPECT_FALSE(ParseKvTrace(header + "P 0 1 0 xyz\n").ok());
  const std::string two = header + "P 0 1 0 -\nP 1 1 1 -\n";
  EXPECT_TRUE(ParseKvTrace(two + "R 1 2 2 0-1 -\n").ok());
  EXPECT_FALSE(ParseKvTrace(two + "R 1 2 2 0-2 -\n").ok());  // block 2 was not read
  EXPECT_FALSE(ParseKvTrace(two + "R 1 2 2 1,0 -\n").ok());  // not ascending
  EXPECT_FALSE(ParseKvTrace(two + "R 1 2 2 -\n").ok());      // one list without the other
  EXPECT_EQ(ParseKvTrace(two + "R 1 2 2 - - 7\n")->events.back().steps_left, 7);
  EXPECT_EQ(ParseKvTrace(two + "R 1 2 2 - - -\n")->events.back().steps_left, -1);
  EXPECT_FALSE(ParseKvTrace(two + "R 1 2 2 - - x\n").ok());  // steps left not a number
  EXPECT_FALSE(ParseKvTrace(two + "R 1 2 2 - - -3\n").ok());
  EXPECT_FALSE(ParseKvTrace("kvl-trace 1 price_ms=1,2\n").ok());
  // A trace written before demote-redis has one price fewer: the missing one is not available.
  StatusOr<KvTrace> old = ParseKvTrace("kvl-trace 1 price_ms=0,-,-,1.5,-,-,9,0\n");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->header.price_ms[static_cast<size_t>(KvAction::kDemoteRam)], 1.5);
  EXPECT_LT(old->header.price_ms[static_cast<size_t>(KvAction::kDemoteRedis)], 0);
}

// A trace over `num_pages` pages from one page sequence, one step per access.
KvTrace TraceOf(int64_t num_pages) {
  KvTrace t;
  t.num_pages = num_pages;
  return t;
}
std::vector<KvTraceAccess> AccessesOf(const std::vector<int64_t>& pages) {
  std::vector<KvTraceAccess> out;
  for (size_t i = 0; i < pages.size(); ++i) {
    KvTraceAccess a;
    a.step = static_cast<int64_t>(i);
    a.page = pages[i];
    a.request = pages[i];  // one page per request: no sinks or recent windows in play
    a.block = 8;
    a.read_blocks = 100;
    out.push_back(a);
  }
  return out;
}

KvReplayResult Replay(const KvTrace& t, const std::vector<KvTraceAccess>& a, KvReplayPolicy p,
                      int64_t capacity) {
  KvReplayOptions o;
  o.capacity_pages = capacity;
  o.miss_ms = 2;
  return ReplayKvTrace(t, a, p, o);
}

// Pages 0 1 2 3 read twice with room for 3: LRU (and LFU, every count tied) evicts each page just
// before it is read again and misses all four second reads; Belady misses one.
TEST(KvTraceReplayTest, LoopOneLargerThanTheSetIsLruPathological) {
  const KvTrace t = TraceOf(4);
  const auto a = AccessesOf({0, 1, 2, 3, 0, 1, 2, 3});
  for (KvReplayPolicy p : {KvReplayPolicy::kLru, KvReplayPolicy::kLfu}) {
    const KvReplayResult r = Replay(t, a, p, 3);
    EXPECT_EQ(r.cold, 4) << r.policy;
    EXPECT_EQ(r.misses, 4) << r.policy;
    EXPECT_EQ(r.hits, 0) << r.policy;
    EXPECT_DOUBLE_EQ(r.cost_ms, 8.0) << r.policy;
  }
  const KvReplayResult opt = Replay(t, a, KvReplayPolicy::kBelady, 3);
  EXPECT_EQ(opt.cold, 4);
  EXPECT_EQ(opt.misses, 1);
  EXPECT_EQ(opt.hits, 3);
  EXPECT_DOUBLE_EQ(opt.cost_ms, 2.0);
  // With room for all four, nothing misses under any policy.
  for (KvReplayPolicy p : {KvReplayPolicy::kPolicy, KvReplayPolicy::kLru, KvReplayPolicy::kLfu,
                           KvReplayPolicy::kBelady}) {
    EXPECT_EQ(Replay(t, a, p, 4).misses, 0);
  }
}

// A page read often long ago and never again fools LFU, not LRU: 0 is read five times, then 1 2 1
// 2 ... with room for 2; LFU keeps 0 forever and misses every other read, LRU only the first two.
TEST(KvTraceReplayTest, FrequencyFromThePastFoolsLfu) {
  const KvTrace t = TraceOf(3);
  const auto a = AccessesOf({0, 0, 0, 0, 0, 1, 2, 1, 2, 1, 2, 1, 2});
  EXPECT_EQ(Replay(t, a, KvReplayPolicy::kLru, 2).misses, 0);
  EXPECT_EQ(Replay(t, a, KvReplayPolicy::kLfu, 2).misses, 6);
  EXPECT_EQ(Replay(t, a, KvReplayPolicy::kBelady, 2).misses, 0);
}

// Belady's optimal is never beaten, on random traces of every capacity.
TEST(KvTraceReplayTest, BeladyNeverMissesMoreThanAnyPolicy) {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    const int64_t num_pages = 3 + static_cast<int64_t>(rng() % 20);
    std::vector<int64_t> pages;
    // Skewed: a few hot pages and a cold tail, so policies differ.
    for (int i = 0; i < 300; ++i) {
      pages.push_back(rng() % 3 == 0 ? static_cast<int64_t>(rng() % num_pages)
                                     : static_cast<int64_t>(rng() % 3));
    }
    const KvTrace t = TraceOf(num_pages);
    const auto a = AccessesOf(pages);
    for (int64_t capacity = 1; capacity <= num_pages; ++capacity) {
      const KvReplayResult opt = Replay(t, a, KvReplayPolicy::kBelady, capacity);
      for (KvReplayPolicy p :
           {KvReplayPolicy::kPolicy, KvReplayPolicy::kLru, KvReplayPolicy::kLfu}) {
        const KvReplayResult r = Replay(t, a, p, capacity);
        EXPECT_LE(opt.misses, r.misses) << r.policy << " capacity " << capacity;
        EXPECT_EQ(r.cold + r.hits + r.misses, r.accesses);
        EXPECT_EQ(r.cold, opt.cold);
      }
    }
  }
}

// The reuse forecast keeps what a running sequence reads every step: request 1 reads its 4 pages
// at every step; request 2 read 4 pages once at step 0 and stopped (its pages idle); request 3
// then brings 4 new pages. With room for 8, the forecast evicts request 2's pages, so request 1
// never misses.
TEST(KvTraceReplayTest, PolicyKeepsARunningSequencesPages) {
  KvTrace t;
  t.header.block_tokens = 16;
  int64_t next_page = 0;
  auto name = [&](int64_t request, int64_t blocks) {
    for (int64_t b = 0; b < blocks; ++b) t.events.push_back(Page(next_page++, request, b));
  };
  t.events.push_back(Step(0));
  name(1, 4);
  t.events.push_back(Read(1, 4, 0));
  name(2, 4);
  t.events.push_back(Read(2, 4, 0));
  for (int64_t s = 1; s < 10; ++s) {
    t.events.push_back(Step(s));
    t.events.push_back(Read(1, 4, 4));
  }
  t.events.push_back(Step(10));
  name(3, 4);
  t.events.push_back(Read(3, 4, 0));
  t.events.push_back(Read(1, 4, 4));
  t.events.push_back(Step(11));
  t.events.push_back(Read(1, 4, 4));
  t.num_pages = next_page;
  const std::vector<KvTraceAccess> a = KvTraceAccesses(t);
  KvReplayOptions o;
  o.capacity_pages = 8;
  o.miss_ms = 1;
  const KvReplayResult r = ReplayKvTrace(t, a, KvReplayPolicy::kPolicy, o);
  EXPECT_EQ(r.cold, 12);
  EXPECT_EQ(r.misses, 0);
  EXPECT_EQ(ReplayKvTrace(t, a, KvReplayPolicy::kBelady, o).misses, 0);
}

// The forecast knows the whole step's reads, as the engine plans them before the step: request 1
// read pages 0-3 at step 0 and request 2 pages 4-7 at step 30, both then idle; at step 40 request
// 3 reads two new pages first (two evictions with room for 8), then request 5 continues request
// 1 (its pages 0-3). Judged access by access, pages 0-3 look the deadest (idle longest) and leave,
// so request 5 misses; planned by step, they are about to be read and request 2's pages leave.
TEST(KvTraceReplayTest, PolicySeesTheWholeStepsReads) {
  KvTrace t;
  t.header.block_tokens = 16;
  for (int64_t b = 0; b < 4; ++b) t.events.push_back(Page(b, 1, b));
  for (int64_t b = 0; b < 4; ++b) t.events.push_back(Page(4 + b, 2, b));
  for (int64_t b = 0; b < 2; ++b) t.events.push_back(Page(8 + b, 3, b));
  for (int64_t b = 0; b < 4; ++b) t.events.push_back(Page(b, 5, b));  // request 1's pages
  t.events.push_back(Step(0));
  t.events.push_back(Read(1, 4, 0));
  t.events.push_back(Step(30));
  t.events.push_back(Read(2, 4, 0));
  t.events.push_back(Step(40));
  t.events.push_back(Read(3, 2, 0));
  t.events.push_back(Read(5, 4, 4));
  t.num_pages = 10;
  const std::vector<KvTraceAccess> a = KvTraceAccesses(t);
  KvReplayOptions o;
  o.capacity_pages = 8;
  o.miss_ms = 1;
  EXPECT_EQ(ReplayKvTrace(t, a, KvReplayPolicy::kBelady, o).misses, 0);
  const KvReplayResult r = ReplayKvTrace(t, a, KvReplayPolicy::kPolicy, o);
  EXPECT_EQ(r.cold, 10);
  EXPECT_EQ(r.misses, 0);
  EXPECT_EQ(r.hits, 4);
}

// The engine's own decisions priced: a page read from outside the pool misses at every read, a
// page brought back misses once, a page dropped at a preemption misses when it is computed again
// and is a hit when its cached block was found instead, and an evicted page is lost.
TEST(KvTraceReplayTest, RecordedDecisionsArePriced) {
  KvTrace t;
  t.header.pool_blocks = 3;
  t.num_pages = 4;
  t.events = {
      Step(0),
      Page(0, 1, 0),
      Page(1, 1, 1),
      Page(2, 1, 2),
      Page(3, 1, 3),
      Read(1, 4, 0),
      // Page 1 streamed from RAM and page 3 evicted while the sequence runs: two steps read them.
      Leave(1, 1, KvAction::kDemoteRam, KvTraceCause::kRelief, 0.1),
      Leave(3, 1, KvAction::kEvict, KvTraceCause::kRelief, 0),
      Step(1),
      Read(1, 4, 4, {1}, {3}),
      Step(2),
      Read(1, 4, 4, {1}, {3}),
      // Preempted: page 0 demoted (brought back at resume), pages 1 and 2 dropped and computed
      // again from block 1 on.
      Leave(0, 1, KvAction::kDemoteRam, KvTraceCause::kPreempt, 0.1),
      Leave(1, 1, KvAction::kRecomputeTokens, KvTraceCause::kPreempt, 1.0),
      Leave(2, 1, KvAction::kRecomputeTokens, KvTraceCause::kPreempt, 1.0),
      Step(3),
      Back(0, KvAction::kDemoteRam, 0.1, 0.2),
      Read(1, 3, 1),
  };
  t.events.push_back(Step(4));
  t.events.push_back(Read(1, 3, 3));
  const KvRecordedResult r = ReplayRecordedDecisions(t, 2.0);
  EXPECT_EQ(r.replay.cold, 4);
  EXPECT_EQ(r.streamed_reads, 2);  // page 1 at steps 1 and 2
  EXPECT_EQ(r.lost_reads, 2);      // page 3 at steps 1 and 2
  EXPECT_EQ(r.brought_back, 1);
  EXPECT_EQ(r.recomputed, 2);  // pages 1 and 2 at step 3 (from block 1)
  EXPECT_EQ(r.replay.misses, 5);
  EXPECT_DOUBLE_EQ(r.replay.cost_ms, 10.0);
  EXPECT_EQ(r.replay.capacity_pages, 3);

  // The same preemption, but the sequence resumes computing only from block 2: page 1 was found.
  t.events[t.events.size() - 3].from = 2;
  const KvRecordedResult found = ReplayRecordedDecisions(t, 2.0);
  EXPECT_EQ(found.recomputed, 1);
}

}  // namespace
}  // namespace kvl
