"""`Prefetcher`: the next batch crosses to the GPU while this step computes.

    loader = gobrrr.Prefetcher(loader, device="cuda")      # 1. wrap the loader
    for x, y in loader:                                     #    batches arrive on the device
        loss = model(x, y); ...; total += loss.detach()     # 2. keep the loss on the device
    print(total.item())                                     # 3. read it once, at the end

How a batch travels (depth=2 shown; every arrow is enqueued, nobody waits on the host):

    source --next()--> pageable batch k+2 --pool threads memcpy--> pinned slot
    pinned slot --H2D on the copy stream--> device batch k+1 --event--> compute stream
    compute stream: step k   (waits on batch k's copy-done event with wait_event, never synchronize)

    # overlap: H2D of batch k+1 (copy stream, DMA engine) with step k (compute stream, SMs)
    # overlap: pageable -> pinned memcpy of batch k+2 (pool threads) with both of the above

The rules it follows (the reasons are in the docs of each piece):
- One copy stream per Prefetcher, made once and reused for every epoch (a stream per epoch
  was the leak in timm's PrefetchLoader).
- Host memory the GPU reads must be pinned. Already pinned tensors (DataLoader(pin_memory=True),
  a PinnedWorkerLoader's shared slots) are copied directly. Pageable ones go through a
  `PinnedRing` filled by background threads; a slot is rewritten only after the event that
  marks the end of its last copy.
- The consumer's stream waits on the batch's event (`wait_event`). The device tensors are
  allocated in the consumer stream's order and the copy stream first waits (on the GPU) for
  the consumer's work enqueued before that allocation, so device memory stays at depth + 1
  batches however far the host runs ahead (prefetch_pass.py says why and how).
- Few host operations per step: in a step bound by the host they are step time
  (prefetch_pass.py). `stats()` reads the same events, resolved only when asked for: no sync
  per step.

A `DataLoader` with worker processes is swapped for a `PinnedWorkerLoader`
(gobrrr/loader/worker_ring.py: workers collate straight into page-locked shared memory) when
the target is a GPU; pass `worker_ring=False` to keep the DataLoader as it is.
On the CPU (or `device=None` without CUDA) the same API passes batches through unchanged.
"""
from __future__ import annotations

import collections.abc
import functools
import statistics
import warnings
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import torch

from gobrrr.loader.pinned import PinnedRing
from gobrrr.loader.prefetch_pass import KEEP_STEPS, Lane, Pass  # noqa: F401  (KEEP_STEPS: named in PrefetchStats)
from gobrrr.loader.streams import new_copy_stream, resolve_device


@dataclass
class PrefetchStats:
    """What the Prefetcher measured since it was made (or since `reset_stats()`).

    host_wait_ms[i]: how long the host waited for batch i's data (the source's `next()` and
    the pinning threads). device_wait_ms[i]: how long the consumer's stream stalled on batch
    i's copy (CUDA events around its `wait_event`; 0 on the CPU). copy_ms: GPU time of all
    host-to-device copies on the copy stream; gbps = bytes / copy_ms. The per-step lists hold
    the last KEEP_STEPS steps (bounded memory in a long run); `steps` counts every step.
    """
    device: str
    steps: int
    bytes: int
    copy_ms: float
    gbps: float
    host_wait_ms: list[float] = field(default_factory=list)
    device_wait_ms: list[float] = field(default_factory=list)
    pinned_allocations: int = 0
    pinned_bytes: int = 0

    @property
    def wait_ms(self) -> list[float]:
        """Per step: host wait plus device wait, the time the step was held up by data."""
        dev = self.device_wait_ms + [0.0] * (len(self.host_wait_ms) - len(self.device_wait_ms))
        return [h + d for h, d in zip(self.host_wait_ms, dev)]

    @property
    def mean_wait_ms(self) -> float:
        w = self.wait_ms
        return statistics.fmean(w) if w else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mean_wait_ms"] = self.mean_wait_ms
        return d

    def __str__(self) -> str:
        med = statistics.median(self.wait_ms) if self.steps else 0.0
        return (f"Prefetcher on {self.device}: {self.steps} steps, {self.bytes / 1e6:.1f} MB moved in "
                f"{self.copy_ms:.2f} ms of copy ({self.gbps:.1f} GB/s); waited for data "
                f"{self.mean_wait_ms:.3f} ms/step on average (median {med:.3f} ms)")


