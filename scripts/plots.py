#!/usr/bin/env python3
"""Draws kvlattice's benchmark JSON as figures.

Usage:
  plots.py frontier OUT.png FRONTIER.json      `kvl bench frontier --json`: the winner per
                                               (page tokens, depth), per tier and phase
  plots.py turns OUT.png TURNS.json [MORE ...]  `kvl bench turns --json`: per-turn curves
  plots.py throughput OUT.png BENCH.json [...]  `kvl bench -o json`: tok/s per test
  plots.py quality OUT.png QUALITY.json         `kvl bench quality --json`: KLD against the
                                               bytes each KV representation keeps
  plots.py lattice OUT.png LATTICE.json         `kvl bench lattice --json`: a Pareto panel per
                                               workload, agreement with keep-all against tok/s
  plots.py all DATA_DIR IMAGES_DIR              every *.json in DATA_DIR to IMAGES_DIR/<name>.png,
                                               and each DATA_DIR/*llama_bench*/ directory of
                                               side-by-side runs to IMAGES_DIR/<dir>.png
                                               the kind told by the JSON itself (`make plots`)

Exits 3 when matplotlib is missing (Debian: python3-matplotlib), so that a caller can say so and
go on; 2 on bad usage or a JSON file of no known kind.
"""
import glob
import json
import math
import os
import re
import sys
import textwrap

try:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator
except ImportError:
    print("plots.py: matplotlib is missing (apt-get install python3-matplotlib)", file=sys.stderr)
    sys.exit(3)

MIB = 1024.0 * 1024.0

# ----------------------------------------------------------------------------------------------
# kvl bench frontier

WAYS = ["recompute-residual", "recompute-tokens", "transfer"]
WAY_LABELS = {"recompute-residual": "recompute from residual", "recompute-tokens":
              "recompute from tokens", "transfer": "transfer from the tier"}
WAY_COLORS = ["#4c9f70", "#e0a33a", "#4a7fc1"]  # residual green, tokens amber, transfer blue
WAY_LETTERS = {"recompute-residual": "R", "recompute-tokens": "T", "transfer": "X"}


def _grid(points, tier, phase, field, page_tokens, depths):
    """[depth][page tokens] index into WAYS of `field` ("winner" or "predicted_winner")."""
    grid = [[None] * len(page_tokens) for _ in depths]
    for p in points:
        if p["tier"] == tier and p["phase"] == phase:
            i, j = depths.index(p["depth"]), page_tokens.index(p["page_tokens"])
            grid[i][j] = WAYS.index(p[field])
    return grid


def _boundaries(ax, grid, **style):
    """Lines along the cell edges where the winner changes: the crossover lines."""
    rows, cols = len(grid), len(grid[0])
    for i in range(rows):
        for j in range(cols):
            if j + 1 < cols and grid[i][j] != grid[i][j + 1]:
                ax.plot([j + 0.5, j + 0.5], [i - 0.5, i + 0.5], **style)
            if i + 1 < rows and grid[i][j] != grid[i + 1][j]:
                ax.plot([j - 0.5, j + 0.5], [i + 0.5, i + 0.5], **style)


