"""The expression rules of `gobrrr lint` that read a device value on the host: GB002 (`.item()`,
`.cpu()`, `float(t)`), GB003 (printing, formatting or logging a tensor), GB004 (synchronize), GB008
(data-dependent shapes). A mixin of rules.Checker: it relies on the checker's `kind()`,
`looping()`, `flag()`, `hotmap` and `functions`; each rule fires only on evidence of a tensor.
"""
from __future__ import annotations

import ast
import math
import re

from gobrrr.lint.hot import is_bench_name
from gobrrr.lint.loops import name_of
from gobrrr.lint.names import DATA_DEPENDENT, DATA_FACTORIES, HOSTISH, TENSORISH, index_parts

READS = {"item", "cpu", "tolist", "numpy"}
_ANSWERS = {"equal", "allclose", "is_nonzero"}   # torch ops that return a Python bool: read on the host
_STDLIB_MATH = frozenset(n for n in dir(math) if not n.startswith("_"))   # math.log(t): float(t) first
_REDUCTIONS = {"argmax", "argmin", "sum", "max", "min", "mean", "prod", "amax", "amin"}
_SIZED_METHODS = {"new_zeros", "new_ones", "new_empty", "new_full", "view", "reshape", "expand", "repeat", "narrow"}
_SIZED_FACTORIES = {"zeros", "ones", "empty", "full", "randn", "rand", "arange", "range", "eye", "randperm"}
_TRACKER = re.compile(r"wandb|^run$|_run$|tracker|accelerator|experiment|fabric", re.I)
_LOGGERS = {"add_scalar", "add_scalars", "add_histogram", "log_metric", "log_metrics"}


_TIMING_FIX = ("time with torch.cuda.Event(enable_timing=True) pairs recorded around the step and read once per "
               "log interval (elapsed_time), or synchronize only on the steps that log")


