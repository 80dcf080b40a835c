"""What the host was doing while the GPU sat empty: a line of the user's code, or a named cause.

The doctor finds the intervals in which no kernel ran and the next launch came late (the host
was busy elsewhere). To say where, it reads the Python frames the trace holds (`python_function`
events, recorded with `with_stack=True`), thread by thread:

1. The thread. A launch made by a thread without Python frames of the user's (the autograd
   engine's thread runs backward; a prefetcher's copy thread runs library code only) is charged
   to the Python thread (the one with the most frames): what it was doing then is what the user
   wrote (`loss.backward()`, the `for` line).
2. The frame. Of the frames open over the whole interval, the innermost one that is the user's
   code (not torch, site-packages, the standard library or gobrrr: `is_library_file`).
3. The call. That frame's child that covers most of the interval (or, when the host ran the
   frame's own bytecode, the child that starts right after: the call that launched), followed down
   through wrappers (`wrapper`, `_use_grad`, `inner`) until its name matches a call in the
   function's source (`zero_grad`, `backward`, `item`, `__next__` for the `for` line). A module
   call (`_wrapped_call_impl`, `nn.Module: ResNet_0`) matches the lines that call an object
   (`model(images)`, `criterion(out, y)`). When several lines match, the position of the child
   in its run of like calls picks one: `images.to(...)` then `target.to(...)` are the first and
   second `.to` of the step. A module call that runs through `nn.DataParallel` is marked so:
   on one GPU its per-step walk of the parameters is pure host time.
4. Time inside a DataLoader's `__next__` (its `enumerate(DataLoader)#...__next__` range, or the
   frame in torch/utils/data/dataloader.py), or a gobrrr.Prefetcher's, is waiting for data: it is
   charged to the `for` line, with the loader's name read from that line.

When no frame of the user's holds the interval (a trace without Python stacks, or a run whose
every frame is a library's), the cause is named: host launch overhead.

5. Compiled code (torch.compile). Inductor's generated files are never the user's line. When the
   stack passes through torch.compile's frame evaluation (`torch/_dynamo/eval_frame.py`), the user's
   frames below it (the model's `forward`, now running as compiled graphs) are not what the host was
   doing line by line: the site is the user's line that *called* the compiled function
   (`logits, loss = model(X, Y)`), marked `compiled`. A backward that runs compiled graphs on the
   autograd thread is charged to the Python thread's `loss.backward()` line, marked the same way.
"""
from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass

from gobrrr.doctor.sources import (
    Frame,
    Site,
    SourceResolver,
    _is_detective,
    callee_name,
    is_dynamo_frame,
    is_graph_frame,
    stacks_at,
)
from gobrrr.doctor.trace import Trace

HOST_OVERHEAD = "host launch overhead"
LOADER_RE = re.compile(r"DataLoader.*__next__")
MODULE_CALLEES = {"_wrapped_call_impl", "_call_impl", "__call__"}
_DATALOADER_FILE = "torch/utils/data/dataloader.py"
_GOBRRR_LOADERS = ("gobrrr/loader/prefetch_pass.py", "gobrrr/loader/ring_epoch.py")  # ours wait for data too (their __next__)
_DATA_PARALLEL_FILE = "torch/nn/parallel/data_parallel.py"
_MAX_DEPTH = 10  # wrappers followed down from the user's call


@dataclass
class LoaderRange:
    ts: float
    end: float
    name: str           # the record_function name: tells a worker-process loader from an in-process one

    @property
    def in_process(self) -> bool:
        return "SingleProcess" in self.name

    @property
    def ours(self) -> bool:
        """A gobrrr.Prefetcher (or worker ring) waiting on its source, not a DataLoader itself."""
        return self.name.startswith("gobrrr")


def python_thread(tr: Trace) -> int | None:
    """The thread that runs the user's Python: the one with the most frames (in a trace without Python
    stacks, the one with the most record_function ranges, else the most ops)."""
    for table in (tr.frames, tr.annotations, tr.ops):
        if table:
            return max(table, key=lambda t: len(table[t]))
    return None


