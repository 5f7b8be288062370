#!/usr/bin/env python3
"""Two `kvl serve` binaries (say, main's and a branch's) under `kvl bench serve`, alternated.

Both servers run side by side (same model, flags and client); each round measures every
concurrency, plain and streamed, on one server then the other, back to back, the order swapped
each round. The table gives each configuration's median over the rounds.

  scripts/bench_http.py --old /tmp/kvl-main-src/build/kvl --new build/kvl \
      -m ../shared/models/stories260K.gguf [--rounds 3] [-n 200] [--clients 1,4,16]

With --health SECONDS it measures instead how fast /health and /metrics answer under load: 16
streaming clients (`kvl bench serve --stream`) and 8 slowloris connections (a header byte every
half second) on each server in turn, while a probe opens a fresh connection for GET /health and
GET /metrics every 50 ms; it prints p50, p99 and the worst of each (--old is optional there).

On a machine shared with others' builds, their load decides the figures more than either server
does; a session of its own at a higher autogroup priority takes less of it:
  setsid bash -c 'echo -10 > /proc/self/autogroup; exec scripts/bench_http.py ...'
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def start_server(binary, model, extra):
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", *extra],
                            stderr=log, stdout=subprocess.DEVNULL)
    for _ in range(600):
        text = open(log.name).read()
        m = re.search(r"listening on http://[\d.]+:(\d+)\n", text)
        if m and "ready" in text:
            port = int(m.group(1))
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                return proc, port, log.name
            except OSError:
                pass
        if proc.poll() is not None:
            sys.exit(f"{binary} exited: {text}")
        time.sleep(0.05)
    sys.exit(f"{binary} did not get ready: {open(log.name).read()}")


def stop_server(proc, log):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    os.unlink(log)


def bench(client, port, clients, stream, n):
    args = [client, "bench", "serve", "--port", str(port), "-n", str(n), "--concurrency",
            str(clients), "--prompt-tokens", "64", "--max-tokens", "64", "-o", "json"]
    if stream:
        args.append("--stream")
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def slowloris(port, count, stop):
    """`count` connections that send a request's head one byte every half second, never ending."""
    import socket
    import threading

    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nX-Slow: " + \
        b"a" * 4096

    def trickle():
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), 5) as s:
                    for byte in head:
                        if stop.wait(0.5):
                            return
                        s.sendall(bytes([byte]))
            except OSError:
                pass  # cut off by the server's receive deadline: start again

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    return threads


def probe_seconds(port, path):
    """Seconds for GET `path` on a fresh connection (None: no 200 within 10 s)."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            r.read()
            if r.status != 200:
                return None
    except OSError:
        return None
    return time.monotonic() - start


def health_under_load(name, binary, a):
    """p50/p99/max of /health and /metrics while 16 clients stream and 8 trickle headers."""
    import threading

    proc, port, log = start_server(binary, a.model, a.server_args.split())
    stop = threading.Event()
    load = subprocess.Popen([a.new, "bench", "serve", "--port", str(port), "-n", "100000",
                             "--concurrency", "16", "--prompt-tokens", "64", "--max-tokens",
                             "64", "--stream", "-o", "json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    slowloris(port, 8, stop)
    samples = {"/health": [], "/metrics": []}
    failures = 0
    try:
        time.sleep(1)  # the streams under way
        end = time.monotonic() + a.health
        while time.monotonic() < end:
            for path in samples:
                t = probe_seconds(port, path)
                if t is None:
                    failures += 1
                else:
                    samples[path].append(t * 1000)
            time.sleep(0.05)
    finally:
        stop.set()
        load.send_signal(signal.SIGTERM)
        load.wait()
        stop_server(proc, log)
    for path, ms in samples.items():
        print(f"| {name} | {path} | {len(ms)} | {statistics.median(ms):.2f} | "
              f"{percentile(ms, 0.99):.2f} | {max(ms):.2f} |")
    if failures:
        print(f"warning: {name}: {failures} probes got no 200 within 10 s", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old")
    p.add_argument("--new", required=True)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-n", type=int, default=200)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--server-args", default="-np 16 -t 1 --no-calibrate")
    p.add_argument("--health", type=float, default=0,
                   help="seconds of /health and /metrics probes under load, instead of throughput")
    a = p.parse_args()
    if a.health > 0:
        print("| server | path | probes | p50 ms | p99 ms | max ms |")
        print("|---|---|---|---|---|---|")
        for name in ("old", "new"):
            if getattr(a, name):
                health_under_load(name, getattr(a, name), a)
        print(f"\n16 streaming clients (64 prompt words, 64 tokens) and 8 slowloris connections, "
              f"a fresh connection per probe every 50 ms for {a.health:.0f} s; server flags: "
              f"{a.server_args}")
        return
    if not a.old:
        p.error("--old is needed to compare throughput")
    clients = [int(c) for c in a.clients.split(",")]
    runs = {}  # (binary, stream, clients) -> [result]
    # Both servers run side by side (the idle one costs nothing) and every cell is measured on
    # one then the other, back to back, the order swapped each round: the machine's other load
    # falls on both alike.
    servers = {name: start_server(getattr(a, name), a.model, a.server_args.split())
               for name in ("old", "new")}
    try:
        for r in range(a.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for stream in (False, True):
                for c in clients:
                    for name in order:
                        # The bench client is the new binary's for both servers.
                        res = bench(a.new, servers[name][1], c, stream, a.n)
                        if res["requests_failed"]:
                            print(f"warning: {name} {c} clients: {res['requests_failed']} "
                                  "failed", file=sys.stderr)
                        runs.setdefault((name, stream, c), []).append(res)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        for proc, _, log in servers.values():
            stop_server(proc, log)

    def med(name, stream, c, key, sub=None):
        vals = [x[key][sub] if sub else x[key] for x in runs[(name, stream, c)]]
        return statistics.median(vals)

    print(f"| mode | clients | req/s old | req/s new | new/old | TTFT p50 ms old | new "
          f"| ITL p50 ms old | new | e2e p50 ms old | new |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for stream in (False, True):
        for c in clients:
            ro, rn = med("old", stream, c, "request_throughput"), med("new", stream, c,
                                                                     "request_throughput")
            cells = [f"{ro:.1f}", f"{rn:.1f}", f"{rn / ro:.2f}"]
            for key in ("ttft_ms", "itl_ms", "e2e_ms"):
                cells += [f"{med('old', stream, c, key, 'median'):.2f}",
                          f"{med('new', stream, c, key, 'median'):.2f}"]
            print(f"| {'stream' if stream else 'plain'} | {c} | " + " | ".join(cells) + " |")
    print(f"\n{a.rounds} rounds, cells alternated, {a.n} requests per cell, 64 prompt words, "
          f"64 tokens, server flags: {a.server_args}; medians over the rounds.")


if __name__ == "__main__":
    main()
