"""The `kv-stall` scenario of scripts/soak (issue 37): the configuration under which the engine
once stalled for good (`-np 8 --kv-budget 512KiB --kv-policy auto --kv-quality balanced
--kv-tier ram:4MiB --kv-tier disk:...`, 32 clients mixing `kv_quality`; 3 runs of 6 stalled after
60-120 s with one request running, 30 waiting and the tiers full), run for --seconds.

    scripts/soak --scenario kv-stall [--seconds 600] [--stall-seconds 10]

What it asserts (exit status 1 and a message naming each failure):
  - no stall: at no moment did requests wait with no token (nor any answer) for --stall-seconds;
    each stall is reported with what /health and /metrics said during it;
  - /health never said 503 while the clients saw progress, and /metrics counted no watchdog trip;
  - no 5xx answer and no connection error; every answer ends with a finish reason a client knows
    (stop, length, or kv_pressure for a sequence the budget cut);
  - SIGTERM, sent while the 32 clients are still busy, makes the server exit 0 within its
    --shutdown-grace and the cancel wait after it.
It prints one JSON line (prefix `soak-json: `).

The soak's own module (scripts/soak) is handed in as `soak`: its HTTP client, processes and
server helpers are the ones the other scenario uses.
"""

import json
import os
import random
import signal
import subprocess
import threading
import time

PARALLEL = 8
SHUTDOWN_GRACE_S = 5
# After the grace the server cancels what still runs and waits up to 2 s for the answers to go
# out (src/server/server.cc); the rest is the process's exit.
EXIT_SLACK_S = 10
QUALITIES = [None, "lossless", "balanced", "aggressive"]
FINISH_REASONS = ("stop", "length", "kv_pressure")


class Progress:
    """What the clients saw: the last moment anything came back, requests in flight, stalls."""

    def __init__(self):
        self.lock = threading.Lock()
        self.last = time.monotonic()
        self.inflight = 0
        self.stop = False
        self.answers = 0
        self.tokens = 0
        self.finish = {}
        self.status = {}      # HTTP status -> count (non-200)
        self.errors = []      # messages, each a reason to fail
        self.stalls = []      # {start, seconds, health, metrics}
        self.health_503_while_progress = 0

    def moved(self, tokens=0):
        with self.lock:
            self.last = time.monotonic()
            self.tokens += tokens

    def fail(self, message):
        with self.lock:
            if len(self.errors) < 100:
                self.errors.append(message)


def prompts_for(soak, rng, port):
    """Prompts from a few tokens to near the context: short ones, shared prefixes, long ones."""
    prompts = list(soak.SHORT_PROMPTS)
    for tokens in (64, 160, 300, 420):
        prefix = soak.story(rng, tokens - 24, tokens, port)
        prompts += [prefix + " " + end for end in rng.sample(soak.SENTENCES, 3)]
    return prompts


def body_for(rng, prompts):
    prompt = rng.choice(prompts)
    body = {"max_tokens": rng.choice([16, 48, 96, 160, 256]), "stream": rng.random() < 0.6}
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body.update(temperature=0.9, top_p=0.95)
    quality = rng.choice(QUALITIES)
    if quality is not None:
        body["kv_quality"] = quality
    endpoint = rng.choice(["completion", "chat"])
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return endpoint, body


def one_request(soak, progress, rng, prompts, port, timeout_s):
    endpoint, body = body_for(rng, prompts)
    conn = soak.Connection(port, time.monotonic() + timeout_s)
    try:
        conn.send(soak.encode_request("POST", soak.path_of(endpoint), body))
        status, headers = conn.read_head()
        if status != 200:
            data = b"".join(conn.body_pieces(headers))
            with progress.lock:
                progress.status[status] = progress.status.get(status, 0) + 1
            progress.moved()  # an answer is progress too
            if status >= 500 and not progress.stop:
                progress.fail(f"HTTP {status}: {data[:200]!r}")
            return
        finish = None
        if body["stream"]:
            done = False
            for payload in soak.sse_events(conn, headers):
                if payload == "[DONE]":
                    done = True
                    continue
                frame = json.loads(payload)
                if "error" in frame and not progress.stop:
                    progress.fail(f"error frame: {payload[:200]}")
                for choice in frame.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                progress.moved(tokens=1)
            if not done and not progress.stop:
                progress.fail("a stream ended without data: [DONE]")
        else:
            data = json.loads(b"".join(conn.body_pieces(headers)))
            finish = data["choices"][0].get("finish_reason")
            progress.moved(tokens=data.get("usage", {}).get("completion_tokens", 0))
        with progress.lock:
            progress.answers += 1
            progress.finish[finish] = progress.finish.get(finish, 0) + 1
        if finish not in FINISH_REASONS and not (progress.stop and finish == "abort"):
            progress.fail(f"finish_reason {finish!r} ({endpoint}, kv_quality "
                          f"{body.get('kv_quality')!r})")
    finally:
        conn.close()


