"""Tensor parallelism (Megatron, Shoeybi et al. 2019) with sequence parallelism: `tp(model, mesh, plan)`.

Open ops.py first (f and g, the ten-line autograd functions, and the sequence-parallel scatter
and gather), then parallelize.py (the parallel linears and embedding, and `tp()` applying a
plan to an unmodified model). tensors.py gathers sharded tensors (clip, full state), report.py
lists each block's collectives and bytes, checkpoint.py saves and loads through
torch.distributed.checkpoint.
"""
from gobrrr.parallel.tp.parallelize import GPT_PLAN, TPError, loss_parallel, tp, tp_state
from gobrrr.parallel.tp.tensors import clip_grad_norm_, full_state

__all__ = ["tp", "tp_state", "loss_parallel", "GPT_PLAN", "TPError", "clip_grad_norm_", "full_state"]
