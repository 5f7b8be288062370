#!/usr/bin/env python3
"""Draws `kvl bench turns --json` results: per-turn wall time, TTFT and resident KV per config.

Usage: plot_turns.py OUT.png RESULT.json [MORE.json ...]

Several JSON files (one config per run, say) are drawn together; a config that appears in more
than one file is drawn once, from the first. Exits 3 when matplotlib is missing (Debian:
python3-matplotlib), so that the bench can say so and go on.
"""
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
except ImportError:
    print("plot_turns.py: matplotlib is missing (apt-get install python3-matplotlib)",
          file=sys.stderr)
    sys.exit(3)

# One colour and line style per config, the same in every figure.
STYLES = {
    "a": ("tab:red", "--"),
    "b": ("black", "-"),
    "c-ram": ("tab:blue", "-"),
    "c-disk": ("tab:cyan", "-"),
    "d-balanced": ("tab:green", "-."),
    "d-evict": ("tab:orange", "-."),
    "d-compress": ("tab:olive", "-."),
}

MIB = 1024.0 * 1024.0


def load(paths):
    """The first file's header, and every config once, in the order first seen."""
    header, configs, seen = None, [], set()
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        header = header or data
        for config in data.get("configs", []):
            if config["name"] not in seen:
                seen.add(config["name"])
                configs.append(config)
    return header, configs


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, paths = argv[1], argv[2:]
    header, configs = load(paths)
    fig, (ax_time, ax_ttft, ax_mem) = plt.subplots(3, 1, figsize=(9, 11), sharex=True)
    budget = 0
    for config in configs:
        turns = config["turns"]
        if not turns:
            continue
        color, style = STYLES.get(config["name"], (None, "-"))
        x = [t["turn"] for t in turns]
        label = f'{config["name"]}: {config["description"]}'
        ax_time.plot(x, [t["wall_ms"] / 1000 for t in turns], style, color=color, label=label,
                     marker=".")
        ax_ttft.plot(x, [t["ttft_ms"] / 1000 for t in turns], style, color=color, marker=".")
        ax_mem.plot(x, [t["resident_bytes"] / MIB for t in turns], style, color=color,
                    marker=".")
        budget = max(budget, config.get("budget_bytes", 0))
    if budget > 0:
        ax_mem.axhline(budget / MIB, color="grey", linewidth=0.8, linestyle=":")
        ax_mem.annotate("budget", (1, budget / MIB), textcoords="offset points", xytext=(2, 3),
                        color="grey", fontsize=8)
    ax_time.set_ylabel("turn wall time (s)")
    ax_ttft.set_ylabel("time to first token (s)")
    ax_mem.set_ylabel("resident KV (MiB)")
    ax_mem.set_xlabel("turn")
    ax_mem.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_time, ax_ttft, ax_mem):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_time.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f'kvl bench turns: {os.path.basename(header.get("model", ""))}, {header.get("turns", "")} turns, '
        f'replies of {header.get("reply_tokens", "")} tokens, whole history resubmitted',
        fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
