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
    transform  a torchvision transform (`T.Compose([T.ToTensor(), ...])`): calling it makes a host tensor
    loader_pageable / loader_pinned / loader_device / loader    data loaders (the last: pinning unknown)
    batch_host / batch_pinned / batch    a batch from one of them, still on the host

Evidence is positive: a torch factory or op, a model's call, a loss, a loader's batch; a name that
is only "near a .to()" stays unknown, and a sync rule on an unknown fires only where the method
itself is tensor evidence (`.item()`). Modules, strings and Python predicates never count, nor
attributes the project sets to constants (`param.allreduce = False`), guards with hasattr, or reads
with getattr: they are flags on an object, not tensor ops.

This file holds the scopes (bind, lookup, import aliases), the kind of an expression (names, attributes,
subscripts, operators, comparisons, containers), where a value lives or goes (`device_of`, `copy_target`)
and what an annotation says; what a call returns (factories, methods, loaders) is callkinds.py's.
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.callkinds import CallKinds
from gobrrr.lint.loops import CONFIG_NAME, is_model_name, name_of
from gobrrr.lint.names import BATCHES, ITEM_KIND, NUMBER_ATTRS, TENSORISH, self_attr

_TYPED_TENSOR = re.compile(r"\b(torch\.)?(?:Long|Float|Half|BFloat16|Double|Int|Short|Byte|Bool|Char)Tensor\b")
_COUNT_KEY = re.compile(r"^(batch_size|num_\w+|n_\w+|\w+_(size|count|num|len|length))$")   # not `image_shape`: a tensor




