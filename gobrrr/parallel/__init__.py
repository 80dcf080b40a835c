"""Parallelism applied to an unmodified model: `ddp(model)`, `zero(model, optimizer, stage)`, `tp(model, mesh, plan)`.

Open ddp.py first (data parallelism, naive beside bucketed; wrapper.py is what every data-parallel
wrapper shares), then zero/ (ZeRO stages 1-3) and tp/ (tensor and sequence parallelism); mesh.py
builds the (dp, tp) device mesh. Nothing here knows a model: a model's tensor-parallel plan lives
beside it (the reference GPT's is gobrrr.models.gpt_plan.GPT_PLAN, formerly gobrrr.parallel.GPT_PLAN).
"""
from gobrrr.parallel.ddp import DDP, NaiveDDP, ddp, no_sync
from gobrrr.parallel.mesh import make_mesh
from gobrrr.parallel.tp import clip_grad_norm_, full_state, loss_parallel, tp, tp_state
from gobrrr.parallel.zero import NaiveZero1, Zero3, Zero12, ZeroOptimizer, memory_report, zero

__all__ = ["DDP", "NaiveDDP", "ddp", "no_sync", "zero", "memory_report", "NaiveZero1", "Zero12", "Zero3",
           "ZeroOptimizer", "tp", "make_mesh", "clip_grad_norm_", "loss_parallel", "tp_state", "full_state"]
