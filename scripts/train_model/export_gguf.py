#!/usr/bin/python3
"""Writes a training checkpoint as a GGUF of arch "llama" (F16 matrices, F32 norms) with the
SentencePiece tokenizer, in the metadata llama.cpp and kvl read.

Tensor names are llama.cpp's. PyTorch's nn.Linear weight is [out][in] row-major, which is ggml's
ne = (in, out): the bytes go in unchanged. q/k rows need no permutation because model.py rotates
interleaved pairs as ggml does for arch llama. There is no output.weight: the head is tied to the
token embedding, which llama.cpp and kvl fall back to.
"""
import argparse
import os
import sys

import numpy as np
import sentencepiece as spm
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_file import GgufWriter  # noqa: E402
from model import Config, Llama  # noqa: E402
from resume_state import save_compact_state  # noqa: E402
from train import make_optimizer  # noqa: E402

# SentencePiece piece kinds -> llama.cpp token types.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 5, 6


def tokenizer_metadata(writer, sp):
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(TOKEN_UNKNOWN)
        elif sp.is_control(i):
            types.append(TOKEN_CONTROL)
        elif sp.is_byte(i):
            types.append(TOKEN_BYTE)
        elif sp.is_unused(i):
            types.append(TOKEN_UNUSED)
        else:
            types.append(TOKEN_NORMAL)
    writer.add_string("tokenizer.ggml.model", "llama")
    writer.add_string("tokenizer.ggml.pre", "default")
    writer.add_string_array("tokenizer.ggml.tokens", tokens)
    writer.add_float32_array("tokenizer.ggml.scores", scores)
    writer.add_int32_array("tokenizer.ggml.token_type", types)
    writer.add_uint32("tokenizer.ggml.bos_token_id", sp.bos_id())
    writer.add_uint32("tokenizer.ggml.eos_token_id", sp.eos_id())
    writer.add_uint32("tokenizer.ggml.unknown_token_id", sp.unk_id())
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_bool("tokenizer.ggml.add_eos_token", False)
    writer.add_bool("tokenizer.ggml.add_space_prefix", True)


def export(state, sp, out_path, name):
    cfg = Config(**state["config"])
    weights = state["model"]
    w = GgufWriter()
    w.add_string("general.architecture", "llama")
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", 1)  # mostly F16
    w.add_uint32("general.alignment", 32)
    w.add_uint32("llama.vocab_size", cfg.vocab_size)
    w.add_uint32("llama.context_length", cfg.context)
    w.add_uint32("llama.embedding_length", cfg.dim)
    w.add_uint32("llama.block_count", cfg.n_layers)
    w.add_uint32("llama.feed_forward_length", cfg.ffn_dim)
    w.add_uint32("llama.attention.head_count", cfg.n_heads)
    w.add_uint32("llama.attention.head_count_kv", cfg.n_kv_heads)
    w.add_uint32("llama.rope.dimension_count", cfg.head_dim)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", cfg.norm_eps)
    w.add_float32("llama.rope.freq_base", cfg.rope_theta)
    # How far training got, so a resume from this file knows its step (see resume_state.py).
    w.add_uint32("kvlattice.train.step", state["step"])
    w.add_string("kvlattice.train.tokens", str(state["tokens_seen"]))
    tokenizer_metadata(w, sp)

    def f16(key):
        return weights[key].float().numpy().astype(np.float16)

    def f32(key):
        return weights[key].float().numpy().astype(np.float32)

    w.add_tensor("token_embd.weight", f16("tok_embeddings.weight"))
    for i in range(cfg.n_layers):
        p, b = f"layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", f32(p + "attn_norm.weight"))
        w.add_tensor(b + "attn_q.weight", f16(p + "attn.wq.weight"))
        w.add_tensor(b + "attn_k.weight", f16(p + "attn.wk.weight"))
        w.add_tensor(b + "attn_v.weight", f16(p + "attn.wv.weight"))
        w.add_tensor(b + "attn_output.weight", f16(p + "attn.wo.weight"))
        w.add_tensor(b + "ffn_norm.weight", f32(p + "ffn_norm.weight"))
        w.add_tensor(b + "ffn_gate.weight", f16(p + "ffn.w_gate.weight"))
        w.add_tensor(b + "ffn_up.weight", f16(p + "ffn.w_up.weight"))
        w.add_tensor(b + "ffn_down.weight", f16(p + "ffn.w_down.weight"))
    w.add_tensor("output_norm.weight", f32("norm.weight"))
    tmp = out_path + ".tmp"
    w.write(tmp)
    os.replace(tmp, out_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--tokenizer", required=True, help="tokenizer.model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--train-state", help="also write the compact resume state (resume_state.py)")
    args = ap.parse_args()
    state = torch.load(args.ckpt)
    sp = spm.SentencePieceProcessor(model_file=args.tokenizer)
    export(state, sp, args.out, args.name)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB) at step {state['step']}")
    if args.train_state:
        cfg = Config(**state["config"])
        model = Llama(cfg)
        model.load_state_dict(state["model"])
        optimizer = make_optimizer(model, argparse.Namespace(**state["args"]))
        optimizer.load_state_dict(state["optimizer"])
        save_compact_state(optimizer, model, args.train_state)
        print(f"wrote {args.train_state} ({os.path.getsize(args.train_state) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
