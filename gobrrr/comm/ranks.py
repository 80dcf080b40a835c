"""The rank runtime: one process per device, started by torchrun (or alone as world size 1).

    torchrun --nproc-per-node 4 train.py          # sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT

    rank = gobrrr.comm.init()                     # env -> process group, device, seeds
    model = GPT(cfg).to(rank.device)              # same seed on every rank: identical initial weights
    sampler = RankSampler(len(data), rank.rank, rank.world_size, shuffle=True, seed=0)
    print0(f"{rank.world_size} ranks on {rank.backend}")
    gobrrr.comm.shutdown()                        # or: with gobrrr.comm.session() as rank: ...

What `init()` does, in order, and why that order:
  1. read RANK / LOCAL_RANK / WORLD_SIZE (absent: world size 1, rank 0, an in-process store);
  2. pick the backend: NCCL when the device is CUDA, gloo otherwise (override with `backend=` or
     GOBRRR_DIST_BACKEND);
  3. bind `cuda:LOCAL_RANK` *before* creating the group: NCCL builds its communicator on the current
     device, and a group created while every rank sits on cuda:0 puts all ranks on one GPU;
  4. rendezvous through MASTER_ADDR:MASTER_PORT within GOBRRR_DIST_RENDEZVOUS_TIMEOUT_S (default
     30 s, at most the group timeout): a wrong port, address or world size fails here in seconds,
     with a message naming all three, not after the 5-minute group timeout;
  5. create the group with a timeout (default 300 s, GOBRRR_DIST_TIMEOUT_S; NCCL's own default is
     10 minutes of silence);
  6. under torchrun, arm the lifeline (gobrrr.comm.lifeline): the rank exits within about a
     second of its launcher's death instead of training on as an orphan;
  7. seed: the *model* seed is the same on every rank (identical initial weights, no broadcast
     needed); the *data* seed (`Rank.data_seed`) differs per rank, for per-rank augmentation/noise.

Every environment variable read here is checked, and a bad one is named in a `DistConfigError`
(a ValueError): "GOBRRR_DIST_TIMEOUT_S='abc' is not a number of seconds", not "could not convert".

Calling init() again (or a `session()` inside a `session()`) adopts the live group. Decided:
  * it does not re-seed unless `seed=` is passed: a silent re-seed in the middle of a program
    repeats random draws (dropout masks, data order) that already happened;
  * a `session()` only tears down a group its own init created: an inner session leaves the
    outer one's group alive, and does not announce "left" to the peers when it raises.

At world size 1 the same code path runs: a real one-member process group, so every collective in
`gobrrr.comm.collectives` works and is (almost) free. There is no branch for "not distributed".
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import math
import os
import random
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from gobrrr.comm import debug as _debug
from gobrrr.comm import lifeline as _lifeline
from gobrrr.comm import monitor as _monitor
from gobrrr.comm.debug import DistConfigError

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_RENDEZVOUS_TIMEOUT_S = 30.0
ENV_TIMEOUT = "GOBRRR_DIST_TIMEOUT_S"
ENV_RENDEZVOUS_TIMEOUT = "GOBRRR_DIST_RENDEZVOUS_TIMEOUT_S"
log = logging.getLogger("gobrrr.comm")


@dataclass(frozen=True)
class Rank:
    """Who this process is: its place among the ranks and the device it owns."""
    rank: int                # global rank, 0..world_size-1
    local_rank: int          # rank on this node: the GPU index it binds
    world_size: int
    device: torch.device     # cuda:local_rank under NCCL, cpu under gloo
    is_main: bool            # rank == 0: the one that prints, logs and writes checkpoints
    backend: str             # "nccl" or "gloo"
    seed: int = 0            # the model seed, the same on every rank

    @property
    def data_seed(self) -> int:
        """A per-rank seed for data-side randomness (augmentation, noise, synthetic batches)."""
        return (self.seed * 1_000_003 + self.rank + 1) % (2**63)

    def data_generator(self) -> torch.Generator:
        """A CPU torch.Generator seeded with `data_seed`."""
        return torch.Generator().manual_seed(self.data_seed)


class RendezvousError(DistConfigError, TimeoutError):
    """The ranks could not meet at MASTER_ADDR:MASTER_PORT within the rendezvous timeout."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise DistConfigError(f"gobrrr.comm: environment variable {name}={value!r} is not an integer; "
                              f"unset it or launch with torchrun, which sets it.") from None


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not (math.isfinite(seconds) and seconds > 0):
        raise DistConfigError(f"gobrrr.comm: environment variable {name}={value!r} is not a positive number of "
                              f"seconds; set it to e.g. {default:g}, or unset it.")
    return seconds


