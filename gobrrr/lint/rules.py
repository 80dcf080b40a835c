"""What `gobrrr lint` looks for: the rules GB001-GB014 and the AST walk that finds them.

Per file, after hot.HotMap (syntax only: step loops, hooks, rare branches, timed syncs), the
Checker walks the module once with kinds' guess of what each name holds and applies a rule
only with evidence that the value is a tensor. The rules live in mixins by concept: sync
(reading a device value on the host, synchronize, data-dependent shapes), moves (copies and
host indices), inside (barriers, syncs inside torch), env (CPU environments).

Regions: None (straight-line code), 'cold' (a loop that does not step), 'hot' (a step loop, a
per-step hook, a per-element loop that syncs on each element, a function called from hot code),
'off' (rare branches, error paths). Each call made from hot code is resolved through the project
(graph) and queued in `pending`; the driver (lint.check_project) walks the queued function
later as hot, its parameters typed from the call site, with the chain of calls that made it hot.
"""
from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field

from gobrrr.lint.calls import MAX_DEPTH, CallRules
from gobrrr.lint.env import EnvRules, env_makers
from gobrrr.lint.flow import FlowRules
from gobrrr.lint.graph import Project
from gobrrr.lint.hot import HotMap, is_model_name
from gobrrr.lint.inside import InsideRules
from gobrrr.lint.kinds import Kinds
from gobrrr.lint.loops import name_of
from gobrrr.lint.moves import CopyRules
from gobrrr.lint.names import DEVICE_WRAPPERS, LOADERS_PINNED, TENSORISH
from gobrrr.lint.source import Source
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
              "the host waits", "pin the source: .pin_memory(), DataLoader(pin_memory=True) or gobrrr.Prefetcher; "
              "an op on a pinned tensor (.to(dtype), .float()) returns pageable memory: convert on the device"),
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
    "GB010": ("host data copied to the device inside the loop (`{what}`): a blocking copy from pageable "
              "memory that waits for the GPU to drain, every iteration",
              "build it on the device once, before the loop (a lookup table, a constant), or compute it on the "
              "device; for data that must come from the host, pin it and copy with non_blocking=True"),
    "GB011": ("a device tensor indexed by host indices (`{what}`): the index is copied to the device, "
              "blocking, every iteration",
              "make the indices on the device (torch.randperm(n, device=dev), torch.arange(..., device=dev)) "
              "or move them once before the loop"),
    "GB012": ("{what} every step: each rank waits for the slowest and for its GPU to drain",
              "drop it from the step (collectives already order the ranks); keep barriers for set-up, "
              "checkpoints and the end of the run"),
    "GB013": ("{what}: torch syncs inside the call, every iteration", "{fix}"),
    "GB014": ("a CPU environment stepped every iteration (`{what}(...)`): the action is read back to the host "
              "and the observation copied to the device each step{where}",
              "run the environment on the GPU (Isaac Lab, Brax/MJX, ManiSkill, a torch simulator) so actions and "
              "observations stay on the device, or step more environments per call (gym.vector, envpool) so "
              "each round trip carries more work"),
}
SYNC_RULES = {"GB002", "GB003", "GB004", "GB007", "GB008", "GB010", "GB011", "GB012", "GB013", "GB014"}
TITLES = {"GB001": "a tensor built on the host, then moved to the device", "GB002": ".item() / .cpu() / .tolist() / float(t)",
          "GB003": "printing or formatting a tensor", "GB004": "torch.cuda / stream / event synchronize()",
          "GB005": "non_blocking=True from pageable memory", "GB006": "a DataLoader without pin_memory feeding the GPU",
          "GB007": "a tensor as a Python condition (if, while, assert)",
          "GB008": "data-dependent shapes (nonzero, x[mask], unique)",
          "GB009": "a blocking .to(device) / .cuda() of every batch",
          "GB010": "host data copied to the device per step (torch.tensor(x, device=), host.to(dev))",
          "GB011": "a device tensor indexed by host indices (numpy, CPU arange, range, list)",
          "GB012": "a barrier every step (dist.barrier, wait_for_everyone)",
          "GB013": "a sync inside torch (distributions' validation, torch.normal's and Normal.sample's std check)",
          "GB014": "a CPU environment stepped per iteration (one finding per loop)"}
# a module's forward: parameters that hold tensors (or lists and dicts of them) by their usual names
_FORWARD_TENSORS = {"x", "input", "inputs", "outputs", "output", "logits", "targets", "labels", "hidden_states",
                    "y", "src", "tgt", "query", "key", "value", "obs", "observations"}
_HOOK_TENSORS = {"inputs", "outputs", "output", "x", "y", "logits", "loss", "labels", "targets", "images", "data"}
HOOK_NAMES = _FORWARD_TENSORS | _HOOK_TENSORS
_EAGER = {"map", "filter", "sorted", "max", "min", "list", "tuple"}
_IMAGE_SINKS = ("save_image", "imsave", "imwrite", "fromarray", "imshow", "add_image", "add_images", "add_video",
                "write_video", "make_grid", "Image", "savefig", "log_image", "log_images")


