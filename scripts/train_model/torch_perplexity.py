#!/usr/bin/python3
"""A GGUF's perplexity over a text computed in PyTorch, by llama-perplexity's method, from the ids
`kvl tokenize` gives: the independent figure kvl perplexity's test is held to (for stories260K,
tests/cli/perplexity_cli_test.cc) and the check of a trained model's export.
Usage: torch_perplexity.py --gguf M --text F --ctx N [--kvl build/kvl]"""
import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from verify_gguf import model_from_gguf, torch_perplexity  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--kvl", default="build/kvl")
    args = ap.parse_args()
    torch.set_num_threads(2)
    model, meta = model_from_gguf(args.gguf)
    out = subprocess.run([args.kvl, "tokenize", "-m", args.gguf, "-f", args.text, "--ids",
                          "--no-escape"], capture_output=True, text=True, check=True).stdout
    tokens = [int(x) for x in out.strip().strip("[]").split(",")]
    ppl, n_chunks = torch_perplexity(model, tokens, args.ctx, meta["tokenizer.ggml.bos_token_id"])
    print(f"{len(tokens)} tokens, {n_chunks} chunks of {args.ctx}: perplexity {ppl:.6f}")


if __name__ == "__main__":
    main()
