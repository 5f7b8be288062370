#include "lattice_redis_link.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string_view>
#include <vector>

#include "bench_turns.h"
#include "kvl/kv_policy.h"
#include "kvl/kv_tier.h"

namespace kvl::cli {
namespace {

// The script beside the bench: scripts/redis-netns.sh under the working directory, or under the
// source tree the binary was built in (build/kvl -> scripts/).
std::string FindScript() {
  std::vector<std::filesystem::path> candidates = {"scripts/redis-netns.sh"};
  if (StatusOr<std::string> self = SelfExecutable(); self.ok()) {
    const std::filesystem::path dir = std::filesystem::path(*self).parent_path();
    candidates.push_back(dir / ".." / "scripts" / "redis-netns.sh");
  }
  for (const std::filesystem::path& p : candidates) {
    if (access(p.c_str(), X_OK) == 0) return p.lexically_normal().string();
  }
  return "";
}

// The last line of a child's output that is not blank.
std::string LastLine(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

}  // namespace

RedisLink StartRedisLink(const std::string& script, const std::string& rate) {
  RedisLink link;
  link.rate = rate;
  if (!ParseKvPolicy("demote-redis").ok()) {
    link.skip_reason = "this build has no --kv-policy demote-redis";
    return link;
  }
  link.script = script.empty() ? FindScript() : script;
  if (link.script.empty()) {
    link.skip_reason = "scripts/redis-netns.sh not found (give --redis-script)";
    return link;
  }
  link.name = fmt::format("kvl-lattice-{}", getpid());
  std::string out;
  StatusOr<int> rc = RunChildProcess({link.script, "start", "--name", link.name, "--rate", rate},
                                     &out, /*with_stderr=*/true);
  if (!rc.ok()) {
    link.skip_reason = rc.status().ToString();
    link.name.clear();
    return link;
  }
  if (*rc != 0) {
    // Exit code 3: network namespaces are not allowed here; the script's one line says so.
    link.skip_reason = *rc == 3 ? LastLine(out)
                                : fmt::format("{} start exited with {}: {}", link.script, *rc,
                                              LastLine(out));
    link.name.clear();
    return link;
  }
  link.tier_spec = LastLine(out);
  if (!ParseTierSpec(link.tier_spec).ok()) {
    link.skip_reason =
        fmt::format("{} printed no tier spec (its last line: '{}')", link.script, link.tier_spec);
    link.tier_spec.clear();
    StopRedisLink(link);
    link.name.clear();
  }
  return link;
}

void StopRedisLink(const RedisLink& link) {
  if (link.script.empty() || link.name.empty()) return;
  std::string out;
  StatusOr<int> rc = RunChildProcess({link.script, "stop", "--name", link.name}, &out, true);
  if (!rc.ok() || *rc != 0) {
    fmt::print(stderr, "kvl: stopping the Redis link {} failed: {}\n", link.name,
               rc.ok() ? LastLine(out) : rc.status().ToString());
  }
}

std::string CellRedisTierSpec(const RedisLink& link, int cell_index) {
  constexpr std::string_view kScheme = "redis://";
  // "redis:HOST:PORT" (the script's short form) is "redis://HOST:PORT".
  std::string spec = link.tier_spec;
  if (spec.starts_with("redis:") && !spec.starts_with(kScheme)) {
    spec = std::string(kScheme) + spec.substr(6);
  }
  // redis://HOST[:PORT][/NAMESPACE][?ttl=S]: the cell's namespace after the authority's.
  if (!spec.starts_with(kScheme)) return spec;
  const size_t query = spec.find('?');
  const std::string base = spec.substr(0, query);
  const std::string tail = query == std::string::npos ? "" : spec.substr(query);
  const size_t slash = base.find('/', kScheme.size());
  const std::string authority = slash == std::string::npos ? base : base.substr(0, slash);
  const std::string name_space = slash == std::string::npos ? "kvl" : base.substr(slash + 1);
  return fmt::format("{}/{}-lattice-{}-{}{}", authority, name_space, getpid(), cell_index, tail);
}

}  // namespace kvl::cli
