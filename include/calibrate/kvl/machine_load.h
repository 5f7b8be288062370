// How busy the rest of the machine is: the share of every core's time that processes other than
// this one took, read from the kernel's counters (/proc/stat for the machine, /proc/self/stat for
// this process). Calibration records it beside its rates, because a rate measured while others
// took half the cores is a rate for a machine that no longer exists once they stop: a profile
// measured under load priced recomputes 69-117% too slow on a quiet machine.
//
// Thread-safety: the functions are free of shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace kvl {

// Cumulative CPU time in clock ticks, as the kernel counts it since boot.
struct CpuTicks {
  int64_t machine_busy = 0;   // every core's ticks not idle and not waiting for I/O
  int64_t machine_total = 0;  // every core's ticks
  int64_t own = 0;            // this process's user + system ticks, its threads included
};

// The "cpu" line of /proc/stat: busy = user + nice + system + irq + softirq + steal (steal: a
// hypervisor gave the core to another guest), total = busy + idle + iowait. guest time is already
// inside user. nullopt when the text has no well-formed aggregate line.
std::optional<CpuTicks> ParseProcStatTicks(std::string_view proc_stat);
// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line; the command name in parentheses
// may hold spaces and parentheses itself, so fields are counted after its last ')'.
std::optional<int64_t> ParseProcessStatTicks(std::string_view pid_stat);

// The counters now; nullopt where /proc cannot be read (then nothing is known about the load).
std::optional<CpuTicks> ReadCpuTicks();

// The share of the machine's CPU time between two readings that other processes took, in
// [0, 1]: (busy - own) / total. 0 when no time passed.
double OthersCpuShare(const CpuTicks& before, const CpuTicks& after);

// Samples OthersCpuShare over `seconds` of sleep (this process takes nothing meanwhile);
// nullopt where /proc cannot be read.
std::optional<double> MeasureOthersCpuShare(double seconds);

// The relative spread of repeated timings of one measurement, (slowest - fastest) / median: how
// steady the machine was as the measurement saw it. 0 for fewer than 3 samples (too few to say).
double SampleSpread(std::span<const double> samples);

// The time a measurement stands for. Where its samples agree (spread at most `busy_spread`,
// kBusySampleSpread) the median. Where they spread further, other processes took the cores
// during some of them, and each such sample is slow by however long the others ran: the median
// of the fastest half (the samples least disturbed) stands for the machine once it is quiet.
// Not empty.
double QuietSeconds(std::vector<double> samples, double busy_spread);

}  // namespace kvl
