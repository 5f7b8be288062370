// The KV reuse forecast: a running page's next read from the schedule, an idle page's from the
// history of idle pages read again; and replayed, on a hand-built cyclic scan (every running
// sequence reads all its pages at every step), the policy's cost within 10% of Belady's while
// LRU's are not; a chat's idle history kept over a one-off's, a conversation's pages judged by
// conversations' pauses, a preempted sequence's pages kept for its resume; and a trace replayed
// through the engine's own KV manager, its idle cached blocks reused in the forecast's order.
#include "kvl/kv_reuse_forecast.h"

#include <gtest/gtest.h>

#include "kvl/kv_trace_replay.h"

namespace kvl {
namespace {

KvReuseForecast Running(int64_t steps_to_read, int64_t reads_left, int64_t order) {
  KvReuseInput in;
  in.running_reader = true;
  in.steps_to_read = steps_to_read;
  in.reads_left = reads_left;
  in.order_in_step = order;
  return ForecastReuse(in, KvIdleReuseHistory{});
}

// Misses of a replay of `trace` through `capacity` pages.
int64_t Misses(const KvTrace& trace, KvReplayPolicy policy, int64_t capacity) {
  KvReplayOptions o;
  o.capacity_pages = capacity;
  o.miss_ms = 1;
  return ReplayKvTrace(trace, KvTraceAccesses(trace), policy, o).misses;
}

TEST(KvReuseForecastTest, RunningPagesLeaveFarthestReadFirstThenFewestReadsLeft) {
  // Read at the next step leaves before read later in this one, however many reads are left.
  EXPECT_TRUE(KvPageLeavesFirst(Running(1, 100, 0), Running(0, 1, 5)));
  EXPECT_FALSE(KvPageLeavesFirst(Running(0, 1, 5), Running(1, 100, 0)));
  // The same step: the one whose sequence ends sooner (read from a tier fewer times).
  EXPECT_TRUE(KvPageLeavesFirst(Running(1, 3, 0), Running(1, 50, 9)));
  // And with as many reads left, the one read later in the step (a cyclic scan's farthest).
  EXPECT_TRUE(KvPageLeavesFirst(Running(1, 3, 9), Running(1, 3, 2)));
  // Unknown steps left count as many.
  EXPECT_TRUE(KvPageLeavesFirst(Running(1, 3, 0), Running(1, -1, 0)));
  // A sequence with no step left does not read it again: the page is idle, read only by reuse.
  EXPECT_TRUE(KvPageLeavesFirst(Running(0, 0, 0), Running(1, 1, 0)));
}

TEST(KvReuseForecastTest, AWaitingSequencesPagesAreReadWhenItResumes) {
  KvReuseInput waiting;
  waiting.waiting_reader = true;
  waiting.steps_to_resume = 6;
  waiting.reads_left = 10;
  waiting.idle_steps = 40;  // long unread, yet certain to be read: no idle history applies
  const KvReuseForecast f = ForecastReuse(waiting, KvIdleReuseHistory{});
  EXPECT_DOUBLE_EQ(f.next_read_steps, 6);
  EXPECT_DOUBLE_EQ(f.reads_left, 10);
  // Kept over a page idle for a step whose revival is a coin toss, left before a running one.
  KvReuseInput idle;
  idle.idle_steps = 1;
  EXPECT_TRUE(KvPageLeavesFirst(ForecastReuse(idle, KvIdleReuseHistory{}), f));
  EXPECT_TRUE(KvPageLeavesFirst(f, Running(1, 3, 0)));
  // A waiting sequence with no step left reads nothing more.
  waiting.reads_left = 0;
  EXPECT_FALSE(KvPageLeavesFirst(ForecastReuse(idle, KvIdleReuseHistory{}),
                                 ForecastReuse(waiting, KvIdleReuseHistory{})));
}

TEST(KvReuseForecastTest, IdlePagesFromTheHistoryOfPagesReadAgain) {
  KvIdleReuseHistory h;
  // An empty history: one in two, after the named default pause.
  EXPECT_DOUBLE_EQ(h.RevivalProbability(0, 0, 1, 0), 0.5);
  EXPECT_DOUBLE_EQ(h.RemainingGapSteps(0), KvIdleReuseHistory::kDefaultIdleGapSteps);
  // 40 pages went idle after step 0: 20 read again at step 4, 20 never (asked at step 10).
  for (int i = 0; i < 40; ++i) h.PageWentIdle(0);
  for (int i = 0; i < 20; ++i) h.PageRevived(0, 4);
  EXPECT_EQ(h.revived_pages(), 20);
  EXPECT_EQ(h.idle_pages(), 20);
  const double fresh = h.RevivalProbability(10, 0, 1, 0);
  const double stale = h.RevivalProbability(10, 10, 1, 0);
  EXPECT_NEAR(fresh, 0.5, 0.05);
  EXPECT_LT(stale, 0.1);  // past every pause seen: the ones never read again
  EXPECT_DOUBLE_EQ(h.RemainingGapSteps(1), 3.0);
  // A page read again after each of its 3 earlier idle periods (a shared opening) is likelier.
  EXPECT_GT(h.RevivalProbability(10, 10, 4, 3), 0.6);

  KvReuseInput idle;
  idle.step = 10;
  idle.idle_steps = 0;
  const KvReuseForecast soon = ForecastReuse(idle, h);
  EXPECT_NEAR(soon.next_read_steps, 4 / fresh, 1e-9);
  idle.idle_steps = 10;
  // A page idle past every pause seen is expected far later than one just idle, and both later
  // than a running page read at the next step.
  EXPECT_TRUE(KvPageLeavesFirst(ForecastReuse(idle, h), soon));
  EXPECT_TRUE(KvPageLeavesFirst(soon, Running(1, 5, 0)));
}

// What the history says of a long pause comes from the pages that were idle that long: 2 pages
// idle since step 0, none read again, and 40 that went idle at step 95. At step 100 a page idle
// for 100 steps is judged by the 2 (1 in 4 with Laplace's rule), not by the 42, of which the 40
// have not been idle that long and are no evidence that pages idle so long stay unread (counted,
// they made it 1 in 44, and every long-idle page the first to leave: LRU's order). Once 30 pages
// have stayed idle that long, the history does say so.
TEST(KvReuseForecastTest, OnlyPagesIdleAsLongJudgeALongPause) {
  KvIdleReuseHistory h;
  for (int i = 0; i < 2; ++i) h.PageWentIdle(0);
  for (int i = 0; i < 40; ++i) h.PageWentIdle(95);
  EXPECT_DOUBLE_EQ(h.RevivalProbability(100, 100, 1, 0), 0.25);
  EXPECT_DOUBLE_EQ(h.RevivalProbability(100, 5, 1, 0), 1.0 / 44);
  for (int i = 0; i < 28; ++i) h.PageWentIdle(0);
  EXPECT_DOUBLE_EQ(h.RevivalProbability(100, 100, 1, 0), 1.0 / 32);
  // A page read again after 50 steps counts among the pages idle for 10 (and the 40 do not yet),
  // not among those idle for 60.
  h.PageRevived(0, 50);
  EXPECT_DOUBLE_EQ(h.RevivalProbability(100, 10, 1, 0), 2.0 / 32);
  EXPECT_DOUBLE_EQ(h.RevivalProbability(100, 60, 1, 0), 1.0 / 31);
}

// A bounded history keeps the pauses of the latest revivals only, so an engine's history stays
// the same size however long it runs: with room for 2, the pause of 1 step recorded first is
// forgotten, and the mean of the rest (5 and 9 steps) is what is left of a pause.
TEST(KvReuseForecastTest, ABoundedHistoryForgetsTheOldestPauses) {
  KvIdleReuseHistory all, latest(2);
  for (KvIdleReuseHistory* h : {&all, &latest}) {
    for (int64_t gap : {1, 5, 9}) {
      h->PageWentIdle(0);
      h->PageRevived(0, gap);
    }
  }
  EXPECT_EQ(all.revived_pages(), 3);
  EXPECT_EQ(latest.revived_pages(), 2);
  EXPECT_DOUBLE_EQ(all.RemainingGapSteps(0), 5.0);
  EXPECT_DOUBLE_EQ(latest.RemainingGapSteps(0), 7.0);
  // After a pause of 6 only the 9 is left in both, and a fourth revival pushes out the 5.
  EXPECT_DOUBLE_EQ(latest.RemainingGapSteps(6), 3.0);
  latest.PageWentIdle(0);
  latest.PageRevived(0, 3);
  EXPECT_EQ(latest.revived_pages(), 2);
  EXPECT_DOUBLE_EQ(latest.RemainingGapSteps(0), 6.0);  // (3 + 9) / 2
  EXPECT_DOUBLE_EQ(latest.RemainingGapSteps(4), 5.0);  // 9 - 4
}

// A page read again after about the same pause each time (a conversation's history at every
// turn, an opening every other round of a workload) is expected when that pause ends, not after
// the history's pause: with an empty history (the named default pause, 16 steps, and one in two)
// a page revived 3 times after 60 steps each, idle for 10, waits (3 x 50 + 2 x 16) / 5 = 36.4
// more steps if read again. One idle for 50 is nearly due and is kept over one just idle, where
// the history alone would rank them the other way (the longer wait, the less likely). A page
// idle past its own pause is late on its own record: the history alone says.
TEST(KvReuseForecastTest, APageReadAgainAfterTheSamePauseIsExpectedWhenItsPauseEnds) {
  const KvIdleReuseHistory empty;
  KvReuseInput periodic;
  periodic.step = 100;
  periodic.idle_periods = 4;
  periodic.revivals = 3;
  periodic.revival_gap_steps = 3 * 60;
  periodic.idle_steps = 10;
  const double p = (3 + 2 * 0.5) / (3 + 2);  // its own record, weighed with the history's 1/2
  const KvReuseForecast just_idle = ForecastReuse(periodic, empty);
  EXPECT_DOUBLE_EQ(just_idle.reads_left, p);
  EXPECT_NEAR(just_idle.next_read_steps, (3 * 50 + 2 * 16) / 5.0 / p, 1e-9);
  periodic.idle_steps = 50;
  const KvReuseForecast nearly_due = ForecastReuse(periodic, empty);
  EXPECT_NEAR(nearly_due.next_read_steps, (3 * 10 + 2 * 16) / 5.0 / p, 1e-9);
  EXPECT_TRUE(KvPageLeavesFirst(just_idle, nearly_due));
  // Without its pauses (not known), both wait the history's default pause.
  periodic.revival_gap_steps = 0;
  EXPECT_NEAR(ForecastReuse(periodic, empty).next_read_steps, 16 / p, 1e-9);
  // Idle for 70 steps, past its own 60: the history's default pause only.
  periodic.revival_gap_steps = 3 * 60;
  periodic.idle_steps = 70;
  EXPECT_NEAR(ForecastReuse(periodic, empty).next_read_steps, 16 / p, 1e-9);
}

// Two sequences decode side by side under full attention, each reading its 4 pages at every step
// for 40 steps, with room for 6 of the 8: a cyclic scan. LRU evicts each page just before it is
// read again and misses every read; Belady keeps a stable set and misses about 2 a step; the
// forecast, knowing that a page read this step is read next at the next one, does as Belady does.
TEST(KvReuseForecastTest, CyclicScanPolicyWithinTenPercentOfBeladyAndLruIsNot) {
  KvTrace t;
  t.header.block_tokens = 16;
  constexpr int64_t kSteps = 40, kPages = 4;
  auto page_event = [](int64_t page, int64_t request, int64_t block) {
    KvTraceEvent e;
    e.kind = KvTraceEvent::Kind::kPage;
    e.page = page;
    e.request = request;
    e.block = block;
    return e;
  };
  for (int64_t s = 0; s < kSteps; ++s) {
    KvTraceEvent step;
    step.kind = KvTraceEvent::Kind::kStep;
    step.step = s;
    t.events.push_back(step);
    for (int64_t r = 0; r < 2; ++r) {
      if (s == 0) {
        for (int64_t b = 0; b < kPages; ++b) t.events.push_back(page_event(r * kPages + b, r, b));
      }
      KvTraceEvent read;
      read.kind = KvTraceEvent::Kind::kRead;
      read.request = r;
      read.block = kPages;
      read.from = s == 0 ? 0 : kPages;
      read.steps_left = kSteps - 1 - s;
      t.events.push_back(read);
    }
  }
  t.num_pages = 2 * kPages;
  const std::vector<KvTraceAccess> a = KvTraceAccesses(t);
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps * 2 * kPages));
  KvReplayOptions o;
  o.capacity_pages = 6;
  o.miss_ms = 1;
  const KvReplayResult opt = ReplayKvTrace(t, a, KvReplayPolicy::kBelady, o);
  const KvReplayResult policy = ReplayKvTrace(t, a, KvReplayPolicy::kPolicy, o);
  const KvReplayResult lru = ReplayKvTrace(t, a, KvReplayPolicy::kLru, o);
  EXPECT_EQ(policy.cold, 8);
  EXPECT_GT(opt.misses, 0);
  EXPECT_LE(opt.misses, policy.misses);
  EXPECT_LE(policy.cost_ms, 1.10 * opt.cost_ms) << policy.misses << " vs " << opt.misses;
  EXPECT_EQ(lru.misses, lru.accesses - lru.cold);  // every read after the first misses
  EXPECT_GT(lru.cost_ms, 1.10 * opt.cost_ms);
}

