"""What every data-parallel wrapper shares: NaiveDDP and DDP (ddp.py), the ZeRO stages (zero/).

  wrap time     `check_same_model`: every rank gathers every rank's model signature (name, shape,
                dtype and requires_grad of each parameter and buffer, plus the wrapper's settings)
                and all raise on the first difference, naming it; `broadcast_from_rank0` then makes
                rank 0's weights everyone's (ddp.py's phase 0).
  forward       a pass-through that notes whether this iteration communicates (not inside `no_sync()`).
  backward      a wrapper registers post-accumulate-grad hooks through `weak_grad_hook` (the hook holds
                the wrapper weakly, so a dropped wrapper is freed) and queues its `_end_backward` with
                the autograd engine on the first hook of an iteration.
  failures      `_explain` turns a backend's bare error into gobrrr.comm's, naming the ranks that left;
                `_no_gradient_error` names the parameters that got no gradient (instead of a hang).

At world size 1 (no process group) every check and broadcast is a no-op; the wrappers run the same path.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

# ---------------------------------------------------------------- group helpers

def _group_size(group) -> int:
    """World size of `group`; 1 when torch.distributed is not initialised (one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _group_src(group) -> int:
    """Global rank of the group's rank 0 (the broadcast source)."""
    return 0 if group is None else dist.get_global_rank(group, 0)


# ---------------------------------------------------------------- wrap-time checks

def model_signature(module: nn.Module, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """What must be identical on every rank: tensors (kind, name, shape, dtype, requires_grad) and settings."""
    tensors = [("parameter", n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in module.named_parameters()]
    tensors += [("buffer", n, tuple(b.shape), str(b.dtype), False) for n, b in module.named_buffers()]
    return {"settings": dict(settings or {}), "tensors": tensors}


def signature_difference(ref: dict[str, Any], other: dict[str, Any]) -> str | None:
    """The first difference between two signatures, in words (rank 0's side first), or None."""
    if ref["settings"] != other["settings"]:
        return f"wrapper settings differ: {ref['settings']} on rank 0 vs {other['settings']}"
    a = {(t[0], t[1]): t for t in ref["tensors"]}
    b = {(t[0], t[1]): t for t in other["tensors"]}
    for key in a:
        if key not in b:
            return f"{key[0]} {key[1]!r} exists on rank 0 but not on this rank"
    for key in b:
        if key not in a:
            return f"{key[0]} {key[1]!r} exists on this rank but not on rank 0"
    for key, ta in a.items():
        tb = b[key]
        for what, i in (("shape", 2), ("dtype", 3), ("requires_grad", 4)):
            if ta[i] != tb[i]:
                return f"{key[0]} {key[1]!r} has {what} {ta[i]} on rank 0 but {tb[i]} on this rank"
    if [t[:2] for t in ref["tensors"]] != [t[:2] for t in other["tensors"]]:
        return "the same parameters are registered in a different order"
    return None


def check_same_model(module: nn.Module, group=None, settings: dict[str, Any] | None = None) -> None:
    """Raise on every rank if any rank's model (or wrapper settings) differs from rank 0's."""
    world = _group_size(group)
    if world == 1:
        return
    mine = model_signature(module, settings)
    sigs: list[Any] = [None] * world
    dist.all_gather_object(sigs, mine, group=group)  # sync: wrap time only; the signatures travel through the host
    problems = []
    for r in range(1, world):
        diff = signature_difference(sigs[0], sigs[r])
        if diff is not None:
            problems.append(f"rank {r}: " + diff.replace("this rank", f"rank {r}"))
    if problems:
        raise RuntimeError("data parallel wrap: the ranks hold different models; " + "; ".join(problems)
                           + ". Build the same model (same code, config and freezing) on every rank before wrapping it.")


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module, group=None) -> None:
    """Copy rank 0's parameters and buffers to every rank (a no-op at world size 1)."""
    if _group_size(group) == 1:
        return
    src = _group_src(group)
    for t in [*module.parameters(), *module.buffers()]:
        t = t.detach()
        if t.dtype == torch.bool:  # not every backend reduces bools; bytes are bytes
            t = t.view(torch.uint8)
        dist.broadcast(t, src=src, group=group)


# ---------------------------------------------------------------- shared wrapper mechanics

def weak_grad_hook(owner: Any, call: Callable[[Any], None]) -> Callable[[torch.Tensor], None]:
    """A parameter's gradient hook that runs `call(owner)` while `owner` lives, holding it weakly.

    A parameter keeps its hooks in C++, where Python's garbage collector cannot follow them: a hook
    that held the wrapper (or a bucket listing the parameters) would close the loop wrapper ->
    model -> parameter -> hook -> wrapper out of the collector's sight, and a dropped wrapper, its
    model and its gradient buffers would stay allocated for the life of the process. So `call`
    gets the owner through a weak reference and must itself capture only plain values (indices).
    """
    ref = weakref.ref(owner)

    def hook(_param: torch.Tensor) -> None:
        live = ref()
        if live is not None:
            call(live)

    return hook


class _DataParallel(nn.Module):
    """What both versions share: wrap-time checks, forward pass-through, no_sync, hook plumbing."""

    def __init__(self, module: nn.Module, group, settings: dict[str, Any], force_communication: bool = False):
        super().__init__()
        self.module = module
        self.group = group
        self.world_size = _group_size(group)
        # world size 1: the same path, the collective a no-op (tests force it to exercise NCCL on one GPU)
        self._communicate = self.world_size > 1 or force_communication
        if self.world_size > 1 and "nccl" in str(dist.get_backend(group)):
            on_cpu = [n for n, p in module.named_parameters() if not p.is_cuda]
            if on_cpu:
                raise ValueError(f"data parallel wrap: NCCL reduces GPU tensors but {on_cpu[:3]} are on the CPU; "
                                 "move the model to its GPU (model.to(rank.device)) before wrapping it.")
        check_same_model(module, group, settings)
        broadcast_from_rank0(module, group)
        self._no_sync = False            # inside a no_sync() block right now
        self._forward_no_sync = False    # the last forward ran inside no_sync()
        self._callback_queued = False
        self.reductions = 0              # gradient collectives launched (no-ops included at world size 1)
        self._hooks: list[Any] = []

    def forward(self, *args, **kwargs):
        if self._callback_queued:  # the last backward died before its end (an exception): start clean
            self._callback_queued = False
            self._reset_iteration()
        self._forward_no_sync = self._no_sync
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip gradient communication for backwards in this block: gradients accumulate locally."""
        before = self._no_sync
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = before

    def _syncing(self) -> bool:
        return not (self._no_sync or self._forward_no_sync)

    def _queue_end_of_backward(self) -> None:
        """On the first hook of a communicating backward: run `_end_backward` when the engine is done."""
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self) -> None:
        raise NotImplementedError

    def _reset_iteration(self) -> None:
        raise NotImplementedError

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def _explain(exc: BaseException, group, what: str) -> BaseException:
    """The backend's bare error ("Connection closed by peer") as gobrrr.comm's, naming the ranks that left.

    Our all-reduces are not counted as gobrrr.comm collectives, so the message uses the group's
    current count; what matters is the part about who died or raised."""
    from gobrrr.comm import debug as _debug

    try:
        watch = _debug.watch_for(group)
    except RuntimeError:  # no gobrrr.comm group: nothing to ask
        return exc
    return _debug.explain_failure(watch, watch.seq, what, exc)


def _no_gradient_error(names: list[str]) -> RuntimeError:
    return RuntimeError(
        f"data parallel: {len(names)} parameter(s) got no gradient in this backward: {names}. Every rank waits "
        "for all gradients before averaging, so this would hang; make them take part in the loss, or set "
        "requires_grad=False on them before wrapping the model.")
