"""`gobrrr train`: train the reference GPT on one rank or many, resumable bit for bit.

    gobrrr train --model tiny --steps 200 --out runs/tiny                     # CPU or one GPU
    torchrun --nproc-per-node 8 -m gobrrr train --model 124m --steps 2000 --out runs/124m
    torchrun --nproc-per-node 4 -m gobrrr train ... --tp 2 --zero 1           # a (2, 2) mesh, ZeRO over dp
    gobrrr train ... --resume                                                 # continue after a kill

This file is the command only: arguments -> TrainConfig (gobrrr.train.config, where every flag is
checked) -> the loop (gobrrr.train.loop) -> an exit code. The package's __init__ says where the rest is.

Failures end the run with one line, `gobrrr train: error: <what>; <what to do>`, and a non-zero exit:
2 for what the user can fix (arguments, --out, a full disk, a checkpoint that does not fit or is
damaged), 1 for a run that diverged (a non-finite loss or weights: nothing non-finite is ever
checkpointed, gobrrr.train.checks) or lost a rank (named by gobrrr.comm). An error every rank meets
alike (arguments, the run folder, a checkpoint, agreed through gobrrr.comm.agree) is printed once,
by rank 0, and every rank exits with the same code; one only some ranks meet (a dead peer, a
rendezvous that failed) is printed by each. Ranks started by torchrun exit within about a second of
the launcher's death (gobrrr.comm.lifeline).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from gobrrr.comm.debug import CollectiveError, DistConfigError
from gobrrr.train import checks, rundir
from gobrrr.train.checkpoint_io import CheckpointError
from gobrrr.train.checks import TrainError
from gobrrr.train.config import TrainConfig, lr_at
from gobrrr.train.layout import make_optimizer
from gobrrr.train.loop import train
from gobrrr.train.metrics import read_metrics

__all__ = ["main", "parse_args", "train", "TrainConfig", "TrainError", "lr_at", "make_optimizer", "read_metrics"]


def parse_args(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser(prog="gobrrr train", description="Train the reference GPT (works under torchrun).")
    d = TrainConfig()
    p.add_argument("--model", default=d.model, choices=["tiny", "small", "124m"])
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps in the whole schedule")
    p.add_argument("--out", required=True, help="the run folder: checkpoints/, metrics.jsonl (created if needed)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="sequences per rank per micro-step (default: 8 on a CPU; on a GPU the largest power of two "
                        "that fits in free memory, up to 64k tokens per micro-step, found by a short probe)")
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's block size")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-steps per optimizer step")
    p.add_argument("--data", choices=["shakespeare", "synthetic"], default=d.data)
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    p.add_argument("--min-lr", type=float, default=d.min_lr)
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default min(100, steps // 10))")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--grad-clip", type=float, default=d.grad_clip, help="max gradient norm, 0 = off")
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    p.add_argument("--log-every", type=int, default=d.log_every, help="steps between loss reads (host syncs)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar: plain step lines every --log-every steps and the final line (for logs)")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="torch.compile the model (default on a GPU; on a CPU it needs a C++ compiler). Not yet with "
                        "--tp > 1 or --zero 3: those run eagerly with a one-line notice (gobrrr/train/layout.py)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="run eagerly")
    p.add_argument("--compile-backend", default=d.compile_backend, help=argparse.SUPPRESS)
    p.add_argument("--cuda-graph", dest="cuda_graph", action="store_true", default=None,
                   help="capture the whole step (forward, backward, clip, AdamW) in one CUDA graph after 2 eager "
                        "steps and replay it: one launch per step instead of ~1,500 (default on a GPU at world "
                        "size 1; not yet with several ranks, --zero, --tp > 1 or under gobrrr doctor: those run "
                        "eagerly with a one-line notice)")
    p.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", help="issue every kernel from Python")
    p.add_argument("--bf16-residual", action="store_true",
                   help="carry the residual stream between blocks in bf16 instead of float32 (a GPU's autocast "
                        "only): fewer bytes for every LayerNorm and residual add, as Megatron-LM and FSDP2's bf16 "
                        "mixed precision run; parameters, gradients and AdamW stay float32")
    p.add_argument("--crash-after-step", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--zero", type=int, default=0,
                   help="ZeRO stage 1, 2 or 3 instead of ddp; with --tp, stages 1-2 over the dp ranks (stage 3 with --tp "
                        "is refused). Checkpoints of every layout resume at any other (same global batch)")
    p.add_argument("--tp", type=int, default=d.tp,
                   help="tensor-parallel degree: world size = dp x tp (torchrun); ddp, or --zero 1|2, over dp")
    p.add_argument("--sequence-parallel", action="store_true", help="with --tp: sequence parallelism as well")
    args = p.parse_args(argv)
    return TrainConfig(**{f.name: getattr(args, f.name, f.default) for f in fields(TrainConfig)})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        train(parse_args(argv))
    except (TrainError, CheckpointError, rundir.RunDirError, DistConfigError) as e:
        return _fail(e, 2)
    except (checks.DivergedError, CollectiveError) as e:  # the run failed: diverged, or a rank died (named)
        return _fail(e, 1)
    return 0


def _fail(e: BaseException, code: int) -> int:
    """Print the error's one line (once under torchrun when every rank raised it alike: the loop printed it on rank 0
    before the ranks left, or, for a flag refused before the ranks met, rank 0 prints it here) and return `code`."""
    if getattr(e, "printed", False):
        return code
    if not getattr(e, "all_ranks", False) or os.environ.get("RANK", "0") == "0":
        print(checks.error_line(e), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
