"""Parallelism applied to an unmodified model: `ddp(model)`, `zero(model, optimizer, stage)`, `tp(model, mesh)`."""
from gobrrr.parallel.ddp import DDP, NaiveDDP, ddp, no_sync
from gobrrr.parallel.mesh import make_mesh
from gobrrr.parallel.tp.parallelize import GPT_PLAN, loss_parallel, tp, tp_state
from gobrrr.parallel.tp.tensors import clip_grad_norm_, full_state
from gobrrr.parallel.zero.stages import NaiveZero1, Zero12, ZeroOptimizer, memory_report, zero
from gobrrr.parallel.zero.zero3 import Zero3

__all__ = ["DDP", "NaiveDDP", "ddp", "no_sync", "zero", "memory_report", "NaiveZero1", "Zero12", "Zero3",
           "ZeroOptimizer", "tp", "make_mesh", "GPT_PLAN", "clip_grad_norm_", "loss_parallel", "tp_state", "full_state"]
