"""Which torch calls block the host, and as what kind of sync: the rules behind the sync detective's wrappers.

Each rule looks at a call's arguments, before the call, and returns the kind of sync it makes
("item", "d2h_copy", ...) or None when the call does not block the host (a CPU tensor's `.item()`,
a pinned `non_blocking` copy, a device-to-device copy). `targets()` lists every entry point
gobrrr.syncs wraps while someone watches, with its rule. Host and device in one table:

    copy                        blocking        non_blocking
    device -> host              d2h_copy        async into pinned memory; pageable: a sync
    host (pageable) -> device   h2d_copy        pageable_non_blocking_copy (CUDA stages it and waits)
    host (pinned) -> device     h2d_copy        async
"""
from __future__ import annotations

from typing import Callable

import torch


def cuda_read(kind: str) -> Callable:
    def rule(args, kwargs):
        self = args[0] if args else None
        return kind if isinstance(self, torch.Tensor) and self.is_cuda else None
    return rule


def repr_rule(kind: str) -> Callable:
    def rule(args, kwargs):
        self = args[0] if args else None
        return kind if isinstance(self, torch.Tensor) and self.is_cuda and self.numel() > 0 else None
    return rule


def numpy_rule(args, kwargs):
    self = args[0]
    force = kwargs.get("force", args[1] if len(args) > 1 else False)
    return "numpy" if self.is_cuda and force else None


def index_rule(args, kwargs):
    self, index = args[0], args[1] if len(args) > 1 else None
    if not self.is_cuda:
        return None
    items = index if isinstance(index, tuple) else (index,)
    for i in items:
        if isinstance(i, torch.Tensor) and i.is_cuda and i.dtype in (torch.bool, torch.uint8):
            return "bool_mask_index"
    return None


def copy_kind(src: torch.Tensor, dst_is_cuda: bool, dst_pinned: Callable[[], bool], non_blocking: bool):
    """Classify a copy between host and device; None when it does not block the host."""
    if src.is_cuda and not dst_is_cuda:
        if not non_blocking:
            return "d2h_copy"
        return None if dst_pinned() else "pageable_non_blocking_copy"
    if not src.is_cuda and dst_is_cuda and src.device.type == "cpu":
        if not non_blocking:
            return "h2d_copy"
        return None if src.is_pinned() else "pageable_non_blocking_copy"
    return None


def to_rule(args, kwargs):
    self = args[0]
    try:
        device, _dtype, non_blocking, _fmt = torch._C._nn._parse_to(*args[1:], **kwargs)
    except (TypeError, RuntimeError, AttributeError):
        return None
    if device is None:
        return None
    # D2H with non_blocking lands in pinned memory that torch allocates: never pageable
    return copy_kind(self, device.type == "cuda", lambda: True, bool(non_blocking))


def cuda_rule(args, kwargs):
    self = args[0]
    non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
    return copy_kind(self, True, lambda: True, bool(non_blocking))


def copy_rule(args, kwargs):
    dst = args[0]
    src = args[1] if len(args) > 1 else kwargs.get("src")
    non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
    if not isinstance(src, torch.Tensor):
        return None
    if src.is_cuda and dst.device.type == "cpu":
        return copy_kind(src, False, dst.is_pinned, bool(non_blocking))
    if dst.is_cuda:
        return copy_kind(src, True, lambda: True, bool(non_blocking))
    return None


def first_tensor_rule(kind: str) -> Callable:
    def rule(args, kwargs):
        x = args[0] if args else kwargs.get("input")
        return kind if isinstance(x, torch.Tensor) and x.is_cuda else None
    return rule


def always(kind: str) -> Callable:
    return lambda args, kwargs: kind


DEFAULT_KIND = {"__bool__": "bool", "__float__": "float", "__int__": "int", "__index__": "index",
               "__complex__": "complex", "__repr__": "print", "__format__": "format",
               "__getitem__": "bool_mask_index", "to": "copy", "cuda": "copy", "copy_": "copy",
               "argwhere": "nonzero", "unique_consecutive": "unique"}


def targets() -> list:
    """(owner, attribute, rule) for every entry point we wrap while watching."""
    T = torch.Tensor
    out = [(T, n, cuda_read(DEFAULT_KIND.get(n, n))) for n in
           ("item", "tolist", "cpu", "__bool__", "__float__", "__int__", "__index__", "__complex__")]
    out += [(T, "numpy", numpy_rule), (T, "__repr__", repr_rule("print")), (T, "__format__", repr_rule("format")),
            (T, "__getitem__", index_rule), (T, "to", to_rule), (T, "cuda", cuda_rule), (T, "copy_", copy_rule)]
    for name, kind in (("nonzero", "nonzero"), ("argwhere", "nonzero"), ("masked_select", "masked_select")):
        out += [(T, name, first_tensor_rule(kind)), (torch, name, first_tensor_rule(kind))]
    out += [(torch, "unique", first_tensor_rule("unique")), (torch, "unique_consecutive", first_tensor_rule("unique"))]
    out += [(torch.cuda, "synchronize", always("device_synchronize"))]
    for cls, kind in ((getattr(torch.cuda, "Stream", None), "stream_synchronize"),
                      (getattr(torch.cuda, "Event", None), "event_synchronize")):
        if isinstance(cls, type) and "synchronize" in cls.__dict__:
            out.append((cls, "synchronize", always(kind)))
    return out
