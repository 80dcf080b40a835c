"""The process state a training script is in when it reaches our loader: other loaders alive.

A user's script often holds, before (or beside) a gobrrr Prefetcher, a validation or second
DataLoader(pin_memory=True) with persistent workers and timm's PrefetchLoader over another. Each
was iterated for a while and left alive mid-epoch: its workers forked, its pin-memory thread
parked, the batches it prefetched pinned by torch's caching host allocator. `make_busy` builds
exactly that, with the real timm package when it is installed (otherwise one DataLoader only, and
`BusyState.note` says so in one line).

    busy = make_busy(batches, model_step, device)   # left alive until `busy.close()`
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    """Item i is stored batch i % n (a pageable tensor): a dataset of pre-batched shards, as in issue 28."""

    def __init__(self, batches: list[torch.Tensor], length: int = 10 ** 6, labels: bool = False):
        self.batches, self.length, self.labels = batches, length, labels

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        x = self.batches[i % len(self.batches)]
        return (x, torch.zeros(x.shape[0], dtype=torch.long)) if self.labels else x


def timm_prefetch_loader() -> tuple[Any, str]:
    """timm's PrefetchLoader class, or (None, why not) in one line."""
    try:
        from timm.data.loader import PrefetchLoader
    except ImportError:
        return None, "timm is not installed: the busy state has no timm PrefetchLoader (pip install timm)"
    except Exception as e:   # a timm built against another torch/torchvision
        return None, f"timm does not import here ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
    return PrefetchLoader, ""


@dataclass
class BusyState:
    """The other loaders and their iterators, kept alive; `touch` iterates them again."""
    keep: list = field(default_factory=list)
    iters: list = field(default_factory=list)     # (iterator, take batch -> host or device tensor)
    note: str = ""
    built_s: float = 0.0

    def touch(self, step: Callable[[torch.Tensor], Any], device: torch.device, n: int) -> None:
        """Iterate every loader `n` batches through `step`, then leave them mid-epoch (their workers and
        pin-memory threads go on filling their queues for a moment: see bench prefetch_busy)."""
        for it, take in self.iters:
            for _ in range(n):
                step(take(next(it)).to(device, non_blocking=True))
        if device.type == "cuda":
            torch.cuda.synchronize(device)   # sync: bench boundary

    def close(self) -> None:
        self.iters.clear()
        self.keep.clear()


def make_busy(batches: list[torch.Tensor], step: Callable[[torch.Tensor], Any], device: torch.device,
              workers: int = 6, n: int = 45) -> BusyState:
    """A DataLoader(pin_memory=True, persistent workers) and timm's PrefetchLoader over another, each
    iterated `n` batches through `step` and left alive (the independent check's state, issue 28)."""
    t0 = time.perf_counter()
    cuda = device.type == "cuda"
    state = BusyState()
    dl = DataLoader(Batches(batches), batch_size=None, num_workers=workers, pin_memory=cuda, prefetch_factor=2,
                    persistent_workers=True)
    it = iter(dl)
    state.keep += [dl, it]
    state.iters.append((it, lambda b: b))
    PrefetchLoader, state.note = timm_prefetch_loader()
    if PrefetchLoader is not None and cuda:
        tl = DataLoader(Batches(batches, labels=True), batch_size=None, num_workers=workers, pin_memory=True,
                        persistent_workers=True)
        channels = batches[0].shape[1]
        pl = PrefetchLoader(tl, mean=(0.0,) * channels, std=(1.0,) * channels, channels=channels, device=device)
        pit = iter(pl)
        state.keep += [tl, pl, pit]
        state.iters.append((pit, lambda b: b[0]))
    elif PrefetchLoader is not None:
        state.note = "timm's PrefetchLoader needs CUDA: the busy state has one DataLoader only"
    state.touch(step, device, n)
    state.built_s = time.perf_counter() - t0
    return state
