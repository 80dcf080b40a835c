"""What `gobrrr bench prefetch` feeds and times: datasets, collates, the MLP, the timed loop.

Datasets hold a few distinct pageable images or batches and hand them out as a decoded dataset
would; the collates and `CopyReused` are the workers' production floors (build a batch, send
nothing). `timed_loop` is every row's clock: warm-up steps, then ms/step with the clock stopped
after the GPU drains.
"""
from __future__ import annotations

import gc
import multiprocessing
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, get_worker_info


@dataclass
class Config:
    batch: int = 256
    side: int = 160            # images are (3, side, side) float32
    width: int = 1024          # MLP width; depth comes from the regime
    workers: int = 6
    warmup: int = 30          # > every worker's first write to each of its 4 ring slots (batches 0-23)
    steps: int = 80
    copy_ms: float = 0.8       # target compute time of the copy-bound regime
    compute_ms: float = 2.1    # target compute time of the compute-bound regime
    depths: tuple[int, ...] | None = None  # explicit (copy-bound, compute-bound) depths
    regimes: tuple[str, ...] = ("copy-bound", "compute-bound")
    device: str = "cuda"
    repeats: int = 1           # passes over the rows, interleaved (row order r1 r2 .. r1 r2 ..); median kept
    kinds: tuple[str, ...] = ("floor", "info", "in-process", "workers", "prebatched")  # which rows (floors always run)
    busy: bool = True          # then a pass in a busy process: other loaders' workers and pin threads alive


QUICK = dict(batch=8, side=16, width=64, workers=2, warmup=2, steps=5, depths=(1, 2), device="cpu")


class Frames(Dataset):
    """`length` samples (image, label) drawn from a few distinct pageable images, as a decoded dataset."""

    def __init__(self, images: torch.Tensor, length: int):
        self.images, self.length = images, length   # images: (n, 3, side, side) float32

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.images[i % len(self.images)], i


class PreBatched(Dataset):
    """`length` items, each a whole batch (x, y): a view of one of a few stored batches, as pre-batched
    shards read from memory; for DataLoader(batch_size=None)."""

    def __init__(self, batches: list[torch.Tensor], length: int):
        self.batches, self.length = batches, length   # batches: k x (B, 3, side, side) float32

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        x = self.batches[i % len(self.batches)]
        return x, torch.arange(x.shape[0]) + i


class BatchStream(IterableDataset):
    """The same batches as PreBatched, streamed: worker w of n yields items w, w + n, ... (its shard)."""

    def __init__(self, batches: list[torch.Tensor], length: int):
        self.batches, self.length = batches, length

    def __len__(self):
        return self.length

    def __iter__(self):
        info = get_worker_info()
        w, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(w, self.length, n):
            x = self.batches[i % len(self.batches)]
            yield x, torch.arange(x.shape[0]) + i


class CopyReused:
    """Production floor of pre-batched sources: copy the dataset's batch into one private buffer per
    worker (allocated once), send nothing: what a worker must do at least to hand a batch over."""

    def __init__(self):
        self.buf = None

    def __call__(self, item):
        x = item[0]
        if self.buf is None or self.buf.shape != x.shape:
            self.buf = torch.empty_like(x)
        self.buf.copy_(x)
        return x.shape[0]


def collate_fresh(samples):
    """Production floor, info row: stack into fresh private memory (what default_collate does), send nothing."""
    torch.stack([s[0] for s in samples])
    return len(samples)


class CollateReused:
    """Production floor: stack into one private buffer per worker (allocated once), send nothing."""

    def __init__(self):
        self.buf = None

    def __call__(self, samples):
        x = samples[0][0]
        if self.buf is None or self.buf.shape[0] != len(samples):
            self.buf = torch.empty((len(samples), *x.shape), dtype=x.dtype)
        torch.stack([s[0] for s in samples], out=self.buf)
        return len(samples)


def mlp(cfg: Config, depth: int, device: torch.device) -> nn.Module:
    """Rows of 3*side pixels through `depth` hidden layers; one scalar out."""
    feat = 3 * cfg.side
    layers: list[nn.Module] = [nn.Linear(feat, cfg.width), nn.GELU()]
    for _ in range(depth):
        layers += [nn.Linear(cfg.width, cfg.width), nn.GELU()]
    layers += [nn.Linear(cfg.width, 1)]
    net = nn.Sequential(*layers).to(device)

    def step(x: torch.Tensor) -> torch.Tensor:   # x: (B, 3, side, side)
        return net(x.reshape(-1, feat)).mean()   # (B*side, 3*side) -> ()

    return step


# ---------------------------------------------------------------- timing helpers

def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # sync: benchmark boundary, outside the timed loop body


