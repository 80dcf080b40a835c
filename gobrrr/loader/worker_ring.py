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

Every source a DataLoader takes goes through the same ring, with the same batches in the same
order as the DataLoader (each worker runs torch's own fetcher, seeded and with `get_worker_info()`
set as in a DataLoader worker):
- map-style with batches: the worker stacks the samples straight into its slot;
- `batch_size=None` (each item is already a batch: pre-batched shards): the worker copies the
  item into its slot, once (libc memmove);
- an IterableDataset (batched by the loader or yielding batches): every worker iterates its own
  copy; tasks go to the workers round-robin and a worker whose iterator has ended answers
  `_Ended` and leaves the rotation, which is exactly the interleaving a DataLoader yields.

Slots are sized from the first batch. Map-style: the main process collates batch 0 itself (it
learns the leaf shapes and dtypes and yields that batch from slot 0). IterableDataset: its items
exist only inside the workers, so before the first epoch's workers start a short-lived forked
probe builds worker 0's first batch exactly as worker 0 will, and reports its size. A smaller batch
(the odd last one) uses the front of its slot; a batch that does not fit (or a custom collate that
returns no tensors) falls back to the ordinary pickled path and is yielded with a no-op release.
A second `iter()` while an epoch is open ends that epoch (its workers write into the same slots);
the old iterator then raises RuntimeError instead of stopping quietly.

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
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data._utils.collate import collate as _collate
from torch.utils.data._utils.collate import default_collate_fn_map, default_convert
from torch.utils.data.dataloader import _DatasetKind, _InfiniteConstantSampler, default_collate

from gobrrr.loader import ntcopy
from gobrrr.loader.forking import (
    StderrTap,
    death_message,
    fork_context,
    no_collection_in_children,
    redirect_stderr,
)
from gobrrr.loader.slots import (
    ALIGN,
    NoRoom,
    SlotRing,
    SlotWriter,
    is_leaf_ref,
    leaf_view,
    map_tree,
    packed_size,
    prefault,
)


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

@dataclass
class _Ended:
    """A worker's answer to a task once its IterableDataset is exhausted: nothing in the slot."""
    worker_id: int


@dataclass(frozen=True)
class _Source:
    """What a worker needs to build batch after batch, as a DataLoader worker would (picklable, forked)."""
    dataset: Any
    iterable: bool          # an IterableDataset: each worker iterates its own copy
    auto_collation: bool    # indices are lists (batch_sampler / batch_size); False with batch_size=None
    collate_fn: Callable
    drop_last: bool
    fast_collate: bool      # default_collate: stack samples straight into the slot
    num_workers: int
    worker_init_fn: Callable | None

    def start_worker(self, worker_id: int, base_seed: int):
        """Seed, worker info, worker_init_fn and fetcher exactly as torch's DataLoader worker sets them up.

        Runs in the forked child. Returns torch's own fetcher (the map- or iterable-style `fetch(index)`),
        so that what a task yields (`__getitems__`, per-worker batching of an IterableDataset, drop_last,
        StopIteration at its end) is what the DataLoader's worker would yield for it.
        """
        torch.set_num_threads(1)
        seed = base_seed + worker_id
        random.seed(seed)
        torch.default_generator.manual_seed(seed)  # the CPU generator only: nothing here may touch CUDA
        try:
            import numpy as np
            np.random.seed(_torch_worker._generate_state(base_seed, worker_id))
        except ImportError:
            pass
        # what torch.utils.data.get_worker_info() returns inside the worker: sharding of an
        # IterableDataset (and many worker_init_fn) depend on it
        _torch_worker._worker_info = _torch_worker.WorkerInfo(
            id=worker_id, num_workers=self.num_workers, seed=seed, dataset=self.dataset)
        if self.worker_init_fn is not None:
            self.worker_init_fn(worker_id)
        kind = _DatasetKind.Iterable if self.iterable else _DatasetKind.Map
        return _DatasetKind.create_fetcher(kind, self.dataset, self.auto_collation, self.collate_fn, self.drop_last)


def _into_slot(source: _Source, writer: SlotWriter) -> Callable[[Any], Any]:
    """The collate a worker's fetcher calls: collate into the slot and return the batch's skeleton,
    or the batch as it is (`_Pickled`, built outside the slot) when it does not fit."""
    fmap = {**default_collate_fn_map, torch.Tensor: writer.stack_fn}

    def collate(samples):
        try:
            if source.fast_collate:
                return writer.pack(_collate(samples, collate_fn_map=fmap))
            return writer.pack(source.collate_fn(samples))
        except NoRoom:
            return _Pickled(source.collate_fn(samples))
    return collate


