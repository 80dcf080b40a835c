"""Every rank learns whether any rank failed, and with which error: one all-reduce of one number.

    error = None
    try:
        write_my_part()
    except OSError as e:
        error = e
    error = first_error(error, device=rank.device)   # the same answer on every rank
    if error is not None:
        raise error                                  # all ranks stop together, with one message

Why: a step that only some ranks can fail (rank 0 writes a file, one rank finds NaN in its shard)
must not leave the others walking into the next collective, where they would wait for a peer
that has left. The schedule:
  1. all-reduce (sum) of a 0/1 flag over `group`: # sync: the caller's, once per such check;
  2. only when the sum is not 0: all_gather_object of every rank's error (pickled), and each
     rank takes the lowest failing rank's, so every rank raises the same message and a launcher
     prints it once (rank 0) instead of once per rank.
The error returned is marked `all_ranks = True`. At world size 1 (or with no process group)
nothing is communicated and `error` comes back as it was.
"""
from __future__ import annotations

import pickle

import torch
import torch.distributed as dist

from gobrrr.comm import collectives


def _size(group) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def any_rank(flag: bool, *, device, group=None) -> bool:
    """True on every rank when `flag` is true on at least one rank (one all-reduce of one number)."""
    if _size(group) == 1:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    collectives.all_reduce(t, "sum", group=group)  # names a rank that died instead of hanging
    return bool(t.item())  # sync: the caller's check point (once per checkpoint, per log interval, at start)


def first_error(error: BaseException | None, *, device, group=None) -> BaseException | None:
    """None on every rank when no rank passed an error; else, on every rank, the lowest failing rank's error."""
    if _size(group) == 1:
        return mark(error) if error is not None else None
    if not any_rank(error is not None, device=device, group=group):
        return None
    if error is not None:
        try:
            pickle.dumps(error)
        except Exception:  # an error that does not pickle travels as its text
            error = RuntimeError(str(error))
    every: list = [None] * _size(group)
    dist.all_gather_object(every, error, group=group)
    first = next(i for i, e in enumerate(every) if e is not None)
    return mark(error if first == dist.get_rank(group) else every[first])


def mark(error: BaseException) -> BaseException:
    """Say that every rank raises this same error (a command prints it on rank 0 only)."""
    error.all_ranks = True
    return error
