"""ZeRO stages 1-3 (Rajbhandari et al. 2020): `zero(model, optimizer, stage)` shards optimizer state, gradients, parameters.

Open stages.py first (the memory and traffic of every stage, the schedule of stages 1-2 phase by
phase, and `NaiveZero1`, the idea in 40 lines), then base.py (what the optimized stages share:
the config, reduce-scatter launching, the end of backward, memory accounting) and zero3.py
(parameters gathered per unit, ahead of each block). api.py is `zero()` choosing a stage, shard.py
the flat padded layout and its collectives, optim.py the optimizer over the shards, pieces.py and
checkpoint.py the sharded checkpoint through torch.distributed.checkpoint.
"""
from gobrrr.parallel.zero.api import memory_report, zero
from gobrrr.parallel.zero.base import ZeroConfig
from gobrrr.parallel.zero.optim import ZeroOptimizer
from gobrrr.parallel.zero.stages import NaiveZero1, Zero12
from gobrrr.parallel.zero.zero3 import Zero3

__all__ = ["zero", "memory_report", "NaiveZero1", "Zero12", "Zero3", "ZeroConfig", "ZeroOptimizer"]
