#include "kvl/process_memory.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <string>

namespace kvl {
namespace {

// The value of a "Name:   1234 kB" line, in bytes.
std::optional<int64_t> FieldBytes(std::string_view status, std::string_view name) {
  size_t at = 0;
  while (at < status.size()) {
    const size_t end = std::min(status.find('\n', at), status.size());
    std::string_view line = status.substr(at, end - at);
    at = end + 1;
    if (line.size() <= name.size() || line.substr(0, name.size()) != name ||
        line[name.size()] != ':') {
      continue;
    }
    line.remove_prefix(name.size() + 1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    int64_t kib = 0;
    const auto [rest, error] = std::from_chars(line.data(), line.data() + line.size(), kib);
    if (error != std::errc() || kib < 0 || std::string_view(rest, line.data() + line.size()) != " kB")
      return std::nullopt;
    return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ProcessMemory> ParseProcessStatus(std::string_view status) {
  const std::optional<int64_t> rss = FieldBytes(status, "VmRSS");
  const std::optional<int64_t> anon = FieldBytes(status, "RssAnon");
  const std::optional<int64_t> file = FieldBytes(status, "RssFile");
  const std::optional<int64_t> shmem = FieldBytes(status, "RssShmem");
  const std::optional<int64_t> peak = FieldBytes(status, "VmHWM");
  if (!rss || !anon || !file || !shmem || !peak) return std::nullopt;
  return ProcessMemory{*rss, *anon + *shmem, *file, *peak};
}

std::optional<ProcessMemory> ReadProcessMemory() {
  std::ifstream in("/proc/self/status");
  if (!in) return std::nullopt;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseProcessStatus(text);
}

}  // namespace kvl
