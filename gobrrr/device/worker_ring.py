"""PinnedWorkerLoader: DataLoader workers collate straight into a ring of page-locked shared slots.

Why. With `DataLoader(num_workers=N, pin_memory=True)` every batch is built three times over:
the worker stacks the samples into fresh shared memory (page faults on ~80 MB), the main
process receives a file descriptor and maps it, and a single pin-memory thread memcpy's the whole
batch again into the caching host allocator's pinned memory. On an H200 that path ran at ~17x the
copy floor. Here each batch is built once:

    main process                                   worker k (forked, never touches CUDA)
    ------------                                   ------------------------------------
    ring = S slots of anonymous MAP_SHARED memory, allocated before the fork, so every worker
           inherits the same physical pages; page-locked once with cudaHostRegister
    send (batch i, indices, slot s) ------------->  samples = [dataset[j] for j in indices]
                                                    torch.stack(samples, out=<view of slot s>)
    <------------- (i, s, skeleton)                 the skeleton is the batch structure with each
                                                    tensor replaced by (offset, shape, dtype): tiny
    yield Leased(batch=<views of slot s>, release)
    consumer: copy_stream: batch.to(dev, non_blocking=True); event.record(copy_stream); release(event)
    slot s goes back to the free list once event.query() says the copy is done

The main process copies nothing per batch: it pickles an index list and unpickles a skeleton.
# overlap: workers fill slot s+1.. while the copy engine drains slot s while the GPU computes.

Each worker owns its slots (slot s belongs to worker s % num_workers; batch i goes to worker
i % num_workers, as in a DataLoader) and maps a slot's pages with one madvise before its first
write to it. Why: a forked child inherits the shared mapping but not its page-table entries, so
every first write to a 4 KiB page is a minor fault. With a shared free list each worker wrote most
slots over an epoch, taking ~6,000 faults per batch, and the ring produced a batch every 4.7-6.1 ms
where the same workers stacking into private buffers took 2.4-4.0 ms (6 workers, 78.6 MB batches,
H200 host); see slots.py. Slots: 4 per worker by default (`default_slots`).

Slots are sized from the first batch, which the main process collates itself (it learns the leaf
shapes and dtypes and yields that batch from slot 0). A smaller batch (the odd last one) uses the
front of its slot; a batch that does not fit (or a custom collate that returns no tensors) falls
back to the ordinary pickled path and is yielded with a no-op release.

On a machine without CUDA (or `pin=False`) the slots are plain shared memory and `release(None)`
frees a slot at once. Workers use the "fork" start method (Linux, macOS); they are started per
epoch, as a default DataLoader does, while the slots live as long as the loader.
"""
from __future__ import annotations

import os
import queue
import random
import time
import traceback
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import collate as _collate, default_collate_fn_map
from torch.utils.data.dataloader import default_collate

from gobrrr.device.slots import (ALIGN, NoRoom, SlotRing, SlotWriter, is_leaf_ref, leaf_view, map_tree,
                                 packed_size, prefault)


@dataclass
class Leased:
    """A batch whose tensors are views of a page-locked slot, plus the way to hand the slot back.

    Enqueue the host-to-device copy of `batch`, record a CUDA event on the copy stream, then call
    `release(event)`; the slot is reused only after that event completes. `release(None)` frees it
    at once (CPU, or after the data has been consumed on the host).
    """
    batch: Any
    release: Callable[[Any], None]


@dataclass
class _Pickled:
    """A batch that did not fit its slot, sent through ordinary (pickled, shared-memory) transport."""
    batch: Any




@dataclass
class _Failure:
    """An exception raised inside a worker, with its traceback already formatted there."""
    worker_id: int
    exc_type: type
    text: str

    def reraise(self):
        msg = (f"Caught {self.exc_type.__name__} in PinnedWorkerLoader worker {self.worker_id}.\n"
               f"Original traceback in the worker:\n{self.text}")
        try:
            err = self.exc_type(msg)
        except Exception:  # exception types whose constructor wants other arguments
            err = RuntimeError(msg)
        raise err


