"""Parallelism applied to an unmodified model: `ddp(model)`, `tp(model, mesh)` (tensor parallel); ZeRO next."""
from gobrrr.parallel.ddp import DDP, NaiveDDP, ddp, no_sync
from gobrrr.parallel.mesh import make_mesh
from gobrrr.parallel.tp import GPT_PLAN, loss_parallel, tp, tp_state
from gobrrr.parallel.tp_tensors import clip_grad_norm_, full_state

__all__ = ["DDP", "NaiveDDP", "ddp", "no_sync", "tp", "make_mesh", "GPT_PLAN", "clip_grad_norm_", "loss_parallel",
           "tp_state", "full_state"]
