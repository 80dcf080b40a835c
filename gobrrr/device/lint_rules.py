"""What `gobrrr lint` looks for: the rules GB001-GB008 and the AST walk that finds them.

The walk keeps, per scope, a guess of what each name holds:

    num      a Python number (literals, len(), range() targets, .item(), .shape[0], ...)
    host     a tensor in pageable host memory (torch factories without device=, .cpu(), pageable loader batches)
    pinned   a tensor in page-locked memory (.pin_memory(), pin_memory=True, pinned loader batches)
    tensor   a tensor that may live on the GPU (device=..., .to(device), a model's output)
    mask     a boolean device tensor (comparisons and logical ops of tensors)
    numpy    a numpy array;  loader_pageable / loader_pinned / loader_device: data loaders

and flags a sync rule only on something that can be a device tensor (`tensor`, `mask`, or an
unknown that a tensor-only method is called on). A loop body is hot; the iterable of a `for`, its
`else`, and a branch under a periodic guard (`if step % N == 0:`) are not.
"""
from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass

RULES = {
    "GB001": ("tensor built on the host, then copied to the device: an extra host allocation and a "
              "blocking host-to-device copy", "create it on the device: pass device=... to the factory"),
    "GB002": ("{what} inside a loop makes the host wait for the GPU every iteration",
              "keep the value on the device (accumulate into a tensor) and read it once after the loop or every N steps"),
    "GB003": ("{what} a tensor inside a loop copies it to the host and waits for the GPU every iteration",
              "log a detached value every N steps (if step % N == 0) or after the loop"),
    "GB004": ("{what} inside a loop stalls the host until the GPU drains, every iteration",
              "order work with events: event.record() then stream.wait_event(event); poll with event.query()"),
    "GB005": ("non_blocking=True from pageable host memory is not asynchronous: CUDA stages the copy and "
              "the host waits", "pin the source: .pin_memory(), DataLoader(pin_memory=True) or gobrrr.Prefetcher"),
    "GB006": ("DataLoader without pin_memory=True whose batches go to CUDA: every copy is a slow, blocking "
              "copy from pageable memory", "pass pin_memory=True and copy with non_blocking=True, or wrap it in gobrrr.Prefetcher"),
    "GB007": ("a tensor used as a Python condition{where} waits for the GPU to decide the branch",
              "keep the decision on the device: torch.where(cond, a, b) or masking; check on the host every N steps"),
    "GB008": ("{what} inside a loop has a data-dependent output shape: the host waits for the GPU to learn the size",
              "use fixed-shape ops: torch.where(mask, x, 0), masked_fill, or nonzero_static / bincount with a known size"),
}
SYNC_RULES = {"GB002", "GB003", "GB004", "GB007", "GB008"}  # exempt on a line marked `# sync: why`

FACTORIES = {"randn", "rand", "randint", "randperm", "zeros", "ones", "empty", "full", "arange", "linspace",
             "logspace", "eye", "tensor", "as_tensor", "normal", "bernoulli", "tril_indices", "triu_indices"}
NUMBER_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad", "is_leaf", "itemsize", "nbytes"}
NUMBER_METHODS = {"item", "size", "dim", "numel", "nelement", "ndimension", "element_size", "get_device",
                  "data_ptr", "is_pinned", "is_contiguous", "is_floating_point", "stride", "storage_offset"}
MASK_FUNCS = {"isnan", "isinf", "isfinite", "logical_and", "logical_or", "logical_not", "logical_xor",
              "eq", "ne", "gt", "ge", "lt", "le", "isin", "isclose", "signbit"}
DATA_DEPENDENT = {"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"}
READS = {"item", "cpu", "tolist", "numpy"}
NOT_TENSOR_TORCH = {"is_tensor", "is_floating_point", "numel", "device", "dtype", "no_grad", "inference_mode",
                    "manual_seed", "save", "load", "compile", "set_grad_enabled", "enable_grad", "get_default_dtype",
                    "set_default_dtype", "Generator", "Size", "finfo", "iinfo", "set_float32_matmul_precision",
                    "use_deterministic_algorithms", "equal", "is_grad_enabled", "set_printoptions", "autocast"}
