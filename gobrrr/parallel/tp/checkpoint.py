"""Checkpoints of a tensor-parallel model through torch.distributed.checkpoint (DCP), loadable at another tp.

    save_tp(path, model, optimizer, extra={"step": 100})     # every rank writes its shards (collective);
                                                              # extra: what torch.load(weights_only) reads
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

For a trainer, `save_run(dir, ...)` / `load_run(dir, ...)` make it atomic: DCP writes into
DIR/.tp-step-<s>.tmp, rank 0 renames it to DIR/tp-step-<s>.<ns> and then points DIR/tp_latest.pt at
it (gobrrr.train.checkpoint_io's atomic file write), and removes the older folders. A kill at any moment leaves
the previous checkpoint loadable.

A fresh optimizer has no state yet: `load_tp` first creates it with one step at learning rate 0 on
zero gradients (which changes no parameter for SGD/Adam/AdamW), then overwrites it.
"""
from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gobrrr.parallel.tp.parallelize import Split, TPError, tp_state


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
    buf = io.BytesIO()
    torch.save(extra or {}, buf)  # one opaque value: DCP loads a non-tensor only under a key it is given
    sd["extra"] = buf.getvalue()
    dcp.save(sd, checkpoint_id=str(path))


def load_tp(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
            ) -> dict[str, Any]:
    """Read a `save_tp` checkpoint into a tp() model of any degree (and its optimizer); return `extra`."""
    import torch.distributed.checkpoint as dcp

    if optimizer is not None:
        _init_optimizer_state(optimizer)
    sd = tp_state_dict(model, optimizer)
    sd["extra"] = b""
    dcp.load(sd, checkpoint_id=str(path))
    return torch.load(io.BytesIO(sd["extra"]), weights_only=True)


# ---------------------------------------------------------------- a trainer's run folder, atomically

LATEST = "tp_latest.pt"


def _main() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()  # sync: checkpoint time only; every rank's shards are on disk before rank 0 publishes


def latest_run(out: str | os.PathLike) -> Path | None:
    """The checkpoint folder DIR/tp_latest.pt points at, or None when DIR holds no tp checkpoint."""
    from gobrrr.train.checkpoint_io import load_checkpoint

    out = Path(out)
    if not (out / LATEST).is_file():
        return None
    return out / load_checkpoint(out / LATEST)["dir"]


def save_run(out: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer,
             state: dict[str, Any]) -> Path:
    """Write model, optimizer and the trainer's `state` (with a "step") under DIR atomically; every rank calls."""
    from gobrrr.train.checkpoint_io import save_checkpoint

    out = Path(out)
    tmp = out / f".tp-step-{state['step']}.tmp"
    if _main():
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
        out.mkdir(parents=True, exist_ok=True)
    _barrier()
    save_tp(tmp, model, optimizer, extra=state)
    _barrier()
    final = out / f"tp-step-{state['step']}.{time.time_ns()}"
    if _main():
        os.replace(tmp, final)
        save_checkpoint({"dir": final.name}, out / LATEST)  # the switch: atomic rename of a small file
        for old in out.glob("tp-step-*"):
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load_run(out: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load DIR's latest tp checkpoint into `model` (any tp degree) and `optimizer`; return the trainer's state."""
    from gobrrr.train.checkpoint_io import CheckpointError

    path = latest_run(out)
    if path is None or not path.is_dir():
        raise CheckpointError(f"no tensor-parallel checkpoint in {out} ({LATEST} missing or pointing nowhere); "
                              "start without --resume")
    return load_tp(path, model, optimizer)
