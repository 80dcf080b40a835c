"""Python lists beside device tensors: lists of ints that index one, and lists a device scalar indexes.

Two costs, both paid on the host every time the line runs:

    scores[:, allowed_classes]      a list of ints (or a list of such lists, picked by a number) as an index:
                                    PyTorch builds a CPU index tensor and copies it up, blocking (GB011)
    self.label_name[label]          a device scalar as an index of a Python list (or tuple, or str):
                                    the list calls `__index__`, an `.item()` of the CUDA tensor (GB002)

The evidence is the list's making, never its name:

    list(range(n)), [i for i in range(n) if ...], [0, 2], [[0, 1], [0, 2]]    ints, nested `depth` deep
    [list(range(a * i, a * (i + 1))) for i in range(n)]                       depth 2 (Task-IL's active classes)
    ['[blank]'] + chars, [line.rstrip() for line in f], f.readlines(), sorted(x)   a Python list (any items)

A name holds what it was bound to in this def (`#ints` = its depth, `#list`); a parameter what the call site
handed it (calls.CallRules passes both marks); a `self.` attribute what every assignment of it in the class and its
bases makes (through one local name: `names = [l.strip() for l in f]; self.names = names`).

A mixin of rules.Checker: it relies on kinds.Kinds (`lookup()`, `scopes`, `src`, `project`, `defs`).
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.bindings import assigned_pairs
from gobrrr.lint.loops import name_of

_LIST_METHODS = {"readlines", "splitlines"}   # str / file methods that return a Python list


class ListRules:
    """The int-list and Python-list evidence of names, parameters and attributes."""

    def int_depth(self, p: ast.AST) -> int | None:
        """How deep the Python ints of `p` nest (1: a list of positions), from its making or its name's binding;
        `lists[i]` of a depth-2 list is depth 1, `x if c else None` what `x` is."""
        if isinstance(p, ast.Name):
            mark = self.lookup(p.id + "#ints")
            if mark:
                return int(mark) if mark.isdigit() else 1
            return 1 if self.defs and self._appended(p.id) else None   # row = []; ...: row.append(i)
        if isinstance(p, ast.IfExp):
            ways = [w for w in (p.body, p.orelse) if not (isinstance(w, ast.Constant) and w.value is None)]
            depths = {self.int_depth(w) for w in ways}
            return depths.pop() if len(depths) == 1 else None
        if isinstance(p, ast.Subscript) and not isinstance(p.slice, (ast.Slice, ast.Tuple)):
            inner = self.int_depth(p.value)
            if inner is None:
                inner = self._attr_depth(p.value)
            return inner - 1 if inner and inner > 1 else None
        if isinstance(p, ast.Subscript) and isinstance(p.slice, ast.Slice):
            return self.int_depth(p.value)
        return int_depth(p)

    def _appended(self, name: str) -> bool:
        """`name` is a list of positions the current def grows with appends (appended_ints, cached per def); looked
        for only where the file appends to that name at all."""
        per_file = self.project.per_file.setdefault(id(self.src), {})
        if "appended" not in per_file:
            per_file["appended"] = set(re.findall(r"(\w+)\.append\(", self.src.text))
        if name not in per_file["appended"]:
            return False
        cache, fn = per_file.setdefault("appended_ints", {}), self.defs[-1]
        if id(fn) not in cache:
            cache[id(fn)] = appended_ints(fn)
        return name in cache[id(fn)]

    def note_lists(self, name: ast.Name, val: ast.AST) -> None:
        """Mark a name bound to a list of ints (its depth) or to a Python list."""
        depth = self.int_depth(val)
        if depth:
            self.scopes[-1][name.id + "#ints"] = str(depth)   # chosen = [i for i in range(n) if status[i] == 1]
        if list_display(val) or isinstance(val, ast.Name) and self.lookup(val.id + "#list"):
            self.scopes[-1][name.id + "#list"] = "list"   # (by its making here: attributes are read where indexed)

    def py_list(self, node: ast.AST) -> bool:
        """`node` certainly holds a Python list: made here, bound to one, or a `self.` attribute the class only
        ever sets to one."""
        if isinstance(node, ast.Name):
            return bool(self.lookup(node.id + "#list")) or bool(self.lookup(node.id + "#ints"))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            made = self.attr_values().get(node.attr)
            return bool(made) and all(_made_list(v, fn) for v, fn in made)
        return list_display(node) or int_depth(node) is not None

    def _int_attr(self, p: ast.AST) -> bool:
        """`self.keep` (or `self.matMode[0]` of a list of lists) that the class sets only to Python lists of ints
        (`self.matMode = [[0, 1], [0, 2], [1, 2]]`, `self.delete_tag_index = [127, 2961]`): TensoRF's plane lookups."""
        depth = 0
        while isinstance(p, ast.Subscript) and not isinstance(p.slice, ast.Slice):
            p, depth = p.value, depth + 1
        return (self._attr_depth(p) or 0) > depth

    def _attr_depth(self, p: ast.AST) -> int | None:
        if not (isinstance(p, ast.Attribute) and isinstance(p.value, ast.Name) and p.value.id == "self"):
            return None
        depths = {int_depth(v) for v, _ in self.attr_values().get(p.attr, [])}
        return depths.pop() if len(depths) == 1 else None

    def attr_values(self) -> dict[str, list[tuple[ast.AST, ast.AST]]]:
        """What the class of the def being walked and its bases assign to each `self.` attribute: attr ->
        [(value, the def that assigns it)], tabled once per class (TensoRF sets matMode in TensorBase)."""
        cls = self.src.owner.get(id(self.defs[-1])) if self.defs else None
        if cls is None:
            return {}
        memo = self.project.per_file.setdefault(id(self.src), {}).setdefault("attr_values", {})
        if id(cls) not in memo:
            ids = self.project.ancestors(id(cls))
            found: dict[str, list] = {}
            for c in [c for s in self.project.sources for c in s.classes.values() if id(c) in ids]:
                for fn in (f for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))):
                    for n in ast.walk(fn):
                        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                    found.setdefault(t.attr, []).append((n.value, fn))
            memo[id(cls)] = (cls, found)   # the class kept beside its id, so the id is not reused
        return memo[id(cls)][1]

    def list_index(self, node: ast.Subscript) -> ast.AST | None:
        """The device scalar that a Python list is read with here (`self.character[t[i]]`), if any."""
        if not isinstance(node.ctx, ast.Load) or isinstance(node.slice, (ast.Slice, ast.Tuple)) \
                or not self.py_list(node.value):
            return None
        return node.slice if self._device_scalar(node.slice) else None

    def _device_scalar(self, p: ast.AST) -> bool:
        """A device scalar by its making in this def: a full reduction (`scores.argmax()`), an element of a named
        tensor (`t[i]`), a name assigned a tensor op or an element, or one iterating a named tensor (`for i in
        row`, `for l in labels`). A parameter, or an item of an attribute of something (`for s, e in enc.offsets`),
        holds what a caller or a guess says: not evidence enough for a read."""
        if self.zero_d(p):
            return True
        if self.kind(p) != "tensor":
            return False
        if isinstance(p, ast.Subscript):
            return isinstance(p.value, ast.Name)
        if not (isinstance(p, ast.Name) and self.defs):
            return False
        for n in ast.walk(self.defs[-1]):   # any binding of the name that makes one (`i` may be bound twice)
            if isinstance(n, (ast.For, ast.comprehension)) and any(
                    isinstance(t, ast.Name) and t.id == p.id for t in ast.walk(n.target)):
                it = n.iter.value if isinstance(n.iter, ast.Subscript) else n.iter
                if isinstance(it, ast.Name):
                    return True
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == p.id for t in n.targets) \
                    and isinstance(n.value, (ast.Call, ast.Subscript)):
                return True
        return False