def frontier(out, path):
    with open(path) as f:
        data = json.load(f)
    points = data["points"]
    page_tokens, depths = data["page_tokens"], data["depths"]
    tiers = [t["tier"] for t in data["tiers"]]
    phases = ["prefill", "decode"]
    fig, axes = plt.subplots(len(phases), len(tiers), squeeze=False,
                             figsize=(3.2 * len(tiers) + 1.5, 2.9 * len(phases) + 1.2))
    cmap = ListedColormap(WAY_COLORS)
    for r, phase in enumerate(phases):
        for c, tier in enumerate(tiers):
            ax = axes[r][c]
            measured = _grid(points, tier, phase, "winner", page_tokens, depths)
            model = _grid(points, tier, phase, "predicted_winner", page_tokens, depths)
            ax.imshow([[-1 if v is None else v for v in row] for row in measured], cmap=cmap,
                      vmin=0, vmax=len(WAYS) - 1, origin="lower", aspect="auto")
            for i, row in enumerate(measured):
                for j, v in enumerate(row):
                    if v is None:
                        continue
                    # The measured winner's letter; the model's in brackets where it disagrees.
                    text = WAY_LETTERS[WAYS[v]]
                    if model[i][j] != v:
                        text += f" ({WAY_LETTERS[WAYS[model[i][j]]]})"
                    ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white",
                            fontweight="bold")
            _boundaries(ax, measured, color="black", linewidth=2.5)
            _boundaries(ax, model, color="white", linewidth=1.2, linestyle="--")
            ax.set_xticks(range(len(page_tokens)))
            ax.set_xticklabels([str(t) for t in page_tokens], fontsize=8)
            ax.set_yticks(range(len(depths)))
            ax.set_yticklabels([str(d) for d in depths], fontsize=8)
            ax.set_title(f"{tier}, {phase}", fontsize=9)
            if r == len(phases) - 1:
                ax.set_xlabel("page tokens")
            if c == 0:
                ax.set_ylabel("depth (layers)")
    handles = [Patch(color=WAY_COLORS[i], label=f"{WAY_LETTERS[w]}: {WAY_LABELS[w]}")
               for i, w in enumerate(WAYS)]
    handles.append(plt.Line2D([], [], color="black", linewidth=2.5, label="measured crossover"))
    handles.append(plt.Line2D([], [], color="grey", linewidth=1.2, linestyle="--",
                              label="cost model's crossover (white); (X) = model's winner"))
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=7, frameon=False)
    shape = data.get("shape", {})
    fig.suptitle(
        f'kvl bench frontier: {data.get("model_name", "")} ({data.get("weight_type", "")}, '
        f'{shape.get("layers", "?")} layers, {shape.get("heads", "?")}/{shape.get("kv_heads", "?")} '
        f'heads), {data.get("threads", "?")} thread(s), pages after {data.get("position", "?")} '
        f'tokens\nresidual / K+V bytes = {data["residual_bytes_per_token_layer"] / data["kv_bytes_per_token_layer"]:.2f}, '
        f'decode idle fraction {data["decode"]["idle_fraction"]:.2f}', fontsize=9)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# kvl bench turns (scripts/plot_turns.py calls this: `kvl bench turns --plot`)

# One colour and line style per config, the same in every figure.
TURN_STYLES = {
    "a": ("tab:red", "--"),
    "b": ("black", "-"),
    "c-ram": ("tab:blue", "-"),
    "c-disk": ("tab:cyan", "-"),
    "d-balanced": ("tab:green", "-."),
    "d-evict": ("tab:orange", "-."),
    "d-compress": ("tab:olive", "-."),
}


def _load_turns(paths):
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


def turns(out, paths):
    header, configs = _load_turns(paths)
    fig, (ax_time, ax_ttft, ax_mem) = plt.subplots(3, 1, figsize=(9, 11), sharex=True)
    budget = 0
    for config in configs:
        rows = config["turns"]
        if not rows:
            continue
        color, style = TURN_STYLES.get(config["name"], (None, "-"))
        x = [t["turn"] for t in rows]
        label = f'{config["name"]}: {config["description"]}'
        ax_time.plot(x, [t["wall_ms"] / 1000 for t in rows], style, color=color, label=label,
                     marker=".")
        ax_ttft.plot(x, [t["ttft_ms"] / 1000 for t in rows], style, color=color, marker=".")
        ax_mem.plot(x, [t["resident_bytes"] / MIB for t in rows], style, color=color, marker=".")
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
        f'kvl bench turns: {os.path.basename(header.get("model", ""))}, {header.get("turns", "")} '
        f'turns, replies of {header.get("reply_tokens", "")} tokens, whole history resubmitted',
        fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# kvl bench -o json (llama-bench's fields)

