"""Classes of a module picked by name at run time, for the call graph (index.Index.classes_of).

    `Model = getattr(importlib.import_module(f"model.{model_name}"), model_name)`   news-recommendation: the
        class named as its module, in each module directly inside the package `model`
    `importlib.import_module("models." + model).__getattribute__("MainModel")`   voxceleb_trainer: the class
        MainModel of each module directly inside `models`
    `importlib.import_module("exps." + name).Exp`                                 the class Exp, likewise

What the program will pick is not known, so each of them may be (at most eight; more pins nothing). A path
with text after its run-time part (`f"{pkg}.models"`), or a class named by another run-time value, picks none.

Likewise a registry, a dict literal of classes indexed by a run-time key (`registry_classes`):
    `ALGOS = {"gail": GAIL, "airl": AIRL}` at a module's top, here or imported: `ALGOS[args.algo](env)`
    `models = {"GCN": GCN, "GAT": GAT, ...}; return models[name](net_params)` in the factory itself, its values
        classes or defs that build one (benchmarking-gnns' `def GCN(net_params): return GCNNet(net_params)`)
Each value may be the one made (at most twelve, a model zoo's; a value that is no class pins nothing).
"""
from __future__ import annotations

import ast

from gobrrr.lint.source import IMPORT_MODULE, Source

_MOST = 8
_REGISTRY_MOST = 12


def picked_class(expr: ast.AST) -> tuple[tuple[str, ...], str | None] | None:
    """(the package the picked module sits in, the class name or None for the class named as its module), or
    None when `expr` is no class of a module picked at run time."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "getattr" \
            and len(expr.args) == 2:
        module, attr = expr.args
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
            and expr.func.attr == "__getattribute__" and len(expr.args) == 1:
        module, attr = expr.func.value, expr.args[0]
    elif isinstance(expr, ast.Attribute):
        module, attr = expr.value, ast.Constant(expr.attr)
    else:
        return None
    if not (isinstance(module, ast.Call) and ast.unparse(module.func) in IMPORT_MODULE and module.args):
        return None
    prefix, names = "", []
    for piece in _pieces(module.args[0]):
        if isinstance(piece, ast.Constant) and isinstance(piece.value, str) and not names:
            prefix += piece.value
        elif isinstance(piece, (ast.Name, ast.Attribute, ast.FormattedValue)) and not names:
            names.append(ast.unparse(piece.value if isinstance(piece, ast.FormattedValue) else piece))
        else:
            return None   # text after the run-time part, or two run-time parts
    if len(names) != 1 or not prefix.endswith(".") or prefix.startswith("."):
        return None
    package = tuple(prefix[:-1].split("."))
    if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
        return package, attr.value
    return (package, None) if ast.unparse(attr) == names[0] else None


def _pieces(path: ast.AST) -> list[ast.AST]:
    """The parts of a module path built at run time: an f-string's, or a `+` chain's."""
    if isinstance(path, ast.JoinedStr):
        return list(path.values)
    if isinstance(path, ast.BinOp) and isinstance(path.op, ast.Add):
        return _pieces(path.left) + _pieces(path.right)
    return [path]


def picked_classes(index, src: Source, made: ast.AST) -> list:
    """The project classes `made` (a class expression, or a name assigned one anywhere in `src`) may be."""
    picks = [p for p in [picked_class(made)] if p is not None]
    if not picks and isinstance(made, ast.Name) and "import_module" in src.text:
        picks = [p for n in src.nodes if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == made.id for t in n.targets)
                 for p in [picked_class(n.value)] if p is not None]
    out: list = []
    for package, name in picks[:2]:
        for path, s in index.by_path.items():
            parts = path.parts
            if len(parts) > len(package) and parts[-len(package) - 1:-1] == package:
                hit = index.lookup(s, name or parts[-1])
                if hit and hit[0] == "class" and all(c[1] is not hit[2] for c in out):
                    out.append((hit[1], hit[2]))
    return out if len(out) <= _MOST else []


def registry_classes(index, src: Source, name: str, scope: ast.AST | None, depth: int) -> list:
    """The project classes the dict literal `name` holds: bound in `scope` (the factory that indexes it) or at
    the top of this file or of the module it is imported from; a value naming a def counts the classes that
    def returns built (depth permitting)."""
    def dicts(where: Source, scope: ast.AST | None) -> list[ast.expr]:
        return [v for st in where.assigns(scope).get(name, ()) if isinstance(st.value, ast.Dict) for v in st.value.values]

    where = src
    values = dicts(src, scope) if scope is not None else []   # the factory's own dict first
    if not values and name in src.imports and src.imports[name][1] is not None:
        module, attr = src.imports[name]
        where, name = index.module(module, src), attr
    if not values and where is not None:
        values = dicts(where, None)
    if where is None or not 0 < len(values) <= _REGISTRY_MOST:
        return []
    out: list = []
    for v in values:
        hit = index.class_of(where, v)
        made = [hit] if hit is not None else index.classes_of(where, v, depth) if isinstance(v, ast.Name) else []
        if not made:
            return []
        out += [c for c in made if c not in out]
    return out