class Prefetcher:
    """Wrap an iterable of batches; iterate it to get the batches on `device`, ready to use.

    iterable: a DataLoader, a generator, a list... Batches are tensors or any nesting of
        dict / list / tuple / namedtuple / dataclass; other leaves pass through unchanged.
    device: 'cuda', 'cuda:N', 'cpu', a torch.device, or None (the current GPU if any, else CPU).
    depth: batches on the device at once from the Prefetcher's side (the one handed over and
        depth-1 being copied ahead). 2 overlaps one copy with one step; more absorbs jitter.
    transform: optional `fn(batch) -> batch` run on the device, on the copy stream, e.g.
        uint8 -> float and normalise. It must not synchronize. Its outputs are allocated on the
        copy stream and handed over with record_stream, so with a transform the device memory
        held grows with how far the host runs ahead of a slow consumer (without one it is
        depth + 1 batches).
    pin_threads: threads that copy pageable tensors into pinned memory (default: 3/4 of the cores, <= 12).
    worker_ring: swap a DataLoader with workers for a PinnedWorkerLoader when one is available.

    Iterating twice. What `iter()` does depends on the source, as it does without a Prefetcher:
    - A re-iterable source (a list, a DataLoader, a dataset): each `for` loop is a new pass from the
      first batch; `break` ends the pass and frees what it held (a DataLoader's workers stop).
      One pass at a time: starting a second pass while the first is still open ends the first,
      and the first then raises RuntimeError on its next `next()` instead of ending quietly
      (`zip(pf, pf)` is an error, not a silently shortened loop).
    - A one-shot iterator (a generator, `iter(x)`, `map(...)`): the Prefetcher is one stream of
      batches, like the iterator itself. After `break`, the next `for` loop continues with the
      next batch: the batches already pulled ahead and copied are kept, none is dropped. Two
      loops at once share the stream (each batch is delivered once). Once the iterator is
      exhausted, further loops yield nothing. `close()` (or garbage collection) drops the batches
      pulled ahead and closes the generator; iterating again afterwards raises RuntimeError
      saying how many were dropped.
    """

    def __init__(self, iterable: Iterable, device: Any = None, depth: int = 2,
                 transform: Callable[[Any], Any] | None = None, *, pin_threads: int | None = None,
                 worker_ring: bool = True):
        if not _is_iterable(iterable):
            raise TypeError(f"Prefetcher needs an iterable of batches (a DataLoader, a generator, a list); "
                            f"got a {type(iterable).__name__}")
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ValueError(f"depth must be an int >= 1 (batches in flight), got {depth!r}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable (batch -> batch), got a {type(transform).__name__}")
        self.device = resolve_device(device)
        self.depth = depth
        self.transform = transform
        self.pin_threads = pin_threads
        self.iterable = iterable
        self.source = _choose_source(iterable, self.device, worker_ring)
        self._cuda = self.device.type == "cuda"
        self._lane = Lane(self.device, depth, transform, self._cuda, pin_threads)
        self._one_shot = isinstance(iterable, collections.abc.Iterator)   # a generator, map(), iter(x)...
        self._epoch: Any = None       # the current pass: itself (one-shot source) or a weakref to it

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Pass:
        """A pass over the source (see "Iterating twice" in the class doc)."""
        old = self._current_epoch()
        if self._one_shot and old is not None:
            if not old.closed:
                return old   # an iterator source is one stream: carry on where the last loop stopped
            if old.dropped:
                raise RuntimeError(
                    f"this Prefetcher's source is a one-shot iterator and {old.dropped} batch(es) already taken "
                    "from it were dropped when the Prefetcher was closed (close() or an interrupt); wrap a "
                    "fresh iterator in a new Prefetcher, or pass a re-iterable source (a list, a DataLoader).")
        elif old is not None:
            old.close(superseded=True)  # one pass at a time: the ring and the copy stream are shared
        lane = self._lane
        lane.cuda = self._cuda
        if lane.cuda and lane.stream is None:
            lane.stream = new_copy_stream(self.device)
        epoch = Pass(lane, self.source, bool(getattr(self.source, "yields_leases", False)),
                     functools.partial(_len_of, self.iterable))
        # a one-shot source's pass is held here, so that `break` loses none of the batches pulled
        # ahead; a re-iterable source's pass is held by the loop alone (dropping it ends it). The pass
        # holds the lane, not this Prefetcher: no reference cycle either way.
        self._epoch = epoch if self._one_shot else weakref.ref(epoch)
        return epoch

    def _current_epoch(self) -> Pass | None:
        e = self._epoch
        return e() if isinstance(e, weakref.ref) else e

    def __len__(self) -> int:
        return _len_of(self.iterable)

    # what the tests and benches look at
    @property
    def _stream(self) -> Any:
        return self._lane.stream

    @property
    def _ring(self) -> PinnedRing | None:
        return self._lane.ring

    # -- stats -----------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        lane = self._lane
        lane.host_wait.clear()
        lane.steps = 0
        lane.bytes = 0
        lane.times.reset()

    def stats(self) -> PrefetchStats:
        """Figures since construction or `reset_stats()`; waits once for pending events (not per step)."""
        lane = self._lane
        device_wait: list[float] = []
        copy_ms = 0.0
        if lane.cuda and lane.stream is not None and lane.timed:
            lane.times.resolve()
            device_wait, copy_ms = list(lane.times.device_wait), lane.times.copy_ms
        ring = lane.ring
        return PrefetchStats(
            device=str(self.device), steps=lane.steps, bytes=lane.bytes, copy_ms=copy_ms,
            gbps=(lane.bytes / (copy_ms * 1e6)) if copy_ms > 0 else 0.0,
            host_wait_ms=list(lane.host_wait), device_wait_ms=device_wait,
            pinned_allocations=ring.allocations if ring else 0,
            pinned_bytes=ring.capacity_bytes if ring else 0)

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """End the current pass, stop the pinning threads and free the pinned buffers."""
        old = self._current_epoch()
        if old is not None:
            old.close()
        if self._lane.ring is not None:
            self._lane.ring.close()
            self._lane.ring = None

    # No __del__: `for x in Prefetcher(src)` drops the Prefetcher as soon as the loop has its pass, which
    # must go on. What it holds goes with the last of the two: a pass closes itself when it is dropped
    # (Pass.__del__), and the pinned ring stops its threads when the lane that owns it is (PinnedRing.__del__).

    def describe(self) -> str:
        """One line: depth, and the ring the batches come through (what a benchmark prints)."""
        src, ring = self.source, self._lane.ring
        if getattr(src, "yields_leases", False) and hasattr(src, "describe"):
            desc = src.describe()
        elif ring is not None:
            desc = f"PinnedRing: {ring.slots} pinned slots, {ring.threads} pinning threads"
        else:
            desc = f"PinnedRing: {2 * self.depth + 1} slots when a pageable batch comes"
        return f"depth {self.depth}; {desc}"

    def __repr__(self) -> str:
        return (f"Prefetcher({type(self.iterable).__name__}, device={str(self.device)!r}, depth={self.depth}"
                f"{', transform=' + getattr(self.transform, '__name__', 'fn') if self.transform else ''})")


