"""Syncs that happen inside torch (or between ranks) because of one line of the user's code.

    GB012  a barrier every step: `dist.barrier()`, `accelerator.wait_for_everyone()`: every rank
           waits for the slowest, and NCCL's barrier waits for the device too
    GB013  a sync inside torch the line causes:
             a torch.distributions object built with argument validation on (the default): its
             constructor checks each parameter's constraint with `.all()` read on the host, and
             `log_prob` checks the sample the same way. `validate_args=False` (or once,
             `torch.distributions.Distribution.set_default_validate_args(False)`) removes them.
             Also a project subclass of one (`class CategoricalMasked(Categorical)`), and
             `d.log_prob(x)` of a name bound to such a distribution, or to a project def's call that
             returns one (`policy = self._get_policy(obs)`, `out = self.actor(obs)`); one behind a class
             alias, in a list, or as the base of a TransformedDistribution subclass (dists.py).
             `torch.normal(mean, std)` with a tensor std: torch checks `std >= 0` on the host; so
             does `d.sample()` of a Normal of device tensors (it calls torch.normal; rsample does not).
             `loss.backward()` through a 0-dim CPU parameter a trainer object never moved (cpuparams.py):
             autograd copies its CUDA gradient to the host.

A mixin of rules.Checker: it relies on `kind()`, `looping()`, `flag()`, `project_flags`, `project`,
`src`, `scopes`, `lookup()`.
"""
from __future__ import annotations

import ast

from gobrrr.lint.bindings import assigned_calls, own_statements
from gobrrr.lint.cpuparams import cpu_grad_backwards
from gobrrr.lint.dists import dist_aliases, qualified, wrapped_dist
from gobrrr.lint.loops import name_of
from gobrrr.lint.names import TENSORISH
from gobrrr.lint.source import DEFS

_BARRIERS = ("torch.distributed.barrier", "dist.barrier", "wait_for_everyone", "xm.rendezvous",
             "torch_xla.core.xla_model.rendezvous")


# wrappers with no parameters of their own to check: Independent(base, 1) validates nothing when built (the base
# distribution inside it, built elsewhere, does)
_NO_ARGS_CHECKED = {"Independent", "MixtureSameFamily"}


