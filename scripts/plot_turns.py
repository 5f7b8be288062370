#!/usr/bin/env python3
"""Draws `kvl bench turns --json` results: per-turn wall time, TTFT and resident KV per config.

Usage: plot_turns.py OUT.png RESULT.json [MORE.json ...]

The drawing lives in plots.py (`plots.py turns ...`, with every other benchmark's figures); this
name stays because `kvl bench turns --plot` runs it. Several JSON files (one config per run, say)
are drawn together; a config that appears in more than one file is drawn once, from the first.
Exits 3 when matplotlib is missing (Debian: python3-matplotlib), so that the bench can say so and
go on.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plots  # noqa: E402  (exits 3 when matplotlib is missing)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    plots.turns(argv[1], argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
