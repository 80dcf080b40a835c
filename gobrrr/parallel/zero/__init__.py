"""ZeRO stages 1-3 (Rajbhandari et al. 2020): `zero(model, optimizer, stage)` shards optimizer state, gradients, parameters.

Open stages.py first (the schedule of stages 1-2, phase by phase, and `NaiveZero1`, the idea in
40 lines), then zero3.py (parameters gathered per unit, ahead of each block). shard.py is the
flat padded layout and its collectives, optim.py the optimizer over the shards, pieces.py and
checkpoint.py the sharded checkpoint through torch.distributed.checkpoint.
"""
from gobrrr.parallel.zero.stages import NaiveZero1, Zero12, ZeroConfig, ZeroOptimizer, memory_report, zero
from gobrrr.parallel.zero.zero3 import Zero3

__all__ = ["zero", "memory_report", "NaiveZero1", "Zero12", "Zero3", "ZeroConfig", "ZeroOptimizer"]
