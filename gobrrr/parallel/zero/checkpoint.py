"""ZeRO checkpoints: sharded through torch.distributed.checkpoint (DCP), atomic, loadable anywhere.

What is saved is layout-free: every parameter and every optimizer-state tensor is stored as its
own 1-D tensor of `numel` elements (the fp32 master values, not the bf16 compute copy), and each
rank writes only the contiguous piece of it that its shards own:

    parameter w (numel 10), N = 3, S = 4:   flat  [ w w w w | w w w w | w w . . ]
    saved as "model/w" (10,):               rank 0 writes [0, 4), rank 1 [4, 8), rank 2 [8, 10)

Those pieces travel as `ShardedTensor`s with explicit offsets, so DCP's planner can hand any other
layout (another world size, another stage, the naive stage 1, or one process with no group at
all) exactly the elements it owns: resharding is DCP's job, not ours.

ZeRO over the dp ranks of a `tp()` model (zero(tp(model, mesh), ..., group=mesh["dp"].get_group())):
each parameter is saved with its *global* shape instead, the plain model's (unsharded over tp), and
every dp x tp rank writes its pieces as boxes of it (zero_pieces.py draws them): ZeRO's 1-D piece is
taken over the tp-local tensor and placed inside the global one. Such a checkpoint loads at any dp,
any stage and any tp degree tp() accepts, a plain model (tp = 1) and one process (`load_plain`)
included. A 1-D record (saved without tp) of a matrix loads at tp = 1 only. `load` reads which form
each record has from the checkpoint's metadata and checks its shape.

Keys: "model/<param name>", "optim/<param name>/<state key>" (exp_avg, exp_avg_sq, step, ...).
Tied parameters are stored once under their first name. Buffers and the frozen parameters stages 1-2
leave whole are stored once, flattened too ("model/<key>"; DCP deduplicates replicated tensors).

Atomic save (a SIGKILL at any moment leaves the previous checkpoint loadable):
  1. every rank (under tp: every dp x tp rank) writes into DIR/.tmp-step-<s>/ (DCP's
     FileSystemWriter; rank 0 also writes extra.pt, the trainer's own state);  # sync: DCP's barriers
  2. rank 0 renames the folder to DIR/step-<s>.<ns> (atomic within one filesystem; a fresh name,
     so re-saving a step never touches the folder `latest` points at);
  3. rank 0 points DIR/latest at it (write latest.tmp, fsync, os.replace), then deletes the
     older step folders and stale .tmp folders. Readers follow `latest` only.

`export(dir, file)` streams one checkpoint into a single plain `torch.save` state_dict: tensor by
tensor, each read by DCP into a memory-mapped temporary file, so the process's own memory stays
about one tensor while the page cache (reclaimable) carries the rest.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from gobrrr.parallel.zero.pieces import Layout, record
from gobrrr.parallel.zero.shard import all_gather_flat
from gobrrr.train.checkpoint_io import CheckpointError, load_checkpoint, save_checkpoint

LATEST = "latest"


# ---------------------------------------------------------------- plain (consolidated) state

@torch.no_grad()
def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The whole model's state_dict (master precision) on every rank; a collective over the group."""
    values: dict[int, torch.Tensor] = {}
    for f in model.flats:
        src = f.master if f.master is not None else f.shard
        full = torch.empty(f.P, dtype=src.dtype, device=src.device)  # (P,)
        all_gather_flat(full, src, model.group, model.world_size, async_op=False)
        for p, v in zip(f.params, f.views(full)):
            values[id(p)] = v.clone()
    return {k: values[id(v)] if id(v) in values else v.detach().clone()
            for k, v in model.module.state_dict(keep_vars=True).items()}


@torch.no_grad()
def load_full_state_dict(model, state: dict[str, torch.Tensor]) -> None:
    """Load a plain state_dict (every rank passes the same one): each rank keeps its own slices."""
    sharded = {id(p) for f in model.flats for p in f.params}  # tied aliases (lm_head.weight) included
    rest = {k for k, v in model.module.state_dict(keep_vars=True).items() if id(v) not in sharded}
    missing = rest - state.keys()
    if missing:
        raise KeyError(f"zero: the state_dict lacks {sorted(missing)[:4]}; pass the full model's state_dict.")
    model.module.load_state_dict({k: state[k] for k in rest}, strict=False)  # buffers, unsharded frozen params
    for f in model.flats:
        for i, a, b in f.owned_ranges():
            name = f.names[i]
            if name not in state:
                raise KeyError(f"zero: the state_dict has no {name!r}; pass the full model's state_dict.")
            piece = state[name].reshape(-1)[a:b].to(f.master_dtype)
            f.piece(f.master if f.master is not None else f.shard, i, a, b).copy_(piece)
        if f.mixed:
            f.shard.copy_(f.master)
    model.after_step()  # stages 1-2 re-gather the compute parameters