def _len_of(iterable: Any) -> int:
    try:
        return len(iterable)
    except TypeError:
        raise TypeError(f"len() of a Prefetcher forwards to the wrapped iterable, and a "
                        f"{type(iterable).__name__} has no len()") from None


def _is_iterable(x: Any) -> bool:
    """Iterable without calling iter() (which would start a DataLoader's workers); text is not a batch source."""
    if isinstance(x, (str, bytes)):
        return False
    cls = type(x)
    return callable(getattr(cls, "__iter__", None)) or callable(getattr(cls, "__getitem__", None))


def _choose_source(iterable: Iterable, device: torch.device, worker_ring: bool) -> Iterable:
    """A DataLoader with workers feeding a GPU becomes a PinnedWorkerLoader, when one is available."""
    if not worker_ring or device.type != "cuda" or getattr(iterable, "yields_leases", False):
        return iterable
    from torch.utils.data import DataLoader
    if not isinstance(iterable, DataLoader) or iterable.num_workers == 0:
        return iterable
    try:
        from gobrrr.loader.worker_ring import PinnedWorkerLoader
    except ImportError:
        return iterable
    try:
        return PinnedWorkerLoader.from_dataloader(iterable)
    except (TypeError, ValueError, NotImplementedError) as e:
        warnings.warn(f"Prefetcher: keeping the DataLoader as it is ({e}); batches will be pinned by "
                      "the main process, which is slower. Pass worker_ring=False to silence this.",
                      stacklevel=3)
        return iterable
