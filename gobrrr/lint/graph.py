"""The project's own functions and classes, indexed once per run, and the def that a call runs.

    index      every checked file parsed once (source.py: Source), gathered into one Project per run
               (Project.builds counts it).
    resolve    a call in hot code -> the project defs it runs:
                 f(x)              a nested, module-level or imported function (`from utils import f`)
                 mod.f(x)          a function of an imported module (`import utils`, `from pkg import utils`)
                 self.m(x)         a method of this class or of a base class (bases in any checked file)
                 Cls.m(x)          a method of a named class
                 obj.m(x), obj(x)  a method of the class assigned to obj (`obj(x)` runs its forward)
                 self.m(x)         also the overrides of m in the project's subclasses (a base class's
                                   loop calling a hook its subclasses define)
                 anything.m(x)     a method that only one class of the project defines, or only the
                                   classes of one hierarchy (all of them; not a common name)
                 buf.m(x), unknown the classes buf is named after (`replay_buffer` -> ReplayBuffer and its
                                   subclasses, `proposal_matcher` -> Matcher; see _named_like)
                 fn(x)             with `fn = functools.partial(g, k=v)` in a def around: g, given k=v too;
                                   with `fn = get_step_fn(cfg)`: the def nested in get_step_fn that it returns
                 wrap(g)(x)        g: a wrapper made at the call site (`retry_if_cuda_oom(self.matcher)(iou)`)
                 Cls(x)            its __init__: a constructor called in hot code runs every step
                 pkg.mod.f(x)      through a chain of modules (`import k_diffusion as K; K.sampling.f`)
                 torch.min(a, b)   nothing: a module from outside the project is never a project method
                 obj(x), unknown   an object built from a config: the class named like it (augment_pipe ->
                                   AugmentPipe), or the __call__/forward taking all of the call's keywords
Names imported with `from .boxes import *` are found in that module.

A module is matched to a file by its dotted path's tail (`utils`, `pkg.utils` -> .../pkg/utils.py
or .../utils/__init__.py); an ambiguous name is left alone.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from gobrrr.lint.bindings import assigned_calls, returned_defs
from gobrrr.lint.loops import name_of
from gobrrr.lint.source import DEFS, Source, _constructed

# method names too common to pin to one class by name alone (torch, Python and framework APIs)
GENERIC = {"forward", "step", "update", "reset", "train", "eval", "get", "set", "run", "call", "apply", "append",
           "extend", "add", "save", "load", "close", "start", "stop", "log", "info", "debug", "warning", "format",
           "items", "keys", "values", "pop", "copy", "clone", "to", "cuda", "cpu", "item", "sum", "mean", "view",
           "reshape", "backward", "zero_grad", "state_dict", "load_state_dict", "parameters", "named_parameters",
           "modules", "children", "register_buffer", "sample", "read", "write", "flush", "join", "split", "strip",
           "encode", "decode", "build", "init", "setup", "prepare", "compute", "process", "transform", "predict",
           "__call__", "__init__", "__getitem__", "__len__", "__iter__", "__next__", "__enter__", "__exit__"}


# object names that say nothing of their class (`self.module.step()`, `trainer.fit()`)
VAGUE = {"module", "modules", "model", "models", "trainer", "wrapper", "object", "config", "handler", "helper",
         "manager", "runner", "self", "other", "instance", "engine", "worker", "loader", "dataset", "client"}


class Project:
    """Every checked file, indexed once; resolves calls to project defs (see the module doc)."""

    builds = 0   # how many Project indexes were built in this process (a test checks one per run)

    def __init__(self, sources: list[Source]):
        Project.builds += 1
        self.sources = sources
        self.by_tail: dict[tuple[str, ...], list[Source]] = {}
        self.methods: dict[str, list[tuple[Source, ast.AST]]] = {}
        self.by_path: dict[Path, Source] = {}   # path without .py (a package: its folder) -> file
        for s in sources:
            self.by_path[s.path.parent if s.path.name == "__init__.py" else s.path.with_suffix("")] = s
            p = s.path.with_suffix("")
            parts = p.parts if s.path.name != "__init__.py" else p.parent.parts
            for k in range(1, min(len(parts), 4) + 1):
                self.by_tail.setdefault(tuple(parts[-k:]), []).append(s)
            for cls in s.classes.values():
                for d in cls.body:
                    if isinstance(d, DEFS):
                        self.methods.setdefault(d.name, []).append((s, d))
        self._lookups: dict = {}
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
        self.summaries: dict = {}   # (id(def), argument kinds) -> the kind it returns (rules.summarize)
        self.python_attrs = {t.attr for s in sources for n in s.nodes if isinstance(n, ast.Assign)
                             and isinstance(n.value, ast.Constant) and isinstance(n.value.value, (bool, int, str))
                             for t in n.targets if isinstance(t, ast.Attribute)
                             and not (isinstance(t.value, ast.Name) and t.value.id == "self")}
        self.python_attrs |= {n.args[1].value for s in sources if "setattr" in s.text for n in s.nodes
                              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"
                              and len(n.args) == 3 and isinstance(n.args[1], ast.Constant)
                              and isinstance(n.args[1].value, str)}   # param.allreduce = False: a flag on a tensor
        self._following: set = set()   # (file, name, scope) whose assigned call is being resolved (no cycles)
        self._like: dict[str, list] = {}   # an object's name key -> the classes it is named after (_named_like)
        self._by_lower: dict | None = None   # lower-cased class name -> [(Source, ClassDef)], built on first use
        self.per_file: dict[int, dict] = {}   # id(Source) -> what the checkers of that file compute once
        self.per_class: dict[int, dict] = {}   # id(ClassDef) -> what its methods set self attributes to (calls._class_attrs)
        self.looping: set[str] = set()   # names of the defs that hold a step loop (set by check.check_sources)
        self.hotmaps: dict = {}     # id(Source) -> its HotMap, once built
        self.attr_types: dict[tuple[int, str], list] = {}   # (id(cls), attr) -> classes its constructors were given
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
        found = self.by_tail.get(tuple(dotted.split(".")), [])
        found = [s for s in found if s is not near] or found
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
            m = self.module(f"{module}.{attr}" if not module.endswith(".") else module + attr, src)
            if m is not None:
                return ("module", m, None)   # from pkg import utils
            m = self.module(module, src)
            return self.lookup(m, attr, depth + 1) if m is not None and m is not src else None
        for module in src.stars if depth < 3 else ():   # yolox/utils/__init__.py: from .boxes import *
            m = self.module(module, src)
            hit = self.lookup(m, name, depth + 1) if m is not None and m is not src else None
            if hit is not None:
                return hit
        return None

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
                return self.lookup(hit[1], expr.attr)
        return None

    def classes_of(self, src: Source, made: ast.AST, depth: int = 0) -> list:
        """The project classes an object is made from: `Cls`, or a factory call whose returns build one."""
        if isinstance(made, ast.Call):
            made = made.func
        hit = self._named(src, made)
        if hit and hit[0] == "class":
            return [(hit[1], hit[2])]
        if hit and hit[0] == "def" and depth < 2:   # def build_matcher(args): return HungarianMatcher(...)
            out = []
            for n in ast.walk(hit[2]):
                if isinstance(n, ast.Return) and n.value is not None and _constructed(n.value) is not None:
                    out += self.classes_of(hit[1], _constructed(n.value), depth + 1)
                elif isinstance(n, ast.Return) and isinstance(n.value, ast.Name):   # evaluator = Cls(...); return it
                    for made_by in assigned_calls(hit[1], n.value.id, hit[2]):
                        out += [c for c in self.classes_of(hit[1], made_by, depth + 1) if c not in out]
            return out
        return []

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
            for attr in attrs:
                self.attr_types.setdefault((id(cls), attr), []).extend(insts)

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
                out += [hit for hit in self.classes_of(b[0], m) if hit not in out]
            if not made:
                out += [hit for hit in self._inherited_instances(b[0], b[1], attr, depth + 1) if hit not in out]
        return out

    def _module_classes(self) -> set[str]:
        """Names of the project's classes that are torch modules (a base named *Module*, or a base
        that is one of these), by fixed point over the bases."""
        out: set[str] = set()
        changed = True
        while changed:
            changed = False
            for s in self.sources:
                for cls in s.classes.values():
                    if cls.name in out:
                        continue
                    bases = [ast.unparse(b) for b in cls.bases]
                    if any(b.rsplit(".", 1)[-1] in out or b.endswith("Module") or b.endswith("LightningModule")
                           for b in bases):
                        out.add(cls.name)
                        changed = True
        return out

    def is_module_class(self, src: Source, cls: ast.ClassDef) -> bool:
        return cls.name in self.module_classes

    # -- calls
    def resolve(self, src: Source, call: ast.Call, scope: ast.AST | None, types=None,
                fallback: bool = True) -> list[tuple[Source, ast.AST]]:
        """The project defs `call` may run, from inside `scope` (a def, or None at module level) of
        `src`. `types`: parameter name -> [(Source, ClassDef)] handed over from a call site."""
        f = call.func
        if isinstance(f, ast.Name):
            s = scope
            while s is not None:   # a def nested in an enclosing def
                for d in getattr(s, "body", []):
                    if isinstance(d, DEFS) and d.name == f.id:
                        return [(src, d)]
                s = src.parent.get(id(s))
            hit = self.lookup(src, f.id)
            if hit and hit[0] == "def":
                return [(hit[1], hit[2])]
            if hit and hit[0] == "class":
                return self._init(hit[1], hit[2])   # Cls(x) in hot code: its __init__ runs every step
            found = self._forwards(self.instances_of(src, f, scope, types))   # net(x): its class's forward
            key = (id(src), f.id, id(scope))
            if not found and key not in self._following:   # `fn = wrap(fn)`, `f = partial(f, ...)` do not recur
                self._following.add(key)
                try:
                    found = self._made_by(src, call, f.id, scope, types, fallback)
                finally:
                    self._following.discard(key)
            return found or (self._callables(f.id, call) if fallback else [])
        if isinstance(f, ast.Call) and len(f.args) == 1 and not f.keywords \
                and isinstance(f.args[0], (ast.Name, ast.Attribute)):   # retry_if_cuda_oom(self.matcher)(iou):
            return self.resolve(src, ast.Call(func=f.args[0], args=call.args, keywords=call.keywords),  # a wrapper
                                scope, types, fallback)   # made at the call site runs what it wraps
        if isinstance(f, ast.Subscript):   # loss_map[name](...) with loss_map = {"a": self.loss_a, ...}
            return [hit for v in self._dict_values(src, f.value, scope)
                    for hit in self.resolve(src, ast.Call(func=v, args=call.args, keywords=call.keywords), scope, types)]
        if not isinstance(f, ast.Attribute):
            return []
        recv = f.value
        if isinstance(recv, ast.Name) and recv.id == "self":
            cls = self._class_around(src, scope)
            if cls is not None:
                hit = self.method(src, cls, f.attr)
                found = ([hit] if hit else []) + self.overrides(cls, f.attr)
                if found:
                    return found
            insts = self.instances_of(src, f, scope, types)   # self.criterion(out, y)
            if insts:
                return self._forwards(insts)
        elif isinstance(recv, ast.Name):
            hit = self.lookup(src, recv.id)
            if hit and hit[0] == "module":
                inner = self.lookup(hit[1], f.attr)
                if inner and inner[0] == "class":
                    return self._init(inner[1], inner[2])   # mod.Cls(x)
                return [(inner[1], inner[2])] if inner and inner[0] == "def" else []
            if hit and hit[0] == "class":
                found = self.method(hit[1], hit[2], f.attr)
                return [found] if found else []
            if hit is None and recv.id in src.imports and src.imports[recv.id][1] is None:
                return []   # torch.min(a, b), np.max(x): a module from outside the project
        if isinstance(recv, ast.Attribute) and isinstance(recv.value, (ast.Name, ast.Attribute)):
            hit = self._named(src, recv)
            if hit and hit[0] == "module":   # K.sampling.sample_lms(model, x, sigmas)
                inner = self.lookup(hit[1], f.attr)
                if inner and inner[0] == "class":
                    return self._init(inner[1], inner[2])
                return [(inner[1], inner[2])] if inner and inner[0] == "def" else []
        insts = self.instances_of(src, recv, scope, types)     # obj.m(x), self.obj.m(x)
        if insts:   # and its siblings among the classes it is named after: `predictor_obj = NonePredictor(...)` in
            seen = set().union(*(self._ancestors(id(c)) for _, c in insts))   # one branch, `predictor(...)` of a
            insts += [c for c in self._named_like(recv)   # parameter (another Predictor subclass) in the other
                      if c not in insts and self._ancestors(id(c[1])) & seen]
            return [hit for inst in insts if (hit := self.method(*inst, f.attr))]
        if not fallback or f.attr.startswith("__"):
            return []
        like = self._named_like(recv)
        named = [hit for inst in like if (hit := self.method(*inst, f.attr))]
        if named:   # replay_buffer.sample(n) with replay_buffer a parameter: ReplayBuffer's sample, or a subclass's
            return (named + [o for inst in like for o in self.overrides(inst[1], f.attr)])[:6]
        if f.attr in GENERIC:
            return []
        only = self.methods.get(f.attr, [])
        if len(only) == 1:
            return only[:1]
        return only if 1 < len(only) <= 8 and self._one_hierarchy(only) else []

    def _callables(self, name: str, call: ast.Call) -> list:
        """An object built where the lint cannot see (a config names its class) and called:
        `augment_pipe(images)` runs the project's class AugmentPipe; `loss_fn(net=ddp, images=x,
        labels=y)` runs the __call__ / forward whose parameters take all of those keywords (at most 6)."""
        self._classes_by_lower()
        found = self._by_lower.get(name.replace("_", "").lower(), []) if "_" in name else []
        hits = self._forwards(found)
        if hits or len([k for k in call.keywords if k.arg]) < 2:
            return hits
        keys = {k.arg for k in call.keywords if k.arg}
        out = [(s, d) for s, d in self.methods.get("__call__", []) + self.methods.get("forward", [])
               if keys <= {a.arg for a in [*d.args.posonlyargs, *d.args.args, *d.args.kwonlyargs]}]
        return out if len(out) <= 6 else []

    def _made_by(self, src: Source, call: ast.Call, name: str, scope, types, fallback: bool) -> list:
        """What `name(...)` runs when `name` was assigned a call: a partial's function, a factory's nested def."""
        found: list = []
        for made in assigned_calls(src, name, scope)[:4]:
            if name_of(made.func) == "partial" and made.args:
                found += self.resolve(src, ast.Call(func=made.args[0], args=[*made.args[1:], *call.args],
                                                    keywords=[*made.keywords, *call.keywords]), scope, types, fallback)
            else:   # train_step_fn = losses.get_step_fn(sde, ...): the def the factory returns
                found += [hit for fs, fn in self.resolve(src, made, scope, types, fallback=False)[:3]
                          for hit in returned_defs(fs, fn)]
        return found

    def _named_like(self, recv: ast.AST) -> list:
        """The project classes an object of unknown origin is named after (`replay_buffer`, `self.rollout_buffer`
        -> ReplayBuffer, DictRolloutBuffer): the class name, lower-cased, equals or ends with the object's
        last name without underscores (and without an `_obj` or `_fn` suffix), or, failing that, the name ends
        with a class name of six letters or more (`proposal_matcher` -> Matcher). Names under five letters
        (`env`, `net`) or vague (`model`) pin nothing; nor do more than three classes, unless they are one
        hierarchy (at most eight: `predictor_obj` -> the Predictor subclasses)."""
        name = recv.id if isinstance(recv, ast.Name) else recv.attr if isinstance(recv, ast.Attribute) else ""
        key = re.sub(r"_(obj|object|fn|inst|instance)$", "", name).replace("_", "").lower()   # predictor_obj
        if len(key) < 5 or key in VAGUE:
            return []
        if key not in self._like:
            self._like[key] = self._classes_named(key)
        return list(self._like[key])

    def _classes_named(self, key: str) -> list:
        self._classes_by_lower()
        found = [c for low, cs in self._by_lower.items() if low.endswith(key) for c in cs]
        if not found:   # self.proposal_matcher -> Matcher, self.box2box_transform -> Box2BoxTransform
            found = [c for low, cs in self._by_lower.items() if len(low) >= 6 and key.endswith(low) for c in cs]
        if len(found) <= 3:
            return found
        return found if len(found) <= 8 and self._one_hierarchy([(s, c) for s, c in found], classes=True) else []

    def _classes_by_lower(self) -> None:
        if self._by_lower is None:
            self._by_lower = {}
            for s in self.sources:
                for c in s.classes.values():
                    self._by_lower.setdefault(c.name.lower(), []).append((s, c))

    def _init(self, src: Source, cls: ast.ClassDef) -> list:
        hit = self.method(src, cls, "__init__")
        return [hit] if hit else []

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

    def _ancestors(self, cls_id: int) -> set[int]:
        out, todo = set(), [cls_id]
        while todo:
            c = todo.pop()
            if c not in out:
                out.add(c)
                todo += self.parents.get(c, [])
        return out

    def _one_hierarchy(self, defs, classes: bool = False) -> bool:
        """The classes defining these methods (or these classes) share a project base class (an observer
        and its subclasses)."""
        owners = [d if classes else s.owner.get(id(d)) for s, d in defs]
        if any(o is None for o in owners):
            return False
        common = self._ancestors(id(owners[0]))
        for o in owners[1:]:
            common &= self._ancestors(id(o))
        return bool(common)

    def _dict_values(self, src: Source, node: ast.AST, scope) -> list[ast.AST]:
        if not isinstance(node, ast.Name) or scope is None:
            return []
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict) \
                    and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets):
                return [v for v in n.value.values if isinstance(v, (ast.Name, ast.Attribute))]
        return []

    def _forwards(self, insts) -> list:
        return [hit for inst in insts if (hit := self.method(*inst, "forward") or self.method(*inst, "__call__"))]

    def _class_around(self, src: Source, scope: ast.AST | None) -> ast.ClassDef | None:
        s = scope
        while s is not None:
            cls = src.owner.get(id(s))
            if cls is not None:
                return cls
            s = src.parent.get(id(s))
        return None

    def instances_of(self, src: Source, node: ast.AST, scope: ast.AST | None, types=None) -> list:
        """[(Source, ClassDef)] of the project classes assigned to a name or self attribute."""
        made: list = []
        if isinstance(node, ast.Name):
            if types and node.id in types:
                return types[node.id]
            s = scope
            while not made and s is not None:
                made = src.instances.get((id(s), node.id), [])
                s = src.parent.get(id(s))
            made = made or src.instances.get((id(None), node.id), [])
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            cls = self._class_around(src, scope)
            if cls is None:
                return []
            made = src.instances.get((id(cls), node.attr), [])
            if not made and id(cls) in self.parents:
                return self._inherited_instances(src, cls, node.attr)
            if not made:
                return list(self.attr_types.get((id(cls), node.attr), []))
        out = []
        for m in made:
            for hit in self.classes_of(src, m):
                if hit not in out:
                    out.append(hit)
        return out


__all__ = ["Project"]
