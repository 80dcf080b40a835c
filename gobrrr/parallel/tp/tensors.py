"""Whole tensors and norms from a tp() model's shards: `unshard`, `full_state`, `clip_grad_norm_`.

    clip_grad_norm_(model, 1.0)           # the global norm: sharded squares summed over tp, whole ones once
    full = full_state(model)              # {name: whole parameter} on every tp rank (export, tests)

`unshard` undoes a `Split`: rank r's part of each of the `chunks` fused pieces goes back to its
place, so a fused QKV returns as [q | k | v] with every rank's heads in order.
"""
from __future__ import annotations

import torch
from torch import nn

from gobrrr.comm import collectives as comm
from gobrrr.parallel.tp.layers import Split, TPError
from gobrrr.parallel.tp.ops import TPGroup
from gobrrr.parallel.tp.parallelize import tp_state

# ---------------------------------------------------------------- gradient clipping over both dimensions

@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float, eps: float = 1e-6) -> torch.Tensor:
    """Scale every gradient so that the global 2-norm is at most `max_norm`; return the norm before.

    The norm is over the whole (unsharded) model: squared norms of sharded parameters are summed over
    the tp ranks (one all-reduce of a scalar), replicated ones are counted once. Over dp the gradients
    are already averaged (ddp), so they are alike there. No host-device sync: the scale is applied on
    the device. Without tp() this is torch.nn.utils.clip_grad_norm_ (same formula).
    """
    state, sharded = tp_state(model), set()
    for m in model.modules():  # the module tp() was applied to, also inside a wrapper such as ddp
        if m.__dict__.get("_gobrrr_tp") is not None:
            sharded = {id(p) for n, p in m.named_parameters() if state.is_sharded(n)}
    params = list(model.parameters())
    shard = [p.grad for p in params if p.grad is not None and id(p) in sharded]
    whole = [p.grad for p in params if p.grad is not None and id(p) not in sharded]
    device = params[0].device

    def sq(gs):
        return torch.stack(torch._foreach_norm(gs)).float().pow(2).sum() if gs else torch.zeros((), device=device)

    sq_shard = sq(shard)
    if state is not None and state.tpg.size > 1:
        comm.all_reduce(sq_shard, "sum", group=state.tpg.group)
    total = (sq_shard + sq(whole)).sqrt()
    coef = (max_norm / (total + eps)).clamp(max=1.0)
    grads = shard + whole
    if grads:
        torch._foreach_mul_(grads, coef.to(grads[0].dtype))
    return total


# ---------------------------------------------------------------- whole tensors back (export, tests)

def unshard(local: torch.Tensor, split: Split, tpg: TPGroup) -> torch.Tensor:
    """The whole tensor from every tp rank's part (an all-gather; `local` itself when it is whole)."""
    if split.dim is None or tpg.size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(tpg.size)]
    comm.all_gather(parts, local.contiguous(), group=tpg.group)
    d, c = split.dim, split.chunks
    return torch.cat([p.unflatten(d, (c, p.shape[d] // c)) for p in parts], dim=d + 1).flatten(d, d + 1)


def full_state(model: nn.Module, grads: bool = False) -> dict[str, torch.Tensor]:
    """{name: whole parameter} (or whole gradient) of a tp() model, on every tp rank; names as before tp()."""
    state = tp_state(model)
    if state is None:
        raise TPError("full_state: the model was not given to tp(); its parameters are already whole")
    holder = next(m for m in model.modules() if m.__dict__.get("_gobrrr_tp") is state)
    out = {}
    for name, p in holder.named_parameters():
        t = p.grad if grads else p.detach()
        out[name] = None if t is None else unshard(t, state.splits[name], state.tpg)
    return out