def _master() -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT, checked (torch's own errors do not name the variable)."""
    addr = os.environ.get("MASTER_ADDR", "").strip()
    if not addr:
        raise DistConfigError("gobrrr.comm: MASTER_ADDR is not set; launch with torchrun, or set MASTER_ADDR "
                              "to rank 0's host name and MASTER_PORT to a free port on it.")
    port = os.environ.get("MASTER_PORT", "")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 1 <= number <= 65535:
        raise DistConfigError(f"gobrrr.comm: environment variable MASTER_PORT={port!r} is not a port number "
                              "(1-65535); set it to the same free port on every rank, or launch with torchrun.")
    return addr, number


def _rendezvous(rank: int, world_size: int, timeout_s: float) -> dist.Store:
    """env:// rendezvous with its own, short timeout; a failure names address, port and world size."""
    addr, port = _master()
    # A client's connect retries twice over its timeout (plus a back-off), so it gets half: every rank
    # gives up within about `timeout_s`. Under torchrun every rank is a client of the agent's store.
    client = rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    try:
        store, _, _ = next(dist.rendezvous("env://", rank, world_size,
                                           timeout=_dt.timedelta(seconds=timeout_s / 2 if client else timeout_s)))
    except (RuntimeError, TimeoutError, OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise RendezvousError(
            f"gobrrr.comm: rank {rank} of {world_size} could not meet the other ranks at "
            f"MASTER_ADDR={addr} MASTER_PORT={port} within {timeout_s:g} s ({first}). Check that every rank "
            f"uses the same MASTER_ADDR and MASTER_PORT, that rank 0 can listen on that port and the others "
            f"reach it, and that WORLD_SIZE={world_size} processes were started; "
            f"{ENV_RENDEZVOUS_TIMEOUT} sets this timeout.") from None
    return store


def _pick_device(device: torch.device | str | None, backend: str | None, local_rank: int) -> torch.device:
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", local_rank)
        return dev
    if backend is not None and "nccl" not in backend:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device lazily: no CUDA init here
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # numpy is optional for this module
        pass


def init(backend: str | None = None, *, timeout_s: float | None = None, seed: int | None = None,
         device: torch.device | str | None = None, debug: bool | None = None,
         store: dist.Store | None = None) -> Rank:
    """Join the process group described by the torchrun environment and return this process's `Rank`.

    backend:   "nccl", "gloo" (or any c10d backend string); default NCCL when the device is CUDA,
               else gloo; GOBRRR_DIST_BACKEND overrides the default.
    timeout_s: how long any collective may wait for its peers (default 300 s, GOBRRR_DIST_TIMEOUT_S).
    seed:      the model seed, applied identically on every rank (python, numpy, torch); default 0.
               A second init() (adopting our own live group) leaves the generators alone unless
               `seed` is given.
    device:    "cpu" forces CPU (and gloo); default cuda:LOCAL_RANK when CUDA is available.
    debug:     check before every collective that all ranks call the same op with the same shapes
               and dtypes (default: GOBRRR_DIST_DEBUG=1). See gobrrr.comm.debug.
    store:     a c10d Store to rendezvous through instead of MASTER_ADDR/MASTER_PORT (the test harness
               passes one); RANK and WORLD_SIZE still come from the environment.

    If a default process group already exists (you called torch.distributed.init_process_group
    yourself), `init` adopts it instead of creating another.
    """
    return _init(backend, timeout_s=timeout_s, seed=seed, device=device, debug=debug, store=store)[0]


def _init(backend, *, timeout_s, seed, device, debug, store) -> tuple[Rank, bool]:
    """`init`, also saying whether this call created the group (True) or adopted a live one."""
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank)  # launched without torchrun on one node: local = global
    if not 0 <= rank < world_size:
        raise DistConfigError(f"gobrrr.comm: RANK={rank} is outside 0..WORLD_SIZE-1={world_size - 1}; "
                              f"launch with torchrun, or unset RANK and WORLD_SIZE for a single process.")
    if timeout_s is None:
        timeout_s = _env_seconds(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)
    if debug is None:
        debug = os.environ.get(_debug.ENV_DEBUG, "0").lower() not in ("", "0", "false", "no")
    backend = backend or os.environ.get("GOBRRR_DIST_BACKEND") or None

    if dist.is_initialized():  # adopt the caller's group
        rank, world_size = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend())
        dev = _pick_device(device, backend, local_rank)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        world = _debug._WATCHES.get("WORLD")
        if world is not None:  # our own group (e.g. init() called again inside gobrrr.comm.testing.spawn)
            world.debug = world.debug or debug
            if seed is None:  # adopting our own group: no silent re-seed (see the module docstring)
                return Rank(rank, local_rank, world_size, dev, rank == 0, backend, world.seed), False
        else:
            try:  # private but long-stable; without it we simply lose the named-rank diagnostics
                adopted_store = dist.distributed_c10d._get_default_store()
            except Exception:
                adopted_store = None
            _debug.install(adopted_store, rank, world_size, timeout_s, debug)
        seed = 0 if seed is None else seed
        _seed_everything(seed)
        _debug._WATCHES["WORLD"].seed = seed
        return Rank(rank, local_rank, world_size, dev, rank == 0, backend, seed), False

    dev = _pick_device(device, backend, local_rank)
    if backend is None:
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RuntimeError(f"gobrrr.comm: rank {rank} wants {dev} but this node has "
                               f"{torch.cuda.device_count()} GPU(s); start at most that many processes "
                               f"per node (torchrun --nproc-per-node).")
        torch.cuda.set_device(dev)  # before the group: NCCL binds its communicator to the current device

    timeout = _dt.timedelta(seconds=timeout_s)
    if store is None:
        if world_size == 1 and "MASTER_ADDR" not in os.environ:
            store = dist.HashStore()  # world size 1 without torchrun: nothing to rendezvous with
        else:
            rendezvous_s = min(timeout_s, _env_seconds(ENV_RENDEZVOUS_TIMEOUT, DEFAULT_RENDEZVOUS_TIMEOUT_S))
            store = _rendezvous(rank, world_size, rendezvous_s)
    store.set_timeout(timeout)
    kwargs = {}
    if "nccl" in backend and dev.type == "cuda":
        kwargs["device_id"] = dev  # eager NCCL init: errors surface here, not at the first collective
    dist.init_process_group(backend, store=dist.PrefixStore("gobrrr-pg/", store), rank=rank,
                            world_size=world_size, timeout=timeout, **kwargs)
    world = _debug.install(store, rank, world_size, timeout_s, debug)
    _monitor.start(world, backend)  # NCCL: exit with a message when a peer left and we wait for it
    world.lifeline_stop = _lifeline.start(rank)  # torchrun: exit when the launcher dies
    seed = 0 if seed is None else seed
    world.seed = seed
    _seed_everything(seed)
    return Rank(rank, local_rank, world_size, dev, rank == 0, backend, seed), True


