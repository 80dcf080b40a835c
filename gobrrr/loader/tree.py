"""Walk a nested batch: find its tensors, or rebuild it with every tensor replaced.

A batch is a tensor or any nesting of dict, list, tuple, namedtuple and dataclass around
tensors and other values. `map_tensors(fn, batch)` returns the same structure with
`fn(t)` in place of every tensor; everything else (ints, strings, None, numpy arrays)
passes through untouched. Container types are kept exactly: an OrderedDict stays an
OrderedDict, a namedtuple keeps its class, a dataclass instance is copied field by field
(frozen ones too) so fields with `init=False` survive.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import torch


def tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor leaf of `batch`, depth first, in the order `map_tensors` visits them."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for v in batch.values():
            yield from tensors(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from tensors(v)
    elif _is_dataclass_instance(batch):
        for f in dataclasses.fields(batch):
            yield from tensors(getattr(batch, f.name))


def map_tensors(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """`batch` with `fn(t)` in place of every tensor `t`; structure and other leaves unchanged."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        items = [(k, map_tensors(fn, v)) for k, v in batch.items()]
        return _rebuild_mapping(batch, items)
    if _is_namedtuple(batch):
        return type(batch)(*(map_tensors(fn, v) for v in batch))
    if isinstance(batch, tuple):
        values = [map_tensors(fn, v) for v in batch]
        return tuple(values) if type(batch) is tuple else type(batch)(values)
    if isinstance(batch, list):
        values = [map_tensors(fn, v) for v in batch]
        if type(batch) is list:
            return values
        out = copy.copy(batch)  # a list subclass: keep its class and attributes
        out[:] = values
        return out
    if _is_dataclass_instance(batch):
        out = copy.copy(batch)
        for f in dataclasses.fields(batch):
            # object.__setattr__ also writes the fields of a frozen dataclass
            object.__setattr__(out, f.name, map_tensors(fn, getattr(batch, f.name)))
        return out
    return batch


def _rebuild_mapping(original: Mapping, items: list[tuple[Any, Any]]) -> Mapping:
    if type(original) is dict:
        return dict(items)
    try:
        out = copy.copy(original)  # keeps the class, a defaultdict's factory, an OrderedDict's order
        for k, v in items:
            out[k] = v
        return out
    except TypeError:  # an immutable mapping (e.g. MappingProxyType): a plain dict is the honest rebuild
        return dict(items)


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _is_dataclass_instance(x: Any) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)
