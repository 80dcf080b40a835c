"""The walk of `gobrrr lint`: the Checker, which finds the rules GB001-GB014 in one module.

Per file, after hot.HotMap (syntax only: step loops, hooks, rare branches, timed syncs), the
Checker walks the module once with kinds' guess of what each name holds and applies a rule
only with evidence that the value is a tensor. The Checker is this file's driver (regions,
reporting, the entry points, the rules on calls) over mixins by concept: scopes (binding names
as the walk meets them), flow (loops, branches, error paths), calls (following calls into the
project), sync (reading a device value on the host, synchronize, data-dependent shapes), moves
(copies and host indices), inside (barriers, syncs inside torch), env (CPU environments), elements
(one-dimensional device tensors and their 0-d elements); what
each rule says, and the Finding it makes, are in findings.py.

Regions: None (straight-line code), 'cold' (a loop that does not step), 'hot' (a step loop, a
per-step hook, a per-element loop that syncs on each element, a function called from hot code),
'off' (rare branches, error paths). Each call made from hot code is resolved through the project
(graph) and queued in `pending`; the driver (lint.check_project) walks the queued function
later as hot, its parameters typed from the call site, with the chain of calls that made it hot.
"""
from __future__ import annotations

import ast

from gobrrr.lint.calls import MAX_DEPTH, CallRules
from gobrrr.lint.elements import ElementRules
from gobrrr.lint.env import EnvRules, env_makers
from gobrrr.lint.findings import RULES, SYNC_RULES, TITLES, Finding
from gobrrr.lint.flow import FlowRules
from gobrrr.lint.graph import Project
from gobrrr.lint.hot import HotMap, host_model_def
from gobrrr.lint.inside import InsideRules
from gobrrr.lint.kinds import Kinds
from gobrrr.lint.loops import name_of
from gobrrr.lint.moves import CopyRules
from gobrrr.lint.names import BATCHES, ITEM_KIND, LOADERS_PINNED
from gobrrr.lint.pylists import ListRules
from gobrrr.lint.scopes import HOOK_NAMES, ScopeWalk, seed_names
from gobrrr.lint.source import Source
from gobrrr.lint.sync import SyncRules

# RULES, SYNC_RULES, TITLES, Finding, HOOK_NAMES and MAX_DEPTH stay importable from here, as before they moved
# (the 0.1 name gobrrr.device.lint_rules still resolves to this module); check.py imports each from its own file

_EAGER = {"map", "filter", "sorted", "max", "min", "list", "tuple"}
_IMAGE_SINKS = ("save_image", "imsave", "imwrite", "fromarray", "imshow", "add_image", "add_images", "add_video",
                "write_video", "make_grid", "Image", "savefig", "log_image", "log_images")


def _not_a_mode_switch(call: ast.Call) -> bool:
    """`agent.train(data_sampler, iterations=n)`, not `model.train()` / `model.train(False)`: a project's own
    `train` that holds a step loop, whose arguments seed it (check._seeded)."""
    if not call.args and not call.keywords:
        return False
    only = call.args[0] if len(call.args) == 1 and not call.keywords else None
    return not (isinstance(only, ast.Constant) and isinstance(only.value, bool)) and not (
        isinstance(only, ast.Name) and only.id in ("mode", "training", "train", "is_train"))


