"""A torch.profiler (Kineto) Chrome trace, read into plain lists: GPU work, CUDA runtime calls,
Python frames, CPU ops and steps; and the interval arithmetic the doctor's figures are made of.

Event kinds used (Chrome trace `cat`): `kernel`, `gpu_memcpy`, `gpu_memset` (on the GPU, `tid`
and `args.stream` the CUDA stream), `cuda_runtime` / `cuda_driver` (host calls; `args.correlation`
links a call to the GPU work it enqueued), `python_function` (with `with_stack=True`), `cpu_op`,
and `user_annotation` named `ProfilerStep#N` (one per step). Times are microseconds.
"""
from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from gobrrr.doctor.sources import FRAME_RE, Frame

# ----------------------------------------------------------------------------------------------
# Interval arithmetic on sorted, disjoint (start, end) lists

Intervals = list[tuple[float, float]]


def merge(intervals: Iterable[tuple[float, float]]) -> Intervals:
    """Union of intervals as a sorted list of disjoint ones."""
    out: Intervals = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def total(intervals: Intervals) -> float:
    return sum(e - s for s, e in intervals)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two merged lists (two-pointer sweep)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def complement(a: Intervals, lo: float, hi: float) -> Intervals:
    """The parts of [lo, hi] not covered by the merged list `a`."""
    out, cur = [], lo
    for s, e in a:
        if s > cur:
            out.append((cur, min(s, hi)))
        cur = max(cur, e)
        if cur >= hi:
            break
    if cur < hi:
        out.append((cur, hi))
    return [(s, e) for s, e in out if e > s]


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a minus b, both merged."""
    if not a:
        return []
    return intersect(a, complement(b, a[0][0], a[-1][1]))



# Host calls that block the calling thread until the GPU has finished earlier work.
SYNC_CALLS = {
    "cudaStreamSynchronize": "stream sync", "cuStreamSynchronize": "stream sync",
    "cudaDeviceSynchronize": "device sync", "cuCtxSynchronize": "device sync",
    "cudaEventSynchronize": "event sync", "cuEventSynchronize": "event sync",
    "cudaMemcpy": "blocking copy", "cudaMemcpy2D": "blocking copy", "cuMemcpyDtoH_v2": "blocking copy",
}
LAUNCH_RE = re.compile(r"LaunchKernel|cuLaunch|GraphLaunch")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)")


@dataclass
class GpuEvent:
    kind: str           # "kernel" | "memcpy" | "memset"
    name: str
    ts: float           # us
    dur: float          # us
    stream: int
    correlation: int = -1
    nbytes: int = 0
    direction: str = ""  # "H2D" | "D2H" | "D2D" | "" for kernels
    pageable: bool = False

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class HostCall:
    name: str
    ts: float
    dur: float
    tid: int
    correlation: int = -1

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class Trace:
    """The events of one trace, sorted by start time."""
    gpu: list[GpuEvent]
    calls: list[HostCall]
    frames: dict[int, list[Frame]]                   # tid -> python frames
    ops: dict[int, list[tuple[float, float, str]]]   # tid -> cpu ops (ts, end, name)
    steps: list[tuple[int, float, float]]            # (number, ts, end), host clock
    thread_names: dict[int, str]
    meta: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)  # tid -> [(ts, end, name)]: record_function ranges


def load_trace(src) -> dict:
    """A Chrome trace as a dict, from a dict, a .json path or a .json.gz path."""
    if isinstance(src, dict):
        return src
    path = Path(src)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    if isinstance(data, list):  # the bare-array form of the Chrome trace format
        data = {"traceEvents": data}
    if "traceEvents" not in data:
        raise ValueError(f"{path} is not a Chrome trace (no 'traceEvents'); pass a torch.profiler export.")
    return data


def _copy_direction(name: str) -> str:
    for tag, direction in (("HtoD", "H2D"), ("DtoH", "D2H"), ("DtoD", "D2D"), ("PtoP", "D2D"), ("HtoH", "H2H")):
        if tag in name:
            return direction
    return "?"


def parse(trace) -> Trace:
    """Sort the events of a Chrome trace into GPU work, CUDA runtime calls, Python frames and steps."""
    data = load_trace(trace)
    gpu, calls, steps = [], [], []
    frames: dict[int, list[Frame]] = defaultdict(list)
    ops: dict[int, list] = defaultdict(list)
    thread_names: dict[int, str] = {}
    annotations: dict[int, list] = defaultdict(list)
    for e in data["traceEvents"]:
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":
            thread_names[_int(e.get("tid"))] = str(e.get("args", {}).get("name", ""))
            continue
        if ph != "X":
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        args = e.get("args") or {}
        corr = _int(args.get("correlation", -1))
        if cat in ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"):
            stream = _int(args.get("stream", e.get("tid", 0)))
            if cat.lower() == "kernel":
                gpu.append(GpuEvent("kernel", name, ts, dur, stream, corr))
            elif "memcpy" in cat.lower():
                gpu.append(GpuEvent("memcpy", name, ts, dur, stream, corr, _int(args.get("bytes", 0)),
                                    _copy_direction(name), "Pageable" in name))
            else:
                gpu.append(GpuEvent("memset", name, ts, dur, stream, corr, _int(args.get("bytes", 0))))
        elif cat in ("cuda_runtime", "cuda_driver"):
            calls.append(HostCall(name, ts, dur, _int(e.get("tid")), corr))
        elif cat == "python_function":
            m = FRAME_RE.match(name)
            # `nn.Module: Linear_0` and the like are markers, not source: named `<...>` like built-ins
            file, line, func = (m.group(1), int(m.group(2)), m.group(3)) if m else (
                name if name.startswith("<") else f"<{name}>", 0, name)
            frames[_int(e.get("tid"))].append(Frame(file, line, func, ts, ts + dur, name))
        elif cat == "user_annotation" and _STEP_RE.match(name):
            steps.append((int(_STEP_RE.match(name).group(1)), ts, ts + dur))
        elif cat == "user_annotation":
            annotations[_int(e.get("tid"))].append((ts, ts + dur, name))
        elif cat == "cpu_op":
            ops[_int(e.get("tid"))].append((ts, ts + dur, name))
    gpu.sort(key=lambda g: g.ts)
    calls.sort(key=lambda c: c.ts)
    for fl in frames.values():
        fl.sort(key=lambda f: (f.ts, -f.end))
        _link_parents(fl)
    for ol in ops.values():
        ol.sort()
    steps.sort(key=lambda s: s[1])
    meta = {k: v for k, v in data.items() if k != "traceEvents"}
    for al in annotations.values():
        al.sort()
    return Trace(gpu, calls, dict(frames), dict(ops), steps, thread_names, meta, dict(annotations))


def _link_parents(frames: list[Frame]) -> None:
    """Number the frames of one thread (sorted by start) and give each its caller's number (-1: none).

    Frames of one thread nest, so one sweep with a stack finds every caller.
    """
    stack: list[Frame] = []
    for i, f in enumerate(frames):
        f.index = i
        while stack and stack[-1].end <= f.ts:
            stack.pop()
        while stack and stack[-1].end < f.end - 0.01:  # clipped at a trace edge: not a caller
            stack.pop()
        f.parent = stack[-1].index if stack else -1
        stack.append(f)


def _int(x, default: int = -1) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default
