"""Where a ZeRO rank's pieces sit in a checkpoint tensor: a 1-D record, or the global tensor of a tp() model.

zero_ckpt.py saves every parameter (and each optimizer moment shaped like it) as one tensor made of
the ranks' pieces, a `ShardedTensor` with explicit offsets, so that DCP's planner reshards. This file
says where each piece goes. A ZeRO piece is a contiguous range [a, b) of the *flattened local*
parameter (zero_shard.Flat.owned_ranges). Two forms:

  flat    (no tp): the record is 1-D, (numel,); the piece is the range [a, b) itself.
  global  (ZeRO over the dp ranks of a tp() model): the record has the parameter's *global* shape,
          the plain model's (unsharded over tp). On tp rank t of n, the local tensor is t's block of
          it (gobrrr.parallel.tp.parallelize.Split), so the range [a, b) of the local tensor is cut into boxes:

    local (R, C) row-major, range [a, b):   [ . . . a a ]  <- head: part of one row      (1, k)
                                            [ a a a a a ]  <- body: whole rows           (m, C)
                                            [ a a . . . ]  <- tail: part of one row      (1, k')
    each box is contiguous in the local tensor and is a rectangle of the global one:
      Split(dim=1)            local (R, C/n): box (r, c) -> global (r, t*C/n + c)
      Split(dim=0)            local (R/n, C): box (r, c) -> global (t*R/n + r, c)
      Split(dim=0, chunks=3)  local (3R/n, C) = [q_t; k_t; v_t]: a box is first cut where the fused
                              parts meet (every R/n rows), part k's rows go to k*R + t*R/n + r
      whole (replicated)      the box is the global box; only tp rank 0's pieces are written (the
                              other tp ranks hold the same values), and every tp rank reads its own.

Every rank's pieces are listed in the ShardedTensor's metadata (rank (q, t) -> global rank from one
all_gather_object at checkpoint time), so the boxes of all ranks tile the global tensor exactly.
A checkpoint saved at (dp, tp) = (2, 2) thus loads at any dp and any tp that tp() accepts,
including a plain model at tp = 1 and one process (`zero_ckpt.load_plain`): the records are the
plain model's tensors. A flat (no tp) record of a matrix cannot be cut by tp; it loads at tp = 1 only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gobrrr.parallel.tp.parallelize import Split, tp_state
from gobrrr.parallel.zero.shard import Flat
from gobrrr.train.checkpoint_io import CheckpointError


def boxes(shape: list[int], a: int, b: int) -> list[tuple[list[int], list[int]]]:
    """Elements [a, b) of a row-major tensor of `shape` as (offsets, sizes) boxes, in order; each box is
    contiguous in memory (all its dimensions before one have size 1, all after it are whole)."""
    if a >= b:
        return []
    if len(shape) == 1:
        return [([a], [b - a])]
    inner = math.prod(shape[1:])
    first, last = a // inner, (b - 1) // inner
    if first == last:
        return [([first] + o, [1] + s) for o, s in boxes(shape[1:], a - first * inner, b - first * inner)]
    out = []
    if a % inner:  # head: the end of row `first`
        out += [([first] + o, [1] + s) for o, s in boxes(shape[1:], a % inner, inner)]
        first += 1
    end = b // inner
    if end > first:  # body: whole rows
        out.append(([first] + [0] * (len(shape) - 1), [end - first] + list(shape[1:])))
    if b % inner:  # tail: the start of row `end`
        out += [([end] + o, [1] + s) for o, s in boxes(shape[1:], 0, b % inner)]
    return out


@dataclass(frozen=True)
class Piece:
    """One box: `numel` local elements from `start` (within the range's 1-D piece), viewed as `local_sizes`,
    narrowed to [x, x + length) along `dim` (None: whole), placed at `offsets` with `sizes` in the record."""
    start: int
    local_sizes: tuple[int, ...]
    dim: int | None
    x: int
    length: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    def of(self, piece: torch.Tensor) -> torch.Tensor:
        box = piece[self.start:self.start + math.prod(self.local_sizes)].view(self.local_sizes)
        return box if self.dim is None else box.narrow(self.dim, self.x, self.length)


def place(shape: list[int], a: int, b: int, split: Split, t: int, n: int) -> list[Piece]:
    """The boxes of local elements [a, b) of tp rank t's tensor (`shape`) in the record (module docstring)."""
    out, start = [], 0
    d, c = split.dim, split.chunks
    for offs, sizes in boxes(shape, a, b):
        numel = math.prod(sizes)
        if d is None or n == 1:
            out.append(Piece(start, tuple(sizes), None, 0, 0, tuple(offs), tuple(sizes)))
            start += numel
            continue
        part = shape[d] // c  # rows of one fused part on this rank
        lo, hi = offs[d], offs[d] + sizes[d]
        cuts = [lo] + [k * part for k in range(lo // part + 1, -(-hi // part))] + [hi]
        if len(cuts) > 2 and any(s != 1 for s in sizes[:d]):
            raise CheckpointError(f"zero checkpoint: a box {sizes} crosses fused parts along dim {d} and is not "
                                  "contiguous there; split fused parameters along their first dimension")
        for x0, x1 in zip(cuts, cuts[1:]):
            k = x0 // part
            g_off = list(offs)
            g_off[d] = k * part * n + t * part + (x0 - k * part)
            g_size = list(sizes)
            g_size[d] = x1 - x0
            out.append(Piece(start, tuple(sizes), d if len(cuts) > 2 else None, x0 - lo, x1 - x0,
                             tuple(g_off), tuple(g_size)))
        start += numel
    return out


class Layout:
    """How this checkpoint's ranks are arranged: dp (the ZeRO group) x tp (the model's tp() group, if any).

    `flat` records (no tp) keep zero_ckpt's 1-D format; a tp() model's records are global tensors.
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
            raise CheckpointError(f"zero checkpoint of a tp() model: dp {self.dp} x tp {self.n} ranks are not the "
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
    form "flat": 1-D (numel,); "global": the parameter's global shape (module docstring)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

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
    metas, local = [], []
    me = dist.get_rank()
    for q in range(layout.dp):
        for j, a, b in f.owned_ranges(q):
            if j != i:
                continue
            for t in columns:
                g = layout.global_rank(q, t)
                for pc in place(shape, a, b, split, t, layout.n):
                    m = ShardMetadata(list(pc.offsets), list(pc.sizes), f"rank:{g}/{dev}")
                    metas.append(m)
                    if g == me:
                        piece = f.piece(src, i, a, b)
                        local.append(Shard(pc.of(piece), m))
    dtype = src.dtype if src is not None else f.master_dtype
    props = TensorProperties(dtype=dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    meta = ShardedTensorMetadata(metas, torch.Size(size), props)
    group = layout.group if layout.tp is not None else layout.model.group
    return ShardedTensor._init_from_local_shards_and_global_metadata(local, meta, process_group=group)