# ---------------------------------------------------------------- worker process

def _worker_loop(worker_id: int, dataset, collate_fn, fast_collate: bool, ring_views, index_q, result_q,
                 seed: int, worker_init_fn, parent_pid: int) -> None:
    """Runs in a forked child. Never touches CUDA: slots are plain CPU memory here."""
    torch.set_num_threads(1)
    random.seed(seed)
    torch.default_generator.manual_seed(seed)  # the CPU generator only: nothing here may touch CUDA
    try:
        import numpy as np
        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    if worker_init_fn is not None:
        try:
            worker_init_fn(worker_id)
        except Exception as e:
            result_q.put((-1, -1, None, _Failure(worker_id, type(e), traceback.format_exc())))
            return
    mapped: set[int] = set()  # slots whose pages this process has mapped (see slots.prefault)
    while True:
        try:
            task = index_q.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent_pid:
                return  # the main process died; do not linger as an orphan
            continue
        if task is None:
            result_q.cancel_join_thread()  # exit now even if the main process stopped reading
            return
        idx, indices, slot = task
        try:
            if slot not in mapped:  # first write to this slot in this process: map it in one call
                prefault(ring_views[slot])
                mapped.add(slot)
            samples = [dataset[i] for i in indices]
            writer = SlotWriter(ring_views[slot])
            try:
                if fast_collate:
                    fmap = {**default_collate_fn_map, torch.Tensor: writer.stack_fn}
                    batch = _collate(samples, collate_fn_map=fmap)
                else:
                    batch = collate_fn(samples)
                result = (idx, slot, writer.pack(batch), None)
            except NoRoom:
                result = (idx, slot, _Pickled((collate_fn or default_collate)(samples)), None)
        except Exception as e:
            result = (idx, slot, None, _Failure(worker_id, type(e), traceback.format_exc()))
        result_q.put(result)


# ---------------------------------------------------------------- the loader

SLOTS_PER_WORKER = 4  # one being filled, up to three built ahead of a worker that lags behind


