"""A 2-D (dp, tp) device mesh from torch's `init_device_mesh`, checked so that a mismatch raises instead of hanging.

    mesh = make_mesh(tp=2)                 # world 8 -> (dp=4, tp=2); tp ranks are consecutive
    model = tp(model, mesh, plan)          # uses mesh["tp"]; plan: e.g. gobrrr.models.gpt_plan.GPT_PLAN
    model = ddp(model, group=mesh["dp"].get_group())

Layout, for 8 ranks at tp = 2 (rows: dp groups' members, columns: tp groups):

        tp=0  tp=1
  dp0:   r0    r1      tp groups {r0,r1} {r2,r3} ...: consecutive ranks, so one node's GPUs (NVLink)
  dp1:   r2    r3      carry TP's per-layer collectives; the dp groups {r0,r2,r4,r6} {r1,r3,r5,r7}
  dp2:   r4    r5      carry one gradient reduction per step, which tolerates the slower links.
  dp3:   r6    r7

Before the mesh is built, every rank's tp is compared (one all_gather_object over the world): if they
differ, all ranks raise the same error, instead of some waiting forever in a sub-group's creation.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist


class MeshError(ValueError):
    """The asked mesh does not fit the world or the ranks disagree; the message says what to change."""


def check_same_tp(tp: int) -> None:
    """Raise on every rank if the ranks were given different tp degrees (a no-op in one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, tp)  # sync: once, before the mesh exists; plain ints through the host
    if len(set(every)) > 1:
        by = {}
        for r, t in enumerate(every):
            by.setdefault(t, []).append(r)
        said = "; ".join(f"ranks {rs} asked for tp={t}" for t, rs in by.items())
        raise MeshError(f"the ranks disagree on the tensor-parallel degree ({said}); pass the same --tp to every rank")


def make_mesh(tp: int, device_type: str | None = None):
    """A DeviceMesh of shape (world // tp, tp) named ("dp", "tp"), over the initialised process group."""
    from torch.distributed.device_mesh import init_device_mesh

    if not (dist.is_available() and dist.is_initialized()):
        raise MeshError("make_mesh needs a process group; call gobrrr.comm.init() (or run under torchrun) first")
    world = dist.get_world_size()
    if tp < 1:
        raise MeshError(f"tp must be >= 1, got {tp}")
    check_same_tp(tp)
    if world % tp:
        raise MeshError(f"tp={tp} does not divide the world size {world}; choose a tp that divides {world}")
    if device_type is None:
        device_type = "cuda" if "nccl" in str(dist.get_backend()) else "cpu"
    return init_device_mesh(device_type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
