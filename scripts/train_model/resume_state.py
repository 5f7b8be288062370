"""Resuming training from what git keeps, when the full checkpoint (outside the repo) is gone.

The committed GGUF holds the weights (F16; the norms F32) and the step it was exported at
(kvlattice.train.step). Beside it, models/<name>.train-state.npz holds Adam's second moment in
8 bits: sqrt(exp_avg_sq) per row as uint8 times a per-row scale. The second moment is what makes
a fresh Adam take over-large steps (it takes ~1/(1-beta2) steps to re-estimate); the first moment
re-forms within ~1/(1-beta1) = 10 steps and starts at zero. So a resume from these continues the
same schedule at the same step, with weights rounded to F16 and the gradient variance rounded to
8 bits: close to, not bit-equal with, the run it continues. About 12 MB for 12 M parameters,
where the full f32 optimizer state would be ~95 MB.
"""
import os

import numpy as np
import torch

from gguf_file import read_gguf


def state_path_for(gguf_path):
    return gguf_path[:-len(".gguf")] + ".train-state.npz"


# Our parameter names -> the GGUF's tensor names (see export_gguf.py).
def gguf_name(param_name):
    if param_name == "tok_embeddings.weight":
        return "token_embd.weight"
    if param_name == "norm.weight":
        return "output_norm.weight"
    if param_name == "output.weight":
        return "output.weight"
    parts = param_name.split(".")  # layers.{i}.{module}[.{sub}].weight
    i, rest = parts[1], ".".join(parts[2:])
    table = {"attn_norm.weight": "attn_norm", "ffn_norm.weight": "ffn_norm",
             "attn.wq.weight": "attn_q", "attn.wk.weight": "attn_k", "attn.wv.weight": "attn_v",
             "attn.wo.weight": "attn_output", "ffn.w_gate.weight": "ffn_gate",
             "ffn.w_up.weight": "ffn_up", "ffn.w_down.weight": "ffn_down"}
    return f"blk.{i}.{table[rest]}.weight"


def save_compact_state(optimizer, model, path):
    """Writes the 8-bit second moment of every parameter (by our parameter name)."""
    arrays = {}
    for name, p in model.named_parameters():
        v = optimizer.state[p]["exp_avg_sq"].float().sqrt().reshape(p.shape[0], -1)
        scale = v.max(dim=1).values.clamp(min=1e-30) / 255.0
        codes = torch.round(v / scale[:, None]).clamp(0, 255).to(torch.uint8)
        arrays[name + ".codes"] = codes.numpy()
        arrays[name + ".scale"] = scale.numpy().astype(np.float32)
    tmp = path + ".tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)


def load_weights_from_gguf(gguf_path, model):
    meta, tensors = read_gguf(gguf_path)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.array(tensors[gguf_name(name)], dtype=np.float32)))
    return meta


def load_resume(gguf_path, model, optimizer):
    """Loads weights (and, where present, the compact optimizer state); returns (step, tokens)."""
    meta = load_weights_from_gguf(gguf_path, model)
    step = int(meta["kvlattice.train.step"])
    tokens = int(meta["kvlattice.train.tokens"])
    state_path = state_path_for(gguf_path)
    if os.path.exists(state_path):
        arrays = np.load(state_path)
        for name, p in model.named_parameters():
            codes = torch.from_numpy(arrays[name + ".codes"]).float()
            scale = torch.from_numpy(arrays[name + ".scale"])
            v = (codes * scale[:, None]).reshape(p.shape) ** 2
            optimizer.state[p] = {"step": torch.tensor(float(step)),
                                  "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": v.contiguous()}
        print(f"optimizer second moment from {state_path}")
    else:
        print(f"no {state_path}: fresh optimizer state (the LR schedule's step is kept)")
    return step, tokens