def client(soak, progress, seed, prompts, port, timeout_s):
    rng = random.Random(seed)
    while not progress.stop:
        with progress.lock:
            progress.inflight += 1
        try:
            one_request(soak, progress, rng, prompts, port, timeout_s)
        except soak.Stuck as e:
            if not progress.stop:
                progress.fail(f"a request got nothing for {timeout_s:.0f} s: {e}")
        except (soak.HttpError, OSError) as e:
            if not progress.stop:
                progress.fail(f"connection error: {e}")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            if not progress.stop:
                progress.fail(f"malformed answer: {type(e).__name__}: {e}")
        finally:
            with progress.lock:
                progress.inflight -= 1


def health_of(soak, port):
    try:
        status, _, body = soak.request(port, "GET", "/health", None, 5)
        return status, body.decode(errors="replace")[:300]
    except (soak.HttpError, soak.Stuck, OSError) as e:
        return None, str(e)


def watcher(soak, progress, port, stall_s, halt):
    """Every 0.5 s: a stall begins when requests are in flight and nothing came back for
    stall_s; /health is asked every second, and what it and /metrics say during a stall is
    kept for the report."""
    stall = None
    last_health = 0.0
    while not halt.wait(0.5):
        now = time.monotonic()
        with progress.lock:
            quiet = now - progress.last
            waiting = progress.inflight > 0
        if now - last_health >= 1.0:
            last_health = now
            status, body = health_of(soak, port)
            if status == 503 and quiet < 2.0:
                with progress.lock:
                    progress.health_503_while_progress += 1
            if stall is not None and stall["health"] is None:
                stall["health"] = f"{status} {body}"
        if stall is None and waiting and quiet >= stall_s:
            stall = {"start": round(now - quiet, 1), "seconds": quiet, "health": None,
                     "metrics": None}
            try:
                values = soak.metric_values(port)
                stall["metrics"] = {k: values.get(k) for k in (
                    "kvl:num_requests_running", "kvl:num_requests_waiting",
                    "kvl:engine_steps_total", "kvl:watchdog_trips_total")}
            except (soak.SoakError, soak.HttpError, soak.Stuck, OSError) as e:
                stall["metrics"] = str(e)
            print(f"soak: STALL: {quiet:.0f} s with requests in flight and nothing back; "
                  f"/metrics {stall['metrics']}", flush=True)
        elif stall is not None:
            stall["seconds"] = max(stall["seconds"], quiet)
            if quiet < stall_s:
                progress.stalls.append(stall)
                stall = None
    if stall is not None:
        progress.stalls.append(stall)