// Pages nobody reads any more, ranked by the history of idle pages read again: a chat's history
// (pages 0 and 1, read again by its second turn) outstays a one-off request's more recent pages
// (3 and 4) and the second turn's own new page (2), so the chat's third turn finds its history.
// LRU keeps the recent one-off pages instead and misses the chat's three; Belady misses one.
TEST(KvReuseForecastTest, AChatsHistoryOutstaysAOneOffsPages) {
  const StatusOr<KvTrace> t = ParseKvTrace(
      "kvl-trace 1 block_tokens=16 pool_blocks=5\n"
      // Turn 1 of the chat (request 1), two steps.
      "S 0\nP 0 1 0 -\nP 1 1 1 -\nR 1 2 0 - - 1\nS 1\nR 1 2 2 - - 0\n"
      // Turn 2 (request 2) reads turn 1's pages again and adds page 2.
      "S 2\nP 0 2 0 -\nP 1 2 1 -\nP 2 2 2 -\nR 2 3 2 - - 1\nS 3\nR 2 3 3 - - 0\n"
      // A one-off request (3), then another (4) whose three new pages need room.
      "S 4\nP 3 3 0 -\nP 4 3 1 -\nR 3 2 0 - - 1\nS 5\nR 3 2 2 - - 0\n"
      "S 6\nP 5 4 0 -\nP 6 4 1 -\nP 7 4 2 -\nR 4 3 0 - - 1\nS 7\nR 4 3 3 - - 0\n"
      // Turn 3 (request 5) reads the chat's history.
      "S 8\nP 0 5 0 -\nP 1 5 1 -\nP 2 5 2 -\nP 8 5 3 -\nR 5 4 3 - - 0\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kPolicy, 5), 1);
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kLru, 5), 3);
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kBelady, 5), 1);
}