class Kinds(CallKinds):
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
            self.scopes[-1].pop(target.id + "#1d", None)
            self.scopes[-1].pop(target.id + "#elem", None)
            self.scopes[-1].pop(target.id + "#delem", None)
            self.scopes[-1].pop(target.id + "#part", None)
            self.scopes[-1].pop(target.id + "#kept", None)
            self.scopes[-1].pop(target.id + "#dflt", None)   # bound here: no longer a guess from the signature
            self.scopes[-1].pop(target.id + "#empty", None)
            self.scopes[-1].pop(target.id + "#nums", None)   # a new dict: its keys hold what it is given
            self.scopes[-1].pop(target.id + "#ints", None)   # no longer the list of positions (pylists.py)
            self.scopes[-1].pop(target.id + "#list", None)
            self.scopes[-1].pop(target.id + "#h1d", None)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            # one kind per attribute name in the file; two different kinds leave it unknown
            old = self.self_attrs.get(target.attr, kind)
            moved = getattr(self, "rebinding", None) is not None and kind == "tensor"
            self.self_attrs[target.attr] = kind if old == kind or moved or (old == "num" and kind in ("obj",)) else None
            # (self.feat_full = self.feat_full.cuda() under `if use_cuda`: on the GPU path the device copy is kept)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.bind(t.value if isinstance(t, ast.Starred) else t, ITEM_KIND.get(kind))
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                and isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str):
            mark, key = target.value.id + "#nums", target.slice.value   # the keys of a dict set to Python numbers
            keys = set(self.lookup(mark) or ())
            if kind == "num" or key in keys:
                keys = keys | {key} if kind == "num" else keys - {key}
                self.scopes[-1][mark] = tuple(sorted(keys))
        elif isinstance(target, ast.Subscript) and kind in TENSORISH and self.kind(target.value) == "hlist" \
                and isinstance(target.value, (ast.Name, ast.Attribute)):
            self.bind(target.value, None)   # self.grid[i] = make_grid().to(dev): items of both places now

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
            if isinstance(node, ast.Name) and is_model_name(n) and self._a_function(n):
                return False   # TCN's `data_generator(args.data)`: a function of the project, not a GAN's generator
            return is_model_name(n) or n in self.models or (isinstance(node, ast.Name) and self.lookup(n) == "obj") \
                or (isinstance(node, ast.Attribute) and self.kind(node) == "obj")
        return False

    def _a_function(self, name: str) -> bool:
        """`name` is a def of the project (this file's, nested here, or imported), not a name bound to a module."""
        project = getattr(self, "project", None)
        if project is None or self.lookup(name) is not None:
            return False
        if name in getattr(self, "local_defs", {}):
            return True
        hit = project.lookup(self.src, name)
        return bool(hit) and hit[0] == "def"

    def named_model(self, node: ast.AST) -> bool:
        """A module by its name or by a module assigned to it (`model`, `self.net`), not any object."""
        return isinstance(node, (ast.Name, ast.Attribute)) and (is_model_name(name_of(node)) or name_of(node) in self.models)

    # -- what an expression holds
    def _in_module(self) -> bool:
        """The method being read belongs to a torch module (or to no class the index knows): `self.quantiles` of a
        pipeline class is its own attribute, not the buffer of that name its model registers (chronos)."""
        project, defs = getattr(self, "project", None), getattr(self, "defs", [])
        cls = project.class_around(self.src, defs[-1]) if project is not None and defs else None
        if cls is None or project.is_module_class(self.src, cls):
            return True
        memo = project.per_file.setdefault(id(self.src), {}).setdefault("registers_buffers", {})   # id(class) ->
        if id(cls) not in memo:   # LDM's DDIMSampler: a plain class whose own register_buffer keeps tables on the GPU
            memo[id(cls)] = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                and n.func.attr == "register_buffer" for n in ast.walk(cls))
        return memo[id(cls)]

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
            if values and all(k in BATCHES for k in values) and all(isinstance(v, ast.Name) for v in node.values):
                return values[0] if len(set(values)) == 1 else "batch"   # {"data": images, "label": labels} of the
                #                                   tensors a loader hands the loop (efficientvit's feed_dict)
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
                if isinstance(node, ast.DictComp) and k in ("numpy", "host"):
                    return "numpy" if k == "numpy" else "hlist"   # {k: torch.cat(v).cpu().numpy() for ...}
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
            seq = [x for x in (node.left, node.right) if isinstance(x, (ast.List, ast.Tuple))]
            if isinstance(node.op, ast.Mult) and len(seq) == 1:
                return self.kind(seq[0])   # [torch.zeros((0, 6), device=d)] * n: n device tensors, a list of them
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
            return "host" if kinds & ({"host", "pinned"} | BATCHES) else None
        if isinstance(node, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops) \
                    or any(isinstance(x, ast.Constant) and x.value is None for x in node.comparators):
                return "num"   # `probs != None` is a Python bool, never an elementwise compare
            kinds = {self.kind(x) for x in [node.left, *node.comparators]}
            if kinds & {"str", "obj"}:
                return "num"
            if kinds & TENSORISH:
                return "mask"
            host = {"host", "pinned"}   # a pinned tensor compared on the host makes a host mask (a batch's may be
            #                             on the device already: a generator that yields device tensors)
            if kinds & (host | {"numpy"}) and kinds <= host | {"numpy", "num", None}:   # counts == self.k: numpy
                return "host" if kinds & host else "numpy"   # layer_idx = from_which_layer == i: a host mask
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
            if node.attr == "device" and self.kind(node.value) in ("host", "pinned", "batch_host"):
                return "cpudev"   # `dtype, device = im.dtype, im.device` of a host image: the CPU
            if node.attr in NUMBER_ATTRS or node.attr in ("size", "dim"):   # x.size, p.dim uncalled: a tuple, an int
                return "num"
            if node.attr == "batch_sizes":
                return "host"   # packed.batch_sizes: a PackedSequence keeps its batch sizes on the CPU
            if node.attr.startswith("__"):
                return "obj"   # module.__class__, x.__dict__: Python's own attributes, never a tensor
            own = isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.self_attrs
            if node.attr.isupper() and len(node.attr) > 1 and not (own and self.self_attrs[node.attr] in ("host", "pinned")):
                return None   # cfg.MODEL.RPN_ONLY: a config node (yacs, ml_collections), never a tensor's field
            if own:   # (self.BBOX_MEANS = torch.FloatTensor(cfg.MEANS): a host table the class keeps)
                return self.self_attrs[node.attr]
            mine = isinstance(node.value, ast.Name) and node.value.id == "self"
            if node.attr in self.buffers and (self._in_module() if mine else self.is_model(node.value)
                                              and not CONFIG_NAME.search(name_of(node.value))):
                return "tensor"   # actor.action_scale: a buffer the project's module registered
            if node.attr == "grad":
                return "tensor"  # a parameter's gradient
            k = self.kind(node.value)
            if k in TENSORISH and node.attr in self.python_attrs:
                return None   # p.sequence_parallel, set as `param.sequence_parallel = True` somewhere: a flag
            if k in TENSORISH and node.attr.startswith(("is_", "has_")):
                return "num"   # param.is_tied, a property of a Parameter subclass: a Python bool, like t.is_cuda
            if k == "mask" and node.attr in ("T", "mT", "data"):
                return "mask"   # j, k = (mask).T: a mask's transpose, and its rows, are masks
            if k in TENSORISH:
                return "generated" if k == "generated" else "tensor"  # .data, .T, a model output's .loss / .logits
            if k in ("host", "pinned", "numpy") or k in BATCHES:
                return k  # a field of a host batch is on the host too
            known = getattr(getattr(self, "project", None), "host_attrs", {}).get(node.attr)
            if k in (None, "obj") and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                # sde.discrete_betas: the project sets that attribute only to host tables (calls.host_attrs); also
                # of an object the project built (omnisafe's self._lagrange.lagrangian_multiplier, a CPU Parameter)
                return known
            return known if known == "loader_device" else None   # a subclass prepared self.eval_dataloader
        if isinstance(node, ast.Subscript):
            if self.dotted(node.value) in ("numpy.r_", "numpy.c_"):
                return "numpy"   # np.r_[:2, 4:n]: an index array built on the host
            k = self.kind(node.value)
            if isinstance(node.value, ast.Call) and isinstance(node.slice, ast.Constant) \
                    and isinstance(node.slice.value, str) and hasattr(self, "returned_key"):
                keyed = self.returned_key(node.value, node.slice.value)   # matcher(out, y)["indices"]
                if keyed is not None:
                    return keyed
            if isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant) \
                    and node.slice.value in (self.lookup(node.value.id + "#nums") or ()):
                return "num"   # targets["num_boxes"] after `targets["num_boxes"] = n.item()`, here or in a caller
            kept = self.lookup(node.value.id + "#kept") if isinstance(node.value, ast.Name) else None
            if kept and isinstance(node.slice, ast.Constant) and node.slice.value in kept[0]:
                return kept[1]   # batch["meta"] of a batch whose other keys a loop moved to the device
            if isinstance(node.slice, (ast.Constant, ast.UnaryOp)) and _one_token_id(node.value):
                return "num"   # tokenizer("<image>", add_special_tokens=False)["input_ids"][-1]: an int
            if k == "mask":   # a row of a mask (`xc[xi]`, `mask[:, 0]`) is a mask; what else indexes it, a tensor
                return "mask" if self._plain_index(node.slice) else "tensor"
            if k == "num" and not isinstance(node.slice, ast.Slice):
                return "num"   # masks.shape[1], size[0]: an int
            if k == "tlist" and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
                    and _COUNT_KEY.search(node.slice.value):
                return "num"   # batch_dict["batch_size"]: a count a dict of device tensors carries beside them
            if k in ("tlist", "tensor", None) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
                    and node.slice.value.endswith("_filter") and isinstance(node.value, ast.Name) and self.defs \
                    and node.value.id in self._reassigned(self.defs[-1]):   # render_pkg = render(...), then
                return "mask"   # render_pkg["visibility_filter"] (3D Gaussian splatting), not a param group's flag
            if k in ("tlist", "hlist"):
                return ("tensor" if k == "tlist" else "hlist") if not isinstance(node.slice, ast.Slice) else k
            if k in (None, "obj") and not isinstance(node.slice, ast.Slice) and self._dataset(node.value):
                return "batch_host"   # image1, image2, flow, valid = val_dataset[val_id]: a sample, on the host
            return k if k in TENSORISH | {"host", "pinned", "numpy"} | BATCHES else None
        if isinstance(node, ast.Call):
            return self.call_kind(node)
        return None

    def _dataset(self, node: ast.AST) -> bool:
        """An instance of a project class that is a torch Dataset (through its project bases: RAFT's `KITTI` of
        `FlowDataset(data.Dataset)`) whose `__getitem__` moves nothing to the device: its items are host samples."""
        project = getattr(self, "project", None)
        if project is None or not isinstance(node, (ast.Name, ast.Attribute)):
            return False
        scope = self.defs[-1] if self.defs else None
        memo = project.per_file.setdefault(id(self.src), {}).setdefault("datasets", {})
        key = (id(scope), ast.dump(node)) if not getattr(self, "types", None) else None   # types: a call's, not kept
        if key is None or key not in memo:
            hits = project.instances_of(self.src, node, scope, getattr(self, "types", None))
            found = bool(hits) and all(_dataset_class(project, src, cls) for src, cls in hits[:4])
            if key is None:
                return found
            memo[key] = found
        return memo[key]

    def _plain_index(self, s: ast.AST) -> bool:
        """An int, a slice or `...` (or a tuple of them): picks rows and columns, keeps the dtype."""
        parts = s.elts if isinstance(s, ast.Tuple) else [s]
        return all(isinstance(p, ast.Slice) or isinstance(p, ast.Constant) and (p.value is Ellipsis or type(p.value) is int)
                   or isinstance(p, ast.Name) and self.lookup(p.id) == "num" for p in parts)

    @staticmethod
    def _list_kind(kinds: list) -> str | None:
        """A list of device tensors is a tlist; one of host tensors or arrays (or of such lists) an hlist; a mix,
        `(x, (Hp, Wp))`, is neither."""
        if kinds and all(k in TENSORISH for k in kinds):
            return "tlist"
        return "hlist" if kinds and all(k in ("host", "pinned", "hlist", "numpy") for k in kinds) else None

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
            words = re.split(r"_|(?<=[a-z])(?=[A-Z])", name_of(node.func))
            if not node.args and any(w.lower() in ("dev", "device", "cuda", "gpu") for w in words) \
                    and not any(w.lower() in ("cpu", "dtype", "count", "name", "type", "capability") for w in words):
                return "cuda"   # .to(dist_util.dev()), .to(get_device()), .to(torch.cuda.current_device())
            return None
        name = self.dotted(node) or ""
        if name.startswith("torch.") and name.count(".") == 1:
            return None  # torch.float16 and friends: a dtype
        if isinstance(node, ast.Attribute) and node.attr == "device":   # .to(t.device): where t is
            return "cpu" if self.kind(node.value) in ({"host", "pinned", "numpy", "hlist"} | BATCHES) else "cuda"
        if isinstance(node, ast.Name) and isinstance(self.lookup(node.id + "#val"), str):
            passed = self.lookup(node.id + "#val")   # device='cpu', a parameter the call leaves at (or sets to)
            if passed[:1] in ("'", '"'):             # a constant: that device
                return self.device_of(ast.Constant(passed[1:-1]))
        if isinstance(node, ast.Name) and self.kind(node) == "str" and (made := _strings_bound(
                self.defs[-1] if getattr(self, "defs", None) else self.src.tree, node.id)):
            return "cpu" if all(self.device_of(ast.Constant(v)) == "cpu" for v in made) else "cuda"   # demucs'
            #   eval_device = 'cpu': the name's own strings, not its words
        if isinstance(node, (ast.Name, ast.Attribute)):
            tail = name.rsplit(".", 1)[-1].lower()
            if "dtype" in tail or "precision" in tail or "type" == tail:
                return None   # .to(precision) with precision=torch.half (gpt-neox's rotary cache): a cast, no copy
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
        if target is None:   # x.to(**self.tpdv) with `self.tpdv = dict(dtype=torch.float32, device=device)`
            target = next((d for k in node.keywords if k.arg is None and (d := self.splatted_device(k.value))), None)
        return self.device_of(target)

    def splatted_device(self, value: ast.AST) -> ast.AST | None:
        """The `device` entry of the dict a `**name` spreads, as this file builds it: `name = dict(device=d, ...)`
        or `{"device": d, ...}` (on-policy's `check(obs).to(**self.tpdv)`), or, for `self.<name>`, as a base class
        builds it in its own file (HARL's actors set `self.tpdv` in OnPolicyBase); None if none builds it."""
        if not isinstance(value, (ast.Name, ast.Attribute)):
            return None
        found = _splat_table(self.project, self.src).get(name_of(value))
        if found is not None or not self_attr(value):
            return found
        cls = self.project.class_around(self.src, self.defs[-1] if self.defs else None)
        todo, seen = [(self.src, cls)] if cls is not None else [], set()
        while todo and len(seen) < 8:
            src, c = todo.pop()
            seen.add(id(c))
            for base in c.bases:
                b = self.project.class_of(src, base)
                if b is None or id(b[1]) in seen:
                    continue
                if (d := _splat_table(self.project, b[0]).get(name_of(value))) is not None:
                    return d
                todo.append(b)
        return None

    def annotation_kind(self, ann: ast.AST | None) -> str | None:
        if ann is None:
            return None
        text = ast.unparse(ann).strip("'\"")
        head, dot, rest = text.partition(".")
        if dot and self.aliases.get(head) == "torch":
            text = "torch." + rest   # `import torch as th`: th.Tensor
        text = _TYPED_TENSOR.sub(r"\1Tensor", text)   # torch.LongTensor, torch.FloatTensor: a tensor, device unsaid
        if re.fullmatch(r"(torch\.)?Tensor", text) or re.fullmatch(
                r"(typing\.)?Optional\[(torch\.)?Tensor\]|(torch\.)?Tensor \| None|None \| (torch\.)?Tensor", text):
            return "tensor"
        if re.fullmatch(r"(typing\.)?(List|Tuple|Sequence|list|tuple)\[(torch\.)?Tensor(, \.\.\.)?\]", text):
            return "tlist"
        if re.fullmatch(r"(int|float|bool|complex)|((typing\.)?Optional\[(int|float|bool)\])|(int|float|bool) \| None", text):
            return "num"   # `batch_size: Optional[int] = None` (GNNAutoScale's __call__)
        if re.fullmatch(r"(np|numpy)\.(ndarray|array)( \| (torch\.)?Tensor)?|(torch\.)?Tensor \| (np|numpy)\.ndarray"
                        r"|(typing\.)?Union\[(np|numpy)\.ndarray, (torch\.)?Tensor\]"
                        r"|(typing\.)?Union\[(torch\.)?Tensor, (np|numpy)\.ndarray\]", text):
            return "numpy"   # `obs: np.ndarray | torch.Tensor` (or `np.array`, as written): host data it must copy
            # (scopes: a device argument wins)
        if re.search(r"Module|Optimizer", text):
            return "obj"
        return "str" if text == "str" else None


