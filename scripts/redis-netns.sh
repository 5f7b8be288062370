#!/usr/bin/env bash
# A Redis server reached over a shaped network link, as a Redis on another machine is: for
# measuring the KV cache's Redis tier (`--kv-tier redis://...`, `--kv-policy demote-redis`) at
# the rates users' links have, on one machine.
#
#   scripts/redis-netns.sh start --name N --rate 1gbit|10gbit|RATE [--port P] [--delay MS]
#     Makes a network namespace kvl-N, a veth pair from this namespace into it with private
#     addresses 10.77.S.1 (here) and 10.77.S.2 (there) on a /30 (S from the name, the next free
#     one where that subnet is taken), shapes the link in both directions with a token bucket
#     (`tc qdisc ... tbf`, at RATE as tc writes rates: 1gbit gives ~124 MB/s of Redis payload),
#     runs Debian's redis-server inside it on 10.77.S.2:P (default 6379; no persistence, its pid,
#     log and working directory in a temp dir of its own), waits until it answers PING, and
#     prints one line on stdout: the --kv-tier spec that reaches it, e.g. redis://10.77.12.2:6379.
#     --delay MS adds that one-way delay with netem, where the kernel has it (exit 3 where not).
#   scripts/redis-netns.sh stop --name N
#     Stops that redis-server by its pid and removes the namespace, the veth pair and the qdiscs.
#     Idempotent: stopping what is not there succeeds.
#
# Exit status: 0 done; 2 bad usage; 3 this machine cannot do it (not root, no `ip netns`, no tbf
# or netem qdisc, no redis-server), with one line on stderr saying why, so that a bench can say
# so and skip the tier; 1 anything else.
set -uo pipefail

readonly PREFIX=kvl
STATE_ROOT="${TMPDIR:-/tmp}"

die() { echo "redis-netns: $2" >&2; exit "$1"; }
usage() {
  die 2 "usage: $0 start --name N --rate RATE [--port P] [--delay MS] | stop --name N"
}

cmd="${1:-}"
[ -n "$cmd" ] || usage
shift
name="" rate="" port=6379 delay=""
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="${2:-}"; shift 2 ;;
    --rate) rate="${2:-}"; shift 2 ;;
    --port) port="${2:-}"; shift 2 ;;
    --delay) delay="${2:-}"; shift 2 ;;
    *) die 2 "unknown argument '$1'" ;;
  esac