def _worker_loop(worker_id: int, source: _Source, ring_views, index_q, result_q, base_seed: int,
                 parent_pid: int, stderr_fd: int) -> None:
    """Runs in a forked child. Never touches CUDA: slots are plain CPU memory here, and the parent's
    objects are never collected here (forking.no_collection_in_children).

    Answers each task (idx, index, slot) with (idx, slot, skeleton | _Pickled | _Ended, failure).
    """
    redirect_stderr(stderr_fd)   # through the parent's tap: a death is reported with its last lines
    try:
        fetcher = source.start_worker(worker_id, base_seed)
    except Exception as e:   # worker_init_fn, or iter() of an IterableDataset
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
        idx, index, slot = task
        try:
            if slot not in mapped:  # first write to this slot in this process: map it in one call
                prefault(ring_views[slot])
                mapped.add(slot)
            fetcher.collate_fn = _into_slot(source, SlotWriter(ring_views[slot]))
            result = (idx, slot, fetcher.fetch(index), None)
        except StopIteration:   # this worker's IterableDataset is exhausted (torch's fetcher keeps saying so)
            result = (idx, slot, _Ended(worker_id), None)
        except Exception as e:
            result = (idx, slot, None, _Failure(worker_id, type(e), traceback.format_exc()))
        result_q.put(result)


