"""What a name holds, as far as `gobrrr lint` can tell: the evidence a rule needs before it fires.

Per scope, each name gets one of:

    num      a Python number or bool (literals, len(), isinstance(), str.endswith(), .item(), .shape[0])
    str      a string
    ttype    a tensor's type name (`x.type()`: 'torch.cuda.FloatTensor'); `.type(it)` copies to x's device
    host     a tensor in pageable host memory (torch factories without device=, .cpu(), .to(dtype) of pinned)
    pinned   a tensor in page-locked memory (.pin_memory(), pin_memory=True)
    tensor   a tensor that may live on the GPU (device=..., .to(device), a model's output, a loss, .grad)
    mask     a boolean device tensor (comparisons and logical ops of tensors)
    tlist    a list or tuple of device tensors (`[loss_a, loss_b]`, `losses.append(loss)`)
    hlist    a list or tuple of host tensors (a CPU matcher's index pairs)
    numpy    a numpy array
    obj      a module or other object: `nn.Linear(...)`, `Net().to(dev)`, `model.cuda()`; never a tensor
    loader_pageable / loader_pinned / loader_device / loader    data loaders (the last: pinning unknown)
    batch_host / batch_pinned / batch    a batch from one of them, still on the host

Evidence is positive: a torch factory or op, a model's call, a loss, a loader's batch; a name that
is only "near a .to()" stays unknown, and a sync rule on an unknown fires only where the method
itself is tensor evidence (`.item()`). Modules, strings and Python predicates never count, nor
attributes the project sets to constants (`param.allreduce = False`), guards with hasattr, or reads
with getattr: they are flags on an object, not tensor ops.
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.loops import LOADER_NAME, is_model_name, name_of
from gobrrr.lint.names import (
    BATCHES,
    DEVICE_WRAPPERS,
    FACTORIES,
    HOSTISH,
    ITEM_KIND,
    LOADERS_PINNED,
    MASK_FUNCS,
    NOT_TENSOR_METHODS,
    NOT_TENSOR_TORCH,
    NUM_BUILTINS,
    NUMBER_ATTRS,
    NUMBER_METHODS,
    STR_METHODS,
    TENSOR_METHODS,
    TENSORISH,
    VIEW_METHODS,
)

_DATA_WORDS = {"data", "dataset", "ds", "batches", "train", "val", "valid", "test", "eval", "dl"}
_PREDICATE = re.compile(r"(^_*|[a-z0-9]_)(is|has|should|can|needs?|uses?|supports?|check_is)_")   # param_is_not_shared
_TOKENIZER = re.compile(r"tokeni[sz]er|processor|feature_extractor|^tok$", re.I)
_LOADER_NAME = LOADER_NAME
_DIST_METHODS = {"sample", "rsample", "log_prob", "entropy", "cdf", "icdf", "sample_n", "mode", "mean", "stddev"}


class Kinds:
    """Scopes of name -> kind, import aliases, and the kind of any expression."""

    def __init__(self):
        self.scopes: list[dict[str, str | None]] = [{}]
        self.aliases: dict[str, str] = {}       # local name -> module or object path ("F" -> torch.nn.functional)
        self.models: set[str] = set()           # names assigned a module in this file (from hot)
        self.self_attrs: dict[str, str | None] = {}   # `self.loss = ...` anywhere in the file: attr -> kind
        self.local_defs: dict[str, ast.AST] = {}      # the file's module-level defs (their return annotations)
        self.python_attrs: set[str] = set()           # attributes the project sets to constants on objects
        self.buffers: set[str] = set()                # names the project's modules register as buffers

    def lookup(self, name: str) -> str | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def bind(self, target: ast.AST, kind: str | None) -> None:
        if isinstance(target, ast.Name):
            self.scopes[-1][target.id] = kind
            self.scopes[-1].pop(target.id + "#val", None)   # no longer the constant the call passed
            self.scopes[-1].pop(target.id + "#0d", None)
            self.scopes[-1].pop(target.id + "#elem", None)
            self.scopes[-1].pop(target.id + "#part", None)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            # one kind per attribute name in the file; two different kinds leave it unknown
            old = self.self_attrs.get(target.attr, kind)
            self.self_attrs[target.attr] = kind if old == kind or (old == "num" and kind in ("obj",)) else None
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.bind(t.value if isinstance(t, ast.Starred) else t, ITEM_KIND.get(kind))

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

    def is_model(self, node: ast.AST) -> bool:
        """A module by its name (`model`, `self.net`) or by what was assigned to it (`m = resnet50()`)."""
        if isinstance(node, (ast.Name, ast.Attribute)):
            n = name_of(node)
            return is_model_name(n) or n in self.models or (isinstance(node, ast.Name) and self.lookup(n) == "obj") \
                or (isinstance(node, ast.Attribute) and self.kind(node) == "obj")
        return False

    # -- what an expression holds
    def kind(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (bool, int, float, complex)) or node.value is None:
                return "num"
            return "str" if isinstance(node.value, (str, bytes)) else None
        if isinstance(node, ast.Name):
            k = self.lookup(node.id)
            return "obj" if k is None and node.id in self.models else k
        if isinstance(node, (ast.JoinedStr, ast.FormattedValue)):
            return "str"
        if isinstance(node, (ast.List, ast.Tuple)):
            return self._list_kind([self.kind(e) for e in node.elts])
        if isinstance(node, ast.Dict):   # {"scores": s, "boxes": b}: a container of device tensors
            values = [self.kind(v) for v in node.values if v is not None]
            return "tlist" if values and all(k in TENSORISH for k in values) else None
        if isinstance(node, (ast.ListComp, ast.DictComp)):
            binder = getattr(self, "bind_loop_target", None)
            self.scopes.append({})
            try:
                for g in node.generators:
                    if binder is not None:
                        binder(g.target, g.iter)
                k = self.kind(node.elt if isinstance(node, ast.ListComp) else node.value)
                # [{"scores": s, "boxes": b} for ...], {img_id: out for ...}: containers of device tensors
                if isinstance(node, ast.DictComp) and k in BATCHES:
                    return k   # data = {key: value for key, value in data.items()}: still the batch
                return "tlist" if k == "tlist" else self._list_kind([k]) if isinstance(node, ast.ListComp) else (
                    "tlist" if k in TENSORISH else None)
            finally:
                self.scopes.pop()
        if isinstance(node, ast.UnaryOp):
            k = self.kind(node.operand)
            if isinstance(node.op, ast.Not):
                return "mask" if k in TENSORISH else "num"
            return "mask" if isinstance(node.op, ast.Invert) and k in TENSORISH else k
        if isinstance(node, ast.BinOp):
            kinds = {self.kind(node.left), self.kind(node.right)}
            if kinds & TENSORISH:   # (u > 0) * (l == u): the product of two masks is a mask too
                return "mask" if isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)) or (
                    kinds == {"mask"} and isinstance(node.op, ast.Mult)) else "tensor"
            if kinds <= {"num"}:
                return "num"
            if "str" in kinds and isinstance(node.op, (ast.Mod, ast.Add, ast.Mult)):
                return "str"
            if "numpy" in kinds and not kinds & ({"host"} | BATCHES):
                return "numpy"   # np.abs(p) + self.eps: still a numpy array
            return "host" if kinds & ({"host"} | BATCHES) else None
        if isinstance(node, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops) \
                    or any(isinstance(x, ast.Constant) and x.value is None for x in node.comparators):
                return "num"   # `probs != None` is a Python bool, never an elementwise compare
            kinds = {self.kind(x) for x in [node.left, *node.comparators]}
            if kinds & {"str", "obj"}:
                return "num"
            if kinds & TENSORISH:
                return "mask"
            if kinds & {"host", "numpy"} and kinds <= {"host", "numpy", "num", None}:   # counts == self.k: numpy
                return "host" if "host" in kinds else "numpy"   # layer_idx = from_which_layer == i: a host mask
            return "num" if kinds <= {"num", "str"} else None
        if isinstance(node, ast.BoolOp):
            guarded = {(ast.unparse(v.args[0]), v.args[1].value) for v in node.values if isinstance(v, ast.Call)
                       and isinstance(v.func, ast.Name) and v.func.id == "hasattr" and len(v.args) == 2
                       and isinstance(v.args[1], ast.Constant)}   # hasattr(p, "tp") and p.tp: a Python attribute
            kinds = {self.kind(v) for v in node.values
                     if not (isinstance(v, ast.Attribute) and (ast.unparse(v.value), v.attr) in guarded)}
            return "mask" if kinds & TENSORISH else ("num" if kinds <= {"num", "str"} else None)
        if isinstance(node, ast.IfExp):
            a, b = self.kind(node.body), self.kind(node.orelse)
            return a if a == b else None
        if isinstance(node, ast.Attribute):
            if node.attr in NUMBER_ATTRS or node.attr in ("size", "dim"):   # x.size, p.dim uncalled: a tuple, an int
                return "num"
            if node.attr.isupper() and len(node.attr) > 1:
                return None   # cfg.MODEL.RPN_ONLY: a config node (yacs, ml_collections), never a tensor's field
            if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.self_attrs:
                return self.self_attrs[node.attr]
            if node.attr in self.buffers and (isinstance(node.value, ast.Name) and node.value.id == "self"
                                              or self.is_model(node.value)):
                return "tensor"   # actor.action_scale: a buffer the project's module registered
            if node.attr == "grad":
                return "tensor"  # a parameter's gradient
            k = self.kind(node.value)
            if k in TENSORISH and node.attr in self.python_attrs:
                return None   # p.sequence_parallel, set as `param.sequence_parallel = True` somewhere: a flag
            if k in TENSORISH:
                return "generated" if k == "generated" else "tensor"  # .data, .T, a model output's .loss / .logits
            if k in ("host", "pinned", "numpy") or k in BATCHES:
                return k  # a field of a host batch is on the host too
            if k is None and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                # sde.discrete_betas: the project sets that attribute only to host tables (calls.host_attrs)
                return getattr(getattr(self, "project", None), "host_attrs", {}).get(node.attr)
            return None
        if isinstance(node, ast.Subscript):
            if self.dotted(node.value) in ("numpy.r_", "numpy.c_"):
                return "numpy"   # np.r_[:2, 4:n]: an index array built on the host
            k = self.kind(node.value)
            if k == "mask":
                return "tensor"
            if k == "num" and not isinstance(node.slice, ast.Slice):
                return "num"   # masks.shape[1], size[0]: an int
            if k in ("tlist", "hlist"):
                return ("tensor" if k == "tlist" else "hlist") if not isinstance(node.slice, ast.Slice) else k
            return k if k in TENSORISH | {"host", "pinned", "numpy"} | BATCHES else None
        if isinstance(node, ast.Call):
            return self.call_kind(node)
        return None

    @staticmethod
    def _list_kind(kinds: list) -> str | None:
        """A list of device tensors is a tlist; one of host tensors (or of such lists) an hlist; a mix,
        `(x, (Hp, Wp))`, is neither."""
        if kinds and all(k in TENSORISH for k in kinds):
            return "tlist"
        return "hlist" if kinds and all(k in ("host", "pinned", "hlist") for k in kinds) else None

    def return_kind(self, node: ast.Call) -> str | None:
        """What a project function returns (rules.Checker reads its body): None if unknown, "" if
        known to be neither a tensor nor a list of them."""
        return None

    def call_kind(self, node: ast.Call) -> str | None:
        func = node.func
        name = self.dotted(func)
        if any(k.arg == "return_tensors" for k in node.keywords) and (
                _TOKENIZER.search(name_of(func)) or (isinstance(func, ast.Attribute) and _TOKENIZER.search(
                    name_of(func.value)))):
            return "batch_tok"   # tokenizer(texts, return_tensors="pt"): a fresh host batch, pageable
        if isinstance(func, (ast.Name, ast.Attribute)) and _PREDICATE.search(name_of(func)) \
                and not (isinstance(func, ast.Attribute) and self.kind(func.value) in TENSORISH):
            return "num"   # self._is_fp8_param(p), has_nan(x): a predicate answers with a Python bool
        if isinstance(func, ast.Name):
            if func.id in NUM_BUILTINS:
                return "num"
            if func.id == "getattr":   # getattr(param, "is_expert", False): a Python attribute someone set
                return "num" if len(node.args) > 2 and self.kind(node.args[2]) == "num" else None
            own = self.local_defs.get(func.id)
            if own is not None and own.returns is not None:   # def _avg_emulated(...) -> bool
                return self.annotation_kind(own.returns)
            if func.id in ("abs", "sum", "min", "max"):
                kinds = {self.kind(a) for a in node.args}
                if kinds & (TENSORISH | {"tlist"}):
                    return "tensor"   # sum(losses) of device tensors is a device tensor
                return "num" if kinds <= {"num", "numpy", "host"} else None
            if func.id in ("str", "repr", "format"):
                return "str"
            if func.id in ("tqdm", "iter", "progress_bar", "trange", "cycle", "islice") and node.args:
                k = self.iter_kind(node.args[0])
                return k if k and k.startswith(("loader", "enum_")) else None   # a wrapped loader is a loader
            if func.id == "enumerate" and node.args:
                k = self.iter_kind(node.args[0])
                return "enum_" + k if k and k.startswith("loader") else None   # pbar = enumerate(loader)
            if func.id == "next" and node.args:
                k = self.iter_kind(node.args[0])
                return ITEM_KIND.get(k) if k and k.startswith("loader") else None
        if name:
            root, _, last = name.rpartition(".")
            if last == "DataLoader":
                return self.loader_kind(node)
            if last == "BatchSampler":
                return "hlist"   # for indices in BatchSampler(SubsetRandomSampler(range(n)), mb, False): host index lists
            if last == "Variable" and node.args:
                return self.kind(node.args[0])   # torch.autograd.Variable(t) (old PyTorch) is t
            if last in LOADERS_PINNED:
                if last == "Prefetcher" and self.device_of(_arg(node, 1, "device")) != "cpu":
                    return "loader_device"
                return "loader_pinned"
            if root in ("time", "math", "random", "os", "sys", "statistics", "os.path"):
                return "num" if root not in ("os", "os.path") else None
            if root in ("numpy", "np"):
                return "numpy"
            if last in ("clip_grad_norm_", "clip_grad_norm", "get_total_norm"):
                return "tensor"  # the total norm, on the device
            if root == "torch" and last == "from_numpy":
                return "host"
            if root == "torch" and last in FACTORIES:
                return self.factory_kind(node)
            if root == "torch" and last in MASK_FUNCS:
                return "mask"
            if name == "torch.device" and node.args and self.device_of(node.args[0]) == "cpu":
                return "cpudev"
            if root == "torch" and (last.startswith("is_") or last in NOT_TENSOR_TORCH):
                return "num" if last.startswith("is_") or last == "equal" else None
            if name in ("torch.cat", "torch.stack", "torch.concat") and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in getattr(self, "mask_lists", ()):
                return "mask"   # torch.cat(fg_masks) of the masks appended per image
            if root == "torch" and not last[:1].isupper():
                kinds = {self.kind(a.value if isinstance(a, ast.Starred) else a) for a in node.args}
                return "host" if not kinds & TENSORISH and kinds & ({"host", "hlist"} | BATCHES) else "tensor"
            if root.startswith("torch.") and root.split(".")[1] in ("nn", "linalg", "fft", "special") \
                    and not last[:1].isupper() and root != "torch.nn" and "init" not in root and "utils" not in root:
                return "tensor"
            if root.startswith("torch."):
                return None
            if last[:1].isupper():
                return "obj"  # a class: a module, a meter, a config; not a tensor
        summary = self.return_kind(node)
        numpy_in = isinstance(func, ast.Name) and not node.keywords and {self.kind(a) for a in node.args} == {"numpy"}
        if summary is not None:
            return summary or ("host" if numpy_in else None)   # "": a project function returning a mixed tuple
        if id(node) in getattr(self, "read_defs", ()):
            return "host" if numpy_in else None   # a project def read that returns nothing certain: no guess
        if isinstance(func, ast.Attribute) and func.attr in DEVICE_WRAPPERS and len(node.args) == 1:
            k = self.iter_kind(node.args[0])
            if k and k.startswith("loader"):
                return "loader_device"   # accelerator.prepare(loader): its batches arrive on the device
        if isinstance(func, ast.Attribute):
            return self.method_kind(node, func)
        if (self.is_model(func) and (node.args or node.keywords)) or re.search(r"loss|criterion", name_of(func), re.I):
            return "tensor"  # a model's forward or a loss
        kinds = {self.kind(a) for a in node.args}
        if kinds & TENSORISH:
            return "tensor"  # an unknown callable fed a device tensor (a layer, a loss)
        if kinds == {"numpy"} and not node.keywords and isinstance(func, ast.Name):
            return "host"    # transforms(np_image): what it makes of a numpy array is on the host
        return None

    def method_kind(self, node: ast.Call, func: ast.Attribute) -> str | None:
        recv = self.kind(func.value)
        method = func.attr
        if method == "type" and node.args and (self.kind(node.args[0]) == "ttype" or getattr(
                self, "cuda_type", None) and self.cuda_type(node.args[0])):
            return "tensor"   # x.type(torch.cuda.FloatTensor), x.type(dtype) with dtype = xin[0].type()
        if method == "type" and not node.args and not node.keywords and recv not in HOSTISH:
            return "ttype"   # xin[0].type(): 'torch.cuda.FloatTensor', a type name that moves what it is given
        if method == "type_as" and node.args and self.kind(node.args[0]) in TENSORISH:
            return "tensor"
        if method in NUMBER_METHODS:
            return "num"
        if method in STR_METHODS or recv == "str":
            return "str" if method in STR_METHODS else None
        if recv in ("numpy", "num"):
            return recv
        if method in ("cuda", "to"):
            if recv == "obj" or (recv is None and self.is_model(func.value)):
                return "obj"  # model.to(device) is still a module
            if recv is None and _loaded_module(func.value):
                return "obj"  # pickle.load(f)['ema'].to(device), torch.load(...)['model'].cuda(): a module moved
            target = self.copy_target(node)
            if target == "cuda":
                return "tensor"
            if target == "cpu":
                return "host"
            if recv in ("pinned", "batch_pinned"):
                return "host" if recv == "pinned" else "batch_host"  # .to(dtype) makes a pageable copy
            return recv
        if method in _DIST_METHODS and isinstance(func.value, ast.Name) and self.lookup(func.value.id + "#ddist"):
            return "tensor"   # probs.sample(), probs.log_prob(a) of a distribution of device tensors
        if recv == "obj" or method in NOT_TENSOR_METHODS:
            if method in ("forward", "generate") or (recv == "obj" and is_model_name(method)):
                return "generated" if method == "generate" else "tensor"
            return None
        if method == "numpy":
            return "numpy"
        if method == "pin_memory":
            return "batch_pinned" if recv in BATCHES else "pinned"
        if method == "cpu":
            return "host"
        if recv == "pinned":
            return "pinned" if method in VIEW_METHODS else "host"  # a view keeps the pinned storage
        if recv == "batch_pinned":
            return "batch_pinned" if method in VIEW_METHODS else "batch_host"
        if recv in BATCHES or recv == "host":
            return recv
        if method == "bool" or method in MASK_FUNCS:
            return "mask" if recv in TENSORISH else recv
        if recv in TENSORISH:   # a mask's views and copies are masks too
            return "mask" if recv == "mask" and method in {"any", "all", "clone", "repeat", *VIEW_METHODS} else "tensor"
        if is_model_name(method) and isinstance(func.value, ast.Name) and func.value.id == "self":
            return "tensor"  # self.model(x)
        if method in ("forward", "generate") and self.is_model(func.value):
            return "generated" if method == "generate" else "tensor"
        if method in TENSOR_METHODS:
            return "tensor" if recv is None and not isinstance(func.value, ast.Constant) else None
        if recv is None and {self.kind(a) for a in node.args} & TENSORISH:
            return "tensor"  # utils.reduce(loss), self.fc(x): fed a device tensor, gives one
        return None

    def factory_kind(self, node: ast.Call) -> str | None:
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        name = self.dotted(node.func) or ""
        if name.endswith(".as_tensor") and "device" not in kw and node.args \
                and self.kind(node.args[0]) in TENSORISH:
            return "tensor"   # torch.as_tensor(sigma) of a device tensor is that tensor, where it is
        if "device" not in kw and any(k.arg is None for k in node.keywords):
            return None   # torch.randint(*args, **kwargs): the device may be in kwargs
        if "device" in kw and self.device_of(kw["device"]) != "cpu":
            dtype = self.dotted(kw["dtype"]) if "dtype" in kw else ""
            return "mask" if dtype in ("torch.bool", "bool") else "tensor"
        pin = kw.get("pin_memory")
        if pin is not None and not (isinstance(pin, ast.Constant) and not pin.value):
            return "pinned"
        return "host"

    def loader_kind(self, node: ast.Call) -> str:
        pin = next((k.value for k in node.keywords if k.arg == "pin_memory"), None)
        if pin is None and any(k.arg is None for k in node.keywords):
            return "loader"  # DataLoader(ds, **kwargs): pinning decided elsewhere
        if pin is None or (isinstance(pin, ast.Constant) and not pin.value):
            return "loader_pageable"
        return "loader_pinned"

    def iter_kind(self, it: ast.AST, unpacked: bool = False) -> str | None:
        """The kind of the iterable of a `for`: a known loader, or one by its name (`train_loader`)."""
        k = self.kind(it)
        if k in (None, "obj") and isinstance(it, (ast.Name, ast.Attribute)) and _LOADER_NAME.search(name_of(it)):
            return "loader"
        if k in (None, "obj") and unpacked and isinstance(it, (ast.Name, ast.Attribute)) \
                and set(re.split(r"_", name_of(it).lower())) & _DATA_WORDS:
            return "loader"   # for source, targets in self.train_data: a dataset's (x, y) pairs
        if k in (None, "obj") and isinstance(it, ast.Call) and it.args and not isinstance(it.args[0], ast.Starred):
            inner = self.iter_kind(it.args[0])   # tqdm(loader), logger.log_every(loader, 10), islice(loader, n)
            return inner if inner and inner.startswith("loader") else k
        return k

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
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)   # f"cuda:{rank}", f"xpu:{local_rank}"
            return "cpu" if head.startswith(("cpu", "meta", "mps")) else "cuda" if ":" in head else None
        if isinstance(node, ast.Call):
            if self.dotted(node.func) == "torch.device":
                return self.device_of(node.args[0]) if node.args else None
            return None
        name = self.dotted(node) or ""
        if name.startswith("torch.") and name.count(".") == 1:
            return None  # torch.float16 and friends: a dtype
        if isinstance(node, ast.Attribute) and node.attr == "device":   # .to(t.device): where t is
            return "cpu" if self.kind(node.value) in ({"host", "pinned", "numpy"} | BATCHES) else "cuda"
        if isinstance(node, (ast.Name, ast.Attribute)):
            tail = name.rsplit(".", 1)[-1].lower()
            if "dtype" in tail or "type" == tail:
                return None
            if "cpu" in tail.split("_") or self.kind(node) == "cpudev":
                return "cpu"   # cpu_device = torch.device("cpu")
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

    def annotation_kind(self, ann: ast.AST | None) -> str | None:
        if ann is None:
            return None
        text = ast.unparse(ann).strip("'\"")
        head, dot, rest = text.partition(".")
        if dot and self.aliases.get(head) == "torch":
            text = "torch." + rest   # `import torch as th`: th.Tensor
        if re.fullmatch(r"(torch\.)?Tensor", text) or re.fullmatch(
                r"(typing\.)?Optional\[(torch\.)?Tensor\]|(torch\.)?Tensor \| None|None \| (torch\.)?Tensor", text):
            return "tensor"
        if re.fullmatch(r"(typing\.)?(List|Tuple|Sequence|list|tuple)\[(torch\.)?Tensor(, \.\.\.)?\]", text):
            return "tlist"
        if text in ("int", "float", "bool", "complex"):
            return "num"
        if re.search(r"Module|Optimizer", text):
            return "obj"
        return "str" if text == "str" else None


def _loaded_module(node: ast.AST) -> bool:
    """`pickle.load(f)['ema']`, `torch.load(path)['model']`: a module taken from what was loaded."""
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) \
        and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) and is_model_name(node.slice.value)


def _arg(node: ast.Call, pos: int, name: str) -> ast.AST | None:
    for k in node.keywords:
        if k.arg == name:
            return k.value
    return node.args[pos] if len(node.args) > pos else None
