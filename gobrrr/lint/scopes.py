"""How the lint's walk learns what names hold: imports, defs, lambdas, classes and assignments.

    imports      `import torch as th`, `from torch.nn import functional as F`: aliases that kinds.dotted resolves
    defs         a def's scope: parameters typed by their annotations and defaults, a hook's or a forward's by
                 their usual names (HOOK_NAMES), a hot callee's by its call site (`seed`), a nested def's by
                 what the def around it assigns (`closure_scope`); regions saved and restored around the body
    lambdas      deferred (a callback) unless map() / sorted() run them right away
    assignments  each target bound to the kind of its value: tuples item by item, a helper's returned parts,
                 accelerator.prepare's loaders, env.step's results, `best = scores.argmax()` as 0-d,
                 `xs.append(x)` making a list of device (or host) tensors

A mixin of rules.Checker: it relies on kinds.Kinds (`kind()`, `bind()`, `scopes`, `aliases`), the walk's
state (`region`, `chain`, `loop_stack`, `loaders`, `hotmap`, `project`) and the rule mixins' hooks on
assignments (`host_write`, `index_rule`, `note_elements`, `note_distribution`, `env_results`).
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.hot import is_model_name
from gobrrr.lint.loops import CONFIG_NAME, name_of
from gobrrr.lint.moves import placeholder, rebinds
from gobrrr.lint.names import BATCHES, COMPILED, DEVICE_WRAPPERS, TENSORISH, self_attr

_MASK_NAME = re.compile(r"^(mask|.*_mask)$")   # `h, mask = to_dense_batch(h, batch)`: a mask by its name
_INDEX_PARAM = re.compile(r"idx|(^|_)(nb|i|id|num|index|no)$")   # a hook's batch_nb, batch_idx: a position
# a module's forward: parameters that hold tensors (or lists and dicts of them) by their usual names
_FORWARD_TENSORS = {"x", "input", "inputs", "outputs", "output", "logits", "targets", "labels", "hidden_states",
                    "y", "src", "tgt", "query", "key", "value", "obs", "observations",
                    "input_ids", "attention_mask", "position_ids", "token_type_ids", "pixel_values",   # a language model's
                    "timestep", "timesteps"}   # a denoiser's: `forward(self, x, timestep)`
_HOOK_TENSORS = {"inputs", "outputs", "output", "x", "y", "logits", "loss", "labels", "targets", "images", "data"}
HOOK_NAMES = _FORWARD_TENSORS | _HOOK_TENSORS


# tensor methods and fields that numpy arrays and Python lists lack (not `.size()`: a process group has one)
_TENSOR_ONLY = {"device", "is_cuda", "view", "unsqueeze", "permute", "contiguous", "dim", "numel", "new_zeros",
                "new_ones", "new_full", "new_tensor", "new_empty", "masked_fill", "masked_fill_", "index_select",
                "detach", "float", "long", "half", "bool", "int"}


def _tensor_uses(fn: ast.AST) -> set[str]:
    """Names a def uses as a torch tensor, by a method or field only tensors have (`features.device`,
    `coors.long()`, `x.view(b, -1)`): a forward's inputs that its caller's kinds do not tell."""
    return {n.value.id for n in ast.walk(fn) if isinstance(n, ast.Attribute) and n.attr in _TENSOR_ONLY
            and isinstance(n.value, ast.Name)}


# numpy functions that turn their argument into an array: a CUDA tensor there raises, so a name handed to one holds host data
_NUMPY_TAKES = {"clip", "concatenate", "stack", "vstack", "hstack", "where", "maximum", "minimum", "asarray", "array",
                "ascontiguousarray", "expand_dims", "floor", "ceil"}


def numpy_named(nodes: list[ast.AST]) -> frozenset[str]:
    """Names that a def's nodes hand to numpy as arrays (`np.clip(bboxes[..., [0, 2]], 0., w)`) and bind from one
    expression only (`x *= s` aside; the same `bboxes, scores, labels = net(x)` in three branches is one), or
    scale in place by a numpy array (`bboxes *= scale`, `scale = np.array(...)`): numpy raises on a CUDA tensor
    (and a CUDA tensor on a numpy array that is no scalar), so whatever made the name it holds host data (a
    detector whose forward ends in a CPU post-process returns numpy boxes: FreeYOLO, yolov2-yolov3)."""
    handed: set[str] = set()
    sources: dict[str, set] = {}
    assigned = {id(e): ast.dump(n.value) for n in nodes if isinstance(n, ast.Assign)
                for t in n.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])}
    augmented = {id(n.target) for n in nodes if isinstance(n, ast.AugAssign)}
    made = {t.id for n in nodes if isinstance(n, ast.Assign) and _numpy_call(n.value) for t in n.targets
            if isinstance(t, ast.Name)}
    handed.update(n.target.id for n in nodes if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
                  and isinstance(n.value, ast.Name) and n.value.id in made)   # bboxes *= scale, a numpy array
    through = {id(t) for n in nodes if isinstance(n, ast.Assign) and _numpy_call(n.value) for t in n.targets
               if isinstance(t, ast.Name) and t.id in _names_in(n.value.args)}
    for n in nodes:   # `bboxes = np.clip(bboxes, 0., w)` rebinds the name to numpy's own result: not a second source
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and id(n) not in augmented | through:
            sources.setdefault(n.id, set()).add(assigned.get(id(n), id(n)))
        elif isinstance(n, ast.arg):   # a parameter is a source of its own (what the caller hands)
            sources.setdefault(n.arg, set()).add(id(n))
        elif _numpy_call(n) and n.func.attr in _NUMPY_TAKES:
            handed |= _names_in([*n.args, *(k.value for k in n.keywords)])
    return frozenset(name for name in handed if len(sources.get(name, ())) == 1)


def _names_in(args: list) -> set[str]:
    """The names of `args` (`bboxes` for `bboxes[..., [0, 2]]`)."""
    out = set()
    for a in args:
        while isinstance(a, ast.Subscript):
            a = a.value
        if isinstance(a, ast.Name):
            out.add(a.id)
    return out


def _numpy_call(node: ast.AST) -> bool:
    """`np.f(...)` or `numpy.f(...)`."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
        and isinstance(node.func.value, ast.Name) and node.func.value.id in ("np", "numpy")


