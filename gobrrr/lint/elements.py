"""One-dimensional device tensors and their elements: where a name certainly holds a 0-d device tensor.

PyTorch reads a 0-d integer tensor used as an index (`x[i]`, `x[b, i, :] = v`) with `.item()`, so a
CUDA one costs a blocking read each time (sync.scalar_index flags it once the name is known to be 0-d).
A tensor of unknown rank says nothing: its element `rows[i]` is a row, an index of which is advanced
indexing on the device. The evidence here is the rank: a tensor made one-dimensional

    inds = torch.nonzero(m).view(-1)      (also .reshape(-1), .flatten(), torch.flatten(t))
    ids = torch.unique(task_ids)          (torch.unique / .unique() with no dim)
    order = torch.randperm(n, device=d)   (torch.arange too)

stays so when sliced (`inds[1:]`); one int picks a 0-d element (`ind = inds[i]`, `last = inds[-1]`),
and iterating it yields 0-d elements (`for task_id in ids:`).

A mixin of rules.Checker: it relies on kinds.Kinds (`kind()`, `dotted()`, `lookup()`, `scopes`).
"""
from __future__ import annotations

import ast

from gobrrr.lint.names import TENSORISH

_FLAT = "#1d"   # scope key of a name bound to a one-dimensional device tensor
_MADE_1D = {"unique", "arange", "randperm"}   # torch.<f>(...) with no dim: one dimension


class ElementRules:
    """Marks names that hold one-dimensional device tensors, and their 0-d elements."""

    def one_dim(self, node: ast.AST) -> bool:
        """A device tensor with certainly one dimension (see the module doc)."""
        if isinstance(node, ast.Name):
            return bool(self.lookup(node.id + _FLAT))
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            return self.one_dim(node.value)   # inds[1:]: still one dimension
        if not isinstance(node, ast.Call) or self.kind(node) not in TENSORISH:
            return False
        func, args = node.func, node.args
        dims = any(k.arg in ("dim", "dims", "start_dim") for k in node.keywords)
        name = self.dotted(func) or ""
        if name.startswith("torch.") and name.count(".") == 1:
            f = name[6:]
            return not dims and (f in _MADE_1D and (f != "unique" or len(args) == 1)
                                 or f == "flatten" and len(args) == 1)
        if not isinstance(func, ast.Attribute):
            return False
        if func.attr in ("view", "reshape") and len(args) == 1 and _minus_one(args[0]):
            return True   # x.view(-1)
        return not dims and not args and func.attr in ("flatten", "unique", "ravel")

    def zero_d_element(self, node: ast.AST) -> bool:
        """`inds[i]`, `order[-1]`: one int picks one element of a one-dimensional device tensor."""
        return isinstance(node, ast.Subscript) and _int_index(node.slice, self) and self.one_dim(node.value)

    def note_flat(self, targets: list[ast.AST], value: ast.AST) -> None:
        """After an assignment: mark names bound to a one-dimensional device tensor."""
        if self.one_dim(value):
            for t in targets:
                if isinstance(t, ast.Name):
                    self.scopes[-1][t.id + _FLAT] = "1d"

    def note_loop_elements(self, target: ast.AST, it: ast.AST) -> None:
        """`for task_id in torch.unique(ids):` yields 0-d device tensors."""
        if isinstance(target, ast.Name) and self.one_dim(it):
            self.scopes[-1][target.id + "#0d"] = "0d"


def _minus_one(node: ast.AST) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
        and node.operand.value == 1


def _int_index(s: ast.AST, checker) -> bool:
    """An int: a literal (`-1` too) or a name holding a number."""
    if isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.USub):
        s = s.operand
    if isinstance(s, ast.Constant):
        return type(s.value) is int
    return isinstance(s, ast.Name) and checker.lookup(s.id) == "num"


__all__ = ["ElementRules"]
