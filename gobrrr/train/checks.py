"""What stops `gobrrr train` early, in one line each: bad numbers, a misfit checkpoint, divergence.

Kept out of the loop so that it reads as a loop. Each check returns a message (the caller raises
its TrainError) or raises `DivergedError`; none costs anything per step:

  * `numbers_problem(cfg)`  at start: --lr -1 / nan / inf, --grad-clip -1, --seq-len 0, ... are
    refused before a process group exists (torch would raise "Invalid learning rate" from deep
    inside AdamW, or accept inf and train NaNs);
  * `records_misfit(path, saved, state)`  at resume, before any tensor is read: a record the model
    needs that the checkpoint lacks, or one of another shape, named in one line instead of DCP's
    per-rank tracebacks; `misfit(path, state, model)` the same for gobrrr 0.1's checkpoint.pt;
  * `stop_if_diverged(logged, n, cfg)`  after each log flush (the losses are on the host then
    anyway): the first non-finite loss stops the run before the next checkpoint;
  * `nonfinite_weights(model, step, cfg)`  before each checkpoint, one sync: a finite loss can
    still be followed by an update to inf (the loss at step s is computed before update s), so
    the weights themselves are checked. Nothing non-finite is ever written: the last checkpoint
    on disk is the last finite state.

Errors every rank raises alike (from the same arguments and files, or agreed through
gobrrr.comm.agree) carry `all_ranks = True`, so the command prints them once, on rank 0.
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import torch

from gobrrr.comm.agree import mark

CHECKPOINTS = "checkpoints"  # DIR/checkpoints/: gobrrr.train.checkpoints


class TrainError(RuntimeError):
    """The run cannot start or continue as asked; the message says what to change (exit 2)."""

    all_ranks = True  # raised from arguments and files every rank sees alike


class DivergedError(RuntimeError):
    """The loss or the weights stopped being finite; nothing non-finite was checkpointed (exit 1)."""


def error_line(e: BaseException) -> str:
    """The one line `gobrrr train` ends with."""
    return f"gobrrr train: error: {e}"


def numbers_problem(cfg: Any) -> str | None:
    """Why the numbers of a TrainConfig cannot train (one sentence and the fix), or None."""
    def bad(name: str, rule: str) -> str:
        return f"--{name.replace('_', '-')} {getattr(cfg, name)} must be {rule}; pass such a value"

    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
        if not math.isfinite(getattr(cfg, name)):
            return bad(name, "a finite number")
    if cfg.lr <= 0:
        return bad("lr", "> 0")
    if not 0 <= cfg.min_lr <= cfg.lr:
        return bad("min_lr", f"between 0 and --lr {cfg.lr}")
    if cfg.weight_decay < 0:
        return bad("weight_decay", ">= 0")
    if cfg.grad_clip < 0:
        return bad("grad_clip", ">= 0 (0 turns clipping off)")
    if cfg.seq_len is not None and cfg.seq_len < 1:
        return bad("seq_len", ">= 1")
    return None


def misfit(path: Path, state: dict[str, Any], model: torch.nn.Module,
           optimizer: torch.optim.Optimizer | None = None) -> str | None:
    """Why `state["model"]` / `state["optimizer"]` cannot load into `model` / `optimizer` (keys, shapes,
    parameter groups), in one line; None when they fit."""
    lacking = [k for k in ("model", "optimizer") if not isinstance(state.get(k), dict)]
    if lacking:
        return (f"checkpoint {path} lacks {' and '.join(lacking)}: it is damaged or edited; restore a copy or "
                "start a new run")
    saved = state["model"]
    want = model.state_dict()
    missing = [k for k in want if k not in saved]
    extra = [k for k in saved if k not in want]
    shapes = [f"{k} {tuple(saved[k].shape)} vs {tuple(v.shape)}" for k, v in want.items()
              if k in saved and hasattr(saved[k], "shape") and tuple(saved[k].shape) != tuple(v.shape)]
    parts = ([f"missing {', '.join(missing[:3])}"] if missing else []) + \
            ([f"unexpected {', '.join(extra[:3])}"] if extra else []) + \
            ([f"size mismatch {'; '.join(shapes[:3])} (checkpoint vs model)"] if shapes else [])
    if not parts and optimizer is not None:
        groups = [len(g.get("params", [])) for g in state["optimizer"].get("param_groups", [])]
        mine = [len(g["params"]) for g in optimizer.param_groups]
        if groups != mine:
            parts.append(f"optimizer parameter groups of {groups} tensors vs {mine}")
    if not parts:
        return None
    return (f"checkpoint {path} does not fit this model ({'; '.join(parts)}); it was written for another "
            "model or edited; resume with the original --model, or start a new run")


def records_misfit(path: Path, saved: dict[str, Any], state: dict[str, Any]) -> str | None:
    """Why the records `state` (what the model loads: tensors or ShardedTensors) cannot be read from a checkpoint
    whose state_dict_metadata is `saved` (keys, shapes), in one line; None when they fit."""
    missing = [k for k in state if k not in saved]
    shapes = []
    for k, v in state.items():
        size = getattr(saved.get(k), "size", None)
        want = list(v.metadata().size) if hasattr(v, "local_shards") else list(getattr(v, "shape", []))
        if size is not None and torch.is_tensor(v) and list(size) != want:
            shapes.append(f"{k} {tuple(size)} vs {tuple(want)}")
    parts = ([f"missing {', '.join(missing[:3])}"] if missing else []) + \
            ([f"size mismatch {'; '.join(shapes[:3])} (checkpoint vs model)"] if shapes else [])
    if not parts:
        return None
    return (f"checkpoint {path} does not fit this model ({'; '.join(parts)}); it was written for another model "
            "or edited; resume with the original --model, or start a new run")


def stop_if_diverged(logged: dict[int, float], n: int, cfg: Any) -> None:
    """After a flush: raise at the first non-finite loss among the latest `n` (<= --log-every) steps."""
    recent = dict(itertools.islice(reversed(logged.items()), min(n, cfg.log_every, len(logged))))
    bad = [s for s, loss in recent.items() if not math.isfinite(loss)]
    if bad:
        raise mark(DivergedError(f"the loss is {recent[min(bad)]} at step {min(bad)}: the run diverged and stopped; "
                                 f"the last checkpoint in {Path(cfg.out) / CHECKPOINTS} (if any) is from before it "
                                 f"and finite; start a new run with a lower --lr (now {cfg.lr:g}) or --grad-clip"))


def nonfinite_weights(weights, step: int, cfg: Any) -> DivergedError | None:
    """A DivergedError if any of this rank's `weights` (tensors) is NaN/inf after `step`, else None."""
    flags = [torch.isfinite(p).all() for p in weights]
    if not flags or bool(torch.stack(flags).all()):  # sync: once per checkpoint
        return None
    return DivergedError(f"the weights hold NaN/inf after step {step}: the run diverged and stopped without "
                         f"writing them; the last checkpoint in {Path(cfg.out) / CHECKPOINTS} (if any) is the last "
                         f"finite state; start a new run with a lower --lr (now {cfg.lr:g}) or --grad-clip")