def loader_ranges(tr: Trace, tid: int | None) -> list[LoaderRange]:
    """The intervals the Python thread spent inside a DataLoader's `__next__` (sorted, disjoint)."""
    if tid is None:
        return []
    out = [LoaderRange(s, e, n) for s, e, n in tr.annotations.get(tid, []) if LOADER_RE.search(n)]
    # the Python frame of __next__ starts a little before its range and ends a little after
    for f in tr.frames.get(tid, []):
        if f.func == "__next__":
            file = f.file.replace("\\", "/")
            if file.endswith(_DATALOADER_FILE):
                out.append(LoaderRange(f.ts, f.end, "DataLoader.__next__"))
            elif file.endswith(_GOBRRR_LOADERS):
                out.append(LoaderRange(f.ts, f.end, f"gobrrr {file.rsplit('/', 1)[-1]} __next__"))
    out.sort(key=lambda r: r.ts)
    merged: list[LoaderRange] = []
    for r in out:
        if merged and r.ts <= merged[-1].end:
            merged[-1].end = max(merged[-1].end, r.end)
            if "#" in r.name and not merged[-1].ours:  # the record_function name tells the loader's kind
                merged[-1].name = r.name
        else:
            merged.append(r)
    return merged


class HostAttribution:
    """Names the user's line behind host intervals of one trace (see the module docstring)."""

    def __init__(self, tr: Trace, resolver: SourceResolver):
        self.tr, self.resolver = tr, resolver
        self.main = python_thread(tr)
        self._kids: dict[int, dict[int, list[Frame]]] = {}
        self._kid_starts: dict[tuple[int, int], list[float]] = {}

    def thread(self, tid: int) -> int | None:
        """The thread whose frames explain work launched by `tid`."""
        return tid if self.tr.frames.get(tid) else self.main

    def locate(self, queries: list[tuple[int, float, float]]) -> list[Site | None]:
        """For each (tid, a, b): the user's line that held the host over [a, b]; None when no frame of
        the user's did (the caller names the cause). One stack sweep per thread."""
        out: list[Site | None] = [None] * len(queries)
        self.compiled: dict[int, bool] = {}  # query index -> its stack ran compiled code
        by_thread: dict[int, list[int]] = defaultdict(list)
        for i, (tid, _, _) in enumerate(queries):
            th = self.thread(tid)
            if th is not None and self.tr.frames.get(th):
                by_thread[th].append(i)
        retry: list[int] = []
        for th, idxs in by_thread.items():
            self._sweep(th, idxs, queries, out)
            if th != self.main:  # a thread of library code only (a prefetcher's copy thread): ask the main one
                retry += [i for i in idxs if out[i] is None]
        if retry and self.tr.frames.get(self.main):
            self._sweep(self.main, retry, queries, out)
        return out

    def _sweep(self, th: int, idxs: list[int], queries, out) -> None:
        stacks = stacks_at(self.tr.frames[th], [queries[i][1] for i in idxs])
        for i, stack in zip(idxs, stacks):
            _, a, b = queries[i]
            enclosing = [f for f in stack if f.end >= b]
            compiled = self.compiled.get(i, False) or any(is_graph_frame(f) for f in enclosing)
            if compiled:
                self.compiled[i] = True  # a retry on the main thread keeps the mark
            site = self._site(th, enclosing, a, b)
            if site is not None and compiled:
                site.detail = "compiled"
            out[i] = site

    # -- one interval ----------------------------------------------------------------------

    def _site(self, th: int, enclosing: list[Frame], a: float, b: float) -> Site | None:
        # in a compiled graph the user's frames below torch.compile's entry (the model's forward) are not
        # what the host was doing line by line: start the search above the outermost entry, at the line
        # that called the compiled function
        g = next((k for k, f in enumerate(enclosing) if is_graph_frame(f)), len(enclosing))
        top = next((k for k, f in enumerate(enclosing[:g]) if is_dynamo_frame(f)), g)
        for k in range(top - 1, -1, -1):
            f = enclosing[k]
            if self.resolver.is_library(f.file):
                continue
            child = enclosing[k + 1] if k + 1 < len(enclosing) else self._child(th, f, a, b)
            return self._resolve(th, f, child, a, b)
        return None

    def kids(self, th: int, f: Frame) -> list[Frame]:
        """The frames `f` called directly, by start time."""
        table = self._kids.get(th)
        if table is None:
            table = self._kids[th] = defaultdict(list)
            for g in self.tr.frames[th]:
                if g.parent >= 0:
                    table[g.parent].append(g)
        return table.get(f.index, [])

    def _starts(self, th: int, f: Frame) -> list[float]:
        key = (th, f.index)
        starts = self._kid_starts.get(key)
        if starts is None:
            starts = self._kid_starts[key] = [g.ts for g in self.kids(th, f)]
        return starts

    def _child(self, th: int, f: Frame, a: float, b: float) -> Frame | None:
        """The call of `f` that covers most of [a, b] (for a point, the call open at it); None when
        the host ran `f`'s own bytecode (tensor operators, which launch without a Python call)."""
        kids = self.kids(th, f)
        if not kids:
            return None
        starts = self._starts(th, f)
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        best, best_overlap = None, -1.0
        while i < len(kids) and kids[i].ts <= b:
            g = kids[i]
            overlap = min(g.end, b) - max(g.ts, a)
            if overlap >= 0 and overlap > best_overlap:
                best, best_overlap = g, overlap
            i += 1
        return best

    def _resolve(self, th: int, f: Frame, child: Frame | None, a: float, b: float) -> Site:
        """The line of `f` that made the call `child` (followed down through wrappers)."""
        r = self.resolver
        if child is None:  # launched by the function's own operators: the line is not in the trace
            return Site(f.file, f.line, r.code(f.file, f.line), f.func, HOST_OVERHEAD if b > a else "")
        top = callee_name(child.raw)
        g, lines, callee, module = child, [], top, False
        for _ in range(_MAX_DEPTH):
            if g is None:
                break
            if not _is_detective(g.file):
                name = callee_name(g.raw)
                if g.raw.startswith("nn.Module: ") or name in MODULE_CALLEES:
                    module, callee = True, "module call"
                    lines = r.module_call_lines(f.file, f.line, f.func)
                    break
                lines = r.call_lines(f.file, f.line, f.func, name)
                if lines:
                    callee = name
                    break
            inner = self._child(th, g, max(a, g.ts), min(b, g.end)) if b > a else self._child(th, g, a, b)
            g = inner or self._main_call(th, g)  # in a wrapper's own code: follow the call it wraps
        if not lines:  # the call is not in the source we can read: the function itself, by its first line
            return Site(f.file, f.line, r.code(f.file, f.line), f.func, top)
        line = lines[0]
        if len(lines) > 1:
            line = lines[self._position_in_run(th, f, child, module) % len(lines)]
        site = Site(f.file, line, r.code(f.file, line), f.func, callee)
        if module and b > a and self._under(th, child, a, b, _DATA_PARALLEL_FILE):
            site.detail = "DataParallel"
        return site

    def _under(self, th: int, g: Frame, a: float, b: float, suffix: str) -> bool:
        """Whether [a, b] was spent in the code of `suffix` itself (or what it calls outside a module):
        following the calls that hold [a, b] down from `g`, one passes through `suffix` and no module
        call comes after it (a gap inside the wrapped model's forward is that model's, not the wrapper's)."""
        seen = False
        for _ in range(3 * _MAX_DEPTH):
            inner = self._child(th, g, max(a, g.ts), min(b, g.end))
            if inner is None:
                return seen
            g = inner
            if g.file.replace("\\", "/").endswith(suffix):
                seen = True
            elif seen and (g.raw.startswith("nn.Module: ") or callee_name(g.raw) in MODULE_CALLEES):
                return False
        return seen

    def _main_call(self, th: int, g: Frame) -> Frame | None:
        """The longest call `g` makes outside gobrrr: what a wrapper wraps (not its timers, not its rules)."""
        kids = [k for k in self.kids(th, g) if "gobrrr/" not in k.file.replace("\\", "/")]
        return max(kids, key=lambda k: k.end - k.ts) if kids else None

    def _position_in_run(self, th: int, f: Frame, child: Frame, module: bool) -> int:
        """How many like calls (same callee; or module calls) `f` made just before `child`, back to back."""
        kids = self.kids(th, f)
        i = bisect.bisect_left(self._starts(th, f), child.ts)
        while i < len(kids) and kids[i] is not child and kids[i].ts == child.ts:
            i += 1
        if i >= len(kids) or kids[i] is not child:
            return 0
        key = self.call_key(th, child)
        n = 0
        while i - 1 - n >= 0 and self.call_key(th, kids[i - 1 - n]) == key:
            n += 1
        return n

    def call_key(self, th: int, g: Frame) -> str:
        """What a call is, for telling like calls apart: "module call", or the callee's name (seen through
        the sync detective's wrapper, which sits over `.to()`, `.item()`... while the doctor watches)."""
        for _ in range(3):
            inner = self._main_call(th, g) if _is_detective(g.file) else None
            if inner is None:
                break
            g = inner
        name = callee_name(g.raw)
        return "module call" if name in MODULE_CALLEES or g.raw.startswith("nn.Module: ") else name
