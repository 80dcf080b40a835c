"""Bytes each GPU's link carries per optimizer step, and the part of their time compute cannot hide.

`comm` lists every collective kind of a layout with its bus bytes (nccl-tests' convention), count,
group and what it can hide under; `exposed` turns one kind's time into the part left on the
critical path. formulas.py's `evaluate` adds compute and the optimizer step to make the step time.
"""
from __future__ import annotations

import math

from gobrrr.plan.inputs import PRECISIONS, Layout, ModelShape, Options


def comm(model: ModelShape, layout: Layout, b: int, s: int, accum: int, opt: Options
         ) -> dict[str, tuple[float, int, str, str]]:
    """{kind: (bus bytes per optimizer step on one GPU's link, collectives per step, group, hides under)}.

    Bus bytes follow nccl-tests' busbw convention: size x 2(n-1)/n for all-reduce, size x (n-1)/n for
    all-gather and reduce-scatter, so time = bus bytes / bus bandwidth. "hides under" is what compute
    can cover it: the last micro-step's backward, every micro-step's backward, the next block's compute
    (prefetch), or nothing (on the critical path).
    """
    p, g, _, _, c = PRECISIONS[opt.precision]
    n, t, L = layout.dp, layout.tp, model.n_layer
    psi = model.params_per_tp_rank(t)
    bucket = opt.bucket_mb * 2**20
    out: dict[str, tuple[float, int, str, str]] = {}
    if n > 1:
        ag, ar = (n - 1) / n, 2 * (n - 1) / n
        calls = max(1, math.ceil(g * psi / bucket))
        if layout.zero == 0:    # accumulate locally (no_sync), all-reduce once
            out["dp_all_reduce"] = (ar * g * psi, calls, "dp", "last_backward")
        elif layout.zero == 1:  # accumulate unsharded, reduce-scatter once
            out["zero_reduce_scatter"] = (ag * g * psi, calls, "dp", "last_backward")
        else:                   # stage 2-3: reduce-scatter every micro-step into the sharded gradient
            out["zero_reduce_scatter"] = (ag * g * psi * accum, calls * accum, "dp", "each_backward")
        if layout.zero in (1, 2):  # updated shards back to every rank, after the optimizer step
            out["zero_all_gather"] = (ag * p * psi, calls, "dp", "none")
        if layout.zero == 3:    # gathered before forward and again before backward, one block at a time
            out["zero3_all_gather"] = (2 * ag * p * psi * accum, 2 * (L + 1) * accum, "dp", "prefetch")
    if t > 1:
        ar = 2 * (t - 1) / t
        per_block = 4 + (2 if layout.recompute else 0)  # f and g, forward and backward; recompute repeats g
        act = c * s * b * model.n_embd
        sp = layout.sequence_parallel
        name = "tp_sp_reduce_scatter_all_gather" if sp else "tp_all_reduce"
        out[name] = (ar * act * per_block * L * accum, per_block * L * accum * (2 if sp else 1), "tp", "none")
        # vocab-parallel embedding (an fp32 sum forward) and the head's input gradient (backward), plus
        # the loss's max and sum-of-exponentials and target logit (s·b floats each)
        out["tp_vocab_parallel"] = (ar * (4 + c + 3 * 4 / model.n_embd) * s * b * model.n_embd * accum,
                                    5 * accum, "tp", "none")
    return out


def exposed(hides: str, t_comm: float, calls: int, accum: int, t_fwd: float, t_bwd: float,
             t_bucket: float) -> float:
    """The part of a kind's time over all micro-steps that compute cannot hide (module docstring)."""
    if hides == "last_backward":   # buckets launch during backward; the last one waits at the end
        return max(0.0, t_comm - t_bwd) + min(t_bucket, t_comm)
    per_micro = t_comm / accum
    if hides == "each_backward":
        return accum * (max(0.0, per_micro - t_bwd) + min(t_bucket, per_micro))
    if hides == "prefetch":        # the next block's gather under this block's compute; the first waits
        first = per_micro / max(1, calls // accum)
        return accum * (max(0.0, per_micro - (t_fwd + t_bwd)) + 2 * first)
    return t_comm