class InsideRules:
    """GB012 and GB013 on calls."""

    def inside_rules(self, node: ast.Call, func, name: str, method, kw) -> None:
        if any(name == b or name.endswith("." + b) for b in _BARRIERS) or method == "wait_for_everyone":
            self.flag(node, "GB012", what=f"`{ast.unparse(func)}()`")
            return
        dist = self.validated_dist(node, name, kw)
        if dist:
            self.flag(node, "GB013", what=f"`{dist}(...)` built with argument validation on", fix=_FIX)
            return
        if method == "backward" and self.defs \
                and (cls := self.src.owner.get(id(self.defs[-1]))) is not None \
                and id(node) in cpu_grad_backwards(self.project, self.src, cls):
            self.flag(node, "GB013", what="`backward()` through a CPU parameter (a 0-dim learnable scalar never moved to "
                                          "the device): autograd copies its CUDA gradient to the host",
                      fix="create the scalar on the device (`Scalar(0.0).to(device)`, `torch.tensor(0.0, device=device, "
                          "requires_grad=True)`) so its gradient stays there")
            return
        if method == "log_prob" and (self.bound_to(func.value, _DIST, self.dist_attrs)
                                     or any(v for _, v in self.returned_dists(func.value))):
            self.flag(node, "GB013", what="`log_prob()` of a distribution built with argument validation on "
                                          "(the sample is checked on the host)", fix=_FIX)
            return
        if method == "sample" and (self.bound_to(func.value, _NORMAL, self.normal_attrs)
                                   or any(d == "Normal" for d, _ in self.returned_dists(func.value))):
            self.flag(node, "GB013", what="`Normal.sample()` (torch.normal with a tensor std checks std >= 0 on the host)",
                      fix="draw with .rsample() (loc + scale * randn), which checks nothing on the host")
            return
        if name == "torch.normal":
            std = kw.get("std", node.args[1] if len(node.args) > 1 else None)
            if std is not None and self.kind(std) in TENSORISH:
                self.flag(node, "GB013", what="`torch.normal(mean, std)` with a tensor std",
                          fix="sample as mean + std * torch.randn_like(std): torch.normal checks std >= 0 "
                              "on the host before it samples")

    def validated_dist(self, node: ast.Call, name: str, kw) -> str | None:
        """The class name when this call builds a torch distribution (or a project subclass of one)
        from device tensors with argument validation on, else None."""
        return None if self.validation_off(kw) else self.device_dist(node, name, kw)

    def device_dist(self, node: ast.Call, name: str, kw) -> str | None:
        """The class name when this call builds a torch distribution (or a project subclass of one)
        from device tensors, else None."""
        if not any(self.kind(a) in TENSORISH for a in [*node.args, *kw.values()]):
            return None
        last = name.rsplit(".", 1)[-1]
        if name.startswith("torch.distributions.") and last[:1].isupper() \
                and not name.endswith(("Distribution", "constraints")) and last not in _NO_ARGS_CHECKED:
            return last
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            aliases = dist_aliases(self.project, self.src)   # self.ActionDist = torch.distributions.Normal
            hit = next((aliases[c, func.attr] for c in self.self_classes() if (c, func.attr) in aliases), None)
            if hit:
                return hit
        if last[:1].isupper() and isinstance(node.func, (ast.Name, ast.Attribute)):
            hit = self.project.class_of(self.src, node.func)   # class CategoricalMasked(Categorical)
            if hit is not None and _torch_dist_base(self.project, *hit):
                return last
        return None

    def note_distribution(self, node: ast.Assign) -> None:
        """`d = Normal(mu, std)` with validation on: its `d.log_prob(x)` checks the sample on the host."""
        v = _base_dist(self.src, node.value)
        if isinstance(v, ast.ListComp):
            return self.note_dist_list(node.targets, v)
        if isinstance(v, ast.Call) and isinstance(v.func, (ast.Name, ast.Attribute)):
            kw = {k.arg: k.value for k in v.keywords if k.arg}
            made = self.device_dist(v, self.dotted(v.func) or "", kw)
            wrapper = None if made else self.wrapper_of(v)
            if wrapper:   # d = SquashedNormal(mu, std): its log_prob validates, its sample is its base's
                if wrapper == "Normal":
                    self.bind_to(node.targets, _NORMAL, self.normal_attrs)
                self.bind_to(node.targets, _DIST, self.dist_attrs)
                return
            for t in node.targets:   # its samples, log_prob and entropy are device tensors
                if made and isinstance(t, ast.Name):
                    self.scopes[-1][t.id + _DEVICE_DIST] = "dist"
                elif isinstance(t, ast.Name) and self.host_dist(v):
                    self.scopes[-1][t.id + _HOST_DIST] = "dist"
            if made == "Normal":   # its .sample() calls torch.normal(loc, scale), validation or not
                self.bind_to(node.targets, _NORMAL, self.normal_attrs)
            if self.validated_dist(v, self.dotted(v.func) or "", kw):
                self.bind_to(node.targets, _DIST, self.dist_attrs)

    def host_dist(self, call: ast.Call) -> bool:
        """`Normal(0, 1)`, `Uniform(-1.0, 1.0)`: a torch distribution of Python numbers, whose samples are drawn on
        the host (a `.cuda()` of each one is a blocking copy)."""
        name = self.dotted(call.func) or ""
        last = name.rsplit(".", 1)[-1]
        args = [*call.args, *(k.value for k in call.keywords if k.arg != "validate_args")]
        return name.startswith("torch.distributions.") and last[:1].isupper() and bool(args) and all(
            isinstance(a, ast.Constant) and type(a.value) in (int, float) or isinstance(a, ast.UnaryOp)
            and isinstance(a.operand, ast.Constant) for a in args)

    def wrapper_of(self, call: ast.Call) -> str | None:
        """The base a project TransformedDistribution subclass builds (dists.wrapped_dist), when this
        call makes one from device tensors."""
        if not any(self.kind(a) in TENSORISH for a in [*call.args, *(k.value for k in call.keywords)]):
            return None
        hit = self.project.class_of(self.src, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
        return wrapped_dist(self.project, *hit) if hit is not None else None

    def note_dist_list(self, targets, comp: ast.ListComp) -> None:
        """`heads = [Categorical(logits=l) for l in logits]`: a list of validated distributions (dists.py)."""
        elt = _base_dist(self.src, comp.elt)
        if not isinstance(elt, ast.Call) or not isinstance(elt.func, (ast.Name, ast.Attribute)):
            return
        self.scopes.append({})
        try:
            for g in comp.generators:
                self.bind_loop_target(g.target, g.iter)
            kw = {k.arg: k.value for k in elt.keywords if k.arg}
            made = self.validated_dist(elt, self.dotted(elt.func) or "", kw)
        finally:
            self.scopes.pop()
        if made:
            self.bind_to(targets, _DISTS, self.dist_list_attrs)

    def note_dist_items(self, target: ast.AST, it: ast.AST) -> None:
        """A loop over a list of validated distributions (note_dist_list): each item is one; through
        zip() and enumerate() too."""
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and isinstance(target, ast.Tuple):
            if it.func.id == "zip" and len(it.args) == len(target.elts):
                for t, a in zip(target.elts, it.args):
                    self.note_dist_items(t, a)
            elif it.func.id == "enumerate" and it.args and len(target.elts) == 2:
                self.note_dist_items(target.elts[1], it.args[0])
        elif isinstance(target, ast.Name) and self.bound_to(it, _DISTS, self.dist_list_attrs):
            self.scopes[-1][target.id + _DIST] = _DIST[1:]

    def returned_dists(self, v: ast.AST) -> list[tuple[str, bool]]:
        """(class, validated) of the torch distributions that the project def whose call was assigned to
        the name `v` returns, when the call is handed a device tensor: `policy = self._get_policy(state)`,
        `out = self.actor(obs)` with a forward that returns `Normal(mean, std)`."""
        if not isinstance(v, ast.Name) or self.project_flags.get("no_validation", False):
            return []
        scope = self.defs[-1] if self.defs else None
        out = []
        for call in assigned_calls(self.src, v.id, scope)[:2]:
            if any(self.kind(a) in (*TENSORISH, "tlist") for a in [*call.args, *(k.value for k in call.keywords)]):
                for s, fn in self.project.resolve(self.src, call, scope, self.types, fallback=False)[:3]:
                    out += _returned_dists(self.project, s, fn)
        return out

    def bind_to(self, targets, key: str, attrs: set[tuple[str, str]]) -> None:
        """Mark each target as holding such a distribution: a name in this scope (its key appended), or
        `self.distribution` in the class of the method being walked."""
        for t in targets:
            if isinstance(t, ast.Name):
                self.scopes[-1][t.id + key] = key[1:]   # "dist" or "normal", as lookup() reads it
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                attrs.update((c, t.attr) for c in self.self_classes()[:1])

    def bound_to(self, v: ast.AST, key: str, attrs: set[tuple[str, str]]) -> bool:
        """`v` holds what bind_to marked: a name, or `self.x` set in this method's class or one of its bases."""
        if isinstance(v, ast.Name):
            return bool(self.lookup(v.id + key))
        return isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self" \
            and any((c, v.attr) in attrs for c in self.self_classes())

    def self_classes(self) -> list[str]:
        """The class of the method being walked, then its bases (by name, as far as this file defines them):
        `self.distribution` of a Normal in one class is not the Categorical of its sibling."""
        cls = self.src.owner.get(id(self.defs[-1])) if self.defs else None
        out: list[str] = []
        while cls is not None and cls.name not in out:
            out.append(cls.name)
            bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
            cls = self.src.classes.get(bases[0]) if bases else None
        return out

    def validation_off(self, kw) -> bool:
        v = kw.get("validate_args")
        if isinstance(v, ast.Constant):
            return v.value is False or v.value is None and self.project_flags.get("no_validation", False)
        return v is not None or self.project_flags.get("no_validation", False)


_DIST = "#dist"   # scope key of a name bound to a validated distribution
_DEVICE_DIST = "#ddist"   # scope key of a name bound to a distribution of device tensors
_HOST_DIST = "#hdist"   # scope key of a name bound to a distribution of Python numbers (sampled on the host)
_NORMAL = "#normal"   # scope key of a name bound to a Normal of device tensors
_DISTS = "#dists"   # scope key of a name bound to a list of validated distributions
_FIX = ("pass validate_args=False, or call torch.distributions.Distribution.set_default_validate_args(False) once "
        "at start-up: validation reads each parameter check (and each log_prob sample check) on the host")


def _returned_dists(project, src, fn) -> list[tuple[str, bool]]:
    """(class, validated) of each torch distribution `fn` returns: built in the return statement, or
    assigned to the name it returns (cached per def)."""
    cache = project.per_file.setdefault(id(src), {}).setdefault("dists", {})
    if id(fn) not in cache:
        out = []
        for r in own_statements(getattr(fn, "body", [])):
            if not isinstance(r, ast.Return):
                continue
            made = [r.value] if isinstance(r.value, ast.Call) else assigned_calls(src, r.value.id, fn) \
                if isinstance(r.value, ast.Name) else []
            for c in made:
                c = _base_dist(src, c)
                full = qualified(src, c.func)
                last = full.rsplit(".", 1)[-1]
                hit = project.class_of(src, c.func) if last[:1].isupper() and not full.startswith("torch.") else None
                wrapper = wrapped_dist(project, *hit) if hit is not None else None
                if wrapper:   # SquashedNormal(mu, std): validated log_prob, its base's sample
                    out.append((wrapper, True))
                elif full.startswith("torch.distributions.") and last[:1].isupper() and not last.endswith("Distribution") \
                        or hit is not None and _torch_dist_base(project, *hit):
                    off = any(k.arg == "validate_args" and not (isinstance(k.value, ast.Constant) and k.value.value)
                              for k in c.keywords)
                    out.append((last, not off))
        cache[id(fn)] = out
    return cache[id(fn)]


def _base_dist(src, v: ast.AST) -> ast.AST:
    """`Independent(Normal(loc, scale), 1)`: the Normal it wraps, whose checks its log_prob and sample run."""
    while isinstance(v, ast.Call) and v.args and isinstance(v.args[0], ast.Call) \
            and qualified(src, v.func) == "torch.distributions.Independent":
        v = v.args[0]
    return v


def _torch_dist_base(project, src, cls, depth: int = 0) -> bool:
    """A project class whose bases reach a torch.distributions class that checks its arguments
    (not the abstract Distribution / TransformedDistribution, which check none of their own), and
    whose __init__ does not turn validation off."""
    init = project.method(src, cls, "__init__")
    if init is not None and any(isinstance(k, ast.keyword) and k.arg == "validate_args" and isinstance(k.value, ast.Constant)
                                and k.value.value is False for k in ast.walk(init[1])):
        return False
    for base in cls.bases:
        full = qualified(src, base)
        if full.startswith(("torch.distributions.", "distributions.")):
            return not full.endswith("Distribution")
        hit = project.class_of(src, base) if depth < 4 else None
        if hit is not None and hit[1] is not cls and _torch_dist_base(project, *hit, depth + 1):
            return True
    return False


def validation_off_globally(src, on: set[str] = frozenset()) -> bool:
    """The file turns argument validation off for the whole process: `set_default_validate_args(False)` once,
    or a call of `torch.compile`, whose first call does the same (torch/_dynamo/eval_frame.py, TorchPatcher.patch,
    since torch 2.0; seen on an H100: a Categorical that synced before a compiled test in the same process no
    longer did after it). A compile counts where it runs by default: outside any `if`, or under tests that name
    only options on by default (`on`: `compile = True`, `default=True`); under any other test (`if
    args.compile:` with `store_true`, a flag passed down) validation stays on for the default run."""
    text = src.text
    if "set_default_validate_args(False)" in text.replace(" ", ""):
        return True
    if "compile" not in text:
        return False
    guarded: set[int] = set()
    for n in src.nodes:
        if isinstance(n, (ast.If, ast.IfExp)) and not _names_on(n.test, on):
            for branch in (n.body, n.orelse):
                guarded |= {id(x) for st in (branch if isinstance(branch, list) else [branch]) for x in ast.walk(st)}
    for n in src.nodes:
        if id(n) in guarded:
            continue
        if isinstance(n, ast.Call) and (qualified(src, n.func) in _COMPILERS or isinstance(n.func, ast.Attribute)
                                        and n.func.attr == "compile" and not n.args
                                        and all(k.arg in _COMPILE_KEYWORDS for k in n.keywords)):
            return True   # torch.compile(model), @torch.compile(mode=...), model.compile()
        if isinstance(n, DEFS) and any(qualified(src, d) in _COMPILERS for d in n.decorator_list):
            return True   # @torch.compile
    return False


def _names_on(test: ast.AST, on: set[str]) -> bool:
    """`if compile:` / `if args.compile and use_cuda:`: every part an option on by default."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    return all(isinstance(p, (ast.Name, ast.Attribute)) and name_of(p) in on for p in parts)


_COMPILERS = {"torch.compile", "torch._dynamo.optimize"}
_COMPILE_KEYWORDS = {"mode", "fullgraph", "dynamic", "backend", "options", "disable"}


__all__ = ["InsideRules", "validation_off_globally"]
