// The machine's load as calibration reads it: the kernel's counters parsed, and real busy
// processes seen as others' CPU time while this process's own is not.
#include "kvl/machine_load.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "kvl/calibration.h"  // kBusySampleSpread

namespace kvl {
namespace {

TEST(MachineLoadTest, ParsesTheAggregateLineOfProcStat) {
  // user nice system idle iowait irq softirq steal guest guest_nice
  const std::optional<CpuTicks> t = ParseProcStatTicks(
      "cpu  100 5 20 1000 30 2 3 7 50 0\ncpu0 50 2 10 500 15 1 1 3 25 0\nintr 1 2 3\n");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->machine_busy, 100 + 5 + 20 + 2 + 3 + 7);  // guest is inside user already
  EXPECT_EQ(t->machine_total, t->machine_busy + 1000 + 30);

  EXPECT_FALSE(ParseProcStatTicks("cpu0 1 2 3 4 5 6 7 8\n").has_value());
  EXPECT_FALSE(ParseProcStatTicks("cpu  1 2 3\n").has_value());  // too few fields
  EXPECT_FALSE(ParseProcStatTicks("").has_value());
}

TEST(MachineLoadTest, ParsesAProcessLineWhoseNameHoldsSpacesAndParentheses) {
  // Fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
  // utime stime ...
  const std::optional<int64_t> ticks =
      ParseProcessStatTicks("4242 (kvl (worker) 1) R 1 2 3 0 -1 6 7 8 9 10 123 45 0 0 20 0\n");
  ASSERT_TRUE(ticks.has_value());
  EXPECT_EQ(*ticks, 123 + 45);
  EXPECT_FALSE(ParseProcessStatTicks("4242 kvl R 1 2").has_value());
  EXPECT_FALSE(ParseProcessStatTicks("4242 (kvl) R 1 2 3").has_value());
}

TEST(MachineLoadTest, SharesAreClampedAndOwnTimeIsNotOthers) {
  CpuTicks before{100, 1000, 10};
  // 200 ticks of 400 busy, 150 of them ours: others took 50 / 400.
  CpuTicks after{300, 1400, 160};
  EXPECT_DOUBLE_EQ(OthersCpuShare(before, after), 50.0 / 400.0);
  EXPECT_DOUBLE_EQ(OthersCpuShare(before, before), 0.0);
  CpuTicks own_more{300, 1400, 400};  // counters of two reads a tick apart can cross
  EXPECT_DOUBLE_EQ(OthersCpuShare(before, own_more), 0.0);
}

// Spinning child processes: one per core, for as long as the guard lives.
class Spinners {
 public:
  explicit Spinners(int count) {
    for (int i = 0; i < count; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        volatile uint64_t x = 0;
        for (;;) x = x + 1;
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~Spinners() {
    for (pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
  }

 private:
  std::vector<pid_t> pids_;
};

TEST(MachineLoadTest, BusyProcessesAreOthersAndOwnTimeIsOwn) {
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  {
    // Every core spun by another process: others take (nearly) all of the machine, whatever
    // else runs beside this test.
    Spinners spinners(cores);
    const std::optional<double> busy = MeasureOthersCpuShare(0.5);
    ASSERT_TRUE(busy.has_value()) << "/proc unreadable";
    EXPECT_GT(*busy, 0.6);
  }
  // This process's own spin is read as its own: the ticks it took show in /proc/self/stat, and
  // within the machine's busy ticks of the same window (so OthersCpuShare subtracts them).
  const std::optional<CpuTicks> before = ReadCpuTicks();
  ASSERT_TRUE(before.has_value());
  // Spin until the kernel has counted 20 ticks (0.2 s of CPU) to this process, however crowded
  // the cores are; 30 s of wall time without them means the counter does not move.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::optional<CpuTicks> after;
  volatile uint64_t x = 0;
  do {
    for (int i = 0; i < 1000000; ++i) x = x + 1;
    after = ReadCpuTicks();
    ASSERT_TRUE(after.has_value());
  } while (after->own - before->own < 20 && std::chrono::steady_clock::now() < give_up);
  const int64_t own_ticks = after->own - before->own;
  EXPECT_GE(own_ticks, 20);
  EXPECT_LE(own_ticks, after->machine_busy - before->machine_busy + 2);
}

// Busy detection on the samples alone: timings a few percent apart are a quiet machine's; some
// samples twice as slow as the rest are others taking the cores during them.
TEST(SampleSpreadTest, SteadySamplesAreNotFlaggedAndGiveTheirMedian) {
  const std::vector<double> steady = {1.00, 1.02, 0.99, 1.01, 1.03};
  EXPECT_NEAR(SampleSpread(steady), (1.03 - 0.99) / 1.01, 1e-12);
  EXPECT_LE(SampleSpread(steady), kBusySampleSpread);
  EXPECT_DOUBLE_EQ(QuietSeconds(steady, kBusySampleSpread), 1.01);
}

TEST(SampleSpreadTest, DisturbedSamplesAreFlaggedAndGiveTheirFastestHalf) {
  // Three quiet samples near 1.0, three slowed about 2x by a busy loop on the same cores.
  const std::vector<double> disturbed = {1.0, 2.1, 1.02, 1.9, 0.99, 2.3};
  const double median = (1.02 + 1.9) / 2;
  EXPECT_NEAR(SampleSpread(disturbed), (2.3 - 0.99) / median, 1e-12);
  EXPECT_GT(SampleSpread(disturbed), kBusySampleSpread);
  // The median would say 1.46; the quiet half says 1.0.
  EXPECT_DOUBLE_EQ(QuietSeconds(disturbed, kBusySampleSpread), 1.0);
  // The same samples judged against a looser bound are taken whole.
  EXPECT_DOUBLE_EQ(QuietSeconds(disturbed, 10.0), median);
}

TEST(SampleSpreadTest, TooFewSamplesSayNothing) {
  EXPECT_EQ(SampleSpread(std::vector<double>{1.0, 3.0}), 0);
  EXPECT_DOUBLE_EQ(QuietSeconds({1.0, 3.0}, kBusySampleSpread), 2.0);
  EXPECT_DOUBLE_EQ(QuietSeconds({4.0}, kBusySampleSpread), 4.0);
}

TEST(SampleSpreadTest, AProfileIsBusyByOthersShareOrBySpread) {
  MachineProfile p;
  p.others_cpu_share = 0.1;
  p.sample_spread = 0.2;
  EXPECT_FALSE(MeasuredUnderLoad(p));
  p.sample_spread = 0.9;  // the samples disagreed, whoever took the cores
  EXPECT_TRUE(MeasuredUnderLoad(p));
  p.sample_spread = 0.2;
  p.others_cpu_share = 0.6;  // two busy loops on two cores while it measured
  EXPECT_TRUE(MeasuredUnderLoad(p));
}

}  // namespace
}  // namespace kvl