def optimizer_state_dict(model) -> dict[str, Any]:
    """This rank's optimizer state (same layout only); use save()/load() to change world size or stage."""
    opt = model.optimizer
    return {"param_groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
            "shards": [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state.get(f.master, {}).items()}
                       for f in model.order]}


def load_optimizer_state_dict(model, state: dict[str, Any]) -> None:
    opt = model.optimizer
    for g, saved in zip(opt.param_groups, state["param_groups"]):
        g.update(saved)
    for f, st in zip(model.order, state["shards"]):
        opt.state[f.master] = {k: (v.clone().to(f.master.device) if torch.is_tensor(v) and v.dim() else v)
                               for k, v in st.items()}


# ---------------------------------------------------------------- sharded, layout-free state

def sharded_state(model, optim_keys: dict[str, list[str]] | None = None, forms: dict[str, str] | None = None,
                  layout: Layout | None = None) -> dict[str, Any]:
    """{"model/<name>": my master pieces as one record, "optim/<name>/<key>": ...} (views: saving reads, loading
    writes straight into the shards). `optim_keys` (loading): which state keys to create. `forms` (loading):
    {name: "flat" | "global"}, the form each parameter was saved in (zero_pieces); saving picks "global" for a
    tp() model and "flat" otherwise."""
    layout = layout or Layout(model)
    default = "global" if layout.tp is not None else "flat"
    loading = forms is not None
    out: dict[str, Any] = {}
    opt = model.optimizer
    for f in model.flats:
        src = f.master if f.master is not None else f.shard
        st = opt.state.get(f.master, {}) if f.trainable else {}
        if optim_keys is not None and f.trainable:
            st = opt.state.setdefault(f.master, {})
            group = opt.param_groups[f.group]
            on_device = group.get("fused") or group.get("capturable")  # their step counters live on the device
            for key in optim_keys.get(f.names[0], []):
                if key not in st:
                    st[key] = (torch.zeros_like(f.master) if key != "step" else
                               torch.zeros((), dtype=torch.float32, device=f.master.device if on_device else "cpu"))
        owned = {i for i, _, _ in f.owned_ranges()}
        for i, name in enumerate(f.names):
            form = (forms or {}).get(name, default)
            out[f"model/{name}"] = record(layout, f, i, src if i in owned else None, form, loading)
            for key, v in st.items():
                if torch.is_tensor(v) and v.dim() == 1:
                    out[f"optim/{name}/{key}"] = record(layout, f, i, v if i in owned else None, form, loading)
                elif torch.is_tensor(v):
                    out[f"optim/{name}/{key}"] = v  # replicated scalar (Adam's step)
    sharded = {id(p) for f in model.flats for p in f.params}
    for k, v in model.module.state_dict(keep_vars=True).items():
        if id(v) not in sharded:  # buffers, and frozen parameters stages 1-2 leave whole: replicated
            out[f"model/{k}"] = v.detach().view(-1)  # 1-D like the rest, so stage 3 (which shards them) reads them
    return out


def save(model, folder: str | os.PathLike, step: int, extra: dict[str, Any] | None = None) -> Path:
    """Atomically write checkpoint `step` of a zero-wrapped model (all ranks call it; under tp, every dp x tp
    rank); return its folder."""
    folder = Path(folder)
    layout = Layout(model)
    tmp = folder / f".tmp-step-{step:08d}"
    final = folder / f"step-{step:08d}.{time.time_ns()}"  # never overwrites a folder `latest` may point at
    if layout.rank0:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier(layout)
    with _quiet():
        dcp.save(sharded_state(model, layout=layout), checkpoint_id=str(tmp),
                 process_group=layout.group if layout.world > 1 else None, no_dist=layout.world == 1)
    if layout.rank0:
        save_checkpoint({"step": step, "world_size": model.world_size, "tp": layout.n, "stage": model.cfg.stage,
                         "extra": extra or {}}, tmp / "extra.pt")
        os.replace(tmp, final)
        _write_latest(folder, final.name)
        for old in folder.iterdir():
            if old.name != final.name and (old.name.startswith("step-") or old.name.startswith(".tmp-step-")):
                shutil.rmtree(old, ignore_errors=True)
    _barrier(layout)
    return final