def default_slots(num_workers: int, slot_bytes: int, ram_bytes: int | None = None) -> int:
    """Slots per worker: 4, or fewer (down to 2) while the ring would exceed min(8 GiB, RAM / 4).

    Why 4: batches are delivered in order, round-robin over the workers, so one worker that is
    momentarily slow (a busy core) stalls the others once their own slots are full; measured on an
    H200 host (6 workers, 78.6 MB batches, no GPU copy), 4 slots per worker produced a batch every
    2.50-2.95 ms over 3 runs, 3 per worker every 3.05-4.02 ms. Page-locked memory is scarce, hence
    the cap; pass `slots=` to choose.
    """
    if ram_bytes is None:
        try:
            ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            ram_bytes = 32 * 2**30
    budget = min(8 * 2**30, ram_bytes // 4)
    per = SLOTS_PER_WORKER
    while per > 2 and per * num_workers * slot_bytes > budget:
        per -= 1
    return max(per * num_workers, 2)


class PinnedWorkerLoader:
    """A DataLoader whose workers collate into page-locked shared slots; yields `Leased` batches.

    Same index order as `torch.utils.data.DataLoader` with the same dataset, sampler, batch size,
    drop_last and generator. Map-style datasets only.
    """
    yields_leases = True

    def __init__(self, dataset, batch_size: int = 1, *, collate_fn=None, num_workers: int = 4,
                 shuffle: bool = False, drop_last: bool = False, sampler=None, batch_sampler=None,
                 generator: torch.Generator | None = None, worker_init_fn=None, slots: int | None = None,
                 slot_bytes: int | None = None, timeout_s: float = 600.0, pin: bool | None = None,
                 device: torch.device | str | None = None):
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError("PinnedWorkerLoader needs a map-style dataset (with __getitem__); "
                            "iterate an IterableDataset through a plain DataLoader instead.")
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers}: the worker ring needs at least one worker; "
                             "use the batches directly (or a DataLoader) without workers.")
        if batch_sampler is None:
            if batch_size is None or batch_size < 1:
                raise ValueError(f"batch_size={batch_size!r}: PinnedWorkerLoader batches samples; "
                                 "give a positive batch_size (or a batch_sampler).")
            if sampler is None:
                sampler = (RandomSampler(dataset, generator=generator) if shuffle
                           else SequentialSampler(dataset))
            elif shuffle:
                raise ValueError("shuffle=True conflicts with an explicit sampler; pass one or the other.")
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset, self.batch_sampler, self.generator = dataset, batch_sampler, generator
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.num_workers, self.worker_init_fn, self.timeout_s = num_workers, worker_init_fn, timeout_s
        self._auto_slots = slots is None  # sized from the first batch by default_slots()
        self.num_slots = slots if slots is not None else SLOTS_PER_WORKER * num_workers
        if self.num_slots < 2:
            raise ValueError(f"slots={slots}: need at least 2 (one being filled, one being copied).")
        self.slot_bytes = slot_bytes
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        self.device = torch.device(device) if device is not None else None
        self._ring: SlotRing | None = None
        self._iter: weakref.ref | None = None  # the live epoch, if any
        self._finalizer = None
        self._warned_fallback = False

    @classmethod
    def from_dataloader(cls, dl: torch.utils.data.DataLoader, **overrides) -> "PinnedWorkerLoader":
        """Same dataset, batch sampler, collate_fn, workers, worker_init_fn and generator as `dl`."""
        if dl.batch_sampler is None:
            raise ValueError("this DataLoader has batch_size=None (no automatic batching); the worker "
                             "ring needs batches: give the DataLoader a batch_size.")
        kw = dict(collate_fn=dl.collate_fn, num_workers=dl.num_workers, batch_sampler=dl.batch_sampler,
                  drop_last=dl.drop_last, generator=dl.generator, worker_init_fn=dl.worker_init_fn)
        kw.update(overrides)
        return cls(dl.dataset, None, **kw)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Leased]:
        old = self._iter() if self._iter is not None else None
        if old is not None:
            old.shutdown()  # one live epoch at a time: its workers write into our slots
        it = _RingIter(self)
        self._iter = weakref.ref(it)  # weak: dropping the iterator (break, GC) stops its workers
        return it

    def _ensure_ring(self, first_batch: Any, scale: int = 1) -> SlotRing:
        if self._ring is None:
            need = self.slot_bytes or packed_size(first_batch) * scale + ALIGN * 8
            if self._auto_slots:
                self.num_slots = default_slots(self.num_workers, need)
            self._ring = SlotRing(self.num_slots, need, self.pin, self.device, owners=self.num_workers)
            self._finalizer = weakref.finalize(self, self._ring.close)
        return self._ring

    @property
    def ring_bytes(self) -> int:
        """Bytes of shared (and, on CUDA, page-locked) memory held by the slots; 0 before the first epoch."""
        return self._ring.nbytes if self._ring is not None else 0

    def close(self) -> None:
        """Stop the workers, wait for copies still reading the slots, unregister and free them."""
        it = self._iter() if self._iter is not None else None
        if it is not None:
            it.shutdown()
        self._iter = None
        if self._finalizer is not None:
            self._finalizer()  # runs SlotRing.close once
        self._ring = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _shutdown_epoch(workers, index_qs, result_q, ring, outstanding: dict, ready: dict, owner_pid: int) -> None:
    """Stop one epoch's workers, then hand back the slots they (or the reorder buffer) held."""
    if os.getpid() != owner_pid:
        return  # collected inside a forked child: these workers are not its children
    for q in index_qs:
        try:
            q.put(None)
        except (OSError, ValueError):
            pass
    for w in workers:
        w.join(timeout=5.0)
        if w.is_alive():
            w.terminate()
            w.join(timeout=5.0)
    for q in [*index_qs, *([result_q] if result_q is not None else [])]:
        q.cancel_join_thread()
        q.close()
    if ring is not None:  # only now: a joined worker can no longer write into these slots
        for slot in outstanding.values():
            ring.release(slot, None)
        for slot, _, _ in ready.values():
            ring.release(slot, None)
    outstanding.clear()
    ready.clear()