def run(args, seed, procs, workdir, soak):
    print(f"soak kv-stall: seed {seed}, {args.seconds:.0f} s, {args.clients} clients, stall at "
          f"{args.stall_seconds:.0f} s without progress, work folder {workdir}", flush=True)
    disk_dir = os.path.join(workdir, "disk")
    os.makedirs(disk_dir)
    argv = ["-m", args.model, "-c", str(soak.CONTEXT), "--parallel", str(PARALLEL),
            "--kv-budget", "512KiB", "--kv-policy", "auto", "--kv-quality", "balanced",
            "--kv-tier", "ram:4MiB", "--kv-tier", f"disk:{disk_dir}/kv.pages:16MiB",
            "--shutdown-grace", str(SHUTDOWN_GRACE_S), "--no-calibrate",
            "--kv-profile", os.path.join(workdir, "profile.json")] + args.server_extra
    server = soak.KvlServer(procs, args.kvl, argv, os.path.join(workdir, "server.log"),
                            "kv-stall", soak.server_env(args.malloc_arenas))
    server.start(args.restart_timeout)
    rng = random.Random(seed)
    prompts = prompts_for(soak, rng, server.port)
    progress = Progress()
    halt = threading.Event()
    watch = threading.Thread(target=watcher,
                             args=(soak, progress, server.port, args.stall_seconds, halt),
                             daemon=True)
    watch.start()
    threads = [threading.Thread(target=client, daemon=True,
                                args=(soak, progress, seed * 1000 + i, prompts, server.port,
                                      args.request_timeout))
               for i in range(args.clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    next_report = start + 60
    while time.monotonic() < start + args.seconds:
        time.sleep(1)
        if time.monotonic() >= next_report:
            next_report += 60
            with progress.lock:
                print(f"soak kv-stall: {time.monotonic() - start:.0f} s: {progress.answers} "
                      f"answers, {progress.tokens} tokens, {len(progress.stalls)} stalls",
                      flush=True)
    metrics = {}
    try:
        metrics = soak.metric_values(server.port)
    except (soak.SoakError, soak.HttpError, soak.Stuck, OSError) as e:
        progress.fail(f"/metrics at the end: {e}")
    # SIGTERM with the clients' requests still in flight: the server must exit within its grace
    # (new requests then get 503 or a closed connection, and streams cut past the grace end
    # with "abort": neither is a failure from here on).
    halt.set()
    watch.join(5)
    progress.stop = True
    sent = time.monotonic()
    os.kill(server.pid, signal.SIGTERM)
    exit_s = None
    try:
        server.proc.wait(SHUTDOWN_GRACE_S + EXIT_SLACK_S)
        exit_s = time.monotonic() - sent
    except subprocess.TimeoutExpired:
        progress.fail(f"SIGTERM: the server had not exited {SHUTDOWN_GRACE_S + EXIT_SLACK_S} s "
                      f"later (grace {SHUTDOWN_GRACE_S} s):\n{soak.tail(server.log)}")
    for t in threads:
        t.join(args.request_timeout + 5)
    procs.stop(server.proc, signal.SIGKILL)
    if exit_s is not None and server.proc.returncode != 0:
        progress.fail(f"SIGTERM: the server exited with status {server.proc.returncode}")
    return report(progress, metrics, seed, exit_s, time.monotonic() - start, args)


def report(progress, metrics, seed, exit_s, elapsed, args):
    trips = metrics.get("kvl:watchdog_trips_total", 0.0)
    if progress.stalls:
        progress.fail(f"{len(progress.stalls)} stalls (nothing back for {args.stall_seconds:.0f} s "
                      f"while requests waited): {progress.stalls[:5]}")
    if trips:
        progress.fail(f"the engine's watchdog tripped {trips:.0f} times")
    if progress.health_503_while_progress:
        progress.fail(f"/health said 503 {progress.health_503_while_progress} times while the "
                      f"clients saw progress")
    if progress.answers == 0:
        progress.fail("no request was answered")
    summary = {
        "scenario": "kv-stall", "seed": seed, "seconds": round(elapsed, 1),
        "clients": args.clients, "answers": progress.answers, "tokens": progress.tokens,
        "finish_reasons": progress.finish, "http_status": progress.status,
        "stalls": len(progress.stalls), "longest_stall_s": round(max(
            (s["seconds"] for s in progress.stalls), default=0.0), 1),
        "watchdog_trips": trips,
        "preemptions": metrics.get("kvl:num_preemptions_total"),
        # How full the tiers got: the stall needed the RAM tier full.
        "tiers": {tier: {field: metrics.get(f'kvl:kv_tier_{field}{{tier="{tier}"}}')
                         for field in ("capacity_bytes", "bytes_used", "evictions_total",
                                       "pages_in_total", "errors_total")}
                  for tier in ("ram", "disk")},
        "steps": metrics.get("kvl:engine_steps_total"),
        "sigterm_exit_s": None if exit_s is None else round(exit_s, 2),
        "failures": len(progress.errors),
    }
    print(f"soak kv-stall: {progress.answers} answers, {progress.tokens} tokens in "
          f"{elapsed:.0f} s; finish reasons {progress.finish}; non-200 {progress.status}; "
          f"{len(progress.stalls)} stalls; SIGTERM exit in "
          f"{'-' if exit_s is None else f'{exit_s:.1f}'} s", flush=True)
    print("soak-json: " + json.dumps(summary), flush=True)
    for message in progress.errors:
        print(f"soak: FAILED: {message}", flush=True)
    return 1 if progress.errors else 0
