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
  the consumer's work enqueued before that allocation, so the caching allocator's ordinary
  stream-ordered reuse is safe and device memory stays at depth + 1 batches however far the
  host runs ahead. Only a transform's outputs, allocated on the copy stream, are handed over
  with `record_stream` (the proof is in `_Epoch._launch`).
- `stats()` is measured with CUDA events and resolved only when asked for: no sync per step.

A `DataLoader` with worker processes is swapped for a `PinnedWorkerLoader`
(gobrrr/loader/worker_ring.py: workers collate straight into page-locked shared memory) when
the target is a GPU; pass `worker_ring=False` to keep the DataLoader as it is.
On the CPU (or `device=None` without CUDA) the same API passes batches through unchanged.
"""
from __future__ import annotations

import collections.abc
import statistics
import time
import warnings
import weakref
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import torch

from gobrrr.loader.pinned import PinnedRing, StagedBatch
from gobrrr.loader.streams import GpuTimer, new_copy_stream, resolve_device
from gobrrr.loader.tree import map_tensors, tensors

KEEP_STEPS = 100_000   # per-step figures kept for stats(): bounded memory however long the run


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

    # experiment switches, read by gobrrr/bench/prefetch_busy.py (not API): where device batches are
    # allocated, and whether every step records timing events for stats()
    _alloc_on_copy_stream = False
    _timed = True

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
        self._stream = None          # the copy stream, made on first use, kept for life
        self._ring: PinnedRing | None = None
        self._one_shot = isinstance(iterable, collections.abc.Iterator)   # a generator, map(), iter(x)...
        self._epoch: Any = None       # the current pass: itself (one-shot source) or a weakref to it
        self.reset_stats()

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> "_Epoch":
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
        if self._cuda and self._stream is None:
            self._stream = new_copy_stream(self.device)
            self._wait_timer = GpuTimer(self.device)
            self._copy_timer = GpuTimer(self.device, stream=self._stream)
        epoch = _Epoch(self)
        # a one-shot source's pass is held here, so that `break` loses none of the batches pulled
        # ahead; a re-iterable source's pass is held by the loop alone (dropping it ends it)
        self._epoch = epoch if self._one_shot else weakref.ref(epoch)
        return epoch

    def _current_epoch(self) -> "_Epoch | None":
        e = self._epoch
        return e() if isinstance(e, weakref.ref) else e

    def __len__(self) -> int:
        try:
            return len(self.iterable)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"len() of a Prefetcher forwards to the wrapped iterable, and a "
                            f"{type(self.iterable).__name__} has no len()") from None

    def _pinned_ring(self) -> PinnedRing:
        if self._ring is None:
            # slots: depth-1 launched + depth being pinned ahead + 2 so a slot's reuse rarely waits
            self._ring = PinnedRing(2 * self.depth + 1, threads=self.pin_threads, pin=True, device=self.device)
        return self._ring

    # -- stats -----------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        self._host_wait: deque[float] = deque(maxlen=KEEP_STEPS)   # the last steps' host waits, ms
        self._steps = 0
        self._bytes = 0
        if self._cuda and self._stream is not None:
            self._wait_timer.reset()
            self._copy_timer.reset()

    def stats(self) -> PrefetchStats:
        """Figures since construction or `reset_stats()`; waits once for pending events (not per step)."""
        device_wait: list[float] = []
        copy_ms = 0.0
        if self._cuda and self._stream is not None:
            device_wait = self._wait_timer.times_ms()
            copy_ms = self._copy_timer.total_ms
        ring = self._ring
        return PrefetchStats(
            device=str(self.device), steps=self._steps, bytes=self._bytes, copy_ms=copy_ms,
            gbps=(self._bytes / (copy_ms * 1e6)) if copy_ms > 0 else 0.0,
            host_wait_ms=list(self._host_wait), device_wait_ms=device_wait,
            pinned_allocations=ring.allocations if ring else 0,
            pinned_bytes=ring.capacity_bytes if ring else 0)

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """End the current pass, stop the pinning threads and free the pinned buffers."""
        old = self._current_epoch()
        if old is not None:
            old.close()
        if self._ring is not None:
            self._ring.close()
            self._ring = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def describe(self) -> str:
        """One line: depth, and the ring the batches come through (what a benchmark prints)."""
        src = self.source
        if getattr(src, "yields_leases", False) and hasattr(src, "describe"):
            ring = src.describe()
        elif self._ring is not None:
            ring = f"PinnedRing: {self._ring.slots} pinned slots, {self._ring.threads} pinning threads"
        else:
            ring = f"PinnedRing: {2 * self.depth + 1} slots when a pageable batch comes"
        return f"depth {self.depth}; {ring}"

    def __repr__(self) -> str:
        return (f"Prefetcher({type(self.iterable).__name__}, device={str(self.device)!r}, depth={self.depth}"
                f"{', transform=' + getattr(self.transform, '__name__', 'fn') if self.transform else ''})")


@dataclass
class _Pending:
    """A batch pulled from the source, not yet copied: staged in a pinned slot, or ready as is."""
    staged: StagedBatch
    release: Callable[[Any], None] | None = None   # a PinnedWorkerLoader lease's release(event)


class _Epoch:
    """One pass over the source. Holds no thread; dropping it (break, GC) releases everything."""

    def __init__(self, owner: Prefetcher):
        self.pf = owner
        self.device = owner.device
        self.leases = bool(getattr(owner.source, "yields_leases", False))
        self.it: Any = iter(owner.source)
        self.pending: deque[_Pending] = deque()
        self.launched: deque[tuple] = deque()   # (device batch, ready event, consumer stream, transformed)
        self.exhausted = False
        self.error: BaseException | None = None
        self.closed = False
        self.superseded = False   # ended by a newer pass over the same Prefetcher
        self.dropped = 0          # batches pulled from the source but never handed over, at close
        self.waited = 0.0   # host seconds spent waiting for data since the last handed batch
        if owner._cuda:
            # the copy stream starts after everything already enqueued on the current stream
            # (e.g. a transform's mean/std tensors created just before the loop); once per epoch
            owner._stream.wait_stream(torch.cuda.current_stream(self.device))

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Any:
        if self.closed:
            if self.superseded:
                raise RuntimeError("this pass over the Prefetcher was ended by a newer iter() of the same "
                                   "Prefetcher (one pass at a time: they share its pinned slots and copy "
                                   "stream); finish or break out of one loop before starting the next, or "
                                   "wrap the source in two Prefetchers.")
            raise StopIteration
        if not self.pf._cuda:
            return self._next_cpu()
        try:
            self._fill_launched()
        except BaseException:   # a pinning error, a tensor on the wrong GPU, Ctrl-C: the epoch is over
            self.close()
            raise
        if not self.launched:
            error, self.error = self.error, None
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        batch, ready, allocated_on, transformed = self.launched.popleft()
        consumer = torch.cuda.current_stream(self.device)
        pf = self.pf
        if pf._timed:
            pf._wait_timer.start(consumer)
        consumer.wait_event(ready)   # the consumer's stream, not the host, waits for the copy
        if pf._timed:
            pf._wait_timer.stop(consumer)
        if transformed or consumer != allocated_on:
            for t in tensors(batch):
                if t.device == self.device:
                    # memory allocated on another stream is now used on this one: tell the allocator,
                    # so that it does not hand the block out again before this step's kernels ran
                    t.record_stream(consumer)
        pf._host_wait.append(self.waited * 1e3)
        pf._steps += 1
        self.waited = 0.0
        self._pull()  # start pinning the next batches while this step computes
        return batch

    # -- CPU: pass through -------------------------------------------------------------------------
    def _next_cpu(self) -> Any:
        t0 = time.perf_counter()
        try:
            item = next(self.it)
        except BaseException:   # the end, or the source's own error: either way this epoch is over
            self.close()
            raise
        waited = time.perf_counter() - t0
        if self.leases:
            # the lease's memory is reused once released: hand the consumer its own copy
            batch = map_tensors(lambda t: t.clone(), item.batch)
            item.release(None)
        else:
            batch = item
        for t in tensors(batch):
            if t.device.type != "cpu":
                raise ValueError(f"a batch tensor is on {t.device} but this Prefetcher's device is cpu; "
                                 "create it with device=None or the tensor's device")
        if self.pf.transform is not None:
            batch = self.pf.transform(batch)
        self.pf._host_wait.append(waited * 1e3)
        self.pf._steps += 1
        return batch

    # -- CUDA: pull, pin, copy -------------------------------------------------------------------------
    def _pull(self) -> None:
        """Take batches from the source until `depth` are pulled ahead; pinning starts at once."""
        while not self.exhausted and len(self.pending) < self.pf.depth:
            t0 = time.perf_counter()
            try:
                item = next(self.it)
            except StopIteration:
                self.exhausted = True
                break
            except Exception as e:  # deliver the batches before it first, then raise it
                self.exhausted = True
                self.error = e
                break
            finally:
                self.waited += time.perf_counter() - t0
            if self.leases:
                self.pending.append(_Pending(StagedBatch(None, item.batch, None), item.release))
            else:
                self.pending.append(_Pending(self.pf._pinned_ring().stage(item)))

    def _fill_launched(self) -> None:
        while len(self.launched) < self.pf.depth:
            self._pull()
            if not self.pending:
                return
            self._launch(self.pending.popleft())

    def _launch(self, p: _Pending) -> None:
        """Enqueue batch p's host-to-device copy on the copy stream; never waits on the GPU."""
        pf, staged = self.pf, p.staged
        t0 = time.perf_counter()
        try:
            host_batch = staged.result()   # waits only if the pinning threads are behind
            consumer = torch.cuda.current_stream(self.device)
            # Destinations are allocated HERE, on the host, in the consumer stream's order (the
            # current stream): when the consumer drops a batch its memory returns to the consumer
            # stream's pool, where stream order alone makes reuse safe. The copy stream writes into
            # fresh memory only after the consumer's work enqueued so far (which may still read
            # that memory under an earlier owner) has run: `allocated` below. Device memory is
            # then at most depth + 1 batches however far the host runs ahead, which record_stream
            # (reuse delayed until an event, so fresh cudaMallocs meanwhile) does not give.
            copies: list[tuple[torch.Tensor, torch.Tensor]] = []   # (device dst, pinned src)

            def destination(t: torch.Tensor) -> torch.Tensor:
                if t.device == self.device:
                    return t  # already there: nothing to copy
                if t.device.type != "cpu":
                    raise ValueError(f"a batch tensor is already on {t.device} but this Prefetcher moves batches "
                                     f"to {self.device}; keep the dataset's tensors on the CPU, or create the "
                                     f"Prefetcher with device='{t.device}'")
                dst = torch.empty_like(t, device=self.device)
                copies.append((dst, t))
                return dst

            alloc_on = pf._stream if pf._alloc_on_copy_stream else consumer
            with torch.cuda.stream(alloc_on):
                if staged.slot is not None and staged.nbytes:
                    # one DMA for every staged tensor of the batch: the slot's used bytes, then views
                    flat = torch.empty(staged.nbytes, dtype=torch.uint8, device=self.device)   # (nbytes,) uint8
                    copies.append((flat, staged.slot.buf[:staged.nbytes]))
                    batch = staged.rebuild(flat, destination)
                else:
                    batch = map_tensors(destination, host_batch)
        except BaseException:
            self._release(p, None)   # nothing was enqueued from it
            raise
        finally:
            self.waited += time.perf_counter() - t0
        stream = pf._stream
        if alloc_on is consumer:
            allocated = torch.cuda.Event()
            allocated.record(consumer)
        with torch.cuda.stream(stream):
            # overlap: this copy (copy stream, DMA engine) with the step the consumer runs now
            if alloc_on is consumer:
                stream.wait_event(allocated)
            if pf._timed:
                pf._copy_timer.start(stream)
            try:
                for dst, src in copies:
                    dst.copy_(src, non_blocking=True)   # pinned source: an asynchronous DMA
                    pf._bytes += src.numel() * src.element_size()
            finally:
                if pf._timed:
                    copied = pf._copy_timer.stop(stream)
                else:
                    copied = torch.cuda.Event()
                    copied.record(stream)
                self._release(p, copied)  # the slot is rewritten only after `copied` completed
            if pf.transform is not None:
                inputs = [t for t in tensors(batch) if t.device == self.device]
                batch = pf.transform(batch)
                for t in inputs:
                    t.record_stream(stream)   # read on the copy stream, allocated in consumer order
                ready = torch.cuda.Event()
                ready.record(stream)
            else:
                ready = copied
        # a transform allocates its outputs on the copy stream: those need record_stream at hand-over
        self.launched.append((batch, ready, alloc_on, pf.transform is not None))

    def _release(self, p: _Pending, event: Any) -> None:
        if p.release is not None:
            p.release(event)                    # a PinnedWorkerLoader slot
        elif self.pf._ring is not None:
            self.pf._ring.release(p.staged, event)

    # -- lifetime ------------------------------------------------------------------------------------------
    def close(self, superseded: bool = False) -> None:
        """Stop the pass: free the slots and leases it holds and let go of the source iterator."""
        if self.closed:
            return
        self.closed = True
        self.superseded = superseded
        self.dropped = len(self.pending) + len(self.launched)
        ring = self.pf._ring if self.pf is not None else None
        while self.pending:
            p = self.pending.popleft()
            if p.release is not None:
                p.release(None)     # nothing was copied from it
            elif ring is not None:
                # the single coordinator thread finishes this fill before it starts any later one
                # for the same slot, so the slot can be handed out again without an event
                ring.release(p.staged, None)
        while self.launched:
            _, ready, allocated_on, _ = self.launched.popleft()
            # a batch never handed over goes back to the consumer stream's pool while its copy may
            # still be running: order that stream after the copy (on the GPU) before letting it go
            allocated_on.wait_event(ready)
        it, self.it = self.it, None
        # a generator runs its finally blocks now; a DataLoader's worker processes stop now (left to
        # GC, an iterator whose worker raised takes 5 s to shut down, and a traceback may keep it alive)
        for name in ("close", "_shutdown_workers"):
            stop = getattr(it, name, None)
            if callable(stop):
                try:
                    stop()
                except Exception:
                    pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __len__(self) -> int:
        return len(self.pf)


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
