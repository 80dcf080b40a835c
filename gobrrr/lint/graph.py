"""The call graph of `gobrrr lint`: the project defs that a call runs.

    project    one Project per run (Project.builds counts them) over index.Index, which holds every
               checked file parsed once and says what a name, a class or an instance is
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
                                   subclasses, `proposal_matcher` -> Matcher; see _named_like); when the
                                   project has too many (one-file scripts, each with its Actor), the
                                   calling file's own class, or the one method of that name it defines;
                                   failing those, the classes of the folder named after it, for a component
                                   a registry builds (`self.dense_head` -> the classes in dense_heads/)
                 fn(x)             with fn a parameter: the def a call site handed it (DiffDock's loss_fn)
                 fn(x)             with `fn = functools.partial(g, k=v)` in a def around: g, given k=v too;
                                   with `fn = get_step_fn(cfg)`: the def nested in get_step_fn that it returns
                 wrap(g)(x)        g: a wrapper made at the call site (`retry_if_cuda_oom(self.matcher)(iou)`)
                 metric(x)         named after a project base class its subclasses override: every __call__
                 self.cells[i](x)  the forward of the classes the module appended to self.cells
                 self.propagate()  a PyG layer's own message / aggregate / update
                 table[k](x)       every function of the dict literal assigned to table (in the def around,
                                   at module level, or to self.table in a method: `loss_map[loss](out, y)`)
                 Cls(x)            its __init__: a constructor called in hot code runs every step
                 @deco def f       (wrappers) the inner def a project decorator returns runs with f, per call
                 pkg.mod.f(x)      through a chain of modules (`import k_diffusion as K; K.sampling.f`)
                 M.f(x)            with `M = importlib.import_module(name)`: the project's functions named f
                 torch.min(a, b)   nothing: a module from outside the project is never a project method
                 obj(x), unknown   an object built from a config: the class named like it (augment_pipe ->
                                   AugmentPipe), or the __call__/forward taking all of the call's keywords
Names imported with `from .boxes import *` are found in that module (index.py: how a module is
matched to a file). The per-run caches of the checkers (summaries, per_file, per_class, hotmaps) live
on the Project too.
"""
from __future__ import annotations

import ast

from gobrrr.lint.bindings import (
    assigned_calls,
    assigned_functions,
    assigned_methods,
    module_attrs,
    param_default,
    param_names,
    picked_tables,
    returned_defs,
    through_partial,
)
from gobrrr.lint.index import Index
from gobrrr.lint.loops import local_def, partial_target
from gobrrr.lint.names import folder_key, object_key, self_attr
from gobrrr.lint.source import DEFS, Source

# method names too common to pin to one class by name alone (torch, Python and framework APIs)
GENERIC = {"forward", "step", "update", "reset", "train", "eval", "get", "set", "run", "call", "apply", "append",
           "extend", "add", "save", "load", "close", "start", "stop", "log", "info", "debug", "warning", "format",
           "items", "keys", "values", "pop", "copy", "clone", "to", "cuda", "cpu", "item", "sum", "mean", "view", "numpy",
           "tolist", "detach", "float", "half", "long", "int", "double", "bool", "contiguous",
           "reshape", "backward", "zero_grad", "state_dict", "load_state_dict", "parameters", "named_parameters",
           "modules", "children", "register_buffer", "sample", "read", "write", "flush", "join", "split", "strip",
           "encode", "decode", "build", "init", "setup", "prepare", "compute", "process", "transform", "predict",
           "__call__", "__init__", "__getitem__", "__len__", "__iter__", "__next__", "__enter__", "__exit__"}


# what torch_geometric's MessagePassing.propagate(edge_index, **kwargs) calls on the layer (HGTConv's message/update)
_PYG_HOOKS = ("message", "aggregate", "message_and_aggregate", "update")

