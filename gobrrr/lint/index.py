"""The project's own files, modules and classes, indexed once per run, and what a name means in them.

    index      every checked file parsed once (source.py: Source): files by path and by dotted tail, methods
               by name, the class hierarchy (children, parents), the torch module classes, the buffers
               modules register, the attributes set to Python constants (flags, not tensors), and what
               each constructor was handed (`SetCriterion(matcher=matcher)`: its self.matcher's class)
    names      what a name means at the top of a file: a def, a class or a module (`lookup`), through
               imports, `from pkg import mod`, relative imports and `from .boxes import *`
    classes    the project classes a name, `mod.Cls` or a factory call names (`class_of`, `classes_of`);
               the classes assigned to a name or self attribute (`instances_of`, through base classes'
               __init__ and constructor arguments); a method on a class or its bases (`method`), and its
               overrides in the subclasses

A module is matched to a file by its dotted path's tail (`utils`, `pkg.utils` -> .../pkg/utils.py
or .../utils/__init__.py); an ambiguous name is left alone. graph.Project builds on this to say which
defs a call runs.
"""
from __future__ import annotations

import ast
import re
from functools import cached_property
from pathlib import Path

from gobrrr.lint.bindings import assigned_calls, returned_defs
from gobrrr.lint.picked import picked_classes, registry_classes
from gobrrr.lint.source import DEFS, Source, _constructed

_OTHER = object()   # an attribute assigned something other than a constant
_TAIL = 4   # a module is indexed by the last 1..4 parts of its dotted path


def _python_property(fn: ast.AST) -> bool:
    """`@property def num_frames(self) -> int`: a field of a project batch class that is a Python number or
    string, though the batch holds tensors (sam2's tensorclass batch: its frame count was taken for a tensor)."""
    return any(isinstance(d, ast.Name) and d.id in ("property", "cached_property") for d in fn.decorator_list) \
        and isinstance(fn.returns, ast.Name) and fn.returns.id in ("int", "float", "bool", "str")


# a transformers model class: `PreTrainedModel`, `LlamaModel`, `LlamaForCausalLM`, `T5ForConditionalGeneration`
# (not pydantic's `BaseModel`, nor a bare `Model`)
_HF_MODEL = re.compile(r"(?<!\bBase)(?<=[a-z0-9])(Model|For[A-Z]\w+)$")


def _forward_on_a_library_base(cls: ast.ClassDef, bases: list[str], own: set[str]) -> bool:
    """A class that defines `forward(self, x, ...)` over a base from a library (detectron2's `CascadeROIHeads`,
    `GeneralizedRCNN`): a torch module whose base the project does not hold, not one of its own helper classes
    (nor an autograd Function, whose forward runs only where `.apply` is called)."""
    return any(isinstance(d, ast.FunctionDef) and d.name == "forward" and len(d.args.args) > 1 for d in cls.body) \
        and any(b.rsplit(".", 1)[-1] not in own | {"object", "ABC", "Generic", "Protocol", "Function"} for b in bases)


