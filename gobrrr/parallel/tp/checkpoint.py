"""Checkpoint records of a tensor-parallel model, in the plain model's shapes, through torch.distributed.checkpoint.

    save_tp(path, model, optimizer, extra={"step": 100})     # every rank writes its pieces (collective)
    extra = load_tp(path, model, optimizer)                   # a model tp()'d at any degree (1 included)

    state = state_for_save(model, optimizer)                  # the records alone, for a caller's dcp.save
    state, after = state_for_load(model, optimizer, metadata) # dcp.load(state, ...); after()

The records are the format every gobrrr checkpoint shares (gobrrr.train.checkpoints writes them for
plain, ZeRO and tensor-parallel runs alike): "model/<name>" for each parameter (tied ones once, under
their first name) and buffer, "optim/<name>/<key>" for each optimizer state entry, every tensor in the
plain model's shape (Adam's step count: a 0-d tensor). On tp rank t of n, a split parameter's local
tensor is t's block of the plain one, so its record is a ShardedTensor whose shards are the tp ranks'
blocks placed in the plain tensor; DCP's planner then hands any other layout (another tp degree, a
plain model, ZeRO's 1-D pieces of it) exactly the elements it owns. A replicated parameter is a plain
tensor: DCP writes it once and every rank reads it.

Where a range of a tp rank's local tensor sits in the plain one (`place`, also ZeRO's, whose
pieces are ranges of the flattened local tensor, gobrrr.parallel.zero.pieces):

    local (R, C) row-major, range [a, b):   [ . . . a a ]  <- head: part of one row      (1, k)
                                            [ a a a a a ]  <- body: whole rows           (m, C)
                                            [ a a . . . ]  <- tail: part of one row      (1, k')
    each box is contiguous in the local tensor and is a rectangle of the global one:
      Split(dim=1)            local (R, C/n): box (r, c) -> global (r, t*C/n + c)
      Split(dim=0)            local (R/n, C): box (r, c) -> global (t*R/n + r, c)
      Split(dim=0, chunks=3)  local (3R/n, C) = [q_t; k_t; v_t]: a box is first cut where the fused
                              parts meet (every R/n rows), part k's rows go to k*R + t*R/n + r
      whole (replicated)      the box is the global box.

Replicas over dp: every dp row of the (dp, tp) mesh lists its own tp ranks' blocks (each row tiles
the tensor once) and DCP keeps one writer per block. ShardedTensor is deprecated in favour of
DTensor, which has no way to say "three blocks per rank" (the fused QKV); `quiet()` silences only
that deprecation's FutureWarning, which DCP raises each time it touches one.

A fresh optimizer has no state yet: loading creates each entry the checkpoint holds (zeros shaped
like the parameter, or a 0-d step count) and DCP then writes into it.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from gobrrr.parallel.tp.layers import Split
from gobrrr.parallel.tp.ops import TPGroup
from gobrrr.parallel.tp.parallelize import tp_state


class CheckpointFitError(ValueError):
    """A checkpoint's records do not fit the model or layout asked to load them; the message says which."""


