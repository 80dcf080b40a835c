"""The names torch, Python and the common training libraries give to what they return, grouped by kind.

kinds.py and callkinds.py read these tables to give a name its kind (what it holds); the rules read the groups of kinds
(TENSORISH, HOSTISH, BATCHES) to decide what may sync. A table per question:

    FACTORIES, DATA_FACTORIES   torch functions that make a tensor (from nothing / from host data)
    NUMBER_*, STR_METHODS       attributes and methods that answer with a Python number or string
    NOT_TENSOR_*                methods and torch functions that never give a tensor
    MASK_FUNCS, DATA_DEPENDENT  ops that give a boolean mask / a data-dependent shape (nonzero, unique)
    VIEW_METHODS, DTYPE_METHODS, TENSOR_METHODS    tensor methods that keep the tensor's device
    DEVICE_WRAPPERS, LOADERS_PINNED                 calls that put a loader's batches on the device / pin them
    TENSORISH, HOSTISH, BATCHES, ITEM_KIND          groups of kinds, and what iterating a kind gives
"""
from __future__ import annotations

import ast
import re

FACTORIES = {"randn", "rand", "randint", "randperm", "zeros", "ones", "empty", "full", "arange", "range", "linspace",
             "logspace", "eye", "tensor", "as_tensor", "normal", "bernoulli", "tril_indices", "triu_indices",
             "Tensor", "FloatTensor", "LongTensor", "IntTensor", "BoolTensor", "HalfTensor", "DoubleTensor",
             "ByteTensor", "hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window"}
DATA_FACTORIES = {"tensor", "as_tensor", "Tensor", "FloatTensor", "LongTensor", "IntTensor", "BoolTensor",
                  "HalfTensor", "DoubleTensor", "ByteTensor", "from_numpy"}
NUMBER_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad", "is_leaf", "itemsize", "nbytes",
                "training", "layout", "is_sparse", "is_quantized", "is_meta", "names",
                "placements", "device_mesh",   # a DTensor's layout: Python objects
                "batch_size"}   # x.batch_size of a sparse-conv tensor or a batch object: an int beside the tensors
NUMBER_METHODS = {"item", "size", "dim", "numel", "nelement", "ndimension", "element_size", "get_device",
                  "data_ptr", "is_pinned", "is_contiguous", "is_floating_point", "stride", "storage_offset",
                  "is_complex", "is_set_to", "is_shared", "is_signed", "is_inference",
                  "endswith", "startswith", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper",
                  "isidentifier", "isnumeric", "isdecimal", "count", "find", "index", "rfind", "__len__",
                  "issuperset", "issubset", "isdisjoint"}   # set(batch).issuperset(keys): a Python bool
STR_METHODS = {"batch_decode", "convert_ids_to_tokens", "lower", "upper", "strip", "lstrip", "rstrip", "replace",
               "join", "format", "capitalize", "title", "removeprefix", "removesuffix", "zfill", "ljust", "rjust",
               "center", "casefold", "encode", "decode"}
NOT_TENSOR_METHODS = {"parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules",
                      "children", "named_children", "state_dict", "keys", "items", "values", "get", "train", "eval",
                      "zero_grad", "register_hook", "register_forward_hook", "apply", "append", "extend", "update",
                      "type", "tolist", "split_with_sizes", "untyped_storage", "storage", "__class__",
                      "has", "get_fields"}   # detectron2 Instances: no tensor has them
MASK_FUNCS = {"isnan", "isinf", "isfinite", "logical_and", "logical_or", "logical_not", "logical_xor",
              "eq", "ne", "gt", "ge", "lt", "le", "isin", "isclose", "signbit", "isneginf", "isposinf"}
NUM_BUILTINS = {"len", "int", "float", "bool", "round", "ord", "hash", "isinstance", "issubclass", "hasattr", "type",
                "callable", "id", "any", "all",
                # inspect's predicates, imported bare: `d() if isfunction(d) else d`
                "isfunction", "isclass", "ismethod", "ismodule", "isroutine", "isbuiltin", "iscoroutinefunction",
                "isgeneratorfunction", "isabstract"}
NOT_TENSOR_TORCH = {"is_tensor", "is_floating_point", "is_complex", "is_nonzero", "is_storage", "is_grad_enabled",
                    "is_inference_mode_enabled", "is_autocast_enabled", "numel", "device", "dtype", "no_grad",
                    "inference_mode", "manual_seed", "seed", "save", "load", "compile", "set_grad_enabled",
                    "enable_grad", "get_default_dtype", "set_default_dtype", "Generator", "Size", "finfo", "iinfo",
                    "set_float32_matmul_precision", "use_deterministic_algorithms", "equal", "set_printoptions",
                    "autocast", "get_rng_state", "set_rng_state", "typename", "result_type", "promote_types",
                    "can_cast", "get_num_threads", "set_num_threads"}
VIEW_METHODS = {"view", "reshape", "narrow", "squeeze", "unsqueeze", "flatten", "permute", "transpose", "t",
                "expand", "expand_as", "select", "split", "chunk", "unbind", "detach", "view_as", "contiguous"}
DTYPE_METHODS = {"float", "half", "bfloat16", "double", "long", "int", "short", "bool", "byte", "char", "type_as"}
# methods that name a tensor operation: on an unknown receiver, evidence that it is a tensor
TENSOR_METHODS = {"any", "all", "sum", "mean", "max", "min", "norm", "argmax", "argmin", "std", "var", "detach", "abs",
                  "sqrt", "exp", "log", "softmax", "log_softmax", "float", "half", "bfloat16", "clone", "squeeze",
                  "unsqueeze", "view", "reshape", "argsort", "topk"}