// Requests repeated in order after a long pause (a workload cycling through its prompts, as the
// shared-prefix trace's requests 17-24 repeat 1-8 about 150 steps later): request 1 (prompt pages
// 0-1, reply page 2) finishes at step 1, request 2 (pages 3-4) at step 30, and at step 32 request
// 3's three pages need two blocks. No page was ever read again, so the history cannot say when an
// idle page comes back; it can say that 5 pages were idle for 2 steps and only 3 for 31. "As long
// again as it has waited" made the older pages' wait twice theirs, so pages 2 and 1 left (LRU's
// order lets 0 and 1 go) and request 4, request 1's prompt again, missed page 1; judged by the
// pages idle as long, and with the default pause for both, request 2's pages leave and request 4
// misses nothing, as with Belady.
TEST(KvReuseForecastTest, APromptRepeatedAfterALongPauseIsNotLostToRecency) {
  const StatusOr<KvTrace> t = ParseKvTrace(
      "kvl-trace 1 block_tokens=16 pool_blocks=6\n"
      "S 0\nP 0 1 0 -\nP 1 1 1 -\nR 1 2 0 - - 1\nS 1\nP 2 1 2 -\nR 1 3 2 - - 0\n"
      "S 30\nP 3 2 0 -\nP 4 2 1 -\nR 2 2 0 - - 0\n"
      "S 32\nP 5 3 0 -\nP 6 3 1 -\nP 7 3 2 -\nR 3 3 0 - - 0\n"
      "S 40\nP 0 4 0 -\nP 1 4 1 -\nP 8 4 2 -\nR 4 3 2 - - 0\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kBelady, 6), 0);
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kLru, 6), 2);
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kPolicy, 6), 0);
}

