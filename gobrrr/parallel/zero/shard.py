"""Flat shards for ZeRO: how a group of parameters becomes one padded vector split over N ranks.

A `Flat` is the unit every ZeRO stage communicates: parameters of one optimizer param-group and
one dtype, concatenated in a fixed order and padded with zeros to a multiple of the world size N:

    flat (P = S * N elements):  [ w0 .......... | w1 ...... | w2 ... | 0 0 ]   <- padding (P - numel)
    shards (S each):            [ rank 0       ][ rank 1      ][ rank 2     ]

Rank r owns elements [r*S, (r+1)*S): it keeps the fp32 master weights and the optimizer state of
exactly those elements, receives their reduced gradient in a reduce-scatter, and sends its
updated elements to everyone in an all-gather. A parameter may straddle two shards; nothing
cares, because every optimizer we shard (SGD, Adam, AdamW) is elementwise. Padding elements
have gradient 0 and weight 0, so they stay 0 under AdamW and add nothing to a gradient norm.

This file holds the layout (`Flat`, `layout_ranges`), the three collectives every stage issues
(through gobrrr.comm.collectives, so failures name ranks), and the memory formulas
(`formula_bytes`). The stages themselves live in stages.py (1 and 2) and zero3.py (3), on base.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gobrrr.comm import collectives as comm

MB = 1e6  # reports are in decimal megabytes, as every byte figure gobrrr prints (bench copy's GB = 1e9)


# ---------------------------------------------------------------- collectives (through gobrrr.comm.collectives)
# gobrrr.comm.collectives numbers every collective per group, checks signatures across ranks in debug mode
# (GOBRRR_DIST_DEBUG=1: a rank at another stage or bucket layout is named before any data moves) and
# turns a dead peer into an error naming it. Each returns a handle with .wait(), or None at world size 1.

def all_gather_flat(full: torch.Tensor, shard: torch.Tensor, group, world: int, async_op: bool = True):
    """full (P,) <- [shard of rank 0 | shard of rank 1 | ...]; `shard` may be full's own slice (in place)."""
    if world == 1:
        if shard.data_ptr() != full.data_ptr():
            full.copy_(shard)
        return None
    return comm.all_gather(full, shard, group=group, async_op=async_op)


def reduce_scatter_flat(out: torch.Tensor, full: torch.Tensor, group, world: int, async_op: bool = True):
    """out (S,) <- sum over ranks of full (P,), this rank's chunk; a copy at world size 1."""
    if world == 1:
        out.copy_(full)
        return None
    return comm.reduce_scatter(out, full, op="sum", group=group, async_op=async_op)


def all_reduce_sum(t: torch.Tensor, group, world: int) -> None:
    """Sum `t` over ranks in place (blocking on gloo; stream-ordered on NCCL); a no-op at world size 1."""
    if world > 1:
        comm.all_reduce(t, op="sum", group=group)


# ---------------------------------------------------------------- layout

