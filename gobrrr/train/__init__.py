"""gobrrr.train: `gobrrr train`, the reference GPT trained on one rank or many (Parts 5-6 applied).

Open cli.py first (the config, the loop, the command). step.py is one training step (compile
scope, chunked loss, fused ops), graph.py replays it as a CUDA graph, data.py feeds it,
checkpoint_io.py and rundir.py make a run folder survive kills and second runs, checks.py stops a
run that diverged, auto_batch.py picks a batch size that fits.
"""
from gobrrr.train.cli import TrainConfig, TrainError, main, train

__all__ = ["train", "TrainConfig", "TrainError", "main"]