def _write_latest(folder: Path, name: str) -> None:
    tmp = folder / f"{LATEST}.tmp"
    with open(tmp, "w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / LATEST)


def latest(folder: str | os.PathLike) -> Path | None:
    """The checkpoint folder DIR/latest points at, or None when there is none yet."""
    folder = Path(folder)
    try:
        name = (folder / LATEST).read_text().strip()
    except OSError:
        return None
    return folder / name if (folder / name).is_dir() else None


def _barrier(layout: Layout) -> None:
    if layout.world > 1:
        dist.barrier(group=layout.group)  # sync: checkpoint time only


@contextlib.contextmanager
def _quiet():
    """DCP warns that it assumes one process when no group exists: that is what we asked for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _metadata(path: Path):
    return dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata


def load(model, folder: str | os.PathLike) -> dict[str, Any]:
    """Load the latest checkpoint of DIR into a zero-wrapped model at any world size, stage and (for records saved
    from a tp() model) tp degree; return extra.pt ({"step", "world_size" (dp), "tp", "stage", "extra"})."""
    path = latest(folder)
    if path is None:
        raise CheckpointError(f"no zero checkpoint in {folder} (no {LATEST} file); start without --resume")
    meta = _metadata(path)
    keys: dict[str, list[str]] = {}
    for k in meta:
        if k.startswith("optim/"):
            name, key = k[len("optim/"):].rsplit("/", 1)
            keys.setdefault(name, []).append(key)
    layout = Layout(model)
    state = sharded_state(model, optim_keys=keys, forms=_forms(model, layout, meta, path), layout=layout)
    with _quiet():
        dcp.load(state, checkpoint_id=str(path), process_group=layout.group if layout.world > 1 else None,
                 no_dist=layout.world == 1)
    for f in model.order:  # replicated scalars were loaded into fresh tensors
        st = model.optimizer.state.get(f.master, {})
        for key, v in list(st.items()):
            name = f"optim/{f.names[0]}/{key}"
            if torch.is_tensor(v) and v.dim() == 0 and name in state:
                st[key] = state[name]
    with torch.no_grad():
        for f in model.flats:
            if f.mixed:
                f.shard.copy_(f.master)
    model.after_step()
    return load_checkpoint(path / "extra.pt")


def _forms(model, layout: Layout, meta, path: Path) -> dict[str, str]:
    """{param name: "flat" | "global"}: the form each parameter was saved in (zero_pieces), checked to fit."""
    forms, bad = {}, []
    for f in model.flats:
        for name, p in zip(f.names, f.params):
            saved = getattr(meta.get(f"model/{name}"), "size", None)
            if saved is None:
                continue
            flat = len(saved) == 1 and p.dim() > 1
            if flat and layout.split(name).dim is not None and layout.n > 1:
                raise CheckpointError(f"checkpoint {path} was saved without tensor parallelism (1-D records), which "
                                      "tp cannot cut; load it with --tp 1, or save it from a tp() model")
            split = layout.split(name)
            want = [p.numel()] if flat else layout.global_shape(p, split)
            if list(saved) != want:
                bad.append(f"{name} {tuple(saved)} vs {tuple(want)}")
            forms[name] = "flat" if flat else "global"
    if bad:
        raise CheckpointError(f"checkpoint {path} does not fit this model (size mismatch {'; '.join(bad[:3])}, "
                              "checkpoint vs model); load it into the model it was saved from")
    return forms


def load_plain(folder_or_step: str | os.PathLike) -> dict[str, dict[str, torch.Tensor]]:
    """One process, no group: {"model": {name: tensor}, "optim": {name: {key: tensor}}}, as saved: 1-D records
    (no tp) or the plain model's shapes (saved from a tp() model); `reshape_like` gives a plain state_dict."""
    path = Path(folder_or_step)
    path = latest(path) or path
    meta = _metadata(path)
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items() if hasattr(m, "size")}
    with _quiet():
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model_sd = {k[len("model/"):]: v for k, v in state.items() if k.startswith("model/")}
    optim: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in state.items():
        if k.startswith("optim/"):
            name, key = k[len("optim/"):].rsplit("/", 1)
            optim.setdefault(name, {})[key] = v
    return {"model": model_sd, "optim": optim}


def reshape_like(module: nn.Module, flat_sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Give each saved 1-D tensor its parameter's shape and add tied aliases: a plain `module.state_dict()`."""
    params = dict(module.named_parameters())
    out = {}
    for k, v in module.state_dict(keep_vars=True).items():
        name = next((n for n, p in params.items() if p is v), k)
        out[k] = flat_sd[name].view(v.shape) if name in flat_sd else v.detach().clone()
    return out


def export(folder_or_step: str | os.PathLike, out_file: str | os.PathLike) -> Path:
    """Stream a sharded checkpoint into one plain torch.save file of {param name: tensor as saved (`load_plain`)},
    tensor by tensor."""
    path = Path(folder_or_step)
    path = latest(path) or path
    meta = _metadata(path)
    out_file = Path(out_file)
    scratch = Path(tempfile.mkdtemp(prefix=".export-", dir=out_file.parent))
    try:
        tensors = {}
        for i, (k, m) in enumerate(meta.items()):
            if not k.startswith("model/") or not hasattr(m, "size"):
                continue
            numel = int(torch.Size(m.size).numel())
            dtype = m.properties.dtype
            backing = scratch / f"{i}.bin"
            t = torch.from_file(str(backing), shared=True, size=numel, dtype=dtype)  # memory-mapped, not resident
            t = t.view(m.size)  # the record's shape: 1-D, or the plain model's (saved from a tp() model)
            with _quiet():
                dcp.load({k: t}, checkpoint_id=str(path), no_dist=True)  # DCP reads only this tensor's pieces
            tensors[k[len("model/"):]] = t
        save_checkpoint(tensors, out_file)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out_file
