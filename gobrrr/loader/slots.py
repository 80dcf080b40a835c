"""Slots: page-locked shared memory that worker processes write batches into, reused after events.

A `SlotRing` is S equal slots carved out of one anonymous MAP_SHARED mapping. It is allocated in
the main process before the workers fork, so parent and workers see the same physical pages, and
it is page-locked once with `cudaHostRegister`, so a host-to-device copy from a slot is a direct
DMA (no staging through another pinned buffer). A slot is handed out (`take`), filled by a worker,
leased to the consumer, and comes back (`release(slot, event)`) to be reused only once the event
of the copy that reads it has completed.

Why each worker owns its slots. A MAP_SHARED mapping is not copied into a forked child's page
table (Linux fills those entries lazily, on fault), so a worker's first write to each 4 KiB page of
a slot takes a minor fault: ~19,000 of them for a 78.6 MB batch, every epoch, in every worker that
touches the slot. With one shared free list each worker ends up writing most of the slots and keeps
paying for that first touch deep into the epoch. So slot s belongs to worker `s % owners`: a worker
only ever writes its own few slots, and before its first write to one it maps the slot's pages in a
single `madvise(MADV_POPULATE_WRITE)` call (Linux >= 5.14; a read of one byte per page, which
maps 16 pages per fault, elsewhere), see `prefault`.
Measured on an H200 host (6 workers, 78.6 MB batches, no GPU copy): with one shared free list the
workers took 6,037 minor faults per batch and the ring made a batch every 4.66 ms, the same workers
stacking into private buffers every 2.44 ms; with owned, prefaulted slots 1 fault per batch. A
first write that faults costs a worker ~51 ms per batch instead of ~12.5 ms; the madvise ~7.6 ms.

Inside a slot a batch is laid out leaf after leaf (`SlotWriter`): each tensor at a 256-byte
aligned offset. What travels between processes is only the *skeleton* of the batch, its structure
with every tensor replaced by a `Leaf(offset, shape, dtype)`; `map_tree` rebuilds views from it.
"""
from __future__ import annotations

import collections
import collections.abc
import copy
import ctypes
import dataclasses
import mmap
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from gobrrr.loader import ntcopy

ALIGN = 256           # every leaf starts on a 256-byte boundary inside its slot
PAGE = mmap.PAGESIZE  # every slot starts on a page (cudaHostRegister and DMA like that)


@dataclass(frozen=True)
class Leaf:
    """Where one tensor of a batch lives inside its slot."""
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype


class NoRoom(Exception):
    """The batch does not fit its slot (or has a tensor we cannot place); use the pickled path."""


# ---------------------------------------------------------------- batch structure

def map_tree(fn: Callable[[Any], Any], x: Any, is_leaf: Callable[[Any], bool]) -> Any:
    """Rebuild `x` with `fn` applied to every leaf; dict / list / tuple / namedtuple / dataclass kept."""
    if is_leaf(x):
        return fn(x)
    if isinstance(x, collections.abc.Mapping):
        items = {k: map_tree(fn, v, is_leaf) for k, v in x.items()}
        try:
            if isinstance(x, collections.abc.MutableMapping):
                clone = copy.copy(x)
                clone.update(items)
                return clone
            return type(x)(items)
        except TypeError:
            return items
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(map_tree(fn, v, is_leaf) for v in x))
    if isinstance(x, (list, tuple)):
        vals = [map_tree(fn, v, is_leaf) for v in x]
        try:
            return type(x)(vals)
        except TypeError:
            return vals
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        clone = copy.copy(x)
        for f in dataclasses.fields(x):
            object.__setattr__(clone, f.name, map_tree(fn, getattr(x, f.name), is_leaf))
        return clone
    return x


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def is_leaf_ref(x: Any) -> bool:
    return isinstance(x, Leaf)