// A page other requests read while one held it (an opening shared by requests run together) is
// idle for the first time with reads again on its record: more likely to be read again than a
// one-off prompt's page idle as long, and expected sooner, whatever the history says.
TEST(KvReuseForecastTest, APageSharedByRequestsRunTogetherOutstaysAOneOffs) {
  KvIdleReuseHistory history;
  for (int64_t last_read = 0; last_read < 8; ++last_read) history.PageWentIdle(last_read);
  KvReuseInput one_off;
  one_off.step = 20;
  one_off.idle_steps = 12;
  KvReuseInput shared = one_off;
  shared.shared_reads = 2;
  const KvReuseForecast f_one_off = ForecastReuse(one_off, history);
  const KvReuseForecast f_shared = ForecastReuse(shared, history);
  EXPECT_GT(f_shared.reads_left, f_one_off.reads_left);
  EXPECT_LT(f_shared.next_read_steps, f_one_off.next_read_steps);
  EXPECT_TRUE(KvPageLeavesFirst(f_one_off, f_shared));
  EXPECT_FALSE(KvPageLeavesFirst(f_shared, f_one_off));
}

// A conversation's pages learn from conversations' pauses, apart from other pages': request 3
// continues request 1's whole chain (pages 0-1, a chat's next turn) after a pause of 10 steps; at
// step 11 request 4's three new pages need two blocks, and the candidates are the conversation's
// pages (idle for a step) and a one-off opening (pages 2-3, idle for 8 steps). Judged by one
// history of every idle page, the opening sits just before the only pause seen, due within two
// steps, so the conversation's pages leave and its next turn (request 5) misses two; the
// conversations' own history says the chat comes back after ~10 steps and the opening has no
// record, so the opening leaves: no miss, as Belady.
TEST(KvReuseForecastTest, AConversationsPagesLearnFromConversationsPauses) {
  const StatusOr<KvTrace> t = ParseKvTrace(
      "kvl-trace 1 block_tokens=16 pool_blocks=6\n"
      "S 0\nP 0 1 0 -\nP 1 1 1 -\nR 1 2 0 - - 0\n"
      "S 3\nP 2 2 0 -\nP 3 2 1 -\nR 2 2 0 - - 0\n"
      "S 10\nP 0 3 0 -\nP 1 3 1 -\nP 4 3 2 -\nR 3 3 2 - - 0\n"
      "S 11\nP 5 4 0 -\nP 6 4 1 -\nP 7 4 2 -\nR 4 3 0 - - 2\n"
      "S 12\nR 4 3 3 - - 1\nS 13\nR 4 3 3 - - 0\n"
      "S 20\nP 0 5 0 -\nP 1 5 1 -\nP 4 5 2 -\nP 8 5 3 -\nR 5 4 3 - - 0\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kBelady, 6), 0);
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kPolicy, 6), 0);
}