def timed_loop(batches, step: Callable[[Any], None], cfg: Config, dev: torch.device) -> float:
    """ms/step over cfg.steps steps after cfg.warmup steps, the clock stopped after the GPU drains."""
    t0 = None
    n = 0
    for i, b in enumerate(batches):
        if i == cfg.warmup:
            sync(dev)
            t0 = time.perf_counter()
        step(b)
        n = i + 1
        if n == cfg.warmup + cfg.steps:
            break
    sync(dev)
    if t0 is None or n < cfg.warmup + cfg.steps:
        raise RuntimeError(f"source gave {n} batches, fewer than warmup + steps = {cfg.warmup + cfg.steps}")
    return (time.perf_counter() - t0) * 1e3 / cfg.steps


def first(b):
    """The image tensor of a batch: (x, y) pairs from loaders, plain tensors from lists."""
    return b[0] if isinstance(b, (list, tuple)) else b



def settle(timeout_s: float = 10.0, keep: frozenset = frozenset()) -> None:
    """Collect the last row's loaders and wait for their worker processes to exit (all but the
    pids in `keep`: the busy pass's other loaders, which stay alive on purpose)."""
    gc.collect()
    deadline = time.monotonic() + timeout_s
    while {p.pid for p in multiprocessing.active_children()} - keep and time.monotonic() < deadline:
        time.sleep(0.02)


def calibrate(cfg: Config, dev: torch.device) -> tuple[int, int]:
    """Depths whose compute time is near cfg.copy_ms and cfg.compute_ms (a line through 2 depths)."""
    if cfg.depths is not None:
        return tuple(cfg.depths)  # type: ignore[return-value]
    probe = type(cfg)(**{**asdict(cfg), "warmup": 3, "steps": 10})
    x = torch.randn(cfg.batch, 3, cfg.side, cfg.side, device=dev)
    acc = torch.zeros((), device=dev)
    t = {}
    for d in (2, 8):
        model = mlp(cfg, d, dev)
        with torch.no_grad():
            t[d] = timed_loop(range(20), lambda _: acc.add_(model(x)), probe, dev)
    per_layer = max((t[8] - t[2]) / 6, 1e-4)
    base = t[2] - 2 * per_layer

    def depth(target):
        return max(1, round((target - base) / per_layer))
    return depth(cfg.copy_ms), depth(cfg.compute_ms)




def memcpy_floor(pageable: list[torch.Tensor], nbytes: int, cfg: Config, dev: torch.device) -> tuple[float, str]:
    """Host memcpy ceiling: the batch's bytes from pageable memory into pinned buffers, one slice
    per thread (GIL released), while the copy engine reads another pinned buffer (as it does
    during the Prefetcher's pageable rows); the best of libc memmove (the fastest of numpy / torch /
    memmove, measured on the H200 host) and the streaming copy the ring uses (gobrrr.loader.ntcopy),
    on the pin-thread count and on all cores. Returns (ms per batch, what was tried)."""
    import ctypes
    import os
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from gobrrr.loader import ntcopy
    from gobrrr.loader.pinned import default_pin_threads
    cuda = dev.type == "cuda"
    n = cfg.warmup + cfg.steps
    # as many pinned destinations as the Prefetcher's ring has slots (2 * depth + 1), written in
    # turn: with one destination the copy would run partly in the L3 cache (300 MB on the H200
    # VM), which the ring's 5 slots do not fit
    dsts = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda).numpy() for _ in range(5)]
    srcs = [t.reshape(-1).view(torch.uint8).numpy() for t in pageable]
    dma_src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dma_dst = torch.empty(nbytes, dtype=torch.uint8, device=dev) if cuda else None
    copies = {"memmove": ctypes.memmove}
    if ntcopy.streaming():
        copies["streaming"] = ntcopy.copy
    best, how, tried = float("inf"), "", []
    side = torch.cuda.Stream(dev) if cuda else None
    for name, fn in copies.items():
        for threads in sorted({default_pin_threads(), len(os.sched_getaffinity(0))}):
            cuts = np.linspace(0, nbytes, threads + 1).astype(np.int64) // 4096 * 4096
            cuts[-1] = nbytes
            with ThreadPoolExecutor(threads) as pool:
                def one(i, pool=pool, cuts=cuts, fn=fn, threads=threads):
                    s, d = srcs[i % len(srcs)], dsts[i % len(dsts)]
                    list(pool.map(lambda k: fn(d[cuts[k]:].ctypes.data, s[cuts[k]:].ctypes.data,
                                               int(cuts[k + 1] - cuts[k])), range(threads)))
                    if cuda and i % 2 == 0:   # keep the copy engine reading pinned memory meanwhile
                        with torch.cuda.stream(side):
                            dma_dst.copy_(dma_src, non_blocking=True)
                ms = timed_loop(range(n), one, cfg, dev)
                tried.append(f"{name} x{threads} {ms:.2f} ms")
                if ms < best:
                    best, how = ms, f"{name}, {threads} threads"
    return best, f"best: {how} (of {', '.join(tried)})"
