"""The communication of tensor parallelism, as small autograd Functions (Megatron's f and g and friends).

Megatron-style tensor parallelism (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion
Parameter Language Models Using Model Parallelism") splits a block's first linear by output
features (column-parallel) and its second by input features (row-parallel). Between them each
rank works on its own heads / hidden units with no communication at all; the operators in this
file are all the communication there is. Sequence parallelism (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models") swaps each all-reduce for an
all-gather and a reduce-scatter along the sequence, which move the same bytes, so that the
LayerNorms and dropouts between the blocks also work on 1/n of the tokens.

Notation: n = tp ranks (r0, r1 drawn), activations (B, T, C), one rank's full activation is
S = B*T*C*bytes. "Moves" is what one rank sends (= receives) with a ring algorithm.

  f  copy_to_tp        forward: identity          backward: all-reduce(sum)
  g  reduce_from_tp    forward: all-reduce(sum)   backward: identity
     gather_seq        forward: all-gather (T)    backward: reduce-scatter (T)   (SP's f)
     scatter_seq       forward: reduce-scatter(T) backward: all-gather (T)       (SP's g)
     vocab_parallel_embedding       masked lookup of this rank's V/n rows, then g (or scatter_seq)
     vocab_parallel_cross_entropy   loss from (N, V/n) logits; one all-gather of 2N floats

At n = 1 every collective is skipped (the functions return their input), so tp = 1 runs the same
model code with no communication and no autograd node of ours; with nothing to mask or reduce, the
embedding is a plain lookup (and layers.py's row-parallel bias rides in the GEMM, as in nn.Linear).
None of these reads a value on the host: no host-device sync anywhere.

Collectives go through `gobrrr.comm.collectives`, so debug mode (GOBRRR_DIST_DEBUG=1) checks that every tp
rank issues the same op with the same shapes, and a failure names the op and the missing ranks.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd import Function

from gobrrr.comm import collectives as comm


@dataclass(frozen=True)
class TPGroup:
    """The tensor-parallel process group with its size and this rank's place, read once (not per op)."""
    group: Any          # a torch ProcessGroup (None: the default group)
    size: int
    rank: int

    @staticmethod
    def of(group) -> "TPGroup":
        if not (dist.is_available() and dist.is_initialized()):
            return TPGroup(None, 1, 0)
        return TPGroup(group, dist.get_world_size(group), dist.get_rank(group))


def _all_reduce(t: torch.Tensor, tpg: TPGroup) -> torch.Tensor:
    comm.all_reduce(t, "sum", group=tpg.group)
    return t


# ---------------------------------------------------------------- f and g (Shoeybi et al. 2019, section 3)

class _CopyToTP(Function):
    """f: before a column-parallel linear. Each rank's input is the whole activation.

        forward (identity)                backward (all-reduce of dL/dx)
        r0: X   -> X                      r0: dX0 \\
        r1: X   -> X                      r1: dX1  >-- sum --> dX0+dX1 on both
                                          (each rank's dX covers only its own heads/hidden units)
    Moves: nothing forward; 2(n-1)/n * S backward.
    """

    @staticmethod
    def forward(ctx, x, tpg):
        ctx.tpg = tpg
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # a fresh contiguous copy: autograd may hand the same gradient tensor to another branch
        return _all_reduce(grad.contiguous().clone(), ctx.tpg), None


class _ReduceFromTP(Function):
    """g: after a row-parallel linear. Each rank holds a partial sum over its slice of the input.

        forward (all-reduce)              backward (identity)
        r0: Y0  \\                         r0: dY -> dY
        r1: Y1   >-- sum --> Y0+Y1        r1: dY -> dY
    Moves: 2(n-1)/n * S forward; nothing backward.
    """

    @staticmethod
    def forward(ctx, y, tpg):
        if not y.is_contiguous():
            return _all_reduce(y.contiguous(), tpg)
        ctx.mark_dirty(y)  # reduced in place: y is a fresh matmul output that no backward reads
        return _all_reduce(y, tpg)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, tpg: TPGroup) -> torch.Tensor:
    """f: identity forward, all-reduce backward (a no-op at n = 1)."""
    return x if tpg.size == 1 else _CopyToTP.apply(x, tpg)


