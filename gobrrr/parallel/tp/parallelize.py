"""Tensor parallelism applied to an unmodified model: `tp(model, mesh, plan)` (Megatron-style, with SP).

    from gobrrr.models.gpt_plan import GPT_PLAN                # the reference GPT's plan, beside the model
    mesh = make_mesh(tp=2)                                     # (dp, tp) DeviceMesh over all ranks
    model = tp(GPT(cfg).to(device), mesh, GPT_PLAN, sequence_parallel=True)  # shards in place, returns it
    model = ddp(model, group=mesh["dp"].get_group())           # data parallel over the other dimension
    opt = AdamW(model.parameters())                            # after tp(): the parameters are new
    logits, loss = model(x, y)          # logits: (B, T, V/tp), this rank's vocabulary; loss: the full loss
    gobrrr.parallel.clip_grad_norm_(model, 1.0)   # the norm over all shards, each counted once (tensors.py)

A plan is data: a dict from module-name patterns (fnmatch on `named_modules()` names) or module
types to a style; the first matching entry wins. The model's plan lives beside the model, not here
(gobrrr/models/gpt_plan.py is the reference GPT's, as torchtitan keeps one per model); write your
own for your model. Every module that holds parameters (or is a dropout with p > 0) must be matched,
so nothing is replicated by accident. The styles and what they do to the module (n = tp ranks;
the modules they become are layers.py's):

  Colwise(chunks)   out features split: W (out, in) -> rows of each of `chunks` fused parts (a QKV
                    linear has 3: q, k, v); bias split the same way. gather_input: apply f (or
                    SP's all-gather) to the input here; vocab_output: the output is (.., V/n) logits
                    and F.cross_entropy on them runs vocab-parallel (see below).
  Rowwise           in features split: W (out, in/n); its partial output goes through g (or SP's
                    reduce-scatter), then the bias, whole on every rank, is added once.
  VocabEmbedding    rows split by vocabulary; masked lookup, then g (or SP's reduce-scatter).
  ModuleInput       f (or SP's all-gather) on the module's first input: placed at attention/MLP entry
                    so their own reshapes see whole sequences; `heads` names the head-count attribute,
                    divided by n; `sharded_random` names the attribute of its internal dropout
                    probability (SDPA's), whose masks differ across tp ranks (its heads differ).
  Replicate         parameters whole on every rank. seq_dim: with SP, the output is cut to this rank's
                    positions (a position embedding). With SP every replicated parameter is taken to
                    act on this rank's tokens (true of norms, of biases added after a reduce-scatter
                    and of position embeddings), so its gradient is partial: it is all-reduced over tp
                    (a hook, before accumulation, so a ddp wrapper on the dp dimension sees the whole
                    gradient). A replicated parameter used on whole sequences has no place under SP.
  Dropout           masks from the replicated stream where activations are replicated (no SP) and from
                    the sharded stream where they are sharded (SP).

One GPT block, what each tp rank holds (no SP | SP), Shoeybi et al. 2019 fig. 3, Korthikanti et al.
2022 fig. 5:

    x (B,T,C) | (B,T/n,C) -> ln1 -> f | all-gather -> qkv: H/n heads -> attention (B,H/n,T,T)
      -> proj: partial (B,T,C) -> g | reduce-scatter -> + bias -> dropout -> + x
      -> ln2 -> f | all-gather -> fc: (B,T,4C/n) -> gelu -> proj -> g | reduce-scatter -> + bias -> + x
    per block: forward 2 all-reduces | 2 all-gathers + 2 reduce-scatters; backward the same again,
    plus, with SP, one all-reduce per replicated parameter used on the shard (ln weights and biases,
    proj biases: torch's SequenceParallel reduces those one by one too; Megatron coalesces them).

The head and the loss: lm_head (tied to wte: one tensor, the same V/n rows) gives (B, T, V/n)
logits; `F.cross_entropy` called on them (the GPT's own forward does) is intercepted by a
TorchFunctionMode that is active only from lm_head's output to the end of the model's forward,
and runs `vocab_parallel_cross_entropy`: the whole (B, T, V) never exists on any rank. A loss you
compute outside the model needs `with loss_parallel():` (as with torch's loss_parallel).

Random streams (Megatron's RNG tracker): torch's default generator, seeded alike on every rank, is
the *replicated* stream; a second state, seeded with seed + 2718 + tp rank, is the *sharded* one.
Hooks swap the two around modules whose masks must differ across tp ranks; when no dropout is
active nothing is installed. The sharded state is in `tp_state(model).streams` (checkpoint it if
you resume with dropout > 0).

At tp = 1 the same code runs: slices are whole, every collective is skipped, the loss still goes
through vocab_parallel_cross_entropy.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gobrrr.parallel.tp.layers import (
    ColumnParallelLinear,
    RandomStreams,
    RowParallelLinear,
    Split,
    TPError,
    TPState,
    VocabParallelEmbedding,
    shard_tensor,
)
from gobrrr.parallel.tp.ops import TPGroup, seq_chunk
from gobrrr.parallel.wrapper import model_signature

# ---------------------------------------------------------------- styles: the plan's vocabulary

@dataclass(frozen=True)
class Colwise:
    chunks: int = 1
    gather_input: bool = False
    vocab_output: bool = False


@dataclass(frozen=True)
class Rowwise:
    pass


@dataclass(frozen=True)
class VocabEmbedding:
    pass


@dataclass(frozen=True)
class ModuleInput:
    heads: str | None = None
    sharded_random: str | None = None


@dataclass(frozen=True)
class Replicate:
    seq_dim: int | None = None


@dataclass(frozen=True)
class Dropout:
    pass



def tp_state(model: nn.Module) -> TPState | None:
    """The TPState of a model given to `tp()` (also through wrappers such as ddp); None if it was not."""
    for m in model.modules():
        state = m.__dict__.get("_gobrrr_tp")
        if state is not None:
            return state
    return None


# ---------------------------------------------------------------- applying a plan

def _style_for(name: str, module: nn.Module, plan: dict) -> Any:
    for key, style in plan.items():
        if (isinstance(key, str) and fnmatch.fnmatchcase(name, key)) or (isinstance(key, type) and isinstance(module, key)):
            return style
    return None


def _tp_group(mesh_or_group):
    """(ProcessGroup, tp DeviceMesh or None) from a DeviceMesh (its "tp" dimension if named), a group or None."""
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(mesh_or_group, DeviceMesh):
        mesh = mesh_or_group
        names = mesh.mesh_dim_names or ()
        if mesh.ndim > 1:
            if "tp" not in names:
                raise TPError(f"tp: the mesh has dimensions {names}; name one 'tp' (init_device_mesh(..., "
                              "mesh_dim_names=('dp', 'tp'))) or pass its tp sub-mesh")
            mesh = mesh["tp"]
        return mesh.get_group(), mesh
    return mesh_or_group, None


def _check_ranks_agree(model: nn.Module, tpg: TPGroup, sequence_parallel: bool, plan: dict) -> None:
    """Every rank of the world calls tp() with the same tp size, SP flag, plan and model, or all raise."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    mine = {"tp": tpg.size, "sequence_parallel": sequence_parallel, "plan": [(str(k), repr(v)) for k, v in plan.items()],
            "model": model_signature(model)["tensors"]}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)  # sync: once, at tp() time; the settings travel through the host
    odd = [r for r, s in enumerate(every) if s != every[0]]
    if odd:
        diffs = [k for k in mine if every[odd[0]][k] != every[0][k]]
        said = ", ".join(f"rank {r}: tp={every[r]['tp']}, sequence_parallel={every[r]['sequence_parallel']}"
                         for r in [0] + odd[:3])
        raise TPError(f"tp: the ranks disagree on {', '.join(diffs)} ({said}); pass the same --tp, plan and model on "
                      "every rank")


