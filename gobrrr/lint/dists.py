"""Where a torch distribution hides from a plain `Normal(mu, std)`: the shapes GB013 follows besides it.

    an alias    `self.ActionDist = torch.distributions.Normal` in a class, then `self.ActionDist(mu, std)`:
                the call builds that class (with validation on, as any other)
    a wrapper   `class SquashedNormal(TransformedDistribution)` whose __init__ builds `Normal(loc, scale)`
                as its base: its `log_prob` validates the sample (TransformedDistribution checks the
                support, then the base's log_prob does), and its `sample()` is the Normal's, which calls
                torch.normal with a tensor std (std >= 0 read on the host). Its own construction is
                left to the Normal built inside, which GB013 reports where it is written
    a list      `heads = [Categorical(logits=l) for l in logits]` (or `self.distribution = [...]`), then
                `for d, a in zip(heads, actions): d.log_prob(a)`: each item is such a distribution

Helpers of inside.InsideRules; each per-file or per-class answer is cached on the project.
"""
from __future__ import annotations

import ast

from gobrrr.lint.source import DEFS

_TORCH_DISTS = "torch.distributions."


def qualified(src, expr: ast.AST) -> str:
    """`pyd.Normal` -> 'torch.distributions.Normal' through the file's imports."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return ""
    module, attr = src.imports.get(expr.id, (expr.id, None))
    head = f"{module}.{attr}" if attr else module
    return ".".join([head, *reversed(parts)])


def torch_dist_class(full: str) -> str | None:
    """'Normal' for 'torch.distributions.normal.Normal'; None for the abstract bases and non-classes."""
    last = full.rsplit(".", 1)[-1]
    if full.startswith(_TORCH_DISTS) and last[:1].isupper() and not last.endswith(("Distribution", "constraints")):
        return last
    return None


def dist_aliases(project, src) -> dict[tuple[str, str], str]:
    """(class, attribute) -> the torch distribution class the class's methods bind to `self.<attribute>`
    (`self.ActionDist = torch.distributions.Normal`); an attribute bound to two classes is left out."""
    cache = project.per_file.setdefault(id(src), {})
    if "dist_aliases" not in cache:
        out: dict[tuple[str, str], str | None] = {}
        for cls in src.classes.values():
            for n in ast.walk(cls):
                if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute)):
                    continue
                made = torch_dist_class(qualified(src, n.value))
                for t in n.targets:
                    if made and isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        key = (cls.name, t.attr)
                        out[key] = made if out.get(key, made) == made else None
        cache["dist_aliases"] = {k: v for k, v in out.items() if v}
    return cache["dist_aliases"]


def wrapped_dist(project, src, cls: ast.ClassDef) -> str | None:
    """The torch distribution a project subclass of TransformedDistribution builds as its base in
    __init__ (`self.base_dist = Normal(loc, scale)`), validated; None otherwise (cached per class)."""
    cache = project.per_file.setdefault(id(src), {}).setdefault("wrapped_dists", {})
    if id(cls) not in cache:
        cache[id(cls)] = _wrapped(src, cls)
    return cache[id(cls)]


def _wrapped(src, cls: ast.ClassDef) -> str | None:
    if not any(qualified(src, b).endswith("TransformedDistribution") for b in cls.bases):
        return None
    init = next((d for d in cls.body if isinstance(d, DEFS) and d.name == "__init__"), None)
    if init is None or any(k.arg == "validate_args" and isinstance(k.value, ast.Constant) and k.value.value is False
                           for k in ast.walk(init) if isinstance(k, ast.keyword)):
        return None
    for n in ast.walk(init):
        if isinstance(n, ast.Call):
            made = torch_dist_class(qualified(src, n.func))
            if made:
                return made
    return None


__all__ = ["qualified", "torch_dist_class", "dist_aliases", "wrapped_dist"]
