"""One checked file, parsed and indexed once per run: what the call graph (graph.py) needs of it.

    parse      the file's module-level functions (and lambdas bound to a name), its classes, its imports
               (star imports kept apart), the classes assigned to names (`net = QNetwork(...)`, `self.crit =
               SetCriterion(...)`), constructor calls per scope, and per def its class and the def it
               is nested in; `self.attr = param` in `__init__` so that a constructor's callers type it
    walk       every node of a tree in one flat list (cheaper than ast.walk), and per def the names
               it calls
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def walk(tree: ast.AST, calls: dict[str, set[str]] | None = None) -> list[ast.AST]:
    """Every node below `tree` (itself first), in one flat list: one pass, cheaper than ast.walk.
    With `calls`, also fill def name -> the names it calls (a nested def's calls are its own)."""
    out = []
    stack = [(tree, None)]
    AST, Call, Def = ast.AST, ast.Call, (ast.FunctionDef, ast.AsyncFunctionDef)
    while stack:
        node, owner = stack.pop()
        out.append(node)
        if calls is not None:
            if isinstance(node, Def):
                owner = calls.setdefault(node.name, set())
            elif owner is not None and isinstance(node, Call):
                f = node.func
                owner.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
        for name in node._fields:
            v = getattr(node, name, None)
            if v.__class__ is list:
                stack.extend((x, owner) for x in reversed(v) if isinstance(x, AST))
            elif isinstance(v, AST):
                stack.append((v, owner))
    return out


IMPORT_MODULE = ("importlib.import_module", "import_module")   # a module imported by a name known at run time


@dataclass(eq=False)
class Source:
    """One parsed file and what the call graph needs of it."""
    path: Path
    text: str
    tree: ast.Module
    nodes: list[ast.AST]
    functions: dict[str, ast.AST] = field(default_factory=dict)     # module-level defs
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)  # every class of the file, by name
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)   # local -> (module, name or None)
    owner: dict[int, ast.ClassDef] = field(default_factory=dict)    # id(method) -> its class
    parent: dict[int, ast.AST] = field(default_factory=dict)        # id(def) -> the def it is nested in
    instances: dict[tuple[int, str], list[ast.expr]] = field(default_factory=dict)  # (id(scope), name) -> made by
    ctor_calls: list[tuple[ast.AST | None, ast.Call]] = field(default_factory=list)  # `x = Cls(a, k=b)`, in scope
    param_attrs: dict[tuple[int, str], list[str]] = field(default_factory=dict)  # (id(cls), param) -> self.attrs
    calls: dict[str, set[str]] = field(default_factory=dict)   # def name -> the names it calls
    stars: list[str] = field(default_factory=list)   # modules imported with `from .boxes import *`
    _assigns: dict[int, dict[str, list[ast.Assign]]] = field(default_factory=dict, repr=False)   # see assigns()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def module_path(self) -> Path:
        """The path of the module the file is, without .py: pkg/sub/mod.py -> pkg/sub/mod; pkg/__init__.py -> pkg.
        Its parts are the module's dotted name."""
        return self.path.parent if self.path.name == "__init__.py" else self.path.with_suffix("")

    def assigns(self, scope: ast.AST | None) -> dict[str, list[ast.Assign]]:
        """name -> the `name = ...` statements of this def (the module's, for None), in order, its ifs, loops,
        withs and trys included and nested defs not; each scope's table is made once, on first asking."""
        if id(scope) not in self._assigns:
            table: dict[str, list[ast.Assign]] = {}
            for st in own_statements(self.tree.body if scope is None else getattr(scope, "body", [])):
                if isinstance(st, ast.Assign):
                    for name in dict.fromkeys(t.id for t in st.targets if isinstance(t, ast.Name)):
                        table.setdefault(name, []).append(st)
            self._assigns[id(scope)] = table
        return self._assigns[id(scope)]

    @cached_property
    def dynamic(self) -> set[str]:
        """The names bound to a module imported by a name known only at run time (`MODEL =
        importlib.import_module(FLAGS.model)`, votenet's network and loss): one of the project's modules."""
        if "import_module" not in self.text:
            return set()
        return {t.id for n in ast.walk(self.tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                and ast.unparse(n.value.func) in IMPORT_MODULE
                for t in n.targets if isinstance(t, ast.Name)}


def own_statements(body: list[ast.stmt]):
    """The statements of a body and of its ifs, withs, trys and loops, not of nested defs."""
    for st in body:
        yield st
        if not isinstance(st, (*DEFS, ast.ClassDef)):
            for field_name in ("body", "orelse", "finalbody"):
                yield from own_statements(getattr(st, field_name, None) or [])
            for h in getattr(st, "handlers", None) or []:
                yield from own_statements(h.body)


# a Python 2 print statement: `print x, y` (not `print(x)`, `print = f`); its comment kept apart
_PRINT_STATEMENT = re.compile(r"^([ \t]*)print[ \t]+(?![(=>])([^#]*?)[ \t]*(#.*)?$")


def _print_calls(text: str) -> str:
    """Python 2's `print x, y` statements as `print(x, y)` calls, line for line: a statement whose brackets
    run on (`print voc_eval(\n    a, b)`) is closed on the line where they balance. Strings holding `#` or
    brackets are not understood: such a file stays refused."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _PRINT_STATEMENT.match(lines[i])
        if m:
            indent, body, comment = m.group(1), m.group(2), m.group(3) or ""
            depth, j = _depth(body), i
            lines[i] = f"{indent}print({body}" + (f"){comment}" if depth <= 0 else comment)
            while depth > 0 and j + 1 < len(lines):
                j += 1
                code, _, rest = lines[j].partition("#")
                depth += _depth(code)
                if depth <= 0:
                    lines[j] = code.rstrip() + ")" + (" #" + rest if rest else "")
            i = j
        i += 1
    return "\n".join(lines)


def _depth(code: str) -> int:
    return sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")


def parse(path: Path, text: str) -> Source:
    """Parse and index one file; SyntaxError / RecursionError propagate to the caller. Code written for
    Python 3.6 or older, where `async` and `await` were plain names (`def run(async=True)`), is read with
    that grammar when today's refuses it; code for Python 2 whose only such syntax is `print x` statements,
    with them read as calls (_print_calls)."""
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as today:
        try:
            tree = ast.parse(text, filename=str(path), feature_version=(3, 6))
        except (SyntaxError, ValueError):   # not that either (or no such grammar here)
            tree = None
        if tree is None and "print" in (today.msg or ""):   # `print x, y` of Python 2: read as print(x, y),
            try:                                            # each on its own line (line numbers kept)
                tree = ast.parse(_print_calls(text), filename=str(path))
            except SyntaxError:
                tree = None
        if tree is None:
            raise today from None   # today's error: the one line the user sees
    calls: dict[str, set[str]] = {}
    src = Source(path, text, tree, walk(tree, calls))
    src.calls = calls
    src.functions = {s.name: s for s in tree.body if isinstance(s, DEFS)}
    for name, lam in _named_lambdas(tree):   # to_np = lambda x: x.detach().cpu().numpy(): a function like a def
        src.functions.setdefault(name, lambda_def(name, lam))
    _index_scopes(src, tree, None, None)
    for node in src.nodes:
        if isinstance(node, ast.ClassDef):
            src.classes.setdefault(node.name, node)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 or \
                isinstance(node, ast.ImportFrom) and node.level:
            base = ("." * node.level) + (node.module or "")
            for a in node.names:
                if a.name == "*":
                    src.stars.append(base)
                    continue
                src.imports[a.asname or a.name] = (base, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    src.imports[a.asname] = (a.name, None)
                else:
                    src.imports.setdefault(a.name.split(".")[0], (a.name.split(".")[0], None))
    return src


def _named_lambdas(tree: ast.Module):
    """(name, Lambda) of each module-level `name = lambda ...:` statement."""
    for st in tree.body:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Lambda) and len(st.targets) == 1 \
                and isinstance(st.targets[0], ast.Name):
            yield st.targets[0].id, st.value


def lambda_def(name: str, lam: ast.Lambda) -> ast.FunctionDef:
    """A def standing for a named lambda: its parameters, and one statement returning its body (the body's
    own nodes, so that a finding in it points at the lambda's line)."""
    ret = ast.copy_location(ast.Return(value=lam.body), lam.body)
    fn = ast.FunctionDef(name=name, args=lam.args, body=[ret], decorator_list=[], returns=None)
    return ast.copy_location(fn, lam)


def _index_scopes(src: Source, node: ast.AST, scope: ast.AST | None, cls: ast.ClassDef | None) -> None:
    """Record each def's class and parent def, and `name = Cls(...)` assignments per scope."""
    for child in _statements(node):
        if isinstance(child, DEFS):
            if cls is not None:
                src.owner[id(child)] = cls
            if scope is not None:
                src.parent[id(child)] = scope
            _index_scopes(src, child, child, None)
        elif isinstance(child, ast.ClassDef):
            _index_scopes(src, child, scope, child)
        else:
            if isinstance(child, ast.Assign) and len(child.targets) == 1 and isinstance(child.targets[0], ast.Tuple) \
                    and isinstance(child.value, ast.Tuple) and len(child.targets[0].elts) == len(child.value.elts):
                for t, v in zip(child.targets[0].elts, child.value.elts):   # `actor, critic = Actor(), Critic()`
                    _index_scopes(src, ast.Module(body=[ast.Assign(targets=[t], value=v)], type_ignores=[]), scope, cls)
            elif isinstance(child, ast.Assign) and len(child.targets) == 1 and isinstance(child.targets[0], ast.Tuple) \
                    and isinstance(child.value, ast.Call) and isinstance(child.value.func, (ast.Name, ast.Attribute)):
                for i, t in enumerate(child.targets[0].elts):   # `stats, self.loss = self._get_losses(opt)`: the
                    item = ast.Subscript(value=child.value, slice=ast.Constant(i), ctx=ast.Load())   # i-th returned
                    _index_scopes(src, ast.Module(body=[ast.Assign(targets=[t], value=item)], type_ignores=[]), scope, cls)
            elif isinstance(child, ast.Assign) and isinstance(child.value, (ast.Tuple, ast.List)) and child.value.elts \
                    and all(_constructed(e) is not None for e in child.value.elts):
                for t in child.targets:   # dt = (Profile(), Profile()): dt[i] is one of them
                    if isinstance(t, ast.Name):
                        src.instances.setdefault((id(scope), t.id + "[]"), []).extend(
                            _constructed(e) for e in child.value.elts)
            elif isinstance(child, ast.Expr) and isinstance(child.value, ast.Call) and child.value.args \
                    and isinstance(child.value.func, ast.Attribute) and child.value.func.attr == "append" \
                    and isinstance(child.value.func.value, ast.Attribute) and isinstance(child.value.func.value.value, ast.Name) \
                    and child.value.func.value.value.id == "self" and src.owner.get(id(scope)) is not None \
                    and (made := _constructed(child.value.args[0])) is not None:   # self.cells.append(Cell(...)):
                src.instances.setdefault((id(src.owner[id(scope)]), child.value.func.value.attr + "[]"), []).append(made)
            elif isinstance(child, (ast.Assign, ast.AnnAssign)) and child.value is not None:   # self.cells[i] is one
                either = _either(child.value)   # actor = (A(...) if cfg.deterministic else B(...)).to(dev): both
                made = _constructed(child.value) if not either else either[0]
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                owner = src.owner.get(id(scope)) if scope is not None else None
                for m in either or ([made] if made is not None else []):
                    if isinstance(m, ast.Call):
                        src.ctor_calls.append((scope, m))
                    for t in targets:
                        if isinstance(t, ast.Name):
                            src.instances.setdefault((id(scope), t.id), []).append(m)
                        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                                and owner is not None:
                            src.instances.setdefault((id(owner), t.attr), []).append(m)
                given = _given(child.value)
                if owner is not None and getattr(scope, "name", "") == "__init__" and given is not None:
                    for t in targets:   # self.matcher = matcher, self.model = nn.DataParallel(model): typed by the
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            src.param_attrs.setdefault((id(owner), given), []).append(t.attr)   # constructor's callers
            _index_scopes(src, child, scope, cls)


def _statements(node: ast.AST):
    for name in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, name, None) or ():
            if isinstance(child, ast.AST):
                yield child


def _either(value: ast.AST) -> list[ast.expr]:
    """The two calls of `(A(...) if c else B(...))[.to(dev)]` that each make an object, else []."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda"):
        value = value.func.value
    if isinstance(value, ast.IfExp):
        both = [_constructed(value.body), _constructed(value.orelse)]
        return both if None not in both else []
    return []


def _given(value: ast.AST) -> str | None:
    """The name a constructor's parameter is stored under, as is or wrapped: `model`, `model.to(dev)`,
    `nn.DataParallel(model)` (OpenNRE's frameworks), `DistributedDataParallel(model, ...)`."""
    while isinstance(value, ast.Call):
        f = value.func
        called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if isinstance(f, ast.Attribute) and called in ("to", "cuda", "eval", "train", "half", "float", "bfloat16"):
            value = f.value
        elif called.endswith("DataParallel") and value.args:
            value = value.args[0]
        else:
            break
    return value.id if isinstance(value, ast.Name) else None


def _constructed(value: ast.AST) -> ast.expr | None:
    """The call that makes an object: `Cls(...)`, `mod.Cls(...)`, `Cls(...).to(dev)`, `build_matcher(args)`
    (a factory: its returns say the class)."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in ("to", "cuda", "eval", "train", "half", "float", "bfloat16"):
        value = value.func.value
    if isinstance(value, ast.Call) and (isinstance(value.func, (ast.Name, ast.Attribute)) or isinstance(
            value.func, ast.Subscript) and isinstance(value.func.value, ast.Name)):   # ALGOS[name](...): a registry's
        return value
    if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Call) and isinstance(value.slice, ast.Constant) \
            and type(value.slice.value) is int and value.slice.value >= 0 and _constructed(value.value) is value.value:
        return value   # one item of what a factory returns: `stats, loss = get_losses(opt)` -> get_losses(opt)[1]
    return None


__all__ = ["DEFS", "Source", "parse", "walk"]
