#!/usr/bin/python3
"""The loss curve of a run (train.py's loss.csv) as a markdown table for models/README.md: the
mean training loss over windows of steps, and the held-out loss where it was measured; with
--png, also a small plot (if matplotlib is installed; the table is the record)."""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--csv", required=True)
    ap.add_argument("--png")
    ap.add_argument("--rows", type=int, default=12)
    args = ap.parse_args()
    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    window = max(1, len(rows) // args.rows)
    print("| steps | tokens (M) | train loss (mean) | held-out loss |")
    print("| --- | --- | --- | --- |")
    for begin in range(0, len(rows), window):
        part = rows[begin:begin + window]
        mean = sum(float(r["loss"]) for r in part) / len(part)
        held = [r["heldout_loss"] for r in part if r["heldout_loss"]]
        print(f"| {part[0]['step']}-{part[-1]['step']} | {int(part[-1]['tokens']) / 1e6:.2f} "
              f"| {mean:.3f} | {held[-1] if held else ''} |")
    if args.png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        steps = [int(r["step"]) for r in rows]
        plt.figure(figsize=(5, 3))
        plt.plot(steps, [float(r["loss"]) for r in rows], lw=0.6, label="train")
        held = [(int(r["step"]), float(r["heldout_loss"])) for r in rows if r["heldout_loss"]]
        if held:
            plt.plot(*zip(*held), "o-", label="held-out")
        plt.xlabel("step (1,024 tokens each)")
        plt.ylabel("loss (nats/token)")
        plt.legend()
        plt.tight_layout()
        plt.savefig(args.png, dpi=80)


if __name__ == "__main__":
    main()