@contextlib.contextmanager
def quiet():
    """DCP touches each ShardedTensor record through torch functions, and each touch warns that ShardedTensor is
    deprecated; it also warns that it assumes one process when told so (no_dist). Both are ours to know, not
    the user's: only those two are silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Please use DTensor instead and we are deprecating ShardedTensor",
                                category=FutureWarning)
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


# ---------------------------------------------------------------- where a local range sits in the plain tensor

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
            raise CheckpointFitError(f"a box {sizes} crosses fused parts along dim {d} and is not contiguous "
                                     "there; split fused parameters along their first dimension")
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


def global_shape(local_shape, split: Split, n: int) -> list[int]:
    """The plain tensor's shape from tp rank's local one (0-d tensors count as (1,))."""
    shape = list(local_shape) or [1]
    if split.dim is not None:
        shape[split.dim] *= n
    return shape


def sharded(metas_and_locals: list[tuple[Any, torch.Tensor | None]], size: list[int], dtype: torch.dtype, group):
    """A ShardedTensor of `size` from (ShardMetadata, this rank's view or None) pairs: its shards are the views."""
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

    props = TensorProperties(dtype=dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    meta = ShardedTensorMetadata([m for m, _ in metas_and_locals], torch.Size(size), props)
    local = [Shard(v, m) for m, v in metas_and_locals if v is not None]
    with quiet():
        return ShardedTensor._init_from_local_shards_and_global_metadata(local, meta, process_group=group)


def record(local: torch.Tensor, split: Split, tpg, ranks: list[int]):
    """`local` (this tp rank's block) as a record of the plain tensor: the tensor itself when it is whole,
    else a ShardedTensor of every tp rank's boxes (`ranks`: their global ranks), this rank's being views."""
    if split.dim is None or tpg.size == 1:
        return local
    from torch.distributed._shard.metadata import ShardMetadata

    shape, flat = list(local.shape), local.view(-1)
    where = local.device  # a torch.device: "cpu" or "cuda:<index>"
    placements = [f"rank:{r}/{where}" for r in ranks]  # where each tp rank's shards live
    pairs = []
    for t in range(tpg.size):
        for pc in place(shape, 0, flat.numel(), split, t, tpg.size):
            m = ShardMetadata(list(pc.offsets), list(pc.sizes), placements[t])
            pairs.append((m, pc.of(flat) if t == tpg.rank else None))
    return sharded(pairs, global_shape(shape, split, tpg.size), local.dtype, tpg.group)


# ---------------------------------------------------------------- a tp() model's records

def _holder(model: nn.Module):
    """(the module tp() was given, its TPState); a model never given to tp() is the tp = 1 case: (model, None)."""
    state = tp_state(model)
    if state is None:
        return model, None
    return next(m for m in model.modules() if m.__dict__.get("_gobrrr_tp") is state), state


def named_records(module: nn.Module) -> tuple[dict[str, nn.Parameter], dict[str, torch.Tensor]]:
    """({name: parameter}, {name: buffer}) as the records name them: tied parameters once, under their first name."""
    params = dict(module.named_parameters())
    ids = {id(p) for p in module.parameters()}
    buffers = {k: v for k, v in module.state_dict(keep_vars=True).items() if k not in params and id(v) not in ids}
    return params, buffers


def ensure_optimizer_state(optimizer: torch.optim.Optimizer, params: dict[str, torch.Tensor], saved) -> None:
    """Create the optimizer state entries the checkpoint holds ("optim/<name>/<key>" in `saved`, DCP's
    state_dict_metadata) that do not exist yet: zeros like the parameter, or a 0-d step count (on the device
    for fused or capturable optimizers, which read it there; on the CPU otherwise, as torch's own)."""
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for name, p in params.items():
        if id(p) not in groups:
            continue
        st = optimizer.state[p]
        on_device = groups[id(p)].get("fused") or groups[id(p)].get("capturable")
        prefix = f"optim/{name}/"
        for key in (k[len(prefix):] for k in saved if k.startswith(prefix) and "/" not in k[len(prefix):]):
            if key in st:
                continue
            size = getattr(saved[prefix + key], "size", None)
            if size is not None and len(size) == 0:
                st[key] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
            else:
                st[key] = torch.zeros_like(p)


def _records(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    holder, state = _holder(model)
    tpg = state.tpg if state is not None else TPGroup(None, 1, 0)
    ranks = [dist.get_global_rank(tpg.group, t) if tpg.group is not None else t for t in range(tpg.size)]
    params, buffers = named_records(holder)
    out: dict[str, Any] = {f"model/{k}": v.detach() for k, v in buffers.items()}
    for name, p in params.items():
        split = state.splits.get(name, Split(None)) if state is not None else Split(None)
        out[f"model/{name}"] = record(p.detach(), split, tpg, ranks)
        for key, v in (optimizer.state.get(p, {}) if optimizer is not None else {}).items():
            if torch.is_tensor(v) and v.shape == p.shape and v.dim():
                out[f"optim/{name}/{key}"] = record(v, split, tpg, ranks)
            elif torch.is_tensor(v):
                out[f"optim/{name}/{key}"] = v  # replicated scalar (Adam's step)
    return out


def state_for_save(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """The records of a tp() model, or of a plain one (tp = 1), and its optimizer, for dcp.save: views of the live
    tensors, nothing copied."""
    return _records(model, optimizer)


def state_for_load(model: nn.Module, optimizer: torch.optim.Optimizer | None, saved
                   ) -> tuple[dict[str, Any], Callable[[], None]]:
    """(records to dcp.load into, what to call after): `saved` is the checkpoint's state_dict_metadata; the
    optimizer's missing entries are created first, and the loaded step counts put back in place after."""
    if optimizer is not None:
        ensure_optimizer_state(optimizer, named_records(_holder(model)[0])[0], saved)
    state = _records(model, optimizer)

    def after() -> None:
        if optimizer is None:
            return
        for name, p in named_records(_holder(model)[0])[0].items():
            st = optimizer.state.get(p, {})
            for key, v in list(st.items()):
                if torch.is_tensor(v) and v.dim() == 0 and f"optim/{name}/{key}" in state:
                    st[key] = state[f"optim/{name}/{key}"]

    return state, after


def save_tp(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
            extra: dict[str, Any] | None = None) -> None:
    """Write the model's (and optimizer's) records into the folder `path` (every rank calls it; not atomic:
    gobrrr.train.checkpoints makes a run's checkpoints atomic)."""
    import torch.distributed.checkpoint as dcp

    sd = state_for_save(model, optimizer)
    buf = io.BytesIO()
    torch.save(extra or {}, buf)  # one opaque value: DCP loads a non-tensor only under a key it is given
    sd["extra"] = buf.getvalue()
    with quiet():
        dcp.save(sd, checkpoint_id=str(path))


def load_tp(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
            ) -> dict[str, Any]:
    """Read a checkpoint in the shared format into a tp() model of any degree or a plain model (and its
    optimizer); return the `extra` that save_tp stored ({} when another writer made it)."""
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    sd, after = state_for_load(model, optimizer, saved)
    if "extra" in saved:
        sd["extra"] = b""
    with quiet():
        dcp.load(sd, checkpoint_id=str(path))
    after()
    return torch.load(io.BytesIO(sd["extra"]), weights_only=True) if "extra" in saved else {}