class Checker(ScopeWalk, FlowRules, CallRules, SyncRules, CopyRules, InsideRules, EnvRules, ElementRules, ListRules,
              Kinds, ast.NodeVisitor):
    """One module's findings (see the module doc)."""

    def __init__(self, src: Source, project: Project | None = None, hotmap: HotMap | None = None,
                 project_flags: dict | None = None):
        Kinds.__init__(self)
        self.src = src
        self.path = str(src.path)
        self.project = project or Project([src])
        self.buffers = self.project.buffers
        self.python_attrs = self.project.python_attrs
        self.hotmap = hotmap or HotMap(src.tree, self.path, src.nodes)
        self.models = self.hotmap.models
        self.project_flags = project_flags or {}
        cache = self.project.per_file.setdefault(id(src), {})
        if "env_makers" not in cache:   # a summary's scratch checker of the same file reuses it
            cache["env_makers"] = env_makers(src.nodes)
        self.env_makers = cache["env_makers"]
        self.local_defs = src.functions
        self.findings: dict[tuple[str, int], Finding] = {}
        self.spans: dict[tuple[str, int], range] = {}   # lines a finding's node covers (for suppression)
        self.names_at: dict[tuple[str, int], set[str]] = {}   # names in a finding's node (for GB014)
        self.round_trips: dict[str, list] = {}   # "main.py:93" (a GB014 loop's policy call) -> [(GB014, lines)]
        self.region: str | None = None
        self.loaders: list[dict] = []           # pageable DataLoaders in this scope (GB006 candidates)
        self.scope_node: ast.AST | None = None  # the module or function whose loops GB006 searches
        self.functions: list[str] = []          # names of the enclosing functions
        self.defs: list[ast.AST] = []           # the enclosing defs (to resolve calls)
        self.types: dict = {}                   # parameter -> (Source, ClassDef) handed over by a call site
        self.chain: tuple[str, ...] = ()        # the calls that made the current function hot
        self.pending: list[tuple] = []          # (Source, def, kinds, types, chain, functions) to walk as hot
        self.waiting: list[tuple] = []          # pending calls of a CPU-only file, held back (lint.check_sources)
        self.dropped: dict = {}                 # findings of a CPU-only file, held back
        self.loop_stack: list[int] = []         # id() of the enclosing loops
        self.key_loops: list = []               # (key, container) of the enclosing loops over a container's keys
        self.guesses: set[str] = set()          # names bound to an unknown call's result, guessed a tensor
        self.module_scope: dict = {}
        self.silent = False                     # a first pass over a step loop's body: kinds only (flow)
        self.eager_lambdas: set[int] = set()    # id of lambdas that map()/sorted() call right away
        self.lambda_items: dict[int, str] = {}  # id(lambda) -> the kind its one parameter takes (a batch's leaves)
        self.cuda_types: dict[str, str] = {}    # name -> the torch.cuda.FloatTensor (or friend) it is bound to
        self.seeding: set[str] = set()          # names this def hands to a def holding a step loop (note_seed)
        self.assigning: set[str] = set()        # the names the assignment being walked binds
        self.init_attrs = False                 # in __init__, it binds self attributes or calls an own helper
        self.rebinding: int | None = None       # id of a move stored back into its attribute (moves.rebinds)
        self.seeds: list[tuple] = []            # (Source, def holding a step loop, kinds and classes of its parameters)
        self.left = False                       # this call has returned (flow.static_truth): the rest is dead
        self.dead_depth = 0                     # > 0 inside a branch this call never takes (flow.static_truth)
        self._host_defs: dict[int, bool] = {}   # id(def) -> hot.host_model_def
        self.mask_lists: set[str] = set()       # lists that masks are appended to (torch.cat of them is a mask)
        self.normal_attrs: set[tuple[str, str]] = set()   # (class, self attribute) bound to a Normal (inside)
        self.dist_attrs: set[tuple[str, str]] = set()     # (class, self attribute) bound to a validated one
        self.dist_list_attrs: set[tuple[str, str]] = set()   # (class, self attribute) bound to a list of them
        self.summary_depth = 0                  # > 0 in a scratch walk that only learns what a def returns
        self.cut = False                        # that walk met a call too deep to follow
        self.rare_depth = 0                     # > 0 inside a rare branch of hot code (flow: its own step loops)
        self.looping_def = False                # in a def that holds a step loop (its set-up learns what helpers return)
        self.collect: ast.AST | None = None     # that def
        self.returns: list = []                 # the kinds of its return values
        self.return_at: dict[int, str | None] = {}   # id(Return) -> the kind it returns (summaries' main path)
        self.return_items: list = []            # per return: the kinds of a returned tuple's items, or None
        self.return_keyed: list = []            # per return: {key: kind} of a returned dict literal, or None
        self.return_dicts: dict[int, dict] = {}   # id(Call) -> {key: kind} of the dict it returns
        self.return_kinds: dict[int, str | None] = {}   # id(Call) -> what the project def it runs returns
        self.read_defs: set[int] = set()   # id(Call) of project defs read whose return is unknown
        self.return_parts: dict[int, tuple | None] = {}   # id(Call) -> the kinds of the tuple it returns

    # -- reporting
    def flag(self, node: ast.AST, rule: str, hot: bool | None = None, fix: str | None = None, **fmt) -> None:
        if self.region == "off" or self.silent or not self.chain and self.on_host_model():
            return
        hot = self.region == "hot" if hot is None else hot
        message, default_fix = RULES[rule]
        message = message.format(**fmt)
        if hot and not self.loop_stack:   # a hook, a forward or a helper: per step, not per iteration here
            message = message.replace(" inside a loop", " in per-step code").replace(
                " inside the loop", " in per-step code").replace("every iteration", "every step")
        key = (rule, node.lineno)
        old = self.findings.get(key)
        if old is None or (hot and not old.hot):
            chain = list(self.chain) if hot else []
            self.findings[key] = Finding(self.path, node.lineno, node.col_offset + 1, rule, message,
                                         (fix or default_fix).format(**fmt), hot, chain)
            self.spans[key] = range(node.lineno, (getattr(node, "end_lineno", None) or node.lineno) + 1)
            self.names_at[key] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    def on_host_model(self) -> bool:
        """In a def that builds and calls its own module and never names a device (hot.host_model_def)."""
        fn = self.defs[-1] if self.defs else None
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or self.default_cuda("torch.zeros"):
            return False
        if id(fn) not in self._host_defs:
            self._host_defs[id(fn)] = host_model_def(fn, self.project.plain_classes)
        return self._host_defs[id(fn)]

    def visit(self, node: ast.AST):
        if self.left and self.summary_depth and isinstance(node, ast.stmt):
            return None   # a summary reads what this call returns: not the returns of the dead rest
        if self.region != "off" and (id(node) in self.hotmap.off_tails or self.left and isinstance(node, ast.stmt)):
            return self.visit_off(node)   # after `if not should_log(step): return`, or a return this call takes
        return super().visit(node)

    def looping(self) -> bool:
        return self.region in ("hot", "cold")

    def visit_off(self, *nodes: ast.AST) -> None:
        saved, self.region = self.region, "off"
        for n in nodes:
            if n is not None:
                self.visit(n)
        self.region = saved

    def check_module(self) -> None:
        """The module as written (its hot code queues the calls it makes in `pending`)."""
        self.scope_node = self.src.tree
        self.seeding = seed_names([st for st in self.src.tree.body if not isinstance(
            st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))], self.project.looping)
        self.visit(self.src.tree)
        self.check_loaders()
        self.module_scope = self.scopes[0]

    def check_hot(self, fn: ast.AST, kinds: dict, types: dict, chain: tuple[str, ...], functions: list[str]) -> None:
        """Walk one function as hot code: a step loop (`chain[0]`) calls it through `chain`."""
        self.scopes = [self.module_scope]
        self.functions = list(functions)   # a helper of `def benchmark()` is benchmark code
        self.defs = [d for d in self._enclosing(fn)]
        self._function(fn, region="hot", chain=chain, seed=kinds, types=types)

    def check_seeded(self, fn: ast.AST, kinds: dict, types: dict | None = None) -> None:
        """Walk a def that holds a step loop again, its parameters typed by the project's calls of it
        (calls.note_seed); its regions are its own (a library sampler called from a script)."""
        self.scopes = [self.module_scope]
        self.defs = [d for d in self._enclosing(fn)]
        self.functions = [d.name for d in self.defs if hasattr(d, "name")]
        if "loader_device" in kinds.values():   # vali(..., vali_loader) with every caller's loader prepared by
            spans = [range(n.lineno, (n.end_lineno or n.lineno) + 1) for n in ast.walk(fn)   # accelerate: the first
                     if id(n) in self.hotmap.step_loops]   # walk, blind to that, took its batches for host ones; this
            for key in [k for k, f in self.findings.items() if f.rule in ("GB009", "GB010", "GB005")   # walk says
                        and not f.chain and any(f.line in r for r in spans)]:   # again what still holds in its loops
                del self.findings[key]
        self._function(fn, seed=kinds, types=types)

    def _enclosing(self, fn: ast.AST) -> list[ast.AST]:
        out, s = [], self.src.parent.get(id(fn))
        while s is not None:
            out.insert(0, s)
            s = self.src.parent.get(id(s))
        return out

    def visit_With(self, node: ast.With) -> None:
        """`with dt[0]:` / `with timer:` in hot code runs the project class's __enter__ and __exit__
        (ultralytics' Profile, which synchronizes the device to time each stage). `with tqdm(loader) as bar:`
        binds the bar as the loader it wraps."""
        for item in node.items:
            if isinstance(item.optional_vars, ast.Name):
                k = self.kind(item.context_expr)
                if k and k.startswith(("loader", "enum_")):
                    self.bind(item.optional_vars, k)
        if self.region == "hot" and not self.silent:
            for item in node.items:
                ctx = item.context_expr
                if isinstance(ctx, ast.Subscript):
                    ctx = ctx.value
                if isinstance(ctx, ast.Name) or isinstance(ctx, ast.Attribute) and isinstance(ctx.value, ast.Name) \
                        and ctx.value.id == "self":
                    for m in ("__enter__", "__exit__"):
                        self.follow(ast.copy_location(ast.Call(func=ast.Attribute(
                            value=item.context_expr, attr=m, ctx=ast.Load()), args=[], keywords=[]), node))
        self.generic_visit(node)

    def batch_lambdas(self, node: ast.Call) -> None:
        """`tree_map(lambda x: x.to(device), batch)`, `map_structure(batch, lambda x: x.to(device))`: a helper
        runs the lambda now on each leaf of the batch it is handed with it, so its parameter is one of the batch's
        tensors (a copy of per-step data, as `{k: v.to(device) for k, v in batch.items()}` is)."""
        args = [*node.args, *(k.value for k in node.keywords)]
        lams = [a for a in args if isinstance(a, ast.Lambda) and len(a.args.args) == 1 and not a.args.vararg]
        if len(lams) != 1:
            return
        kinds = [self.kind(a) for a in args if a is not lams[0]]
        batch = next((k for k in kinds if k in BATCHES), None)
        if batch is not None:
            self.eager_lambdas.add(id(lams[0]))
            self.lambda_items[id(lams[0])] = ITEM_KIND[batch]

    # -- the rules on expressions
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self.dotted(func) or ""
        method = func.attr if isinstance(func, ast.Attribute) else None
        recv = self.kind(func.value) if method else None
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if name in _EAGER and node.args and isinstance(node.args[0], ast.Lambda):
            self.eager_lambdas.add(id(node.args[0]))   # map(lambda t: t.item(), ts): run here, per item
        self.batch_lambdas(node)
        self.copy_rules(node, func, name, method, recv, kw)
        if self.looping():
            self.sync_rules(node, func, name, method, recv, kw)
            self.inside_rules(node, func, name, method, kw)
        if self.region == "hot" and not self.silent:
            self.follow(node)
        elif not self.silent and not self.summary_depth and (name_of(func) in self.project.looping or (
                self.hotmap.facts.aliases.get(name_of(func), set()) & self.project.looping) or (
                name_of(func) in self.project.housekeeping_looping and _not_a_mode_switch(node))):
            self.note_seed(node)   # sample_euler(model, x, sigmas) from a script: its own loop learns the kinds
        # calls that hand a pageable loader to gobrrr (which pins): not a GB006 any more
        if isinstance(func, (ast.Name, ast.Attribute)) and name.rsplit(".", 1)[-1] in LOADERS_PINNED:
            for a in node.args:
                if isinstance(a, ast.Name):
                    self.loaders = [d for d in self.loaders if d["name"] != a.id]
        if name.rsplit(".", 1)[-1] in _IMAGE_SINKS:   # save_image(x.cpu()): deliberate output, not a stall
            self.visit(func)
            return self.visit_off(*node.args, *[k.value for k in node.keywords])
        self.generic_visit(node)



__all__ = ["RULES", "SYNC_RULES", "TITLES", "HOOK_NAMES", "Finding", "Checker", "MAX_DEPTH"]
