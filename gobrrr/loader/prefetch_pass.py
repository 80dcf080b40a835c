"""One pass of a `Prefetcher` over its source: pull, pin, copy on the side stream, hand over.

What one `next()` enqueues (depth 2 shown; nothing here waits for the GPU):

    host:  pull batch k+2 (its pageable leaves start pinning on the ring's threads)
           allocate batch k+1's device memory on the consumer stream; record `allocated` there
    copy stream:     wait `allocated`; H2D copy of batch k+1; record `ready`
    consumer stream: record `waited_at`; wait `ready` of batch k; <- the step the caller enqueues next

    # overlap: batch k+1's H2D copy (copy stream, DMA engine) with step k (consumer stream, SMs)
    # overlap: pinning of batch k+2 (the ring's threads) with both

Memory. Device batches are allocated in the consumer stream's order: a batch the consumer has
dropped goes back to that stream's pool, where stream order alone makes its reuse safe, and the
copy stream writes fresh memory only after the consumer's work enqueued before the allocation
(`allocated`). So the device holds at most depth + 1 batches however far the host runs ahead;
handing memory over with `record_stream` instead (as a hand-rolled side stream does) parks freed
blocks behind events and cudaMallocs new ones meanwhile. A transform allocates its outputs on the
copy stream: those are handed over with `record_stream`.

Per-step host cost. In a step bound by the host (many small kernels: the 70-layer MLP of issue 28
enqueues 142 kernels in ~3.5 ms, as long as the GPU takes to run them), every microsecond this
code spends is a microsecond of step time. So the hot path makes three events and two stream
switches per batch and nothing else: the timing events double as the ordering ones (`allocated`,
`ready`, `waited_at`; see `StepTimes`), and the copy stream is made current with `set_stream`
rather than `torch.cuda.stream()`, which builds Stream objects and compares devices each time.

A pass holds the `Lane` (what every pass of one Prefetcher shares), never the Prefetcher: a
Prefetcher over a generator keeps its pass, and a reference back would make a cycle that only the
cyclic collector frees (see forking.py for why garbage holding pinned memory must not wait for it).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from gobrrr.loader.pinned import PinnedRing, StagedBatch
from gobrrr.loader.tree import map_tensors, tensors

KEEP_STEPS = 100_000   # per-step figures kept for stats(): bounded memory however long the run
FOLD_EVERY = 32        # timing records resolved in groups once this many more are pending


class StepTimes:
    """Device wait and copy time per step, from the ordering events themselves; resolved lazily.

    Per step: `allocated` (consumer stream, before the copy may start), `ready` (copy stream,
    after the copy [and transform]), `copied` (after the copy alone; `ready` without a transform)
    and `waited_at` (consumer stream, just before it waits on `ready`). The consumer stalled
    for max(0, ready - waited_at); the copy ran from max(allocated, the previous ready) to
    `copied`. Records are folded into lists FOLD_EVERY at a time, once a later record's events
    have completed (one `query()` per group, no wait).
    """

    def __init__(self):
        self.pending: deque = deque()              # (allocated, copied, ready, waited_at)
        self.device_wait: deque[float] = deque(maxlen=KEEP_STEPS)
        self.copy_ms = 0.0
        self._prev_ready: Any = None

    def add(self, allocated: Any, copied: Any, ready: Any, waited_at: Any) -> None:
        self.pending.append((allocated, copied, ready, waited_at))
        if len(self.pending) >= 3 * FOLD_EVERY:
            last = self.pending[FOLD_EVERY - 1]
            if last[2].query() and last[3].query():   # the copy stream and the consumer are past it
                for _ in range(FOLD_EVERY):
                    try:
                        self._fold(*self.pending[0])
                    except RuntimeError:   # an event not done yet (the consumer switched streams): later
                        break
                    self.pending.popleft()

    def _fold(self, allocated: Any, copied: Any, ready: Any, waited_at: Any) -> None:
        start = allocated
        if self._prev_ready is not None and allocated.elapsed_time(self._prev_ready) > 0:
            start = self._prev_ready                 # the copy stream was still busy with the one before
        copy_ms, wait_ms = start.elapsed_time(copied), waited_at.elapsed_time(ready)   # raise if not done
        self.copy_ms += max(0.0, copy_ms)
        self.device_wait.append(max(0.0, wait_ms))
        self._prev_ready = ready

    def resolve(self) -> None:
        if self.pending:
            # sync: stats() was asked for; wait for the pending events (done long ago but the newest), never per step
            while self.pending:
                rec = self.pending.popleft()
                for e in rec:
                    e.synchronize()
                self._fold(*rec)

    def reset(self) -> None:
        self.pending.clear()
        self.device_wait.clear()
        self.copy_ms = 0.0
        self._prev_ready = None


@dataclass
class Lane:
    """What every pass of one Prefetcher shares: device, depth, copy stream, staging ring, counters."""
    device: torch.device
    depth: int
    transform: Callable[[Any], Any] | None
    cuda: bool
    pin_threads: int | None = None
    stream: Any = None                     # the copy stream, made on the first pass, kept for life
    ring: PinnedRing | None = None
    timed: bool = True                     # experiment switch (bench prefetch_busy): events not timed
    host_wait: deque = field(default_factory=lambda: deque(maxlen=KEEP_STEPS))   # ms per step
    steps: int = 0
    bytes: int = 0
    times: StepTimes = field(default_factory=StepTimes)

    def pinned_ring(self) -> PinnedRing:
        if self.ring is None:
            # slots: depth-1 launched + depth being pinned ahead + 2 so a slot's reuse rarely waits
            self.ring = PinnedRing(2 * self.depth + 1, threads=self.pin_threads, pin=True, device=self.device)
        return self.ring

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=self.timed)


@dataclass
class _Pending:
    """A batch pulled from the source, not yet copied: staged in a pinned slot, or ready as is."""
    staged: StagedBatch
    release: Callable[[Any], None] | None = None   # a PinnedWorkerLoader lease's release(event)


class Pass:
    """One pass over the source. Holds no thread; dropping it (break, GC) releases everything."""

    def __init__(self, lane: Lane, source: Any, leases: bool, length: Callable[[], int]):
        self.lane = lane
        self.length = length      # len() of what the Prefetcher wraps
        self.device = lane.device
        self.leases = leases
        self.it: Any = iter(source)
        self.pending: deque[_Pending] = deque()
        self.launched: deque[tuple] = deque()   # (device batch, allocated, copied, ready, consumer, transformed)
        self.exhausted = False
        self.error: BaseException | None = None
        self.closed = False
        self.superseded = False   # ended by a newer pass over the same Prefetcher
        self.dropped = 0          # batches pulled from the source but never handed over, at close
        self.waited = 0.0         # host seconds spent waiting for data since the last handed batch
        if lane.cuda:
            # the copy stream starts after everything already enqueued on the current stream
            # (e.g. a transform's mean/std tensors created just before the loop); once per pass
            lane.stream.wait_stream(torch.cuda.current_stream(self.device))

    def __iter__(self) -> Pass:
        return self

    def __next__(self) -> Any:
        if self.closed:
            if self.superseded:
                raise RuntimeError("this pass over the Prefetcher was ended by a newer iter() of the same "
                                   "Prefetcher (one pass at a time: they share its pinned slots and copy "
                                   "stream); finish or break out of one loop before starting the next, or "
                                   "wrap the source in two Prefetchers.")
            raise StopIteration
        lane = self.lane
        if not lane.cuda:
            return self._next_cpu()
        consumer = torch.cuda.current_stream(self.device)
        try:
            self._fill_launched(consumer)
        except BaseException:   # a pinning error, a tensor on the wrong GPU, Ctrl-C: the pass is over
            self.close()
            raise
        if not self.launched:
            error, self.error = self.error, None
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        batch, allocated, copied, ready, allocated_on, transformed = self.launched.popleft()
        if lane.timed:
            waited_at = torch.cuda.Event(enable_timing=True)
            waited_at.record(consumer)
            lane.times.add(allocated, copied, ready, waited_at)
        consumer.wait_event(ready)   # the consumer's stream, not the host, waits for the copy
        if transformed or consumer != allocated_on:
            for t in tensors(batch):
                if t.device == self.device:
                    # memory allocated on another stream is now used on this one: tell the allocator,
                    # so that it does not hand the block out again before this step's kernels ran
                    t.record_stream(consumer)
        lane.host_wait.append(self.waited * 1e3)
        lane.steps += 1
        self.waited = 0.0
        self._pull()  # start pinning the next batches while this step computes
        return batch

    # -- CPU: pass through -------------------------------------------------------------------------
    def _next_cpu(self) -> Any:
        t0 = time.perf_counter()
        try:
            item = next(self.it)
        except BaseException:   # the end, or the source's own error: either way this pass is over
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
        if self.lane.transform is not None:
            batch = self.lane.transform(batch)
        self.lane.host_wait.append(waited * 1e3)
        self.lane.steps += 1
        return batch

    # -- CUDA: pull, pin, copy -------------------------------------------------------------------------
    def _pull(self) -> None:
        """Take batches from the source until `depth` are pulled ahead; pinning starts at once."""
        while not self.exhausted and len(self.pending) < self.lane.depth:
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
                self.pending.append(_Pending(self.lane.pinned_ring().stage(item)))

    def _fill_launched(self, consumer: Any) -> None:
        while len(self.launched) < self.lane.depth:
            self._pull()
            if not self.pending:
                return
            self._launch(self.pending.popleft(), consumer)

    def _launch(self, p: _Pending, consumer: Any) -> None:
        """Enqueue batch p's host-to-device copy on the copy stream; never waits on the GPU."""
        lane, staged, device = self.lane, p.staged, self.device
        t0 = time.perf_counter()
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []   # (device dst, pinned src)

        def destination(t: torch.Tensor) -> torch.Tensor:
            if t.device == device:
                return t  # already there: nothing to copy
            if t.device.type != "cpu":
                raise ValueError(f"a batch tensor is already on {t.device} but this Prefetcher moves batches "
                                 f"to {device}; keep the dataset's tensors on the CPU, or create the "
                                 f"Prefetcher with device='{t.device}'")
            dst = torch.empty_like(t, device=device)
            copies.append((dst, t))
            return dst

        try:
            host_batch = staged.result()   # waits only if the pinning threads are behind
            # allocated HERE, on the host, on the consumer stream (the current one): see the module doc
            if staged.slot is not None and staged.nbytes:
                # one DMA for every staged tensor of the batch: the slot's used bytes, then views
                flat = torch.empty(staged.nbytes, dtype=torch.uint8, device=device)   # (nbytes,) uint8
                copies.append((flat, staged.slot.buf[:staged.nbytes]))
                batch = staged.rebuild(flat, destination)
            else:
                batch = map_tensors(destination, host_batch)
        except BaseException:
            self._release(p, None)   # nothing was enqueued from it
            raise
        finally:
            self.waited += time.perf_counter() - t0
        allocated = lane.event()
        allocated.record(consumer)
        stream = lane.stream
        stream.wait_event(allocated)     # fresh memory is written only after the consumer's earlier work
        current_device = torch.cuda.current_device()
        torch.cuda.set_stream(stream)    # copies and the transform run on the copy stream
        try:
            # overlap: this copy (copy stream, DMA engine) with the step the consumer runs now
            try:
                for dst, src in copies:
                    dst.copy_(src, non_blocking=True)   # pinned source: an asynchronous DMA
                    lane.bytes += src.numel() * src.element_size()
            finally:
                copied = lane.event()
                copied.record(stream)
                self._release(p, copied)  # the slot is rewritten only after `copied` completed
            ready = copied
            if lane.transform is not None:
                inputs = [t for t in tensors(batch) if t.device == device]
                batch = lane.transform(batch)
                for t in inputs:
                    t.record_stream(stream)   # read on the copy stream, allocated in consumer order
                ready = lane.event()
                ready.record(stream)
        finally:
            torch.cuda.set_stream(consumer)
            if current_device != device.index:
                torch.cuda.set_device(current_device)   # set_stream made our device the current one
        # a transform allocates its outputs on the copy stream: those need record_stream at hand-over
        self.launched.append((batch, allocated, copied, ready, consumer, lane.transform is not None))

    def _release(self, p: _Pending, event: Any) -> None:
        if p.release is not None:
            p.release(event)                    # a PinnedWorkerLoader slot
        elif self.lane.ring is not None:
            self.lane.ring.release(p.staged, event)

    # -- lifetime ------------------------------------------------------------------------------------------
    def close(self, superseded: bool = False) -> None:
        """Stop the pass: free the slots and leases it holds and let go of the source iterator."""
        if self.closed:
            return
        self.closed = True
        self.superseded = superseded
        self.dropped = len(self.pending) + len(self.launched)
        ring = self.lane.ring
        while self.pending:
            p = self.pending.popleft()
            if p.release is not None:
                p.release(None)     # nothing was copied from it
            elif ring is not None:
                # the single coordinator thread finishes this fill before it starts any later one
                # for the same slot, so the slot can be handed out again without an event
                ring.release(p.staged, None)
        while self.launched:
            _, _, _, ready, allocated_on, _ = self.launched.popleft()
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
        return self.length()
