"""The optimizer a ZeRO user steps: the user's own optimizer, pointed at this rank's master shards.

    model, opt = zero(model, lambda m: torch.optim.AdamW(m.parameters()), stage=2)
    opt.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

`step()` is phase 6 of stages.py's schedule: each master shard's `.grad` becomes this rank's
averaged gradient shard (cast to the master dtype: a transient copy when gradients are bf16),
the user's optimizer steps the masters, and the wrapper writes them back into the compute
parameters (stages 1-2 then all-gather). `clip_grad_norm_` is the global L2 norm: each rank
sums the squares of its own shards (padding is zero), one all-reduce adds the ranks' sums.
"""
from __future__ import annotations

from typing import Any

import torch

from gobrrr.comm import collectives as comm
from gobrrr.parallel.zero.shard import Flat, all_reduce_sum


def _tp_state(module):
    from gobrrr.parallel.tp.parallelize import tp_state  # tp imports nothing of ZeRO; imported late to keep it so

    return tp_state(module)


class ZeroOptimizer:
    """Steps the user's optimizer on this rank's master shards; `param_groups` are the user's own (set lr there)."""

    def __init__(self, model):  # a Zero12, Zero3 or NaiveZero1
        self.model = model
        self.inner = model.optimizer
        self._shards: list[tuple[Flat, torch.Tensor]] | None = None

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def _grads(self) -> list[tuple[Flat, torch.Tensor]]:
        if self._shards is None:
            self._shards = self.model.grad_shards()
        return self._shards

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Global L2 norm of the averaged gradient (all shards, all ranks), scaled to at most `max_norm`.

        Under tensor parallelism (ZeRO over the dp ranks of a `tp()` model) the norm is the whole
        model's: squares of tp-sharded parameters are summed over the tp ranks too, replicated ones
        (alike on every tp rank) counted once, as gobrrr.parallel.tp.tensors.clip_grad_norm_ does.
        """
        shards = self._grads()
        dev = self.model.flats[0].master.device
        tp = _tp_state(self.model.module)
        tp = tp if tp is not None and tp.tpg.size > 1 else None
        sq = torch.zeros(1 if tp is None else 2, dtype=torch.float32, device=dev)  # [(tp-sharded,) the rest]
        for f, g in shards:
            if tp is None:
                sq[0] += g.float().pow(2).sum()
                continue
            for i, a, b in f.owned_ranges():  # this rank's elements of parameter i: [a, b) of it
                sq[0 if tp.is_sharded(f.names[i]) else 1] += f.piece(g, i, a, b).float().pow(2).sum()
        all_reduce_sum(sq, self.model.group, self.model.world_size)  # one or two scalars over dp; stream-ordered
        if tp is not None:
            comm.all_reduce(sq[:1], "sum", group=tp.tpg.group)  # the shards' squares over tp as well
        norm = sq.sum().sqrt()
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)  # as torch.nn.utils.clip_grad_norm_
        for _, g in shards:
            g.mul_(coef.to(g.dtype))
        return norm

    @torch.no_grad()
    def step(self) -> None:
        shards = self._grads()
        for f, g in shards:
            f.master.grad = g if g.dtype == f.master.dtype else g.to(f.master.dtype)  # (S,) transient fp32 copy
        self.inner.step()
        for f, _ in shards:
            f.master.grad = None
        self._shards = None
        self.model.after_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._shards = None
        self.model.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        from gobrrr.parallel.zero.checkpoint import optimizer_state_dict
        return optimizer_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from gobrrr.parallel.zero.checkpoint import load_optimizer_state_dict
        load_optimizer_state_dict(self.model, state)
