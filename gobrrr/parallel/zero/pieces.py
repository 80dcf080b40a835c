"""Where a ZeRO rank's pieces sit in a checkpoint record: the parameter's plain shape (or, in old checkpoints, 1-D).

zero/checkpoint.py saves every parameter (and each optimizer moment shaped like it) as one record made
of the ranks' pieces, a `ShardedTensor` with explicit offsets, so that DCP's planner reshards. This file
says where each piece goes. A ZeRO piece is a contiguous range [a, b) of the *flattened local*
parameter (zero.shard.Flat.owned_ranges). Two forms:

  global  the record has the parameter's plain shape: the model's own, or under ZeRO over the dp ranks
          of a tp() model the plain model's (unsharded over tp). The range [a, b) of the local tensor is
          cut into boxes, each a rectangle of the plain tensor (gobrrr.parallel.tp.checkpoint.place draws
          them; on tp rank t the local tensor is t's block of the plain one). A replicated parameter:
          only tp rank 0's pieces are written (the other tp ranks hold the same values) and every tp
          rank reads its own. This is the format every gobrrr checkpoint shares; ZeRO writes it.
  flat    (numel,): the range [a, b) itself. Written by gobrrr 0.1 without tp; still read (at tp = 1:
          a 1-D record of a matrix cannot be cut by tp).

Every rank's pieces are listed in the ShardedTensor's metadata (rank (q, t) -> global rank from one
all_gather_object at checkpoint time), so the boxes of all ranks tile the record exactly. A checkpoint
saved at (dp, tp) = (2, 2) thus loads at any dp and any tp that tp() accepts, a plain model and one
process included.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gobrrr.parallel.tp.checkpoint import CheckpointFitError, place, sharded
from gobrrr.parallel.tp.layers import Split
from gobrrr.parallel.tp.parallelize import tp_state
from gobrrr.parallel.zero.shard import Flat


class Layout:
    """How this checkpoint's ranks are arranged: dp (the ZeRO group) x tp (the model's tp() group, if any).

    `group` is the process group that writes and reads the checkpoint (None: the default one), `world`
    its size; `rank0` whether this process publishes the checkpoint (renames, `latest`).
    """

    def __init__(self, model):
        self.model = model
        self.q, self.dp = model.rank, model.world_size
        self.tp = tp_state(model.module)
        self.t, self.n = (self.tp.tpg.rank, self.tp.tpg.size) if self.tp is not None else (0, 1)
        self._prefix = ""
        if self.tp is not None:
            holder = next(name for name, m in model.module.named_modules() if m.__dict__.get("_gobrrr_tp") is self.tp)
            self._prefix = holder + "." if holder else ""
        self.world = self.dp * self.n
        if self.tp is None:
            self.group = model.group if self.dp > 1 else None
            self.rank0 = model.rank == 0
            self._ranks = {(q, 0): (dist.get_global_rank(model.group, q) if model.group is not None else q)
                           for q in range(self.dp)}
            return
        self.group = None  # dp x tp: the whole world writes the checkpoint
        self.rank0 = not dist.is_initialized() or dist.get_rank() == 0
        if self.world == 1:
            self._ranks = {(0, 0): 0}
            return
        if dist.get_world_size() != self.world:
            raise CheckpointFitError(f"zero checkpoint of a tp() model: dp {self.dp} x tp {self.n} ranks are not the "
                                     f"world of {dist.get_world_size()}; build the mesh over every rank (make_mesh)")
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, (self.q, self.t))  # sync: checkpoint time only; which rank holds (dp, tp)
        self._ranks = {tuple(qt): g for g, qt in enumerate(every)}

    def global_rank(self, q: int, t: int) -> int:
        return self._ranks[(q, t)]

    def split(self, name: str) -> Split:
        if self.tp is None or not name.startswith(self._prefix):
            return Split(None)
        return self.tp.splits.get(name[len(self._prefix):], Split(None))

    def global_shape(self, p: torch.Tensor, split: Split) -> list[int]:
        shape = list(p.shape) or [1]
        if split.dim is not None:
            shape[split.dim] *= self.n
        return shape


def record(layout: Layout, f: Flat, i: int, src: torch.Tensor | None, form: str, loading: bool):
    """Parameter i of `f` as a checkpoint record: a ShardedTensor of every rank's pieces of `src` (this rank's
    (S,) master or moment, or None when this rank has no piece of it), or a plain tensor in one process.
    form "flat": 1-D (numel,); "global": the parameter's plain shape (module docstring)."""
    from torch.distributed._shard.metadata import ShardMetadata

    p = f.params[i]
    split = layout.split(f.names[i]) if form == "global" else Split(None)
    shape = (list(p.shape) or [1]) if form == "global" else [p.numel()]
    size = layout.global_shape(p, split) if form == "global" else [p.numel()]
    whole = split.dim is None or layout.n == 1
    mine = {j: (a, b) for j, a, b in f.owned_ranges()}
    if layout.world == 1:
        a, b = mine[i]
        return f.piece(src, i, a, b).view(size)
    dev = "cpu" if src is None or src.device.type == "cpu" else f"cuda:{src.device.index}"
    # a replicated parameter: tp rank 0's pieces are saved; each tp rank loads its own copy
    columns = [layout.t if loading else 0] if whole else range(layout.n)
    pairs = []
    me = dist.get_rank()
    for q in range(layout.dp):
        for j, a, b in f.owned_ranges(q):
            if j != i:
                continue
            for t in columns:
                g = layout.global_rank(q, t)
                for pc in place(shape, a, b, split, t, layout.n):
                    m = ShardMetadata(list(pc.offsets), list(pc.sizes), f"rank:{g}/{dev}")
                    pairs.append((m, pc.of(f.piece(src, i, a, b)) if g == me else None))
    dtype = src.dtype if src is not None else f.master_dtype
    return sharded(pairs, size, dtype, layout.group if layout.tp is not None else layout.model.group)
