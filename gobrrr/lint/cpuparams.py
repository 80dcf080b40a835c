"""CPU parameters that receive CUDA gradients: the `backward()` calls that copy a gradient to the host.

A trainer object (not itself a module, so nothing moves it whole) keeps a learnable scalar on the host,
`self.log_alpha = Scalar(0.0)` with `Scalar.__init__` making `nn.Parameter(torch.tensor(init_value))`, or
`self.log_alpha = torch.tensor(0.0, requires_grad=True)`, and never moves it. A 0-dim CPU tensor mixes with
CUDA tensors without an error, so `alpha = self.log_alpha().exp()` enters losses computed on the GPU; each
`loss.backward()` through it copies the scalar's CUDA gradient to the host, blocking, every step (CORL's CQL
and Cal-QL temperature and Lagrange multiplier; SAC ports that forget `device=`).

Which losses carry the scalar is read from the class's own methods, flow-insensitively: a name assigned from
an expression that uses `self.<scalar>` (not under `.detach()`, `.item()` or `torch.no_grad()`), a name
assigned from such a name, and the items of `a, b = self._helper(...)` that the helper returns from such
names (its parameters carrying them when the call passes carried names). Cached per class.
"""
from __future__ import annotations

import ast

from gobrrr.lint.source import DEFS, Source

_CUT = {"detach", "item", "tolist", "numpy", "cpu", "detach_", "data"}


def cpu_grad_backwards(project, src: Source, cls: ast.ClassDef) -> set[int]:
    """ids of the `x.backward()` calls in `cls`'s methods whose x carries a CPU scalar parameter."""
    cache = project.per_file.setdefault(id(src), {}).setdefault("cpu_grad", {})
    if id(cls) not in cache:
        cache[id(cls)] = _backwards(project, src, cls)
    return cache[id(cls)]


def _backwards(project, src: Source, cls: ast.ClassDef) -> set[int]:
    if any("Module" in ast.unparse(b) for b in cls.bases):
        return set()   # a module: `.to(device)` of the owner moves its parameters too
    scalars = _host_scalars(project, src, cls)
    if not scalars:
        return set()
    methods = {d.name: d for d in cls.body if isinstance(d, DEFS)}
    walk = _Taint(scalars, methods)
    out: set[int] = set()
    for fn in methods.values():
        names = walk.names(fn, frozenset())
        for n in ast.walk(fn):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward" \
                    and walk.carries(n.func.value, names):
                out.add(id(n))
    return out


