"""The copy rules of `gobrrr lint`: data crossing between host and device where it should not.

    GB001  a tensor built on the host, then copied (`torch.randn(..).to(dev)`, `torch.from_numpy(x).cuda()`)
    GB005  non_blocking=True from pageable memory (also a pinned tensor that `.to(dtype)` made pageable)
    GB006  a DataLoader without pin_memory=True whose batches go to CUDA
    GB009  a loader's batch copied with a blocking `.to(device)` (or `.type(torch.cuda.FloatTensor)`), every step
    GB002  a device tensor's `.to('cpu')` / `.to(cpu_device)` in a loop: a read back like `.cpu()` (with
           non_blocking=True it lands in pinned memory, queued: quiet)
    GB010  host data copied by a factory (or a device tensor's `.new_tensor(data)`) or a host tensor's
           `.to(device)` inside the loop:
           `torch.tensor(data, device=dev)`, `torch.as_tensor(x, device=dev)`, `lr_t.to(dev)`, a host
           tensor written into a device one (`gain[2:6] = torch.tensor(shape)`), a Python number written
           into one element (`rewards[i] = 0.5`): each a blocking copy that waits for the GPU to drain
           (torch copies from pageable memory and syncs)
    GB011  a device tensor indexed by host indices (`b_obs[mb_inds]` with a numpy array, a CPU
           `torch.arange`, a `range` or a list): the index is copied to the device, blocking, each time

A mixin of rules.Checker: it relies on `kind()`, `copy_target()`, `looping()`, `flag()`.
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.bindings import assigned_calls
from gobrrr.lint.hot import iterates, own_nodes, root_name
from gobrrr.lint.loops import name_of, one_block
from gobrrr.lint.names import (
    BATCHES,
    COMPILED,
    DATA_FACTORIES,
    DTYPE_METHODS,
    FACTORIES,
    HOSTISH,
    TENSORISH,
    VIEW_METHODS,
    index_parts,
    splatted,
)

_SIZED = {"zeros", "ones", "empty", "rand", "randn"}   # factories whose int arguments are all sizes
_HOST_INDEX = {"numpy", "host", "pinned", "hlist"}
# pinned host data copied without non_blocking=True: the copy is done on the stream, and the host waits for it
_PINNED_FIX = "it is pinned already: copy it with .to(device, non_blocking=True), so the host does not wait"


def _host_data(arg: ast.AST, kind: str | None) -> bool:
    """The one argument of the legacy `t.new(x)` is data (not sizes): a list or tuple literal, a numpy array, or
    a configuration constant named in capitals (`cfg.TRAIN.BBOX_INSIDE_WEIGHTS`, a tuple of floats); `t.new(n)`
    with an int makes an empty tensor of n elements and copies nothing."""
    if isinstance(arg, (ast.List, ast.Tuple)) or kind in ("numpy", "hlist"):
        return True
    return isinstance(arg, ast.Attribute) and arg.attr.isupper() and len(arg.attr) > 1


_SIZE_NAME = re.compile(r"^(n|k|num|size|shape|count|length|dim)$|^(n|num|max)_|_(size|len|count|dim|num|length|shape)$",
                        re.I)   # torch.cuda.FloatTensor(shape): shape a torch.Size, the tensor allocated, nothing copied


def _legacy_data(arg: ast.AST, kind: str | None) -> bool:
    """The one argument of a typed CUDA constructor (`torch.cuda.LongTensor(x)`) is data to copy up, not a
    size: a list, a numpy array, or a name of unknown kind not named like a count (`torch.cuda.FloatTensor(n)`
    allocates n elements and copies nothing)."""
    if isinstance(arg, (ast.ListComp, ast.GeneratorExp)) or _host_data(arg, kind) or kind == "host" \
            or isinstance(arg, ast.Call) and name_of(arg.func) in ("list", "tuple"):
        return True   # (ByteTensor(tuple(map(f, batch))): a sequence built on the host, never a size)
    return kind is None and isinstance(arg, (ast.Name, ast.Attribute, ast.Subscript)) \
        and not _SIZE_NAME.search(name_of(arg) if not isinstance(arg, ast.Subscript) else name_of(arg.value))


class CopyRules:
    """GB001/GB005/GB009/GB010 on calls, GB011 on subscripts, GB002 on writes into host tensors."""

    def copy_rules(self, node: ast.Call, func, name: str, method, recv, kw) -> None:
        if id(node) == self.rebinding and recv not in BATCHES:
            return   # self.freqs_cis = self.freqs_cis.to(h.device): copied on the first call, a no-op after (a
            # batch stored back, `self.data.points = self.data.points.to(dev)`, is a new one each step)
        nb = kw.get("non_blocking", node.args[1] if method == "cuda" and len(node.args) > 1 else None)
        if isinstance(nb, ast.Name) and self.lookup(nb.id + "#val") == "False":
            nb = ast.Constant(False)   # to(device, non_blocking=non_blocking) with the parameter left at False
        blocking = nb is None or (isinstance(nb, ast.Constant) and not nb.value)
        nb_true = isinstance(nb, ast.Constant) and nb.value is True
        if method == "type" and node.args and (self.cuda_type(node.args[0]) or self.kind(node.args[0]) == "ttype") \
                or method == "type_as" and node.args and self.kind(node.args[0]) not in HOSTISH:
            method = "cuda"   # x.type(torch.cuda.FloatTensor), x.type(xin.type()), x.type_as(cuda_t): a copy
        if method in ("to", "cuda") and (method == "cuda" or self.copy_target(node) == "cuda"):
            src = func.value   # torch.<factory>(...)[.long()...] on the host, then .to(device)/.cuda()
            while isinstance(src, ast.Call) and isinstance(src.func, ast.Attribute) and (
                    src.func.attr in DTYPE_METHODS | VIEW_METHODS or src.func.attr.endswith("_")
                    or (src.func.attr == "to" and self.copy_target(src) is None)):
                src = src.func.value
            inner = self.dotted(src.func) if isinstance(src, ast.Call) else ""
            made_here = bool(inner) and inner.startswith("torch.") and inner.count(".") == 1 and (
                (inner.split(".")[1] in FACTORIES and (self.factory_kind(src) in ("host", "pinned") or splatted(src)))
                or (inner == "torch.from_numpy" and self.looping()))   # from_numpy once is how host data loads;
            # a factory handed only splatted arguments, then moved (rlkit's `ptu.zeros(*sizes, **kwargs).to(device)`),
            # builds on the host: were the device in kwargs, the move after it would be pointless
            if made_here and _empty_literal(src):
                pass   # torch.tensor([]).to('cuda'): an empty literal moves no bytes
            elif made_here and not (recv == "pinned" and nb_true):   # pinned + non_blocking is the right pattern
                self.flag(node, "GB001")
            elif nb_true and recv in ("host", "batch_host"):
                self.flag(node, "GB005")
            elif (recv in ("host", "hlist") or recv is None and (self._sample_item() or self._converted(func.value))) \
                    and blocking and self.looping() \
                    and not self._compiled_constant(func.value):
                self.flag(node, "GB010", what=_short(node))   # hlist: an item of a list of host tensors
            elif recv not in TENSORISH and blocking and self.looping() and self._one_layer(func.value):
                self.flag(node, "GB010", what=f"{_short(node)}: one block's weights, each layer")   # GPTQ's offload
            if recv in BATCHES and blocking and self.looping():   # a prompt tokenized per question, too
                self.flag(node, "GB009", what=_short(node))
            elif recv == "pinned" and blocking and self.looping() and not made_here:   # stylegan2-ada's labels:
                self.flag(node, "GB009", what=_short(node), fix=_PINNED_FIX)   # `.pin_memory().to(device)`
        elif method == "to" and recv in TENSORISH and self.looping() and self.copy_target(node) == "cpu" \
                and not nb_true:   # x.to('cpu', non_blocking=True): into pinned memory, queued (reading it needs an event)
            self.flag(node, "GB002", what="`.to('cpu')`")   # x.to('cpu'), x.to(cpu_device): a read like .cpu()
        elif method == "copy_" and nb_true and node.args and self.kind(node.args[0]) in ("host", "batch_host"):
            self.flag(node, "GB005")
        elif method == "copy_" and blocking and node.args and recv in TENSORISH and self.looping() \
                and self.kind(node.args[0]) in BATCHES:
            self.flag(node, "GB009", what=_short(node))   # x_dev.copy_(batch): a blocking copy into a device buffer
        elif method == "copy_" and node.args and recv in TENSORISH and self.looping() \
                and self.kind(node.args[0]) in ("host", "hlist"):   # buf[i].copy_(torch.from_numpy(obs)): pageable
            self.flag(node, "GB010", what=_short(node))   # memory copied into a device buffer, blocking
        elif method == "new_tensor" and recv in TENSORISH and node.args and self.looping() \
                and self.kind(node.args[0]) not in TENSORISH:
            self.flag(node, "GB010", what=_short(node))   # obs.new_tensor(0.0): host data copied to obs's device
        elif method == "new" and recv in TENSORISH and len(node.args) == 1 and not node.keywords and self.looping() \
                and _host_data(node.args[0], self.kind(node.args[0])):
            self.flag(node, "GB010", what=_short(node))   # t.new(cfg.TRAIN.BBOX_NORMALIZE_STDS): a table, copied
        elif name.startswith("torch.") and name.count(".") == 1 and name[6:] in DATA_FACTORIES and self.looping() \
                and node.args \
                and (self.device_of(kw["device"]) == "cuda" if "device" in kw else self.default_cuda(name, node)) \
                and self.kind(node.args[0]) not in TENSORISH \
                and not (name == "torch.as_tensor" and "device" in kw and self._on_its_own_device(node.args[0], kw["device"])) \
                and not (isinstance(node.args[0], (ast.List, ast.Tuple)) and not node.args[0].elts):   # [] copies nothing
            self.flag(node, "GB010", what=_short(node))   # torch.tensor(host_list, device="cuda")
        elif self.cuda_type(func) and len(node.args) == 1 and not node.keywords and self.looping() \
                and _legacy_data(node.args[0], self.kind(node.args[0])):
            self.flag(node, "GB010", what=_short(node))   # torch.cuda.LongTensor(sizes): a host list, copied

    def _one_layer(self, node: ast.AST) -> bool:
        """`layers[i]` of a model's list of blocks, or a name bound to one in this def (`layer = layers[i]`): in a
        layer-by-layer pass (GPTQ, AWQ, SparseGPT) the model waits on the host and each block is copied up in turn."""
        if isinstance(node, ast.Name) and self.defs:
            node = next((st.value for st in ast.walk(self.defs[-1]) if isinstance(st, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == node.id for t in st.targets)
                         and isinstance(st.value, ast.Subscript)), node)
        return one_block(node)

    def _compiled_constant(self, value: ast.AST) -> bool:
        """A host table built from torch factories (`torch.exp(-c * torch.arange(half) / half)`) in code
        that a @torch.compile'd def runs: Inductor builds it on the device, no copy at run time."""
        return COMPILED in self.functions and any(
            isinstance(n, ast.Call) and (self.dotted(n.func) or "").startswith("torch.")
            and (self.dotted(n.func) or "")[6:] in FACTORIES for n in ast.walk(value)) and not any(
            isinstance(n, ast.Name) and self.kind(n) in ("host", "hlist", "numpy") for n in ast.walk(value))

    def _converted(self, value: ast.AST) -> bool:
        """`check(obs)` / `to_tensor(batch.obs)`, a call of a project def that exists to turn numpy into a tensor
        (_numpy_converter), on data of unknown kind: the data is numpy (or the def would not be called), so
        moving the result copies host data."""
        if not (isinstance(value, ast.Call) and value.args and isinstance(value.func, (ast.Name, ast.Attribute))):
            return False
        if self.kind(value.args[0]) in TENSORISH:
            return False
        scope = self.defs[-1] if self.defs else None
        return any(_numpy_converter(fn) for _, fn in self.project.resolve(self.src, value, scope, self.types,
                                                                           fallback=False)[:3])

    def _sample_item(self) -> bool:
        """Inside a Dataset's `__getitem__` walked as a hook (hot.HotMap): what it builds is host data, so a
        `.cuda()` of a value of unknown kind there copies a sample from the host, per sample."""
        fn = self.defs[-1] if self.defs else None
        return getattr(fn, "name", "") == "__getitem__" and id(fn) in self.hotmap.hooks

    def cuda_type(self, node: ast.AST) -> bool:
        """`torch.cuda.FloatTensor`, or a name bound to one (`Tensor = torch.cuda.FloatTensor if cuda else ...`)."""
        if isinstance(node, ast.Name) and node.id in self.cuda_types:
            return True
        name = self.dotted(node) or ""
        return name.startswith("torch.cuda.") and name.endswith("Tensor")

    def cuda_mask_type(self, node: ast.AST) -> bool:
        """`torch.cuda.ByteTensor` / `BoolTensor`, or a name bound to one: what it makes from a list of flags is a
        mask (the DQN tutorial's `non_final_mask = ByteTensor(tuple(map(lambda s: s is not None, ...)))`)."""
        name = self.cuda_types.get(node.id, "") if isinstance(node, ast.Name) else self.dotted(node) or ""
        return bool(re.fullmatch(r"torch\.cuda\.(Byte|Bool)Tensor", name))

    def _on_its_own_device(self, arg: ast.AST, device: ast.AST) -> bool:
        """`torch.as_tensor(kp, device=kp.device)` (or a `device` name set from `kp.device`): a tensor
        already there comes back as is; only host data would be copied, onto the host."""
        if not isinstance(arg, ast.Name):
            return False
        own = f"{arg.id}.device"
        if ast.unparse(device) == own:
            return True
        scope = self.defs[-1] if self.defs else None
        return isinstance(device, ast.Name) and scope is not None and any(
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == device.id for t in n.targets)
            and own in ast.unparse(n.value) for n in ast.walk(scope))

    def index_rule(self, node: ast.Subscript) -> None:
        """GB011: a device tensor indexed (read or written) by host indices."""
        if not self.looping() or self.kind(node.value) not in TENSORISH:
            return
        parts = index_parts(node)
        for p in parts:
            if isinstance(p, (ast.List, ast.ListComp)) or (
                    isinstance(p, ast.Call) and isinstance(p.func, ast.Name) and p.func.id in ("range", "list")) \
                    or self.int_depth(p) == 1 or self._int_attr(p) \
                    or self.kind(p) in _HOST_INDEX and not self.host_element(p):
                self.flag(node, "GB011", what=_short(p, 30))
                return

    def note_elements(self, node: ast.Assign) -> None:
        """Mark names bound to one element of a host array (`i, j = truth_i[ti], truth_j[ti]`)."""
        t, v = node.targets[0], node.value
        pairs = zip(t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) \
            and len(t.elts) == len(v.elts) else [(t, v)] if len(node.targets) == 1 else []
        if isinstance(t, ast.Tuple) and not isinstance(v, ast.Tuple) and self._host_flat(v):
            pairs = [(e, None) for e in t.elts]   # idx1, idx2 = torch.randperm(n)[:2]: two host ints (DomainBed)
        for name, val in pairs:
            if isinstance(name, ast.Name) and (val is None or self.host_element(val)):
                self.scopes[-1][name.id + "#elem"] = "elem"
            elif isinstance(name, ast.Name):
                self.note_lists(name, val)   # chosen = [i for i in range(n) if status[i] == 1]: a list of positions
                if self._host_flat(val):
                    self.scopes[-1][name.id + "#h1d"] = "h1d"

    def _host_flat(self, v: ast.AST) -> bool:
        """A one-dimensional host tensor: `torch.randperm(n)` or `torch.arange(n)` with no device, a name bound
        to one, or a slice of one; unpacked, its items are 0-d host ints."""
        while isinstance(v, ast.Subscript) and isinstance(v.slice, ast.Slice):
            v = v.value
        if isinstance(v, ast.Name):
            return bool(self.lookup(v.id + "#h1d"))
        if isinstance(v, ast.Call) and (self.dotted(v.func) or "") == "torch.randint" and self.kind(v) == "host":
            size = v.args[-1] if len(v.args) >= 2 else next((k.value for k in v.keywords if k.arg == "size"), None)
            return isinstance(size, (ast.Tuple, ast.List)) and len(size.elts) == 1   # randint(0, n, (b,)): 1-d
        return isinstance(v, ast.Call) and (self.dotted(v.func) or "") in ("torch.randperm", "torch.arange") \
            and self.kind(v) == "host"

    def host_element(self, p: ast.AST) -> bool:
        """One element of a host array (`truth_i[ti]`, or `i` from `i, j = truth_i[ti], truth_j[ti]`): an
        integer index read on the host, a plain select with nothing copied to the device."""
        if isinstance(p, ast.Name):
            return bool(self.lookup(p.id + "#elem"))
        if isinstance(p, ast.BinOp) and isinstance(p.op, (ast.Add, ast.Sub)):   # l + 1: still one host int
            sides = (p.left, p.right)
            return any(isinstance(x, ast.Constant) for x in sides) and any(self.host_element(x) for x in sides)
        return isinstance(p, ast.Subscript) and _int_expression(p.slice) and self.kind(p.value) in ("numpy", "host")

    def check_loaders(self) -> None:
        """GB006: a pageable DataLoader of this scope whose batches go to CUDA."""
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


    def host_write(self, target: ast.AST, value: ast.AST, augmented: bool = False) -> None:
        """`cpu_t[i] = cuda_value`: the device value is read back to the host to be stored;
        `cuda_t[2:6] = torch.tensor(shape)`: a host tensor is copied in, blocking; `t[mask] = u` with a tensor
        `u`, `t[idx, mask] = 1` with a second tensor index, `H[dead, dead] = 1` with two masks (GPTQ), or
        `t[:, mask] *= 0`: the mask goes through nonzero. A Python value through the mask alone (`t[mask] = 0`,
        `t[i, mask] = 0` with an int i, `t[:, mask] = 0`) is a masked_fill (index_put_ sends one mask and a CPU
        scalar there)."""
        if not isinstance(target, ast.Subscript) or not self.looping():
            return
        into, k = self.kind(target.value), self.kind(value)
        if into in ("host", "pinned") and k in TENSORISH:
            self.flag(target, "GB002", what="writing a device value into a host tensor")
        elif into in TENSORISH and k in ("host", "hlist", "batch_host"):
            self.flag(target, "GB010", what=f"{_short(target, 30)} = <host tensor>")
        elif into in TENSORISH and k == "batch_pinned" and isinstance(value, ast.Name):   # bank[s:s + bs] = idx (SwAV's
            self.flag(target, "GB009", what=f"{_short(target, 30)} = <pinned batch>",   # memory bank)
                      fix="it is pinned already: write it with `dst[...].copy_(src, non_blocking=True)`: the host does not wait")
        elif into in TENSORISH and not augmented and _python_number(value, k) and self._through_positions(target):
            self.flag(target, "GB010", what=f"{_short(target, 30)} = <Python number> through an index tensor"
                                            " (index_fill_ copies nothing)")
        elif into in TENSORISH and not augmented and self.element_write(target, value, k):
            self.flag(target, "GB010", what=f"{_short(target, 30)} = <Python number>, one element")
        if into in TENSORISH:
            parts = index_parts(target)
            masks = [p for p in parts if self.kind(p) == "mask"]
            others = [p for p in parts if p not in masks and not isinstance(p, ast.Slice)
                      and not (isinstance(p, ast.Constant) and p.value in (Ellipsis, None))
                      and not (isinstance(p, ast.Constant) and type(p.value) is int) and self.kind(p) != "num"]
            # `t[i, mask] = 0` with an int i selects first: the mask is then the one index, a masked_fill
            if masks and (augmented or k in TENSORISH or others or len(masks) > 1):   # H[dead, dead] = 1: two masks
                self.flag(target, "GB008", what="writing through a boolean mask `x[mask] = y`")

    def _through_positions(self, target: ast.Subscript) -> bool:
        """`t[idx] = 0`, `t[idx, 3] = 1.5` with a device tensor of positions among the indices and no mask (a mask
        beside it takes the nonzero path, GB008's finding)."""
        parts = index_parts(target)
        return any(self.index_tensor(p) for p in parts) and not any(self.kind(p) == "mask" for p in parts)

    def element_write(self, target: ast.Subscript, value: ast.AST, k: str | None) -> bool:
        """`rewards[i] = 0.5` into a device tensor made here with one dim per index: the value becomes a CPU
        scalar tensor that is copied into the one element, blocking (a sync; measured on an H100, torch 2.11).
        A row or a slice (`m[1] = 0`, `t[2:5] = 7`) is filled on the device instead, and `t[i] += 0.5` adds
        on the device and writes back a device scalar: neither syncs."""
        if not (isinstance(value, ast.Constant) and type(value.value) in (int, float, bool) or k == "num"
                or isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _NUMBER_CALLS
                and all(self.kind(a) not in TENSORISH for a in value.args)) or not isinstance(target.value, ast.Name):
            return False
        parts = index_parts(target)
        if any(not (isinstance(p, ast.Constant) and type(p.value) is int) and not (   # ints, or 0-d host tensors
                isinstance(p, ast.Name) and (self.kind(p) in (None, "num", "host", "numpy") or self.kind(p) in BATCHES))
                for p in parts):
            return False
        made = assigned_calls(self.src, target.value.id, self.defs[-1] if self.defs else None)
        return bool(made) and all(_made_ndim(c) == len(parts) for c in made)