def list_display(v: ast.AST) -> bool:
    """A Python list by its making: a display or comprehension, `list(...)`, `sorted(...)`, `f.readlines()`,
    `s.splitlines()`, and `+` or `*` of one."""
    if isinstance(v, (ast.List, ast.ListComp)):
        return True
    if isinstance(v, ast.Call):
        f = v.func
        return isinstance(f, ast.Name) and f.id in ("list", "sorted") or \
            isinstance(f, ast.Attribute) and f.attr in _LIST_METHODS
    if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Add):
        return list_display(v.left) or list_display(v.right)   # ['[blank]'] + chars: list + list
    return isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mult) and list_display(v.left)


def _made_list(value: ast.AST, fn: ast.AST, hops: int = 2) -> bool:
    """An attribute's assigned value makes a Python list, itself or through the local names it is made of in
    the def that assigns it (`label_name = [l.rstrip() for l in f]; self.label_name = label_name`, `self.character =
    list_token + list_character`), two names deep."""
    if list_display(value):
        return True
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        return _made_list(value.left, fn, hops) or _made_list(value.right, fn, hops)
    if not isinstance(value, ast.Name) or not hops:
        return False
    made = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)]
    return bool(made) and all(_made_list(v, fn, hops - 1) for v in made)


def appended_ints(fn: ast.AST) -> set[str]:
    """The names of `fn` bound only to an empty list (`row = []`, `row, col = list(), list()`) and grown only by
    `append`s of ints: a `for` target over `range(...)` (or `enumerate`'s count) or an int literal. pytorch-fm's
    `row.append(i), col.append(j)` over the field pairs, then `x[:, row]`: a list of positions."""
    counters = {t.id for n in ast.walk(fn) if isinstance(n, (ast.For, ast.comprehension))
                for t in [_counter(n.target, n.iter)] if t is not None}
    empty, other, grown, bad = set(), set(), set(), set()
    for name, v in assigned_pairs(fn):
        if isinstance(name, ast.Name):
            (empty if _empty_list(v) else other).add(name.id)
        elif isinstance(name, ast.Tuple):
            other.update(e.id for e in name.elts if isinstance(e, ast.Name))
    for n in ast.walk(fn):
        if isinstance(n, (ast.AugAssign, ast.AnnAssign)) and isinstance(n.target, ast.Name):
            other.add(n.target.id)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name):
            name = n.func.value.id
            if n.func.attr == "append" and len(n.args) == 1 and (
                    isinstance(n.args[0], ast.Name) and n.args[0].id in counters
                    or isinstance(n.args[0], ast.Constant) and type(n.args[0].value) is int):
                grown.add(name)
            elif n.func.attr in ("append", "extend", "insert", "__setitem__") or n.func.attr.startswith("__i"):
                bad.add(name)
    return (empty & grown) - other - bad - counters