def shutdown() -> None:
    """Destroy the default process group (if any) and forget this module's per-group state.

    At the end of a script, drop what holds the groups first (`del model, opt, mesh`): a process group whose
    last reference goes in the interpreter's own teardown can abort the process (SIGABRT, "terminate called
    without an active exception") after the script's work is done (examples/tp.py, 5 runs in 18 before it did)."""
    _debug.note_exit(None)  # peers still waiting for this rank will read "called shutdown() and left"
    _debug.uninstall()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def session(backend: str | None = None, **kwargs) -> Iterator[Rank]:
    """`with session() as rank:` -- init on entry; destroy the group on exit, also on exception.

    On an exception the rank first posts it to the store, so the peers waiting for it say
    "rank 3 raised ValueError: ... and left" instead of timing out in silence.

    Inside a live group (an outer session, or a group you created yourself) the session adopts it
    and, on exit, leaves it alive and posts nothing: the owner of the group tears it down.
    """
    kwargs = {"timeout_s": None, "seed": None, "device": None, "debug": None, "store": None, **kwargs}
    rank, created = _init(backend, **kwargs)
    if not created:  # an inner session: the outer one owns the group and tears it down
        yield rank
        return
    try:
        yield rank
    except BaseException as exc:
        _debug.note_exit(exc)
        raise
    finally:
        shutdown()