def _python_number(value: ast.AST, k: str | None) -> bool:
    """`0`, `-1.5`, `True`, `-float('inf')`, `math.inf`, a name holding a number: what torch wraps in a CPU tensor."""
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
        value = value.operand
    if isinstance(value, ast.Constant):
        return type(value.value) in (int, float, bool)
    if isinstance(value, ast.Attribute):
        return value.attr in ("inf", "nan", "pi") and isinstance(value.value, ast.Name)
    return k == "num" or isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
        and value.func.id == "float" and len(value.args) == 1 and isinstance(value.args[0], ast.Constant)


_KEEPS_SHAPE = {"type", "to", "cuda", "float", "half", "double", "long", "int", "bool", "contiguous"}
_NUMBER_CALLS = {"float", "int", "bool", "max", "min", "round", "abs", "sum", "len"}


def _made_ndim(call: ast.Call) -> int | None:
    """The dims of a tensor a factory makes (`torch.zeros(n, device=d)`: 1, `torch.full((b, t), v)`: 2, also
    through a cast or a move: `torch.ones(b, a, h, w).type(dtype)`: 4), or None."""
    while isinstance(call.func, ast.Attribute) and call.func.attr in _KEEPS_SHAPE and isinstance(call.func.value, ast.Call):
        call = call.func.value
    last = name_of(call.func)
    if last not in _SIZED and last != "full" or not call.args:
        return None
    sizes = call.args[:1] if last == "full" else call.args
    if len(sizes) == 1 and isinstance(sizes[0], (ast.Tuple, ast.List)):
        return len(sizes[0].elts)
    return None if any(isinstance(a, (ast.Tuple, ast.List, ast.Starred)) for a in sizes) else len(sizes)