def numpy_named_of(project, src, fn) -> frozenset[str]:
    """numpy_named of one def of `src` (None: the script's own statements, not its defs), once per run: the walk asks
    it of the def it is in, numpy_unpacks of every def."""
    memo = project.per_file.setdefault(id(src), {}).setdefault("numpy_named", {})
    if id(fn) not in memo:
        if "np." not in src.text and "numpy." not in src.text:
            memo[id(fn)] = frozenset()
        elif fn is None:
            memo[id(fn)] = numpy_named([n for st in src.tree.body if not isinstance(st, (
                ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(st)])
        else:
            memo[id(fn)] = numpy_named(list(ast.walk(fn)))
    return memo[id(fn)]


def numpy_unpacks(project) -> frozenset[tuple]:
    """The unpackings into three or more names (the names and the value's text) of which some def of the project
    hands one name to numpy (numpy_named): the same unpacking elsewhere (`bboxes, scores, cls_inds = outputs` in
    four more evaluators that only call float() on them) holds the same numpy arrays; the same names unpacked from
    something else (a replay buffer's `zip(*samples)` against a learner's `experiences`) say nothing."""
    found: set[tuple] = set()
    for src in project.sources:
        if "np." not in src.text:
            continue
        for fn in (n for n in src.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            if not (named := numpy_named_of(project, src, fn)):
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Tuple) \
                        and len(n.targets[0].elts) >= 3 and all(isinstance(e, ast.Name) for e in n.targets[0].elts) \
                        and {e.id for e in n.targets[0].elts} & named:
                    found.add((*(e.id for e in n.targets[0].elts), ast.dump(n.value)))
    return frozenset(found)


def _kwargs_kind(seed: dict, params: set[str]) -> str | None:
    """The kind of a `**kwargs` dict from the keywords a call passes into it: device tensors ('tlist': its
    items are tensors), only numbers and strings ('nums': `metric_logger.update(loss=loss.item())`, whose
    `if isinstance(v, torch.Tensor): v = v.item()` then never runs), or unknown."""
    extra = {k for name, k in seed.items() if "#" not in name and name not in params}
    if extra & {*TENSORISH, "tlist"}:
        return "tlist"
    return "nums" if extra and extra <= {"num", "str"} else None


class ScopeWalk:
    """Binding names as the walk meets them (see the module doc)."""

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            self.scopes[-1][(a.asname or a.name).split(".")[0]] = None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{node.module}.{a.name}" if node.module else a.name

    def _function(self, node, region: str | None = None, chain: tuple[str, ...] = (), seed: dict | None = None,
                  types: dict | None = None) -> None:
        if not chain:
            for d in node.decorator_list:
                self.visit(d)
        saved = (self.region, self.loaders, self.scope_node, self.chain, self.types, self.loop_stack, self.left,
                 self.dead_depth)
        self.left, self.dead_depth = False, 0
        hook = id(node) in self.hotmap.hooks
        per_step = hook or id(node) in self.hotmap.step_fns
        self.region = region or ("hot" if per_step else None)
        self.loaders, self.scope_node, self.chain, self.types, self.loop_stack = [], node, chain, types or {}, []
        self.functions.append(node.name)
        if any(name_of(d.func if isinstance(d, ast.Call) else d) == "compile" for d in node.decorator_list):
            self.functions.append(COMPILED)   # @torch.compile(): what it runs is traced into a graph
        saved_seeding, saved_looping = self.seeding, self.looping_def   # what helpers return is learnt in a def
        self.looping_def = node.name in self.hotmap.looping   # that holds a step loop or calls one that does
        seeds = self.project.per_file.setdefault(id(self.src), {}).setdefault("seed_names", {})
        if id(node) not in seeds:
            seeds[id(node)] = seed_names(node.body, self.project.looping) \
                if self.src.calls.get(node.name, set()) & self.project.looping else set()
        self.seeding = seeds[id(node)]
        self.defs.append(node)
        if self.region == "hot" and not self.silent and not self.summary_depth:   # @cast_torch_tensor def forward:
            for target_src, inner in self.project.wrappers(self.src, node):   # its wrapper runs on every call
                self.pending.append((target_src, inner, {}, {}, (*self.chain, f"{self.src.name}:{node.lineno}"),
                                     list(self.functions)))
        scope: dict[str, str | None] = {}
        args = node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        for a in params:
            scope[a.arg] = self.annotation_kind(a.annotation)
            if scope[a.arg] in ("tensor", "tlist"):
                scope[a.arg + "#dflt"] = "dflt"   # `tensors: list[torch.Tensor]` names no device: a call's host list wins
            if scope[a.arg] == "numpy" and "Tensor" in ast.unparse(a.annotation):
                scope[a.arg + "#dflt"] = "dflt"   # `np.ndarray | Tensor`: numpy unless a call passes a tensor
        for a, d in [*zip(reversed([*args.posonlyargs, *args.args]), reversed(args.defaults)),
                     *zip(args.kwonlyargs, args.kw_defaults)]:
            if isinstance(d, ast.Constant) and d.value is None:
                scope[a.arg + "#opt"] = "opt"   # `x: Tensor | None = None`: `if not x:` tests for None
            if d is not None and scope.get(a.arg) is None and self.kind(d) == "num" \
                    and not (isinstance(d, ast.Constant) and d.value is None):   # `labels=None`: a tensor or nothing
                scope[a.arg] = "num"
                scope[a.arg + "#dflt"] = "dflt"   # a guess from the default: what a call passes wins
        guessed = set()   # a hook's parameters typed by their names: a call site's device kinds win
        if hook:   # a framework (or the step loop) hands the hook device batches, outputs and a model
            for a in params[1:]:
                if scope.get(a.arg) is None:
                    guessed.add(a.arg)
                    tensors = _FORWARD_TENSORS if node.name == "forward" else _HOOK_TENSORS
                    batch = "batch" in a.arg   # forward(self, batched_inputs): a host batch it copies itself
                    scope[a.arg] = "num" if _INDEX_PARAM.search(a.arg) else "tlist" if a.arg.endswith("_dict") \
                        and node.name == "forward" else "batch" if batch and node.name == "forward" \
                        else "tensor" if a.arg in tensors or batch else "obj" if is_model_name(a.arg) or "module" in a.arg \
                        or a.arg == "trainer" else None
            if node.name == "forward":   # forward(self, features, coors): named like nothing, used as a tensor
                used = _tensor_uses(node)
                for a in params[1:]:   # (not `forward(self, opt, var)`: `opt.device` is a config's, BARF's)
                    if scope.get(a.arg) is None and a.arg in used and not CONFIG_NAME.search(a.arg):
                        scope[a.arg] = "tensor"
        if args.kwarg is not None and seed and args.kwarg.arg not in seed:
            scope[args.kwarg.arg] = _kwargs_kind(seed, {a.arg for a in params})
        for name, k in (seed or {}).items():   # `sample(z, temperature, cfg_iter)` with a CUDA cfg_iter passes
            if scope.get(name) is None or (k in TENSORISH and scope.get(name + "#dflt")) \
                    or (k in ("num", "host", "hlist", "nums", "numpy", "pinned", *BATCHES)
                        and scope.get(name) in ("tensor", "tlist") and scope.get(name + "#dflt")) \
                    or (name in guessed and k in (*TENSORISH, "tlist", "numpy", "host", "hlist", *BATCHES)):
                # `cfg=1.0` a tensor, forward(batch) a dict of them, `self.actor(np.concatenate(obs))` a host array it
                # moves itself, `batch: tuple[torch.Tensor, ...]` a loader's host batch
                scope[name] = k
                scope.pop(name + "#dflt", None)   # what a call passes: no longer a guess
            if k in TENSORISH and chain and name not in guessed:
                scope[name + "#handed"] = "handed"   # a device tensor the hot caller made (sync._made_here)
        closure = self.closure_scope(node) if chain else None
        if closure is not None:
            self.scopes.append(closure)
        self.scopes.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self.check_loaders()
        self.scopes.pop()
        if closure is not None:
            self.scopes.pop()
        if self.functions[-1] == COMPILED:
            self.functions.pop()
        self.functions.pop()
        self.defs.pop()
        self.region, self.loaders, self.scope_node, self.chain, self.types, self.loop_stack, self.left, \
            self.dead_depth = saved
        self.seeding, self.looping_def = saved_seeding, saved_looping

    def items_moved(self) -> dict[str, int]:
        """Names whose items this def copies to the device by key (`split_idx['train'].to(device)`), with the
        last line that does: bound from a call above that line, a container of host tensors, whatever made it (bound
        below it, as 3DETR's `batch = all_gather_dict(batch)` after the moves, the device tensors). Once per def."""
        scope = self.scope_node
        memo = self.project.per_file.setdefault(id(self.src), {}).setdefault("items_moved", {})
        if id(scope) not in memo and not any(k in self.src.text for k in ("'].to(", '"].to(', "'].cuda(", '"].cuda(')):
            memo[id(scope)] = (scope, {})   # no item moved by a string key anywhere in the file
        if id(scope) not in memo:
            last: dict[str, int] = {}
            for n in ast.walk(scope):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("to", "cuda") \
                        and isinstance(n.func.value, ast.Subscript) and isinstance(n.func.value.value, ast.Name) \
                        and isinstance(n.func.value.slice, ast.Constant) and isinstance(n.func.value.slice.value, str):
                    last[n.func.value.value.id] = max(last.get(n.func.value.value.id, 0), n.lineno)
            memo[id(scope)] = (scope, last)
        return memo[id(scope)][1]

    def closure_scope(self, node) -> dict | None:
        """A nested def walked as hot on its own (a loss_fn its factory returned): what the def around it
        assigns, in order, so that `smld_sigma_array = torch.flip(vesde.discrete_sigmas, (0,))` is known
        as a host table inside it."""
        outer = self.src.parent.get(id(node))
        if outer is None or not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        scope: dict = {}
        self.scopes.append(scope)
        try:
            for st in outer.body:
                if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                    scope[st.targets[0].id] = self.kind(st.value)
        finally:
            self.scopes.pop()
        return scope

    def visit_FunctionDef(self, node) -> None:
        self._function(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        saved, self.region = self.region, (self.region if id(node) in self.eager_lambdas else None)
        a = node.args
        item = getattr(self, "lambda_items", {}).get(id(node))   # tree_map(lambda x: x.to(d), batch): a leaf
        self.scopes.append({p.arg: item for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]})
        self.visit(node.body)   # deferred (a callback, `default(x, lambda: ...)`) unless map() runs it now
        self.scopes.pop()
        self.region = saved

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scopes.append({})
        self.generic_visit(node)
        self.scopes.pop()

    def visit_Assign(self, node: ast.Assign) -> None:
        self.assigning = {t.id for t in node.targets if isinstance(t, ast.Name)} if self.seeding else set()
        self.init_attrs = bool(self.defs) and getattr(self.defs[-1], "name", "") == "__init__" \
            and (all(self_attr(e) for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t]))
                 or isinstance(node.value, ast.Call) and self_attr(node.value.func))   # cos, sin = self._cache(n)
        self.rebinding = id(node.value) if rebinds(node) else None
        try:
            self._assign(node)
        finally:
            self.assigning, self.init_attrs, self.rebinding = set(), False, None
        self.note_elements(node)   # after the binding, which clears a name's marks
        self.note_positions(node.targets, node.value)

    def _numpy_named(self) -> frozenset[str]:
        return numpy_named_of(self.project, self.src, self.defs[-1] if self.defs else None)

    def _unpacks(self) -> frozenset[tuple]:
        if self.project.numpy_unpacks is None:
            self.project.numpy_unpacks = numpy_unpacks(self.project)
        return self.project.numpy_unpacks

    def _packed(self, name: str) -> bool:
        """`name` is a PackedSequence in this def: tested with `isinstance(name, PackedSequence)` or made by a
        `pack_padded_sequence` / `pack_sequence` call."""
        fn = self.defs[-1] if self.defs else None
        if fn is None or "PackedSequence" not in self.src.text and "pack_" not in self.src.text:
            return False
        span = range(getattr(fn, "lineno", 0), (getattr(fn, "end_lineno", None) or 0) + 1)
        nodes = [n for n in self.src.nodes if getattr(n, "lineno", -1) in span]   # the file's own nodes (a def the
        # lint made up for a summary may hold holes that ast.walk trips over)
        return any(isinstance(n, ast.Call) and name_of(n.func) == "isinstance" and len(n.args) == 2
                   and isinstance(n.args[0], ast.Name) and n.args[0].id == name
                   and name_of(n.args[1]) == "PackedSequence" for n in nodes) \
            or any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                   and name_of(n.value.func) in ("pack_padded_sequence", "pack_sequence")
                   and any(isinstance(t, ast.Name) and t.id == name for t in n.targets) for n in nodes)

    def _assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        zero_d = self.zero_d(node.value) or self.zero_d_element(node.value)
        self.note_distribution(node)
        for t in node.targets:
            self.visit_target(t)
            self.host_write(t, node.value)
        value = node.value
        names = [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        if all(isinstance(e, ast.Name) for e in names) \
                and ({e.id for e in names} & self._numpy_named() or len(node.targets) == 1
                     and isinstance(node.targets[0], ast.Tuple)
                     and (*(e.id for e in names), ast.dump(value)) in self._unpacks()) \
                and self.kind(value) in (*TENSORISH, None):
            for e in names:   # bboxes, scores, labels = net(x), then np.clip(bboxes, ...): the model's outputs
                self.bind(e, "numpy")   # are numpy arrays, all of them
            return
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr in DEVICE_WRAPPERS and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Tuple) and len(node.targets[0].elts) == len(value.args):
            # model, opt, loader = accelerator.prepare(model, opt, loader): the loader yields device batches
            for t, a in zip(node.targets[0].elts, value.args):
                k = self.iter_kind(a)
                self.bind(t, "loader_device" if k and k.startswith("loader") else self.kind(a))
            return
        if isinstance(value, ast.Tuple) and all(isinstance(t, ast.Tuple) for t in node.targets):
            for t in node.targets:
                for a, v in zip(t.elts, value.elts):
                    self.bind(a, self.kind(v))
            return
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "step" \
                and value.args and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) \
                and len(node.targets[0].elts) in (4, 5):
            k = self.env_results(node)   # obs, reward, done, info = env.step(action): info is a dict
            for i, t in enumerate(node.targets[0].elts):
                self.bind(t, None if i == len(node.targets[0].elts) - 1 else k)
            return
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) \
                and not any(isinstance(t, ast.Starred) for t in node.targets[0].elts) \
                and (parts := self.unpacked_kinds(value, len(node.targets[0].elts))) is not None:
            for t, k in zip(node.targets[0].elts, parts):   # a, b = helper(x): each item as the helper returns it
                self.bind(t, k)
                if isinstance(t, ast.Name):
                    self.scopes[-1][t.id + "#part"] = "part"   # a helper's guess: no evidence for a size rule
            return
        if isinstance(value, ast.Constant) and value.value is None and all(self_attr(t) for t in node.targets):
            return   # self.tloss = None: a reset before the step assigns what the attribute holds
        if isinstance(value, ast.BoolOp):   # `cached = self.use_cache and not locs.any()`: bool() of the tensor,
            last = value.values[-1]          # here (of every operand but the last, and of a `not` one)
            for v in [*value.values[:-1], *([last] if isinstance(last, ast.UnaryOp) else [])]:
                inner = v.operand if isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not) else v
                if isinstance(inner, ast.Compare) or isinstance(inner, ast.Call) \
                        and name_of(inner.func) in _TRUTH_CALLS:   # computed here: `m.any()`, `x.isnan().all()`
                    self.check_condition(v)
            if isinstance(last, ast.UnaryOp) and isinstance(last.op, ast.Not):
                for t in node.targets:
                    self.bind(t, "num")
                return
        k = self.kind(value)
        if k in (None, "obj") and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(value, ast.Call) and self.items_moved().get(node.targets[0].id, 0) > node.lineno:
            k = "hlist"   # split_idx = dataset.get_idx_split(), then split_idx['train'].to(device): host tensors
        if zero_d:
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.bind(t, k)
                    self.scopes[-1][t.id + "#0d"] = "0d"   # best = scores.argmax(): one element, as an index an .item()
            return
        if k == "tensor" and self.guessed(value):
            if any(isinstance(t, ast.Tuple) for t in node.targets):
                k = None   # `q, was_thd = helper(q)`: a guess that a call returns a tensor says nothing of its parts
            self.guesses.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif k == "tensor" and any(isinstance(t, ast.Tuple) for t in node.targets) and self.own_method(value):
            k = None   # `_, feats, sizes = self._features(x)` not read: a method's tuple may hold sizes
        for t in node.targets:
            self.bind(t, k)
            if isinstance(t, ast.Tuple) and len(t.elts) == 4 and isinstance(value, ast.Name) and self._packed(value.id):
                self.bind(t.elts[1], "host")   # inputs, batch_sizes, sorted_indices, unsorted_indices = inputs: a
                # PackedSequence's batch sizes stay on the CPU (DeepCTR's DynamicGRU slices by them)
            if k is None and isinstance(t, ast.Tuple) and self.kind(value) == "tensor":   # h, mask = to_dense_batch(
                for e in t.elts:   # h, batch): what a call of device tensors names a mask is one (GraphGPS's layers)
                    if isinstance(e, ast.Name) and _MASK_NAME.search(e.id):
                        self.bind(e, "mask")
            if isinstance(t, ast.Name) and placeholder(value):
                self.scopes[-1][t.id + "#empty"] = "empty"   # `idx = torch.tensor([]).to('cuda')`, then filled by an if
            elif isinstance(t, ast.Name) and isinstance(value, ast.Constant) and value.value is None:
                self.scopes[-1][t.id + "#empty"] = "none"   # `batch_iterator = None`, a loader each epoch (PytorchSSD)
        self.note_flat(node.targets, value)
        for t in node.targets:
            for kl in self.key_loops:   # for k in batch: batch[k] = batch[k].to(dev): flow binds batch after the loop
                if kl and k in TENSORISH and isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) \
                        and isinstance(t.slice, ast.Name) and kl[:2] == [t.slice.id, t.value.id]:
                    kl.append("moved")
            if k == "loader_pageable" and isinstance(t, ast.Name):
                self.loaders.append({"name": t.id, "node": value, "scope": self.scope_node})
            if isinstance(t, ast.Tuple) and isinstance(value, ast.Call) and not (
                    isinstance(value.func, ast.Attribute) and self.kind(value.func.value) in TENSORISH
                    or (self.dotted(value.func) or "").startswith("torch.")):
                for n in t.elts:   # x, feat_size = stage(x, feat_size): a module's parts may be sizes
                    if isinstance(n, ast.Name):
                        self.scopes[-1][n.id + "#part"] = "part"
        aliased = value.body if isinstance(value, ast.IfExp) else value  # `a if cuda else noop`
        if self.cuda_type(aliased) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.cuda_types[node.targets[0].id] = self.cuda_types.get(aliased.id, "") if isinstance(aliased, ast.Name) \
                else self.dotted(aliased) or ""   # Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
        dotted = self.dotted(aliased) if isinstance(aliased, ast.Attribute) else None
        if dotted and dotted.endswith(".synchronize") and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            self.aliases[node.targets[0].id] = dotted  # synchronize = torch.cuda.synchronize

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        elif isinstance(node.target, ast.Attribute):
            return   # `self.quantiles: torch.Tensor` before register_buffer: a declaration of one class's attribute,
            #          not what every class of the file keeps under that name (chronos's pipeline has a list)
        k = self.annotation_kind(node.annotation) or (self.kind(node.value) if node.value else None)
        self.bind(node.target, k)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        self.visit_target(node.target)
        self.host_write(node.target, node.value, augmented=True)
        if isinstance(node.target, ast.Name):
            self.bind(node.target, self.kind(ast.BinOp(node.target, node.op, node.value)))

    def visit_target(self, t: ast.AST) -> None:
        if isinstance(t, (ast.Subscript, ast.Attribute)):
            self.visit(t.value)
            if isinstance(t, ast.Subscript):
                self.index_rule(t)
                self.scalar_index(t)
                self.visit(t.slice)

    def visit_Expr(self, node: ast.Expr) -> None:
        v = node.value   # losses.append(loss): a list of device tensors; xs.append(x.cpu()): of host ones
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "append" \
                and isinstance(v.func.value, ast.Name) and len(v.args) == 1:
            k, old = self.kind(v.args[0]), self.lookup(v.func.value.id)
            if (k in TENSORISH or k == "tlist" and isinstance(v.args[0], ast.Tuple)) and old in (None, "tlist"):
                # indices.append((b, a, gj, gi)): a list of tuples of device tensors; indices[i] unpacks to them
                self.bind(v.func.value, "tlist")
                if k == "mask":
                    self.mask_lists.add(v.func.value.id)   # fg_masks.append(fg_mask)
            elif k == "host" and old in (None, "hlist"):
                self.bind(v.func.value, "hlist")
        self.generic_visit(node)


_TRUTH_CALLS = {"any", "all", "isnan", "isinf", "isfinite", "equal", "eq", "ne", "gt", "ge", "lt", "le"}


def seed_names(body: list[ast.stmt], looping: set[str]) -> set[str]:
    """The names passed to calls of defs that hold a step loop (`sample_euler(model, x, sigmas)`):
    what a helper returns into them is worth learning (calls.return_kind)."""
    if not looping:
        return set()
    return {a.id for st in body for n in ast.walk(st) if isinstance(n, ast.Call) and name_of(n.func) in looping
            for a in [*n.args, *(k.value for k in n.keywords)] if isinstance(a, ast.Name)}


__all__ = ["HOOK_NAMES", "ScopeWalk", "seed_names"]
