#!/usr/bin/env python3
"""A KV-event subscriber written from vLLM's wire format alone, against a real `kvl serve`.

It subscribes (ZeroMQ SUB, python3-zmq) to `kvl serve --kv-events`, decodes every message as
vLLM's KVEventBatch (msgpack, python3-msgpack: msgspec structs with array_like=True, events tagged
by class name), rebuilds the block index per medium from BlockStored / BlockRemoved /
AllBlocksCleared, and compares it with the engine's own prefix index (GET /v1/kv/blocks) at
every check, during a random workload (shared prefixes, so prefix hits; more requests than
sequences and a small KV budget, so preemption and evictions; a disk tier, so pages leave the
pool and come back) and after it. Midway it drops its subscription, misses batches, reconnects
and asks the replay socket (ROUTER) for the batches it missed, from their sequence number.

    kv_events_subscriber.py --kvl build/kvl --model ../shared/models/stories260K.gguf

Prints the figures, then '1 passed, 0 failed' or '0 passed, 1 failed'; exit status 0 / 1.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class CheckFailed(Exception):
    pass


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port, method, path, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


# ------------------------------------------------------------------------------------------
# vLLM's format, decoded by hand: KVEventBatch = [ts, events, data_parallel_rank];
# BlockStored = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
# medium, ...]; BlockRemoved = ["BlockRemoved", block_hashes, medium, ...];
# AllBlocksCleared = ["AllBlocksCleared"].

def decode_batch(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) < 2:
        raise CheckFailed(f"a batch is not a KVEventBatch array: {batch!r:.200}")
    ts, events = batch[0], batch[1]
    if not isinstance(ts, float) or not isinstance(events, list):
        raise CheckFailed(f"KVEventBatch fields of the wrong types: {batch!r:.200}")
    out = []
    for ev in events:
        tag = ev[0]
        if tag == "BlockStored":
            hashes, parent, token_ids, block_size, lora_id, medium = ev[1:7]
            if len(token_ids) != block_size * len(hashes):
                raise CheckFailed(f"BlockStored with {len(token_ids)} token ids for "
                                  f"{len(hashes)} blocks of {block_size}")
            if lora_id is not None:
                raise CheckFailed(f"lora_id {lora_id!r}: kvl serves no adapters")
            out.append(("stored", hashes, parent, token_ids, block_size, medium))
        elif tag == "BlockRemoved":
            hashes, medium = ev[1:3]
            out.append(("removed", hashes, medium))
        elif tag == "AllBlocksCleared":
            out.append(("cleared",))
        else:
            raise CheckFailed(f"unknown event tag {tag!r}")
    return ts, out, (batch[2] if len(batch) > 2 else None)


class Subscriber:
    """Keeps every event in order of sequence number; the index at any point is rebuilt from
    them (a check compares the index as of the engine's snapshot, which may be behind what has
    arrived)."""

    def __init__(self, ctx, sub_address, replay_address):
        self.ctx, self.sub_address, self.replay_address = ctx, sub_address, replay_address
        self.events = []          # decoded events in stream order
        self.next_seq = 0         # the next batch's sequence number wanted
        self.replayed_batches = 0
        self.gaps = 0
        self.block_sizes = set()
        self.dp_ranks = set()
        self.parent_known = 0
        self.parent_total = 0
        self.sub = None
        self.connect()

    def connect(self):
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.bind(self.sub_address)  # kvl connects to a named host, as vLLM's engines do

    def disconnect(self):
        self.sub.close(0)
        self.sub = None

    def apply(self, seq, payload):
        if seq != self.next_seq:
            raise CheckFailed(f"batch {seq} applied when {self.next_seq} was due")
        _, events, dp_rank = decode_batch(payload)
        self.dp_ranks.add(dp_rank)
        for ev in events:
            if ev[0] == "stored":
                self.block_sizes.add(ev[4])
        self.events.extend(events)
        self.next_seq += 1

    def replay_from(self, start):
        """Asks the replay socket for every kept batch from `start` on, as vLLM's ROUTER answers:
        [seq, payload] per batch, then [-1, b""]. A DEALER, since one request has many replies
        (it adds REQ's empty delimiter frame itself)."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVTIMEO, 5000)
        dealer.connect(self.replay_address)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = dealer.recv_multipart()
                if len(frames) != 3 or frames[0] != b"":
                    raise CheckFailed(f"a replay reply of {len(frames)} frames")
                _, seq_bytes, payload = frames
                if seq_bytes == END_SEQ:
                    return
                seq = int.from_bytes(seq_bytes, "big")
                if seq == self.next_seq:
                    self.apply(seq, payload)
                    self.replayed_batches += 1
                elif seq > self.next_seq:
                    raise CheckFailed(f"replay sent batch {seq} when {self.next_seq} was due")
        except zmq.Again:
            raise CheckFailed("the replay socket did not answer in 5 s")
        finally:
            dealer.close(0)

    def poll(self, timeout_ms):
        """Takes what has arrived; a gap in the sequence numbers is filled from the replay
        socket before the batch after it is applied."""
        if self.sub is None:
            return
        while self.sub.poll(timeout_ms):
            topic, seq_bytes, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            if seq < self.next_seq:
                continue  # already had it from a replay
            if seq > self.next_seq:
                self.gaps += 1
                self.replay_from(self.next_seq)
            if seq == self.next_seq:
                self.apply(seq, payload)
            timeout_ms = 0

    def index_through(self, n):
        """The index per medium after the first n events."""
        media = {}
        for ev in self.events[:n]:
            if ev[0] == "cleared":
                media = {}
            elif ev[0] == "stored":
                held = media.setdefault(ev[5], set())
                for h in ev[1]:
                    if h in held:
                        raise CheckFailed(f"BlockStored of {h} already held on {ev[5]}")
                    held.add(h)
            else:
                held = media.setdefault(ev[2], set())
                for h in ev[1]:
                    if h not in held:
                        raise CheckFailed(f"BlockRemoved of {h}, never stored on {ev[2]}")
                    held.discard(h)
        return media


def check(sub, port, label, figures):
    """The subscriber's index as of the engine's last snapshot equals that snapshot."""
    _, body = http(port, "GET", "/v1/kv/blocks")
    state = json.loads(body)
    through = state["events_through"]
    deadline = time.monotonic() + 10
    asked_replay_at = time.monotonic()
    while len(sub.events) < through:
        if time.monotonic() > deadline:
            raise CheckFailed(f"{label}: {len(sub.events)} events arrived, the engine's state is "
                              f"as of event {through}")
        sub.poll(50)
        # A batch PUB dropped (a subscription not joined yet) shows as a gap only when a later
        # one comes; an idle engine sends none, so ask the replay socket after a while.
        if len(sub.events) < through and time.monotonic() - asked_replay_at > 0.5:
            sub.replay_from(sub.next_seq)
            asked_replay_at = time.monotonic()
    mine = sub.index_through(through)
    for medium in set(mine) | set(state["media"]):
        want = set(state["media"].get(medium, []))
        have = mine.get(medium, set())
        if want != have:
            raise CheckFailed(f"{label}: medium {medium}: engine holds {len(want)} blocks, the "
                              f"events say {len(have)} ({len(want - have)} missing, "
                              f"{len(have - want)} extra)")
    figures["checks"] += 1
    figures["max_blocks"] = max(figures["max_blocks"],
                                sum(len(v) for v in state["media"].values()))


WORDS = ("once upon a time there was a little girl named lily she liked to play with her "
         "toys in the park one day a big dog came and the sun was happy tom saw bird tree "
         "ball red blue friend mom dad").split()


def make_prompts(rng, n):
    # A few long openings shared by many requests (prefix hits), each with its own tail.
    openings = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 30)))
                for _ in range(4)]
    prompts = []
    for _ in range(n):
        tail = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
        prompts.append((rng.choice(openings) + " " + tail) if rng.random() < 0.8 else tail)
    return prompts