@dataclass
class Finding:
    path: str
    line: int
    col: int      # 1-based, like compilers and editors
    rule: str
    message: str
    fix: str
    hot: bool = True   # in a step loop or what it calls (shown by default); else shown with --all
    chain: list[str] = field(default_factory=list)   # the calls that make it hot: ['train.py:120', 'utils.py:44']
    covers: list[int] = field(default_factory=list)  # other lines this one finding stands for (GB014's round trip)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        via = f" ({' -> '.join([*self.chain, 'here'])})" if self.chain else ""
        return f"{self.path}:{self.line}:{self.col}: {self.rule} {self.message}{via}" + \
            ("" if self.hot else " [not per-step]")


class Checker(FlowRules, CallRules, SyncRules, CopyRules, InsideRules, EnvRules, Kinds, ast.NodeVisitor):
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
        self.guesses: set[str] = set()          # names bound to an unknown call's result, guessed a tensor
        self.module_scope: dict = {}
        self.silent = False                     # a first pass over a step loop's body: kinds only (flow)
        self.eager_lambdas: set[int] = set()    # id of lambdas that map()/sorted() call right away
        self.cuda_types: set[str] = set()       # names bound to torch.cuda.FloatTensor and friends
        self.seeding: set[str] = set()          # names this def hands to a def holding a step loop (note_seed)
        self.assigning: set[str] = set()        # the names the assignment being walked binds
        self.seeds: list[tuple] = []            # (Source, def holding a step loop, kinds of its parameters)
        self.left = False                       # this call has returned (flow.static_truth): the rest is dead
        self.mask_lists: set[str] = set()       # lists that masks are appended to (torch.cat of them is a mask)
        self.normal_attrs: set[tuple[str, str]] = set()   # (class, self attribute) bound to a Normal (inside)
        self.dist_attrs: set[tuple[str, str]] = set()     # (class, self attribute) bound to a validated one
        self.summary_depth = 0                  # > 0 in a scratch walk that only learns what a def returns
        self.looping_def = False                # in a def that holds a step loop (its set-up learns what helpers return)
        self.collect: ast.AST | None = None     # that def
        self.returns: list = []                 # the kinds of its return values
        self.return_items: list = []            # per return: the kinds of a returned tuple's items, or None
        self.return_kinds: dict[int, str | None] = {}   # id(Call) -> what the project def it runs returns
        self.read_defs: set[int] = set()   # id(Call) of project defs read whose return is unknown
        self.return_parts: dict[int, tuple | None] = {}   # id(Call) -> the kinds of the tuple it returns

    # -- reporting
    def flag(self, node: ast.AST, rule: str, hot: bool | None = None, fix: str | None = None, **fmt) -> None:
        if self.region == "off" or self.silent:
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

    def updating(self) -> bool:
        """In a loop that trains (backward / optimizer step), or in a helper or hook of one: not a
        generation or inference loop, where a small per-prompt copy is not worth a finding."""
        return bool(self.chain) or not self.loop_stack or self.loop_stack[-1] in self.hotmap.update_loops

    def visit(self, node: ast.AST):
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
        self.seeding = _seed_names([st for st in self.src.tree.body if not isinstance(
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

    def check_seeded(self, fn: ast.AST, kinds: dict) -> None:
        """Walk a def that holds a step loop again, its parameters typed by the project's calls of it
        (calls.note_seed); its regions are its own (a library sampler called from a script)."""
        self.scopes = [self.module_scope]
        self.defs = [d for d in self._enclosing(fn)]
        self.functions = [d.name for d in self.defs if hasattr(d, "name")]
        self._function(fn, seed=kinds)

    def _enclosing(self, fn: ast.AST) -> list[ast.AST]:
        out, s = [], self.src.parent.get(id(fn))
        while s is not None:
            out.insert(0, s)
            s = self.src.parent.get(id(s))
        return out

    # -- scopes and bindings
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
        saved = (self.region, self.loaders, self.scope_node, self.chain, self.types, self.loop_stack, self.left)
        self.left = False
        hook = id(node) in self.hotmap.hooks
        per_step = hook or id(node) in self.hotmap.step_fns
        self.region = region or ("hot" if per_step else None)
        self.loaders, self.scope_node, self.chain, self.types, self.loop_stack = [], node, chain, types or {}, []
        self.functions.append(node.name)
        saved_seeding, saved_looping = self.seeding, self.looping_def   # what helpers return is learnt in a def
        self.looping_def = node.name in self.hotmap.looping   # that holds a step loop or calls one that does
        seeds = self.project.per_file.setdefault(id(self.src), {}).setdefault("seed_names", {})
        if id(node) not in seeds:
            seeds[id(node)] = _seed_names(node.body, self.project.looping) \
                if self.src.calls.get(node.name, set()) & self.project.looping else set()
        self.seeding = seeds[id(node)]
        self.defs.append(node)
        scope: dict[str, str | None] = {}
        args = node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        for a in params:
            scope[a.arg] = self.annotation_kind(a.annotation)
        for a, d in [*zip(reversed([*args.posonlyargs, *args.args]), reversed(args.defaults)),
                     *zip(args.kwonlyargs, args.kw_defaults)]:
            if isinstance(d, ast.Constant) and d.value is None:
                scope[a.arg + "#opt"] = "opt"   # `x: Tensor | None = None`: `if not x:` tests for None
            if d is not None and scope.get(a.arg) is None and self.kind(d) == "num" \
                    and not (isinstance(d, ast.Constant) and d.value is None):   # `labels=None`: a tensor or nothing
                scope[a.arg] = "num"
                scope[a.arg + "#dflt"] = "dflt"   # a guess from the default: what a call passes wins
        if hook:   # a framework (or the step loop) hands the hook device batches, outputs and a model
            for a in params[1:]:
                if scope.get(a.arg) is None:
                    tensors = _FORWARD_TENSORS if node.name == "forward" else _HOOK_TENSORS
                    batch = "batch" in a.arg   # forward(self, batched_inputs): a host batch it copies itself
                    scope[a.arg] = "num" if "idx" in a.arg else "batch" if batch and node.name == "forward" \
                        else "tensor" if a.arg in tensors or batch else "obj" if is_model_name(a.arg) or "module" in a.arg \
                        or a.arg == "trainer" else None
        for name, k in (seed or {}).items():   # `sample(z, temperature, cfg_iter)` with a CUDA cfg_iter passes
            if scope.get(name) is None or (k in TENSORISH and scope.get(name + "#dflt")):   # `cfg=1.0` a tensor
                scope[name] = k
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
        self.functions.pop()
        self.defs.pop()
        self.region, self.loaders, self.scope_node, self.chain, self.types, self.loop_stack, self.left = saved
        self.seeding, self.looping_def = saved_seeding, saved_looping

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
        self.scopes.append({p.arg: None for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]})
        self.visit(node.body)   # deferred (a callback, `default(x, lambda: ...)`) unless map() runs it now
        self.scopes.pop()
        self.region = saved

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scopes.append({})
        self.generic_visit(node)
        self.scopes.pop()

    def visit_Assign(self, node: ast.Assign) -> None:
        self.assigning = {t.id for t in node.targets if isinstance(t, ast.Name)} if self.seeding else set()
        try:
            self._assign(node)
        finally:
            self.assigning = set()
        self.note_elements(node)   # after the binding, which clears a name's marks

    def _assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        zero_d = self.zero_d(node.value)
        self.note_distribution(node)
        for t in node.targets:
            self.visit_target(t)
            self.host_write(t, node.value)
        value = node.value
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
        k = self.kind(value)
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
        for t in node.targets:
            self.bind(t, k)
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
            self.cuda_types.add(node.targets[0].id)   # Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
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
            if k in TENSORISH and old in (None, "tlist"):
                self.bind(v.func.value, "tlist")
                if k == "mask":
                    self.mask_lists.add(v.func.value.id)   # fg_masks.append(fg_mask)
            elif k == "host" and old in (None, "hlist"):
                self.bind(v.func.value, "hlist")
        self.generic_visit(node)

    # -- the rules on expressions
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self.dotted(func) or ""
        method = func.attr if isinstance(func, ast.Attribute) else None
        recv = self.kind(func.value) if method else None
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if name in _EAGER and node.args and isinstance(node.args[0], ast.Lambda):
            self.eager_lambdas.add(id(node.args[0]))   # map(lambda t: t.item(), ts): run here, per item
        self.copy_rules(node, func, name, method, recv, kw)
        if self.looping():
            self.sync_rules(node, func, name, method, recv, kw)
            self.inside_rules(node, func, name, method, kw)
        if self.region == "hot" and not self.silent:
            self.follow(node)
        elif not self.silent and not self.summary_depth and name_of(func) in self.project.looping:
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


def _seed_names(body: list[ast.stmt], looping: set[str]) -> set[str]:
    """The names passed to calls of defs that hold a step loop (`sample_euler(model, x, sigmas)`):
    what a helper returns into them is worth learning (calls.return_kind)."""
    if not looping:
        return set()
    return {a.id for st in body for n in ast.walk(st) if isinstance(n, ast.Call) and name_of(n.func) in looping
            for a in [*n.args, *(k.value for k in n.keywords)] if isinstance(a, ast.Name)}


__all__ = ["RULES", "SYNC_RULES", "TITLES", "HOOK_NAMES", "Finding", "Checker", "MAX_DEPTH"]