// A preempted sequence's pages are read again when it resumes, however long they wait: request 2
// is preempted at step 1 (its pages leave, the L lines), request 1 finishes at step 1, and at
// step 2 request 3's three pages need two blocks. As idle pages, request 2's (unread for longer,
// and later in their step) would leave and miss at its resume; waiting for it, they stay and
// request 1's pages, which nobody reads again, leave. Belady does the same.
TEST(KvReuseForecastTest, APreemptedSequencesPagesWaitForItsResume) {
  const StatusOr<KvTrace> t = ParseKvTrace(
      "kvl-trace 1 block_tokens=16 pool_blocks=5\n"
      "S 0\nP 0 1 0 -\nP 1 1 1 -\nR 1 2 0 - - 1\nP 2 2 0 -\nP 3 2 1 -\nR 2 2 0 - - 10\n"
      "S 1\nL 2 2 demote-ram preempt 0.1\nL 3 2 demote-ram preempt 0.1\nR 1 2 2 - - 0\n"
      "S 2\nP 4 3 0 -\nP 5 3 1 -\nP 6 3 2 -\nR 3 3 0 - - 5\n"
      "S 3\nR 3 3 3 - - 4\nR 2 2 2 - - 9\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kBelady, 5), 0);
  EXPECT_EQ(Misses(*t, KvReplayPolicy::kPolicy, 5), 0);
}

// The same kind of trace through the engine's own KV manager (ReplayKvTraceThroughManager): an
// opening (page 0) read by requests 1-3, a one-off (page 1) after them, then request 5's four
// new pages and its partial page take five of the six blocks, so one of the two idle cached
// pages must go; request 6 reads the opening again. The manager's forecast order gives up the
// one-off (never found again) and request 6 hits, as Belady does; least recently freed first
// gives up the opening, freed earlier, and request 6 misses, as LRU does.
TEST(KvReuseForecastTest, TheEnginesOwnManagerKeepsTheOpeningItsHistorySaysComesBack) {
  const StatusOr<KvTrace> t = ParseKvTrace(
      "kvl-trace 1 block_tokens=16 pool_blocks=6\n"
      "S 0\nP 0 1 0 -\nR 1 1 0 - - 0\n"
      "S 1\nP 0 2 0 -\nR 2 1 1 - - 0\n"
      "S 2\nP 0 3 0 -\nR 3 1 1 - - 0\n"
      "S 3\nP 1 4 0 -\nR 4 1 0 - - 0\n"
      "S 4\nP 2 5 0 -\nP 3 5 1 -\nP 4 5 2 -\nP 5 5 3 -\nR 5 4 0 - - 0\n"
      "S 5\nP 0 6 0 -\nR 6 1 1 - - 0\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::vector<KvTraceAccess> a = KvTraceAccesses(*t);
  const KvManagerReplayResult forecast =
      ReplayKvTraceThroughManager(*t, a, KvIdleBlockOrder::kForecast, 6, 2.0);
  const KvManagerReplayResult lrf =
      ReplayKvTraceThroughManager(*t, a, KvIdleBlockOrder::kLeastRecentlyFreed, 6, 2.0);
  for (const KvManagerReplayResult* r : {&forecast, &lrf}) {
    EXPECT_TRUE(r->fits);
    EXPECT_EQ(r->replay.accesses, 9);
    EXPECT_EQ(r->replay.cold, 6);
    EXPECT_EQ(r->replay.cold + r->replay.hits + r->replay.misses, r->replay.accesses);
    EXPECT_EQ(r->reuse_reads, 3);  // requests 2, 3 and 6 read the opening seen before
  }
  EXPECT_EQ(forecast.replay.policy, "engine");
  EXPECT_EQ(forecast.replay.misses, 0);
  EXPECT_EQ(forecast.reuse_hits, 3);
  EXPECT_EQ(lrf.replay.policy, "engine-lrf");
  EXPECT_EQ(lrf.replay.misses, 1);
  EXPECT_EQ(lrf.reuse_hits, 2);
  EXPECT_DOUBLE_EQ(lrf.replay.cost_ms, 2.0);
  // The replay's oracle and LRU, holding a partial page per running request as the manager does.
  KvReplayOptions held;
  held.capacity_pages = 6;
  held.partial_pages_per_reader = 1;
  held.miss_ms = 2.0;
  EXPECT_EQ(ReplayKvTrace(*t, a, KvReplayPolicy::kBelady, held).misses, 0);
  EXPECT_EQ(ReplayKvTrace(*t, a, KvReplayPolicy::kLru, held).misses, 1);
  // Four blocks cannot hold request 5's five: the manager says so rather than guess.
  EXPECT_FALSE(ReplayKvTraceThroughManager(*t, a, KvIdleBlockOrder::kForecast, 4, 2.0).fits);
}

// Three requests admitted in one step on an opening the pool lost (page 0: request 1 read it,
// request 2's six blocks took its block): the manager's replay admits them as the engine's
// scheduler does, the first alone and the two others a step later (KvManager::
// SharesPagesComputedInStep), so the opening is computed once and found twice, as LRU counts
// it. Read in one step each would compute it into a block of its own: three misses.
TEST(KvReuseForecastTest, TheManagersReplayComputesAnOpeningSharedInOneStepOnce) {
  const StatusOr<KvTrace> t = ParseKvTrace(
      "kvl-trace 1 block_tokens=16 pool_blocks=6\n"
      "S 0\nP 0 1 0 -\nR 1 1 0 - - 0\n"
      "S 1\nP 1 2 0 -\nP 2 2 1 -\nP 3 2 2 -\nP 4 2 3 -\nP 5 2 4 -\nR 2 5 0 - - 0\n"
      "S 2\nP 0 3 0 -\nR 3 1 0 - - 0\nP 0 4 0 -\nR 4 1 0 - - 0\nP 0 5 0 -\nR 5 1 0 - - 0\n");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::vector<KvTraceAccess> a = KvTraceAccesses(*t);
  for (KvIdleBlockOrder order : {KvIdleBlockOrder::kForecast, KvIdleBlockOrder::kLeastRecentlyFreed}) {
    const KvManagerReplayResult r = ReplayKvTraceThroughManager(*t, a, order, 6, 1.0);
    EXPECT_TRUE(r.fits);
    EXPECT_EQ(r.replay.misses, 1);
    EXPECT_EQ(r.replay.hits, 2);
    EXPECT_EQ(r.reuse_reads, 3);
    EXPECT_EQ(r.reuse_hits, 2);
  }
  KvReplayOptions held;
  held.capacity_pages = 6;
  held.partial_pages_per_reader = 1;
  held.miss_ms = 1;
  // LRU lost the opening at step 1 too, and counts one miss; Belady keeps it (the replay's
  // Belady may leave a running request's page out, which the manager never does).
  EXPECT_EQ(ReplayKvTrace(*t, a, KvReplayPolicy::kLru, held).misses, 1);
  EXPECT_EQ(ReplayKvTrace(*t, a, KvReplayPolicy::kBelady, held).misses, 0);
}

}  // namespace
}  // namespace kvl
