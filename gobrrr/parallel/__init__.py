"""Parallelism applied to an unmodified model: `ddp(model)`, `zero(model, optimizer, stage)`; tensor parallel next."""
from gobrrr.parallel.ddp import DDP, NaiveDDP, ddp, no_sync
from gobrrr.parallel.zero import NaiveZero1, Zero12, ZeroOptimizer, memory_report, zero
from gobrrr.parallel.zero3 import Zero3

__all__ = ["DDP", "NaiveDDP", "ddp", "no_sync", "zero", "memory_report", "NaiveZero1", "Zero12", "Zero3",
           "ZeroOptimizer"]
