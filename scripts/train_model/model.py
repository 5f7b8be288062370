"""The Llama architecture in PyTorch, written to match what llama.cpp (and kvl) run for a GGUF of
arch "llama", so the trained weights go into the GGUF as they are, with no permutation:

- RMSNorm before attention and FFN, and before the output head (eps 1e-5).
- RoPE in the GGUF/ggml "normal" convention for arch llama: within each head, the pairs
  (x[2i], x[2i+1]) rotate by pos * theta_base^(-2i/head_dim). (Hugging Face checkpoints rotate
  (x[i], x[i+half]) instead, which is why llama.cpp's converter permutes their q/k rows; we train in
  the GGUF convention directly.)
- Grouped-query attention: query head h reads KV head h // (n_heads / n_kv_heads), as ggml does.
- SwiGLU FFN: down(silu(gate(x)) * up(x)).
- The output head shares the token embedding (the GGUF has no output.weight; llama.cpp and kvl then
  use token_embd.weight), unless Config.tie_embeddings is off.
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Config:
    vocab_size: int = 6144
    dim: int = 384
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 2
    ffn_dim: int = 1024
    context: int = 1024
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # The trained model ties its output head to the embedding; untied reads other GGUFs
    # (stories260K) for reference figures.
    tie_embeddings: bool = True

    @property
    def head_dim(self):
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg, length, device=None):
    """cos/sin [length, head_dim/2] for positions 0..length-1, computed as ggml does: the frequency
    of pair i is theta_base^(-2i/head_dim)."""
    half = cfg.head_dim // 2
    inv_freq = cfg.rope_theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / cfg.head_dim)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x, cos, sin):
    """x [B, T, H, D]; rotates the interleaved pairs (x[2i], x[2i+1])."""
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x, cos, sin, mask):
        cfg = self.cfg
        B, T, _ = x.shape
        hd = cfg.head_dim
        q = apply_rope(self.wq(x).view(B, T, cfg.n_heads, hd), cos, sin)
        k = apply_rope(self.wk(x).view(B, T, cfg.n_kv_heads, hd), cos, sin)
        v = self.wv(x).view(B, T, cfg.n_kv_heads, hd)
        group = cfg.n_heads // cfg.n_kv_heads
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)) + mask
        out = F.softmax(scores.float(), dim=-1).type_as(q) @ v
        return self.wo(out.transpose(1, 2).reshape(B, T, cfg.n_heads * hd))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w_gate = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg, cfg.context)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        # Residual-branch outputs start smaller, as GPT-2 and llama2.c do, so deep sums stay O(1).
        for name, p in self.named_parameters():
            if name.endswith("wo.weight") or name.endswith("w_down.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens):
        """tokens [B, T] -> logits [B, T, vocab]."""
        T = tokens.shape[1]
        x = self.tok_embeddings(tokens)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        mask = torch.full((T, T), float("-inf"), device=tokens.device).triu(1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        head = self.tok_embeddings.weight if self.cfg.tie_embeddings else self.output.weight
        return self.norm(x) @ head.t()