_NEEDS = {Colwise: nn.Linear, Rowwise: nn.Linear, VocabEmbedding: nn.Embedding}


def _validate(model: nn.Module, styles: dict[str, Any], tpg: TPGroup) -> None:
    """Every check before the model is touched, so a bad plan or tp leaves it as it was (the same on all ranks)."""
    n = tpg.size
    missing = [f"{name!r} ({type(m).__name__})" for name, m in model.named_modules()
               if styles[name] is None and (any(True for _ in m.parameters(recurse=False))
                                            or (isinstance(m, nn.Dropout) and m.p > 0))]
    if missing:
        raise TPError(f"tp: the plan does not say how to split {', '.join(missing[:4])}"
                      f"{' and more' if len(missing) > 4 else ''}; add an entry for each (e.g. "
                      f"{{{missing[0].split()[0]}: Replicate()}}) to the plan")
    for name, m in model.named_modules():
        style = styles[name]
        if style is None:
            continue
        if type(style) not in (Colwise, Rowwise, VocabEmbedding, ModuleInput, Replicate, Dropout):
            raise TPError(f"tp: unknown style {style!r} for {name!r}; use Colwise, Rowwise, VocabEmbedding, "
                          "ModuleInput, Replicate or Dropout")
        need = _NEEDS.get(type(style))
        if need is not None and not isinstance(m, need):
            raise TPError(f"tp: {type(style).__name__} on {name!r} needs an {need.__name__}, got {type(m).__name__}; "
                          "fix the plan")
        if isinstance(style, Colwise) and m.out_features % (style.chunks * n):
            per = m.out_features // style.chunks
            raise TPError(f"tp: {name!r} has {m.out_features} out features"
                          + (f" ({style.chunks} fused parts of {per})" if style.chunks > 1 else "")
                          + f", not divisible by tp={n}; choose a tp that divides {per}")
        if isinstance(style, Rowwise) and m.in_features % n:
            raise TPError(f"tp: {name!r} has {m.in_features} in features, not divisible by tp={n}; "
                          f"choose a tp that divides {m.in_features}")
        if isinstance(style, VocabEmbedding) and m.num_embeddings % n:
            raise TPError(f"tp: the vocabulary of {name!r} has {m.num_embeddings} rows, not divisible by tp={n}; "
                          f"pad the vocabulary to a multiple of {n} (e.g. of 128)")
        if isinstance(style, ModuleInput) and style.heads:
            heads = getattr(m, style.heads, None)
            if not isinstance(heads, int):
                raise TPError(f"tp: {name!r} has no integer attribute {style.heads!r} (the head count to divide); "
                              "fix ModuleInput(heads=...) in the plan")
            if heads % n:
                raise TPError(f"tp: {name}.{style.heads} = {heads} heads, not divisible by tp={n}; "
                              f"choose a tp that divides {heads}")



