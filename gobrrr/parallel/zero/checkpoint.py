"""ZeRO checkpoints: the sharded records of the shared format, through torch.distributed.checkpoint (DCP).

    state = state_for_save(model)                        # records: views of this rank's master shards
    dcp.save(state, checkpoint_id=path)                  # every rank writes its pieces (or: save(model, path))
    state, after = state_for_load(model, metadata)       # at any world size, stage and tp degree
    dcp.load(state, checkpoint_id=path); after()         # (or: load(model, path))

What is saved is the format every gobrrr checkpoint shares (gobrrr.parallel.tp.checkpoint): every
parameter and every optimizer-state tensor in the plain model's shape (the fp32 master values, not the
bf16 compute copy), and each rank writes only its own pieces of it:

    parameter w (3, 4), N = 3, S = 4:   flat  [ w w w w | w w w w | w w w w ]
    saved as "model/w" (3, 4):          rank 0 writes row 0, rank 1 row 1, rank 2 row 2
                                        (a range that is not whole rows becomes several boxes)

Those pieces travel as `ShardedTensor`s with explicit offsets (pieces.py), so DCP's planner can hand
any other layout (another world size, another stage, the naive stage 1, a plain or a tp() model, or
one process with no group at all) exactly the elements it owns: resharding is DCP's job, not ours.
Under ZeRO over the dp ranks of a tp() model, every dp x tp rank writes its pieces as boxes of the
plain tensor. Records written 1-D by gobrrr 0.1 (no tp) still load, at tp = 1.

Keys: "model/<param name>", "optim/<param name>/<state key>" (exp_avg, exp_avg_sq, step, ...).
Tied parameters are stored once under their first name. Buffers and the frozen parameters stages 1-2
leave whole are plain tensors (DCP deduplicates replicated tensors; stage 3, which shards frozen
parameters, reads them as records).

Files and folders (atomic writes, a `latest` pointer, the trainer's own state) are the caller's:
gobrrr.train.checkpoints. `save`/`load` here write and read one DCP folder, not atomically.
`load_plain(path)` reads one in a single process as {name: tensor}; `reshape_like` makes a plain
state_dict of it.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from gobrrr.parallel.tp.checkpoint import CheckpointFitError, quiet
from gobrrr.parallel.zero.pieces import Layout, record
from gobrrr.parallel.zero.shard import all_gather_flat

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


# ---------------------------------------------------------------- sharded, layout-free records

def sharded_state(model, saved=None, layout: Layout | None = None) -> dict[str, Any]:
    """{"model/<name>": my master pieces as one record, "optim/<name>/<key>": ...} (views: saving reads, loading
    writes straight into the shards). `saved` (loading): the checkpoint's state_dict_metadata, which says which
    optimizer state to create and in which form each record was saved (pieces.py)."""
    layout = layout or Layout(model)
    loading = saved is not None
    forms = _forms(model, layout, saved) if loading else {}
    out: dict[str, Any] = {}
    opt = model.optimizer
    for f in model.flats:
        src = f.master if f.master is not None else f.shard
        st = opt.state.get(f.master, {}) if f.trainable else {}
        if loading and f.trainable:
            st = opt.state.setdefault(f.master, {})
            group = opt.param_groups[f.group]
            on_device = group.get("fused") or group.get("capturable")  # their step counters live on the device
            prefix = f"optim/{f.names[0]}/"
            for key in (k[len(prefix):] for k in saved if k.startswith(prefix)):
                if key not in st:
                    st[key] = (torch.zeros_like(f.master) if key != "step" else
                               torch.zeros((), dtype=torch.float32, device=f.master.device if on_device else "cpu"))
        owned = {i for i, _, _ in f.owned_ranges()}
        for i, name in enumerate(f.names):
            form = forms.get(name, "global")
            out[f"model/{name}"] = record(layout, f, i, src if i in owned else None, form, loading)
            for key, v in st.items():
                if torch.is_tensor(v) and v.dim() == 1:
                    out[f"optim/{name}/{key}"] = record(layout, f, i, v if i in owned else None, form, loading)
                elif torch.is_tensor(v):
                    out[f"optim/{name}/{key}"] = v  # replicated scalar (Adam's step)
    sharded = {id(p) for f in model.flats for p in f.params}
    for k, v in model.module.state_dict(keep_vars=True).items():
        if id(v) not in sharded:  # buffers, and frozen parameters stages 1-2 leave whole: replicated
            size = getattr((saved or {}).get(f"model/{k}"), "size", None)
            flat = size is not None and len(size) == 1 and v.dim() != 1  # a 1-D record of gobrrr 0.1
            out[f"model/{k}"] = v.detach().view(-1) if flat else v.detach()
    return out


def state_for_save(model) -> dict[str, Any]:
    """The records of a zero-wrapped model (all ranks; under tp, every dp x tp rank) for dcp.save."""
    return sharded_state(model)


def state_for_load(model, saved) -> tuple[dict[str, Any], Callable[[], None]]:
    """(records to dcp.load into, what to call after) for a zero-wrapped model at any world size, stage and (for
    records in the plain shape) tp degree; `saved` is the checkpoint's state_dict_metadata."""
    state = sharded_state(model, saved)

    def after() -> None:
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
        model.after_step()  # stages 1-2 re-gather the compute parameters

    return state, after