VIEW_METHODS = {"view", "reshape", "narrow", "squeeze", "unsqueeze", "flatten", "permute", "transpose", "t",
                "expand", "select", "split", "chunk", "unbind", "detach", "view_as", "contiguous"}
LOADERS_PINNED = {"Prefetcher", "PinnedWorkerLoader", "from_dataloader"}
TENSORISH = {"tensor", "mask"}
HOSTISH = {"num", "host", "pinned", "numpy", "str", "loader_pinned", "loader_pageable", "loader_device"}


@dataclass
class Finding:
    path: str
    line: int
    col: int      # 1-based, like compilers and editors
    rule: str
    message: str
    fix: str

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.rule} {self.message}\n    fix: {self.fix}"


class Checker(ast.NodeVisitor):
    def __init__(self, path: str):
        self.path = path
        self.findings: dict[tuple[str, int], Finding] = {}
        self.spans: dict[tuple[str, int], range] = {}   # lines a finding's node covers (for suppression)
        self.scopes: list[dict[str, str | None]] = [{}]
        self.aliases: dict[str, str] = {}       # local name -> module or object path ("F" -> torch.nn.functional)
        self.loop = 0                           # enclosing loop bodies in this function
        self.guard = 0                          # enclosing periodic guards (if step % N == 0) in a loop
        self.loaders: list[dict] = []           # pageable DataLoaders in this scope (GB006 candidates)
        self.scope_node: ast.AST | None = None  # the module or function whose loops GB006 searches

    # -- reporting
    def flag(self, node: ast.AST, rule: str, **fmt) -> None:
        message, fix = RULES[rule]
        key = (rule, node.lineno)
        if key not in self.findings:
            self.findings[key] = Finding(self.path, node.lineno, node.col_offset + 1, rule,
                                         message.format(**fmt), fix)
            self.spans[key] = range(node.lineno, (getattr(node, "end_lineno", None) or node.lineno) + 1)

    def hot(self) -> bool:
        return self.loop > 0 and self.guard == 0

    # -- names
    def lookup(self, name: str) -> str | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def bind(self, target: ast.AST, kind: str | None) -> None:
        if isinstance(target, ast.Name):
            self.scopes[-1][target.id] = kind
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.bind(t.value if isinstance(t, ast.Starred) else t, kind if kind in _BATCH_KINDS else None)

    def dotted(self, node: ast.AST) -> str | None:
        """'torch.cuda.synchronize' for torch.cuda.synchronize, with import aliases resolved."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    # -- what an expression holds
    def kind(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (bool, int, float, complex)):
                return "num"
            return "str" if isinstance(node.value, (str, bytes)) else None
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, (ast.JoinedStr, ast.FormattedValue)):
            return "str"
        if isinstance(node, ast.UnaryOp):
            k = self.kind(node.operand)
            return "mask" if isinstance(node.op, (ast.Not, ast.Invert)) and k in TENSORISH else k
        if isinstance(node, ast.BinOp):
            kinds = {self.kind(node.left), self.kind(node.right)}
            if kinds & TENSORISH:
                return "mask" if isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)) else "tensor"
            if kinds <= {"num"}:
                return "num"
            if "str" in kinds and isinstance(node.op, ast.Mod):
                return "str"
            return "host" if "host" in kinds else None
        if isinstance(node, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
                return "num"
            kinds = {self.kind(x) for x in [node.left, *node.comparators]}
            return "mask" if kinds & TENSORISH else ("num" if kinds <= {"num", "str"} else None)
        if isinstance(node, ast.BoolOp):
            kinds = {self.kind(v) for v in node.values}
            return "mask" if kinds & TENSORISH else None
        if isinstance(node, ast.IfExp):
            a, b = self.kind(node.body), self.kind(node.orelse)
            return a if a == b else None
        if isinstance(node, ast.Attribute):
            if node.attr in NUMBER_ATTRS:
                return "num"
            k = self.kind(node.value)
            if node.attr in ("grad", "data", "T", "mT", "H", "real", "imag") or k in ("host", "pinned", "numpy"):
                return k  # a field of a host batch is on the host too
            return None
        if isinstance(node, ast.Subscript):
            k = self.kind(node.value)
            return k if k in TENSORISH | {"host", "pinned", "numpy"} else None
        if isinstance(node, ast.Call):
            return self.call_kind(node)
        return None

    def call_kind(self, node: ast.Call) -> str | None:
        func = node.func
        name = self.dotted(func)
        if isinstance(func, ast.Name):
            if func.id in ("len", "int", "float", "bool", "round", "sum", "min", "max", "abs", "ord", "hash"):
                args = {self.kind(a) for a in node.args}
                return "tensor" if func.id in ("abs", "sum", "min", "max") and args & TENSORISH else "num"
            if func.id in ("str", "repr", "format"):
                return "str"
            if func.id in ("DataLoader",) or name == "torch.utils.data.DataLoader":
                return self.loader_kind(node)
        if name:
            root, _, last = name.rpartition(".")
            if name.endswith(".DataLoader"):
                return self.loader_kind(node)
            if last in LOADERS_PINNED:
                if last == "Prefetcher" and self.device_of(_arg(node, 1, "device")) != "cpu":
                    return "loader_device"
                return "loader_pinned"
            if root in ("time", "math", "random", "os", "sys", "statistics"):
                return "num" if root != "os" else None
            if root in ("numpy", "np"):
                return "numpy"
            if root == "torch" and last in FACTORIES:
                return self.factory_kind(node)
            if root == "torch" and last in MASK_FUNCS:
                return "mask"
            if root == "torch" and last not in NOT_TENSOR_TORCH and not last[:1].isupper():
                return "tensor"
            if root.startswith("torch.") and root.split(".")[1] in ("nn", "linalg", "fft", "special") \
                    and not last[:1].isupper() and root != "torch.nn" and "init" not in root:
                return "tensor"
            if root.startswith("torch."):
                return None
        if isinstance(func, ast.Attribute):
            recv = self.kind(func.value)
            method = func.attr
            if method in NUMBER_METHODS:
                return "num"
            if method == "tolist":
                return None
            if recv == "numpy" or recv == "num":
                return recv
            if method == "numpy":
                return "numpy"
            if method == "pin_memory":
                return "pinned"
            if method == "cpu":
                return "host"
            if method in ("cuda", "to"):
                target = self.copy_target(node)
                if target == "cuda":
                    return "tensor"
                if target == "cpu":
                    return "host"
                return recv
            if method == "bool" or method in MASK_FUNCS:
                return "mask" if recv in TENSORISH else recv
            if recv == "pinned":
                return "pinned" if method in VIEW_METHODS else "host"  # a view keeps the pinned storage
            if recv in TENSORISH | {"host"}:
                return "mask" if recv == "mask" and method in ("any", "all") else recv
            if method in ("any", "all", "sum", "mean", "max", "min", "norm", "argmax", "argmin", "std", "var",
                          "detach", "float", "half", "bfloat16", "abs", "sqrt", "exp", "log", "softmax"):
                return "tensor" if recv is None and not isinstance(func.value, ast.Constant) else None
            if recv is not None:
                return None
        # an unknown callable fed a device tensor (a model, a loss) gives a device tensor
        kinds = {self.kind(a) for a in node.args}
        if kinds & TENSORISH:
            return "tensor"
        return None

    def factory_kind(self, node: ast.Call) -> str:
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if "device" in kw and self.device_of(kw["device"]) != "cpu":
            return "tensor"
        pin = kw.get("pin_memory")
        if pin is not None and not (isinstance(pin, ast.Constant) and not pin.value):
            return "pinned"
        return "host"

    def loader_kind(self, node: ast.Call) -> str:
        pin = next((k.value for k in node.keywords if k.arg == "pin_memory"), None)
        if pin is None or (isinstance(pin, ast.Constant) and not pin.value):
            return "loader_pageable"
        return "loader_pinned"

    def device_of(self, node: ast.AST | None) -> str | None:
        """'cuda', 'cpu' or None (not a device, e.g. a dtype) for the target of .to()/device=."""
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                return "cpu" if node.value.split(":")[0] in ("cpu", "meta", "mps") else "cuda"
            if isinstance(node.value, int) and not isinstance(node.value, bool):
                return "cuda"  # .to(0)
            return None
        if isinstance(node, ast.Call):
            if self.dotted(node.func) == "torch.device":
                return self.device_of(node.args[0]) if node.args else None
            return None
        name = self.dotted(node) or ""
        if name.startswith("torch.") and name.count(".") == 1:
            return None  # torch.float16 and friends: a dtype
        if isinstance(node, (ast.Name, ast.Attribute)):
            tail = name.rsplit(".", 1)[-1].lower()
            if "dtype" in tail or "type" == tail:
                return None
            if tail == "cpu":
                return "cpu"
            if any(w in tail for w in ("device", "dev", "cuda", "gpu", "rank")) or self.kind(node) in TENSORISH:
                return "cuda"  # .to(device), .to(x.device), .to(other_tensor)
            return "cuda" if self.kind(node) not in ("num", "str") else None
        return None

    def copy_target(self, node: ast.Call) -> str | None:
        method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if method == "cuda":
            return "cuda"
        target = kw.get("device", node.args[0] if node.args else None)
        return self.device_of(target)

    # -- scopes and bindings
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            self.scopes[-1][(a.asname or a.name).split(".")[0]] = None

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{node.module}.{a.name}" if node.module else a.name

    def _function(self, node) -> None:
        for d in node.decorator_list:
            self.visit(d)
        saved = (self.loop, self.guard, self.loaders, self.scope_node)
        self.loop, self.guard, self.loaders, self.scope_node = 0, 0, [], node
        scope: dict[str, str | None] = {}
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            scope[a.arg] = self.annotation_kind(a.annotation)
        defaults = [*args.defaults]
        for a, d in zip(reversed([*args.posonlyargs, *args.args]), reversed(defaults)):
            if scope.get(a.arg) is None and self.kind(d) == "num":
                scope[a.arg] = "num"
        self.scopes.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self.check_loaders()
        self.scopes.pop()
        self.loop, self.guard, self.loaders, self.scope_node = saved

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Lambda(self, node: ast.Lambda) -> None:
        saved = (self.loop, self.guard)
        self.loop = self.guard = 0
        self.visit(node.body)
        self.loop, self.guard = saved

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scopes.append({})
        self.generic_visit(node)
        self.scopes.pop()

    def annotation_kind(self, ann: ast.AST | None) -> str | None:
        if ann is None:
            return None
        text = ast.unparse(ann)
        if re.fullmatch(r"(torch\.)?Tensor", text):
            return "tensor"
        if text in ("int", "float", "bool", "complex"):
            return "num"
        return "str" if text == "str" else None

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for t in node.targets:
            self.visit_target(t)
        if isinstance(node.value, ast.Tuple) and all(isinstance(t, ast.Tuple) for t in node.targets):
            for t in node.targets:
                for a, v in zip(t.elts, node.value.elts):
                    self.bind(a, self.kind(v))
        else:
            k = self.kind(node.value)
            for t in node.targets:
                self.bind(t, k)
                if k == "loader_pageable" and isinstance(t, ast.Name):
                    self.loaders.append({"name": t.id, "node": node.value, "scope": self.scope_node})

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

    # -- loops and guards
    def bind_loop_target(self, target: ast.AST, it: ast.AST) -> None:
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            return self.bind(target, "num")
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate" and it.args \
                and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            self.bind(target.elts[0], "num")
            return self.bind_loop_target(target.elts[1], it.args[0])
        k = self.kind(it)
        self.bind(target, _BATCH_KINDS.get(k) if k in _BATCH_KINDS else (k if k in ("numpy",) else None))

    def visit_For(self, node) -> None:
        self.visit(node.iter)  # evaluated once: set-up code
        if isinstance(node.iter, ast.Call) and self.kind(node.iter) == "loader_pageable":
            self.loaders.append({"name": None, "node": node.iter, "loop": node})
        self.bind_loop_target(node.target, node.iter)
        self.visit_loop_body(node)

    visit_AsyncFor = visit_For

    def visit_loop_body(self, node, *every_iteration: ast.AST) -> None:
        """Visit what runs every iteration (`every_iteration`, then the body) as loop code, with no
        guard carried in from outside; `else:` runs once, after the loop."""
        self.loop += 1
        saved_guard, self.guard = self.guard, 0
        for part in (*every_iteration, *node.body):
            self.visit(part)
        self.loop -= 1
        self.guard = saved_guard
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_While(self, node: ast.While) -> None:
        if self.kind(node.test) in TENSORISH:
            self.flag(node.test, "GB007", where=" in a while loop")
        self.visit_loop_body(node, node.test)  # the test is evaluated every iteration

    def visit_If(self, node: ast.If) -> None:
        self.check_condition(node.test)
        self.visit(node.test)
        periodic = self.loop > 0 and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
                                         for n in ast.walk(node.test))
        self.guard += periodic
        for stmt in [*node.body, *node.orelse]:
            self.visit(stmt)
        self.guard -= periodic

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.check_condition(node.test)
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.check_condition(node.test)
        self.generic_visit(node)

    def _comprehension(self, node) -> None:
        gens = node.generators
        self.visit(gens[0].iter)  # the first iterable is evaluated once
        self.scopes.append({})
        self.loop += 1
        for i, g in enumerate(gens):
            if i:
                self.visit(g.iter)
            self.bind_loop_target(g.target, g.iter)
            for cond in g.ifs:
                self.visit(cond)
        for part in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]):
            self.visit(part)
        self.loop -= 1
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def check_condition(self, test: ast.AST) -> None:
        if self.hot() and self.kind(test) in TENSORISH:
            self.flag(test, "GB007", where=" inside a loop")

    # -- the rules on expressions
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self.dotted(func) or ""
        method = func.attr if isinstance(func, ast.Attribute) else None
        recv = self.kind(func.value) if method else None
        kw = {k.arg: k.value for k in node.keywords if k.arg}

        # GB001: torch.<factory>(...) on the host, then .to(device)/.cuda()
        if method in ("to", "cuda") and isinstance(func.value, ast.Call):
            inner = self.dotted(func.value.func) or ""
            if inner.startswith("torch.") and inner.count(".") == 1 and inner.split(".")[1] in FACTORIES \
                    and self.factory_kind(func.value) in ("host", "pinned") and self.copy_target(node) == "cuda":
                self.flag(node, "GB001")

        # GB005: non_blocking=True copy whose host source is known to be pageable
        nb = kw.get("non_blocking")
        if isinstance(nb, ast.Constant) and nb.value is True:
            src = func.value if method in ("to", "cuda") else (node.args[0] if method == "copy_" and node.args else None)
            if src is not None and self.kind(src) == "host" and (method != "to" or self.copy_target(node) == "cuda"):
                self.flag(node, "GB005")

        if self.hot():
            # GB002: reading a device value on the host
            forced = isinstance(kw.get("force"), ast.Constant) and kw["force"].value is True
            if method in READS and recv not in HOSTISH and not isinstance(func.value, ast.Constant) \
                    and (method != "numpy" or forced) \
                    and (method != "tolist" or recv in TENSORISH):  # .numpy() of a CUDA tensor raises
                # unless force=True; .tolist() of something unknown is as likely a numpy array
                self.flag(node, "GB002", what=f"`.{method}()`")
            elif isinstance(func, ast.Name) and func.id in ("float", "int", "bool") and len(node.args) == 1 \
                    and self.kind(node.args[0]) in TENSORISH:
                self.flag(node, "GB002", what=f"`{func.id}()` of a tensor")
            # GB003: printing or formatting a tensor
            if isinstance(func, ast.Name) and func.id in ("print", "str", "repr", "format") \
                    and any(self.kind(a) in TENSORISH for a in node.args):
                self.flag(node, "GB003", what="printing" if func.id == "print" else "formatting")
            elif method == "format" and isinstance(func.value, ast.Constant) \
                    and any(self.kind(a) in TENSORISH for a in [*node.args, *kw.values()]):
                self.flag(node, "GB003", what="formatting")
            # GB004: synchronize in a loop
            if name == "torch.cuda.synchronize" or method == "synchronize":
                self.flag(node, "GB004", what=f"`{ast.unparse(func)}()`")
            # GB008: data-dependent output shapes
            last = name.rsplit(".", 1)[-1]
            if (name.startswith("torch.") and name.count(".") == 1 and last in DATA_DEPENDENT) or \
                    (name == "torch.where" and len(node.args) == 1 and not node.keywords):
                self.flag(node, "GB008", what=f"`{name}()`")
            elif method in DATA_DEPENDENT and recv not in HOSTISH and not name.startswith(("torch.", "numpy.", "np.")):
                self.flag(node, "GB008", what=f"`.{method}()`")

        # calls that hand a pageable loader to gobrrr (which pins): not a GB006 any more
        if isinstance(func, (ast.Name, ast.Attribute)) and name.rsplit(".", 1)[-1] in LOADERS_PINNED:
            for a in node.args:
                if isinstance(a, ast.Name):
                    self.loaders = [d for d in self.loaders if d["name"] != a.id]
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if self.hot() and any(isinstance(v, ast.FormattedValue) and self.kind(v.value) in TENSORISH
                              for v in node.values):
            self.flag(node, "GB003", what="formatting")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if self.hot() and isinstance(node.op, ast.Mod) and self.kind(node.left) == "str" \
                and self.kind(node.right) in TENSORISH:
            self.flag(node, "GB003", what="formatting")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.hot() and isinstance(node.ctx, ast.Load) and self.kind(node.value) not in HOSTISH:
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if any(self.kind(p) == "mask" for p in parts):
                self.flag(node, "GB008", what="boolean-mask indexing `x[mask]`")
        self.generic_visit(node)

    # -- GB006: a pageable DataLoader whose batches go to CUDA
    def check_loaders(self) -> None:
        for cand in self.loaders:
            loops = [cand["loop"]] if "loop" in cand else [
                n for n in ast.walk(cand["scope"])
                if isinstance(n, (ast.For, ast.AsyncFor)) and _iterates(n.iter, cand["name"])]
            if any(_moves_to_cuda(loop, self) for loop in loops):
                self.flag(cand["node"], "GB006")
        self.loaders = []


_BATCH_KINDS = {"loader_pageable": "host", "loader_pinned": "pinned", "loader_device": "tensor",
                "host": "host", "pinned": "pinned", "tensor": "tensor", "mask": "tensor"}


def _arg(node: ast.Call, pos: int, name: str) -> ast.AST | None:
    for k in node.keywords:
        if k.arg == name:
            return k.value
    return node.args[pos] if len(node.args) > pos else None


def _iterates(it: ast.AST, name: str | None) -> bool:
    if isinstance(it, ast.Name):
        return it.id == name
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("enumerate", "iter", "zip"):
        return any(_iterates(a, name) for a in it.args)
    return False


def _moves_to_cuda(loop: ast.AST, checker: Checker) -> bool:
    targets = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    for n in ast.walk(loop):  # names unpacked from the batch (x, y = batch) carry it too
        if isinstance(n, ast.Assign) and _root_name(n.value) in targets:
            targets |= {t.id for tgt in n.targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}
    for n in ast.walk(loop):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("to", "cuda"):
            if _root_name(n.func.value) in targets and checker.copy_target(n) == "cuda":
                return True
    return False


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None