def round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class SlotWriter:
    """Places tensors one after another in one slot (a flat uint8 tensor); used by the workers."""

    def __init__(self, slot: torch.Tensor):
        self.slot, self.used = slot, 0      # slot: (slot_bytes,) uint8

    def alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[Leaf, torch.Tensor]:
        nbytes = _numel(shape) * _itemsize(dtype)
        off = round_up(self.used, ALIGN)
        if off + nbytes > self.slot.numel():
            raise NoRoom(f"batch needs more than the slot's {self.slot.numel()} bytes")
        self.used = off + nbytes
        return Leaf(off, tuple(shape), dtype), leaf_view(self.slot, off, tuple(shape), dtype)

    def stack_fn(self, batch: list[torch.Tensor], *, collate_fn_map=None) -> torch.Tensor:
        """A `collate_fn_map` entry for tensors: stack the samples straight into this slot."""
        elem = batch[0]
        if elem.layout != torch.strided or elem.is_nested or elem.device.type != "cpu":
            raise NoRoom("sparse, nested or non-CPU tensors take the pickled path")
        _, out = self.alloc((len(batch), *elem.shape), elem.dtype)
        torch.stack(batch, 0, out=out)  # the one and only copy of the batch
        return out

    def pack(self, batch: Any) -> Any:
        """Skeleton of `batch`: tensors already in this slot become Leaf; others are copied in."""
        base, end = self.slot.data_ptr(), self.slot.data_ptr() + self.slot.numel()

        def leaf(t: torch.Tensor) -> Leaf:
            if t.layout != torch.strided or t.device.type != "cpu":
                raise NoRoom("sparse or non-CPU tensors take the pickled path")
            if base <= t.data_ptr() < end and t.is_contiguous():
                return Leaf(t.data_ptr() - base, tuple(t.shape), t.dtype)
            ref, view = self.alloc(tuple(t.shape), t.dtype)
            if t.is_contiguous() and not (t.is_conj() or t.is_neg()):
                # a whole batch from the dataset (batch_size=None, IterableDataset): libc memmove ran
                # 15-20% faster than torch's copy_ into pinned memory on an H200 host, streaming
                # stores faster still (pinned.py, ntcopy.py)
                ntcopy.copy(view.data_ptr(), t.data_ptr(), t.numel() * t.element_size())
            else:
                view.copy_(t)
            return ref

        return map_tree(leaf, batch, _is_tensor)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def leaf_view(slot: torch.Tensor, off: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    nbytes = _numel(shape) * _itemsize(dtype)
    return slot[off:off + nbytes].view(dtype).view(shape)


def packed_size(batch: Any) -> int:
    """Bytes a batch takes in a slot, alignment included."""
    used = 0

    def add(t: torch.Tensor):
        nonlocal used
        used = round_up(used, ALIGN) + t.numel() * t.element_size()
        return t

    map_tree(add, batch, _is_tensor)
    return used


MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux >= 5.14; not in Python's mmap module before 3.13


def prefault(slot: torch.Tensor) -> str:
    """Map every page of `slot` (a page-aligned (slot_bytes,) uint8 view) into this process's page table.

    Called by a worker before its first write to a slot it inherited through fork: one system call
    instead of one minor fault per 4 KiB page. Never changes the contents (a copy may be reading
    them). Returns how it was done, for diagnostics.
    """
    addr, nbytes = slot.data_ptr(), slot.numel()
    if sys.platform.startswith("linux") and addr % PAGE == 0:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), ctypes.c_int(MADV_POPULATE_WRITE)) == 0:
                return "populate"
        except (OSError, AttributeError):
            pass
    # older kernels: read one byte per page; read faults on shared memory map 16 pages at a time
    if nbytes:
        slot[::PAGE].sum()
    return "touch"


# ---------------------------------------------------------------- the ring of slots