def reduce_from_tp(y: torch.Tensor, tpg: TPGroup) -> torch.Tensor:
    """g: all-reduce forward, identity backward (a no-op at n = 1)."""
    return y if tpg.size == 1 else _ReduceFromTP.apply(y, tpg)


# ---------------------------------------------------------------- the sequence-parallel pair (Korthikanti et al. 2022)

def _check_seq(t: torch.Tensor, dim: int, n: int, what: str) -> None:
    if t.shape[dim] % n:
        raise ValueError(f"sequence parallel {what}: the sequence length {t.shape[dim]} (dim {dim} of shape "
                         f"{tuple(t.shape)}) is not divisible by tp={n}; use a sequence length that is a "
                         f"multiple of {n}, or tp(..., sequence_parallel=False)")


def _gather(x: torch.Tensor, tpg: TPGroup, dim: int) -> torch.Tensor:
    """(B, T/n, C) -> (B, T, C): rank r's rows land at [r*T/n, (r+1)*T/n)."""
    xt = x.movedim(dim, 0).contiguous()                             # (T/n, B, C): one contiguous chunk
    out = xt.new_empty((tpg.size * xt.shape[0], *xt.shape[1:]))     # (T, B, C)
    comm.all_gather(out, xt, group=tpg.group)
    return out.movedim(0, dim).contiguous()                         # (B, T, C)


def _scatter(x: torch.Tensor, tpg: TPGroup, dim: int) -> torch.Tensor:
    """(B, T, C) partial sums -> (B, T/n, C): the sum over ranks of this rank's rows."""
    _check_seq(x, dim, tpg.size, "reduce-scatter")
    xt = x.movedim(dim, 0).contiguous()                             # (T, B, C): rank chunks contiguous
    out = xt.new_empty((xt.shape[0] // tpg.size, *xt.shape[1:]))    # (T/n, B, C)
    comm.reduce_scatter(out, xt, "sum", group=tpg.group)
    return out.movedim(0, dim).contiguous()                         # (B, T/n, C)


class _GatherSeq(Function):
    """SP's f: tokens sharded along T become whole before a column-parallel linear.

        forward (all-gather along T)          backward (reduce-scatter along T)
        r0: X[0:T/2]   --> X[0:T] on both     r0: dX0[0:T] \\ sum, keep own rows: r0 gets (dX0+dX1)[0:T/2]
        r1: X[T/2:T]                          r1: dX1[0:T] /                    r1 gets (dX0+dX1)[T/2:T]
    Moves: (n-1)/n * S each way: together the bytes of f's all-reduce, split over the two passes.
    """

    @staticmethod
    def forward(ctx, x, tpg, dim):
        ctx.tpg, ctx.dim = tpg, dim
        return _gather(x, tpg, dim)

    @staticmethod
    def backward(ctx, grad):
        return _scatter(grad, ctx.tpg, ctx.dim), None, None


class _ScatterSeq(Function):
    """SP's g: partial sums after a row-parallel linear are reduced and left sharded along T.

        forward (reduce-scatter along T)       backward (all-gather along T)
        r0: Y0[0:T] \\ sum, r0 keeps [0:T/2]    r0: dY[0:T/2] --> dY[0:T] on both
        r1: Y1[0:T] /       r1 keeps [T/2:T]   r1: dY[T/2:T]
    Moves: (n-1)/n * S each way.
    """

    @staticmethod
    def forward(ctx, y, tpg, dim):
        ctx.tpg, ctx.dim = tpg, dim
        return _scatter(y, tpg, dim)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.tpg, ctx.dim), None, None


def gather_seq(x: torch.Tensor, tpg: TPGroup, dim: int = 1) -> torch.Tensor:
    """All-gather along the sequence forward, reduce-scatter backward (identity at n = 1)."""
    return x if tpg.size == 1 else _GatherSeq.apply(x, tpg, dim)


def scatter_seq(y: torch.Tensor, tpg: TPGroup, dim: int = 1) -> torch.Tensor:
    """Reduce-scatter along the sequence forward, all-gather backward (identity at n = 1)."""
    return y if tpg.size == 1 else _ScatterSeq.apply(y, tpg, dim)


def seq_chunk(x: torch.Tensor, tpg: TPGroup, dim: int) -> torch.Tensor:
    """This rank's slice of a replicated tensor along the sequence (a view; autograd slices the gradient)."""
    if tpg.size == 1:
        return x
    _check_seq(x, dim, tpg.size, "split")
    step = x.shape[dim] // tpg.size
    return x.narrow(dim, tpg.rank * step, step)


# ---------------------------------------------------------------- vocab-parallel embedding

def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, vocab_start: int, tpg: TPGroup,
                             sequence_parallel: bool = False) -> torch.Tensor:
    """Embedding whose rows are split over ranks: rank r holds ids [r*V/n, (r+1)*V/n).

        ids (B, T), the same on every rank
        r0: W[0:V/2]   looks up the ids it holds, zeros for the others  -> E0 (B, T, C)
        r1: W[V/2:V]   ...                                              -> E1 (B, T, C)
        then g: E0 + E1 = the embedding on every rank (or, with SP, a reduce-scatter along T:
        rank r keeps (E0 + E1)[:, r*T/n:(r+1)*T/n]).
    Moves: one all-reduce of S (or one reduce-scatter) forward; nothing backward, since every
    rank's rows get their gradient from the full-sequence dL/dE.
    """
    if tpg.size == 1:  # one rank holds every row: nothing to mask, nothing to reduce
        return F.embedding(ids, weight)                        # (B, T, C)
    local = ids - vocab_start                                  # (B, T)
    inside = (local >= 0) & (local < weight.shape[0])          # (B, T) bool, never read on the host
    e = F.embedding(local.clamp(0, weight.shape[0] - 1), weight)  # (B, T, C)
    e = e * inside.unsqueeze(-1).to(e.dtype)                   # ids another rank holds contribute 0
    return scatter_seq(e, tpg, 1) if sequence_parallel else reduce_from_tp(e, tpg)


