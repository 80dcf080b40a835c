"""What a plan is asked about: the model's shape, the layout, the batch and the options.

`ModelShape` is a reference-GPT-shaped model (PRESETS: 124m to 70b); `PRECISIONS` the bytes per
parameter of (parameters, gradients, optimizer state) and of the residual stream and compute dtype;
`Layout` one way to split the model over GPUs (dp x tp, ZeRO stage, recompute, SP); `Batch` the
micro-batch, sequence length and global batch; `Options` the precision, attention, loss and headroom.
Byte figures are decimal: GB = 1e9 bytes (as `gobrrr bench copy`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9  # decimal gigabytes, everywhere gobrrr prints bytes


# ---------------------------------------------------------------- the model's shape

@dataclass(frozen=True)
class ModelShape:
    """A reference-GPT-shaped model (gobrrr/models/gpt.py): learned positions, pre-LN blocks with biases,
    multi-head attention, GELU MLP of 4x width, the head tied to the token embedding."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    seq_len: int  # the block size (longest sequence), and the default training length

    def __post_init__(self):
        for f in ("n_layer", "n_embd", "n_head", "vocab_size", "seq_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"model {f} must be >= 1, got {getattr(self, f)}; give a positive size")
        if self.n_embd % self.n_head:
            raise ValueError(f"width {self.n_embd} is not divisible by {self.n_head} heads; "
                             "pick a head count that divides the width")

    def block_params(self) -> int:
        """One block: qkv 3h^2 + 3h, proj h^2 + h, fc 4h^2 + 4h, proj 4h^2 + h, two LayerNorms 4h."""
        h = self.n_embd
        return 12 * h * h + 13 * h

    def params(self) -> int:
        """Ψ of the whole model: V h + T h + L (12 h^2 + 13 h) + 2 h (the head is tied: counted once)."""
        h = self.n_embd
        return self.vocab_size * h + self.seq_len * h + self.n_layer * self.block_params() + 2 * h

    def params_per_tp_rank(self, tp: int) -> int:
        """Ψ one tensor-parallel rank holds: the block matrices and column-parallel biases (qkv 3h, fc 4h)
        split tp ways, the vocabulary split tp ways (vocab-parallel embedding = the tied head, padded to a
        multiple of tp); row-parallel biases (2h), LayerNorms (4h per block + 2h) and positions replicated."""
        h, L = self.n_embd, self.n_layer
        block = (12 * h * h + 7 * h) // tp + 6 * h
        return math.ceil(self.vocab_size / tp) * h + self.seq_len * h + L * block + 2 * h

    def cast_params_per_tp_rank(self, tp: int) -> int:
        """Parameters autocast copies to bf16 (the inputs of matmuls: linear weights and biases, and the
        tied head); LayerNorm weights and the position table are not cast."""
        h, L = self.n_embd, self.n_layer
        return math.ceil(self.vocab_size / tp) * h + L * ((12 * h * h + 7 * h) // tp + 2 * h)

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token, as `GPT.flops_per_token`: 6 N (N without positions) + 12 L h T."""
        T = seq_len or self.seq_len
        n = self.params() - self.seq_len * self.n_embd
        return 6.0 * n + 12.0 * self.n_layer * self.n_embd * T

    def gpt_config(self):
        """The reference GPT's config of this shape (for building it, e.g. on the meta device)."""
        from gobrrr.models.gpt import GPTConfig

        return GPTConfig(vocab_size=self.vocab_size, block_size=self.seq_len, n_layer=self.n_layer,
                         n_head=self.n_head, n_embd=self.n_embd, dropout=0.0, bias=True)


# GPT-2 shapes up to 1.5b (vocab 50257 padded to 50304, as the reference GPT's 124m). 7b/13b/70b take
# the depth, width and head count of the common 32/40/80-layer, 4096/5120/8192-wide models (LLaMA's
# 32k vocabulary and 4096 context) but stay GPT-shaped: multi-head attention (no GQA), a GELU MLP of
# 4h (no SwiGLU of ~8h/3 x 3 matrices), LayerNorm with biases, learned positions, a tied head. So
# "70b" here has 64.7e9 parameters, not LLaMA-2-70B's 69e9; the formulas are the reference GPT's.
PRESETS: dict[str, ModelShape] = {
    "124m": ModelShape("124m", 12, 768, 12, 50304, 1024),
    "350m": ModelShape("350m", 24, 1024, 16, 50304, 1024),
    "1.5b": ModelShape("1.5b", 48, 1600, 25, 50304, 1024),
    "7b": ModelShape("7b", 32, 4096, 32, 32000, 4096),
    "13b": ModelShape("13b", 40, 5120, 40, 32000, 4096),
    "70b": ModelShape("70b", 80, 8192, 64, 32000, 4096),
}

# bytes per parameter of (parameters, gradients, optimizer state), residual stream, compute dtype
PRECISIONS: dict[str, tuple[int, int, int, int, int]] = {
    "fp32": (4, 4, 8, 4, 4),
    "amp": (4, 4, 8, 4, 2),
    "amp-res16": (4, 4, 8, 2, 2),
    "bf16": (2, 2, 12, 2, 2),
}


# ---------------------------------------------------------------- the layout, the batch, the options

LOSSES = ("train", "full", "chunked")


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    zero: int = 0                    # 0 = plain data parallelism (all-reduce), 1-3 = ZeRO stage
    recompute: bool = False          # full activation recomputation, one checkpoint per block
    sequence_parallel: bool = False  # Korthikanti et al. 2022; only with tp > 1


@dataclass(frozen=True)
class Batch:
    micro: int                 # sequences per GPU per micro-step (b)
    seq_len: int               # tokens per sequence (s)
    global_batch: int | None = None  # sequences per optimizer step; None = micro x GPUs, so a layout
                                     # with tp > 1 accumulates tp micro-steps and all see one batch


@dataclass(frozen=True)
class Options:
    precision: str = "bf16"
    attention: str = "flash"   # flash: no s x s scores kept; eager: Korthikanti's 5 a s^2 b
    loss: str = "train"        # train: what `gobrrr train` runs (`loss_at`); full: F.cross_entropy on (B, T, V/tp)
                               # logits; chunked: gobrrr.ops.linear_cross_entropy
    bucket_mb: float = 25.0    # gradient bucket size in MiB (gobrrr.parallel.ddp's default and unit)
    headroom: float = 0.10     # fraction of GPU memory kept free: CUDA context, allocator fragmentation

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        if self.attention not in ("flash", "eager"):
            raise ValueError(f"unknown attention {self.attention!r}; choose flash or eager")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; choose one of {', '.join(LOSSES)}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom {self.headroom} must be in [0, 1)")

    def loss_at(self, tp: int) -> str:
        """The loss a layout of this tp degree runs: "train" is `gobrrr train`'s choice, the chunked loss
        at tp 1 and, at tp > 1 (where the chunked loss would need lm_head's whole weight), F.cross_entropy
        run vocab-parallel on (B, T, V/tp) logits, which the "full" formula counts."""
        if self.loss != "train":
            return self.loss
        return "chunked" if tp == 1 else "full"
