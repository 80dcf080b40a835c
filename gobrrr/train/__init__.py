"""gobrrr.train: `gobrrr train`, the reference GPT trained on one rank or many (Parts 5-6 applied).

Open loop.py first (the training loop, top to bottom), then layout.py (the one table of parallel
layouts: ddp, ZeRO 1-3, tp, tp + ZeRO, what each supports and how its model is built) and
checkpoints.py (the one Checkpointer: the checkpoint folder every layout writes and resumes from).
config.py checks every flag before anything is touched; step.py is one training step (compile
scope, chunked loss, fused ops), graph.py replays it as a CUDA graph, data.py feeds it, metrics.py
logs it; rundir.py keeps a run folder to one live run, checkpoint_io.py writes files atomically,
checks.py stops a run that diverged, auto_batch.py picks a batch size that fits; cli.py is the command.
"""
from gobrrr.train.checks import TrainError
from gobrrr.train.cli import main
from gobrrr.train.config import TrainConfig
from gobrrr.train.loop import train

__all__ = ["train", "TrainConfig", "TrainError", "main"]
