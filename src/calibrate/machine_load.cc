#include "kvl/machine_load.h"

#include <algorithm>
#include <chrono>
#include <charconv>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "kvl/status.h"  // KVL_CHECK

namespace kvl {
namespace {

// Reads the next integer of `text` from `pos` on, skipping spaces (some fields, such as a
// process's tpgid, are -1).
std::optional<int64_t> NextNumber(std::string_view text, size_t* pos) {
  while (*pos < text.size() && text[*pos] == ' ') ++*pos;
  int64_t value = 0;
  const char* begin = text.data() + *pos;
  const auto [end, error] = std::from_chars(begin, text.data() + text.size(), value);
  if (error != std::errc()) return std::nullopt;
  *pos += static_cast<size_t>(end - begin);
  return value;
}

std::optional<std::string> ReadWholeFile(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

std::optional<CpuTicks> ParseProcStatTicks(std::string_view proc_stat) {
  // The aggregate line is the first, "cpu  user nice system idle iowait irq softirq steal ...".
  if (proc_stat.substr(0, 4) != "cpu ") return std::nullopt;
  size_t pos = 4;
  int64_t fields[8];
  for (int64_t& field : fields) {
    std::optional<int64_t> n = NextNumber(proc_stat, &pos);
    if (!n || *n < 0) return std::nullopt;
    field = *n;
  }
  const auto [user, nice, system, idle, iowait, irq, softirq, steal] = fields;
  CpuTicks ticks;
  ticks.machine_busy = user + nice + system + irq + softirq + steal;
  ticks.machine_total = ticks.machine_busy + idle + iowait;
  return ticks;
}

std::optional<int64_t> ParseProcessStatTicks(std::string_view pid_stat) {
  const size_t name_end = pid_stat.rfind(')');
  if (name_end == std::string_view::npos) return std::nullopt;
  // After ") ": state (field 3), then numbers from field 4 on; utime and stime are 14 and 15.
  size_t pos = name_end + 1;
  while (pos < pid_stat.size() && pid_stat[pos] == ' ') ++pos;
  if (pos >= pid_stat.size()) return std::nullopt;
  ++pos;  // the state letter
  int64_t utime = 0;
  for (int field = 4; field <= 15; ++field) {
    std::optional<int64_t> n = NextNumber(pid_stat, &pos);
    if (!n || (field >= 14 && *n < 0)) return std::nullopt;
    if (field == 14) utime = *n;
    if (field == 15) return utime + *n;
  }
  return std::nullopt;
}

std::optional<CpuTicks> ReadCpuTicks() {
  const std::optional<std::string> machine = ReadWholeFile("/proc/stat");
  const std::optional<std::string> own = ReadWholeFile("/proc/self/stat");
  if (!machine || !own) return std::nullopt;
  std::optional<CpuTicks> ticks = ParseProcStatTicks(*machine);
  const std::optional<int64_t> own_ticks = ParseProcessStatTicks(*own);
  if (!ticks || !own_ticks) return std::nullopt;
  ticks->own = *own_ticks;
  return ticks;
}

double OthersCpuShare(const CpuTicks& before, const CpuTicks& after) {
  const int64_t total = after.machine_total - before.machine_total;
  if (total <= 0) return 0;
  const int64_t others =
      (after.machine_busy - before.machine_busy) - (after.own - before.own);
  return std::clamp(static_cast<double>(others) / static_cast<double>(total), 0.0, 1.0);
}

double SampleSpread(std::span<const double> samples) {
  if (samples.size() < 3) return 0;
  const auto [fastest, slowest] = std::minmax_element(samples.begin(), samples.end());
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t mid = sorted.size() / 2;
  const double median =
      sorted.size() % 2 == 1 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
  return median > 0 ? (*slowest - *fastest) / median : 0;
}

double QuietSeconds(std::vector<double> samples, double busy_spread) {
  KVL_CHECK(!samples.empty());
  std::sort(samples.begin(), samples.end());
  // The fastest half where the samples disagree, every sample where they do not.
  const size_t kept =
      SampleSpread(samples) > busy_spread ? std::max<size_t>(1, (samples.size() + 1) / 2)
                                          : samples.size();
  const size_t mid = kept / 2;
  return kept % 2 == 1 ? samples[mid] : 0.5 * (samples[mid - 1] + samples[mid]);
}

std::optional<double> MeasureOthersCpuShare(double seconds) {
  const std::optional<CpuTicks> before = ReadCpuTicks();
  if (!before) return std::nullopt;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const std::optional<CpuTicks> after = ReadCpuTicks();
  if (!after) return std::nullopt;
  return OthersCpuShare(*before, *after);
}

}  // namespace kvl