def _splat_table(project, src) -> dict[str, ast.AST]:
    """{name: the `device` entry of the dict assigned to it} for one file (`self.tpdv = dict(device=d, ...)`)."""
    table = project.per_file.setdefault(id(src), {})
    if "splat_devices" not in table:
        found: dict[str, ast.AST] = {}
        for n in src.nodes:
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], (ast.Name, ast.Attribute)):
                v = n.value
                if isinstance(v, ast.Call) and name_of(v.func) == "dict":
                    d = next((k.value for k in v.keywords if k.arg == "device"), None)
                elif isinstance(v, ast.Dict):
                    d = next((x for key, x in zip(v.keys, v.values)
                              if isinstance(key, ast.Constant) and key.value == "device"), None)
                else:
                    d = None
                if d is not None:
                    found[name_of(n.targets[0])] = d
        table["splat_devices"] = found
    return table["splat_devices"]


def _one_token_id(ids: ast.AST) -> bool:
    """`tokenizer("<image>")["input_ids"]` / `.input_ids`: the ids of one text, a Python list of ints (no
    `return_tensors`), whose items are ints."""
    call = ids.value if isinstance(ids, ast.Subscript) and isinstance(ids.slice, ast.Constant) \
        and ids.slice.value == "input_ids" or isinstance(ids, ast.Attribute) and ids.attr == "input_ids" else None
    return isinstance(call, ast.Call) and bool(call.args) and isinstance(call.args[0], (ast.Constant, ast.JoinedStr)) \
        and isinstance(getattr(call.args[0], "value", ""), str) and "tokeni" in name_of(call.func).lower() \
        and not any(k.arg == "return_tensors" for k in call.keywords)


def _dataset_class(project, src, cls: ast.ClassDef, depth: int = 0) -> bool:
    """`cls` (or a project base of it) derives from a `...Dataset` of torch's, and no `__getitem__` on the way
    moves its sample to the device (`.cuda()`, `.to(...)`)."""
    if depth > 5 or any(isinstance(f, ast.FunctionDef) and f.name == "__getitem__" and any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("cuda", "to")
            for n in ast.walk(f)) for f in cls.body):
        return False
    for b in cls.bases:
        if name_of(b) in ("Dataset", "TensorDataset"):
            return True
        hit = project.class_of(src, b)
        if hit is not None and _dataset_class(project, hit[0], hit[1], depth + 1):
            return True
    return False


def _strings_bound(scope: ast.AST, name: str) -> list[str]:
    """The string constants `name` is assigned anywhere in `scope`; empty when any
    assignment of it is something else."""
    made = [n.value for n in ast.walk(scope) if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    return [v.value for v in made] if made and all(isinstance(v, ast.Constant) and isinstance(v.value, str)
                                                   for v in made) else []
