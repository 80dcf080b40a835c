"""Classes of a module picked by name at run time, for the call graph (index.Index.classes_of).

    `Model = getattr(importlib.import_module(f"model.{model_name}"), model_name)`   news-recommendation: the
        class named as its module, in each module directly inside the package `model`
    `importlib.import_module("models." + model).__getattribute__("MainModel")`   voxceleb_trainer: the class
        MainModel of each module directly inside `models`
    `importlib.import_module("exps." + name).Exp`                                 the class Exp, likewise

What the program will pick is not known, so each of them may be (at most eight; more pins nothing). A path
with text after its run-time part (`f"{pkg}.models"`), or a class named by another run-time value, picks none.
"""
from __future__ import annotations

import ast

from gobrrr.lint.source import IMPORT_MODULE, Source

_MOST = 8


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
