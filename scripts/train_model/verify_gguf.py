#!/usr/bin/python3
"""Checks an exported GGUF against PyTorch running the same weights, through kvl:

1. tokenizer: `kvl tokenize` gives SentencePiece's ids for the held-out text (BOS + encode);
2. greedy text: `kvl run --temp 0` continues each prompt as PyTorch's greedy decoding does, token
   for token (which shows kvl reads the architecture, RoPE convention and tokenizer as trained);
3. perplexity: `kvl perplexity` on the held-out text against PyTorch computing it the same way
   (llama-perplexity's method: chunks of n_ctx with BOS first, second half of each scored).

PyTorch runs the GGUF's own weights (F16 rounded, in f32), so the figures compare engines, not
export precision. Exit status 1 if any check fails.
"""
import argparse
import math
import os
import re
import subprocess
import sys

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Llama  # noqa: E402
from resume_state import load_weights_from_gguf  # noqa: E402
from gguf_file import read_gguf  # noqa: E402

PROMPTS = ["The configuration file", "To install the package, run", "In Python, a list is"]


def model_from_gguf(path):
    meta, tensors = read_gguf(path)
    cfg = Config(vocab_size=len(meta["tokenizer.ggml.tokens"]),
                 dim=meta["llama.embedding_length"], n_layers=meta["llama.block_count"],
                 n_heads=meta["llama.attention.head_count"],
                 n_kv_heads=meta["llama.attention.head_count_kv"],
                 ffn_dim=meta["llama.feed_forward_length"], context=meta["llama.context_length"],
                 norm_eps=meta["llama.attention.layer_norm_rms_epsilon"],
                 rope_theta=meta.get("llama.rope.freq_base", 10000.0),
                 tie_embeddings="output.weight" not in tensors)
    model = Llama(cfg)
    load_weights_from_gguf(path, model)
    model.eval()
    return model, meta


def check_tokenizer(kvl, gguf, sp, text_path):
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    want = [sp.bos_id()] + sp.encode(text)
    out = subprocess.run([kvl, "tokenize", "-m", gguf, "-f", text_path, "--ids", "--no-escape"],
                         capture_output=True, text=True, check=True).stdout
    got = [int(x) for x in out.strip().strip("[]").split(",")]
    same = got == want
    first_diff = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    print(f"tokenizer: kvl {len(got)} tokens, SentencePiece {len(want)}: "
          f"{'identical' if same else f'DIFFER (first at {first_diff})'}")
    return same, want


def piece_text(meta, token):
    """The bytes llama.cpp prints for one token: ▁ as a space, <0xNN> as that byte."""
    piece = meta["tokenizer.ggml.tokens"][token]
    if meta["tokenizer.ggml.token_type"][token] == 6:
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


@torch.no_grad()
def greedy(model, ids, n, eos):
    ids = list(ids)
    out = []
    for _ in range(n):
        logits = model(torch.tensor([ids]))[0, -1]
        token = int(torch.argmax(logits))
        if token == eos:
            break
        out.append(token)
        ids.append(token)
    return out


def check_greedy(kvl, gguf, model, meta, sp, n):
    ok = True
    for prompt in PROMPTS:
        generated = greedy(model, [sp.bos_id()] + sp.encode(prompt), n, sp.eos_id())
        want = prompt.encode("utf-8") + b"".join(piece_text(meta, t) for t in generated)
        got = subprocess.run([kvl, "run", "-m", gguf, "-p", prompt, "-n", str(n), "--temp", "0",
                              "-t", "2"], capture_output=True, check=True).stdout
        same = got in (want, want + b"\n")  # kvl run ends its output with a newline
        ok = ok and same
        print(f"greedy {'same' if same else 'DIFFERENT'}: {want.decode('utf-8', 'replace')!r}")
        if not same:
            print(f"   kvl: {got.decode('utf-8', 'replace')!r}")
    return ok


@torch.no_grad()
def torch_perplexity(model, tokens, n_ctx, bos):
    """llama-perplexity's method on a token list that starts with BOS."""
    n_chunks = len(tokens) // n_ctx
    first = n_ctx // 2
    nll, nll2, count = 0.0, 0.0, 0
    for i in range(n_chunks):
        chunk = torch.tensor(tokens[i * n_ctx:(i + 1) * n_ctx])
        chunk[0] = bos
        logits = model(chunk[None])[0].double()
        logp = F.log_softmax(logits[first:n_ctx - 1], dim=-1)
        token_nll = -logp.gather(1, chunk[first + 1:, None].long())[:, 0]
        nll += token_nll.sum().item()
        nll2 += (token_nll ** 2).sum().item()
        count += len(token_nll)
    mean = nll / count
    return math.exp(mean), n_chunks


def kvl_perplexity(kvl, gguf, text_path, n_ctx):
    out = subprocess.run([kvl, "perplexity", "-m", gguf, "-f", text_path, "-c", str(n_ctx),
                          "-t", "2"], capture_output=True, text=True, check=True).stdout
    last = out.strip().split("\n")[-1]
    m = re.fullmatch(r"perplexity: ([0-9.]+)", last)
    if not m:
        raise RuntimeError(f"kvl perplexity's last line is {last!r}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kvl", default="build/kvl")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--tokenizer", required=True, help="tokenizer.model")
    ap.add_argument("--heldout", required=True, help="the held-out text file")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("-n", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-perplexity", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sp = spm.SentencePieceProcessor(model_file=args.tokenizer)
    model, meta = model_from_gguf(args.gguf)
    print(f"{args.gguf}: step {meta.get('kvlattice.train.step')}, "
          f"tokens {meta.get('kvlattice.train.tokens')}")
    tok_ok, tokens = check_tokenizer(args.kvl, args.gguf, sp, args.heldout)
    greedy_ok = check_greedy(args.kvl, args.gguf, model, meta, sp, args.n)
    ppl_ok = True
    if not args.skip_perplexity:
        torch_ppl, n_chunks = torch_perplexity(model, tokens, args.ctx, sp.bos_id())
        kvl_ppl = kvl_perplexity(args.kvl, args.gguf, args.heldout, args.ctx)
        rel = abs(kvl_ppl - torch_ppl) / torch_ppl
        ppl_ok = rel <= 0.005
        print(f"held-out perplexity, n_ctx {args.ctx}, {n_chunks} chunks: PyTorch "
              f"{torch_ppl:.4f}, kvl {kvl_ppl:.4f} ({100 * rel:.3f}% apart)")
    ok = tok_ok and greedy_ok and ppl_ok
    print("all checks passed" if ok else "CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
