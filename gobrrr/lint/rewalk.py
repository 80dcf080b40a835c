"""When the lint walks a def it has walked before (check.check_sources' queue of hot calls).

Each def is walked once, with the kinds its first call hands it, unless a later call tells more:

    fewer_constants  another call passes other constants (`f(x)`, then `f(x, action)`): walk it again with only
                     the constants both share, so a branch on `action is None` is taken both ways
    retyping         a def first walked with unknown parameters is called with device tensors ('dev'), a
                     loader's batch ('batch') or a host tensor it copies up itself ('host'), or first walked
                     with device tensors is called with nothing known in any of them ('untyped': an untyped
                     caller's copies up may be real): walked again, once for each reason
    types_more       a hook (a forward, a step) first walked with kinds guessed from its parameter names is
                     handed device tensors where the names said nothing, or host arrays where they guessed
                     device tensors: walked again once
"""
from __future__ import annotations

import ast
from functools import lru_cache

from gobrrr.lint.names import BATCHES, GIVEN, TENSORISH
from gobrrr.lint.scopes import HOOK_NAMES

_DEVICE = TENSORISH | {"tlist"}   # a parameter handed device tensors, or a list or dict of them (a batch moved key by key)
_HOST = {"host", "pinned", "numpy", "hlist"}   # a parameter handed host data (a helper's `.cuda()` of it copies up)
_WRAPS = {"Variable", "from_numpy", "as_tensor", "tensor", "Tensor", "FloatTensor", "LongTensor"}   # f(x): x's data
_RECASTS = {"float", "long", "int", "double", "half", "contiguous", "detach"}   # x.float(): x's data


def fewer_constants(old: dict, kinds: dict) -> dict | None:
    """The constants two calls of a def agree on, if fewer than the walk used (`f(x)` then `f(x,
    action)`: the branch on `action is None` goes both ways); None if the walk already covers it."""
    shared = {k: v for k, v in old.items() if kinds.get(k, v if v == GIVEN else None) == v}   # (a value handed
    return shared if shared != old else None   # before, nothing known now: no second walk; None handed now: one)


def _typed_now(old: dict | None, kinds: dict, typed: set[str]) -> bool:
    """A def first walked with unknown parameters (`get_pos_mask` reached from an untyped `forward`)
    is now called with device tensors, or a loader's batch, in them (`forward_backward(batch, cond)` reached
    first from the module's untyped walk of `run_step`, then from `run_step` called with `next(self.data)`)."""
    return old is not None and any(v in typed and old.get(k) not in typed for k, v in kinds.items() if "#" not in k)


def retyping(fn: ast.AST, old: dict | None, kinds: dict) -> set[tuple[int, str]]:
    """Why a def walked before is walked again: ('dev') a call hands it device tensors, ('batch') a loader's
    batch, ('host') a host tensor in a parameter its body copies up itself (DHCN's `trans_to_cuda(variable)`:
    `variable.cuda()`, first reached with an unknown `self.adjacency`), where its last walk had none; ('untyped')
    a call says nothing of any parameter its last walk had device tensors in; each at most once per def."""
    key = id(fn)
    found = {(key, tag) for tag, typed in (("dev", _DEVICE), ("batch", BATCHES)) if _typed_now(old, kinds, typed)}
    if _typed_now(old, {k: v for k, v in kinds.items() if k in _copied_up(fn)}, _HOST):
        found.add((key, "host"))
    was = [k for k, v in (old or {}).items() if "#" not in k and v in _DEVICE]
    if was and all(kinds.get(k) is None for k in was):
        found.add((key, "untyped"))   # mbrl's `_get_model_input(obs, action)`: a model env's device action, then a
    return found                   # trainer's batch of arrays, whose `to_tensor(action).to(device)` copies up


@lru_cache(maxsize=4096)
def _copied_up(fn: ast.AST) -> frozenset[str]:
    """The names the def's own body moves with `.cuda()` or `.to(...)`: `return variable.cuda()`, or through a
    wrapper or a cast, `Variable(tensor).cuda()` (JT-VAE's create_var), `torch.from_numpy(x).float().cuda()`
    (walked once per def, not once per call that reaches it)."""
    return frozenset(name for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr in ("cuda", "to") and (name := _data_name(n.func.value)) is not None)


def _data_name(e: ast.AST) -> str | None:
    """The name whose data `e` is: `x`, `Variable(x)`, `torch.from_numpy(x)`, `x.float()`; None for anything else."""
    while isinstance(e, ast.Call):
        f = e.func
        if isinstance(f, ast.Attribute) and f.attr in _RECASTS and not e.args:
            e = f.value
        elif (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) in _WRAPS \
                and len(e.args) == 1:
            e = e.args[0]
        else:
            return None
    return e.id if isinstance(e, ast.Name) else None


def types_more(fn, kinds: dict) -> bool:
    """A call hands a hook device tensors in parameters that its names alone leave unknown
    (`forward(self, results, outputs, orig_target_sizes, max_target_sizes)`), or host arrays where its names
    guess device tensors (`self.actor(obs, ...)` with numpy `obs`: the forward's own `check(obs).to(dev)`), or a
    loader's batch that the hook moves itself."""
    return any(v in _DEVICE and k not in HOOK_NAMES or v in ("numpy", "host", "hlist") or v in BATCHES
               for k, v in kinds.items() if "#" not in k)   # a loader's batch: `concatenated_forward(model, batch)`


__all__ = ["fewer_constants", "retyping", "types_more"]
