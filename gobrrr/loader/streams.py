"""Devices, streams and timers: the small pieces every overlap in gobrrr is built from.

The host only *enqueues* work; the GPU runs it later, in stream order. Timing GPU work with
`time.perf_counter()` around a call therefore measures the enqueue, not the work, unless
the host waits (`torch.cuda.synchronize()`), and a wait per step is exactly the stall we
are trying to remove. A CUDA event pair is the honest clock: record one event before the
region and one after, on the stream that runs it, and ask for `elapsed_time` only when the
figure is wanted. `GpuTimer` does that; on the CPU it falls back to `perf_counter`.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any

import torch


def resolve_device(device: Any = None) -> torch.device:
    """`device` as a `torch.device` with an index, or a clear error for a device we cannot use.

    None picks the current CUDA device when there is one and the CPU otherwise, so the same
    script runs on a laptop and on a GPU box. A CUDA device asked for on a machine without CUDA
    is the CPU too, with one warning per calling line: the README's three lines run as written.
    """
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("cuda", device)
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be None, a string such as 'cuda:0', an int or a torch.device; "
                        f"got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"unknown device {device!r} ({e}); use 'cuda', 'cuda:N' or 'cpu'") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"device {str(dev)!r} is not supported here; use 'cuda', 'cuda:N' or 'cpu'")
    if not torch.cuda.is_available():
        import warnings

        warnings.warn(f"device {str(dev)!r} was asked for but CUDA is not available on this machine; using the CPU "
                      "(batches pass through). Pass device=None to pick the GPU when there is one, without this notice.",
                      stacklevel=3)  # the caller of Prefetcher(...) / GpuTimer(...)
        return torch.device("cpu")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(f"device {str(dev)!r} does not exist: this machine has {count} CUDA device(s), "
                         f"cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def new_copy_stream(device: torch.device) -> "torch.cuda.Stream":
    """A side stream for host-to-device copies on `device`.

    Create it once per owner (a Prefetcher keeps its own for its whole life) and reuse it:
    a new stream per epoch leaks streams and, worse, the allocator pools tied to them.
    """
    with torch.cuda.device(device):
        return torch.cuda.Stream(device=device)


class GpuTimer:
    """Time regions of GPU work with CUDA events, read only when the figure is asked for.

        timer = GpuTimer("cuda")
        for batch in loader:
            with timer:
                step(batch)
        print(timer.mean_ms)          # one wait here, none in the loop

    Each region records a start and an end event on the stream (the current one unless
    `stream=` is given, to the constructor or to `start`/`stop`). Reading `times_ms()`,
    `total_ms` or `mean_ms` waits for the last pending end event (`# sync:` at the one
    place it happens). So that a timer used every step of a long run holds a bounded number
    of events (Python objects the garbage collector walks, in a busy process too), once more
    than `max_pending` regions are pending the oldest are folded in while `query()`
    (non-blocking) says they have completed. `times_ms()` keeps the last `keep` regions;
    `count`, `total_ms` and `mean_ms` cover every region. On the CPU the clock is `perf_counter`.
    """

    def __init__(self, device: Any = None, stream: Any = None, max_pending: int = 64, keep: int = 100_000):
        self.device = resolve_device(device)
        self.stream = stream
        self.max_pending = max_pending
        self._cuda = self.device.type == "cuda"
        self._pending: deque = deque()               # (start_event, end_event) not read yet
        self._times: deque = deque(maxlen=keep)      # the last `keep` resolved region times, ms, in order
        self._sum_ms = 0.0                           # of every resolved region
        self._n = 0
        self._open: Any = None

    # -- recording (hot path: no waits) --------------------------------------------------
    def _stream_for(self, stream: Any) -> Any:
        s = stream if stream is not None else self.stream
        return s if s is not None else torch.cuda.current_stream(self.device)

    def start(self, stream: Any = None) -> Any:
        """Mark the start of a region; returns the start event (CUDA) or the perf_counter time."""
        if self._open is not None:
            raise RuntimeError("GpuTimer.start() called twice without stop(); regions do not nest")
        if self._cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(self._stream_for(stream))
            self._open = ev
        else:
            self._open = time.perf_counter()
        return self._open

    def stop(self, stream: Any = None) -> Any:
        """Mark the end of the region; returns the end event (CUDA, usable with `wait_event`) or None."""
        if self._open is None:
            raise RuntimeError("GpuTimer.stop() called without start()")
        begin, self._open = self._open, None
        if not self._cuda:
            self._fold((time.perf_counter() - begin) * 1e3)
            return None
        end = torch.cuda.Event(enable_timing=True)
        end.record(self._stream_for(stream))
        self._pending.append((begin, end))
        while len(self._pending) > self.max_pending and self._pending[0][1].query():
            # query() asks without waiting; the oldest region has long finished in practice
            b, e = self._pending.popleft()
            self._fold(b.elapsed_time(e))
        return end

    def _fold(self, ms: float) -> None:
        self._times.append(ms)
        self._sum_ms += ms
        self._n += 1

    def __enter__(self) -> "GpuTimer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- reading (waits, once) ---------------------------------------------------------------
    def times_ms(self) -> list[float]:
        """The last `keep` regions' times in milliseconds, oldest first."""
        if self._pending:
            # sync: the caller asked for the figures; wait once for the newest region to finish
            self._pending[-1][1].synchronize()
            while self._pending:
                b, e = self._pending.popleft()
                self._fold(b.elapsed_time(e))
        return list(self._times)

    @property
    def count(self) -> int:
        return self._n + len(self._pending)

    @property
    def total_ms(self) -> float:
        self.times_ms()
        return float(self._sum_ms)

    @property
    def mean_ms(self) -> float:
        self.times_ms()
        return float(self._sum_ms / self._n) if self._n else 0.0

    @property
    def last_ms(self) -> float:
        times = self.times_ms()
        return times[-1] if times else 0.0

    def reset(self) -> None:
        """Forget every region (pending events are dropped unread)."""
        self._pending.clear()
        self._times.clear()
        self._sum_ms, self._n = 0.0, 0
        self._open = None

    def __repr__(self) -> str:
        return f"GpuTimer(device={str(self.device)!r}, regions={self.count})"
