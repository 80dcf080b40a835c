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

Index tensors: a device tensor of positions (`x.argmax(1)`, `torch.randint(.., device=d)`, `x.topk(k)[1]`,
`_, idx = x.sort()`, `m.long()`) indexes by advanced indexing. Writing a Python number through one
(`t[idx] = 0`) makes the number a CPU tensor that index_put_ copies up, blocking, every call (measured on an
H100, torch 2.11); a boolean mask alone (`t[mask] = 0`) is a masked_fill and does not.

A mixin of rules.Checker: it relies on kinds.Kinds (`kind()`, `dotted()`, `lookup()`, `scopes`).
"""
from __future__ import annotations

import ast

from gobrrr.lint.names import TENSORISH, VIEW_METHODS, index_parts

_FLAT = "#1d"   # scope key of a name bound to a one-dimensional device tensor
_MADE_1D = {"unique", "arange", "randperm"}   # torch.<f>(...) with no dim: one dimension
_POSITIONS = {"argmax", "argmin", "argsort", "randint", "randperm", "multinomial", "searchsorted", "bucketize",
              "long", "arange", "nonzero", "argwhere"}   # ops whose result is a tensor of positions
_PAIRED = {"topk", "sort", "max", "min", "kthvalue", "mode", "median"}   # (values, indices) with a dim


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

    def index_tensor(self, node: ast.AST) -> bool:
        """A device tensor of positions (see the module doc), or a view or slice of one."""
        if isinstance(node, ast.Name):
            return bool(self.lookup(node.id + "#pos"))
        if isinstance(node, ast.Subscript):
            parts = index_parts(node)
            if _pair(node.value) and isinstance(node.slice, ast.Constant) and node.slice.value == 1:
                return self.kind(node.value) in TENSORISH   # x.max(1)[1]
            return all(isinstance(p, (ast.Slice, ast.Constant)) for p in parts) \
                and self.index_tensor(node.value)   # idx[:, None], top[:, 0]
        if isinstance(node, ast.Attribute) and node.attr == "indices":
            return _pair(node.value) and self.kind(node.value) in TENSORISH
        if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)) \
                or self.kind(node) not in TENSORISH:
            return False
        f = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if f in VIEW_METHODS:
            return isinstance(node.func, ast.Attribute) and self.index_tensor(node.func.value)
        if f in ("argmax", "argmin") and not (node.args[1:] if _is_torch(node.func) else node.args) \
                and not node.keywords:
            return False   # x.argmax(): one position, a 0-d index (read with .item(), sync.scalar_index's finding)
        return f in _POSITIONS and (f != "long" or isinstance(node.func, ast.Attribute))

    def note_positions(self, targets: list[ast.AST], value: ast.AST) -> None:
        """After an assignment: mark names bound to a device tensor of positions (`_, idx = x.topk(k)`)."""
        for t in targets:
            if isinstance(t, ast.Name) and self.index_tensor(value):
                self.scopes[-1][t.id + "#pos"] = "pos"
            elif isinstance(t, ast.Tuple) and len(t.elts) == 2 and isinstance(t.elts[1], ast.Name) \
                    and _pair(value) and self.kind(value) in TENSORISH:
                self.scopes[-1][t.elts[1].id + "#pos"] = "pos"

    def note_loop_elements(self, target: ast.AST, it: ast.AST) -> None:
        """`for task_id in torch.unique(ids):` yields 0-d device tensors; `for o, l in zip(resps, levels)` with
        `levels = torch.randint(0, n, (b,))` on the host yields 0-d host ints, integer indices (moves.host_element)."""
        if isinstance(target, ast.Name) and self.one_dim(it):
            self.scopes[-1][target.id + "#0d"] = "0d"
        pairs = [(target, it)] if isinstance(target, ast.Name) else \
            list(zip(target.elts, it.args)) if isinstance(target, ast.Tuple) and isinstance(it, ast.Call) \
            and isinstance(it.func, ast.Name) and it.func.id == "zip" and not it.keywords else []
        for t, src in pairs:
            if isinstance(t, ast.Name) and self._host_flat(src):
                self.scopes[-1][t.id + "#elem"] = "elem"


def _minus_one(node: ast.AST) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
        and node.operand.value == 1


def _is_torch(func: ast.AST) -> bool:
    """`torch.argmax(x, 1)`: the tensor is the first argument."""
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch"


def _pair(node: ast.AST) -> bool:
    """`x.topk(k)`, `torch.sort(x)`, `x.max(1)`, `torch.max(x, dim=1)`: values and indices (max and min
    only with a dim)."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    f = node.func.attr
    if f in ("max", "min"):
        return len(node.args) > _is_torch(node.func) or any(k.arg == "dim" for k in node.keywords)
    return f in _PAIRED


def _int_index(s: ast.AST, checker) -> bool:
    """An int: a literal (`-1` too) or a name holding a number."""
    if isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.USub):
        s = s.operand
    if isinstance(s, ast.Constant):
        return type(s.value) is int
    return isinstance(s, ast.Name) and checker.lookup(s.id) == "num"


__all__ = ["ElementRules"]