done
[[ "$name" =~ ^[A-Za-z0-9_-]{1,32}$ ]] || die 2 "--name '$name': use 1-32 of [A-Za-z0-9_-]"
[[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] ||
  die 2 "--port '$port': use 1-65535"

ns="$PREFIX-$name"
state="$STATE_ROOT/kvl-redis-netns-$name"
# Interface names hold 15 bytes: a digest of the name keeps them unique and short.
tag=$(printf '%s' "$name" | cksum | awk '{printf "%06x", $1 % 16777216}')
veth_here="kvl${tag}h"
veth_there="kvl${tag}n"

stop() {
  if [ -f "$state/redis.pid" ]; then
    pid=$(cat "$state/redis.pid" 2>/dev/null || true)
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  # Deleting one end of the pair deletes the other, and an interface takes its qdisc with it.
  ip link del "$veth_here" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$state"
  return 0
}

# Whether this machine can make the link; exits 3 with why where not.
check_can() {
  [ "$(id -u)" -eq 0 ] || die 3 "network namespaces need root (uid $(id -u)): the Redis link tier is skipped"
  command -v ip > /dev/null || die 3 "no 'ip' command (iproute2): the Redis link tier is skipped"
  command -v tc > /dev/null || die 3 "no 'tc' command (iproute2): the Redis link tier is skipped"
  command -v redis-server > /dev/null || die 3 "no redis-server: the Redis link tier is skipped"
  command -v redis-cli > /dev/null || die 3 "no redis-cli: the Redis link tier is skipped"
}

# A /30 under 10.77.0.0/16 nobody here uses: the name's, else the next free one.
pick_subnet() {
  local s=$(( $(printf '%s' "$name" | cksum | awk '{print $1}') % 250 + 1 ))
  for _ in $(seq 250); do
    if ! ip -4 addr show | grep -q "inet 10\.77\.$s\."; then echo "$s"; return 0; fi
    s=$(( s % 250 + 1 ))
  done
  return 1
}

# The qdiscs of one direction, on `dev` (run through `$run`: here, or inside the namespace).
# The bucket holds two GSO super-packets (128 KiB) or 1 ms at the rate, whichever is more: enough
# to pass what the stack hands it, and small, so that a transfer of a few hundred KiB after a
# pause is paced at the rate as on a real link rather than let through at once from a full bucket.
shape() {
  local run="$1" dev="$2"
  local burst=$(( rate_bits / 8 / 1000 ))
  [ "$burst" -ge 131072 ] || burst=131072
  if [ -n "$delay" ]; then
    $run tc qdisc add dev "$dev" root handle 1: netem delay "${delay}ms" 2> "$state/tc.err" ||
      { stop; die 3 "netem is not in this kernel ($(head -1 "$state/tc.err" 2>/dev/null)): --delay cannot be had here"; }
    $run tc qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 100ms
  else
    $run tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
}

start() {
  [ -n "$rate" ] || die 2 "start needs --rate (1gbit, 10gbit, or a tc rate such as 500mbit)"
  [[ -z "$delay" || "$delay" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die 2 "--delay '$delay': milliseconds, e.g. 2 or 0.5"
  [[ "$rate" =~ ^([0-9]{1,6})(g|m|k)bit$ ]] ||
    die 2 "--rate '$rate': use NNgbit, NNmbit or NNkbit (1gbit, 10gbit, 500mbit)"
  case "${BASH_REMATCH[2]}" in
    g) rate_bits=$(( BASH_REMATCH[1] * 1000000000 )) ;;
    m) rate_bits=$(( BASH_REMATCH[1] * 1000000 )) ;;
    k) rate_bits=$(( BASH_REMATCH[1] * 1000 )) ;;
  esac
  [ "$rate_bits" -gt 0 ] || die 2 "--rate '$rate': a rate above 0"
  check_can
  stop  # a link of the same name left by a killed run
  mkdir -p "$state" || die 1 "cannot make $state"
  ip netns add "$ns" 2> "$state/ip.err" ||
    { local why; why=$(head -1 "$state/ip.err"); rm -rf "$state"; die 3 "ip netns add refused ($why): the Redis link tier is skipped"; }
  local s
  s=$(pick_subnet) || { stop; die 1 "no free /30 left in 10.77.0.0/16"; }
  here="10.77.$s.1" there="10.77.$s.2"
  run_there="ip netns exec $ns"
  {
    ip link add "$veth_here" type veth peer name "$veth_there" &&
      ip link set "$veth_there" netns "$ns" &&
      ip addr add "$here/30" dev "$veth_here" &&
      ip link set "$veth_here" up &&
      $run_there ip addr add "$there/30" dev "$veth_there" &&
      $run_there ip link set "$veth_there" up &&
      $run_there ip link set lo up
  } 2> "$state/ip.err" || { local why; why=$(head -1 "$state/ip.err"); stop; die 3 "the veth link could not be made ($why)"; }
  shape "" "$veth_here" 2> "$state/tc.err" &&
    shape "$run_there" "$veth_there" 2>> "$state/tc.err" ||
    { local why; why=$(head -1 "$state/tc.err"); stop; die 3 "tc could not shape the link with tbf ($why)"; }
  $run_there redis-server --bind "$there" --port "$port" --protected-mode no --save "" \
    --appendonly no --daemonize yes --pidfile "$state/redis.pid" --dir "$state" \
    --logfile "$state/redis.log" --loglevel warning > /dev/null 2>&1 ||
    { stop; die 1 "redis-server did not start in $ns"; }
  for _ in $(seq 100); do
    if [ "$(redis-cli -h "$there" -p "$port" PING 2>/dev/null)" = "PONG" ]; then
      echo "redis://$there:$port"
      return 0
    fi
    sleep 0.1
  done
  local log; log=$(tail -3 "$state/redis.log" 2>/dev/null | tr '\n' ' ')
  stop
  die 1 "redis-server in $ns did not answer PING at $there:$port within 10 s ($log)"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