class SlotRing:
    """S equal slots in one anonymous MAP_SHARED mapping, page-locked once, reused after events.

    Slot s belongs to owner (worker) `s % owners`; `take(owner)` hands out only that owner's slots.
    """

    def __init__(self, slots: int, slot_bytes: int, pin: bool, device: torch.device | None, owners: int = 1):
        self.slot_bytes = round_up(max(slot_bytes, 1), PAGE)
        self.nbytes = slots * self.slot_bytes
        self._mm = mmap.mmap(-1, self.nbytes)  # anonymous + MAP_SHARED: forked workers share it
        if hasattr(mmap, "MADV_HUGEPAGE"):
            # 2 MiB pages where the kernel allows them for shared memory (shmem_enabled=advise): 512x
            # fewer faults and TLB entries per slot; a no-op where it does not (shmem_enabled=never)
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        self.flat = torch.frombuffer(self._mm, dtype=torch.uint8)  # (slots * slot_bytes,)
        self.flat.fill_(0)  # fault every page in now, not during the first epoch
        self.views = list(self.flat.view(slots, self.slot_bytes).unbind(0))  # slot s: (slot_bytes,)
        self.owners = max(1, min(int(owners), slots))
        self.free = [collections.deque(range(w, slots, self.owners)) for w in range(self.owners)]
        self.pending: list[tuple[int, Any]] = []   # (slot, copy-done event) not yet completed, oldest first
        self.lock = threading.Lock()               # release() may come from a consumer thread
        self.registered = False
        self.owner_pid = os.getpid()               # only this process unregisters and frees it
        if pin:
            cudart = torch.cuda.cudart()
            with torch.cuda.device(device if device is not None else torch.cuda.current_device()):
                # cudaHostRegisterPortable (1): pinned for every device's context, not only this one
                err = cudart.cudaHostRegister(self.flat.data_ptr(), self.nbytes, 1)
            if int(err) != 0:
                warnings.warn(
                    f"cudaHostRegister of {self.nbytes / 2**20:.0f} MiB of worker slots failed with cudaError "
                    f"{int(err)}: the slots stay pageable, so host-to-device copies from them are slower. "
                    "Lower `slots=` (or the batch size), or raise the locked-memory limit.", stacklevel=4)
                return
            self.registered = True
            # Drivers may mark page-locked ranges MADV_DONTFORK (to keep DMA pages away from a child's
            # copy-on-write); this mapping is MAP_SHARED, so there is no copy-on-write to fear, and the
            # workers forked after this point must see it. A no-op when the flag was never set.
            if hasattr(mmap, "MADV_DOFORK"):
                self._mm.madvise(mmap.MADV_DOFORK)

    @property
    def num_slots(self) -> int:
        return len(self.views)

    def owner(self, slot: int) -> int:
        """The worker that writes this slot (and no other worker ever does)."""
        return slot % self.owners

    def release(self, slot: int, event: Any) -> None:
        with self.lock:
            if event is None:
                self.free[self.owner(slot)].append(slot)
            else:
                self.pending.append((slot, event))

    def reclaim(self) -> None:
        """Move slots whose copy-done event has completed to the free lists (non-blocking query)."""
        with self.lock:
            still = []
            for slot, ev in self.pending:
                if ev.query():
                    self.free[self.owner(slot)].append(slot)
                else:
                    still.append((slot, ev))
            self.pending = still

    def take(self, owner: int = 0) -> int | None:
        """A free slot of this owner, or None when all of its slots are filling, leased or in flight."""
        with self.lock:
            free = self.free[owner % self.owners]
            return free.popleft() if free else None

    def wait_oldest(self, owner: int | None = None) -> bool:
        """Block until the oldest pending copy (of this owner's slots) completes; False when none is pending."""
        with self.lock:
            mine = [i for i, (s, _) in enumerate(self.pending) if owner is None or self.owner(s) == owner]
            if not mine:
                return False
            slot, ev = self.pending.pop(mine[0])
        ev.synchronize()  # sync: every slot of this worker is in flight to the GPU; this wait is the backpressure
        with self.lock:
            self.free[self.owner(slot)].append(slot)
        return True

    def close(self) -> None:
        if os.getpid() != self.owner_pid:
            return  # a forked worker collecting an inherited ring: CUDA and the mapping belong to the parent
        with self.lock:
            pending, self.pending = self.pending, []
        for _, ev in pending:
            ev.synchronize()  # sync: close-time only; no copy may read the slots after unregistering
        if self.registered:
            self.registered = False
            try:
                torch.cuda.cudart().cudaHostUnregister(self.flat.data_ptr())
            except Exception:  # CUDA already torn down at interpreter exit: the process is going anyway
                pass
        self.views, self.flat = [], None
        try:
            self._mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes when that view is collected
