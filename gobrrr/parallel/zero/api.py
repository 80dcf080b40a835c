"""`zero(model, optimizer, stage)`: pick and build a ZeRO stage; `memory_report(model)`: its bytes.

The stages are stages.py (NaiveZero1, Zero12: stages 1-2) and zero3.py (Zero3); this file only
chooses among them, so neither needs to import the other.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from gobrrr.parallel.zero.base import OptimizerArg, ZeroConfig, _ZeroBase
from gobrrr.parallel.zero.optim import ZeroOptimizer
from gobrrr.parallel.zero.shard import MemoryReport
from gobrrr.parallel.zero.stages import NaiveZero1, Zero12
from gobrrr.parallel.zero.zero3 import Zero3


def zero(model: nn.Module, optimizer: OptimizerArg, *, stage: int = 2, group=None, naive: bool = False,
         param_dtype: torch.dtype | None = None, grad_dtype: torch.dtype | None = None, bucket_mb: float = 25,
         first_bucket_mb: float = 1, accumulate: str = "sharded", reshard_after_forward: bool = True,
         wrap_rule: Callable[[nn.Module], list[nn.Module]] | None = None):
    """Shard `model` and its optimizer over the ranks of `group`; return (wrapped model, optimizer).

    optimizer: an optimizer over `model`'s parameters that has not stepped yet, or a function
    model -> optimizer. Its param groups and hyper-parameters are kept; its parameters become this
    rank's fp32 master shards. param_dtype=torch.bfloat16: bf16 compute parameters, fp32 masters.
    naive=True (stage 1 only): `NaiveZero1`. wrap_rule (stage 3): model -> the modules to shard as
    units (default: every child of every nn.ModuleList); the root unit holds the rest.
    """
    if naive:
        if stage != 1:
            raise ValueError(f"zero: the naive version is stage 1 only, got stage {stage}; drop naive=True.")
        wrapped = NaiveZero1(model, optimizer, group)
        return wrapped, ZeroOptimizer(wrapped)
    cfg = ZeroConfig(stage, param_dtype, grad_dtype, bucket_mb, first_bucket_mb, accumulate, reshard_after_forward)
    if stage == 3:
        wrapped = Zero3(model, optimizer, cfg, group, wrap_rule)
    else:
        wrapped = Zero12(model, optimizer, cfg, group)
    return wrapped, ZeroOptimizer(wrapped)


def memory_report(model: nn.Module) -> MemoryReport:
    """Bytes of parameters, gradients and optimizer state this rank holds, beside the stage's formula."""
    if not isinstance(model, _ZeroBase):
        raise TypeError(f"memory_report: {type(model).__name__} is not wrapped by gobrrr.parallel.zero; "
                        "wrap it first with model, opt = gobrrr.parallel.zero(model, optimizer, stage=...).")
    return model.memory_report()
