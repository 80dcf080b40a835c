"""Following calls from hot code into the project's own functions (a mixin of rules.Checker).

    follow        a call made in hot code: the project defs it runs (graph.Project.resolve) are
                  queued in `pending` with the kinds and classes of their arguments and the chain of
                  call sites (`train.py:120`, `utils.py:44`); the driver (check.check_sources) walks
                  each later as hot, breadth-first, each def once, at most MAX_DEPTH calls deep
    note_seed     a call outside hot code of a def that holds a step loop (a library sampler called
                  from a script): the kinds of its arguments are kept, and check.check_sources walks
                  that def again with them (what a helper returns into those arguments is learnt too)
    return_kind   what a project def returns, for the kinds: a scratch walk of its body with the
                  call's argument kinds that reports nothing (`summarize`, cached per def and kinds),
                  two calls deep: a CPU matcher's host index lists, a helper's device tensor

It relies on the checker's `kind()`, `src`, `project`, `defs`, `types`, `chain`, `region`.
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.bindings import agreed, main_path, none_tested, returns_host_lists
from gobrrr.lint.graph import Project
from gobrrr.lint.hot import HotMap
from gobrrr.lint.loops import local_def, name_of
from gobrrr.lint.moves import rebinds
from gobrrr.lint.names import BATCHES, DATA_FACTORIES, DEVICE_WRAPPERS, GIVEN, HANDED, TENSOR_METHODS, TENSORISH, self_attr
from gobrrr.lint.source import Source

MAX_DEPTH = 6   # calls followed from a hot loop into the project's functions
_HOST_DATA = {"host", "pinned", "hlist", "numpy"}   # what a method found by its name alone may say it returns
_TENSOR_CALL = re.compile(r"loss|criterion|forward", re.I)   # a call named so returns tensors, whatever it is


class CallRules:
    """Calls out of hot code: where they go, and what they give back."""

    def return_kind(self, node: ast.Call) -> str | None:
        """What the project def this call runs returns, learnt by walking its body with the call's
        argument kinds (two calls deep, in hot code): a CPU matcher's index list, a helper's tensor; in
        set-up code only for a def holding a step loop, or in __init__ for self attributes or a call of the object's
        own helper (`self.anchors, self.valid_mask = self._generate_anchors()`, `cos, sin, inv =
        self._prepare_cache(n)`: host tables a forward copies); also in such a def's epoch loop (Pyraformer's
        `training_data, validation_data = prepare_dataloader(opt)` each epoch)."""
        set_up = self.region != "hot" and not self.summary_depth and not self.assigning & self.seeding
        script = set_up and not self.defs and self.region is None   # a script's own set-up, at module level
        if set_up and not (self.looping_def and self.region in (None, "cold")) and not self.init_attrs and not script \
                or not isinstance(node.func, (ast.Name, ast.Attribute)):
            return None
        if self.summary_depth >= 2:
            self.cut = True   # this summary knows less than one made nearer the hot code: not reused there
            return None
        if script:   # train_loader, test_loader = data_generator(root, bs): TCN's loaders, and host data; no
            k = self._return_kind(node)   # guess of tensors (a helper's model, a device table) from there
            if parts := self.return_parts.get(id(node)):
                self.return_parts[id(node)] = tuple(p if _set_up_kind(p) else None for p in parts)
            return k if _set_up_kind(k) else None
        if set_up:   # `sigmas = self.sample_schedule(n)` before the step loop: a tensor, host data, not an
            k = self._return_kind(node)   # object (`transforms = build_transforms(cfg)` returns no model)
            return None if k == "obj" else k
        return self._return_kind(node)

    def _return_kind(self, node: ast.Call) -> str | None:
        if id(node) in self.return_kinds:
            return self.return_kinds[id(node)]
        self.return_kinds[id(node)] = None   # a recursive call learns nothing
        scope = self.defs[-1] if self.defs else None
        found, parts, dicts = set(), set(), []
        hits = self.project.resolve(self.src, node, scope, self.types, fallback=False)[:3]
        if not hits:   # sde.get_z0(batch), sde handed in: the one get_z0 there is, when it hands back host data
            only = self._only_method(node)
            if only and summarize(type(self), self.project, *only[0], {}, self.summary_depth + 1,
                                  self.project_flags)[0] in _HOST_DATA:
                hits = only
        for target_src, fn in hits:
            kinds, _ = self._arguments(node, fn, target_src, scope)
            k, p, keyed = summarize(type(self), self.project, target_src, fn, kinds, self.summary_depth + 1,
                                    self.project_flags)
            found.add(k)
            parts.add(p)
            dicts.append(keyed)
        read = bool(found)
        k = found.pop() if len(found) == 1 else None
        self.return_kinds[id(node)] = k
        self.return_parts[id(node)] = parts.pop() if len(parts) == 1 else None
        self.return_dicts[id(node)] = dicts[0] if len(dicts) == 1 and dicts[0] else {}
        if read and k is None:
            self.read_defs.add(id(node))   # a project def was read and says nothing: no guess from its arguments
        return k

    def _only_method(self, node: ast.Call) -> list:
        """The project's one method of the call's name, for a receiver of unknown kind (not a tensor's `.max(0)`
        that a SmoothedValue.max property shares a name with)."""
        func = node.func
        if not isinstance(func, ast.Attribute) or func.attr in TENSOR_METHODS or self.kind(func.value) is not None:
            return []
        return self.project.only_method(func)

    def returned_key(self, node: ast.Call, key: str) -> str | None:
        """The kind of `node(...)[key]` when the project function it runs returns a dict literal: found as for
        return_kind, or, failing that, by the class named like the callee (`self.matcher(out, y)["indices"]`,
        the matcher a config names)."""
        if not isinstance(node.func, (ast.Name, ast.Attribute)):
            return None
        self.return_kind(node)
        if not self.return_dicts.get(id(node)) and id(node) not in self.read_defs:
            scope = self.defs[-1] if self.defs else None
            for target_src, fn in self.project.resolve(self.src, node, scope, self.types)[:1]:
                kinds, _ = self._arguments(node, fn, target_src, scope)
                self.return_dicts[id(node)] = summarize(type(self), self.project, target_src, fn, kinds,
                                                        self.summary_depth + 1, self.project_flags)[2]
        return self.return_dicts.get(id(node), {}).get(key)

    def unpacked_kinds(self, node: ast.AST, n: int) -> tuple | None:
        """The kinds of `a, b, c = f(x)` when every return of the project def f is an n-tuple whose
        items agree position by position (`return obs, rewards.cpu(), dones.cpu(), infos`)."""
        if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
            return None
        self.return_kind(node)
        parts = self.return_parts.get(id(node))
        if parts is not None and not any(parts) and not node.args and not node.keywords and self.is_model(node.func) \
                and self._forward_of_nothing(node.func):
            return ("tensor",) * n   # rec_user_emb, rec_item_emb = model(): an encoder of its own tables (SELFRec)
        if (parts is None or not set(parts) & (TENSORISH | _HOST_DATA)) and self._sampled_lists(node):
            return ("hlist",) * n   # users, pos = data_generator.sample(): the id lists a sampler draws and builds
        return parts if parts is not None and len(parts) == n else None

    def _sampled_lists(self, node: ast.Call) -> bool:
        """The call runs the project's one def that draws Python lists with `random` (bindings.returns_host_lists),
        found as resolve finds it or as the project's one method of its name; learnt once per call and per def."""
        memo = self.project.per_file.setdefault(id(self.src), {}).setdefault("sampled", {})
        if id(node) not in memo:
            scope = self.defs[-1] if self.defs else None
            hits = self.project.resolve(self.src, node, scope, self.types, fallback=False)[:2] or self._only_method(node)
            randoms = frozenset(a for a, (m, name) in hits[0][0].imports.items() if m == "random" and name is None) \
                if len(hits) == 1 else frozenset()
            memo[id(node)] = bool(randoms) and returns_host_lists(hits[0][1], randoms)
        return memo[id(node)]

    def guessed(self, value: ast.AST) -> bool:
        """A call whose result is a tensor only by the guess that an unknown callable fed a tensor
        returns one: not a torch op, a module's forward, a loss, or a project function read."""
        if not isinstance(value, ast.Call) or not isinstance(value.func, (ast.Name, ast.Attribute)):
            return False
        name = self.dotted(value.func) or ""
        return not (name.startswith("torch.") or self.is_model(value.func) or self.return_kind(value)
                    or (isinstance(value.func, ast.Attribute) and (self.is_model(value.func.value)
                                                                   or self.kind(value.func.value) in TENSORISH))
                    or _TENSOR_CALL.search(name_of(value.func))
                    or name_of(value.func) in TENSOR_METHODS)

    def own_method(self, value: ast.AST) -> bool:
        """`self._prepare(x)`: a call of the object's own method, not of a module it holds (`self.neck(x)`
        runs the neck's forward) nor of a loss or a forward; a tensor only by the guess that a module's calls
        return one. Unread, a method is known by its leading underscore."""
        f = value.func if isinstance(value, ast.Call) else None
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self") \
                or self.is_model(f) or _TENSOR_CALL.search(f.attr):
            return False
        runs = self.project.resolve(self.src, value, self.defs[-1] if self.defs else None, self.types)
        return any(fn.name == f.attr for _, fn in runs) if runs else f.attr.startswith("_")

    def visit_Return(self, node: ast.Return) -> None:
        if self.collect is not None and self.defs and self.defs[-1] is self.collect and not self.dead_depth:
            # (not one in a branch this call never takes: XMem's `if return_logits: return logits, prob`)
            none = node.value is None or isinstance(node.value, ast.Constant) and node.value.value is None
            k = "none" if none else self.kind(node.value)   # `return None` on an empty path: an Optional
            if isinstance(node.value, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in node.value.elts):
                self.return_items.append(tuple(self.kind(e) for e in node.value.elts))
            else:
                self.return_items.append(None)
            d = node.value
            self.return_keyed.append({k.value: self.kind(v) for k, v in zip(d.keys, d.values)}
                                     if isinstance(d, ast.Dict) and all(isinstance(k, ast.Constant) for k in d.keys)
                                     else None)   # return {"indices": indices}: each key's kind
            if k is None and isinstance(node.value, (ast.Tuple, ast.List)):
                k = ""   # a mixed tuple, `x, (h, w)`: known not to be one tensor
            self.returns.append(k)
            self.return_at[id(node)] = k
        self.generic_visit(node)

    def _arguments(self, node: ast.Call, fn, target_src, scope) -> tuple[dict, dict]:
        """The kinds and project classes of the arguments, by the callee's parameter names."""
        params, pairs = _passed(node, fn, target_src)
        kinds, types = {}, {}
        for p, a in pairs:
            if isinstance(a, ast.Starred):
                continue
            kinds[p] = self.kind(a)
            if kinds[p] is None and isinstance(a, (ast.List, ast.Tuple)) and a.elts \
                    and all(self.kind(e) in ("num", "str") for e in a.elts):
                kinds[p] = "nums"   # image_sizes=[image.size]: Python numbers, whatever the callee's annotation says
            for mark in ("#kept", "#nums", "#list") if isinstance(a, ast.Name) else ():   # a batch moved but for its
                if self.lookup(a.id + mark):   # "meta" key; targets["num_boxes"] = n.item() before the call: a number there
                    kinds[p + mark] = self.lookup(a.id + mark)
            if (depth := self.int_depth(a)) is not None:   # classify(x, allowed_classes=active_classes[-1]): positions
                kinds[p + "#ints"] = str(depth)
            if kinds[p] in HANDED and isinstance(a, (ast.Call, ast.BinOp)) and p in none_tested(fn):   # max_len=x.size(-1):
                kinds[p + "#val"] = GIVEN   # not None in this call (a name may still hold None); flow.handed_test;
                #                             a call passing None walks the def both ways again (fewer_constants)
            insts = self.project.instances_of(self.src, a, scope, self.types)
            if not insts and isinstance(a, ast.Name) and a.id == "self" \
                    and (cls := self.project.class_around(self.src, scope)) is not None:
                insts = [(self.src, cls)]   # evaluate_ranking(self, test): the object hands itself (caser)
            if insts:
                types[p] = insts
            elif kinds[p] is None and isinstance(a, (ast.Name, ast.Attribute)) \
                    and p in target_src.calls.get(fn.name, ()):   # train_epoch(..., loss_fn): the callee calls
                runs = [(s, d) for s, d in self.project.resolve(   # loss_fn(...), the partial of a project def
                    self.src, ast.Call(func=a, args=[], keywords=[]), scope, self.types, fallback=False)[:3]
                    if scope is None or s.parent.get(id(d)) is not scope]   # given (a closure of the caller's: _handed)
                if runs:
                    types[p + "()"] = runs
        extra = node.args[len(params):]
        if fn.args.vararg is not None and extra and not any(isinstance(a, ast.Starred) for a in extra):
            items = {self.kind(a) for a in extra}   # def meshgrid(*tensors) called with host aranges
            kinds[fn.args.vararg.arg] = "hlist" if items <= {"host", "pinned", "hlist"} else \
                "tlist" if items <= TENSORISH else None
        kinds.update(_constants(fn, dict(pairs), node))
        for p, a in pairs:   # scale_mat(..., device=device) with the caller's device left at "cpu": still "cpu"
            if isinstance(a, ast.Name) and isinstance(self.lookup(a.id + "#val"), str) and p in kinds:
                kinds[p + "#val"] = self.lookup(a.id + "#val")
        return kinds, types

    def follow(self, node: ast.Call) -> None:
        """Queue the project function this hot call runs, with its parameters' kinds and classes."""
        if len(self.chain) >= MAX_DEPTH:
            return
        scope = self.defs[-1] if self.defs else None
        if isinstance(node.func, ast.Name) and node.func.id in ("map", "filter") and len(node.args) == 2 \
                and isinstance(node.args[0], (ast.Name, ast.Attribute)):
            node = ast.copy_location(ast.Call(func=node.args[0], args=[], keywords=[]), node)   # map(self.to_torch, data)
        elif self._applies(node, scope):   # multi_apply(self.loss_single, cls_scores, labels): per item of each
            self.follow(ast.copy_location(ast.Call(func=node.args[0], args=[
                ast.Subscript(value=a, slice=ast.Constant(0), ctx=ast.Load()) for a in node.args[1:]
                if not isinstance(a, ast.Starred)], keywords=node.keywords), node))   # and the helper itself
        hits = self.project.resolve(self.src, node, scope, self.types)
        for target_src, fn in hits:
            if fn is scope:
                continue
            kinds, types = self._arguments(node, fn, target_src, scope)
            self.pending.append((target_src, fn, kinds, types, (*self.chain, f"{self.src.name}:{node.lineno}"),
                                 list(self.functions)))
        self._handed(node, scope, hits)

    def _applies(self, node: ast.Call, scope) -> bool:
        """`multi_apply(self.target_assign_single_img, cls_preds, gt_bboxes)`: a project function handed first to
        a helper that calls it on the items of the other arguments (`map(partial(func, **kw), *args)`), one
        call per image or per level: mmdetection's multi_apply, or a project def that maps its first parameter or calls it
        in a loop or comprehension (not a checkpoint wrapper's one `function(*args)`)."""
        fn = node.args[0] if node.args else None
        if not (isinstance(fn, ast.Name) or self_attr(fn)) or not any(   # a def by its name, not an object's call
                d.name == name_of(fn) for _, d in self.project.resolve(self.src, ast.Call(func=fn, args=[], keywords=[]),
                                                                       scope, self.types)):
            return False
        if name_of(node.func) in ("multi_apply", "starmap"):
            return True
        for _, helper in self.project.resolve(self.src, node, scope, self.types)[:1]:
            params = [a.arg for a in helper.args.args if a.arg not in ("self", "cls")]
            per_item = [n for n in ast.walk(helper) if isinstance(n, (ast.For, ast.ListComp, ast.GeneratorExp))]
            return bool(params) and any(   # map(partial(func, **kw), *args), [fn(i) for i in items]: once per item
                isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == params[0]
                for loop in per_item for n in ast.walk(loop)) or any(   # (a checkpoint's fn(*args) is one call)
                isinstance(n, ast.Call) and name_of(n.func) in ("map", "partial") and n.args
                and isinstance(n.args[0], ast.Name) and n.args[0].id == params[0] for n in ast.walk(helper))
        return False

    def _handed(self, node: ast.Call, scope, hits: list) -> None:
        """A def of this scope handed, beside the data, to a helper that applies it (`apply_to_sample(
        _move_to_cuda, sample)`: `def _move_to_cuda(tensor): return tensor.cuda()`): walked as hot, its first
        parameter holding that data, whatever the helper does in between. Without data, a def handed to a project
        helper that calls it (`gpu_timer(train_step)`: `def gpu_timer(closure): ... result = closure()`, I-JEPA's
        step) runs once per call: walked as hot, when it takes no parameters (the helper's arguments to it are unknown
        here: Megatron's `checkpoint(custom_forward, False, *inputs)` hands it host tensors as well). `hits`: the
        project defs the call runs, as follow() resolved them."""
        cache = self.project.per_file.setdefault(id(self.src), {})
        nested = {a.id: d for a in node.args if scope is not None and isinstance(a, ast.Name)
                  and (d := local_def(scope, a.id, cache)) is not None}
        if not nested:
            return
        data = next((k for a in node.args if not isinstance(a, ast.Starred)
                     and (k := self.kind(a)) in BATCHES | TENSORISH | {"tlist"}), None)
        if data is None:
            for _, helper in hits[:1]:
                params = [p.arg for p in helper.args.args if p.arg not in ("self", "cls")]
                called = {n.func.id for n in ast.walk(helper) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                for i, a in enumerate(node.args):   # a closure of no parameters: what it reads, the def around knows
                    if isinstance(a, ast.Name) and a.id in nested and i < len(params) and params[i] in called \
                            and _takes_nothing(nested[a.id]):   # (not a checkpoint's custom_forward(*inputs))
                        self.pending.append((self.src, nested[a.id], {}, {},
                                             (*self.chain, f"{self.src.name}:{node.lineno}"), list(self.functions)))
            return
        for a in node.args:
            fn = nested.get(a.id) if isinstance(a, ast.Name) else None
            params = [p.arg for p in fn.args.args] if fn is not None else []
            if params:
                self.pending.append((self.src, fn, {params[0]: "tensor" if data == "tlist" else data}, {},
                                     (*self.chain, f"{self.src.name}:{node.lineno}"), list(self.functions)))


    def note_seed(self, node: ast.Call) -> None:
        """A call (outside hot code) of a project def that holds a step loop: keep the kinds of its
        arguments, so that the def's loop is walked again knowing them (check.check_sources)."""
        scope = self.defs[-1] if self.defs else None
        for target_src, fn in self.project.resolve(self.src, node, scope, self.types, fallback=False)[:3]:
            if fn is scope or fn.name not in self.project.looping | self.project.housekeeping_looping:
                continue
            kinds, types = self._arguments(node, fn, target_src, scope)
            guessed = {p for p, a in _passed(node, fn, target_src)[1]
                       if isinstance(a, ast.Name) and self.lookup(a.id + "#dflt")}
            kinds = {k: v for k, v in kinds.items() if "#" not in k and v is not None and k not in guessed}
            # a parameter typed only by the caller's annotation or default (`image_sizes: Optional[torch.Tensor]`,
            # handed PIL sizes by every caller) is passed on as a guess, which seeds nothing
            if kinds or types:   # types: `agent.train(data_sampler, ...)` hands the loop a Data_Sampler
                self.seeds.append((target_src, fn, kinds, types))


def _set_up_kind(k: str | None) -> bool:
    """What a script's module level takes from a helper's return: a loader, or host data."""
    return bool(k) and (k.startswith("loader") or k in _HOST_DATA)


def _takes_nothing(fn: ast.AST) -> bool:
    a = fn.args
    return not (a.posonlyargs or a.args or a.kwonlyargs or a.vararg or a.kwarg)


def _passed(node: ast.Call, fn, target_src: Source) -> tuple[list[str], list[tuple[str, ast.expr]]]:
    """(the callee's positional parameter names, the (parameter, argument) pairs this call passes)."""
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    if params and params[0] in ("self", "cls") and target_src.owner.get(id(fn)) is not None:
        params = params[1:]   # a method: its first parameter is the object
    return params, [*zip(params, node.args), *((k.arg, k.value) for k in node.keywords if k.arg)]


def _constants(fn, passed: dict, call: ast.Call) -> dict[str, str]:
    """`param#val` -> repr of the constant a parameter holds in this call: the literal passed (with a
    default or without), or the default of one not passed (`mode="gpu"`, `mask=None`); nothing when `*args`/`**kwargs`
    may carry it. flow.static_truth reads them to skip a branch this call never takes."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return {}
    a = fn.args
    out = {}
    pos = [*a.posonlyargs, *a.args]
    defaults = [*zip(pos[len(pos) - len(a.defaults):], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
    given = [(p, None) for p in [*pos, *a.kwonlyargs] if p not in {q for q, _ in defaults}]   # and a literal
    for p, d in [*defaults, *given]:   # passed where there is no default: `process_batch(detections=None, ...)`
        v = passed.get(p.arg, d)
        if isinstance(v, ast.Constant) and isinstance(v.value, (str, bool, int, float, type(None))):
            out[p.arg + "#val"] = repr(v.value)
    return out


def summarize(checker_cls, project: Project, src: Source, fn, kinds: dict, depth: int,
              flags: dict) -> tuple[str | None, tuple | None, dict]:
    """(the kind `fn` returns when called with arguments of `kinds`, the kinds of the items of the
    tuple it returns, those of the keys of the dict literal it returns): its return values' kinds where
    they agree, else None. A scratch walk of its body that reports nothing (region 'off'), cached."""
    key = (id(fn), tuple(sorted(kinds.items(), key=lambda kv: kv[0])))
    if key in project.summaries and depth >= project.summary_cut.get(key, 0):   # (one cut short at depth 2 is made
        return project.summaries[key]   # again for a call at depth 1: 2DGS's ssim -> create_window -> gaussian)
    project.summaries[key] = (None, None, {})
    c = _scratch_checker(checker_cls, project, src, flags)
    c.summary_depth = depth
    _class_attrs(c, src.owner.get(id(fn)))
    c.collect, c.region = fn, "off"
    c.defs = c._enclosing(fn)
    c._function(fn, region="off", chain=("summary",), seed=kinds)
    found = set(c.returns)
    found = found - {"none"} or ({"num"} if found else found)   # None or a tensor: a tensor where it is used
    if found == {"tensor", "tlist"}:
        found = {"tlist"}   # `return data` (a loss dict passed in) or `{k: v for ...}` of reduced tensors: a container
    elif found == {"host", "hlist"}:
        found = {"host"}   # `return torch.tensor(ids) if return_tensors == "pt" else ids`: host data either way
    k = found.pop() if len(found) == 1 else main_path(fn, c.return_at)
    items = set(c.return_items)
    parts = None
    if items and None not in items and len({len(t) for t in items}) == 1:
        parts = tuple(agreed(set(col)) for col in zip(*items))
    keyed: dict = {}
    dicts = [d for d in c.return_keyed if d is not None]
    if dicts and len(dicts) == len(c.return_keyed):   # every return a dict literal: the keys all of them agree on
        keyed = {name: agreed({d[name] for d in dicts if name in d}) for name in set().union(*dicts)}
    project.summaries[key] = (k, parts, keyed)
    if c.cut:
        project.summary_cut[key] = depth
    return k, parts, keyed


def host_attrs(checker_cls, project: Project, flags: dict) -> dict[str, str]:
    """Attribute name -> "host" or "numpy" for the attributes that every `self.x = ...` of the project
    sets to a host tensor or a numpy array (`self.discrete_betas = torch.linspace(0.1, 20, N)`), so that
    `sde.discrete_betas.to(t.device)` in another class is seen to copy a host table; any other
    assignment of the name anywhere (a device tensor, an unknown) leaves it out."""
    kinds: dict[str, set] = {}
    bases = {b.rsplit(".", 1)[-1] for s in project.sources for c in s.classes.values() for b in map(ast.unparse, c.bases)} \
        if any("Parameter(" in s.text for s in project.sources) else set()   # only _outside_modules reads it
    for src in project.sources:
        if "self." not in src.text:
            continue
        try:   # a file the kinds cannot read (nested too deep) adds nothing here; check_module reports it
            c = _scratch_checker(checker_cls, project, src, flags)
            plain = _outside_modules(project, src, bases) if "Parameter(" in src.text else set()
            for n in src.nodes:
                target = n.targets[0] if isinstance(n, ast.Assign) and len(n.targets) == 1 else \
                    n.target if isinstance(n, ast.AnnAssign) and n.value is not None else None   # self.m: T = ...
                if isinstance(target, ast.Subscript) and self_attr(target.value):
                    if (k := c.kind(n.value)) is not None:   # self.sg_edges[cluster] = torch.LongTensor(edges): a dict
                        kinds.setdefault(target.value.attr, set()).add(k)   # of host tensors is one (what an item held
                        # before, ids in a list, sorted(...), is not a tensor the copy could take)
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    if isinstance(n.value, (ast.Dict, ast.List)) and not (n.value.keys if isinstance(n.value, ast.Dict)
                                                                         else n.value.elts):
                        continue   # self.sg_edges = {}: an empty container, its items are what fills it
                    k = c.kind(n.value.args[0]) if id(n) in plain and _parameter(n.value) else c.kind(n.value)
                    kinds.setdefault(target.attr, set()).add(k)
                    c.bind(target, k)   # self.alphas = 1. - self.discrete_betas: host, as the line before
                elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Tuple) \
                        and isinstance(n.value, ast.Call) and name_of(n.value.func) in DEVICE_WRAPPERS \
                        and len(n.targets[0].elts) == len(n.value.args):
                    for t, a in zip(n.targets[0].elts, n.value.args):   # self.model, self.eval_dataloader =
                        if self_attr(t):                                # accelerator.prepare(model, eval_dataloader)
                            k = c.iter_kind(a)
                            kinds.setdefault(t.attr, set()).add("loader_device" if k and k.startswith("loader") else c.kind(a))
        except RecursionError:
            continue
    return {a: ks.pop() for a, ks in kinds.items() if len(ks) == 1 and (ks <= {"host", "numpy"} or ks == {"loader_device"})}


def _outside_modules(project: Project, src: Source, bases: set[str]) -> set[int]:
    """ids of the nodes of `src` in classes that are not torch modules nor bases of other classes: a Parameter one of
    them keeps (omnisafe's Lagrange multiplier) stays where its data was made, since no `.to(device)` of a model
    moves it."""
    return {id(n) for cls in src.classes.values() if not project.is_module_class(src, cls) and cls.name not in bases
            for n in ast.walk(cls)}   # (not a mixin of modules: LLaVA's LlavaMetaModel keeps image_newline)


def _parameter(value: ast.AST) -> bool:
    """`nn.Parameter(torch.as_tensor(init))`: a Parameter of values the host gives (a multiplier, a table), not a
    weight made by shape (`nn.Parameter(torch.empty(d))` of a mixin whose subclass is a module)."""
    return isinstance(value, ast.Call) and bool(value.args) and isinstance(value.func, ast.Attribute) \
        and value.func.attr == "Parameter" and isinstance(value.args[0], ast.Call) \
        and name_of(value.args[0].func) in DATA_FACTORIES


def _scratch_checker(checker_cls, project: Project, src: Source, flags: dict):
    """A checker of `src` that has read only the file's imports: for walks that report nothing."""
    c = checker_cls(src, project, project.hotmaps.get(id(src)) or HotMap(src.tree, str(src.path), src.nodes), flags)
    for st in src.tree.body:
        if isinstance(st, (ast.Import, ast.ImportFrom)):
            c.visit(st)
    return c


def _class_attrs(c, cls: ast.ClassDef | None) -> None:
    """What the methods of `fn`'s class assign to self attributes, as the file's full walk learns it
    (`self._loss_counts = np.zeros(n)`: a numpy array, so `(self._loss_counts == k).all()` is no sync).
    Learnt once per class (project.per_class) and handed to each summary of its methods."""
    if cls is None:
        return
    cache = c.project.per_class
    if id(cls) not in cache:
        for d in cls.body:
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for st in ast.walk(d):
                    if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Attribute):
                        c.rebinding = id(st.value) if rebinds(st) else None
                        c.bind(st.targets[0], c.kind(st.value))
                        c.rebinding = None
        cache[id(cls)] = dict(c.self_attrs)
    else:
        c.self_attrs.update(cache[id(cls)])


__all__ = ["CallRules", "MAX_DEPTH", "host_attrs", "summarize"]