class _RingIter:
    """One epoch: forks the workers, hands out slots, yields leases in sampler order."""

    def __init__(self, loader: PinnedWorkerLoader):
        self.loader = loader
        self.timeout_s = loader.timeout_s
        # the same order as DataLoader: the sampler's iterator first, then the workers' base seed
        self.batches = iter(loader.batch_sampler)
        g = loader.generator
        self.base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=g).item())
        self.ready: dict[int, tuple[int, Any, Any]] = {}  # batch idx -> (slot, skeleton, failure)
        self.outstanding: dict[int, int] = {}              # batch idx -> slot, while a worker owns it
        self.send_idx = self.rcvd_idx = 0
        self.exhausted = False
        self.workers: list = []
        self.index_qs: list = []
        self.result_q = None
        self._finalizer = None
        self.ring = loader._ring
        if loader._ring is None:  # first epoch: collate batch 0 here to learn the slot size
            try:
                indices = next(self.batches)
            except StopIteration:
                self.exhausted = True
                return
            first = loader.collate_fn([loader.dataset[i] for i in indices])
            # a short first batch (a custom batch sampler) would size every slot too small: scale it
            full = getattr(loader.batch_sampler, "batch_size", None) or len(indices)
            scale = max(1, -(-int(full) // max(len(indices), 1)))
            ring = loader._ensure_ring(first, scale)
            slot = ring.take()
            writer = SlotWriter(ring.views[slot])
            try:
                self.ready[0] = (slot, writer.pack(first), None)
            except NoRoom:
                self.ready[0] = (slot, _Pickled(first), None)
            self.send_idx = 1
        self.ring = loader._ring
        self._start_workers()

    def _start_workers(self) -> None:
        import torch.multiprocessing as tmp
        try:
            ctx = tmp.get_context("fork")
        except ValueError:
            raise RuntimeError("PinnedWorkerLoader needs the 'fork' start method (Linux or macOS) so the "
                               "workers inherit the shared slots; use a DataLoader on this platform.") from None
        L = self.loader
        fast = L.collate_fn is default_collate
        self.result_q = ctx.Queue()
        for wid in range(self.ring.owners):  # min(num_workers, slots): a worker without a slot has no work
            iq = ctx.Queue()
            w = ctx.Process(target=_worker_loop, daemon=True,
                            args=(wid, L.dataset, L.collate_fn, fast, self.ring.views, iq, self.result_q,
                                  self.base_seed + wid, L.worker_init_fn, os.getpid()))
            w.start()
            self.workers.append(w)
            self.index_qs.append(iq)
        self._finalizer = weakref.finalize(self, _shutdown_epoch, self.workers, self.index_qs, self.result_q,
                                           self.ring, self.outstanding, self.ready, os.getpid())

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def _dispatch(self) -> None:
        """Hand out batches in order, batch i to worker i % workers (like DataLoader), each into one of
        that worker's own free slots; stop at the first batch whose worker has none free."""
        while not self.exhausted:
            slot = self.ring.take(self.send_idx % len(self.index_qs))
            if slot is None:
                return
            try:
                indices = next(self.batches)
            except StopIteration:
                self.exhausted = True
                self.ring.release(slot, None)
                return
            idx = self.send_idx
            self.index_qs[self.ring.owner(slot)].put((idx, list(indices), slot))
            self.outstanding[idx] = slot
            self.send_idx += 1

    def _receive(self) -> None:
        """Wait (bounded) for one worker result; notice dead workers and the overall timeout."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                idx, slot, skel, failure = self.result_q.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
                break
            except queue.Empty:
                dead = [(i, w) for i, w in enumerate(self.workers) if not w.is_alive()]
                if dead:
                    try:  # a worker that reported its error and exited: read the report first
                        idx, slot, skel, failure = self.result_q.get(timeout=0.5)
                        break
                    except queue.Empty:
                        pass
                    i, w = dead[0]
                    self.shutdown()
                    raise RuntimeError(f"PinnedWorkerLoader worker {i} (pid {w.pid}) exited unexpectedly with "
                                       f"exit code {w.exitcode}; a crash in the dataset or out of memory? "
                                       "Try num_workers=0 through a plain DataLoader to see the error.")
                if time.monotonic() > deadline:
                    self.shutdown()
                    raise TimeoutError(f"no batch from the PinnedWorkerLoader workers in {self.timeout_s:.0f} s; "
                                       "raise timeout_s= if the dataset is that slow.")
        if idx < 0:  # worker_init_fn failed
            self.shutdown()
            failure.reraise()
        self.outstanding.pop(idx, None)
        self.ready[idx] = (slot, skel, failure)

    def __next__(self) -> Leased:
        ring = self.ring
        while True:
            if ring is not None and self.workers:
                ring.reclaim()
                self._dispatch()
            if self.rcvd_idx in self.ready:
                slot, skel, failure = self.ready.pop(self.rcvd_idx)
                self.rcvd_idx += 1
                if failure is not None:
                    ring.release(slot, None)
                    self.shutdown()
                    failure.reraise()
                return self._lease(slot, skel)
            if self.rcvd_idx in self.outstanding:
                self._receive()
                continue
            if self.exhausted or ring is None:
                self.shutdown()
                raise StopIteration
            # The next batch has not been handed to a worker: every slot of its worker is leased or in flight.
            if not ring.wait_oldest(self.send_idx % len(self.index_qs)):
                raise RuntimeError(
                    f"all worker slots ({ring.num_slots} in all) are leased and none was released: call "
                    "lease.release(event) after enqueuing each batch's copy (release(None) on CPU), "
                    "or pass a larger slots=.")

    def _lease(self, slot: int, skel: Any) -> Leased:
        ring = self.ring
        if isinstance(skel, _Pickled):
            ring.release(slot, None)  # the batch came through ordinary shared memory
            if not self.loader._warned_fallback:
                self.loader._warned_fallback = True
                warnings.warn(f"PinnedWorkerLoader: a batch did not fit its {ring.slot_bytes}-byte slot (sized "
                              "from the first batch) and took the slower pickled path; pass slot_bytes= "
                              "large enough for the biggest batch.", stacklevel=3)
            return Leased(skel.batch, _no_release)
        view = ring.views[slot]
        batch = map_tree(lambda r: leaf_view(view, r.offset, r.shape, r.dtype), skel, is_leaf_ref)
        done = [False]

        def release(event: Any = None) -> None:
            if done[0]:
                raise RuntimeError("this lease was already released; release each batch exactly once.")
            done[0] = True
            ring.release(slot, event)

        return Leased(batch, release)

    def shutdown(self) -> None:
        """Stop this epoch's workers and return the slots they or the reorder buffer held."""
        if self._finalizer is not None and self._finalizer.alive:
            self._finalizer()  # joins (or terminates) the workers, then returns their slots
        elif self.ring is not None:  # no workers started (empty or one-batch epoch)
            _shutdown_epoch([], [], None, self.ring, self.outstanding, self.ready, os.getpid())
        self.exhausted = True

    close = shutdown  # a consumer that closes its source iterator (as a generator) stops the workers


def _no_release(event: Any = None) -> None:
    """Release of a batch that did not come from a slot: nothing to hand back."""
