// The engine's watchdog (issue 37) on a clock the test moves: stalled only when a step runs past
// the limit or work waits that long with no step ending, never while idle; each stall is one trip;
// the stalled time is summed from the moment it is seen until a step ends.
#include "engine/step_watchdog.h"

#include <gtest/gtest.h>

namespace kvl {
namespace {

using Clock = StepWatchdog::Clock;

Clock::time_point At(double seconds) {
  return Clock::time_point{} + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(1000 + seconds));
}

TEST(StepWatchdogTest, AnIdleLoopIsNeverStalledAndBusyStepsUnderTheLimitAreNot) {
  StepWatchdog w(10);
  EXPECT_FALSE(w.Check(At(0), true).stalled);  // the loop has not started: nothing to judge
  w.LoopStarted(At(0));
  EXPECT_FALSE(w.Check(At(500), /*work_queued=*/false).stalled);  // idle for long: fine
  for (int i = 0; i < 100; ++i) {
    w.StepStarted(At(500 + 9.0 * i));
    EXPECT_FALSE(w.Check(At(500 + 9.0 * i + 8.9), false).stalled);
    w.StepEnded(At(500 + 9.0 * i + 8.9), /*work_left=*/true);
  }
  const StepWatchdogReport r = w.Check(At(1400), false);
  EXPECT_FALSE(r.stalled);
  EXPECT_EQ(r.trips, 0);
  EXPECT_EQ(r.stalled_seconds, 0);
}

TEST(StepWatchdogTest, AStepRunningPastTheLimitIsOneTripUntilItEnds) {
  StepWatchdog w(10);
  w.LoopStarted(At(0));
  w.StepStarted(At(1));
  EXPECT_FALSE(w.Check(At(10.5), false).stalled);
  StepWatchdogReport r = w.Check(At(11.5), false);
  EXPECT_TRUE(r.stalled);
  EXPECT_NE(r.reason.find("a step has been running for"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("limit 10 s"), std::string::npos) << r.reason;
  EXPECT_EQ(r.trips, 1);
  r = w.Check(At(41.5), false);  // still the same stall: no second trip
  EXPECT_EQ(r.trips, 1);
  EXPECT_DOUBLE_EQ(r.stalled_seconds, 30);
  w.StepEnded(At(51.5), true);
  r = w.Check(At(52), false);
  EXPECT_FALSE(r.stalled);
  EXPECT_EQ(r.trips, 1);
  EXPECT_DOUBLE_EQ(r.stalled_seconds, 40);  // seen at 11.5, over at 51.5
  // A second stall is a second trip.
  w.StepStarted(At(60));
  EXPECT_EQ(w.Check(At(75), false).trips, 2);
}

TEST(StepWatchdogTest, WorkWaitingWithNoStepIsAStallAndAStepEndsIt) {
  StepWatchdog w(5);
  w.LoopStarted(At(0));
  w.StepStarted(At(0));
  w.StepEnded(At(1), /*work_left=*/false);
  // Queued requests that the loop has not taken for longer than the limit.
  EXPECT_FALSE(w.Check(At(5.5), /*work_queued=*/true).stalled);
  StepWatchdogReport r = w.Check(At(6.5), true);
  EXPECT_TRUE(r.stalled);
  EXPECT_NE(r.reason.find("requests have waited"), std::string::npos) << r.reason;
  // Work left after the last step counts as waiting too.
  w.StepStarted(At(7));
  w.StepEnded(At(7.1), /*work_left=*/true);
  EXPECT_FALSE(w.Check(At(8), false).stalled);
  EXPECT_TRUE(w.Check(At(13), false).stalled);
  EXPECT_EQ(w.Check(At(13), false).trips, 2);
}

TEST(StepWatchdogTest, ALimitOfZeroIsNoWatchdog) {
  StepWatchdog w(0);
  w.LoopStarted(At(0));
  w.StepStarted(At(0));
  const StepWatchdogReport r = w.Check(At(1e6), true);
  EXPECT_FALSE(r.stalled);
  EXPECT_EQ(r.trips, 0);
}

}  // namespace
}  // namespace kvl