def _counter(target: ast.AST, it: ast.AST) -> ast.Name | None:
    """The int a loop counts with: `i` of `for i in range(n)` or of `for i, x in enumerate(xs)`."""
    f = it.func.id if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) else ""
    if f == "range" and isinstance(target, ast.Name):
        return target
    if f == "enumerate" and isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name):
        return target.elts[0]
    return None


def _empty_list(v: ast.AST) -> bool:
    return isinstance(v, ast.List) and not v.elts or isinstance(v, ast.Call) and isinstance(v.func, ast.Name) \
        and v.func.id == "list" and not v.args and not v.keywords


_POSITIONS = re.compile(r"(^|_)(idx|ix)$|(2|_to_)(idx|ix|id|index)$|^stoi$", re.I)   # column_idx, word2idx, stoi


def int_depth(val: ast.AST) -> int | None:
    """How deep a literal of Python ints nests: 1 for `[0, 2]` or `list(range(n))`, 2 for `[[0, 1], [0, 2]]` or
    `[list(range(a, b)) for i in range(n)]`; None for anything else."""
    if int_list(val):
        return 1
    if isinstance(val, ast.ListComp) and len(val.generators) == 1 and int_list(val.elt):
        return 2   # [list(range(k * i, k * (i + 1))) for i in range(contexts)]: one list of classes per context
    if isinstance(val, (ast.List, ast.Tuple)) and val.elts:
        if all(isinstance(e, ast.Constant) and type(e.value) is int for e in val.elts):
            return 1
        inner = {int_depth(e) for e in val.elts}
        return inner.pop() + 1 if len(inner) == 1 and None not in inner else None
    return None


def int_list(val: ast.AST) -> bool:
    """A Python list of positions: `[i for i in range(n) if ...]`, `[i for i, s in enumerate(xs) if ...]`,
    `list(range(n))`. As an index into a device tensor it is copied to the device first, blocking."""
    if isinstance(val, ast.Call) and isinstance(val.func, ast.Name) and val.func.id == "list" and val.args:
        val = val.args[0]
        return isinstance(val, ast.Call) and isinstance(val.func, ast.Name) and val.func.id == "range"
    if isinstance(val, ast.ListComp) and isinstance(val.elt, ast.Subscript) and len(val.generators) == 1 \
            and isinstance(val.elt.value, (ast.Name, ast.Attribute)) and _POSITIONS.search(name_of(val.elt.value)) \
            and isinstance(val.elt.slice, ast.Name) and val.elt.slice.id in {n.id for n in ast.walk(val.generators[0].target)
                                                                             if isinstance(n, ast.Name)}:
        return True   # [column_idx[col] for col in cols]: the positions a name-to-index map gives
    if not (isinstance(val, ast.ListComp) and isinstance(val.elt, ast.Name) and len(val.generators) == 1):
        return False
    counter = _counter(val.generators[0].target, val.generators[0].iter)
    return counter is not None and counter.id == val.elt.id
