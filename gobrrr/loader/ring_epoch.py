"""One epoch of a `PinnedWorkerLoader` in the main process: fork, dispatch, receive, lease, stop.

Schedule of one `next()` (the loader's docstring draws the whole ring):
    1. reclaim slots whose copy-done event completed (`SlotRing.reclaim`, a non-blocking query);
    2. dispatch: hand tasks out in order, each to the next active worker in the rotation, into one
       of that worker's own free slots, until one has none free;
    3. deliver task `rcvd_idx` if its answer is in, else wait (bounded) on the result queue;
       a dead worker is reported with its signal, its last stderr lines and the likely cause.
The workers are forked at the start of the epoch (gc frozen around the fork, stderr through a tap:
forking.py) and stopped when the epoch ends, is dropped or is superseded by a newer `iter()`.
"""
from __future__ import annotations

import os
import queue
import time
import warnings
import weakref
from typing import Any

import torch
from torch.utils.data.dataloader import _DatasetKind

from gobrrr.loader.forking import StderrTap, death_message, fork_context, no_collection_in_children
from gobrrr.loader.ring_worker import Leased, _Ended, _Pickled, _probe_loop, _Source, _worker_loop
from gobrrr.loader.slots import NoRoom, SlotWriter, is_leaf_ref, leaf_view, map_tree, packed_size


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

    def __init__(self, loader: Any):  # the PinnedWorkerLoader (worker_ring.py) this epoch belongs to
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
                    raise RuntimeError(death_message(f"PinnedWorkerLoader worker {i}", w.pid, w.exitcode,
                                                     last)) from None
                if time.monotonic() > deadline:
                    self.shutdown()
                    raise TimeoutError(f"no batch from the PinnedWorkerLoader workers in {self.timeout_s:.0f} s; "
                                       "raise timeout_s= if the dataset is that slow.") from None
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
