"""What `gobrrr lint` looks for: the rules GB001-GB009 and the AST walk that finds them.

Two passes over one file:

    1. lint_hot.HotMap (syntax only): the step loops, the rare branches inside them, the
       same-file functions they call, the synchronize() calls used for timing.
    2. Checker (this file, with the host-read rules of lint_sync): walks the module once with
       lint_kinds' guess of what each name holds, and applies a rule only with evidence that the
       value is a tensor; then walks once more each function called from a step loop, as hot
       code, its parameters typed from the call site.

Each finding is `hot` (in a step loop, a per-step hook, or a helper they call: shown by default)
or not (a loop that does not step, an epoch loop, set-up code: shown with `--all`). Rare branches
(`if step % 100 == 0:`), error paths (`raise`, `except`) and synchronize() next to a timer are not
findings at all.
"""
from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from gobrrr.lint.hot import HotMap, is_model_name, iterates, name_of, own_nodes, root_name
from gobrrr.lint.kinds import (
    BATCHES,
    DEVICE_WRAPPERS,
    DTYPE_METHODS,
    FACTORIES,
    ITEM_KIND,
    LOADERS_PINNED,
    TENSORISH,
    VIEW_METHODS,
    Kinds,
)
from gobrrr.lint.sync import SyncRules

RULES = {
    "GB001": ("tensor built on the host, then copied to the device: an extra host allocation and a "
              "blocking host-to-device copy",
              "create it on the device (device=... for torch.zeros/randn/arange/full...); for host data, build it "
              "pinned and copy with non_blocking=True, or keep the value on the device"),
    "GB002": ("{what} inside a loop makes the host wait for the GPU every iteration",
              "keep the value on the device (accumulate into a tensor) and read it once after the loop or every N steps"),
    "GB003": ("{what} a tensor inside a loop copies it to the host and waits for the GPU every iteration",
              "log a detached value every N steps (if step % N == 0) or after the loop"),
    "GB004": ("{what} inside a loop stalls the host until the GPU drains, every iteration",
              "order work with events: event.record() then stream.wait_event(event); poll with event.query()"),
    "GB005": ("non_blocking=True from pageable host memory is not asynchronous: CUDA stages the copy and "
              "the host waits", "pin the source: .pin_memory(), DataLoader(pin_memory=True) or gobrrr.Prefetcher"),
    "GB006": ("DataLoader without pin_memory=True whose batches go to CUDA: every copy is a slow, blocking "
              "copy from pageable memory",
              "pass pin_memory=True and copy with non_blocking=True, or wrap it in gobrrr.Prefetcher"),
    "GB007": ("a tensor used as a Python condition{where} waits for the GPU to decide the branch",
              "keep the decision on the device: torch.where(cond, a, b) or masking; check on the host every N steps"),
    "GB008": ("{what} inside a loop has a data-dependent output shape: the host waits for the GPU to learn the size",
              "use fixed-shape ops: torch.where(mask, x, 0), masked_fill, or nonzero_static / bincount with a known size"),
    "GB009": ("blocking host-to-device copy of every batch (`{what}` without non_blocking=True): the host "
              "waits for the copy and the GPU for the host, each step",
              "DataLoader(pin_memory=True) and .to(device, non_blocking=True), or wrap the loader in "
              "gobrrr.Prefetcher(loader, device=device), which copies the next batch during this step"),
}
SYNC_RULES = {"GB002", "GB003", "GB004", "GB007", "GB008"}  # exempt on a line marked `# sync: why`
TITLES = {"GB001": "a tensor built on the host, then moved to the device", "GB002": ".item() / .cpu() / .tolist() / float(t)",
          "GB003": "printing or formatting a tensor", "GB004": "torch.cuda / stream / event synchronize()",
          "GB005": "non_blocking=True from pageable memory", "GB006": "a DataLoader without pin_memory feeding the GPU",
          "GB007": "a tensor as a Python condition", "GB008": "data-dependent shapes (nonzero, x[mask], unique)",
          "GB009": "a blocking .to(device) / .cuda() of every batch"}
_HOOK_TENSORS = {"inputs", "outputs", "output", "x", "y", "logits", "loss", "labels", "targets", "images", "data"}


