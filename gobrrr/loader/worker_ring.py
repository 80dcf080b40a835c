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
epoch, as a default DataLoader does, while the slots live as long as the loader. They never touch
CUDA, whatever the parent holds when they fork (the collector is frozen around the fork), and a
worker that dies is reported with its signal and its last stderr lines (forking.py).

Files: this one is the loader (arguments, sizing the slots); ring_epoch.py is one epoch in the main
process (fork, dispatch, receive, lease); ring_worker.py is the worker process and what it sends.
"""
from __future__ import annotations

import os
import weakref
from typing import Iterator

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import default_convert
from torch.utils.data.dataloader import _InfiniteConstantSampler, default_collate

from gobrrr.loader import ntcopy
from gobrrr.loader.ring_epoch import _RingIter
from gobrrr.loader.ring_worker import Leased, _Source
from gobrrr.loader.slots import ALIGN, SlotRing

__all__ = ["Leased", "PinnedWorkerLoader", "default_slots", "SLOTS_PER_WORKER"]


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