def _probe_loop(worker_id: int, source: _Source, base_seed: int, index: Any, result_q, stderr_fd: int) -> None:
    """Forked before the slots exist: build worker `worker_id`'s first batch exactly as that worker
    will, and report only its size (bytes in a slot, samples in it); the batch itself is dropped."""
    redirect_stderr(stderr_fd)
    try:
        fetcher = source.start_worker(worker_id, base_seed)
        counted: list[int] = []

        def size_of(samples):
            counted.append(len(samples) if source.auto_collation else 1)
            return packed_size(source.collate_fn(samples))
        fetcher.collate_fn = size_of
        try:
            result = (fetcher.fetch(index), counted[0], None)
        except StopIteration:
            result = (None, 0, None)
    except Exception as e:
        result = (None, 0, _Failure(worker_id, type(e), traceback.format_exc()))
    result_q.put(result)
    result_q.close()
    result_q.join_thread()


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

    The same batches in the same order as `torch.utils.data.DataLoader` with the same arguments:
    - map-style datasets with a batch size or batch sampler (sampler, shuffle, drop_last, generator);
    - `batch_size=None`: each item of the dataset is a whole batch (pre-batched shards), converted by
      `collate_fn` (default: `default_convert`, as DataLoader) and copied once into its slot;
    - an `IterableDataset`: each worker iterates its own copy (`get_worker_info()` works as in a
      DataLoader worker, to shard), batching its own items when `batch_size` is given; batches are
      taken from the workers round-robin, and a worker whose iterator ends drops out of the
      rotation, which is the order a DataLoader yields. Every worker owns its own slots, so
      `slots >= num_workers`. The slot size is learnt before the first epoch's workers start, by a
      short-lived forked probe that builds worker 0's first batch (its size only) exactly as worker
      0 then builds it again: a dataset whose start is slow pays that start twice, once; pass
      `slot_bytes=` to skip the probe.
    A worker's exception is re-raised in the main process with the worker's traceback.
    """
    yields_leases = True

    def __init__(self, dataset, batch_size: int | None = 1, *, collate_fn=None, num_workers: int = 4,
                 shuffle: bool = False, drop_last: bool = False, sampler=None, batch_sampler=None,
                 generator: torch.Generator | None = None, worker_init_fn=None, slots: int | None = None,
                 slot_bytes: int | None = None, timeout_s: float = 600.0, pin: bool | None = None,
                 device: torch.device | str | None = None):
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers}: the worker ring needs at least one worker; "
                             "use the batches directly (or a DataLoader) without workers.")
        self.iterable = isinstance(dataset, IterableDataset)
        if self.iterable:
            if shuffle or sampler is not None or batch_sampler is not None:
                raise ValueError("an IterableDataset takes no shuffle, sampler or batch_sampler (its workers "
                                 "decide the order); shuffle inside the dataset's __iter__ instead.")
            sampler = _InfiniteConstantSampler()
        elif sampler is None:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        elif shuffle:
            raise ValueError("shuffle=True conflicts with an explicit sampler; pass one or the other.")
        if batch_sampler is None and batch_size is not None:
            if batch_size < 1:
                raise ValueError(f"batch_size={batch_size!r}: give a positive batch_size, or batch_size=None "
                                 "when every item of the dataset is already a whole batch.")
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset, self.generator = dataset, generator
        self.auto_collation = batch_sampler is not None
        self.batch_sampler = batch_sampler
        self.index_sampler = batch_sampler if self.auto_collation else sampler   # what one task fetches
        self.batch_size = getattr(batch_sampler, "batch_size", None) if self.auto_collation else None
        self.drop_last = drop_last
        self.collate_fn = collate_fn if collate_fn is not None else (
            default_collate if self.auto_collation else default_convert)
        self.num_workers, self.worker_init_fn, self.timeout_s = num_workers, worker_init_fn, timeout_s
        self._auto_slots = slots is None  # sized from the first batch by default_slots()
        self.num_slots = slots if slots is not None else SLOTS_PER_WORKER * num_workers
        if self.num_slots < 2:
            raise ValueError(f"slots={slots}: need at least 2 (one being filled, one being copied).")
        if self.iterable and self.num_slots < num_workers:
            raise ValueError(f"slots={slots} < num_workers={num_workers}: with an IterableDataset every worker "
                             "yields its own share of the data and needs slots of its own; pass slots >= workers.")
        self.slot_bytes = slot_bytes
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        self.device = torch.device(device) if device is not None else None
        self._ring: SlotRing | None = None
        self._iter: weakref.ref | None = None  # the live epoch, if any
        self._finalizer = None
        self._warned_fallback = False
        ntcopy.streaming()   # build/load the slot copy loop once here, not in every forked worker

    @classmethod
    def from_dataloader(cls, dl: torch.utils.data.DataLoader, **overrides) -> "PinnedWorkerLoader":
        """Same dataset, sampling, batching, collate_fn, workers, worker_init_fn and generator as `dl`."""
        kw = dict(collate_fn=dl.collate_fn, num_workers=dl.num_workers, drop_last=dl.drop_last,
                  generator=dl.generator, worker_init_fn=dl.worker_init_fn)
        if isinstance(dl.dataset, IterableDataset):
            kw["batch_size"] = dl.batch_size
        elif dl.batch_sampler is not None:
            kw.update(batch_size=None, batch_sampler=dl.batch_sampler)
        else:
            kw.update(batch_size=None, sampler=dl.sampler)
        kw.update(overrides)
        return cls(dl.dataset, **kw)

    def _source(self) -> _Source:
        return _Source(self.dataset, self.iterable, self.auto_collation, self.collate_fn, self.drop_last,
                       self.auto_collation and self.collate_fn is default_collate, self.num_workers,
                       self.worker_init_fn)

    def __len__(self) -> int:
        if self.iterable:   # as DataLoader: the dataset's own len(), in batches when batching
            n = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        return len(self.index_sampler)

    def __iter__(self) -> Iterator[Leased]:
        old = self._iter() if self._iter is not None else None
        if old is not None:
            old.shutdown(superseded=True)  # one live epoch at a time: its workers write into our slots
        it = _RingIter(self)
        self._iter = weakref.ref(it)  # weak: dropping the iterator (break, GC) stops its workers
        return it

    def _ensure_ring(self, need: int) -> SlotRing:
        """The slots, made once: `need` bytes each (or slot_bytes=), sized from the first batch."""
        if self._ring is None:
            need = self.slot_bytes or need + ALIGN * 8
            if self._auto_slots:
                self.num_slots = max(default_slots(self.num_workers, need),
                                     self.num_workers if self.iterable else 2)
            self._ring = SlotRing(self.num_slots, need, self.pin, self.device,
                                  owners=self.num_workers)
            self._finalizer = weakref.finalize(self, self._ring.close)
        return self._ring

    @property
    def ring_bytes(self) -> int:
        """Bytes of shared (and, on CUDA, page-locked) memory held by the slots; 0 before the first epoch."""
        return self._ring.nbytes if self._ring is not None else 0

    def describe(self) -> str:
        """One line: workers, slots (per worker) and slot size; what a benchmark prints."""
        ring = self._ring
        if ring is None:
            return f"PinnedWorkerLoader: {self.num_workers} workers, slots not made yet"
        return (f"PinnedWorkerLoader: {ring.owners} workers, {ring.num_slots} slots "
                f"({ring.num_slots // ring.owners} per worker) of {ring.slot_bytes / 1e6:.1f} MB, "
                f"{ring.nbytes / 1e9:.2f} GB page-locked" if ring.registered else
                f"PinnedWorkerLoader: {ring.owners} workers, {ring.num_slots} slots "
                f"({ring.num_slots // ring.owners} per worker) of {ring.slot_bytes / 1e6:.1f} MB (not page-locked)")

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
            if slot is not None:   # None: an _Ended answer, whose slot went back at once
                ring.release(slot, None)
    outstanding.clear()
    ready.clear()


class _RingIter:
    """One epoch: forks the workers, hands out slots, yields leases in the DataLoader's order.

    Tasks go to the workers round-robin (task i to the i-th active worker in cyclic order, as
    DataLoader's `_try_put_index`), each into one of that worker's own free slots; results are
    delivered by task number. A task answered `_Ended` (the worker's IterableDataset is exhausted)
    is skipped and its worker leaves the rotation.
    """

    def __init__(self, loader: PinnedWorkerLoader):
        self.loader = loader
        self.timeout_s = loader.timeout_s
        # the same order as DataLoader: the sampler's iterator first, then the workers' base seed
        self.batches = iter(loader.index_sampler)
        g = loader.generator
        self.base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=g).item())
        self.source = loader._source()
        self.ready: dict[int, tuple[int, Any, Any]] = {}  # task idx -> (slot, skeleton, failure)
        self.outstanding: dict[int, int] = {}              # task idx -> slot, while a worker owns it
        self.send_idx = self.rcvd_idx = 0
        self.exhausted = False       # no more tasks will be sent (sampler done, or every worker ended)
        self.superseded = False      # ended by a newer iter() of the same loader
        self.active = [True] * loader.num_workers   # workers whose IterableDataset has not ended
        self.next_worker = 0         # where the round-robin continues
        self.workers: list = []
        self.index_qs: list = []
        self.result_q = None
        self.tap: StderrTap | None = None
        self._finalizer = None
        self.ring = loader._ring
        if loader._ring is None and not self._first_epoch():
            self.exhausted = True    # an empty epoch: no worker is started
            return
        self.ring = loader._ring
        self._start_workers()

    def _first_epoch(self) -> bool:
        """Make the slots, sized from the first batch; False when the epoch turned out empty.

        Map-style: the main process builds batch 0 itself (it is yielded from slot 0). An
        IterableDataset's batches exist only inside the workers: a forked probe builds worker w's
        first batch and reports its size (workers 0, 1, ... until one has any data).
        """
        L = self.loader
        if L.slot_bytes:
            L._ensure_ring(L.slot_bytes)
            return True
        if L.iterable:
            index = next(self.batches)   # [None] * batch_size, or None: the infinite sampler
            for wid in range(L.num_workers):
                nbytes, samples, failure = _probe(wid, self.source, self.base_seed, index)
                if failure is not None:
                    failure.reraise()
                if nbytes is not None:
                    full = L.batch_size or samples
                    L._ensure_ring(nbytes * max(1, -(-int(full) // max(samples, 1))))
                    self.batches = iter(L.index_sampler)   # the probe's task was not a real one
                    return True
            return False
        try:
            index = next(self.batches)
        except StopIteration:
            return False
        fetcher = _DatasetKind.create_fetcher(_DatasetKind.Map, L.dataset, L.auto_collation, L.collate_fn,
                                              L.drop_last)
        first = fetcher.fetch(index)
        # a short first batch (a custom batch sampler) would size every slot too small: scale it
        n = len(index) if L.auto_collation else 1
        full = L.batch_size or n
        ring = L._ensure_ring(packed_size(first) * max(1, -(-int(full) // max(n, 1))))
        slot = ring.take(0)
        try:
            self.ready[0] = (slot, SlotWriter(ring.views[slot]).pack(first), None)
        except NoRoom:
            self.ready[0] = (slot, _Pickled(first), None)
        self.send_idx = 1
        self.next_worker = 1 % L.num_workers
        return True

    def _start_workers(self) -> None:
        ctx = fork_context()
        self.result_q = ctx.Queue()
        self.tap = StderrTap()
        # min(num_workers, slots) for a map-style dataset: a worker without a slot has no work
        with no_collection_in_children():
            for wid in range(self.ring.owners):
                iq = ctx.Queue()
                r, wfd = self.tap.pipe()
                w = ctx.Process(target=_worker_loop, daemon=True,
                                args=(wid, self.source, self.ring.views, iq, self.result_q, self.base_seed,
                                      os.getpid(), wfd))
                try:
                    w.start()
                finally:
                    self.tap.watch(wid, r, wfd)
                self.workers.append(w)
                self.index_qs.append(iq)
        self.active = [True] * len(self.workers)
        self.next_worker %= len(self.workers)
        self._finalizer = weakref.finalize(self, _shutdown_epoch, self.workers, self.index_qs, self.result_q,
                                           self.ring, self.outstanding, self.ready, os.getpid())

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def _worker_for_next_task(self) -> int | None:
        """The active worker the next task goes to (cyclic order from `next_worker`), None if none is left."""
        n = len(self.workers)
        for k in range(n):
            w = (self.next_worker + k) % n
            if self.active[w]:
                return w
        return None

    def _dispatch(self) -> None:
        """Hand out tasks in order, each to the next active worker in the rotation, into one of that
        worker's own free slots; stop at the first task whose worker has none free."""
        while not self.exhausted:
            w = self._worker_for_next_task()
            if w is None:
                self.exhausted = True
                return
            slot = self.ring.take(w)
            if slot is None:
                return
            try:
                index = next(self.batches)
            except StopIteration:
                self.exhausted = True
                self.ring.release(slot, None)
                return
            idx = self.send_idx
            self.index_qs[w].put((idx, index, slot))
            self.outstanding[idx] = slot
            self.send_idx += 1
            self.next_worker = (w + 1) % len(self.workers)

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
                    last = self.tap.tail(i)
                    self.shutdown()
                    raise RuntimeError(death_message(f"PinnedWorkerLoader worker {i}", w.pid, w.exitcode, last))
                if time.monotonic() > deadline:
                    self.shutdown()
                    raise TimeoutError(f"no batch from the PinnedWorkerLoader workers in {self.timeout_s:.0f} s; "
                                       "raise timeout_s= if the dataset is that slow.")
        if idx < 0:  # worker_init_fn (or iter() of the dataset) failed
            self.shutdown()
            failure.reraise()
        self.outstanding.pop(idx, None)
        if isinstance(skel, _Ended):   # nothing was written: the slot is free again at once
            self.active[skel.worker_id] = False
            self.ring.release(slot, None)
            slot = None
        self.ready[idx] = (slot, skel, failure)

    def __next__(self) -> Leased:
        if self.superseded:
            raise RuntimeError("this PinnedWorkerLoader epoch was ended by a newer iter() of the same loader "
                               "(its workers write into the same slots); finish or close one epoch before "
                               "starting the next.")
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
                if isinstance(skel, _Ended):
                    continue   # a task sent to a worker after its data ended: DataLoader skips it too
                return self._lease(slot, skel)
            if self.rcvd_idx in self.outstanding:
                self._receive()
                continue
            if self.exhausted or ring is None:
                self.shutdown()
                raise StopIteration
            # The next task has not been handed to a worker: every slot of its worker is leased or in flight.
            w = self._worker_for_next_task()
            if w is None or not ring.wait_oldest(w):
                if w is None:
                    continue   # every worker has ended: the loop above finishes the epoch
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

    def shutdown(self, superseded: bool = False) -> None:
        """Stop this epoch's workers and return the slots they or the reorder buffer held."""
        if self._finalizer is not None and self._finalizer.alive:
            self._finalizer()  # joins (or terminates) the workers, then returns their slots
        elif self.ring is not None:  # no workers started (empty or one-batch epoch)
            _shutdown_epoch([], [], None, self.ring, self.outstanding, self.ready, os.getpid())
        self.exhausted = True
        self.superseded = self.superseded or superseded

    def close(self) -> None:
        """A consumer that closes its source iterator (as a generator) stops the workers."""
        self.shutdown()


def _probe(worker_id: int, source: _Source, base_seed: int, index: Any) -> tuple[int | None, int, Any]:
    """(bytes, samples, failure) of worker `worker_id`'s first batch, built in a forked probe (see
    `_probe_loop`); bytes is None when that worker has no data."""
    ctx = fork_context()
    q = ctx.Queue()
    tap = StderrTap()
    r, wfd = tap.pipe()
    p = ctx.Process(target=_probe_loop, args=(worker_id, source, base_seed, index, q, wfd), daemon=True)
    with no_collection_in_children():
        try:
            p.start()
        finally:
            tap.watch("probe", r, wfd)
    try:
        while True:
            try:
                return q.get(timeout=1.0)
            except queue.Empty:
                if not p.is_alive():
                    try:
                        return q.get(timeout=0.5)
                    except queue.Empty:
                        what = f"the PinnedWorkerLoader probe of worker {worker_id} (it sizes the slots)"
                        raise RuntimeError(death_message(what, p.pid, p.exitcode, tap.tail("probe")) +
                                           " Pass slot_bytes= to skip the probe.") from None
    finally:
        p.join(timeout=5.0)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5.0)
        q.close()


def _no_release(event: Any = None) -> None:
    """Release of a batch that did not come from a slot: nothing to hand back."""
