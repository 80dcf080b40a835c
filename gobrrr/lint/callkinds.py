"""What a call makes, as `gobrrr lint` tells it: the kind (kinds.py) of a call's result.

    functions   Python builtins (len, sum of device tensors, getattr of a flag), numpy, math, time; a
                predicate (`is_fp8(p)`, `has_nan(x)`) answers with a Python bool
    torch       factories with or without device= (`factory_kind`), masks, from_numpy, torch.nn ops
    methods     of a tensor: .cpu(), .to(device) or .to(dtype) (`copy_target`), .pin_memory(), views of pinned
                memory, .type(); of a module: .to() is still a module, .forward() a tensor
    loaders     DataLoader(pin_memory=...) (`loader_kind`), wrapped (tqdm, enumerate, accelerator.prepare),
                and what iterating one yields (`iter_kind`); a tokenizer's batch
    the project what its own defs return (`return_kind`: calls.CallRules reads their bodies)

A mixin of kinds.Kinds: it relies on `kind()`, `dotted()`, `lookup()`, `is_model()`, `device_of()`,
`copy_target()`, `annotation_kind()`, `aliases` and `local_defs`.
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.bindings import (
    assigned_calls,
    device_dataset,
    kept_loader,
    loaded_module,
    yields_host_lists,
    yields_on_device,
)
from gobrrr.lint.loops import LOADER_NAME, is_model_name, name_of
from gobrrr.lint.names import (
    BATCHES,
    DEVICE_WRAPPERS,
    DICT_WRAPPERS,
    FACTORIES,
    HOSTISH,
    ITEM_KIND,
    LOADERS_PINNED,
    MASK_FUNCS,
    NOT_TENSOR_METHODS,
    NOT_TENSOR_TORCH,
    NP_SCALARS,
    NUM_BUILTINS,
    NUMBER_METHODS,
    SPARSE_MAKERS,
    STR_METHODS,
    TENSOR_METHODS,
    TENSORISH,
    VIEW_METHODS,
    call_arg,
    np_random_kind,
    splatted,
    values_of,
)

_DATA_WORDS = {"data", "dataset", "ds", "batches", "train", "val", "valid", "test", "eval", "dl"}
# accelerate's collectives, which hand back what they are given, gathered from every rank (on the device)
_GATHERS = {"gather", "gather_for_metrics", "reduce", "pad_across_processes"}
_PREDICATE = re.compile(r"(^_*|[a-z0-9]_)(is|has|should|can|needs?|uses?|supports?|check_is)_|^exists$")   # param_is_not_shared,
# exists(x) (`x is not None`, lucidrains' helper, even where a file forgets to import it)
_COUNT = re.compile(r"^num(ber_of)?_")   # g.num_nodes(), g.number_of_edges() of a DGL graph: ints (no torch method)
_TOKENIZER = re.compile(r"tokeni[sz]er|processor|feature_extractor|^tok$", re.I)
_DOTTED_WRAPPERS = {"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "itertools.islice", "itertools.cycle"}
# what `next()` draws a loader's batch from (not a generator of batches): `next(self.train_iter)`, `next(self.data)`
_DATA_ITER = re.compile(r"^((train|val|valid|eval|test|data|dataset)_?(iter|iterator)|"
                        r"(train_|val_|valid_|eval_|test_)?(data|dataset|data_?loader|loader))$", re.I)
_CPU_TENSOR_TYPE = re.compile(r"torch\.(Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool)Tensor")   # not torch.cuda.*
_DIST_METHODS = {"sample", "rsample", "log_prob", "entropy", "cdf", "icdf", "sample_n", "mode", "mean", "stddev"}


# a tokenizer or processor called on text or images returns host data (`tokenizer(text).input_ids`); not a call that
# builds one (`get_tokenizer(opt)`, `load_processor(path)`)
_HOST_MAKER = re.compile(r"^(?!(get|load|build|make|create|init|setup|new)_)(\w+_)?(tokenizer|processor|feature_extractor)$"
                         r"|^tokenize$", re.I)   # ... and clip.tokenize(texts): a host tensor of token ids
_OWN_TOKENIZER = re.compile(r"(?!_*(get|load|build|make|create|init|setup|new)_)_*(\w+_)?(tokenizer|tokenize|tokenizer_encode)")
#                            self.tokenizer_encode(text), self.tokenizer(text); not self._load_tokenizer(cls, path)


class CallKinds:
    """The kind of a call's result: functions, torch, methods, loaders and the project's defs."""

    def return_kind(self, node: ast.Call) -> str | None:
        """What a project function returns (rules.Checker reads its body): None if unknown, "" if
        known to be neither a tensor nor a list of them."""
        return None

    def _host_items(self, comp: ast.ListComp | ast.GeneratorExp) -> bool:
        """Every item of the comprehension is host data: made by a tokenizer, processor or transform, or taken
        (by index or attribute, nothing called) from the items of a host batch, list or array it iterates."""
        if self.kind(comp.elt) in ("host", "hlist", "numpy", "batch_tok"):
            return True
        if len(comp.generators) != 1 or not isinstance(comp.generators[0].target, ast.Name):
            return False
        target = comp.generators[0].target.id
        e = comp.elt
        while isinstance(e, (ast.Subscript, ast.Attribute)):
            e = e.value
        return isinstance(e, ast.Name) and e.id == target and not any(isinstance(n, ast.Call) for n in ast.walk(comp.elt)) \
            and self.kind(comp.generators[0].iter) in ({"host", "hlist", "numpy"} | BATCHES)

    def call_kind(self, node: ast.Call) -> str | None:
        func = node.func
        name = self.dotted(func)
        if self._a_transform(func):   # transform(img) with transform = T.Compose([T.ToTensor(), ...]): made on
            return "tensor" if any(self.kind(a) in TENSORISH for a in node.args) else "host"   # the host
        if name and name.startswith("torchvision.transforms"):
            last = name.rsplit(".", 1)[-1]
            if last[:1].isupper():
                return "transform"   # T.Compose([...]), T.ToTensor(): a callable that returns host tensors
            if last in ("to_tensor", "pil_to_tensor"):
                return "host"        # TF.to_tensor(pil_image)
        if any(k.arg == "return_tensors" for k in node.keywords) and (
                _TOKENIZER.search(name_of(func)) or (isinstance(func, ast.Attribute) and _TOKENIZER.search(
                    name_of(func.value)))
                or any(k.arg == "return_tensors" and isinstance(k.value, ast.Constant) and k.value.value == "pt"
                       for k in node.keywords)):   # model.encode(text, return_tensors="pt"): a wrapper's tokenizer
            return "batch_tok"   # tokenizer(texts, return_tensors="pt"): a fresh host batch, pageable
        if name in ("copy.deepcopy", "copy.copy", "deepcopy") and len(node.args) == 1:
            return self.kind(node.args[0])   # copy.deepcopy([x.cpu() for x in outputs]): what it copies
        if SPARSE_MAKERS.match(name or "") and not any(k.arg == "device" for k in node.keywords):
            kinds = {self.kind(a) for a in node.args[:2]}   # torch.sparse.FloatTensor(i, v, size): where i, v are
            return "tensor" if kinds & TENSORISH else "host" if "host" in kinds else None
        if isinstance(func, ast.Attribute) and func.attr == "__iter__" and not node.args \
                and (k := self.iter_kind(func.value)) and k.startswith("loader"):
            return k   # iterator = self.datasets.dataloader_train.__iter__(): the loader, stepped by hand
        if name_of(func) in DICT_WRAPPERS and len(node.args) == 1 and not node.keywords \
                and (k := self.kind(node.args[0])) in BATCHES:
            return k   # self.data = EasyDict(data): the batch, its fields read as attributes
        if isinstance(func, (ast.Name, ast.Attribute)) and (_PREDICATE.search(name_of(func)) and not (
                isinstance(func, ast.Attribute) and self.kind(func.value) in TENSORISH) or isinstance(func, ast.Attribute)
                and _COUNT.search(func.attr) and not node.args):
            return "num"   # self._is_fp8_param(p), has_nan(x): a predicate answers with a Python bool
        if name in _DOTTED_WRAPPERS and node.args:   # tqdm.tqdm(loader), itertools.islice(loader, n)
            k = self.iter_kind(node.args[0])
            return k if k and k.startswith(("loader", "enum_")) else None
        if isinstance(func, ast.Name):
            if func.id in NUM_BUILTINS:
                return "num"
            if func.id == "getattr":   # getattr(param, "is_expert", False): a Python attribute someone set
                return "num" if len(node.args) > 2 and self.kind(node.args[2]) == "num" else None
            own = self.local_defs.get(func.id)
            if own is not None and own.returns is not None:   # def _avg_emulated(...) -> bool
                ann = self.annotation_kind(own.returns)
                if ann not in ("tensor", "tlist"):
                    return ann
                summary = self.return_kind(node)   # `-> torch.Tensor` names no device: what the def makes of
                return summary or ann              # these arguments does (pad() of host tensors builds on the host)
            if func.id in ("abs", "sum", "min", "max"):
                kinds = {self.kind(values_of(a)) if values_of(a) is not None else self.kind(a) for a in node.args}
                if kinds & (TENSORISH | {"tlist"}):
                    return "tensor"   # sum(losses) of device tensors is a device tensor
                return "num" if kinds <= {"num", "numpy", "host"} else None
            if func.id in ("str", "repr", "format"):
                return "str"
            if func.id.lower() in ("tqdm", "iter", "progress_bar", "trange", "cycle", "islice") and node.args:
                k = self.iter_kind(node.args[0])
                return k if k and k.startswith(("loader", "enum_")) else None   # a wrapped loader is a loader
            if func.id == "enumerate" and node.args:
                k = self.iter_kind(node.args[0])
                return "enum_" + k if k and k.startswith("loader") else None   # pbar = enumerate(loader)
            if func.id == "next" and node.args:
                k = self.iter_kind(node.args[0])
                if k is None and isinstance(node.args[0], (ast.Name, ast.Attribute)) \
                        and _DATA_ITER.search(name_of(node.args[0])):
                    return "batch"   # next(self.train_iter): a batch of a loader passed in (host, pinned or not)
                if k is None and kept_loader(node.args[0]):
                    return "batch"   # next(self.dataloaders['train']): a loader (or its endless wrapper) kept by key
                return ITEM_KIND.get(k) if k and k.startswith("loader") else None
        if getattr(self, "cuda_type", None) and self.cuda_type(func):
            return "mask" if self.cuda_mask_type(func) and node.args else "tensor"   # dtype(np_array) with dtype =
            # torch.cuda.FloatTensor if x.is_cuda else ...: on the device (a ByteTensor of flags: a mask)
        if name:
            root, _, last = name.rpartition(".")
            if last == "DataLoader" or "Loader" in last and self._loader_class(node.func):
                return self.loader_kind(node)
            if last == "BatchSampler":
                return "hlist"   # for indices in BatchSampler(SubsetRandomSampler(range(n)), mb, False): host index lists
            if last == "Variable" and node.args:
                return self.kind(node.args[0])   # torch.autograd.Variable(t) (old PyTorch) is t
            if last == "Parameter" and node.args and (k := self.kind(node.args[0])) in TENSORISH:
                return k   # nn.Parameter(x.to(device)): tgn's memory (one made on the host stays unknown)
            if last in LOADERS_PINNED:
                if last == "Prefetcher" and self.device_of(call_arg(node, 1, "device")) != "cpu":
                    return "loader_device"
                return "loader_pinned"
            if root in ("time", "math", "random", "os", "sys", "statistics", "os.path"):
                return "num" if root not in ("os", "os.path") else None
            if root in ("numpy", "np", "cv2"):
                if last in NP_SCALARS and len(node.args) == 1 and not node.keywords:
                    return "num"   # np.argmin(d): one position, a numpy integer that indexes as an int
                return "numpy"   # (OpenCV takes and returns numpy arrays, and tuples of floats: `cv2.mean(m)[0]`)
            if root == "numpy.random":
                return np_random_kind(node, last)
            if last in ("clip_grad_norm_", "clip_grad_norm", "get_total_norm"):
                return "tensor"  # the total norm, on the device
            if root == "torch" and last in ("from_numpy", "from_file", "frombuffer"):
                return "host"   # torch.from_file(path, ...): a CPU tensor read from disk
            if root == "torch" and last in FACTORIES:
                return self.factory_kind(node)
            if root == "torch" and last.endswith("_like") and any(
                    k.arg == "pin_memory" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords):
                return "pinned"   # torch.empty_like(x, pin_memory=True): a staging buffer in page-locked memory
            if root == "torch" and last in MASK_FUNCS:
                return "mask"
            if name == "torch.device" and node.args and self.device_of(node.args[0]) == "cpu":
                return "cpudev"
            if root == "torch" and (last.startswith("is_") or last in NOT_TENSOR_TORCH):
                return "num" if last.startswith("is_") or last == "equal" else None
            if name in ("torch.cat", "torch.stack", "torch.concat") and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in getattr(self, "mask_lists", ()):
                return "mask"   # torch.cat(fg_masks) of the masks appended per image
            if name in ("torch.cat", "torch.stack") and node.args and isinstance(node.args[0], (ast.Tuple, ast.List)) \
                    and node.args[0].elts and all(self.kind(e) == "mask" for e in node.args[0].elts):
                return "mask"   # torch.stack((torch.ones_like(j), j, k)) of masks
            if last in ("cat", "stack", "concat", "vstack", "hstack") and root == "torch" and node.args \
                    and isinstance(node.args[0], (ast.Tuple, ast.List)):
                parts = {self.kind(e) for e in node.args[0].elts}
                if parts & ({"host", "hlist"} | BATCHES) and not parts & TENSORISH:
                    return "host"   # torch.cat((labels[:, :1], boxes), 1) with host labels: one device for all parts
            if last in ("cat", "stack", "concat") and root == "torch" and node.args \
                    and isinstance(node.args[0], (ast.ListComp, ast.GeneratorExp)) and self._host_items(node.args[0]):
                return "host"   # torch.stack([x[0] for x in batch[1]]), torch.stack([processor(im) for im in images])
            if root == "torch" and last in ("ones_like", "zeros_like") and node.args and len(node.args) == 1 \
                    and not node.keywords and self.kind(node.args[0]) == "mask":
                return "mask"   # torch.ones_like(j) keeps j's bool dtype
            if root == "torch" and last.endswith("_like") and node.args and self.kind(node.args[0]) in TENSORISH \
                    and any(k.arg == "dtype" and (self.dotted(k.value) or "") in ("torch.bool", "bool")
                            for k in node.keywords):
                return "mask"   # torch.zeros_like(x0, dtype=torch.bool): LLaDA's transfer_index
            if root == "torch" and not last[:1].isupper():
                kinds = {self.kind(a.value if isinstance(a, ast.Starred) else a) for a in node.args}
                return "host" if not kinds & TENSORISH and kinds & ({"host", "hlist"} | BATCHES) else "tensor"
            if last in ("pack_padded_sequence", "pack_sequence") and root.startswith("torch.") and node.args \
                    and self.kind(node.args[0]) in BATCHES:
                return self.kind(node.args[0])   # GraphRNN's pack_padded_sequence(y, y_len).data of the host batch
            if last in ("pad_sequence", "pack_padded_sequence", "pack_sequence") and root.startswith("torch.") and node.args and (
                    self.kind(node.args[0]) in ("host", "hlist") or isinstance(node.args[0], (ast.ListComp, ast.GeneratorExp))
                    and self._host_items(node.args[0])):
                return "host"   # pad_sequence([torch.tensor(ids) for ids in texts]): F5-TTS's list_str_to_idx
            if root.startswith("torch.") and root.split(".")[1] in ("nn", "linalg", "fft", "special") \
                    and not last[:1].isupper() and root != "torch.nn" and "init" not in root and "utils" not in root:
                kinds = {self.kind(a.value if isinstance(a, ast.Starred) else a) for a in node.args[:1]}
                return "host" if kinds & {"host", "hlist"} else "tensor"   # F.softmax(torch.from_numpy(p)) stays there
            if root.startswith("torch."):
                return None
            if last[:1].isupper() and getattr(self, "project", None) is not None and self.project.class_of(
                    self.src, node.func) is None and (wrapped := next(
                        (k for a in node.args[1:3] if (k := self.iter_kind(a)) and k.startswith("loader")), None)):
                return wrapped   # LogProgress(logger, loader, total=n) (dora): a library's progress wrapper is the loader
            if last[:1].isupper():
                return "obj"  # a class: a module, a meter, a config; not a tensor
        if looped := self._looped_loader(node):
            return looped   # infiniteloop(dataloader): a generator that yields a loader's batches is that loader
        if not node.args and not node.keywords and self.is_model(func) and self._forward_of_nothing(func):
            return "tensor"   # emb = model(): a forward of no input, propagating the module's own tables
        summary = self.return_kind(node)
        numpy_in = isinstance(func, ast.Name) and not node.keywords and {self.kind(a) for a in node.args} == {"numpy"}
        if summary is not None:
            return summary or ("host" if numpy_in else None)   # "": a project function returning a mixed tuple
        if id(node) in getattr(self, "read_defs", ()) and not (self.named_model(func) and (node.args or node.keywords)):
            return "host" if numpy_in else None   # a project def read that returns nothing certain: no guess (but
            # a model's forward that returns a loss on one path and predictions on the other still gives tensors)
        if isinstance(func, ast.Attribute) and func.attr in DEVICE_WRAPPERS and len(node.args) == 1:
            k = self.iter_kind(node.args[0])
            if k and k.startswith("loader"):
                return "loader_device"   # accelerator.prepare(loader): its batches arrive on the device
        if isinstance(func, ast.Attribute) and func.attr == "skip_first_batches" and node.args:
            k = self.iter_kind(node.args[0])
            if k and k.startswith("loader"):
                return k   # accelerator.skip_first_batches(loader, n): the same loader, resumed
        if isinstance(func, ast.Attribute) and func.attr == "tokenize" and isinstance(func.value, ast.Name) \
                and func.value.id in getattr(getattr(self, "src", None), "imports", {}):
            return "host"    # clip.tokenize(texts): a module's tokenizer makes the ids on the host
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and _OWN_TOKENIZER.fullmatch(func.attr) and not {self.kind(a) for a in node.args} & TENSORISH:
            return "host"    # self.tokenizer_encode(prompt): a tokenizer the object was handed, ids on the host
        if isinstance(func, ast.Attribute):
            return self.method_kind(node, func)
        if _HOST_MAKER.search(name_of(func)) and not {self.kind(a) for a in node.args} & TENSORISH:
            return "host"    # tokenizer(text).input_ids, image_processor(img): a tokenizer's ids are made on the host
        if self.is_model(func) and node.args and self.kind(node.args[0]) == "numpy":
            return None      # policy(np.expand_dims(obs, 0)): no module takes numpy; a wrapper's result is unknown
        if re.search(r"loss|criterion", name_of(func), re.I) and not self.is_model(func) and node.args \
                and {self.kind(a) for a in node.args} <= {"host"}:
            return "host"    # criterion(pred.cpu(), true.cpu()): a loss of host tensors is one
        if (self.is_model(func) and (node.args or node.keywords or self._forward_of_nothing(func))) \
                or re.search(r"loss|criterion", name_of(func), re.I):
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
        if method == "copy" and not node.args and recv in ("hlist", "tlist", "numpy"):
            return recv   # indices.copy(): a shallow copy of the list holds the same tensors
        if method == "apply" and isinstance(func.value, ast.Name) and func.value.id.lstrip("_")[:1].isupper():
            return next((k for a in node.args if (k := self.kind(a)) in TENSORISH), None)   # AllReduce.apply(loss):
            # an autograd Function's output is where its input is
        if method in _GATHERS and len(node.args) == 1 and recv not in TENSORISH:
            arg = node.args[0]   # accelerator.gather_for_metrics((preds, labels)): the ranks' device tensors
            items = arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]
            if {self.kind(a) for a in items} <= TENSORISH:
                return "tlist" if isinstance(arg, (ast.Tuple, ast.List)) else "tensor"
        if method == "type" and node.args and (self.kind(node.args[0]) == "ttype" or getattr(
                self, "cuda_type", None) and self.cuda_type(node.args[0])):
            return "tensor"   # x.type(torch.cuda.FloatTensor), x.type(dtype) with dtype = xin[0].type()
        if method == "type" and not node.args and not node.keywords and recv not in HOSTISH:
            return "ttype"   # xin[0].type(): 'torch.cuda.FloatTensor', a type name that moves what it is given
        to = self.dotted(node.args[0]) or "" if method == "type" and len(node.args) == 1 else ""
        if recv in BATCHES and _CPU_TENSOR_TYPE.fullmatch(to):
            return recv   # inputs.type(torch.FloatTensor): the batch in another dtype, still on the host
        if recv in ("host", "pinned") and ("dtype" in to.rsplit(".", 1)[-1].lower() or _CPU_TENSOR_TYPE.fullmatch(to)
                                           or re.fullmatch(r"torch\.(float|int|uint|bfloat|bool|long|half|double)\w*", to)):
            return "host"   # torch.from_numpy(x).type(dtype): a host tensor of another dtype, still on the host
        if method in ("type", "to") and recv in TENSORISH and to in ("torch.bool", "bool"):
            return "mask"   # torch.floor(r).type(torch.bool): NGCF's sparse dropout mask, on the device
        if method == "type_as" and node.args and self.kind(node.args[0]) in TENSORISH:
            return "tensor"
        if method == "type_as" and node.args and self.kind(node.args[0]) is None and recv in ("host", "pinned"):
            return None   # host.type_as(t) with t unknown: on t's device, wherever that is (often the GPU's)
        if method in NUMBER_METHODS or method.startswith(("is_", "has_")) and method != "is_nonzero":
            return "num"   # sharded_info.is_tp_sharded(...), t.is_contiguous(): predicates (t.is_nonzero() reads t)
        if method in STR_METHODS or recv == "str":
            return "str" if method in STR_METHODS else None
        if recv == "numpy" and method in NP_SCALARS and not node.args and not node.keywords:
            return "num"   # (np.abs(a - v)).argmin(): a numpy integer; indexing a device tensor with it copies nothing
        if recv in ("numpy", "num"):
            return recv
        if method == "reset" and getattr(self, "cpu_env", None) and self.cpu_env(func.value):
            return "numpy"   # state = env.reset() of a gym environment: a numpy observation
        if method in ("cuda", "to"):
            if recv == "obj" or (recv is None and self.is_model(func.value)):
                return "obj"  # model.to(device) is still a module
            if recv is None and loaded_module(func.value):
                return "obj"  # pickle.load(f)['ema'].to(device), torch.load(...)['model'].cuda(): a module moved
            target = self.copy_target(node)
            if target == "cuda":   # (cost.sum(0) > 0).to(device): a mask moved is a mask (unless a dtype is named)
                return "mask" if recv == "mask" and len(node.args) + len(node.keywords) == 1 else "tensor"
            if target == "cpu":
                return "host"
            if recv in ("pinned", "batch_pinned"):
                return "host" if recv == "pinned" else "batch_host"  # .to(dtype) makes a pageable copy
            return recv
        if method in _DIST_METHODS and isinstance(func.value, ast.Name) and self.lookup(func.value.id + "#ddist"):
            return "tensor"   # probs.sample(), probs.log_prob(a) of a distribution of device tensors
        if method in ("sample", "rsample", "sample_n") and (isinstance(func.value, ast.Name) and self.lookup(
                func.value.id + "#hdist") or isinstance(func.value, ast.Call) and self.host_dist(func.value)):
            return "host"     # Normal(0, 1).sample(shape), MaskGIT's Gumbel(0, 1).sample(s): drawn on the host
        if method == "get" and recv in BATCHES and node.args:
            return recv   # data.get('cond_image'): a field of the batch, where the batch is
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
        if method.startswith("forward_") and node.args and self.is_model(func.value):
            return "tensor"   # target_model.forward_(next_states), model.forward_features(x): a forward by another name
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
        if name.rsplit(".", 1)[-1] in ("normal", "bernoulli") and "device" not in kw \
                and any(self.kind(a) in TENSORISH for a in node.args[:2]):
            return "tensor"   # torch.normal(mean_t, std_t), torch.bernoulli(p): drawn where the tensors handed are
        if splatted(node):
            return None   # torch.randint(*args, **kwargs): the device may be in kwargs
        if "device" in kw and self.device_of(kw["device"]) != "cpu":
            dtype = self.dotted(kw["dtype"]) if "dtype" in kw else ""
            return "mask" if dtype in ("torch.bool", "bool") else "tensor"
        pin = kw.get("pin_memory")
        if pin is not None and not (isinstance(pin, ast.Constant) and not pin.value):
            return "pinned"
        return "tensor" if "device" not in kw and self.default_cuda(name, node) else "host"

    def default_cuda(self, name: str, node: ast.Call | None = None) -> bool:
        """The project sets a CUDA default tensor type: torch.zeros(...), torch.tensor(obs) with no device=
        make CUDA tensors; the typed constructors (`torch.LongTensor(n)`) stay on the host (and
        `torch.Tensor(n)`, a reading the judges left on the host, but not `torch.Tensor([10.])`, a list
        copied to the default device: NeRF's mse2psnr), and so does `torch.from_numpy`, which
        shares the array's host memory whatever the default type."""
        leaf = name.rsplit(".", 1)[-1]
        listed = leaf == "Tensor" and node is not None and node.args and isinstance(node.args[0], (ast.List, ast.Tuple))
        return (leaf[:1].islower() and leaf != "from_numpy" or bool(listed)) \
            and getattr(getattr(self, "project", None), "default_cuda", False)   # torch.Tensor([1e10]): data, made there

    def _forward_of_nothing(self, func: ast.AST) -> bool:
        """`model()` of a project module whose forward takes no input (SELFRec's graph encoders propagate their own
        embedding tables and return them): still a forward, of device tensors."""
        project, scope = getattr(self, "project", None), self.defs[-1] if self.defs else None
        insts = project.instances_of(self.src, func, scope, self.types) if project is not None else []
        if not insts and isinstance(func, ast.Name) and project is not None:   # model = self.model.cuda()
            insts = [i for c in assigned_calls(self.src, func.id, scope)[:2] if isinstance(c.func, ast.Attribute)
                     and c.func.attr in ("cuda", "to") for i in project.instances_of(self.src, c.func.value, scope)]
        fwd = [d for s, c in insts[:2] if (d := project.method(s, c, "forward"))]
        return bool(fwd) and all(len(d[1].args.args) - len(d[1].args.defaults) == 1 and not d[1].args.vararg
                                 for d in fwd)   # forward(self, perturbed=False): its inputs all have defaults

    def _looped_loader(self, node: ast.Call) -> str | None:
        """The loader kind of the argument a project generator loops over and yields from (`def infiniteloop(dl):
        while True: for x, y in iter(dl): yield x`); a device loader when it yields only what it moves there."""
        project = getattr(self, "project", None)
        if project is None or not isinstance(node.func, ast.Name) or node.func.id not in project.generators:
            return None
        for _, fn in project.resolve(self.src, node, self.defs[-1] if self.defs else None, self.types)[:1]:
            if (moved := yields_on_device(fn)) or yields_host_lists(fn):   # modded-nanogpt's data generator moves
                return "loader_device" if moved else "loader_index"   # what it yields; SELFRec's yields id lists
            params = [a.arg for a in fn.args.args]
            for loop in (n for n in ast.walk(fn) if isinstance(n, ast.For)):
                it = loop.iter
                while isinstance(it, ast.Call) and name_of(it.func) in ("iter", "enumerate") and it.args:
                    it = it.args[0]   # `for _, y in enumerate(dataloader): yield y` (CoDi)
                if isinstance(it, ast.Name) and it.id in params[:len(node.args)] \
                        and any(isinstance(y, (ast.Yield, ast.YieldFrom)) for y in ast.walk(loop)):
                    k = self.iter_kind(node.args[params.index(it.id)])
                    return k if k and k.startswith("loader") else None
        return None

    def _a_transform(self, func: ast.AST) -> bool:
        """A name (or `self.` attribute) bound to a torchvision transform: its call converts a PIL image or
        an array into a host tensor (a device tensor handed in stays there)."""
        if isinstance(func, ast.Name):
            return self.lookup(func.id) == "transform"
        if isinstance(func, ast.Call):   # transforms.ToTensor()(image): made and called on one line
            return self.call_kind(func) == "transform"
        return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
            and self.self_attrs.get(func.attr) == "transform"

    def _loader_class(self, func: ast.AST) -> bool:
        """`DataLoaderX(ds, pin_memory=...)`: a project class whose base is torch's DataLoader."""
        project = getattr(self, "project", None)
        hit = project.class_of(self.src, func) if project is not None and isinstance(func, (ast.Name, ast.Attribute)) \
            else None
        return hit is not None and any((self.dotted(b) or "").rsplit(".", 1)[-1] == "DataLoader" for b in hit[1].bases)

    def loader_kind(self, node: ast.Call) -> str:
        data = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "dataset"), None)
        if isinstance(data, ast.Call) and name_of(data.func) in ("range", "arange") \
                and not any(k.arg == "device" for k in data.keywords):
            return "loader_index"   # DataLoader(range(n), bs, shuffle=True): batches of host indices (PyG's edge loops)
        if device_dataset(self.src, data, self.defs[-1] if self.defs else None, self.kind):
            return "loader_device"   # DataLoader(TensorDataset(x.to(dev))): slices of device tensors (CTGAN's TVAE)
        pin = next((k.value for k in node.keywords if k.arg == "pin_memory"), None)
        if pin is None and any(k.arg is None for k in node.keywords):
            return "loader"  # DataLoader(ds, **kwargs): pinning decided elsewhere
        if pin is None or (isinstance(pin, ast.Constant) and not pin.value):
            return "loader_pageable"
        project = getattr(self, "project", None)
        if isinstance(pin, ast.Attribute) and project is not None \
                and project.attr_values.get(pin.attr) in ({False}, {False, None}):
            return "loader_pageable"   # pin_memory=cfg.PIN_MEMORY with `_C.PIN_MEMORY = False` its only setting
        return "loader_pinned"

    def iter_kind(self, it: ast.AST, unpacked: bool = False) -> str | None:
        """The kind of the iterable of a `for`: a known loader, or one by its name (`train_loader`)."""
        k = self.kind(it)
        if k in (None, "obj") and isinstance(it, (ast.Name, ast.Attribute)) and LOADER_NAME.search(name_of(it)):
            return "loader"
        if k in (None, "obj") and isinstance(it, ast.Subscript) and (isinstance(it.slice, ast.Constant) and isinstance(
                it.slice.value, str) and LOADER_NAME.search(it.slice.value) or isinstance(it.slice, (ast.Name, ast.Constant))
                and isinstance(it.value, (ast.Name, ast.Attribute)) and LOADER_NAME.search(name_of(it.value))):
            return "loader"   # self.dataloader['train_loader'], self.data_loader[ln], self.data_loader["dev"]: kept in a dict
        if k in (None, "obj") and unpacked and isinstance(it, (ast.Name, ast.Attribute)) \
                and set(re.split(r"_", name_of(it).lower())) & _DATA_WORDS:
            return "loader"   # for source, targets in self.train_data: a dataset's (x, y) pairs
        if k in (None, "obj") and isinstance(it, ast.Call) and it.args and not isinstance(it.args[0], ast.Starred):
            inner = self.iter_kind(it.args[0])   # tqdm(loader), logger.log_every(loader, 10), islice(loader, n)
            return inner if inner and inner.startswith("loader") else k
        return k