def throughput(out, paths):
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [r for r in json.load(f) if "avg_ts" in r]
    labels, values, errors, colors = [], [], [], []
    models = sorted({r.get("model_type", "") for r in rows}, key=lambda m: [r.get("model_type") for r in rows].index(m))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r in rows:
        cache = "" if r.get("type_k", "f32") == "f32" and r.get("type_v", "f32") == "f32" else \
            f' {r["type_k"]}/{r["type_v"]}'
        labels.append(f'{r.get("model_type", "")}  {r["test"]}  t={r.get("n_threads", "?")}{cache}')
        values.append(r["avg_ts"])
        errors.append(r.get("stddev_ts", 0))
        colors.append(palette[models.index(r.get("model_type", "")) % len(palette)])
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
    y = list(range(len(rows)))[::-1]
    ax.barh(y, values, xerr=errors, color=colors, alpha=0.85)
    for yi, v, e in zip(y, values, errors):
        ax.text(v + e, yi, f"  {v:.1f}", va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xscale("log" if values and max(values) / max(min(values), 1e-9) > 50 else "linear")
    ax.set_xlabel("tokens per second (mean ± stddev)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("kvl bench: prompt processing (pp) and generation (tg) speed", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# kvl bench beside llama-bench: a directory of gated runs named MODEL-DEPTH-PROGRAM-ROUND.json
# (PROGRAM kvl or llama), both in llama-bench's JSON; the best round of each test is drawn.

VERSUS_NAME = re.compile(r"(?P<model>.+)-d(?P<depth>\d+)-(?P<prog>kvl|llama)-(?P<round>\d+)\.json$")


def versus(out, directory):
    best = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        m = VERSUS_NAME.match(os.path.basename(path))
        if not m:
            continue
        try:
            with open(path) as f:
                rows = json.load(f)
        except (OSError, ValueError):
            continue  # a unit cut short leaves an empty file
        for r in rows:
            if "avg_ts" not in r:
                continue
            test = r.get("test") or (f'pp{r["n_prompt"]}' if r.get("n_prompt") else f'tg{r["n_gen"]}')
            if r.get("n_depth") and "@" not in test:
                test += f' @ d{r["n_depth"]}'
            key = (m["model"], test, m["prog"])
            best[key] = max(best.get(key, 0.0), r["avg_ts"])
    groups = sorted({(model, test) for model, test, _ in best})
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(groups) + 1.4))
    height = 0.38
    for i, prog in enumerate(("kvl", "llama")):
        y = [len(groups) - 1 - g + (0.2 if i == 0 else -0.2) for g in range(len(groups))]
        values = [best.get((model, test, prog), 0.0) for model, test in groups]
        ax.barh(y, values, height, label="kvlattice" if prog == "kvl" else "llama.cpp (llama-bench)")
        for yi, v in zip(y, values):
            if v > 0:
                ax.text(v, yi, f" {v:.1f}", va="center", fontsize=7)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([f"{model}  {test}" for model, test in reversed(groups)], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("tokens per second (best round)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("kvl bench beside llama-bench: same file, same threads, same minutes", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# kvl bench quality

QUALITY_COLORS = {"cache type": "#4c7ec1", "compress": "#e0a030"}


def quality(out, path):
    with open(path) as f:
        data = json.load(f)
    if "contexts" not in data:
        quality_against_f32(out, data)
        return
    # The shortest context measured (512, or the text's length), one point per representation.
    ctx = data["contexts"][0]["ctx"]
    configs = [c for c in data["configs"] if c["ctx"] == ctx]
    fig, ax = plt.subplots(figsize=(8, 5))
    # KLD 0 has no place on a log axis: it is drawn on a floor below the smallest KLD measured.
    measured = [c["kld_mean"] for c in configs if c["kld_mean"] > 0]
    floor = min(measured) / 10 if measured else 1e-8
    for family, color in QUALITY_COLORS.items():
        points = [c for c in configs if c["family"] == family]
        xs = [c["bits_per_value"] for c in points]
        ys = [max(c["kld_mean"], floor) for c in points]
        ax.scatter(xs, ys, s=60, color=color, label=family, zorder=3)
        for i, (c, x, y) in enumerate(zip(points, xs, ys)):
            # Alternately above and below, so that neighbours (q8_0, q8_0r) do not overlap.
            # Compressed pages labelled to the left of their points, cache types to the right.
            left = family == "compress"
            ax.annotate(f'{c["name"]}  (top-1 {100 * c["top1"]:.1f}%)', (x, y),
                        textcoords="offset points",
                        xytext=(-6 if left else 6, 5 if i % 2 == 0 else -12),
                        ha="right" if left else "left", fontsize=8)
    ax.axhline(floor, color="grey", linewidth=0.6, linestyle=":")
    ax.set_yscale("log")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bits per K/V value as held")
    ax.set_ylabel(f'mean KL divergence from the {data.get("reference", "f16")} cache (nats)')
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f'kvl bench quality: {os.path.basename(data.get("model", ""))} '
                 f'({data.get("model_name", "")}), {data.get("layers", "")} '
                 f'layers, ctx {ctx}, teacher-forced', fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def quality_against_f32(out, data):
    """The JSON of kvl bench quality before issue 39 (one context, against an f32 cache, sizes as a
    fraction of f32's), as docs/data/bench_quality_stories260k.json holds it."""
    configs = data["configs"]
    fig, ax = plt.subplots(figsize=(8, 5))
    # KLD 0 (the f32 reference, and every lossless action) has no place on a log axis: it is drawn
    # on a floor below the smallest KLD measured, and labelled so.
    measured = [c["mean_kld"] for c in configs if c["mean_kld"] > 0]
    floor = min(measured) / 10 if measured else 1e-8
    for family, color in QUALITY_COLORS.items():
        points = [c for c in configs if c["family"] == family]
        xs = [100 * c["fraction_of_f32"] for c in points]
        ys = [max(c["mean_kld"], floor) for c in points]
        ax.scatter(xs, ys, s=60, color=color, label=family, zorder=3)
        for i, (c, x, y) in enumerate(zip(points, xs, ys)):
            left = family == "compress"
            ax.annotate(f'{c["name"]}  (top-1 {100 * c["top1"]:.1f}%)', (x, y),
                        textcoords="offset points",
                        xytext=(-6 if left else 6, 5 if i % 2 == 0 else -12),
                        ha="right" if left else "left", fontsize=8)
    ax.scatter([0], [floor], s=60, color="#4b9e6b", marker="s", zorder=3,
               label="lossless: demote / recompute (bit-exact, nothing in the pool)")
    ax.axhline(floor, color="grey", linewidth=0.6, linestyle=":")
    ax.text(101, floor, " KLD 0", va="center", fontsize=8, color="grey")
    ax.set_yscale("log")
    ax.set_xlim(-5, 115)
    ax.set_xlabel("KV bytes kept per token, % of f32")
    ax.set_ylabel("mean KL divergence from the f32 cache (nats)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f'kvl bench quality: {os.path.basename(data.get("model", ""))} '
                 f'({data.get("model_name", "")}), {data.get("layers", "")} '
                 f'layers, {data.get("text_tokens", "")} tokens teacher-forced', fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# kvl bench lattice

LATTICE_COLORS = {"auto": "#d62728", "keep": "#7f7f7f", "compress": "#e0a030",
                  "compress-int4": "#8c564b", "demote": "#4a7fc1", "demote-disk": "#17becf",
                  "demote-redis": "#1f3f7f", "recompute-residual": "#4c9f70",
                  "recompute-tokens": "#bcbd22", "evict": "#9467bd"}
LATTICE_MARKERS = ["v", "s", "o", "D", "^"]  # one per budget, smallest first


def lattice(out, path):
    """A Pareto panel per workload: quality (agreement with keep-all) against output tok/s, a
    colour per policy and a marker per budget; keep-all as a star. Up and right is better."""
    with open(path) as f:
        data = json.load(f)
    workloads = data["workloads"]

    def top1(c):
        # "top1" since issue 40; "agreement" in the JSON of earlier runs (docs/data).
        return 100 * c.get("top1", c.get("agreement", 0))
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 5), squeeze=False)
    budgets = sorted(data["budgets"])
    drawn = set()  # the policies with a point in some panel: the legend's entries
    for ax, w in zip(axes[0], workloads):
        ref = w["reference"]
        ax.scatter([ref["tok_s"]], [top1(ref)], marker="*", s=220, color="black", zorder=4)
        for policy, color in LATTICE_COLORS.items():
            for i, b in enumerate(budgets):
                cells = [c for c in w["cells"] if c["policy"] == policy
                         and c["budget_fraction"] == b and not c["error"]]
                if not cells:
                    continue
                ax.scatter([c["tok_s"] for c in cells], [top1(c) for c in cells],
                           marker=LATTICE_MARKERS[i % len(LATTICE_MARKERS)], s=70 if policy == "auto" else 45,
                           color=color, edgecolors="black" if policy == "auto" else "none",
                           zorder=3 if policy == "auto" else 2)
                drawn.add(policy)
        ax.set_xlabel("output tok/s")
        ax.set_ylabel("top-1 agreement with keep-all (%)"
                      + ("" if data.get("quality_meaningful", True) else ": meaningless, random weights"))
        ax.set_ylim(-5, 105)
        ax.grid(True, alpha=0.3)
        ax.set_title(textwrap.fill(f'{w["name"]}: {w["description"]}', 80), fontsize=8)
    # One legend for every panel, beside the last: a policy may have cells only in some panels.
    last = axes[0][-1]
    last.scatter([], [], marker="*", s=220, color="black", label="keep-all")
    for policy, color in LATTICE_COLORS.items():
        if policy in drawn:
            last.scatter([], [], marker="o", color=color, label=policy)
    for i, b in enumerate(budgets):
        last.scatter([], [], marker=LATTICE_MARKERS[i % len(LATTICE_MARKERS)], color="grey",
                     label=f"budget 1/{round(1 / b)}")
    last.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f'kvl bench lattice: {os.path.basename(data.get("model", ""))} '
                 f'({data.get("model_name", "")}), auto against each fixed KV policy', fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------

def kind_of(path):
    """frontier, quality, lattice, turns or throughput, from the JSON's own shape; None for anything else."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict) and data.get("bench") in ("frontier", "quality", "lattice"):
        return data["bench"]
    if isinstance(data, dict) and "configs" in data:
        return "turns"
    if isinstance(data, list) and any(isinstance(r, dict) and "avg_ts" in r for r in data):
        return "throughput"
    return None


def everything(data_dir, images_dir):
    os.makedirs(images_dir, exist_ok=True)
    drawn = 0
    for directory in sorted(glob.glob(os.path.join(data_dir, "*llama_bench*"))):
        out = os.path.join(images_dir, os.path.basename(directory) + ".png")
        versus(out, directory)
        print(f"plots.py: versus     {directory} -> {out}")
        drawn += 1
    for path in sorted(glob.glob(os.path.join(data_dir, "*.json"))):
        kind = kind_of(path)
        out = os.path.join(images_dir, os.path.splitext(os.path.basename(path))[0] + ".png")
        if kind is None:
            print(f"plots.py: {path}: not a JSON kind this script draws, skipped", file=sys.stderr)
            continue
        DRAW[kind](out, path if kind in ("frontier", "quality", "lattice") else [path])
        print(f"plots.py: {kind:<10} {path} -> {out}")
        drawn += 1
    return 0 if drawn > 0 else 2


DRAW = {"frontier": frontier, "quality": quality, "turns": turns, "throughput": throughput,
        "lattice": lattice}


def main(argv):
    if len(argv) >= 4 and argv[1] == "all":
        return everything(argv[2], argv[3])
    if len(argv) == 4 and argv[1] in ("frontier", "quality", "lattice"):
        DRAW[argv[1]](argv[2], argv[3])
        return 0
    if len(argv) >= 4 and argv[1] in ("turns", "throughput"):
        DRAW[argv[1]](argv[2], argv[3:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