DATA_DEPENDENT = {"nonzero", "unique", "unique_consecutive", "masked_select", "argwhere"}
DEVICE_WRAPPERS = {"prepare", "prepare_data_loader", "setup_dataloaders"}   # accelerate / Lightning Fabric
DICT_WRAPPERS = {"dict", "EasyDict", "edict", "AttrDict", "Munch", "DotMap", "Box"}   # a batch dict seen another way
SPARSE_MAKERS = re.compile(r"^torch\.(sparse\.[A-Z]\w*Tensor|sparse_(coo|csr|csc)_tensor)$")   # made where i, v are
GIVEN = "<given>"   # param#val of a parameter a call hands a number or a tensor: `is None` is False in that call
HANDED = {"num", "str", "tensor", "mask", "host", "pinned", "numpy"}   # the kinds that are never None
LOADERS_PINNED = {"Prefetcher", "PinnedWorkerLoader", "from_dataloader"}
COMPILED = "<torch.compile>"   # in Checker.functions: a @torch.compile'd def runs this code
TENSORISH = {"tensor", "mask", "generated"}   # generated: model.generate()'s tokens, made to be read on the host
BATCHES = {"batch_host", "batch_pinned", "batch", "batch_tok"}   # batch_tok: a tokenizer's return_tensors="pt" output
HOSTISH = {"num", "host", "pinned", "numpy", "str", "ttype", "obj", "hlist", "cpudev", "loader_pinned", "loader_pageable",
           "loader_device", "loader_index", "transform",
           "loader", *BATCHES}
# what iterating (or unpacking) a value of one kind gives
ITEM_KIND = {"loader_pageable": "batch_host", "loader_pinned": "batch_pinned", "loader_device": "tensor",
             "loader": "batch", "host": "host", "pinned": "pinned", "tensor": "tensor", "mask": "mask",
             "batch_host": "batch_host", "batch_pinned": "batch_pinned", "batch": "batch", "numpy": "numpy",
             "tlist": "tensor", "hlist": "hlist", "loader_index": "host"}


# numpy.random's draws: the position of `size` (None: any argument is a dimension, as rand(3, 4))
_NP_SIZE = {"randint": 2, "choice": 1, "uniform": 2, "normal": 2, "random": 0, "random_sample": 0, "rand": None,
            "randn": None, "binomial": 2, "poisson": 1, "exponential": 1, "beta": 2, "gamma": 2}


def np_random_kind(node: ast.Call, last: str) -> str | None:
    """np.random.randint(0, n, size=b), np.random.choice(n, b), np.random.permutation(n): a numpy array
    (a host index, a replay buffer's sample); the draw of one number (no size) is a number."""
    if last in ("permutation", "default_rng", "RandomState", "Generator"):
        return "numpy"   # a generator's draws (`rng.choice(pool, k).tolist()`) are numpy, as np.random's own
    if last not in _NP_SIZE:
        return None   # np.random.seed(), shuffle(): no array
    pos = _NP_SIZE[last]
    if pos is None:
        return "numpy" if node.args else "num"
    size = call_arg(node, pos, "size")
    return "num" if size is None or isinstance(size, ast.Constant) and size.value is None else "numpy"


NP_SCALARS = {"argmin", "argmax"}   # numpy reductions over the whole array, with no axis: one index


def values_of(node: ast.AST) -> ast.AST | None:
    """The dict of `d.values()` (sum(loss_dict.values()) sums what the dict holds), else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "values" \
            and not node.args and not node.keywords:
        return node.func.value
    return None


def splatted(call: ast.Call) -> bool:
    """`torch.zeros(*sizes, **kwargs)` with no device= of its own: the device, if any, comes in the kwargs."""
    return any(k.arg is None for k in call.keywords) and not any(k.arg == "device" for k in call.keywords)


def call_arg(node: ast.Call, pos: int, name: str) -> ast.AST | None:
    for k in node.keywords:
        if k.arg == name:
            return k.value
    return node.args[pos] if len(node.args) > pos else None


def folder_key(part: str) -> str:
    """A folder's name as an object key, each word singular: `dense_heads` -> densehead, `backbones_3d` ->
    backbone3d, `necks` -> neck."""
    words = [w[:-2] if w.endswith("sses") else w[:-1] if w.endswith("s") and not w.endswith("ss") and len(w) > 3
             else w for w in part.lower().split("_")]
    return "".join(words)


def object_key(recv: ast.AST) -> str:
    """An object's last name, lower-cased, without underscores or an `_obj`/`_fn` suffix: the key a class is
    named after (`replay_buffer` -> replaybuffer, `predictor_obj` -> predictor)."""
    name = recv.id if isinstance(recv, ast.Name) else recv.attr if isinstance(recv, ast.Attribute) else ""
    return re.sub(r"_(obj|object|fn|inst|instance)$", "", name).replace("_", "").lower()


def index_parts(node: ast.Subscript) -> list[ast.AST]:
    """The indices of a subscript, one per dimension: `t[i, mask]` gives [i, mask], `t[i]` gives [i]."""
    return node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]


def self_attr(node: ast.AST) -> bool:
    """`self.x`: an attribute of the instance a method runs on."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
