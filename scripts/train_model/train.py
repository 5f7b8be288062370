#!/usr/bin/python3
"""Trains the model (model.py) on the token stream from tokenize_corpus.py, on CPU, in runs that
stop by themselves after --max-minutes and resume exactly where the last checkpoint left off.

Everything a step depends on is a function of the step number: the batch of step s is drawn from
numpy's generator seeded with (SEED, s), and the learning rate is a function of s. So a checkpoint
(model + optimizer + step + RNG states, written atomically every --ckpt-minutes) is all a resume
needs; the loss CSV is cut back to the checkpoint's step when a run resumes.

Where the full checkpoint (in --ckpt-dir, outside git) is gone, --from-gguf resumes from the
committed GGUF's weights plus, if present, the compact optimizer state export.py commits beside it
(see README.md).

Training windows are --seq + 1 tokens from a random offset, and the first token of every window is
replaced by BOS, as llama.cpp's perplexity tool does for each chunk; so training sees exactly the
kind of input the held-out perplexity is measured on.
"""
import argparse
import csv
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Llama  # noqa: E402

SEED = 39
BOS = 1


def shape_for_step(step, args):
    """(batch, seq) of step: mostly short windows, which cost less attention per token, and every
    --long-every-th step one of full context, so all positions up to the context are trained.
    Both shapes hold the same number of tokens."""
    if args.long_every and step % args.long_every == args.long_every - 1:
        return args.tokens_per_step // args.seq, args.seq
    return args.tokens_per_step // args.short_seq, args.short_seq


def batch_for_step(tokens, step, batch, seq):
    rng = np.random.default_rng([SEED, step])
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
    rows = np.stack([tokens[s:s + seq + 1].astype(np.int64) for s in starts])
    rows[:, 0] = BOS
    rows = torch.from_numpy(rows)
    return rows[:, :-1], rows[:, 1:]


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.total_steps - args.warmup))
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


def make_optimizer(model, args):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def heldout_loss(model, heldout, seq, n_windows):
    """Mean loss over n_windows fixed, evenly spaced held-out windows (all positions scored)."""
    model.eval()
    stride = max(1, (len(heldout) - seq - 1) // n_windows)
    losses = []
    for i in range(n_windows):
        row = torch.from_numpy(heldout[i * stride:i * stride + seq + 1].astype(np.int64))[None]
        row[0, 0] = BOS
        logits = model(row[:, :-1])
        losses.append(F.cross_entropy(logits[0], row[0, 1:]).item())
    model.train()
    return sum(losses) / len(losses)


def save_checkpoint(path, model, optimizer, step, tokens_seen, cfg, args):
    state = {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
        "tokens_seen": tokens_seen, "config": cfg.__dict__, "args": vars(args),
        "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def truncate_csv(path, step):
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = list(csv.reader(f))
    kept = [rows[0]] + [r for r in rows[1:] if int(r[0]) < step]
    with open(path + ".tmp", "w", newline="") as f:
        csv.writer(f).writerows(kept)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True, help="folder with train.bin and heldout.bin")
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--from-gguf", help="resume from these weights when --ckpt-dir has none")
    ap.add_argument("--max-minutes", type=float, default=85.0)
    ap.add_argument("--ckpt-minutes", type=float, default=5.0)
    ap.add_argument("--total-steps", type=int, default=6000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--tokens-per-step", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024, help="the model's context")
    ap.add_argument("--short-seq", type=int, default=256)
    ap.add_argument("--long-every", type=int, default=4)
    ap.add_argument("--no-bf16", action="store_true", help="train in f32 (bf16 autocast is ~2x "
                    "faster on CPUs with AVX512-BF16; master weights and optimizer stay f32)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr", type=float, default=1.5e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--max-steps-this-run", type=int, default=0, help="0: no limit (for tests)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    start_time = time.time()
    os.makedirs(args.ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(args.ckpt_dir, "ckpt.pt")
    csv_path = os.path.join(args.ckpt_dir, "loss.csv")

    train = np.memmap(os.path.join(args.data, "train.bin"), dtype=np.uint16, mode="r")
    heldout = np.memmap(os.path.join(args.data, "heldout.bin"), dtype=np.uint16, mode="r")

    torch.manual_seed(SEED)
    np.random.seed(SEED)
    random.seed(SEED)
    cfg = Config()
    model = Llama(cfg)
    optimizer = make_optimizer(model, args)
    step, tokens_seen = 0, 0
    if os.path.exists(ckpt_path):
        state = torch.load(ckpt_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, tokens_seen = state["step"], state["tokens_seen"]
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        print(f"resumed from {ckpt_path} at step {step}", flush=True)
    elif args.from_gguf:
        from resume_state import load_resume
        step, tokens_seen = load_resume(args.from_gguf, model, optimizer)
        print(f"resumed from {args.from_gguf} at step {step}", flush=True)
    truncate_csv(csv_path, step)
    new_csv = not os.path.exists(csv_path)
    csv_file = open(csv_path, "a", newline="")
    writer = csv.writer(csv_file)
    if new_csv:
        writer.writerow(["step", "tokens", "loss", "lr", "grad_norm", "heldout_loss", "wall_s"])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f} M, train tokens {len(train) / 1e6:.1f} M, "
          f"step {step}/{args.total_steps}", flush=True)

    model.train()
    last_ckpt = time.time()
    steps_this_run = 0
    while step < args.total_steps:
        t0 = time.time()
        lr = lr_at(step, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = batch_for_step(train, step, *shape_for_step(step, args))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.no_bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        optimizer.step()
        step += 1
        steps_this_run += 1
        tokens_seen += x.numel()
        held = ""
        if step % args.eval_every == 0 or step == args.total_steps:
            held = f"{heldout_loss(model, heldout, args.seq, args.eval_windows):.4f}"
        writer.writerow([step, tokens_seen, f"{loss.item():.4f}", f"{lr:.6g}", f"{grad_norm:.3f}",
                         held, f"{time.time() - start_time:.1f}"])
        csv_file.flush()
        print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} gn {grad_norm:.2f} "
              f"{x.numel() / (time.time() - t0):.0f} tok/s {held}", flush=True)
        out_of_time = time.time() - start_time > args.max_minutes * 60
        out_of_steps = args.max_steps_this_run and steps_this_run >= args.max_steps_this_run
        if (time.time() - last_ckpt > args.ckpt_minutes * 60 or out_of_time or out_of_steps
                or step == args.total_steps):
            save_checkpoint(ckpt_path, model, optimizer, step, tokens_seen, cfg, args)
            last_ckpt = time.time()
            print(f"checkpoint at step {step}", flush=True)
        if out_of_time or out_of_steps:
            break
    csv_file.close()


if __name__ == "__main__":
    main()
