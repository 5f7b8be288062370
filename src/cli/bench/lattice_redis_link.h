// The Redis tier of `kvl bench lattice`: a redis-server in a network namespace of its own behind
// a shaped link (scripts/redis-netns.sh), started before the workloads and stopped after, so that
// "demote to Redis" pays what a page over a 1 or 10 Gbit/s network costs. Where the script, the
// engine's `--kv-policy demote-redis` or network namespaces are missing, the link is not started
// and the Redis cells are reported as skipped with the reason.
#pragma once

#include <string>

namespace kvl::cli {

struct RedisLink {
  std::string tier_spec;    // the --kv-tier spec the script printed; empty: not started
  std::string skip_reason;  // why not, when not started
  std::string script;       // the script that started it (stops it)
  std::string name;         // the namespace's name
  std::string rate;         // 1gbit | 10gbit
};

// Starts the link with `script` (empty: scripts/redis-netns.sh, looked for under the working
// directory and beside the binary's source tree) at `rate`. Never fails: a link that cannot be
// started comes back with skip_reason set.
RedisLink StartRedisLink(const std::string& script, const std::string& rate);
// Stops a started link (nothing for one that was not); a failure is printed, not returned.
void StopRedisLink(const RedisLink& link);

// The tier spec one cell uses: the link's, in a key namespace of the cell's own where the spec
// can carry one, so that no cell finds pages an earlier cell stored.
std::string CellRedisTierSpec(const RedisLink& link, int cell_index);

}  // namespace kvl::cli
