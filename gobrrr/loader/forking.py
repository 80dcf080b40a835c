"""Forking worker processes that never touch CUDA, and saying why one died.

CUDA cannot be used in a process forked after the parent started it: any CUDA call there fails
with "initialization error". Our workers make none, but a forked child holds a copy of every
Python object of the parent, and two things can run the parent's destructors in the child:

- Python's cyclic garbage collector. Garbage the parent had not collected yet (say a Prefetcher
  and its epoch, which refer to each other) is still garbage in the child, and the child's first
  full collection frees it. A pinned host buffer that a copy once read, or a device block used on
  another stream, calls CUDA when freed (torch's caching allocators record an event on each stream
  that used the block), from a C++ destructor: the exception it throws there ends the process
  ("terminate called after throwing an instance of 'c10::AcceleratorError'", signal 6).
- Reference counts dropped in the child (objects only the child's copies refer to).

`no_collection_in_children()` freezes the collector around the fork (`gc.freeze()`: every object
the parent holds moves to a permanent generation that no collection looks at, in the child that
inherits it; the parent unfreezes right after the fork). The child's collections then see only
what the child itself made. The workers' own code drops no reference to a parent object that holds
CUDA memory (slots are plain shared memory, its views carry no CUDA state).

`StderrTap` gives each worker a pipe as its stderr (fd 2): a thread of the parent forwards
everything to the parent's stderr as it comes, and keeps the last lines of each worker, so that a
worker that dies can be reported with what it printed last (`death_message`).
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
import selectors
import signal
import threading
from collections import deque
from typing import Iterator

TAIL_BYTES = 65536  # of each worker's stderr, kept for the death message (faulthandler's dump alone can fill 8 KB)
# Python's faulthandler (on under pytest, `-X faulthandler`) prints every frame and every extension module of a
# process that aborts: not what killed the worker, so the death message leaves those lines out
_FAULTHANDLER_LINE = re.compile(r'^\s*(File "|Extension modules:|Current thread 0x|Thread 0x|<no Python frame>)')


@contextlib.contextmanager
def no_collection_in_children() -> Iterator[None]:
    """Fork inside this block: the children's garbage collector never frees the parent's objects.

    The parent unfreezes on exit, unless something (the user, for copy-on-write friendliness)
    had frozen objects before: that freeze is theirs to undo, and ours stays with it.
    """
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    try:
        yield
    finally:
        if frozen_before == 0:
            gc.unfreeze()


def fork_context():
    """torch.multiprocessing's "fork" context, or a clear error where fork does not exist."""
    import torch.multiprocessing as tmp
    try:
        return tmp.get_context("fork")
    except ValueError:
        raise RuntimeError("PinnedWorkerLoader needs the 'fork' start method (Linux or macOS) so the "
                           "workers inherit the shared slots; use a DataLoader on this platform.") from None


class StderrTap:
    """Each worker's stderr through a pipe: forwarded to ours as it comes, its tail kept.

    `pipe()` before forking a worker, whose first act is `redirect_stderr(write_end)`; then
    `watch(key, read_end, write_end)` in the parent. One daemon thread per tap reads every pipe
    (blocked in select() between writes: it takes the GIL only to forward what a worker wrote) and
    ends once every worker it watches has exited; the next `watch` starts a new one.
    """

    def __init__(self):
        self._state = _TapState()

    @staticmethod
    def pipe() -> tuple[int, int]:
        return os.pipe()

    def watch(self, key: object, read_fd: int, write_fd: int) -> None:
        """Start forwarding `read_fd`; `write_fd` (the forked worker's copy is its stderr) is closed here."""
        os.close(write_fd)
        st = self._state
        with st.lock:
            st.tails[key] = deque()
            st.closed[key] = threading.Event()
            st.sel.register(read_fd, selectors.EVENT_READ, key)
            if not st.running:
                st.running = True
                # the thread holds the tap's state, never the loader or the tap: no cycle through it
                threading.Thread(target=_forward, args=(st,), name="gobrrr-worker-stderr", daemon=True).start()

    def tail(self, key: object, wait_s: float = 1.0) -> list[str]:
        """The last lines `key` wrote; waits up to `wait_s` for its pipe to close (a dead worker's last
        bytes may still be in flight)."""
        st = self._state
        ev = st.closed.get(key)
        if ev is None:
            return []
        ev.wait(wait_s)
        with st.lock:
            text = b"".join(st.tails.get(key, ())).decode("utf-8", "replace")
        return [line for line in text.splitlines() if line.strip()]


class _TapState:
    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.tails: dict[object, deque] = {}
        self.closed: dict[object, threading.Event] = {}
        self.lock = threading.Lock()
        self.running = False


def _forward(st: _TapState) -> None:
    while True:
        with st.lock:
            if not st.sel.get_map():
                st.running = False
                return
        for sk, _ in st.sel.select(timeout=5.0):
            try:
                data = os.read(sk.fd, 65536)
            except OSError:
                data = b""
            if not data:   # every copy of the write end is closed: the worker exited
                with st.lock:
                    st.sel.unregister(sk.fd)
                os.close(sk.fd)
                st.closed[sk.data].set()
                continue
            try:
                os.write(2, data)
            except OSError:
                pass
            with st.lock:
                tail = st.tails[sk.data]
                tail.append(data)
                size = sum(len(d) for d in tail)
                while size > TAIL_BYTES and len(tail) > 1:
                    size -= len(tail.popleft())


def redirect_stderr(write_fd: int) -> None:
    """In the worker: make `write_fd` (the tap's pipe) this process's stderr."""
    os.dup2(write_fd, 2)
    os.close(write_fd)


CUDA_IN_CHILD = ("CUDA error: initialization error", "Cannot re-initialize CUDA in forked subprocess",
                 "AcceleratorError", "CUDA driver initialization failed")


def death_message(what: str, pid: int | None, exitcode: int | None, last_lines: list[str]) -> str:
    """What happened to a worker process that exited without a word, in a few sentences."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        how = f"was killed by {name} (exit code {exitcode})"
    else:
        how = f"exited with code {exitcode}"
    text = "\n".join(last_lines)
    if any(k in text for k in CUDA_IN_CHILD):
        cause = ("Likely cause: CUDA was called in the forked worker, which CUDA does not allow; keep CUDA "
                 "tensors and calls out of the dataset, its collate_fn and worker_init_fn (move batches to "
                 "the GPU in the main process).")
    elif exitcode == -signal.SIGKILL:
        cause = "Likely cause: the system ran out of memory and killed it; lower num_workers or the batch size."
    elif exitcode == -signal.SIGSEGV or exitcode == -signal.SIGBUS:
        cause = ("Likely cause: a crash in native code run by the dataset (a library that is not safe to fork?); "
                 "try num_workers=0 through a plain DataLoader to see it.")
    else:
        cause = "Try num_workers=0 through a plain DataLoader to see the error in the main process."
    said = [line for line in last_lines if not _FAULTHANDLER_LINE.match(line)]
    shown = ("Its last stderr lines:\n    " + "\n    ".join(said[-12:])) if said else \
        "It wrote nothing to stderr."
    return f"{what} (pid {pid}) {how}. {shown}\n{cause}"
