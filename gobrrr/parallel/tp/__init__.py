"""Tensor parallelism (Megatron, Shoeybi et al. 2019) with sequence parallelism: `tp(model, mesh, plan)`.

Open ops.py first (f and g, the ten-line autograd functions, and the sequence-parallel scatter
and gather), then parallelize.py (a plan's styles and `tp()` applying a plan to an unmodified
model, with one block's schedule) and layers.py (the parallel linears and embedding it puts in
place, the vocab-parallel loss, the state left on the model). tensors.py gathers sharded tensors
(clip, full state), report.py lists each block's collectives and bytes, checkpoint.py saves and
loads through torch.distributed.checkpoint. A model's plan lives beside the model: the reference
GPT's is gobrrr.models.gpt_plan.GPT_PLAN.
"""
from gobrrr.parallel.tp.layers import TPError, loss_parallel
from gobrrr.parallel.tp.parallelize import Colwise, Dropout, ModuleInput, Replicate, Rowwise, VocabEmbedding, tp, tp_state
from gobrrr.parallel.tp.tensors import clip_grad_norm_, full_state

__all__ = ["tp", "tp_state", "loss_parallel", "TPError", "clip_grad_norm_", "full_state",
           "Colwise", "Rowwise", "VocabEmbedding", "ModuleInput", "Replicate", "Dropout"]