# ---------------------------------------------------------------- vocab-parallel cross-entropy

def _ce_grad(ls: torch.Tensor, local: torch.Tensor, inside: torch.Tensor, scale: torch.Tensor,
             dtype: torch.dtype) -> torch.Tensor:
    """d loss / d logits = (softmax - onehot) * scale, one pass over (N, V/n), in the logits' dtype.

    ls (N, V/n) fp32: log of my columns of the softmax; local (N,) my column of the target (valid
    where `inside`); scale (N,) the incoming gradient, zero on ignored rows.
    """
    cols = torch.arange(ls.shape[1], device=ls.device)                       # (V/n,)
    onehot = (cols[None, :] == local[:, None]) & inside[:, None]            # (N, V/n) bool, never stored
    return ((ls.exp() - onehot.to(ls.dtype)) * scale[:, None]).to(dtype)    # (N, V/n)


def _ce_log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-softmax of (N, V/n) logits in any float dtype."""
    return F.log_softmax(logits.float(), dim=-1)                             # (N, V/n) fp32


@functools.lru_cache(maxsize=None)
def _ce_kernels(device_type: str):
    """(`_ce_log_softmax`, `_ce_grad`), each one fused kernel where triton can make one (a CUDA GPU).

    Eager, the log-softmax of bf16 logits first writes an fp32 copy of them (ATen fuses the upcast
    for fp16 only) and the gradient takes three passes (exp, the subtraction, the scale and cast);
    compiled, each reads its input once and writes its output once.
    """
    if device_type == "cuda" and importlib.util.find_spec("triton") is not None:
        return torch.compile(_ce_log_softmax, dynamic=False), torch.compile(_ce_grad, dynamic=False)
    return _ce_log_softmax, _ce_grad


class _VocabParallelCE(Function):
    """Per-token loss -log softmax(z)[t] from logits split by vocabulary, never gathering (N, V).

        r0: z[:, 0:V/2]   ls0 = log_softmax(z0) (my columns), lse0 = z0[:,0] - ls0[:,0], p0 = z0[t] or 0
        r1: z[:, V/2:V]   ls1, lse1, p1                                                  (N,) each
        all-gather the (2, N) stats -> lse = logsumexp(lse0, lse1), p = p0 + p1, loss = lse - p
        ls_r += lse_r - lse: now log of *my columns of the global* softmax (saved for backward)
        backward, locally: dz_r = (exp(ls_r) - onehot_r(t)) * dloss
    Moves: (n-1) * 2N * 4 bytes forward (one all-gather; Megatron uses two all-reduces, a max and a
    sum); nothing backward. At n = 1 it is F.cross_entropy's own arithmetic: loss = -log_softmax(z)[t].

    Memory traffic over (N, V/n), the reason for this shape: forward one fused log-softmax that
    reads the bf16 logits and writes fp32 (autocast is off inside, so it makes no fp32 copy of the
    logits first), backward one fused pass that reads it and writes the gradient in the logits'
    dtype (`_ce_kernels`: compiled on a GPU). It saves what F.cross_entropy saves: the fp32 log-softmax.
    """

    @staticmethod
    def forward(ctx, logits, target, vocab_start, tpg, ignore_index):
        with torch.autocast(logits.device.type, enabled=False):  # no fp32 copy of the logits from autocast
            ls = _ce_kernels(logits.device.type)[0](logits)      # (N, V/n) fp32
        vl = ls.shape[-1]
        local = target - vocab_start                            # (N,)
        inside = (local >= 0) & (local < vl)
        local = local.clamp(0, vl - 1)
        if tpg.size == 1:
            loss = -ls.gather(1, local.unsqueeze(1)).squeeze(1)
        else:
            lse_mine = logits[:, 0].float() - ls[:, 0]          # (N,) logsumexp of my columns
            pred = logits.gather(1, local.unsqueeze(1)).squeeze(1).float() * inside
            stats = torch.stack([lse_mine, pred])               # (2, N)
            every = stats.new_empty((tpg.size * 2, stats.shape[1]))  # (n*2, N): ranks' stats stacked
            comm.all_gather(every, stats, group=tpg.group)
            every = every.view(tpg.size, 2, -1)                 # (n, 2, N)
            lse = torch.logsumexp(every[:, 0], dim=0)
            loss = lse - every[:, 1].sum(0)
            ls.add_((lse_mine - lse).unsqueeze(1))              # log of my columns of the global softmax
        valid = target != ignore_index                          # (N,)
        ctx.dtype = logits.dtype
        ctx.save_for_backward(ls, local, inside, valid)
        return loss * valid                                     # (N,)

    @staticmethod
    def backward(ctx, grad):
        ls, local, inside, valid = ctx.saved_tensors
        scale = (grad * valid).to(ls.dtype)                     # (N,)
        dz = _ce_kernels(ls.device.type)[1](ls, local, inside, scale, ctx.dtype)  # (N, V/n)
        return dz, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int, tpg: TPGroup,
                                 ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """F.cross_entropy over logits (..., V/n) that hold vocabulary [vocab_start, vocab_start + V/n).

    reduction "mean" divides by the number of targets != ignore_index (as F.cross_entropy does);
    "sum" and "none" as there. The result is the same on every tp rank.
    """
    z = logits.reshape(-1, logits.shape[-1])                  # (N, V/n)
    t = target.reshape(-1)                                    # (N,)
    loss = _VocabParallelCE.apply(z, t, vocab_start, tpg, ignore_index)  # (N,)
    if reduction == "none":
        return loss.view(target.shape)
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / (t != ignore_index).sum()
    raise ValueError(f"vocab_parallel_cross_entropy: unknown reduction {reduction!r}; use 'mean', 'sum' or 'none'")
