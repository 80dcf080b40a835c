"""The worker-process side of a `PinnedWorkerLoader`, and what travels between the processes.

A worker is forked with the loader's `_Source` (dataset, sampler kind, collate, seed) and the slot
views. It never touches CUDA: the slots are plain shared memory here, and the parent's objects are
never collected here (forking.no_collection_in_children). Its stderr goes through the parent's tap,
so that a death is reported with the worker's last words (forking.py).

    main process                                         worker w (forked)
    (idx, index, slot) --index queue w-->   fetch(index) collates into slot (its own: s % workers == w)
              <--result queue--  (idx, slot, skeleton | _Pickled | _Ended, _Failure | None)

The skeleton is the batch with each tensor replaced by a `Leaf(offset, shape, dtype)` (slots.py);
a batch that does not fit its slot comes back `_Pickled` (ordinary shared-memory transport); an
IterableDataset that is exhausted answers `_Ended`; an exception comes back as a `_Failure` with
the traceback formatted in the worker.
"""
from __future__ import annotations

import os
import queue
import random
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data._utils.collate import collate as _collate
from torch.utils.data._utils.collate import default_collate_fn_map
from torch.utils.data.dataloader import _DatasetKind

from gobrrr.loader.forking import redirect_stderr
from gobrrr.loader.slots import NoRoom, SlotWriter, packed_size, prefault


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