@dataclass
class Finding:
    path: str
    line: int
    col: int      # 1-based, like compilers and editors
    rule: str
    message: str
    fix: str
    hot: bool = True   # in a step loop or what it calls (shown by default); else shown with --all

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule} {self.message}" + ("" if self.hot else " [not per-step]")


class Checker(SyncRules, Kinds, ast.NodeVisitor):
    """One module's findings. Regions: None (straight-line code), 'cold' (a loop that does not
    step), 'hot' (a step loop, a per-step hook, a helper they call), 'off' (rare or error paths)."""

    def __init__(self, path: str, hotmap: HotMap | None = None):
        Kinds.__init__(self)
        self.path = path
        self.hotmap = hotmap or HotMap(ast.Module(body=[], type_ignores=[]), path)
        self.models = self.hotmap.models
        self.findings: dict[tuple[str, int], Finding] = {}
        self.spans: dict[tuple[str, int], range] = {}   # lines a finding's node covers (for suppression)
        self.region: str | None = None
        self.loaders: list[dict] = []           # pageable DataLoaders in this scope (GB006 candidates)
        self.scope_node: ast.AST | None = None  # the module or function whose loops GB006 searches
        self.functions: list[str] = []          # names of the enclosing functions
        self.via: int | str | None = None       # where a revisited helper is called from (line, or file:line)
        self.call_args: dict[int, dict[str, str | None]] = {}   # id(def) -> parameter kinds at a hot call
        self.callers: dict[int, str] = {}                        # id(def) -> the function of that call
        self.loop_stack: list[int] = []                          # id() of the enclosing loops

    # -- reporting
    def flag(self, node: ast.AST, rule: str, hot: bool | None = None, **fmt) -> None:
        if self.region == "off":
            return
        hot = self.region == "hot" if hot is None else hot
        message, fix = RULES[rule]
        message = message.format(**fmt)
        if hot and isinstance(self.via, str):
            message += f" (in a function called from the step loop at {self.via})"
        elif hot and self.via:
            message += f" (in a function called from the step loop at line {self.via})"
        key = (rule, node.lineno)
        old = self.findings.get(key)
        if old is None or (hot and not old.hot):
            self.findings[key] = Finding(self.path, node.lineno, node.col_offset + 1, rule, message, fix, hot)
            self.spans[key] = range(node.lineno, (getattr(node, "end_lineno", None) or node.lineno) + 1)

    def updating(self) -> bool:
        """In a loop that trains (backward / optimizer step), or in a helper or hook of one: not a
        generation or inference loop, where a small per-prompt copy is not worth a finding."""
        return self.via is not None or not self.loop_stack or self.loop_stack[-1] in self.hotmap.update_loops

    def visit(self, node: ast.AST):
        if self.region != "off" and id(node) in self.hotmap.off_tails:
            return self.visit_off(node)   # after `if not should_log(step): return`
        return super().visit(node)

    def looping(self) -> bool:
        return self.region in ("hot", "cold")

    def visit_off(self, *nodes: ast.AST) -> None:
        saved, self.region = self.region, "off"
        for n in nodes:
            if n is not None:
                self.visit(n)
        self.region = saved

    def check(self, tree: ast.Module, called_from: dict[str, str] | None = None) -> None:
        """Both passes: the module as written, then each function called from hot code, as hot
        (`called_from`: module-level functions of this file called from another file's step loop,
        name -> 'other.py:LINE')."""
        self.scope_node = tree
        self.visit(tree)
        self.check_loaders()
        module_scope = self.scopes[0]
        for stmt in tree.body:
            where = (called_from or {}).get(getattr(stmt, "name", None))
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and where \
                    and id(stmt) not in self.hotmap.hot_calls and id(stmt) not in self.hotmap.step_fns:
                self.scopes = [module_scope]
                self.functions = []
                self._function(stmt, region="hot", via=where)
        for key, (fn, line) in list(self.hotmap.hot_calls.items()):
            if key in self.hotmap.hooks:
                continue
            self.scopes = [module_scope]
            self.functions = [self.callers.get(key, "")]   # a helper of `def benchmark()` is benchmark code
            self._function(fn, region="hot", via=line, seed=self.call_args.get(key, {}))

    # -- scopes and bindings
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            self.scopes[-1][(a.asname or a.name).split(".")[0]] = None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{node.module}.{a.name}" if node.module else a.name

    def _function(self, node, region: str | None = None, via: int | str | None = None,
                  seed: dict | None = None) -> None:
        if via is None:
            for d in node.decorator_list:
                self.visit(d)
        saved = (self.region, self.loaders, self.scope_node, self.via)
        hook = id(node) in self.hotmap.hooks
        per_step = hook or id(node) in self.hotmap.step_fns
        self.region, self.loaders, self.scope_node, self.via = region or ("hot" if per_step else None), [], node, via
        self.functions.append(node.name)
        scope: dict[str, str | None] = {}
        args = node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        for a in params:
            scope[a.arg] = self.annotation_kind(a.annotation)
        for a, d in zip(reversed([*args.posonlyargs, *args.args]), reversed(args.defaults)):
            if scope.get(a.arg) is None and self.kind(d) == "num":
                scope[a.arg] = "num"
        if hook:  # a framework hands the hook device batches, outputs and a model (and a trainer)
            for a in params[1:]:
                if scope.get(a.arg) is None:
                    scope[a.arg] = "num" if "idx" in a.arg else "tensor" if a.arg in _HOOK_TENSORS \
                        or "batch" in a.arg else "obj" if is_model_name(a.arg) or "module" in a.arg \
                        or a.arg == "trainer" else None
        for name, k in (seed or {}).items():
            if scope.get(name) is None:
                scope[name] = k
        self.scopes.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self.check_loaders()
        self.scopes.pop()
        self.functions.pop()
        self.region, self.loaders, self.scope_node, self.via = saved

    def visit_FunctionDef(self, node) -> None:
        self._function(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        saved, self.region = self.region, None
        self.visit(node.body)
        self.region = saved

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scopes.append({})
        self.generic_visit(node)
        self.scopes.pop()

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for t in node.targets:
            self.visit_target(t)
        value = node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                and value.func.attr in DEVICE_WRAPPERS and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Tuple) and len(node.targets[0].elts) == len(value.args):
            # model, opt, loader = accelerator.prepare(model, opt, loader): the loader yields device batches
            for t, a in zip(node.targets[0].elts, value.args):
                k = self.iter_kind(a)
                self.bind(t, "loader_device" if k and k.startswith("loader") else self.kind(a))
            return
        if isinstance(node.value, ast.Tuple) and all(isinstance(t, ast.Tuple) for t in node.targets):
            for t in node.targets:
                for a, v in zip(t.elts, node.value.elts):
                    self.bind(a, self.kind(v))
            return
        k = self.kind(node.value)
        for t in node.targets:
            self.bind(t, k)
            if k == "loader_pageable" and isinstance(t, ast.Name):
                self.loaders.append({"name": t.id, "node": node.value, "scope": self.scope_node})
        aliased = node.value.body if isinstance(node.value, ast.IfExp) else node.value  # `a if cuda else noop`
        dotted = self.dotted(aliased) if isinstance(aliased, ast.Attribute) else None
        if dotted and dotted.endswith(".synchronize") and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            self.aliases[node.targets[0].id] = dotted  # synchronize = torch.cuda.synchronize

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        k = self.annotation_kind(node.annotation) or (self.kind(node.value) if node.value else None)
        self.bind(node.target, k)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self.bind(node.target, self.kind(ast.BinOp(node.target, node.op, node.value)))

    def visit_target(self, t: ast.AST) -> None:
        if isinstance(t, (ast.Subscript, ast.Attribute)):
            self.visit(t.value)
            if isinstance(t, ast.Subscript):
                self.visit(t.slice)

    # -- loops, branches, error paths
    def bind_loop_target(self, target: ast.AST, it: ast.AST) -> None:
        fname = it.func.id if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) else None
        if fname == "range":
            return self.bind(target, "num")
        if fname == "enumerate" and it.args and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            self.bind(target.elts[0], "num")
            return self.bind_loop_target(target.elts[1], it.args[0])
        if fname == "zip" and isinstance(target, ast.Tuple) and len(target.elts) == len(it.args):
            for t, a in zip(target.elts, it.args):
                self.bind_loop_target(t, a)
            return
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute):
            method, recv = it.func.attr, self.kind(it.func.value)
            if method in ("parameters", "buffers"):
                return self.bind(target, "tensor")
            if method in ("named_parameters", "named_buffers", "items") and isinstance(target, ast.Tuple) \
                    and len(target.elts) == 2:
                self.bind(target.elts[0], "str")
                value = recv if recv in BATCHES else "tensor" if method != "items" or recv in TENSORISH else None
                return self.bind(target.elts[1], value)
            if method == "values" and recv in BATCHES | TENSORISH:
                return self.bind(target, recv)
        k = self.iter_kind(it, unpacked=isinstance(target, ast.Tuple))
        if k and k.startswith("enum_") and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            self.bind(target.elts[0], "num")   # for i, batch in pbar (pbar = tqdm(enumerate(loader)))
            return self.bind(target.elts[1], ITEM_KIND.get(k[5:]))
        self.bind(target, {"loader_pageable": "batch_host", "loader_pinned": "batch_pinned", "loader": "batch",
                           "loader_device": "tensor"}.get(k, k if k in ("numpy", "host", "pinned", "tensor", "mask",
                                                                         *BATCHES) else None))

    def visit_For(self, node) -> None:
        self.visit(node.iter)  # evaluated once: set-up code
        if isinstance(node.iter, ast.Call) and self.kind(node.iter) == "loader_pageable":
            self.loaders.append({"name": None, "node": node.iter, "loop": node})
        self.bind_loop_target(node.target, node.iter)
        self.visit_loop_body(node)

    visit_AsyncFor = visit_For

    def visit_loop_body(self, node, *every_iteration: ast.AST) -> None:
        """Visit what runs every iteration (`every_iteration`, then the body) in the loop's region;
        `else:` runs once, after the loop."""
        saved = self.region
        if saved != "hot":
            self.region = "hot" if id(node) in self.hotmap.step_loops else ("off" if saved == "off" else "cold")
        self.loop_stack.append(id(node))
        for part in (*every_iteration, *node.body):
            self.visit(part)
        self.loop_stack.pop()
        self.region = saved
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_While(self, node: ast.While) -> None:
        saved = self.region
        if saved != "hot":
            self.region = "hot" if id(node) in self.hotmap.step_loops else ("off" if saved == "off" else "cold")
        if self.kind(node.test) in TENSORISH:
            self.flag(node.test, "GB007", where=" in a while loop")
        self.region = saved
        self.visit_loop_body(node, node.test)  # the test is evaluated every iteration

    def visit_If(self, node: ast.If) -> None:
        self.check_condition(node.test)
        self.visit(node.test)
        if id(node) in self.hotmap.off_ifs:
            self.visit_off(*node.body)
        else:
            for stmt in node.body:
                self.visit(stmt)
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.check_condition(node.test)
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.check_condition(node.test)
        self.visit(node.test)
        self.visit_off(node.msg)  # the message is built only on failure

    def visit_Raise(self, node: ast.Raise) -> None:
        self.visit_off(node.exc, node.cause)

    def visit_Try(self, node) -> None:
        for stmt in node.body:
            self.visit(stmt)
        self.visit_off(*node.handlers)
        for stmt in [*node.orelse, *node.finalbody]:
            self.visit(stmt)

    visit_TryStar = visit_Try

    def _comprehension(self, node) -> None:
        gens = node.generators
        self.visit(gens[0].iter)  # the first iterable is evaluated once
        saved = self.region
        self.region = saved if saved in ("hot", "off") else "cold"
        self.scopes.append({})
        for i, g in enumerate(gens):
            if i:
                self.visit(g.iter)
            self.bind_loop_target(g.target, g.iter)
            for cond in g.ifs:
                self.visit(cond)
        for part in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]):
            self.visit(part)
        self.scopes.pop()
        self.region = saved

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def check_condition(self, test: ast.AST) -> None:
        if self.looping() and self.kind(test) in TENSORISH:
            self.flag(test, "GB007", where=" inside a loop")

    # -- the rules on expressions
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self.dotted(func) or ""
        method = func.attr if isinstance(func, ast.Attribute) else None
        recv = self.kind(func.value) if method else None
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        nb = kw.get("non_blocking", node.args[1] if method == "cuda" and len(node.args) > 1 else None)
        blocking = nb is None or (isinstance(nb, ast.Constant) and not nb.value)
        nb_true = isinstance(nb, ast.Constant) and nb.value is True

        if method in ("to", "cuda") and self.copy_target(node) == "cuda":
            # GB001: torch.<factory>(...)[.long()...] on the host, then .to(device)/.cuda()
            src = func.value
            while isinstance(src, ast.Call) and isinstance(src.func, ast.Attribute) and (
                    src.func.attr in DTYPE_METHODS | VIEW_METHODS or src.func.attr.endswith("_")
                    or (src.func.attr == "to" and self.copy_target(src) is None)):
                src = src.func.value
            inner = self.dotted(src.func) if isinstance(src, ast.Call) else ""
            gb001 = bool(inner) and inner.startswith("torch.") and inner.count(".") == 1 \
                and inner.split(".")[1] in FACTORIES and self.factory_kind(src) in ("host", "pinned") \
                and not (recv == "pinned" and nb_true)   # pinned + non_blocking is the right pattern
            if gb001:
                self.flag(node, "GB001")
            # GB005: non_blocking=True copy whose host source is known to be pageable
            elif nb_true and recv in ("host", "batch_host"):
                self.flag(node, "GB005")
            # GB009: a loader's batch copied with a blocking copy, every step
            if recv in BATCHES and blocking and self.looping() and (recv != "batch_tok" or self.updating()):
                self.flag(node, "GB009", what=_short(node))
        elif method == "copy_" and nb_true and node.args and self.kind(node.args[0]) in ("host", "batch_host"):
            self.flag(node, "GB005")
        elif method == "copy_" and blocking and node.args and recv in TENSORISH and self.looping() \
                and self.kind(node.args[0]) in BATCHES:
            self.flag(node, "GB009", what=_short(node))   # x_dev.copy_(batch): a blocking copy into a device buffer

        if self.looping():
            self.sync_rules(node, func, name, method, recv, kw)

        hot_target = self.hotmap.call_targets.get(id(node))
        if hot_target is not None and self.region == "hot" and self.via is None:
            self.record_call(node, hot_target)

        # calls that hand a pageable loader to gobrrr (which pins): not a GB006 any more
        if isinstance(func, (ast.Name, ast.Attribute)) and name.rsplit(".", 1)[-1] in LOADERS_PINNED:
            for a in node.args:
                if isinstance(a, ast.Name):
                    self.loaders = [d for d in self.loaders if d["name"] != a.id]
        self.generic_visit(node)

    def record_call(self, node: ast.Call, fn) -> None:
        """The kinds a helper's parameters get from its first hot call site."""
        if id(fn) in self.call_args:
            return
        params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
        if isinstance(node.func, ast.Attribute):  # self.helper(...): skip self
            params = params[1:]
        kinds = {p: self.kind(a) for p, a in zip(params, node.args) if not isinstance(a, ast.Starred)}
        kinds.update({k.arg: self.kind(k.value) for k in node.keywords if k.arg})
        self.call_args[id(fn)] = kinds
        self.callers[id(fn)] = self.functions[-1] if self.functions else ""

    # -- GB006: a pageable DataLoader whose batches go to CUDA
    def check_loaders(self) -> None:
        for cand in self.loaders:
            loops = [cand["loop"]] if "loop" in cand else [
                n for n in own_nodes(cand["scope"])
                if isinstance(n, (ast.For, ast.AsyncFor)) and iterates(n.iter, cand["name"])]
            moving = [loop for loop in loops if _moves_to_cuda(loop, self)]
            if moving:
                saved, self.region = self.region, None
                self.flag(cand["node"], "GB006", hot=any(id(loop) in self.hotmap.step_loops for loop in moving))
                self.region = saved
        self.loaders = []


def _short(node: ast.AST, width: int = 40) -> str:
    text = ast.unparse(node)
    return text if len(text) <= width else text[:width - 3] + "..."


def _moves_to_cuda(loop: ast.AST, checker: Checker) -> bool:
    targets = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    for n in ast.walk(loop):  # names unpacked from the batch (x, y = batch) carry it too
        if isinstance(n, ast.Assign) and root_name(n.value) in targets:
            targets |= {t.id for tgt in n.targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}
    for n in ast.walk(loop):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "copy_" and n.args \
                and root_name(n.args[0]) in targets and checker.kind(n.func.value) in TENSORISH:
            return True   # x_dev.copy_(batch)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("to", "cuda"):
            if root_name(n.func.value) in targets and checker.copy_target(n) == "cuda" \
                    and not checker.is_model(n.func.value):
                return True
    return False


__all__ = ["RULES", "SYNC_RULES", "Finding", "Checker", "HotMap", "name_of"]
