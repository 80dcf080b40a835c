"""A reused ring of page-locked staging buffers, filled by background threads.

Why: the GPU's copy engines read host memory by DMA, which needs page-locked ("pinned")
memory. From ordinary pageable memory the driver first copies into a pinned bounce buffer
of its own, synchronously, on the calling thread: the host stalls and the copy runs at a
fraction of the link's speed (7-14 GB/s instead of ~55 GB/s on an H200's PCIe Gen5 x16).

What: `PinnedRing` holds `slots` flat pinned byte buffers. `stage(batch)` picks the next
slot, lays every pageable CPU tensor of the batch out in it (512-byte aligned views) and
returns a future for the staged batch at once; a coordinator thread waits until the
slot's previous H2D copy has finished (its copy-done event), grows the buffer if the batch
is larger than any before, then deals the bytes out as one task per thread (whole tensors and
slices of large ones, balanced by bytes). numpy's copy releases the GIL, so the tasks really
run in parallel and the main thread keeps enqueueing GPU work meanwhile:

    # overlap: pool threads memcpy pageable -> pinned for batch k+2 while the copy stream
    #          moves batch k+1 to the GPU and the compute stream runs step k.

After the caller has enqueued the H2D copy out of the slot it calls `release(staged, event)`
with an event recorded on the copy stream after that copy; the slot is written again only
once that event has completed. In steady state nothing is allocated: the same `slots`
buffers are reused batch after batch and epoch after epoch (`allocations` counts).

What bounds it (measured on the H200 VM: 16 cores, glibc 2.39, a 300 MB L3; a one-off sweep
of threads, task sizes and copy functions on one 78.6 MB batch, BENCHMARKS.md):
- Python tasks are the first limit: the pool copied 45-54 GB/s with one task per thread
  but 14-26 GB/s in 1 MiB tasks and 5-9 GB/s in 256 KiB tasks (submit/GIL cost per task).
  Hence one task per thread and never less than `chunk_bytes` (4 MiB) in a task.
- Then host DRAM: with sources and slots bigger than the L3 (the real case), memcpy reached
  18 GB/s on 4 threads, 26 on 8, 27-33 on 12-16, and 23-29 while the copy engine read pinned
  memory at 47-52 GB/s. glibc's memcpy switches to non-temporal stores only above a threshold
  derived from the L3 size, evidently above our per-thread chunks, so each destination line
  is probably read before it is written. Forcing that threshold down
  (`GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0x100000`, set before Python starts)
  made the same copies 30-40% faster: 38-43 GB/s on 8-16 threads (measured without a DMA
  running). With the default, staging a pageable batch takes about batch / 27 GB/s while the
  DMA runs: 2.9 ms for 78.6 MB, 2.0x the 55 GB/s pinned copy floor.
- The copy function matters too (gobrrr/bench/prefetch_busy.py, 78.6 MB pageable -> pinned, a DMA
  running, H200 VM, 2026-12-03): numpy copyto 29.7 GB/s on 12 threads (31.6 on 16), torch's
  copy_ 31.5 (33.7), libc memmove through ctypes 38.2 (34.0). Hence memmove, and then streaming
  stores (gobrrr.loader.ntcopy), which do what the glibc tunable above did without it: one batch
  into 5 slots in turn, DMA running, 12-16 threads, 1.72-1.95 ms (40-46 GB/s) against memmove's
  2.14-2.88 ms (`bench prefetch`'s memcpy floor, 2026-12-03); the pageable copy-bound row went from
  2.32x to 1.66x the pinned copy floor.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from gobrrr.loader import ntcopy
from gobrrr.loader.tree import map_tensors, tensors

ALIGN = 512                 # bytes; any dtype's element size divides it
CHUNK_BYTES = 4 << 20       # least bytes in one memcpy task: 1 MiB tasks ran at half speed (module doc)
MAX_PIN_THREADS = 12        # host memcpy bandwidth saturated at 12 threads on a 16-core H200 VM
GROW_ROUND = 2 << 20        # the smallest buffer; larger ones are powers of two


def default_pin_threads() -> int:
    """Threads that memcpy into pinned memory: 3/4 of this process's share of the cores, at most 12.

    The share is the cores this process may run on divided by the processes of this node
    (`LOCAL_WORLD_SIZE`, set by torchrun). Measured: 8 threads staged 23 GB/s next to a running
    DMA, 12 threads 26-29, 16 no more (host DRAM is saturated; see the module doc).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, min(MAX_PIN_THREADS, cores // local * 3 // 4))


def needs_staging(t: torch.Tensor) -> bool:
    """A dense CPU tensor that is not already page-locked must go through a pinned buffer."""
    return t.device.type == "cpu" and t.layout == torch.strided and not t.is_pinned()


@dataclass
class _Slot:
    index: int
    buf: torch.Tensor | None = None   # flat uint8 (capacity,), pinned when the ring pins
    event: Any = None                 # copy-done event of the last H2D copy that read buf
    held: bool = False                # staged and not yet released by the consumer


@dataclass
class StagedBatch:
    """A batch whose pageable tensors are being copied into a pinned slot.

    `result()` waits for the pool (the caller measures that as data wait) and returns the
    batch with pinned views in place of the staged tensors; every other leaf is unchanged.
    """
    future: Future | None
    batch: Any                                   # the batch as the source gave it
    slot: _Slot | None
    nbytes: int = 0                              # bytes of the slot in use, alignment included
    layout: dict = field(default_factory=dict, repr=False)   # id(tensor) -> (offset, tensor)

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def result(self) -> Any:
        if self.future is None:
            return self.batch
        return self.future.result()

    def rebuild(self, flat: torch.Tensor, other: Callable[[torch.Tensor], Any]) -> Any:
        """The batch with views of `flat` (a copy of the slot's first `nbytes`, on any device) in
        place of the staged tensors, and `other(t)` in place of every other tensor.

        This is how one host-to-device copy of the whole slot serves every staged tensor."""
        views = {key: flat[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
                 for key, (off, t) in self.layout.items()}

        def pick(t: torch.Tensor) -> Any:
            v = views.get(id(t))
            return v if v is not None else other(t)
        return map_tensors(pick, self.batch)


class PinnedRing:
    """`slots` reused pinned staging buffers and the threads that fill them (see module doc).

    `pin=False` uses ordinary memory: the same logic runs, and is tested, on a CPU-only build.
    `device` is the CUDA device whose context allocates the pinned memory and on which the
    copy-done events live; the coordinator thread makes it current so no other GPU gets a
    context.
    """

    def __init__(self, slots: int, *, threads: int | None = None, pin: bool = True,
                 device: torch.device | None = None, chunk_bytes: int = CHUNK_BYTES,
                 should_stage: Callable[[torch.Tensor], bool] = needs_staging):
        if slots < 1:
            raise ValueError(f"a PinnedRing needs at least one slot, got slots={slots}")
        self.pin = pin
        if device is not None and device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())   # the thread that fills must know which GPU
        self.device = device
        self.chunk_bytes = chunk_bytes
        self.should_stage = should_stage
        self.threads = threads or default_pin_threads()
        ntcopy.streaming()   # build (once per machine) and load the copy loop here, not in the first fill
        self.allocations = 0            # pinned buffers allocated so far (flat in steady state)
        self.bytes_staged = 0
        self._slots = [_Slot(i) for i in range(slots)]
        self._next = 0
        # the initializer is a plain function: a bound method would keep the ring alive from its own thread
        self._coordinator = ThreadPoolExecutor(1, thread_name_prefix="gobrrr-pin-coord",
                                               initializer=_use_device, initargs=(device,))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="gobrrr-pin")
        self._closed = False

    @property
    def slots(self) -> int:
        return len(self._slots)

    @property
    def capacity_bytes(self) -> int:
        return sum(s.buf.numel() for s in self._slots if s.buf is not None)

    # -- main thread ---------------------------------------------------------------------------
    def stage(self, batch: Any) -> StagedBatch:
        """Start copying `batch`'s pageable tensors into the next slot; return without waiting."""
        if self._closed:
            raise RuntimeError("this PinnedRing was closed; create a new one")
        leaves = [t for t in tensors(batch) if self.should_stage(t)]
        if not leaves:
            return StagedBatch(None, batch, None)
        layout: dict[int, tuple[int, torch.Tensor]] = {}   # id(tensor) -> (offset, tensor)
        offset = 0
        for t in leaves:
            if id(t) in layout:
                continue  # the same tensor twice in a batch is staged once
            layout[id(t)] = (offset, t)
            offset += _aligned(t.numel() * t.element_size())
        slot = self._slots[self._next]
        if slot.held:
            raise RuntimeError(f"all {self.slots} pinned slots are in use; release a staged batch "
                               "(after enqueueing its copy) before staging another")
        self._next = (self._next + 1) % len(self._slots)
        slot.held = True
        self.bytes_staged += offset
        future = self._coordinator.submit(self._fill, slot, offset, layout, batch)
        return StagedBatch(future, batch, slot, offset, layout)

    def release(self, staged: StagedBatch, event: Any) -> None:
        """The copy out of `staged`'s slot is enqueued; `event` completes when it has run.

        `event` needs `synchronize()` (a `torch.cuda.Event`); None means the slot is free now.
        """
        if staged.slot is not None:
            staged.slot.event = event
            staged.slot.held = False

    # -- coordinator thread ----------------------------------------------------------------------
    def _fill(self, slot: _Slot, nbytes: int, layout: dict, batch: Any) -> Any:
        if slot.event is not None:
            # sync: (coordinator thread, never the main thread) the GPU may still be reading this
            # slot for an earlier batch; wait for that copy before overwriting the bytes
            wait_for_event(slot.event)
            slot.event = None
        if slot.buf is None or slot.buf.numel() < nbytes:
            slot.buf = None  # drop the old buffer first; its last copy has completed (waited above)
            # a power of two: torch's pinned allocator rounds every request up to one anyway, so
            # this is the memory really held, and a slowly growing batch reallocates rarely
            size = max(GROW_ROUND, 1 << (nbytes - 1).bit_length())
            slot.buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
            self.allocations += 1
        views: dict[int, torch.Tensor] = {}
        tasks = []
        buf_np = slot.buf.numpy()
        pieces: list[tuple[int, np.ndarray]] = []   # (slot offset, source bytes) of the plain tensors
        for key, (off, src) in layout.items():
            n = src.numel() * src.element_size()
            dst = slot.buf[off:off + n].view(src.dtype).view(src.shape)
            views[key] = dst
            if n == 0:
                continue
            plain = src.is_contiguous() and not src.is_conj() and not src.is_neg()
            if not plain:
                tasks.append(self._pool.submit(_torch_copy, dst, src))
                continue
            pieces.append((off, src.detach().reshape(-1).view(torch.uint8).numpy()))
        for group in _deal(pieces, self.threads, self.chunk_bytes):
            tasks.append(self._pool.submit(_copy_group, [(buf_np[o:o + len(s)], s) for o, s in group]))
        first_error = None
        for t in tasks:  # result(), not futures.wait(): wait() never returns for a future cancelled at shutdown
            try:
                t.result()
            except BaseException as e:  # keep waiting: no chunk may still be writing when we return
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return map_tensors(lambda t: views.get(id(t), t), batch)

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the threads and drop the buffers (an H2D copy still reading one keeps it alive:
        torch's pinned allocator frees a block only after the copies recorded on it completed)."""
        if self._closed:
            return
        self._closed = True
        self._coordinator.shutdown(wait=False, cancel_futures=True)   # fills not started are dropped
        self._pool.shutdown(wait=False)   # memcpys already queued finish (a running fill waits for them)
        for s in self._slots:
            s.buf = None
            s.event = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def wait_for_event(event: Any, first_sleep_s: float = 20e-6, max_sleep_s: float = 1e-3) -> None:
    """Block this (background) thread until `event` has completed, by polling `event.query()`.

    Polling instead of `event.synchronize()` keeps the wait out of the sync detective's view of the
    user's loop (it is not the loop that waits) and lets the thread notice a closed ring. In steady
    state the event completed long ago and the first query returns True. An event without
    `query()` (a test double) is waited on with `synchronize()`.
    """
    query = getattr(event, "query", None)
    if query is None:
        event.synchronize()
        return
    sleep = first_sleep_s
    while not query():
        time.sleep(sleep)
        sleep = min(2 * sleep, max_sleep_s)


def _use_device(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        # the coordinator waits on events and allocates pinned memory: keep it on our device so
        # that no other GPU gets a context
        torch.cuda.set_device(device)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _deal(pieces: list[tuple[int, np.ndarray]], threads: int, least: int) -> list[list[tuple[int, np.ndarray]]]:
    """Split (offset, bytes) pieces into at most `threads` groups of about equal bytes, none
    under `least` bytes unless it is the only one; a large piece is cut across groups.

    One task per thread: submitting a task and taking the GIL back costs tens of microseconds,
    which at 1 MiB per task halved the copy rate (module doc).
    """
    total = sum(len(s) for _, s in pieces)
    if total == 0:
        return []
    groups = max(1, min(threads, total // max(1, least)))
    share = -(-total // (groups * 4096)) * 4096          # bytes per group, whole pages
    out: list[list[tuple[int, np.ndarray]]] = [[]]
    room = share
    for off, src in pieces:
        a = 0
        while a < len(src):
            take = min(len(src) - a, room)
            out[-1].append((off + a, src[a:a + take]))
            a += take
            room -= take
            if room == 0:
                out.append([])
                room = share
    return [g for g in out if g]


def _copy_group(group: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in group:
        # streaming stores past the cache (ntcopy; libc memmove where it cannot be built), GIL released
        # for the call: memmove made 38 GB/s on 12 threads where numpy's copyto made 30 (module doc);
        # both are contiguous uint8 views of the same length
        ntcopy.copy(dst.ctypes.data, src.ctypes.data, src.nbytes)


def _torch_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)