def _moves_to_cuda(loop: ast.AST, checker) -> bool:
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


def _numpy_converter(fn) -> bool:
    """A small def that turns its argument from numpy into a tensor and returns anything else as it is:
    `def check(x): return torch.from_numpy(x) if type(x) == np.ndarray else x` (on-policy, HARL), mbrl's
    `to_tensor(x)`; every return is the parameter or `torch.from_numpy` of it (directly or through a local)."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(fn.body) > 6 or not fn.args.args:
        return False
    param = fn.args.args[0].arg
    made: dict[str, list[ast.AST]] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            made.setdefault(n.targets[0].id, []).append(n.value)

    def converts(e: ast.AST, seen: frozenset = frozenset()) -> bool:
        if isinstance(e, ast.IfExp):
            return converts(e.body, seen) and converts(e.orelse, seen)
        if isinstance(e, ast.Name):
            return e.id == param or e.id not in seen and e.id in made and all(
                converts(v, seen | {e.id}) for v in made[e.id])
        return isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "from_numpy" \
            and len(e.args) == 1 and isinstance(e.args[0], ast.Name) and e.args[0].id == param

    returns = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
    return bool(returns) and all(converts(r) for r in returns) and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "from_numpy" for n in ast.walk(fn))


def rebinds(node: ast.Assign) -> bool:
    """`self.freqs_cis = self.freqs_cis.to(h.device)`, `self.cache_k = self.cache_k.cuda()`: a move stored back
    into the attribute it was read from. The attribute then holds the device copy, so only the first call copies
    (set-up, not per step); a local name (`x = x.to(dev)`) is made anew on every call and is not one."""
    value = node.value
    if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Attribute) or not (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda")):
        return False
    return ast.unparse(value.func.value) == ast.unparse(node.targets[0])


def placeholder(value: ast.AST) -> bool:
    """A tensor of no elements a name starts as before an `if` fills it (`map_known_indice =
    torch.tensor([]).to('cuda')`, `torch.zeros(0)`): after the if, the name holds what the if bound."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda"):
        value = value.func.value
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
        and isinstance(value.func.value, ast.Name) and value.func.value.id in ("torch", "th") and _empty_literal(value)