def shard_size(numel: int, world: int) -> int:
    """S = ceil(numel / N): every rank's shard has the same length, the last one padded."""
    return -(-numel // world)


@dataclass
class Flat:
    """One padded flat vector of parameters (one param-group, one dtype), sharded over the ranks.

    Which tensors exist depends on the stage (see stages.py's table); all are 1-D:
      full   (P,) compute dtype   stage 1-2: always; stage 3: only while gathered (storage resized to 0 otherwise)
      shard  (S,) compute dtype   this rank's slice: a view of `full` (stage 1-2) or its own tensor (stage 3)
      master (S,) master dtype    what the optimizer steps: `shard` itself when compute dtype == master dtype
      grad   (P,) compute dtype   stage 1 only: the full gradient buffer autograd accumulates into
      grad_shard (S,)             the averaged gradient of this rank's elements (reduce dtype, fp32 when accumulated)
    """
    index: int
    names: list[str]
    params: list[nn.Parameter]
    group: int                     # optimizer param-group index; -1 for frozen parameters
    world: int
    rank: int
    dtype: torch.dtype             # compute dtype (bf16 with param_dtype=torch.bfloat16)
    master_dtype: torch.dtype      # the parameters' own dtype (fp32): master weights and optimizer state
    offsets: list[int] = field(default_factory=list)
    numel: int = 0
    full: torch.Tensor | None = None
    shard: torch.Tensor | None = None
    master: torch.Tensor | None = None
    grad: torch.Tensor | None = None
    grad_views: list[torch.Tensor] = field(default_factory=list)  # stage 1: each parameter's view into `grad`
    grad_shard: torch.Tensor | None = None
    ready: list[bool] = field(default_factory=list)
    n_ready: int = 0
    work: Any = None               # in-flight collective (CPU path) and what must outlive it
    accumulated: int = 0           # reduce-scatters summed into grad_shard since the last zero_grad

    def __post_init__(self):
        self.offsets, off = [], 0
        for p in self.params:
            self.offsets.append(off)
            off += p.numel()
        self.numel = off
        self.ready = [False] * len(self.params)

    @property
    def trainable(self) -> bool:
        return self.group >= 0

    @property
    def S(self) -> int:
        return shard_size(self.numel, self.world)

    @property
    def P(self) -> int:
        return self.S * self.world

    @property
    def lo(self) -> int:
        return self.rank * self.S

    @property
    def mixed(self) -> bool:
        return self.dtype != self.master_dtype

    def flatten(self, tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """cat(tensors) as one (P,) vector of `dtype`, zero padded: one cat kernel (and one cast), not one copy each."""
        parts = [t.reshape(-1) for t in tensors]
        if self.P > self.numel:
            parts.append(torch.zeros(self.P - self.numel, dtype=tensors[0].dtype, device=tensors[0].device))
        out = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
        return out if out.dtype == dtype else out.to(dtype)

    def views(self, full: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's view into a (P,) vector, in the parameter's shape."""
        return [full[off:off + p.numel()].view(p.shape) for p, off in zip(self.params, self.offsets)]

    def owned_ranges(self, rank: int | None = None) -> list[tuple[int, int, int]]:
        """(param index, start, stop) in the flattened parameter, for the elements `rank` owns."""
        r = self.rank if rank is None else rank
        lo, hi = r * self.S, (r + 1) * self.S
        out = []
        for i, (p, off) in enumerate(zip(self.params, self.offsets)):
            a, b = max(lo, off), min(hi, off + p.numel())
            if a < b:
                out.append((i, a - off, b - off))
        return out

    def piece(self, shard: torch.Tensor, i: int, a: int, b: int) -> torch.Tensor:
        """Elements [a, b) of parameter i inside this rank's (S,) `shard` (a range from owned_ranges())."""
        off = self.offsets[i] - self.lo
        return shard[off + a:off + b]

    def reset_ready(self) -> None:
        self.ready = [False] * len(self.params)
        self.n_ready = 0


def group_index(optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """id(parameter) -> index of its optimizer param-group."""
    out: dict[int, int] = {}
    for g, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) in out:
                raise ValueError("zero: a parameter appears in two optimizer param groups; give each parameter "
                                 "one group.")
            out[id(p)] = g
    return out


def check_optimizer_covers(module: nn.Module, groups: dict[int, int]) -> None:
    missing = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in groups]
    if missing:
        raise ValueError(f"zero: parameters {missing[:4]} require grad but are in no optimizer param group; "
                         "build the optimizer over all trainable parameters, or set requires_grad=False on them.")


# ---------------------------------------------------------------- memory formulas

def formula_bytes(stage: int, psi: int, world: int, mixed: bool, state_bytes: int = 8,
                  unsharded_grads: bool = False) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer state predicted for `stage` (0 = plain DP).

    mixed: bf16 parameters and gradients (2 bytes each), fp32 master weights + optimizer state
    (4 + `state_bytes`, K = 12 for Adam). fp32 only: parameters and gradients 4 bytes each and
    the parameters themselves are the master weights (K = 8 for Adam), so

        stage        mixed (K = 12)         fp32 only (K = 8)
        plain DP     16 psi                 16 psi
        1            4 psi + 12 psi / N     8 psi + 8 psi / N
        2            2 psi + 14 psi / N     4 psi + 12 psi / N
        3            16 psi / N             16 psi / N
    """
    N = world
    p_b, g_b = (2, 2) if mixed else (4, 4)
    opt_b = (4 + state_bytes) if mixed else state_bytes
    params = p_b * psi / N if stage == 3 else p_b * psi
    grads = g_b * psi if stage <= 1 or unsharded_grads else g_b * psi / N
    opt = opt_b * psi if stage == 0 else opt_b * psi / N
    return {"params": params, "grads": grads, "optimizer": opt, "total": params + grads + opt}


def nbytes(t: torch.Tensor | None) -> int:
    """Bytes a tensor's storage holds right now (0 for None or a storage resized to 0)."""
    if t is None:
        return 0
    return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())


@dataclass
class MemoryReport:
    """Bytes held by this rank, next to the stage's formula (`formula_bytes`)."""
    stage: int
    rank: int
    world: int
    psi: int                     # trainable elements, padded to the shards (what the formula counts)
    mixed: bool
    held: dict[str, int]         # params, grads, optimizer, total
    formula: dict[str, float]
    frozen: int = 0              # bytes of frozen parameters (outside the formula)
    peak_cuda: int | None = None

    def lines(self) -> list[str]:
        out = [f"zero stage {self.stage}, rank {self.rank} of {self.world}, psi = {self.psi:,} trainable elements"
               f" ({'bf16 compute + fp32 master' if self.mixed else 'one dtype'}); MB = 1e6 bytes"]
        for k in ("params", "grads", "optimizer", "total"):
            out.append(f"  {k:<10} held {self.held[k] / MB:10.2f} MB   formula {self.formula[k] / MB:10.2f} MB")
        if self.frozen:
            out.append(f"  frozen     held {self.frozen / MB:10.2f} MB")
        if self.peak_cuda is not None:
            out.append(f"  peak allocated on the GPU {self.peak_cuda / MB:.2f} MB (activations included)")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())
