"""The reference GPT: a decoder-only transformer the size of nanoGPT, in one file.

It knows nothing about parallelism, devices or precision: `gobrrr.parallel.ddp(model)`
and friends are applied to an unmodified instance, and `torch.autocast` decides the
dtype. The architecture is GPT-2's (Radford et al. 2019, "Language Models are
Unsupervised Multitask Learners"): learned position embeddings, pre-LayerNorm blocks,
GELU MLP with 4x expansion, weight tying between the token embedding and the output
head, and residual projections initialised with std 0.02 / sqrt(2 * n_layer).

Configs by name (`GPTConfig.from_name`):
    tiny   2 layers,  64 wide, 256-byte vocab   ~0.1M params, a few ms per step on CPU (tests)
    small  6 layers, 384 wide, 256-byte vocab   ~10.7M params (a char-level Shakespeare model)
    124m  12 layers, 768 wide, 50304 vocab      ~124M params, GPT-2 small (GPU benchmarks)

FLOPs per token (`flops_per_token`) follow Kaplan et al. 2020 and the PaLM paper's
appendix B (Chowdhery et al. 2022): 6 * N for the matmuls of forward + backward, plus
12 * n_layer * n_embd * seq_len for the attention scores and the weighted sum of values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model. `block_size` is the longest sequence it can read."""

    vocab_size: int = 256
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True

    @staticmethod
    def from_name(name: str, **overrides) -> "GPTConfig":
        """A named config ("tiny", "small", "124m"), with any field overridden by keyword."""
        try:
            base = _CONFIGS[name]
        except KeyError:
            raise ValueError(
                f"unknown GPT config {name!r}; choose one of: {', '.join(_CONFIGS)}"
            ) from None
        known = {f.name for f in fields(GPTConfig)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(
                f"unknown GPTConfig field(s) {sorted(unknown)}; valid fields: {sorted(known)}"
            )
        return replace(base, **overrides)

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                "pick a head count that divides the width"
            )


_CONFIGS = {
    "tiny": GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=64),
    "small": GPTConfig(vocab_size=256, block_size=256, n_layer=6, n_head=6, n_embd=384),
    # GPT-2 small; vocab 50257 padded to 50304 (a multiple of 128) so the head's matmul tiles evenly.
    "124m": GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
}


class CausalSelfAttention(nn.Module):
    """Multi-head attention where each position sees only itself and the past."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.proj.residual = True  # marks it for the scaled init in GPT._init_weights
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        H = self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.proj.residual = True
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))  # (B, T, C) -> (B, T, 4C) -> (B, T, C)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """`model(idx, targets=None) -> (logits, loss)`; idx is (B, T) int64 token ids.

    With `model.fused_loss` set (e.g. `gobrrr.ops.ChunkedCrossEntropy()`), a call with targets
    returns (None, loss) and never materializes the (B, T, V) logits.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying (Press & Wolf 2017): the head reads out through the embedding matrix.
        self.lm_head.weight = self.wte.weight
        # Optional `fn(x (N, C), head_weight (V, C), targets (N,)) -> mean loss` used instead of
        # lm_head + F.cross_entropy when targets are given; forward then returns (None, loss).
        self.fused_loss = None
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02
            if getattr(module, "residual", False):
                # GPT-2: scale the residual projections by 1/sqrt(number of residual adds).
                std = 0.02 / math.sqrt(2 * self.config.n_layer)
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape  # (B, T)
        if T > self.config.block_size:
            raise ValueError(
                f"sequence length {T} exceeds the model's block_size {self.config.block_size}; "
                "use a shorter --seq-len or a config with a larger block_size"
            )
        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        x = self.ln_f(x)  # (B, T, C)
        if targets is not None and self.fused_loss is not None:
            # the head and the loss in one op that never holds all (B, T, V) logits (gobrrr.ops.linear_ce)
            return None, self.fused_loss(x.view(B * T, -1), self.lm_head.weight, targets.view(B * T))
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            # Under bf16 autocast, cross_entropy runs in float32 (it is on autocast's fp32 list), so the
            # softmax over V keeps its range without a float32 copy of the (B, T, V) logits here.
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss

    def num_params(self, include_position: bool = True) -> int:
        """Parameter count (tied weights counted once); optionally without position embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if not include_position:
            n -= self.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token at `seq_len`: 6N + 12 * n_layer * n_embd * seq_len.

        N excludes the position embeddings (a lookup, not a matmul) but keeps the token
        embedding, whose tied matrix is the output head's matmul. The attention term
        counts the full T x T score matrix, as is customary for MFU, although a causal
        kernel skips about half of it.
        """
        cfg = self.config
        n = self.num_params(include_position=False)
        return 6.0 * n + 12.0 * cfg.n_layer * cfg.n_embd * seq_len
