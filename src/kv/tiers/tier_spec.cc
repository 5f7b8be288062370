// --kv-tier specs: "ram:SIZE[:zstd]" (or "ram:auto[:zstd]": capacity 0, sized by the KV budget's
// split), "disk:PATH:SIZE[:direct][:scratch]" and "redis://HOST[:PORT][/NAMESPACE][?ttl=SECONDS]". The size parser lives here rather than in the
// engine so the kv layer stays usable (and testable) on its own.
#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <limits>
#include <optional>
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

// Digits only, at most `max`; nullopt for anything else (a sign, a unit, an empty string).
std::optional<int64_t> ParseWholeNumber(std::string_view text, int64_t max) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value > max) return std::nullopt;
  return value;
}

bool HasSpaceOrControl(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return true;
  }
  return false;
}

constexpr std::string_view kRedisScheme = "redis://";
constexpr std::string_view kRedisForm = "redis://HOST[:PORT][/NAMESPACE][?ttl=SECONDS]";

// "redis://HOST[:PORT][/NAMESPACE][?ttl=SECONDS]"; an IPv6 HOST goes in brackets.
StatusOr<TierSpec> ParseRedisSpec(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(
        fmt::format("tier spec '{}': {} (expected {}, e.g. redis://127.0.0.1:6379/kvl)", text, why,
                    kRedisForm));
  };
  if (Lower(text.substr(0, kRedisScheme.size())) != kRedisScheme) {
    return bad("a redis tier is a URL starting with redis://");
  }
  std::string_view rest = text.substr(kRedisScheme.size());
  std::string_view query;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  std::string_view authority = rest, name_space;
  bool has_namespace = false;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    authority = rest.substr(0, slash);
    name_space = rest.substr(slash + 1);
    has_namespace = true;
  }
  if (authority.find('@') != std::string_view::npos) {
    return bad("a user name or password is not supported");
  }
  TierSpec spec;
  spec.kind = TierKind::kRedis;
  std::string_view host = authority, port;
  bool has_port = false;
  if (authority.starts_with('[')) {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("the IPv6 address has no closing ']'");
    host = authority.substr(1, close - 1);
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad(fmt::format("unexpected '{}' after the host", after));
      port = after.substr(1);
      has_port = true;
    }
  } else if (const size_t colon = authority.find(':'); colon != std::string_view::npos) {
    if (authority.find(':', colon + 1) != std::string_view::npos) {
      return bad("an IPv6 address goes in brackets, e.g. redis://[::1]:6379");
    }
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    has_port = true;
  }
  if (host.empty()) return bad("the host is empty");
  if (HasSpaceOrControl(host)) return bad(fmt::format("the host '{}' has a space in it", host));
  spec.host = std::string(host);
  if (has_port) {
    const std::optional<int64_t> number = ParseWholeNumber(port, 65535);
    if (!number || *number == 0) {
      return bad(fmt::format("the port '{}' is not a number from 1 to 65535", port));
    }
    spec.port = static_cast<int>(*number);
  }
  // "redis://HOST/" keeps the default namespace.
  if (has_namespace && !name_space.empty()) {
    if (HasSpaceOrControl(name_space)) {
      return bad(fmt::format("the namespace '{}' has a space or control character in it",
                             name_space));
    }
    spec.name_space = std::string(name_space);
  }
  if (!query.empty()) {
    for (std::string_view option : Split(query, '&')) {
      const size_t equals = option.find('=');
      const std::string name = Lower(option.substr(0, equals));
      const std::string_view value =
          equals == std::string_view::npos ? std::string_view() : option.substr(equals + 1);
      if (name != "ttl") {
        return bad(fmt::format("unknown option '{}' (the only one is ttl=SECONDS)", option));
      }
      // Redis keeps expiries in milliseconds: a TTL of more than ~292 million years overflows.
      const std::optional<int64_t> seconds =
          ParseWholeNumber(value, std::numeric_limits<int64_t>::max() / 1000);
      if (!seconds || *seconds == 0) {
        return bad(fmt::format("the ttl '{}' is not a positive whole number of seconds", value));
      }
      spec.ttl_seconds = *seconds;
    }
  }
  return spec;
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
  // A URL: its own parser, since its "//", port and namespace are not ':'-separated fields.
  if (kind == "redis") return ParseRedisSpec(text);
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
          fmt::format("tier spec '{}': expected ram:SIZE[:zstd] or ram:auto[:zstd], e.g. "
                      "ram:256MiB",
                      text));
    }
    spec.kind = TierKind::kRam;
    // ram:auto: capacity 0, the size the KV budget's split chooses (kvl/kv_budget.h).
    if (Lower(parts[1]) != "auto") {
      KVL_ASSIGN_OR_RETURN(spec.capacity_bytes, size_of(parts[1]));
    }
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
    spec.kind = TierKind::kDisk;
    KVL_ASSIGN_OR_RETURN(spec.capacity_bytes, size_of(parts[last - 1]));
    const size_t path_begin = parts[0].size() + 1;
    const size_t path_end = static_cast<size_t>(parts[last - 1].data() - text.data()) - 1;
    spec.path = std::string(text.substr(path_begin, path_end - path_begin));
    if (spec.path.empty())
      return InvalidArgumentError(fmt::format("tier spec '{}': the path is empty", text));
    return spec;
  }
  return InvalidArgumentError(
      fmt::format("tier spec '{}': unknown tier kind '{}' (use ram, disk or redis://)", text,
                  parts[0]));
}

StatusOr<std::unique_ptr<KvTier>> MakeTier(const TierSpec& spec, int64_t page_bytes,
                                           std::string_view identity) {
  if (spec.kind == TierKind::kRam) {
    return MakeRamTier({.capacity_bytes = spec.capacity_bytes, .compress = spec.compress});
  }
  if (spec.kind == TierKind::kDisk) {
    KVL_ASSIGN_OR_RETURN(std::unique_ptr<DiskKvTier> disk,
                         MakeDiskTier({.path = spec.path,
                                       .capacity_bytes = spec.capacity_bytes,
                                       .page_bytes = page_bytes,
                                       .direct_io = spec.direct_io,
                                       .persistent = spec.persistent,
                                       .identity = std::string(identity)}));
    return std::unique_ptr<KvTier>(std::move(disk));
  }
  return MakeRedisTier({.host = spec.host,
                        .port = spec.port,
                        .name_space = spec.name_space,
                        .identity = std::string(identity),
                        .page_bytes = page_bytes,
                        .ttl_seconds = spec.ttl_seconds});
}

std::string_view TierKindName(TierKind kind) {
  switch (kind) {
    case TierKind::kRam:
      return "ram";
    case TierKind::kDisk:
      return "disk";
    case TierKind::kRedis:
      return "redis";
  }
  return "?";
}

}  // namespace kvl