# ----------------------------------------------------------------------------------------------
# Rank 0 only output

def _current_rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", 0)


def print0(*args, **kwargs) -> None:
    """print() on rank 0 only (flushes, so lines from a launcher's ranks do not interleave late)."""
    if _current_rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def log0(msg: str, *args, level: int = logging.INFO, logger: logging.Logger | None = None) -> None:
    """logging on rank 0 only (logger 'gobrrr.comm' by default)."""
    if _current_rank() == 0:
        (logger or log).log(level, msg, *args)


# ----------------------------------------------------------------------------------------------
# Each rank's slice of a dataset

def shard_indices(n: int, rank: int, world_size: int, *, drop_last: bool = False, shuffle: bool = False,
                  seed: int = 0, epoch: int = 0) -> list[int]:
    """The dataset indices rank `rank` of `world_size` reads this epoch.

    Every rank must get the *same number* of samples: with a data-parallel step per batch, a rank
    with one batch more issues one all-reduce more and the others hang waiting for it. So when
    `n` does not divide by `world_size` we choose:

      drop_last=False (default): pad by wrapping around to the start of the order; every rank gets
                                 ceil(n / W) samples, a few samples are seen twice per epoch.
      drop_last=True:            drop the tail; every rank gets floor(n / W), a few samples are
                                 skipped this epoch (a different few each epoch when shuffled).

    Padding is the default because no sample is ever lost (the right choice for evaluation on small
    sets, where you want every sample counted; de-duplicate the wrap-around ones if exact metrics
    matter). Ranks take a strided slice `order[rank::W]` of one permutation that every rank computes
    from the same `seed + epoch` -- so the seed must be the *shared* model seed, not the per-rank one.

        n=10, W=4, pad:   order 0 1 2 3 4 5 6 7 8 9 0 1   rank0: 0 4 8   rank1: 1 5 9   rank2: 2 6 0   rank3: 3 7 1
        n=10, W=4, drop:  order 0 1 2 3 4 5 6 7         rank0: 0 4     rank1: 1 5     rank2: 2 6     rank3: 3 7
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"shard_indices: rank {rank} is not in 0..{world_size - 1}")
    if shuffle:
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    if drop_last:
        per_rank = n // world_size
        order = order[: per_rank * world_size]
    else:
        per_rank = math.ceil(n / world_size) if n else 0
        total = per_rank * world_size
        while len(order) < total and n:  # wrap around (repeatedly when n < world_size)
            order += order[: total - len(order)]
    return order[rank::world_size]


class RankSampler(Sampler[int]):
    """A sampler yielding this rank's slice of `range(n)`; see `shard_indices` for the drop-vs-pad choice.

        sampler = RankSampler(len(ds), rank.rank, rank.world_size, shuffle=True, seed=0)
        loader = DataLoader(ds, batch_size=32, sampler=sampler)
        for epoch in range(E):
            sampler.set_epoch(epoch)   # a new permutation each epoch, the same on every rank
    """

    def __init__(self, n: int, rank: int, world_size: int, *, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False):
        if hasattr(n, "__len__"):
            n = len(n)  # a dataset was passed
        self.n, self.rank, self.world_size = int(n), rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        shard_indices(0, rank, world_size)  # validate rank / world_size now, not at the first epoch

    @classmethod
    def for_rank(cls, n: int, rank: Rank, **kwargs) -> "RankSampler":
        kwargs.setdefault("seed", rank.seed)
        return cls(n, rank.rank, rank.world_size, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(shard_indices(self.n, self.rank, self.world_size, drop_last=self.drop_last,
                                  shuffle=self.shuffle, seed=self.seed, epoch=self.epoch))

    def __len__(self) -> int:
        if self.drop_last:
            return self.n // self.world_size
        return math.ceil(self.n / self.world_size) if self.n else 0
