#include "kvl/process_memory.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace kvl {
namespace {

// The value of a "   1234 kB" field (what follows "Name:"), in bytes.
std::optional<int64_t> KibValue(std::string_view value) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  int64_t kib = 0;
  const auto [rest, error] = std::from_chars(value.data(), value.data() + value.size(), kib);
  if (error != std::errc() || kib < 0 || std::string_view(rest, value.data() + value.size()) != " kB")
    return std::nullopt;
  return kib * 1024;
}

// Whether `line` is the field `name` ("Name:..."); leaves its value in *value.
bool IsField(std::string_view line, std::string_view name, std::string_view* value) {
  if (line.size() <= name.size() || line.substr(0, name.size()) != name ||
      line[name.size()] != ':') {
    return false;
  }
  *value = line.substr(name.size() + 1);
  return true;
}

// Calls f(line) for each line of the text; stops when f returns false.
template <typename F>
void ForEachLine(std::string_view text, F f) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    if (!f(text.substr(at, end - at))) return;
    at = end + 1;
  }
}

// The value of a "Name:   1234 kB" line, in bytes.
std::optional<int64_t> FieldBytes(std::string_view status, std::string_view name) {
  std::optional<int64_t> bytes;
  bool found = false;
  ForEachLine(status, [&](std::string_view line) {
    std::string_view value;
    if (!IsField(line, name, &value)) return true;
    found = true;
    bytes = KibValue(value);
    return false;
  });
  return found ? bytes : std::nullopt;
}

std::string ReadWholeFile(const char* path) {
  std::ifstream in(path);
  if (!in) return "";
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
  const std::string text = ReadWholeFile("/proc/self/status");
  if (text.empty()) return std::nullopt;
  return ParseProcessStatus(text);
}

// smaps: a header line per mapping ("start-end perms offset dev inode   pathname"), then its
// "Field:  N kB" lines. A header is told from a field by its first word, an address range.
std::optional<int64_t> ParseMappedFileResidentBytes(std::string_view smaps, std::string_view path) {
  int64_t total = 0;
  bool in_file = false;
  bool malformed = false;
  ForEachLine(smaps, [&](std::string_view line) {
    const size_t space = line.find(' ');
    const std::string_view first = line.substr(0, space);
    if (first.find('-') != std::string_view::npos && first.back() != ':') {
      // A mapping's header: the pathname is what follows the inode, after the padding.
      const size_t slash = line.find('/');
      in_file = slash != std::string_view::npos && line.substr(slash) == path;
      return true;
    }
    std::string_view value;
    if (!in_file || !IsField(line, "Rss", &value)) return true;
    const std::optional<int64_t> bytes = KibValue(value);
    if (!bytes) {
      malformed = true;
      return false;
    }
    total += *bytes;
    return true;
  });
  if (malformed) return std::nullopt;
  return total;
}

std::optional<int64_t> ReadMappedFileResidentBytes(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path resolved = std::filesystem::canonical(path, ec);
  if (ec) return std::nullopt;
  const std::string text = ReadWholeFile("/proc/self/smaps");
  if (text.empty()) return std::nullopt;
  return ParseMappedFileResidentBytes(text, resolved.string());
}

}  // namespace kvl
