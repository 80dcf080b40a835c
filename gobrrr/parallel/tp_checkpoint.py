"""Checkpoints of a tensor-parallel model through torch.distributed.checkpoint (DCP), loadable at another tp.

    save_tp(path, model, optimizer, extra={"step": 100})     # every rank writes its shards (collective);
                                                              # extra: anything json can write
    extra = load_tp(path, model, optimizer)                   # model built and tp()'d at any degree first

Each parameter goes into the checkpoint as a DTensor on the tp mesh whose *global* shape is the
unsharded parameter's, so DCP can cut what was saved at tp = 2 into the pieces tp = 4 (or 1) needs:

    Split(dim=0)            local (out/n, in)       -> DTensor (out, in),        Shard(0)
    Split(dim=1)            local (out, in/n)       -> DTensor (out, in),        Shard(1)
    Split(dim=0, chunks=3)  local (3*C/n, in) = [q_r; k_r; v_r] is not one contiguous block of the
                            fused (3C, in) weight, so it is stored as (3, C, in), Shard(1): the view
                            (3, C/n, in) of the local tensor is contiguous
    whole                   a plain tensor (DCP writes it once, from one rank, and every rank reads it)

Optimizer state tensors shaped like their parameter (Adam's moments) are stored the same way, under
"optim.<parameter name>.<key>"; other state (Adam's step count) as a plain tensor. The DTensors are
views of the live parameters and moments, so `dcp.load` writes straight into them: no second copy.
Replicas over dp write nothing twice (DCP keeps one writer per chunk). Names and shapes of everything
but fused weights are the plain model's.

A fresh optimizer has no state yet: `load_tp` first creates it with one step at learning rate 0 on
zero gradients (which changes no parameter for SGD/Adam/AdamW), then overwrites it.
"""
from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn

from gobrrr.parallel.tp import Split, TPError, tp_state


def _mesh(state):
    from torch.distributed.device_mesh import DeviceMesh

    if state.mesh is None:
        state.mesh = DeviceMesh.from_group(state.tpg.group, state.device.type)
    return state.mesh


def _as_dtensor(local: torch.Tensor, split: Split, mesh) -> Any:
    from torch.distributed.tensor import DTensor, Shard

    if split.dim is None:
        return local
    if split.chunks > 1:
        view = local.unflatten(split.dim, (split.chunks, local.shape[split.dim] // split.chunks))
        return DTensor.from_local(view, mesh, [Shard(split.dim + 1)], run_check=False)
    return DTensor.from_local(local, mesh, [Shard(split.dim)], run_check=False)


def _holder(model: nn.Module):
    state = tp_state(model)
    if state is None:
        raise TPError("save_tp/load_tp: the model was not given to tp(); call gobrrr.parallel.tp(model, ...) first "
                      "(tp over one rank works too)")
    return next(m for m in model.modules() if m.__dict__.get("_gobrrr_tp") is state), state


def tp_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """{name: DTensor or tensor} views of the model (and optimizer state) in the global layout above."""
    holder, state = _holder(model)
    mesh = _mesh(state)
    sd: dict[str, Any] = {}
    for name, t in holder.state_dict(keep_vars=True).items():
        split = state.splits.get(name, Split(None))
        sd[name] = _as_dtensor(t.detach(), split, mesh)
    if optimizer is not None:
        for name, p in holder.named_parameters():
            for key, v in optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor):
                    same = v.shape == p.shape
                    sd[f"optim.{name}.{key}"] = _as_dtensor(v, state.splits[name] if same else Split(None), mesh)
    return sd


def _init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the per-parameter state with one step at lr 0 on zero gradients (nothing moves)."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad and p not in optimizer.state]
    if not params:
        return
    lrs = [g["lr"] for g in optimizer.param_groups]
    saved = {p: p.grad for p in params}
    for p in params:
        p.grad = torch.zeros_like(p)
    for g in optimizer.param_groups:
        g["lr"] = 0.0 if not isinstance(g["lr"], torch.Tensor) else g["lr"].zero_()
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr
    for p in params:
        p.grad = saved[p]


def save_tp(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
            extra: dict[str, Any] | None = None) -> None:
    """Write the model (and optimizer) shards of every rank to the folder `path` (call on every rank)."""
    import torch.distributed.checkpoint as dcp

    sd = tp_state_dict(model, optimizer)
    sd["extra"] = json.dumps(extra or {})  # one string: DCP loads a non-tensor value only under a key it is given
    dcp.save(sd, checkpoint_id=str(path))


def load_tp(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
            ) -> dict[str, Any]:
    """Read a `save_tp` checkpoint into a tp() model of any degree (and its optimizer); return `extra`."""
    import torch.distributed.checkpoint as dcp

    if optimizer is not None:
        _init_optimizer_state(optimizer)
    sd = tp_state_dict(model, optimizer)
    sd["extra"] = ""
    dcp.load(sd, checkpoint_id=str(path))
    return json.loads(sd["extra"])