class Index:
    """Every checked file, indexed once: modules, classes, methods and what names mean (see the module doc)."""

    def __init__(self, sources: list[Source]):
        self.sources = sources
        self.by_tail: dict[tuple[str, ...], list[Source]] = {}
        self.methods: dict[str, list[tuple[Source, ast.AST]]] = {}
        self.by_path: dict[Path, Source] = {}   # path without .py (a package: its folder) -> file
        for s in sources:
            self.by_path[s.module_path] = s
            parts = s.module_path.parts
            for k in range(1, min(len(parts), _TAIL) + 1):
                self.by_tail.setdefault(tuple(parts[-k:]), []).append(s)
            for cls in s.classes.values():
                for d in cls.body:
                    if isinstance(d, DEFS):
                        self.methods.setdefault(d.name, []).append((s, d))
        self._lookups: dict = {}
        self._returns: dict[int, list[ast.Return]] = {}   # id(def) -> its return statements, walked once
        self._defining: dict[str, list[Source]] | None = None   # name -> the checked files defining it (_below)
        self.module_classes = self._module_classes()
        self.buffers = {n.args[0].value for s in sources if "register_buffer" in s.text for n in s.nodes
                        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                        and n.func.attr == "register_buffer" and n.args and isinstance(n.args[0], ast.Constant)
                        and isinstance(n.args[0].value, str)}   # self.register_buffer("action_scale", ...)
        self.children: dict[int, list[tuple[Source, ast.ClassDef]]] = {}   # id(class) -> its direct subclasses
        self.parents: dict[int, list[int]] = {}
        for s in sources:
            for cls in s.classes.values():
                for base in cls.bases:
                    b = self.class_of(s, base)
                    if b is not None and b[1] is not cls:
                        self.children.setdefault(id(b[1]), []).append((s, cls))
                        self.parents.setdefault(id(cls), []).append(id(b[1]))
        self.python_attrs = {t.attr for s in sources for n in s.nodes if isinstance(n, ast.Assign)
                             and isinstance(n.value, ast.Constant) and isinstance(n.value.value, (bool, int, str))
                             for t in n.targets if isinstance(t, ast.Attribute)
                             and not (isinstance(t.value, ast.Name) and t.value.id == "self")}
        self.attr_values: dict[str, set] = {}   # `_C.PIN_MEMORY = False`: what a config attribute is ever set to
        for s in sources:
            for n in s.nodes:
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                            self.attr_values.setdefault(t.attr, set()).add(
                                n.value.value if isinstance(n.value, ast.Constant) else _OTHER)
        self.python_attrs |= {n.args[1].value for s in sources if "setattr" in s.text for n in s.nodes
                              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"
                              and len(n.args) == 3 and isinstance(n.args[1], ast.Constant)
                              and isinstance(n.args[1].value, str)}   # param.allreduce = False: a flag on a tensor
        self.python_attrs |= {n.name for s in sources if "property" in s.text for n in s.nodes
                              if isinstance(n, DEFS) and _python_property(n)}   # batch.num_frames, typed `-> int`
        self.attr_types: dict[tuple[int, str], list] = {}   # (id(cls), attr) -> classes its constructors were given
        self.attr_defs: dict[tuple[int, str], list] = {}    # (id(cls), attr) -> defs its constructors were given
        for s in sources:
            for scope, call in s.ctor_calls:
                for cls_src, cls in self.classes_of(s, call.func):
                    self._type_attrs(s, scope, call, cls_src, cls)

    # -- modules and classes
    def module(self, dotted: str, near: Source) -> Source | None:
        if dotted.startswith("."):   # from .utils import f: a sibling of `near`
            up = len(dotted) - len(dotted.lstrip("."))
            base = near.path.parent
            for _ in range(up - 1):
                base = base.parent
            rest = dotted.lstrip(".")
            want = base.joinpath(*rest.split(".")) if rest else base
            return self.by_path.get(want)
        parts = tuple(dotted.split("."))
        found = self.by_tail.get(parts[-_TAIL:], [])
        if len(parts) > _TAIL:   # onpolicy.algorithms.r_mappo.algorithm.r_actor_critic: indexed by its last four
            found = [s for s in found if s.module_path.parts[-len(parts):] == parts]
        found = [s for s in found if s is not near] or found
        if len(found) > 1:   # several scripts' folders, each with a utils.py: Python finds the one on sys.path,
            found = _nearest(found, near, len(parts))   # the importing script's own folder first
        return found[0] if len(found) == 1 else None

    def lookup(self, src: Source, name: str, depth: int = 0):
        """What `name` means at the top of `src`: ('def', Source, def), ('class', Source, ClassDef),
        ('module', Source, None) or None (cached: the index does not change)."""
        key = (id(src), name)
        if key not in self._lookups:
            self._lookups[key] = self._lookup(src, name, depth)
        return self._lookups[key]

    def _lookup(self, src: Source, name: str, depth: int = 0):
        if name in src.functions:
            return ("def", src, src.functions[name])
        if name in src.classes:
            return ("class", src, src.classes[name])
        if name in src.imports and depth < 3:
            module, attr = src.imports[name]
            if attr is None:
                m = self.module(module, src)
                return ("module", m, None) if m else None
            m = self.module(module, src) if not module.endswith(".") else None
            if m is not None and m is not src and (attr in m.functions or attr in m.classes):
                return self.lookup(m, attr, depth + 1)   # `from NGCF import NGCF` beside NGCF.py: the module's class
                # (Python takes the attribute before a submodule of the same name)
            m = self.module(f"{module}.{attr}" if not module.endswith(".") else module + attr, src)
            if m is not None:
                return ("module", m, None)   # from pkg import utils
            m = self.module(module, src)
            if m is None and not module.startswith("."):
                return self._below(module, attr)
            hit = self.lookup(m, attr, depth + 1) if m is not None and m is not src else None
            return hit if hit is not None or module.startswith(".") else self._on_path(module, attr, src, depth)
        for module in src.stars if depth < 3 else ():   # yolox/utils/__init__.py: from .boxes import *
            m = self.module(module, src)
            hit = self.lookup(m, name, depth + 1) if m is not None and m is not src else None
            if hit is not None:
                return hit
        return None

    def _on_path(self, module: str, attr: str, src: Source, depth: int):
        """`from transformer import Transformer` where the package src/transformer/ lacks it and src/transformer/
        transformer.py has it: each folder is on PYTHONPATH (a path.sh), so that file is meant (Speech-Transformer)."""
        found = [s for s in self.by_tail.get(tuple(module.split("."))[-_TAIL:], [])
                 if s is not src and s.path.name != "__init__.py" and (attr in s.functions or attr in s.classes)]
        return self.lookup(found[0], attr, depth + 1) if len(found) == 1 else None

    def _defining_module(self, src: Source, name: str, depth: int = 0) -> Source | None:
        """The checked module whose top level binds `name`, as `src` imports it by name or with a star."""
        if (id(None), name) in src.instances and depth:
            return src
        if depth >= 3:
            return None
        if name in src.imports:
            module, attr = src.imports[name]
            m = self.module(module, src) if attr is not None and not module.endswith(".") else None
            return self._defining_module(m, attr, depth + 1) if m is not None and m is not src else None
        for module in src.stars:
            m = self.module(module, src)
            if m is not None and m is not src and (hit := self._defining_module(m, name, depth + 1)) is not None:
                return hit
        return None

    def defs_named(self, name: str) -> list:
        """The project's module-level functions called `name`, defined or imported in any checked file: what
        `mod.name(x)` may run when mod is a module picked at run time (at most four; more pins nothing)."""
        key = ("defs_named", name)   # cached with the lookups: the index does not change
        if key not in self._lookups:
            found = {id(h[2]): (h[1], h[2]) for s in self.sources if name in s.functions or name in s.imports
                     for h in [self.lookup(s, name)] if h and h[0] == "def"}
            self._lookups[key] = list(found.values()) if len(found) <= 4 else []
        return list(self._lookups[key])

    def _below(self, package: str, name: str):
        """`from pkg.data import to_numpy` when pkg/data/__init__.py, which re-exports it, was not checked:
        the one checked file below pkg/data that defines `name` (none, or several, is no answer)."""
        if self._defining is None:   # built on first use
            self._defining = {}
            for s in self.sources:
                for n in {*s.functions, *s.classes}:
                    self._defining.setdefault(n, []).append(s)
        want = tuple(package.split("."))
        found = [s for s in self._defining.get(name, [])
                 if any(s.path.parts[i:i + len(want)] == want for i in range(len(s.path.parts) - len(want)))]
        if len(found) != 1:
            return None
        s = found[0]
        return ("def", s, s.functions[name]) if name in s.functions else ("class", s, s.classes[name])

    def class_of(self, src: Source, expr: ast.AST):
        """(Source, ClassDef) that `Cls` / `mod.Cls` names, or None."""
        hit = self._named(src, expr)
        return (hit[1], hit[2]) if hit and hit[0] == "class" else None

    def _named(self, src: Source, expr: ast.AST):
        if isinstance(expr, ast.Name):
            return self.lookup(src, expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, (ast.Name, ast.Attribute)):
            hit = self._named(src, expr.value)   # K.sampling.sample_lms: a module of a module
            if hit and hit[0] == "module":
                found = self.lookup(hit[1], expr.attr)
                if found is None and hit[1].path.name == "__init__.py":   # `import opennre`, then
                    m = self.module("." + expr.attr, hit[1])   # `opennre.model.BagAttention`: a subpackage
                    found = ("module", m, None) if m is not None and m is not hit[1] else None   # it never imports
                return found
        return None

    def classes_of(self, src: Source, made: ast.AST, depth: int = 0, cls: ast.ClassDef | None = None,
                   scope: ast.AST | None = None) -> list:
        """The project classes an object is made from: `Cls`, or a factory call whose returns build one:
        a function (`build_matcher(args)`), or a method of `cls`, the class the call is made in, and its
        overrides in the subclasses (`self.criterion = self.init_criterion()`); `made` may stand for one
        item of the tuple the call returns (`self.stats, self.loss = self._get_losses(opt)`); `scope`, the def
        the call is made in, where a registry may be a dict of its own (picked.registry_classes)."""
        item = None
        if isinstance(made, ast.Subscript) and isinstance(made.value, ast.Call):
            item, made = made.slice.value, made.value
        if isinstance(made, ast.Call):
            made = made.func
        if isinstance(made, ast.Subscript) and isinstance(made.value, ast.Name):   # ALGOS[args.algo](...): a
            return registry_classes(self, src, made.value.id, scope, depth)   # dict of classes, each a possible one
        hit = self._named(src, made)
        if hit and hit[0] == "class" and item is None:
            return [(hit[1], hit[2])]
        if hit is None and item is None and "import_module" in src.text:   # getattr(import_module(f"m.{n}"), n)
            key = ("picked", id(src), made.id if isinstance(made, ast.Name) else id(made))
            if key not in self._lookups:
                self._lookups[key] = picked_classes(self, src, made)
            return self._lookups[key]
        if depth >= 2:
            return []
        if hit and hit[0] == "def":   # def build_matcher(args): return HungarianMatcher(...)
            return self._returned_classes(hit[1], hit[2], depth, item)
        if cls is None or not (isinstance(made, ast.Attribute) and isinstance(made.value, ast.Name)
                               and made.value.id == "self"):
            return []
        key = ("factory", id(src), id(cls), made.attr, item, depth)
        if key not in self._lookups:
            own = self.method(src, cls, made.attr)
            out: list = []
            for ds, df in ([own] if own else []) + self.overrides(cls, made.attr):
                out += [c for c in self._returned_classes(ds, df, depth, item) if c not in out]
            self._lookups[key] = out
        return self._lookups[key]

    def _returned_classes(self, src: Source, fn: ast.AST, depth: int, item: int | None) -> list:
        """The project classes `fn` returns built (`return Cls(...)`, `evaluator = Cls(...); return
        evaluator`), or as item `item` of the tuple it returns."""
        out: list = []
        owner = src.owner.get(id(fn))
        if id(fn) not in self._returns:
            self._returns[id(fn)] = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
        for n in self._returns[id(fn)]:
            value = n.value
            if item is not None:
                if not (isinstance(value, ast.Tuple) and len(value.elts) > item):
                    continue
                value = value.elts[item]
            if _constructed(value) is not None:
                out += [c for c in self.classes_of(src, _constructed(value), depth + 1, owner, fn) if c not in out]
            elif isinstance(value, ast.Name):   # evaluator = Cls(...); return evaluator
                for made_by in assigned_calls(src, value.id, fn):
                    out += [c for c in self.classes_of(src, made_by, depth + 1, owner) if c not in out]
        return out

    def _type_attrs(self, src: Source, scope, call: ast.Call, cls_src: Source, cls: ast.ClassDef) -> None:
        """`SetCriterion(n, matcher=matcher)` with matcher built from a class: SetCriterion's self.matcher is one."""
        init = self.method(cls_src, cls, "__init__")
        if init is None:
            return
        params = [a.arg for a in [*init[1].args.posonlyargs, *init[1].args.args]][1:]
        pairs = [*zip(params, call.args), *((k.arg, k.value) for k in call.keywords if k.arg)]
        for param, arg in pairs:
            attrs = init[0].param_attrs.get((id(cls), param))
            if not attrs or isinstance(arg, ast.Starred):
                continue
            insts = self.instances_of(src, arg, scope)
            fn = self._def_named(src, arg, scope) if not insts else None
            for attr in attrs:
                self.attr_types.setdefault((id(cls), attr), []).extend(insts)
                if fn is not None:   # Policy(actor, dist_fn=dist): self.dist_fn(logits) runs the script's def dist
                    self.attr_defs.setdefault((id(cls), attr), []).append(fn)

    def _def_named(self, src: Source, arg: ast.AST, scope) -> tuple | None:
        """(Source, def) that the name `arg` passed at a call in `scope` is: a def nested there, or the file's; or
        the def a factory called there returns (`Trainer(model, train_functions.model_fn_decorator(), ...)`)."""
        if isinstance(arg, ast.Call) and not arg.args and not arg.keywords:
            factory = self._def_named(src, arg.func, scope) if isinstance(arg.func, ast.Name) else \
                self._module_def(src, arg.func)
            made = returned_defs(*factory) if factory is not None else []
            return made[0] if len(made) == 1 else None
        if not isinstance(arg, ast.Name):
            return None
        s = scope
        while s is not None:
            for d in getattr(s, "body", []):
                if isinstance(d, DEFS) and d.name == arg.id:
                    return (src, d)
            s = src.parent.get(id(s))
        hit = self.lookup(src, arg.id)
        return (hit[1], hit[2]) if hit and hit[0] == "def" else None

    def _module_def(self, src: Source, func: ast.AST) -> tuple | None:
        """(Source, def) of `module.fn` with `module` a project module this file imports."""
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return None
        hit = self._named(src, func)
        return (hit[1], hit[2]) if hit and hit[0] == "def" else None

    def method(self, src: Source, cls: ast.ClassDef, name: str, seen=None):
        """(Source, def) of `name` on `cls` or its bases (own first), else None."""
        seen = seen or set()
        if id(cls) in seen:
            return None
        seen.add(id(cls))
        for d in cls.body:
            if isinstance(d, DEFS) and d.name == name:
                return (src, d)
        for base in cls.bases:
            b = self.class_of(src, base)
            if b is not None:
                hit = self.method(b[0], b[1], name, seen)
                if hit:
                    return hit
        return None

    def _inherited_instances(self, src: Source, cls: ast.ClassDef, attr: str, depth: int = 0) -> list:
        """`self.diagnostics` set in a base class's __init__ (in any checked file)."""
        out = list(self.attr_types.get((id(cls), attr), []))
        for base in cls.bases:
            b = self.class_of(src, base) if depth < 4 else None
            if b is None or b[1] is cls:
                continue
            made = b[0].instances.get((id(b[1]), attr), [])
            for m in made:
                out += [hit for hit in self.classes_of(b[0], m, cls=b[1]) if hit not in out]
            if not made:
                out += [hit for hit in self._inherited_instances(b[0], b[1], attr, depth + 1) if hit not in out]
        return out

    def _module_classes(self) -> set[str]:
        """Names of the project's classes that are torch modules (a base named *Module*, a transformers model
        such as `LlamaForCausalLM` or `CLIPVisionModel`, or a base that is one of these), by fixed point over
        the bases."""
        out: set[str] = set()
        own = {c.name for s in self.sources for c in s.classes.values()}
        changed = True
        while changed:
            changed = False
            for s in self.sources:
                for cls in s.classes.values():
                    if cls.name in out:
                        continue
                    bases = [ast.unparse(b) for b in cls.bases]
                    if any(b.rsplit(".", 1)[-1] in out or b.endswith("Module") or _HF_MODEL.search(b) for b in bases) \
                            or _forward_on_a_library_base(cls, bases, own) and "torch" in s.text:
                        out.add(cls.name)
                        changed = True
        return out

    def is_module_class(self, src: Source, cls: ast.ClassDef) -> bool:
        return cls.name in self.module_classes

    @cached_property
    def plain_classes(self) -> frozenset:
        """Names of the project's classes of no base (or `object`): callable objects (`EarlyStopping`), never modules."""
        return frozenset(c.name for s in self.sources for c in s.classes.values()
                         if all(isinstance(b, ast.Name) and b.id == "object" for b in c.bases)) - self.module_classes

    # -- the class hierarchy
    def overrides(self, cls: ast.ClassDef, name: str, limit: int = 6) -> list:
        """(Source, def) of `name` as the project's subclasses of `cls` (at any depth) define it."""
        out, seen, todo = [], {id(cls)}, list(self.children.get(id(cls), []))
        while todo and len(out) < limit:
            s, c = todo.pop(0)
            if id(c) in seen:
                continue
            seen.add(id(c))
            out += [(s, d) for d in c.body if isinstance(d, DEFS) and d.name == name]
            todo += self.children.get(id(c), [])
        return out[:limit]

    def ancestors(self, cls_id: int) -> set[int]:
        out, todo = set(), [cls_id]
        while todo:
            c = todo.pop()
            if c not in out:
                out.add(c)
                todo += self.parents.get(c, [])
        return out

    # -- instances
    def class_around(self, src: Source, scope: ast.AST | None) -> ast.ClassDef | None:
        s = scope
        while s is not None:
            cls = src.owner.get(id(s))
            if cls is not None:
                return cls
            s = src.parent.get(id(s))
        return None

    def _attr_instances(self, src: Source, cls: ast.ClassDef, attr: str) -> list:
        """[(Source, ClassDef)] of the project classes a class's methods assign to `self.<attr>`."""
        made = src.instances.get((id(cls), attr), [])
        if not made:
            return self._inherited_instances(src, cls, attr) if id(cls) in self.parents \
                else list(self.attr_types.get((id(cls), attr), []))
        out: list = []
        for hit in (hit for m in made for hit in self.classes_of(src, m, cls=cls)):
            if hit not in out:
                out.append(hit)
        return out or list(self.attr_types.get((id(cls), attr), []))   # nn.DataParallel(model): what was handed in

    def instances_of(self, src: Source, node: ast.AST, scope: ast.AST | None, types=None) -> list:
        """[(Source, ClassDef)] of the project classes assigned to a name or self attribute."""
        made: list = []
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):   # dt[0] of dt = (A(), A())
            node = ast.Name(id=node.value.id + "[]", ctx=ast.Load())
        if isinstance(node, ast.Name):
            if types and node.id in types:
                return types[node.id]
            s = scope
            while not made and s is not None:
                made = src.instances.get((id(s), node.id), [])
                s = src.parent.get(id(s))
            made = made or src.instances.get((id(None), node.id), [])
            if not made and (node.id in src.imports or src.stars):   # data_generator, made at the top of the module
                there = self._defining_module(src, node.id)   # it came from (`from utility.batch_test import *`)
                if there is not None:
                    return [h for m in there.instances.get((id(None), node.id), [])[:2] for h in self.classes_of(there, m)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            cls = self.class_around(src, scope)
            return self._attr_instances(src, cls, node.attr) if cls is not None else []
        elif isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            out = []   # agent.replay_buffer, self.agent.buffer: the attribute of an object whose class is known
            for osrc, ocls in self.instances_of(src, node.value, scope, types)[:4]:
                for hit in self._attr_instances(osrc, ocls, node.attr):
                    if hit not in out:
                        out.append(hit)
            return out
        out = []
        around = self.class_around(src, scope) if made else None
        for m in made:
            for hit in self.classes_of(src, m, cls=around):
                if hit not in out:
                    out.append(hit)
        return out


def _nearest(found: list[Source], near: Source, depth: int) -> list[Source]:
    """Of the files an absolute import matches, those whose import root (the folder it is found from) is the
    importing file's folder or the closest folder above it: `python main.py` puts main.py's folder on sys.path."""
    ranked: dict[int, list[Source]] = {}
    for s in found:
        root = s.module_path.parents[depth - 1]
        if root == near.path.parent or root in near.path.parent.parents:
            ranked.setdefault(len(root.parts), []).append(s)
    return ranked[max(ranked)] if ranked else found


__all__ = ["Index"]
