// --kv-tier specs: "ram:SIZE[:zstd]" and "disk:PATH:SIZE[:direct][:scratch]". The size parser lives here
// rather than in the engine so the kv layer stays usable (and testable) on its own.
#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvl/kv_tier.h"

namespace kvl {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (;;) {
    const size_t pos = text.find(sep, start);
    parts.push_back(
        text.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) return parts;
    start = pos + 1;
  }
}

}  // namespace

StatusOr<int64_t> ParseByteSize(std::string_view text) {
  // Digits, an optional fraction, then a unit: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024,
  // case-insensitive) or KB/MB/GB/TB (powers of 1000). A bare number is bytes.
  size_t i = 0;
  uint64_t whole = 0;
  bool any_digit = false;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (whole > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      return InvalidArgumentError(fmt::format("size '{}' is too large", text));
    }
    whole = whole * 10 + digit;
    any_digit = true;
    ++i;
  }
  double fraction = 0.0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    double scale = 0.1;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      fraction += scale * (text[i] - '0');
      scale /= 10;
      any_digit = true;
      ++i;
    }
  }
  if (!any_digit) {
    return InvalidArgumentError(
        fmt::format("size '{}' does not start with a number (e.g. 256MiB)", text));
  }
  const std::string unit = Lower(text.substr(i));
  struct Unit {
    const char* name;
    double multiplier;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"b", 1},
                                    {"k", 1024.0},
                                    {"kib", 1024.0},
                                    {"m", 1048576.0},
                                    {"mib", 1048576.0},
                                    {"g", 1073741824.0},
                                    {"gib", 1073741824.0},
                                    {"t", 1099511627776.0},
                                    {"tib", 1099511627776.0},
                                    {"kb", 1e3},
                                    {"mb", 1e6},
                                    {"gb", 1e9},
                                    {"tb", 1e12}};
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    const double bytes = (static_cast<double>(whole) + fraction) * u.multiplier;
    if (bytes >= 9.2e18) return InvalidArgumentError(fmt::format("size '{}' is too large", text));
    return static_cast<int64_t>(bytes);
  }
  return InvalidArgumentError(fmt::format(
      "size '{}' has an unknown unit '{}' (use B, KiB, MiB, GiB, TiB, K, M, G, T, KB, MB, GB, TB)",
      text, text.substr(i)));
}

StatusOr<TierSpec> ParseTierSpec(std::string_view text) {
  const std::vector<std::string_view> parts = Split(text, ':');
  const std::string kind = Lower(parts[0]);
  auto size_of = [&](std::string_view part) -> StatusOr<int64_t> {
    StatusOr<int64_t> size = ParseByteSize(part);
    if (!size.ok()) {
      return InvalidArgumentError(fmt::format("tier spec '{}': {}", text, size.status().message()));
    }
    if (*size <= 0)
      return InvalidArgumentError(fmt::format("tier spec '{}': the size must be positive", text));
    return *size;
  };
  TierSpec spec;
  if (kind == "ram") {
    if (parts.size() < 2 || parts.size() > 3) {
      return InvalidArgumentError(
          fmt::format("tier spec '{}': expected ram:SIZE[:zstd], e.g. ram:256MiB", text));
    }
    spec.kind = "ram";
    KVL_ASSIGN_OR_RETURN(spec.capacity_bytes, size_of(parts[1]));
    if (parts.size() == 3) {
      if (Lower(parts[2]) != "zstd") {
        return InvalidArgumentError(fmt::format(
            "tier spec '{}': unknown ram option '{}' (the only one is zstd)", text, parts[2]));
      }
      spec.compress = true;
    }
    return spec;
  }
  if (kind == "disk") {
    // The path may itself contain ':', so fields are taken from the right: the options
    // (direct, scratch, in any order), SIZE, PATH.
    size_t last = parts.size();
    while (last >= 2) {
      const std::string option = Lower(parts[last - 1]);
      if (option == "direct") {
        spec.direct_io = true;
      } else if (option == "scratch") {
        spec.persistent = false;
      } else {
        break;
      }
      --last;
    }
    if (last < 3) {
      return InvalidArgumentError(fmt::format(
          "tier spec '{}': expected disk:PATH:SIZE[:direct][:scratch], e.g. "
          "disk:/tmp/kv.pages:4GiB",
          text));
    }
    spec.kind = "disk";
    KVL_ASSIGN_OR_RETURN(spec.capacity_bytes, size_of(parts[last - 1]));
    const size_t path_begin = parts[0].size() + 1;
    const size_t path_end = static_cast<size_t>(parts[last - 1].data() - text.data()) - 1;
    spec.path = std::string(text.substr(path_begin, path_end - path_begin));
    if (spec.path.empty())
      return InvalidArgumentError(fmt::format("tier spec '{}': the path is empty", text));
    return spec;
  }
  return InvalidArgumentError(
      fmt::format("tier spec '{}': unknown tier kind '{}' (use ram or disk)", text, parts[0]));
}

StatusOr<std::unique_ptr<KvTier>> MakeTier(const TierSpec& spec, int64_t page_bytes,
                                           std::string_view identity) {
  if (spec.kind == "ram") {
    return MakeRamTier({.capacity_bytes = spec.capacity_bytes, .compress = spec.compress});
  }
  if (spec.kind == "disk") {
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<DiskKvTier> disk,
                         MakeDiskTier({.path = spec.path,
                                       .capacity_bytes = spec.capacity_bytes,
                                       .page_bytes = page_bytes,
                                       .direct_io = spec.direct_io,
                                       .persistent = spec.persistent,
                                       .identity = std::string(identity)}));
    return std::unique_ptr<KvTier>(std::move(disk));
  }
  return InvalidArgumentError(fmt::format("unknown tier kind '{}' (use ram or disk)", spec.kind));
}

}  // namespace kvl