def _int_expression(node: ast.AST) -> bool:
    """One position: a name, a number, or their sum or difference (`perm[start_ind + offset]`)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return _int_expression(node.left) and _int_expression(node.right)
    return isinstance(node, (ast.Name, ast.Constant))


def _empty_literal(call: ast.Call) -> bool:
    """`torch.tensor([])`, `torch.Tensor(())`, `torch.arange(0, 0)`, `torch.zeros(0)`: a tensor of no elements,
    whose copy moves nothing (copy_ returns before any transfer)."""
    args = call.args
    made = call.func.attr if isinstance(call.func, ast.Attribute) else ""
    if len(args) == 1 and isinstance(args[0], (ast.List, ast.Tuple)) and not args[0].elts \
            or not args and not call.keywords and made.endswith("Tensor"):
        return True   # (torch.FloatTensor(): no data, no size)
    numbers = [a.value for a in args if isinstance(a, ast.Constant) and type(a.value) is int]
    if made in _SIZED and 0 in numbers and not any(isinstance(a, ast.Starred) for a in args):
        return True   # torch.empty(batch_size, 0): a zero-sized dimension, whatever the others
    if not args or len(numbers) != len(args):
        return False
    if made == "arange":
        return len(numbers) == 1 and numbers[0] == 0 or len(numbers) >= 2 and numbers[0] == numbers[1]
    return made in _SIZED and 0 in numbers   # torch.zeros(0), torch.empty(0, 4): a zero-sized dimension


def _short(node: ast.AST, width: int = 40) -> str:
    text = ast.unparse(node)
    return text if len(text) <= width else text[:width - 3] + "..."


__all__ = ["rebinds", "CopyRules"]