# object names that say nothing of their class (`self.module.step()`, `trainer.fit()`)
VAGUE = {"module", "modules", "model", "models", "trainer", "wrapper", "object", "config", "handler", "helper",
         "manager", "runner", "self", "other", "instance", "engine", "worker", "loader", "dataset", "client"}


class Project(Index):
    """Every checked file, indexed once (index.Index); resolves calls to project defs (see the module doc)."""

    builds = 0   # how many Project indexes were built in this process (a test checks one per run)

    def __init__(self, sources: list[Source]):
        Project.builds += 1
        super().__init__(sources)
        self.summaries: dict = {}   # (id(def), argument kinds) -> the kind it returns (rules.summarize)
        self.summary_cut: dict = {}   # such a key -> the depth its walk stopped following calls at
        self.generators = {n.name for s in sources if "yield" in s.text for n in s.nodes   # defs that yield: a
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))   # loader wrapped in one
                           and any(isinstance(y, (ast.Yield, ast.YieldFrom)) for y in ast.walk(n))}   # (callkinds)
        self._following: set = set()   # (file, name, scope) whose assigned call is being resolved (no cycles)
        self._like: dict = {}   # an object's name key (and folder, for _named_near) -> the classes it is named after
        self._by_lower: dict | None = None   # lower-cased class name -> [(Source, ClassDef)], built on first use
        self.per_file: dict[int, dict] = {}   # id(Source) -> what the checkers of that file compute once
        self.per_class: dict[int, dict] = {}   # id(ClassDef) -> what its methods set self attributes to (calls._class_attrs)
        self.looping: set[str] = set()   # names of the defs that hold a step loop (set by check.check_sources)
        self.housekeeping_looping: set[str] = set()   # such names that models also have (`train`): seeds only
        self.hotmaps: dict = {}     # id(Source) -> its HotMap, once built
        self.numpy_unpacks: frozenset | None = None   # name tuples a value is unpacked into for numpy (scopes)
        self._assigned: dict = {}   # ("assigns", id(ClassDef)) -> its `self.<attr> = ...` (_self_assigns); a def's
        #                             wrappers; what a factory stored on self returns (("factory", id, attr))

    # -- calls
    def only_method(self, func: ast.AST) -> list[tuple[Source, ast.AST]]:
        """`obj.get_z0` of an object of unknown class: the project's one method of that name, if there is exactly
        one and the name is not a common one (`sample`, `forward`): resolve's last resort, and what the call
        returns for the kinds (calls.return_kind)."""
        if not isinstance(func, ast.Attribute) or func.attr in GENERIC or func.attr.startswith("__"):
            return []
        only = self.methods.get(func.attr, [])
        return only[:1] if len(only) == 1 else []

    def resolve(self, src: Source, call: ast.Call, scope: ast.AST | None, types=None,
                fallback: bool = True) -> list[tuple[Source, ast.AST]]:
        """The project defs `call` may run, from inside `scope` (a def, or None at module level) of
        `src`. `types`: parameter name -> [(Source, ClassDef)] handed over from a call site."""
        f = call.func
        if isinstance(f, ast.Name):
            if types and (given := types.get(f.id + "()")):
                return given   # a callable parameter: what a call site handed it (calls._arguments)
            s = scope
            while s is not None:   # a def nested in an enclosing def (also in its loops and branches)
                if (d := local_def(s, f.id, self.per_file.setdefault(id(src), {}))) is not None:
                    return [(src, d)]
                s = src.parent.get(id(s))
            default = param_default(scope, f.id)
            if default is not None:   # def cornernet(db, nnet, decode_func=decode): decode_func(...) runs decode
                return self.resolve(src, ast.Call(func=default, args=call.args, keywords=call.keywords),
                                    src.parent.get(id(scope)), types, fallback)
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
            like = [c for c in self._named_like(f) if c[1].name.lower() == object_key(f)] if not found and fallback \
                else []   # for metric in self._metrics: metric(y_pred, y_true): Metric's __call__, and its subclasses'
            subs = [o for _, c in like for m in ("forward", "__call__") for o in self.overrides(c, m, 24)] \
                if len(like) == 1 else []   # (the one class of that very name, a base its subclasses override: not
            if subs:                        # `block(x)` for mage's one Block, nor `actor(s)` of two programs' Actors)
                found = (self._forwards(like) + [o for o in subs if o not in self._forwards(like)])[:24]
            return found or (self._callables(f.id, call) if fallback else [])
        if isinstance(f, ast.Call) and len(f.args) == 1 and not f.keywords \
                and isinstance(f.args[0], (ast.Name, ast.Attribute)):   # retry_if_cuda_oom(self.matcher)(iou):
            return self.resolve(src, ast.Call(func=f.args[0], args=call.args, keywords=call.keywords),  # a wrapper
                                scope, types, fallback)   # made at the call site runs what it wraps
        if isinstance(f, ast.Subscript) and self_attr(f.value) and (cls := self.class_around(src, scope)) \
                and (insts := self._attr_instances(src, cls, f.value.attr + "[]")):   # self.cells[i](x):
            return self._forwards(insts)   # the cells the module appended there
        if isinstance(f, ast.Subscript):   # loss_map[name](...) with loss_map = {"a": self.loss_a, ...}, or
            # self.loss_map[name](...) with the dict set in __init__: each value runs
            return [hit for v in self._dict_values(src, f.value, scope)
                    for hit in self.resolve(src, ast.Call(func=v, args=call.args, keywords=call.keywords), scope, types)]
        if not isinstance(f, ast.Attribute):
            return []
        recv = f.value
        if isinstance(recv, ast.Name) and recv.id == "self":
            cls = self.class_around(src, scope)
            if cls is not None:
                hit = self.method(src, cls, f.attr)
                found = ([hit] if hit else []) + self.overrides(cls, f.attr)
                if not found and f.attr == "propagate":   # PyG's MessagePassing.propagate runs the layer's own hooks
                    found = [h for m in _PYG_HOOKS if (h := self.method(src, cls, m))]
                if found:
                    return found
            insts = self.instances_of(src, f, scope, types)   # self.criterion(out, y)
            if insts:
                return self._forwards(insts)
            bound = self._bound_methods(src, cls, f.attr) if cls is not None and not fallback else []
            if bound:   # self.get_r = self.get_r_vec if vec else ...: what self.get_r(actor) returns (kinds only)
                return bound
            made = self._factory_made(src, cls, f.attr) if cls is not None else []
            if made:   # self.grad_func = self.fuse_update(): the def that factory returns runs
                return made
            key = ("partial", id(cls), f.attr)   # `self.resize_to = partial(self.resize_to, mode=m)` does not recur
            if cls is not None and key not in self._following:
                self._following.add(key)
                try:
                    given = self._partial_of(src, cls, call, f.attr)
                finally:
                    self._following.discard(key)
                if given:   # self.set_device = partial(Util.set_device, rank=r) in a base class's __init__
                    return given
            if cls is not None and self.attr_defs.get((id(cls), f.attr)):   # self.dist_fn(x), a def handed to
                return list(self.attr_defs[(id(cls), f.attr)])[:4]   # the constructor
            key = f.attr.replace("_", "").lower()   # self.matcher(out, y), the matcher handed to __init__ by a
            named = [c for c in self._named_like(f) if c[1].name.lower().endswith(key)]   # config: HungarianMatcher
            if named and cls is not None and f.attr not in self._set_attrs(src, cls):   # (a class named after
                return self._forwards(named)   # the attribute; `self.a2c_network` pins no Network class)
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
            if hit is None and recv.id in src.dynamic:   # MODEL = importlib.import_module(FLAGS.model)
                return self.defs_named(f.attr)
        if isinstance(recv, ast.Attribute) and isinstance(recv.value, (ast.Name, ast.Attribute)):
            hit = self._named(src, recv)
            if hit and hit[0] == "module":   # K.sampling.sample_lms(model, x, sigmas)
                inner = self.lookup(hit[1], f.attr)
                if inner and inner[0] == "class":
                    return self._init(inner[1], inner[2])
                return [(inner[1], inner[2])] if inner and inner[0] == "def" else []
        insts = self.instances_of(src, recv, scope, types)     # obj.m(x), self.obj.m(x)
        if insts:   # and its siblings among the classes it is named after: `predictor_obj = NonePredictor(...)` in
            seen = set().union(*(self.ancestors(id(c)) for _, c in insts))   # one branch, `predictor(...)` of a
            insts += [c for c in self._named_like(recv)   # parameter (another Predictor subclass) in the other
                      if c not in insts and self.ancestors(id(c[1])) & seen]
            found = []
            for inst in insts:   # (a buffer's `self.sample = self.sample_ere if ere else self.sample_`: the methods
                hit = self.method(*inst, f.attr)   # that attribute is bound to)
                found += [hit] if hit else self._bound_methods(*inst, f.attr)
            return found
        if not fallback or f.attr.startswith("__"):
            return []
        like = self._named_like(recv) or self._named_here(recv, src) \
            or self._in_folder_named(recv)   # failing those, a registry's component: any class of its folder
        named = [hit for inst in like if (hit := self.method(*inst, f.attr))]
        if named:   # replay_buffer.sample(n) with replay_buffer a parameter: ReplayBuffer's sample, or a subclass's
            found = named + [o for inst in like for o in self.overrides(inst[1], f.attr, 24) if o not in named]
            return found[:24]
        one = self.only_method(f)
        if one or f.attr in GENERIC:
            return one
        only = self.methods.get(f.attr, [])
        if 1 < len(only) <= 8 and self._one_hierarchy(only):
            return only
        mine = self.class_around(src, scope) if _on_self(recv) else None
        if mine is not None and 1 < len(only) <= 8:   # self.config.method.loss(...) in a trainer's loss: not the
            mine_up = self.ancestors(id(mine))           # trainer's own; the other hierarchy's, if one
            others = [m for m in only if (o := m[0].owner.get(id(m[1]))) is not None
                      and not self.ancestors(id(o)) & mine_up]
            if others and len(others) < len(only) and self._one_hierarchy(others):
                return others
        here = [m for m in only if m[0] is src]   # one-file scripts that each define their Actor.act: this file's
        if here:   # (GaussianPolicy.act, DeterministicPolicy.act: either runs)
            return here if len(here) <= 3 else []
        return [hit for inst in self._named_near(recv, src) if (hit := self.method(*inst, f.attr))]

    def _self_assigns(self, cls: ast.ClassDef) -> dict[str, list[tuple[ast.AST, ast.Assign]]]:
        """attr -> (method, assignment) of each `self.<attr> = ...` in cls's methods: the one walk of a class
        that _set_attrs, _bound_methods and _factory_made read (cached)."""
        key = ("assigns", id(cls))
        if key not in self._assigned:
            table: dict[str, list[tuple[ast.AST, ast.Assign]]] = {}
            for fn in (d for d in cls.body if isinstance(d, DEFS)):
                for n in ast.walk(fn):
                    if isinstance(n, ast.Assign):
                        for t in n.targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                table.setdefault(t.attr, []).append((fn, n))
            self._assigned[key] = table
        return self._assigned[key]

    def _bound_methods(self, src: Source, cls: ast.ClassDef, attr: str) -> list[tuple[Source, ast.AST]]:
        """The methods of cls that its defs set `self.<attr>` to (`self.get_r = self.get_r_single`)."""
        values = [v for _, n in self._self_assigns(cls).get(attr, ()) if len(n.targets) == 1
                  for v in ([n.value.body, n.value.orelse] if isinstance(n.value, ast.IfExp) else [n.value])]
        names = {v.attr for v in values if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name)
                 and v.value.id == "self"}   # (`self.sample = self.sample_ere if ere else self.sample_`: both)
        return [hit for m in sorted(names) if (hit := self.method(src, cls, m))][:4]

    def _partial_of(self, src: Source, cls: ast.ClassDef, call: ast.Call, attr: str, seen=None) -> list:
        """The def that `self.<attr> = functools.partial(f, ...)` binds, in cls or one of its bases: what
        `self.<attr>(x)` runs (Palette's `self.set_device(batch)`, set in BaseModel.__init__)."""
        seen = seen or set()
        if id(cls) in seen:
            return []
        seen.add(id(cls))
        for fn, n in self._self_assigns(cls).get(attr, ()):
            if len(n.targets) == 1 and isinstance(partial_target(n.value), (ast.Name, ast.Attribute)):
                return self.resolve(src, through_partial(n.value, call), fn, fallback=False)
        for base in cls.bases:
            b = self.class_of(src, base)
            if b is not None and (hit := self._partial_of(b[0], b[1], call, attr, seen)):
                return hit
        return []

    def _factory_made(self, src: Source, cls: ast.ClassDef, attr: str) -> list[tuple[Source, ast.AST]]:
        """The nested defs that a factory returns, where a method of cls sets `self.<attr>` to a call of it
        (`self.grad_func = self.fuse_update()`, LOMO's fused update run by each gradient hook); cached."""
        key = ("factory", id(cls), attr)
        if key not in self._assigned:
            self._assigned[key] = []   # `self.stream = self.stream()` (Megatron's lazy stream) does not recur
            found = [hit for fn, n in self._self_assigns(cls).get(attr, ()) if isinstance(n.value, ast.Call)
                     for fs, made in self.resolve(src, n.value, fn, {}, fallback=False)[:3]
                     for hit in returned_defs(fs, made)]
            self._assigned[key] = found[:4]
        return self._assigned[key]

    def wrappers(self, src: Source, fn: ast.AST) -> list[tuple[Source, ast.AST]]:
        """The inner defs that fn's project decorators put around it (`@cast_torch_tensor`, whose `inner`
        runs on every call of fn; `@partial(deco, k=v)`; `@deco(k=v)`, a factory of decorators), cached."""
        key = ("wrappers", id(fn))
        if key not in self._assigned:
            scope = src.parent.get(id(fn))
            found: list = []
            for d in getattr(fn, "decorator_list", []):
                target, levels = d, 1
                if (bound := partial_target(d)) is not None:
                    target = bound
                elif isinstance(d, ast.Call):
                    target, levels = d.func, 2
                if not isinstance(target, (ast.Name, ast.Attribute)):
                    continue
                defs = self.resolve(src, ast.Call(func=target, args=[], keywords=[]), scope, fallback=False)
                for _ in range(levels):
                    defs = [w for ds, df in defs[:3] for w in returned_defs(ds, df)]
                found += defs
            self._assigned[key] = found
        return self._assigned[key]

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
        takes = [[(s, d) for s, d in self.methods.get(m, [])
                  if keys <= {a.arg for a in [*d.args.posonlyargs, *d.args.args, *d.args.kwonlyargs]}]
                 for m in ("forward", "__call__")]
        out = takes[0] or takes[1]   # a module's forward first: `block(x, t, mask=m, rope=r)` in a loop over blocks
        return out if len(out) <= 6 else []   # is a DiTBlock, not the attention processor its Attention calls

    def _made_by(self, src: Source, call: ast.Call, name: str, scope, types, fallback: bool) -> list:
        """What `name(...)` runs when `name` was assigned a call: a partial's function, a factory's nested def."""
        found: list = []
        for made in assigned_calls(src, name, scope)[:4]:
            if partial_target(made) is not None:
                found += self.resolve(src, through_partial(made, call), scope, types, fallback)
            else:   # train_step_fn = losses.get_step_fn(sde, ...): the def the factory returns
                found += [hit for fs, fn in self.resolve(src, made, scope, types, fallback=False)[:3]
                          for hit in returned_defs(fs, fn)]
        for method in assigned_methods(src, name, scope)[:4]:   # sample_fn = self.sample: the method it names
            found += self.resolve(src, ast.Call(func=method, args=call.args, keywords=call.keywords), scope, types)
        for fn in assigned_functions(src, name, scope, self.per_file.setdefault(id(src), {})):   # prepare = a: runs a
            found += self.resolve(src, ast.Call(func=fn, args=call.args, keywords=call.keywords), scope, types)
        for attr in module_attrs(src, name, scope, src.dynamic):   # criterion = MODEL.get_loss
            found += self.defs_named(attr)
        for table in picked_tables(src, name, scope)[:2]:   # sample_fn = {"heun": sample_heun, ...}[sampler]
            values = [v for v in table.values if isinstance(v, (ast.Name, ast.Attribute))] \
                if isinstance(table, ast.Dict) else self._dict_values(src, table, scope)
            found += [hit for v in values[:6] for hit in self.resolve(
                src, ast.Call(func=v, args=call.args, keywords=call.keywords), scope, types, fallback=False)]
        return found

    def _set_attrs(self, src: Source, cls: ast.ClassDef) -> set[str]:
        """The self attributes a method of cls assigns something other than a parameter of its own (cached)."""
        key = ("set", id(cls))
        if key not in self._assigned:
            self._assigned[key] = {attr for attr, sets in self._self_assigns(cls).items()
                                   if any(not (isinstance(n.value, ast.Name) and n.value.id in param_names(fn))
                                          for fn, n in sets)}
        return self._assigned[key]

    def _named_like(self, recv: ast.AST) -> list:
        """The project classes an object of unknown origin is named after (`replay_buffer`, `self.rollout_buffer`
        -> ReplayBuffer, DictRolloutBuffer): the class name, lower-cased, equals or ends with the object's
        last name without underscores (and without an `_obj` or `_fn` suffix), or, failing that, the name ends
        with a class name of six letters or more (`proposal_matcher` -> Matcher). Names under five letters
        (`env`, `net`) or vague (`model`) pin nothing; nor do more than three classes, unless they are one
        hierarchy (at most twelve: `predictor_obj` -> the Predictor subclasses)."""
        key = object_key(recv)   # predictor_obj -> predictor
        if len(key) < 5 or key in VAGUE:
            return []
        if key not in self._like:
            self._like[key] = self._classes_named(key)
        return list(self._like[key])

    def _named_here(self, recv: ast.AST, src: Source) -> list:
        """The classes of the calling file itself an object is named after, when the whole project has too
        many (`actor` in fourteen one-file scripts, each defining its own Actor): at most three."""
        key = object_key(recv)
        if len(key) < 5 or key in VAGUE:
            return []
        found = [(src, c) for c in src.classes.values() if c.name.lower().endswith(key)]
        return found if len(found) <= 3 else []

    def _named_near(self, recv: ast.AST, src: Source) -> list:
        """The classes an object is named after in the calling file's own folder, when the project has too many
        (thirteen algorithm folders, each a script with its own DQN_agent, and `agent` a parameter): at most three."""
        key = object_key(recv)
        if len(key) < 5 or key in VAGUE:
            return []
        if ("near", key, src.path.parent) not in self._like:
            self._classes_by_lower()
            self._like[("near", key, src.path.parent)] = [c for low, cs in self._by_lower.items() if low.endswith(key)
                                                          for c in cs if c[0].path.parent == src.path.parent]
        found = self._like[("near", key, src.path.parent)]
        return list(found) if len(found) <= 3 else []

    def _in_folder_named(self, recv: ast.AST) -> list:
        """The classes of the project folder an object is named after, for components a registry builds from a
        config (`self.dense_head.get_loss()` -> the heads in models/dense_heads/, `self.bbox_head.loss(...)` ->
        bbox_heads/, `self.neck` -> necks/): the folder's name, its words singular and without underscores,
        equals the object's key. A folder named in the singular (`network/`) is a package, not a registry of one
        kind of component. At most 24 classes; vague names pin nothing."""
        key = object_key(recv)
        if len(key) < 4 or key in VAGUE:
            return []
        if ("folders",) not in self._like:   # built once: folder key -> the classes under such a folder
            self._classes_by_lower()
            table: dict[str, dict] = {}
            keys: dict[str, str | None] = {}
            for cs in self._by_lower.values():
                for c in cs:
                    for part in c[0].path.parent.parts:
                        if part not in keys:
                            k = folder_key(part)
                            keys[part] = k if k != part.replace("_", "").lower() else None
                        if keys[part] is not None:
                            table.setdefault(keys[part], {})[id(c[1])] = c   # once, however deep the folder
            self._like[("folders",)] = {k: list(v.values()) if len(v) <= 24 else [] for k, v in table.items()}
        folders = self._like[("folders",)]   # `self.heads.loss()` -> heads/: the key made singular, too
        return list(folders.get(key) or folders.get(folder_key(key), []))

    def _classes_named(self, key: str) -> list:
        self._classes_by_lower()
        found = [c for low, cs in self._by_lower.items() if low.endswith(key) for c in cs]
        if not found:   # self.proposal_matcher -> Matcher, self.box2box_transform -> Box2BoxTransform
            found = [c for low, cs in self._by_lower.items() if len(low) >= 6 and key.endswith(low) for c in cs]
        if len(found) <= 3:
            return found
        return found if len(found) <= 12 and self._one_hierarchy([(s, c) for s, c in found], classes=True) else []

    def _classes_by_lower(self) -> None:
        if self._by_lower is None:
            self._by_lower = {}
            for s in self.sources:
                for c in s.classes.values():
                    self._by_lower.setdefault(c.name.lower(), []).append((s, c))

    def _init(self, src: Source, cls: ast.ClassDef) -> list:
        hit = self.method(src, cls, "__init__")
        return [hit] if hit else []

    def _one_hierarchy(self, defs, classes: bool = False) -> bool:
        """The classes defining these methods (or these classes) share a project base class (an observer
        and its subclasses)."""
        owners = [d if classes else s.owner.get(id(d)) for s, d in defs]
        if any(o is None for o in owners):
            return False
        common = self.ancestors(id(owners[0]))
        for o in owners[1:]:
            common &= self.ancestors(id(o))
        return bool(common)

    def _dict_values(self, src: Source, node: ast.AST, scope) -> list[ast.AST]:
        """The functions a dict of callables holds, for `table[key](...)`: a dict literal assigned to the
        name in the def around (or at module level), or to the self attribute in any method of the class."""
        if isinstance(node, ast.Name):
            where, target = ([scope] if scope is not None else []) + [src.tree], node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            cls = self.class_around(src, scope)
            where, target = ([cls] if cls is not None else []), "self." + node.attr
        else:
            return []
        for body in where:
            nodes = body.body if body is src.tree else ast.walk(body)   # module level: its own statements only
            for n in nodes:
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict) \
                        and any(ast.unparse(t) == target for t in n.targets if isinstance(t, (ast.Name, ast.Attribute))):
                    return [v for v in n.value.values if isinstance(v, (ast.Name, ast.Attribute))]
        return []

    def _forwards(self, insts) -> list:
        return [hit for inst in insts if (hit := self.method(*inst, "forward") or self.method(*inst, "__call__"))]


def _on_self(node: ast.AST) -> bool:
    """`self.config.method`: an attribute chain that starts at self."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


__all__ = ["Project"]