def run_requests(port, prompts, rng, concurrency, errors):
    lock = threading.Lock()
    queue = list(prompts)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                prompt = queue.pop()
                max_tokens = rng.randint(8, 64)
            try:
                http(port, "POST", "/v1/completions",
                     {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
            except (urllib.error.URLError, OSError) as e:
                errors.append(str(e))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    return threads


def metric(port, name):
    _, body = http(port, "GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise CheckFailed(f"/metrics has no {name}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvl", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--requests", type=int, default=240)
    # 16 pages of stories260K at f16 (the default KV type), as 320 KiB held at f32: preemption
    # and evictions.
    parser.add_argument("--kv-budget", default="160KiB")
    args = parser.parse_args()
    for path in (args.kvl, args.model):
        if not os.path.exists(path):
            print(f"kv_events_subscriber: {path} not found", file=sys.stderr)
            return 1
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="kvl-events-")
    http_port, sub_port, replay_port = free_port(), free_port(), free_port()
    ctx = zmq.Context()
    sub = Subscriber(ctx, f"tcp://127.0.0.1:{sub_port}", f"tcp://127.0.0.1:{replay_port}")
    log_path = os.path.join(work, "server.log")
    log = open(log_path, "w")
    argv = [args.kvl, "serve", "-m", args.model, "--host", "127.0.0.1", "--port", str(http_port),
            "-c", "512", "--parallel", "4", "--kv-budget", args.kv_budget, "--no-calibrate",
            "--kv-profile", os.path.join(work, "profile.json"),
            "--kv-tier", f"disk:{work}/kv.pages:8MiB",
            "--kv-events", f"tcp://127.0.0.1:{sub_port}",
            "--kv-events-replay", f"tcp://127.0.0.1:{replay_port}"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    figures = {"checks": 0, "max_blocks": 0}
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise CheckFailed(f"kvl serve exited at start:\n{open(log_path).read()[-2000:]}")
            try:
                if http(http_port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise CheckFailed("kvl serve not ready in 60 s")
            time.sleep(0.1)
        print(f"kv_events_subscriber: seed {args.seed}, server ready in "
              f"{time.monotonic() - started:.1f} s", flush=True)
        # The first batch (AllBlocksCleared) went out before this subscription could be joined
        # (ZeroMQ's slow joiner): it comes from the replay socket like any gap.
        sub.replay_from(0)
        check(sub, http_port, "at start", figures)

        prompts = make_prompts(rng, args.requests)
        errors = []
        half = len(prompts) // 2
        for phase, batch in (("first half", prompts[:half]), ("second half", prompts[half:])):
            threads = run_requests(http_port, batch, rng, 6, errors)
            if phase == "second half":
                # Drop the subscription for a while: the batches sent meanwhile are missed, and
                # come back from the replay socket by sequence number after the reconnect.
                time.sleep(0.5)
                missed_from = sub.next_seq
                sub.disconnect()
                time.sleep(1.5)
                sub.connect()
            while any(t.is_alive() for t in threads):
                sub.poll(100)
                check(sub, http_port, f"{phase}, under load", figures)
                time.sleep(0.05)
            if errors:
                raise CheckFailed(f"requests failed: {errors[:3]}")
            sub.poll(100)
            check(sub, http_port, f"{phase}, idle", figures)
        replayed = sub.replayed_batches
        stored = sum(1 for e in sub.events if e[0] == "stored")
        removed = sum(1 for e in sub.events if e[0] == "removed")
        preemptions = metric(http_port, "kvl:num_preemptions_total")
        hits = metric(http_port, "vllm:prefix_cache_hits_total")
        queries = metric(http_port, "vllm:prefix_cache_queries_total")
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                     "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            metric(http_port, name)
        print(f"kv_events_subscriber: {figures['checks']} checks equal (the most blocks held "
              f"{figures['max_blocks']}), {len(sub.events)} events in {sub.next_seq} batches: "
              f"{stored} stored, {removed} removed; {replayed} batches replayed ({sub.gaps} gaps "
              f"seen, missed from batch {missed_from}); preemptions {preemptions:.0f}, prefix "
              f"hits {hits:.0f} of {queries:.0f} tokens; block sizes {sorted(sub.block_sizes)}, "
              f"dp ranks {sorted(sub.dp_ranks)}; {time.monotonic() - started:.1f} s", flush=True)
        # The workload did what it is for: each of these is a case the index had to follow.
        if sub.block_sizes != {16}:
            raise CheckFailed(f"block sizes {sub.block_sizes}, the pool's is 16")
        if removed == 0:
            raise CheckFailed("no block was removed: the budget did not force evictions")
        if preemptions == 0:
            raise CheckFailed("no preemption: the budget did not force one")
        if hits == 0:
            raise CheckFailed("no prefix hit")
        if replayed < 2:
            raise CheckFailed(f"only {replayed} batches came from the replay socket")
        print("1 passed, 0 failed")
        return 0
    except CheckFailed as e:
        print(f"kv_events_subscriber: FAILED (seed {args.seed}): {e}", flush=True)
        print(f"--- server log (tail) ---\n{open(log_path).read()[-3000:]}", flush=True)
        print("0 passed, 1 failed")
        return 1
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        ctx.destroy(0)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