class SyncRules:
    """GB002/GB003/GB004/GB008 on calls, f-strings, %-formatting and boolean-mask indexing."""

    def sync_rules(self, node, func, name, method, recv, kw) -> None:
        # GB002: reading a device value on the host
        forced = isinstance(kw.get("force"), ast.Constant) and kw["force"].value is True
        if method == "cpu" and recv in HOSTISH and self.wrapped_unknown(func.value):
            self.flag(node, "GB002", what="`.cpu()`")   # torch.as_tensor(v).float().cpu(): v may be on the device
        elif method in READS and recv not in HOSTISH and recv != "generated" and not isinstance(func.value, ast.Constant) \
                and (method != "numpy" or forced) \
                and (method != "tolist" or recv in TENSORISH) \
                and not (method == "cpu" and self.is_model(func.value)) \
                and not (recv is None and isinstance(func.value, ast.Name) and self.lookup(func.value.id + "#opt")) \
                and not (recv is None and self._sample_item()):   # a Dataset's own values are host ones (moves.py)
            # (an optional parameter, `lengths=None`, that no caller typed: as likely a host tensor)
            # .numpy() of a CUDA tensor raises unless force=True; .tolist() of an unknown is as likely numpy
            self.flag(node, "GB002", what=f"`.{method}()`")
        elif isinstance(func, ast.Name) and func.id in ("float", "int", "bool") and len(node.args) == 1 \
                and self.kind(node.args[0]) in TENSORISH:
            self.flag(node, "GB002", what=f"`{func.id}()` of a tensor")
        elif name.startswith("math.") and name.count(".") == 1 and name[5:] in _STDLIB_MATH \
                and any(self.kind(a) in TENSORISH for a in node.args):   # not a project's own `from .math import rope`
            # math.isfinite(loss), math.log(t): math converts its argument with float() (an .item())
            self.flag(node, "GB002", what=f"`{name}()` of a tensor (math reads it with float())")
        elif isinstance(func, ast.Name) and func.id in ("max", "min") and len(node.args) >= 2 and not node.keywords \
                and any(self.kind(a) in TENSORISH for a in node.args) and self.lookup(func.id) is None:
            self.flag(node, "GB002", what=f"the builtin `{func.id}()` of tensors (it compares them as Python bools)")
        elif isinstance(func, ast.Name) and func.id in ("any", "all") and len(node.args) == 1 and not node.keywords \
                and self.kind(node.args[0]) in TENSORISH and self.lookup(func.id) is None:
            # any(t > 0): the builtin iterates the tensor and reads each element with bool(); t.any() stays on the device
            self.flag(node, "GB002", what=f"the builtin `{func.id}()` of a tensor (one bool() read per element)")
        if name.startswith("torch.") and name.count(".") == 1 and name[6:] in DATA_FACTORIES and node.args \
                and isinstance(node.args[0], (ast.List, ast.Tuple)):   # torch.tensor([loss_a, n]): each 0-d
            for e in node.args[0].elts:                               # device element is read with .item()
                if self.kind(e) in ("tensor", "mask"):
                    self.flag(e, "GB002", what=f"a device tensor in the list given to `{name}` (read with .item())")
        bound = self.scalar_bound(node, name, method)
        if bound is not None:   # gj.clamp_(0, gain[3] - 1): a 0-d device bound beside a number takes the Scalar overload
            self.flag(node, "GB002", what=f"a one-element tensor as a clamp bound (`{ast.unparse(bound)[:30]}`)")
        fill = self.fill_value(node, name, method, kw)
        if fill is not None:   # torch.full((n, 1), stride): the fill value is a Scalar, a 0-d tensor read with .item()
            self.flag(node, "GB002", what=f"a tensor as a fill value (`{ast.unparse(fill)[:30]}`, read with .item())")
        size = self.size_argument(node, func, name, method, kw)
        if size is not None:   # topk(k=ks[i]), range(n), x.new_zeros((n, 4)): a device scalar read as an int
            self.flag(node, "GB002", what=f"a tensor as a count or size (`{ast.unparse(size)[:30]}`)")
        # GB003: printing or formatting a tensor
        if isinstance(func, ast.Name) and func.id in ("print", "str", "repr", "format") \
                and any(self.kind(a) in TENSORISH for a in node.args):
            self.flag(node, "GB003", what="printing" if func.id == "print" else "formatting")
        elif method == "format" and isinstance(func.value, ast.Constant) \
                and any(self.kind(a) in TENSORISH for a in [*node.args, *kw.values()]):
            self.flag(node, "GB003", what="formatting")
        elif (method in _LOGGERS or name in ("wandb.log", "mlflow.log_metric", "mlflow.log_metrics")) \
                and any(self.kind(v) in TENSORISH for a in [*node.args, *kw.values()] for v in _values(a)):
            self.flag(node, "GB003", what="logging")  # writer.add_scalar("loss", loss, step) reads it on the host
        elif method == "log" and node.args and isinstance(node.args[0], ast.Dict) \
                and _TRACKER.search(name_of(func.value)) \
                and any(self.kind(v) in TENSORISH for v in _values(node.args[0])):
            self.flag(node, "GB003", what="logging")  # wandb_run.log({"loss": loss}), accelerator.log({...})
        # GB004: synchronize in a loop, unless it is measuring time or in benchmark code
        if name.endswith("torch.cuda.synchronize") or method == "synchronize":
            if not (self.hotmap.bench_file or any(is_bench_name(f) for f in self.functions)):
                if node.lineno in self.hotmap.timed:   # a stopwatch around the step: still a full stall each step
                    self.flag(node, "GB004", what=f"`{ast.unparse(func)}()` to time the step", fix=_TIMING_FIX)
                else:
                    self.flag(node, "GB004", what=f"`{ast.unparse(func)}()`")
        if name.endswith("torch.cuda.empty_cache") and (self.loop_stack or len(self.chain) == 1) and not (
                self.hotmap.bench_file or any(is_bench_name(f) for f in self.functions)):   # cudaFree synchronizes
            # the device. In a loop, or in a helper the step loop calls itself (`self.free_memory()` after each
            # step); set-up and teardown helpers that hot code seems to reach through more calls free memory once
            self.flag(node, "GB004", what="`torch.cuda.empty_cache()` (it frees with cudaFree, which synchronizes)")
        # GB008: data-dependent output shapes
        last = name.rsplit(".", 1)[-1]
        if ((name.startswith("torch.") and name.count(".") == 1 and last in DATA_DEPENDENT) or
                (name == "torch.where" and len(node.args) == 1 and not node.keywords)) \
                and not (node.args and self.kind(node.args[0]) in ("host", "hlist", "numpy")):
            self.flag(node, "GB008", what=f"`{name}()`")   # (of a host tensor: the shape is known on the host)
        elif method in DATA_DEPENDENT and recv not in HOSTISH and not name.startswith(("torch.", "numpy.", "np.")):
            self.flag(node, "GB008", what=f"`.{method}()`")
        elif last in ("bincount", "repeat_interleave") and self.sized_by_data(node, name, method, recv, kw):
            self.flag(node, "GB008", what=f"`{last}()`")   # the output size is the data's max / sum
        if last in _ANSWERS and (name == f"torch.{last}" and any(self.kind(a) in TENSORISH for a in node.args)
                                 or method == last and recv in TENSORISH):
            self.flag(node, "GB002", what=f"`{last}()` (it answers with a Python bool)")

    def sized_by_data(self, node: ast.Call, name: str, method, recv, kw) -> bool:
        """torch.bincount(t) (its length is t.max() + 1), repeat_interleave with tensor repeats (or the
        repeats alone, `torch.repeat_interleave(lengths)`) and no output_size: torch reads the size on the host."""
        torch_fn = name.startswith("torch.") and name.count(".") == 1
        first = node.args[0] if torch_fn and node.args else func_value(node) if not torch_fn else None
        if first is None or self.kind(first) not in TENSORISH:
            return False
        if name.endswith("bincount"):
            return True
        repeats = kw.get("repeats", node.args[1] if torch_fn and len(node.args) > 1 else
                         node.args[0] if node.args else None)   # torch.repeat_interleave(lengths): 0, 0, 1, 1, 1
        return repeats is not None and self.kind(repeats) in TENSORISH and "output_size" not in kw

    def size_argument(self, node: ast.Call, func, name: str, method, kw) -> ast.AST | None:
        """The argument of a call that wants a Python int (a count, a size, `k`) and is handed a
        device tensor: torch reads it with `.item()`. Attributes and parameters are left out (`cfg.n`
        of an object the kinds took for a tensor, `height` as a caller guessed it)."""
        last = name.rsplit(".", 1)[-1] if name else (method or "")
        if isinstance(func, ast.Name) and func.id == "range":
            args = list(node.args)
        elif name in ("torch.nn.functional.pad", "F.pad") and (kw.get("pad") or node.args[1:2]):
            pad = kw.get("pad") or node.args[1]   # F.pad(x, pad=[mx0, mx1, my0, my1]) with 0-d device ints
            args = list(pad.elts) if isinstance(pad, (ast.List, ast.Tuple)) else []
        elif last in ("topk", "kthvalue"):
            args = [kw["k"]] if "k" in kw else node.args[1:2] if name.startswith("torch.") else node.args[:1]
        elif method in _SIZED_METHODS and self.kind(func.value) in TENSORISH or \
                name.startswith("torch.") and name.count(".") == 1 and last in _SIZED_FACTORIES:
            given = node.args[:1] if last in ("full", "new_full") else node.args   # full(size, fill_value)
            args = [e for a in given for e in (a.elts if isinstance(a, (ast.Tuple, ast.List)) else [a])]
            if method == "narrow":
                args = args[1:]
        else:
            return None
        return self._made_here(args)

    def fill_value(self, node: ast.Call, name: str, method, kw) -> ast.AST | None:
        """The fill value of torch.full / full_like / x.new_full when it is a device tensor: these take a
        Scalar, so PyTorch reads the (one-element) tensor with .item(); `x.fill_(t)` and masked_fill take
        a tensor and do not sync."""
        if not (name in ("torch.full", "torch.full_like") or method == "new_full" and not name.startswith(("torch.", "numpy."))):
            return None
        fill = kw.get("fill_value", node.args[1] if len(node.args) > 1 else None)   # second in all three
        return fill if fill is not None and self.kind(fill) == "tensor" else None

    def scalar_bound(self, node: ast.Call, name: str, method) -> ast.AST | None:
        """`x.clamp_(0, gain[3] - 1)`: one bound a Python number, the other an element of a device tensor
        made here; PyTorch takes the (Scalar, Scalar) overload and reads the tensor with .item()."""
        if method not in ("clamp", "clamp_", "clip", "clip_") or name.startswith("numpy.") or node.keywords:
            return None
        args = node.args[1:] if name in ("torch.clamp", "torch.clip") else node.args
        if len(args) != 2 or not any(isinstance(a, ast.Constant) and type(a.value) in (int, float) for a in args):
            return None
        for a in args:
            e = a.left if isinstance(a, ast.BinOp) and isinstance(a.right, ast.Constant) else a
            if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and type(e.slice.value) is int \
                    and isinstance(e.value, ast.Name) and self._made_here([e.value]) is not None:
                return a
        return None

    def scalar_index(self, node: ast.Subscript) -> None:
        """GB002 for a device scalar as a slice bound (`x[:, :h]`, h = size[0]) or a one-element
        tensor as an index (`labels[best] = 1`, best = scores.argmax()): read with .item()."""
        if not self.looping():
            return
        if self.kind(node.value) == "numpy":
            self.numpy_index(node)
        elif (index := self.list_index(node)) is not None:   # self.label_name[label]: the list reads it with __index__
            self.flag(node, "GB002",
                      what=f"a device tensor as a Python list index (`{ast.unparse(index)[:30]}`, read with __index__)")
        if self.kind(node.value) in HOSTISH:
            return
        bound = self.slice_bound(node)
        if bound is not None:
            self.flag(node, "GB002", what=f"a tensor as a slice bound (`{ast.unparse(bound)[:30]}`)")
        parts = index_parts(node)
        index = next((p for p in parts if self.zero_d(p) or self._element(p)), None)
        if index is not None:
            self.flag(node, "GB002", what=f"a one-element tensor as an index (`{ast.unparse(index)[:30]}`)")

    def _element(self, node: ast.AST) -> bool:
        """`mean_value[:, index[i]]`, `best_truth_idx[best_prior_idx[j]] = j`: one element of a device tensor this def
        made (a 1-d index: topk's, argmax's), picked with a loop's counter, as a whole index. A 0-d integer tensor index
        is read with .item() to select (measured: a sync per read). Not `edge_index[0]`: a constant picks a row of a
        2-d index (a gather, no sync) as often as an element."""
        return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and not node.value.id.endswith("mask") \
            and isinstance(node.slice, ast.Name) and node.slice.id in self._index_facts("counters") \
            and self.kind(node.value) == "tensor" and self._made_here([node.value]) is not None \
            and node.value.id not in self._index_facts("rows")

    def _index_facts(self, which: str) -> set[str]:
        """"rows": names this def binds from a call along `dim=1` or higher (`torch.topk(logit, k, dim=1)[1]`): at least
        2-d, so one of their elements is a row of indices (a gather), not a 0-d read (DETA, qmoe); "counters": the
        names its loops count with (`for i in range(k)`, `[... for i in range(k)]`). Once per def."""
        fn = self.defs[-1] if self.defs else None
        memo = self.project.per_file.setdefault(id(self.src), {}).setdefault("index_facts", {})
        if id(fn) not in memo:
            nodes = list(ast.walk(fn)) if fn is not None else []
            rows = {t.id for n in nodes if isinstance(n, ast.Assign) and _along_dim1(n.value)
                    for t in n.targets if isinstance(t, ast.Name)}
            counters = {n.target.id for n in nodes if isinstance(n, (ast.For, ast.comprehension))
                        and isinstance(n.target, ast.Name) and isinstance(n.iter, ast.Call)
                        and isinstance(n.iter.func, ast.Name) and n.iter.func.id in ("range", "trange")}
            memo[id(fn)] = {"rows": rows, "counters": counters}
        return memo[id(fn)][which]

    def numpy_index(self, node: ast.Subscript) -> None:
        """GB002 for a device tensor as an index of a numpy array (`matrix[dc, gc] += 1`, gc from iterating
        a CUDA tensor): numpy takes it through __index__, an .item() (a CUDA tensor of more than one
        element raises there, so code that runs indexes with 0-d ones)."""
        parts = index_parts(node)
        index = next((p for p in parts if not isinstance(p, ast.Slice) and self.kind(p) in ("tensor", "mask")), None)
        if index is not None:
            self.flag(node, "GB002", what=f"a device tensor as a numpy index (`{ast.unparse(index)[:30]}`, read with __index__)")

    def zero_d(self, node: ast.AST) -> bool:
        """A device tensor that certainly has one element: a full reduction (`t.argmax()`, `t.sum()`,
        `torch.argmax(t)` with no dim) or a name bound to one in this def."""
        if isinstance(node, ast.Name):
            return bool(self.lookup(node.id + "#0d"))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _REDUCTIONS):
            return False
        if any(k.arg in ("dim", "axis") for k in node.keywords):
            return False
        name = self.dotted(node.func) or ""
        if name.startswith("torch."):
            return len(node.args) == 1 and self.kind(node.args[0]) in TENSORISH
        return not node.args and self.kind(node.func.value) in TENSORISH

    def slice_bound(self, node: ast.Subscript) -> ast.AST | None:
        parts = index_parts(node)
        bounds = [b for p in parts if isinstance(p, ast.Slice) for b in (p.lower, p.upper, p.step) if b is not None]
        return self._made_here([b for b in bounds if isinstance(b, (ast.Name, ast.Subscript)) or _offset(b)
                                or self._element_offset(b)], True)

    def _element_offset(self, b: ast.AST) -> bool:
        """`h0 - bd`: an element of a device tensor the loop iterates (LoFTR's `for b, (h0, w0) in enumerate(zip(h0s,
        w0s))`), plus or less a name: a one-element tensor, whatever the other name holds."""
        return isinstance(b, ast.BinOp) and isinstance(b.op, (ast.Add, ast.Sub)) and any(
            isinstance(x, ast.Name) and self.lookup(x.id + "#delem") for x in (b.left, b.right))

    def _made_here(self, args: list, handed: bool = False) -> ast.AST | None:
        """The first of `args` that is a device tensor made in this def (not a parameter, whose kind is the
        caller's guess); for a slice bound (`handed`), also an element of a device tensor the hot call that reached
        the def made itself (Conv-TasNet's `get_mask(source, source_lengths)` with `mixture_lengths.cuda()`)."""
        fn = self.defs[-1] if self.defs else None
        params = {p.arg for p in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
                  if not (handed and self.lookup(p.arg + "#handed"))} \
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
        roots = [r for a in args for r in (a.value if isinstance(a, ast.Subscript) else a,
                                           getattr(getattr(a, "func", None), "value", None))]
        if params and any(isinstance(r, ast.Name) and r.id in params for r in roots):
            params -= self._reassigned(fn)   # only when a parameter is among the candidates (walks the def once)
        for a in args:
            root = a.value if isinstance(a, ast.Subscript) else a
            if isinstance(a, ast.Call) and self.zero_d(a) and isinstance(a.func, ast.Attribute):
                root = a.func.value   # torch.zeros(b, counts.max(), 5): a full reduction of a tensor made here
                if isinstance(root, ast.Name) and not (root.id in params or self.lookup(root.id + "#part")):
                    return a
            elif isinstance(a, (ast.Name, ast.Subscript)) and self.kind(a) in TENSORISH \
                    and not (isinstance(root, ast.Name) and (root.id in params or self.lookup(root.id + "#part"))):
                return a
            elif isinstance(a, ast.BinOp) and self.kind(a) in TENSORISH and self._made_here([a.left, a.right]):
                return a   # range(num_images + 1) with num_images = (ids == IMAGE).sum()
        return None

    def _reassigned(self, fn: ast.AST) -> set[str]:
        """Names the def binds from a call (`if length is None: length = t.amax()`): a parameter among them is no
        longer the caller's guess, so a size made from it is this def's own (F5-TTS's lens_to_mask). Once per def."""
        memo = self.project.per_file.setdefault(id(self.src), {}).setdefault("reassigned", {})
        if id(fn) not in memo:
            memo[id(fn)] = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                            for t in n.targets if isinstance(t, ast.Name)}
        return memo[id(fn)]

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if self.looping() and any(isinstance(v, ast.FormattedValue) and self.kind(v.value) in TENSORISH
                                  for v in node.values):
            self.flag(node, "GB003", what="formatting")
        self.generic_visit(node)

    def mask_key(self, node: ast.AST) -> bool:
        """`samples["loss_mask"]`: a mask a batch dict carries by name (not a host one), as an index."""
        return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, str) and node.slice.value.endswith("mask") \
            and self.kind(node) not in HOSTISH and self.kind(node.value) not in HOSTISH

    def visit_BinOp(self, node: ast.BinOp) -> None:
        right = [e.value if isinstance(e, ast.Starred) else e for e in node.right.elts] \
            if isinstance(node.right, ast.Tuple) else [node.right]   # "%.4g %.4g" % (*mloss, n)
        if self.looping() and isinstance(node.op, ast.Mod) and self.kind(node.left) == "str" \
                and any(self.kind(r) in TENSORISH for r in right):   # "%.4f %.4f" % (loss, acc)
            self.flag(node, "GB003", what="formatting")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            self.index_rule(node)
            if self.looping() and _old_item(node) and self.kind(node.value.value) in TENSORISH:
                self.flag(node, "GB002", what="`.data[0]` of a loss (the `.item()` of torch before 0.4)")
        self.scalar_index(node)
        if self.looping() and isinstance(node.ctx, ast.Load) and self.kind(node.value) not in HOSTISH:
            parts = index_parts(node)
            if any(self.kind(p) == "mask" for p in parts) or self.kind(node.value) in TENSORISH and any(
                    self.mask_key(p) for p in parts):
                self.flag(node, "GB008", what="boolean-mask indexing `x[mask]`")
        self.generic_visit(node)


    def wrapped_unknown(self, node: ast.AST) -> bool:
        """`torch.as_tensor(v)` (through its views and casts, no device=) of a value of unknown kind: read back
        with `.cpu()`, it is one the author expects on the device (a metric of a dict, a grad norm)."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CASTS:
            node = node.func.value
        return isinstance(node, ast.Call) and (self.dotted(node.func) or "").endswith(".as_tensor") \
            and len(node.args) == 1 and not any(k.arg == "device" for k in node.keywords) \
            and isinstance(node.args[0], (ast.Name, ast.Attribute, ast.Subscript)) and self.kind(node.args[0]) is None


_CASTS = {"reshape", "view", "flatten", "float", "double", "half", "detach", "squeeze", "unsqueeze", "to", "type"}


def _along_dim1(value: ast.AST) -> bool:
    """`torch.topk(x, k, dim=1)[1]`, `torch.argsort(h, dim=1)`: a call (or its first item) along a dimension past the
    first, whose result has at least two."""
    c = value.value if isinstance(value, ast.Subscript) else value
    return isinstance(c, ast.Call) and any(k.arg in ("dim", "axis") and isinstance(k.value, ast.Constant)
                                           and type(k.value.value) is int and k.value.value >= 1 for k in c.keywords)


def func_value(node: ast.Call) -> ast.AST | None:
    return node.func.value if isinstance(node.func, ast.Attribute) else None


def _values(node: ast.AST) -> list[ast.AST]:
    """The values a logging call is handed: the dict's values for wandb.log({"loss": loss})."""
    return [v for v in node.values if v is not None] if isinstance(node, ast.Dict) else [node]


def _old_item(node: ast.Subscript) -> bool:
    """`loss.data[0]`, `loss_c.data[0]`: how code written for torch < 0.4 read a loss as a number (a 0-d tensor's
    `.item()` today). Only on names that say loss, where the tensor is a scalar (`images.data[0]` is a row)."""
    v = node.value
    return isinstance(v, ast.Attribute) and v.attr == "data" and isinstance(node.slice, ast.Constant) \
        and node.slice.value == 0 and "loss" in name_of(v.value).lower()


def _offset(b: ast.AST) -> bool:
    """`n - 1`, `n + 2`, `2 * n`: a bound a number away from a name (StyleTTS2's `pred[1:n - 1]`), not a product of
    two unknowns (quip-sharp's `cb.codesz * (col - size)`, a module's int attribute)."""
    return isinstance(b, ast.BinOp) and any(isinstance(x, ast.Constant) and type(x.value) is int for x in (b.left, b.right)) \
        and any(isinstance(x, (ast.Name, ast.Subscript)) for x in (b.left, b.right))


__all__ = ["READS", "SyncRules"]