def _group(model):
    layout = Layout(model)
    return layout.group if layout.world > 1 else None, layout.world == 1


def save(model, path: str | os.PathLike) -> None:
    """Write the records of a zero-wrapped model into the folder `path` (every rank calls it; not atomic)."""
    group, alone = _group(model)
    with quiet():
        dcp.save(state_for_save(model), checkpoint_id=str(path), process_group=group, no_dist=alone)


def load(model, path: str | os.PathLike) -> None:
    """Read the folder `path` (records of any layout) into a zero-wrapped model (every rank calls it)."""
    state, after = state_for_load(model, metadata(path))
    group, alone = _group(model)
    with quiet():
        dcp.load(state, checkpoint_id=str(path), process_group=group, no_dist=alone)
    after()


def metadata(path: str | os.PathLike):
    """The checkpoint's {key: metadata} (sizes, dtypes), read from its .metadata file."""
    return dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata


def _forms(model, layout: Layout, saved) -> dict[str, str]:
    """{param name: "flat" | "global"}: the form each parameter was saved in (pieces.py), checked to fit."""
    forms, bad = {}, []
    for f in model.flats:
        for name, p in zip(f.names, f.params):
            size = getattr(saved.get(f"model/{name}"), "size", None)
            if size is None:
                continue
            flat = len(size) == 1 and p.dim() > 1
            split = layout.split(name)
            if flat and split.dim is not None and layout.n > 1:
                raise CheckpointFitError("the checkpoint was saved 1-D, without tensor parallelism (gobrrr 0.1), "
                                         "which tp cannot cut; load it into a model without tp")
            want = [p.numel()] if flat else layout.global_shape(p, split)
            if list(size) != want:
                bad.append(f"{name} {tuple(size)} vs {tuple(want)}")
            forms[name] = "flat" if flat else "global"
    if bad:
        raise CheckpointFitError(f"the checkpoint does not fit this model (size mismatch {'; '.join(bad[:3])}, "
                                 "checkpoint vs model); load it into the model it was saved from")
    return forms


def load_plain(path: str | os.PathLike) -> dict[str, dict[str, torch.Tensor]]:
    """One process, no group: {"model": {name: tensor}, "optim": {name: {key: tensor}}}, as saved (the plain
    model's shapes; 1-D for gobrrr 0.1's records without tp); `reshape_like` gives a plain state_dict."""
    meta = metadata(path)
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items() if hasattr(m, "size")}
    with quiet():
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    model_sd = {k[len("model/"):]: v for k, v in state.items() if k.startswith("model/")}
    optim: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in state.items():
        if k.startswith("optim/"):
            name, key = k[len("optim/"):].rsplit("/", 1)
            optim.setdefault(name, {})[key] = v
    return {"model": model_sd, "optim": optim}


def reshape_like(module: nn.Module, saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Give each saved tensor its parameter's shape and add tied aliases: a plain `module.state_dict()`."""
    params = dict(module.named_parameters())
    out = {}
    for k, v in module.state_dict(keep_vars=True).items():
        name = next((n for n, p in params.items() if p is v), k)
        out[k] = saved[name].view(v.shape) if name in saved else v.detach().clone()
    return out