def _host_scalars(project, src: Source, cls: ast.ClassDef) -> set[str]:
    """`self.x` attributes set to a host 0-dim learnable scalar and never moved anywhere in the file."""
    found: set[str] = set()
    for n in ast.walk(cls):
        if not isinstance(n, ast.Assign) or not isinstance(n.value, ast.Call):
            continue
        for t in n.targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                    and (_host_leaf(n.value) or _scalar_module(project, src, n.value)):
                found.add(t.attr)
    moved = {t.attr for n in src.nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in ("to", "cuda", "to_empty") for t in [n.func.value]
             if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return found - moved - _moved_in_lists(cls)


def _moved_in_lists(cls: ast.ClassDef) -> set[str]:
    """`self.x` kept in a list the class moves item by item: `modules = [self.policy, ...];
    modules.append(self.log_alpha); return modules` and `for module in self.modules: module.to(device)`
    (young-geng's SimpleSAC)."""
    movers = [n for n in ast.walk(cls) if isinstance(n, ast.For) and isinstance(n.target, ast.Name) and any(
        isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in ("to", "cuda")
        and isinstance(c.func.value, ast.Name) and c.func.value.id == n.target.id for c in ast.walk(n))]
    if not movers:
        return set()
    listed = [e for n in ast.walk(cls) for e in (n.elts if isinstance(n, (ast.List, ast.Tuple)) else n.args
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append" else ())]
    return {e.attr for e in listed if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self"}


def _host_scalar(call: ast.AST) -> bool:
    """`torch.tensor(x)` of one value that is no list: a 0-dim tensor, on the host (no `device=`)."""
    return isinstance(call, ast.Call) and ast.unparse(call.func) == "torch.tensor" and len(call.args) == 1 \
        and not isinstance(call.args[0], (ast.List, ast.Tuple, ast.ListComp)) \
        and not any(k.arg == "device" for k in call.keywords)


def _host_leaf(call: ast.Call) -> bool:
    """`torch.tensor(0.0, requires_grad=True)` (a 0-dim leaf, no device)."""
    grad = next((k.value for k in call.keywords if k.arg == "requires_grad"), None)
    return _host_scalar(call) and isinstance(grad, ast.Constant) and grad.value is True


def _scalar_module(project, src: Source, call: ast.Call) -> bool:
    """`Scalar(0.0)`: a project module whose __init__ makes only 0-dim host parameters
    (`nn.Parameter(torch.tensor(init_value))`)."""
    hit = project.class_of(src, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
    init = project.method(*hit, "__init__") if hit is not None else None
    if init is None:
        return False
    params = [n for n in ast.walk(init[1]) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("Parameter")]
    return bool(params) and all(p.args and _host_scalar(p.args[0]) for p in params)


class _Taint:
    """Which names of a method carry the scalars (see the module doc)."""

    def __init__(self, scalars: set[str], methods: dict[str, ast.AST]):
        self.scalars, self.methods = scalars, methods
        self.memo: dict = {}

    def carries(self, e: ast.AST, names: set[str]) -> bool:
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in _CUT:
            return False
        if isinstance(e, ast.Attribute) and e.attr in _CUT:
            return False
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self" \
                and e.attr in self.scalars:
            return True
        if isinstance(e, ast.Name):
            return e.id in names
        if isinstance(e, ast.Call) and self._called(e) is not None:
            return any(self.returns(e, names))
        return any(self.carries(c, names) for c in ast.iter_child_nodes(e))

    def _called(self, call: ast.Call):
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
            return self.methods.get(f.attr)
        return None

    def returns(self, call: ast.Call, names: set[str]) -> tuple[bool, ...]:
        """Per returned item (one item for a plain return): does `self.m(...)` hand back a carrier."""
        fn = self._called(call)
        params = [a.arg for a in fn.args.args[1:]]
        pairs = [*zip(params, call.args), *((k.arg, k.value) for k in call.keywords if k.arg)]
        given = frozenset(p for p, a in pairs if not isinstance(a, ast.Starred) and self.carries(a, names))
        key = (id(fn), given)
        if key in self.memo:
            return self.memo[key] or (False,)
        self.memo[key] = None   # a recursive call learns nothing
        inner = self.names(fn, given)
        out: list[bool] = []
        for r in ast.walk(fn):
            if isinstance(r, ast.Return) and r.value is not None:
                items = r.value.elts if isinstance(r.value, ast.Tuple) else [r.value]
                got = [self.carries(i, inner) for i in items]
                out = got if not out else [a or b for a, b in zip(out, got)] if len(out) == len(got) else out
        self.memo[key] = tuple(out) or (False,)
        return self.memo[key]

    def names(self, fn: ast.AST, given: frozenset) -> set[str]:
        names = set(given)
        quiet = {id(s) for w in ast.walk(fn) if isinstance(w, ast.With)
                 and any("no_grad" in ast.unparse(i.context_expr) for i in w.items) for s in ast.walk(w)}
        assigns = sorted((n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AugAssign))
                          and id(n) not in quiet), key=lambda n: n.lineno)
        for _ in range(2):   # twice: a loop assigns a name before the line that reads it
            for n in assigns:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Call) and self._called(n.value) is not None:
                        got = self.returns(n.value, names)
                        for e, c in zip(t.elts, got if len(got) == len(t.elts) else [any(got)] * len(t.elts)):
                            if c and isinstance(e, ast.Name):
                                names.add(e.id)
                    elif self.carries(n.value, names):
                        names |= {e.id for e in ast.walk(t) if isinstance(e, ast.Name)}
        return names


__all__ = ["cpu_grad_backwards"]