def tp(model: nn.Module, mesh_or_group=None, plan: dict | None = None, sequence_parallel: bool = False) -> nn.Module:
    """Shard `model` in place for tensor parallelism over `mesh_or_group` (default: the world) and return it.

    `plan` says how to split each module (the module docstring); the model's own plan lives beside
    the model (the reference GPT's: gobrrr.models.gpt_plan.GPT_PLAN). Move the model to its device
    first and build the optimizer after.
    """
    if not isinstance(plan, dict):
        got = "no plan" if plan is None else f"plan of type {type(plan).__name__}"
        raise TPError(f"tp: {got} given; pass plan=, a dict of module-name patterns or types to styles "
                      "(for the reference GPT: from gobrrr.models.gpt_plan import GPT_PLAN)")
    group, mesh = _tp_group(mesh_or_group)
    tpg = TPGroup.of(group)
    if model.__dict__.get("_gobrrr_tp") is not None:
        raise TPError("tp: this model is already tensor-parallel; build a fresh model to shard it again")
    if hasattr(model, "no_sync") and isinstance(getattr(model, "module", None), nn.Module):
        raise TPError(f"tp: the model is wrapped in {type(model).__name__}; apply tp() to the bare model first, "
                      "then wrap it (ddp(tp(model, mesh), group=mesh['dp'].get_group()))")
    _check_ranks_agree(model, tpg, sequence_parallel, plan)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    state = TPState(tpg, sequence_parallel, device, mesh=mesh)

    styles = {name: _style_for(name, m, plan) for name, m in model.named_modules()}
    _validate(model, styles, tpg)
    dropout_on = any((isinstance(m, nn.Dropout) and m.p > 0) or (isinstance(styles[n], ModuleInput)
                     and styles[n].sharded_random and getattr(m, styles[n].sharded_random, 0) > 0)
                     for n, m in model.named_modules())
    if dropout_on:
        state.streams = RandomStreams(device, torch.initial_seed() + 2718 + tpg.rank)

    memo: dict[int, tuple[Split, nn.Parameter]] = {}  # id(original parameter) -> its shard (tied weights: once)

    def shard_param(p: nn.Parameter | None, split: Split, what: str) -> nn.Parameter | None:
        if p is None:
            return None
        if id(p) in memo:
            if memo[id(p)][0] != split:
                raise TPError(f"tp: {what} is tied to another parameter that the plan splits as {memo[id(p)][0]}, "
                              f"but here as {split}; split tied weights the same way")
            return memo[id(p)][1]
        new = nn.Parameter(shard_tensor(p, split, tpg, what), requires_grad=p.requires_grad)
        memo[id(p)] = (split, new)
        return new

    def replace(name: str, new: nn.Module) -> None:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)

    for name, m in list(model.named_modules()):
        style = styles[name]
        if isinstance(style, Colwise):
            split = Split(0, style.chunks)
            w = shard_param(m.weight, split, f"{name}.weight (out features)")
            b = shard_param(m.bias, split, f"{name}.bias")
            start = tpg.rank * m.out_features // tpg.size if style.vocab_output else None
            replace(name, ColumnParallelLinear(w, b, state, style.gather_input, start))
        elif isinstance(style, Rowwise):
            w = shard_param(m.weight, Split(1), f"{name}.weight (in features)")
            b = shard_param(m.bias, Split(None), f"{name}.bias")
            replace(name, RowParallelLinear(w, b, state))
        elif isinstance(style, VocabEmbedding):
            w = shard_param(m.weight, Split(0), f"{name}.weight (vocabulary)")
            replace(name, VocabParallelEmbedding(w, tpg.rank * m.num_embeddings // tpg.size, state))
        elif isinstance(style, ModuleInput):
            state.inputs.add(name)
            m.register_forward_pre_hook(lambda mod, args: (state.enter(args[0]), *args[1:]))
            if style.heads:
                setattr(m, style.heads, getattr(m, style.heads) // tpg.size)
            if state.streams and style.sharded_random and getattr(m, style.sharded_random, 0) > 0:
                state.streams.hooks(m, "sharded")
        elif isinstance(style, Replicate):
            if sequence_parallel and style.seq_dim is not None:
                dim = style.seq_dim
                m.register_forward_hook(lambda mod, args, out, dim=dim: seq_chunk(out, tpg, dim))
        elif isinstance(style, Dropout):
            if state.streams and isinstance(m, nn.Dropout) and m.p > 0:
                state.streams.hooks(m, "sharded" if sequence_parallel else "replicated")

    split_of = {id(new): split for split, new in memo.values()}
    for name, p in model.named_parameters(remove_duplicate=False):
        state.splits[name] = split_of.get(id(p), Split(None))
        if sequence_parallel and tpg.size > 1 and state.splits[name].dim is None and p.requires_grad:
            # used on this rank's tokens only: the gradient is a partial sum over tp ranks
            p.register_hook(lambda g: reduce_grad(g, tpg))
    model.register_forward_pre_hook(state._root_pre)
    model.register_forward_hook(state._root_post, always_call=True)
    model._gobrrr_tp = state
    return model


def reduce_grad(g: torch.Tensor, tpg: TPGroup) -> torch.Tensor:
    from gobrrr.comm import collectives as comm

    g = g.contiguous().clone()
    comm.all_reduce(g, "sum", group=tpg.group)
    return g
