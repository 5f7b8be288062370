#!/usr/bin/env python3
"""Two `kvl serve` binaries (say, main's and a branch's) under `kvl bench serve`, alternated.

Both servers run side by side (same model, flags and client); each round measures every
concurrency, plain and streamed, on one server then the other, back to back, the order swapped
each round. The table gives each configuration's median over the rounds.

  scripts/bench_http.py --old /tmp/kvl-main-src/build/kvl --new build/kvl \
      -m ../shared/models/stories260K.gguf [--rounds 3] [-n 200] [--clients 1,4,16]
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-n", type=int, default=200)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--server-args", default="-np 16 -t 1 --no-calibrate")
    a = p.parse_args()
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
