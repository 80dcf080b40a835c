"""The sync detective at runtime: every host-device sync in a block, by the user's source line.

    with gobrrr.watch_syncs() as report:      # "count" (default), "warn" or "raise"
        train_step()
    report.print()                            # kind, site, count, host time blocked, a fix per kind

    with gobrrr.sync_budget(0):               # SyncError on exit when the block synced, listing the sites
        train_step()

How a sync is seen (two nets, one count per Python-level call):

1. Thin wrappers, installed only while at least one watcher is active and removed when the last one
   ends, around the Python entry points of the sixteen common kinds: `Tensor.item/tolist/cpu/numpy`,
   `bool/float/int/index` of a tensor, `repr/format` (print), `nonzero/argwhere`, boolean-mask
   indexing, `unique`, `masked_select`, `to/cuda/copy_` (a blocking D2H or H2D copy, or a
   `non_blocking` copy touching pageable host memory, which CUDA performs synchronously), and
   `torch.cuda.synchronize`, `Stream.synchronize`, `Event.synchronize`. Each wrapper decides from its
   arguments whether the call syncs (a CUDA tensor read on the host, a copy direction), times the call
   (the host stall), and attributes it to the first frame outside torch and gobrrr. Wrapped calls nest
   (`print(t)` calls `item` many times inside torch): only the outermost call is counted.
2. torch's sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`, set only while watching) for
   the long tail: the C++ sync points warn through Python's warnings machinery in the thread that
   synced, on return to Python. Inside a wrapped call such a warning only marks the call as syncing
   (so one `.item()` counts once, not twice); outside, it counts one sync, attributed the same way,
   its kind read from the call expression at the user's line (no stall time: the warning arrives
   after the fact).

Nothing is patched while nobody watches: `import gobrrr` costs a loop nothing. Watchers see every
thread by default; a sync is attributed to the frames of the thread that synced.
"""
from __future__ import annotations

import ast
import functools
import inspect
import linecache
import os
import sys
import threading
import time
import warnings
from typing import Callable

import torch

from gobrrr.syncs.report import DEFAULT_HINT, HINTS, SyncError, SyncReport, SyncSite, SyncWarning  # noqa: F401 (public here)
from gobrrr.syncs.resume import resumable
from gobrrr.syncs.rules import DEFAULT_KIND, targets

SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's text for sync debug mode
PROTOTYPE_WARNING = "Synchronization debug mode is a prototype feature"  # torch's, once, when the mode is set
MODES = ("count", "warn", "raise")


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_GOBRRR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SKIP_FILES = {warnings.__file__, functools.__file__}
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


def _is_stdlib(filename: str) -> bool:
    """runpy, threading, importlib...: never the line a user wants to see."""
    return filename.startswith("<") or (filename.startswith(_STDLIB_DIR) and "-packages" not in filename)


# ---------------------------------------------------------------------------------------- watchers

class watch_syncs:
    """Record every host-device sync in a block (context manager) or in each call (decorator).

    mode: "count" records; "warn" also warns once per site; "raise" raises SyncError at the line.
    all_threads: False watches only the thread that entered the block.
    As a decorator each call gets a fresh report, kept on the wrapper as `.sync_report`. On a generator
    function, an `async def` or an async generator the body is watched on each resumption, into one
    report per call, and a budget covers the whole iteration (gobrrr.syncs.resume).
    """

    def __init__(self, mode: str = "count", *, all_threads: bool = True):
        if mode not in MODES:
            raise ValueError(f"watch_syncs: unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        self.mode = mode
        self.all_threads = all_threads
        self.report: SyncReport | None = None
        self._shared: SyncReport | None = None  # a report carried over resumptions (generators, coroutines)
        self._thread = None

    def _clone(self) -> "watch_syncs":
        return watch_syncs(self.mode, all_threads=self.all_threads)

    def __enter__(self) -> SyncReport:
        if self.report is not None:
            raise RuntimeError("watch_syncs: this watcher is already in use; create a new one per block")
        self.report = self._shared if self._shared is not None else SyncReport(self.mode)
        self._thread = threading.get_ident()
        _HOOKS.add(self)
        return self.report

    def __exit__(self, exc_type, exc, tb) -> bool:
        _HOOKS.remove(self)
        return False

    def __call__(self, fn: Callable) -> Callable:
        if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            return resumable(self, fn)

        @functools.wraps(fn)
        def watched(*args, **kwargs):
            cm = self._clone()
            with cm as report:
                watched.sync_report = report
                return fn(*args, **kwargs)
        watched.sync_report = None
        return watched

    def _fresh_report(self) -> SyncReport:
        return SyncReport(self.mode)

    def _resumption(self, report: SyncReport) -> "watch_syncs":
        """A watcher for one resumption of a generator or coroutine, adding to `report`."""
        w = self._clone()
        w._shared = report
        return w

    def _sees(self, thread: int) -> bool:
        return self.all_threads or thread == self._thread

    def _note(self, site: SyncSite, new: bool) -> None:
        if self.mode == "warn" and new:
            msg = f"host-device sync ({site.kind}) at {site.where()}: {site.code}  -- fix: {site.hint}"
            warnings.warn_explicit(SyncWarning(msg), SyncWarning, site.file, site.line)


class sync_budget(watch_syncs):
    """Allow at most `n` host-device syncs in the block; raise SyncError on exit listing the sites."""

    def __init__(self, n: int, *, mode: str = "count", all_threads: bool = True):
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"sync_budget: n must be a non-negative int, got {n!r}")
        super().__init__(mode, all_threads=all_threads)
        self.n = n

    def _clone(self) -> "sync_budget":
        return sync_budget(self.n, mode=self.mode, all_threads=self.all_threads)

    def __exit__(self, exc_type, exc, tb) -> bool:
        super().__exit__(exc_type, exc, tb)
        report = self.report
        if exc_type is None and report.count > self.n:
            raise SyncError(budget_message(report, self.n), report.sites)
        return False


def budget_message(report: SyncReport, n: int) -> str:
    lines = [f"sync budget of {n} exceeded: {report.count} host-device syncs in the block"]
    lines += [f"  {s.where()}  {s.kind} x{s.count}  ({s.stall_s * 1e3:.3f} ms)  {s.code}" for s in report.sites]
    lines.append("fix the sites above (see report hints), or raise the budget if these syncs are intended")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ attribution

def user_frame(frame):
    """The first frame outside torch and gobrrr: the user's line.

    When that frame is the standard library (code run by `python -m gobrrr ...` through runpy, or a
    thread's bootstrap), the innermost gobrrr frame is the better answer: gobrrr's own code is the user.
    """
    first_gobrrr = None
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_TORCH_DIR) and name not in _SKIP_FILES:
            if not name.startswith(_GOBRRR_DIR):
                if first_gobrrr is not None and _is_stdlib(name):
                    return first_gobrrr
                return f
            if first_gobrrr is None and name != __file__:
                first_gobrrr = f
        f = f.f_back
    return first_gobrrr or frame


def call_kind(frame) -> str:
    """Name of the call the frame is executing, read from its source (`torch.unique(x)` -> 'unique')."""
    try:
        positions = list(frame.f_code.co_positions())
        l0, l1, c0, c1 = positions[frame.f_lasti // 2]
        lines = [linecache.getline(frame.f_code.co_filename, i) for i in range(l0, l1 + 1)]
        text = "".join(lines)
        if l0 == l1:
            text = lines[0].encode()[c0:c1].decode()
        else:
            text = lines[0].encode()[c0:].decode() + "".join(lines[1:-1]) + lines[-1].encode()[:c1].decode()
        node = ast.parse(text.strip(), mode="eval").body
    except (AttributeError, IndexError, TypeError, ValueError, SyntaxError):
        return "sync"
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
    if isinstance(node, ast.Subscript):
        return "bool_mask_index"
    return "sync"


# ---------------------------------------------------------------------------------------- the hooks

class _State(threading.local):
    depth = 0      # nesting of wrapped calls in this thread: only the outermost one counts
    hit = False    # a sync debug warning arrived during the outermost wrapped call


class _Hooks:
    """The patches of torch, installed while at least one watcher is active.

    Patching torch is process-wide by nature, so this is the one process-wide object of the module;
    it holds no results (those live in each watcher's report) and is empty while nobody watches.
    """

    def __init__(self):
        self.lock = threading.RLock()
        self.watchers: tuple = ()
        self.raising = False
        self.state = _State()
        self._saved: list = []
        self._filter = None
        self._show = None
        self._debug_mode = None
        self.kinds: dict = {}  # (code, instruction offset) -> call name, for syncs seen through warnings

    def kind_at(self, frame) -> str:
        key = (frame.f_code, frame.f_lasti)
        kind = self.kinds.get(key)
        if kind is None:
            kind = self.kinds[key] = call_kind(frame)
        return kind

    # -- watcher bookkeeping (copy-on-write tuple: readers never lock)
    def add(self, watcher: watch_syncs) -> None:
        with self.lock:
            if not self.watchers:
                self._install()
            self.watchers = self.watchers + (watcher,)
            self.raising = any(w.mode == "raise" for w in self.watchers)

    def remove(self, watcher: watch_syncs) -> None:
        with self.lock:
            self.watchers = tuple(w for w in self.watchers if w is not watcher)
            self.raising = any(w.mode == "raise" for w in self.watchers)
            if not self.watchers:
                self._uninstall()

    def raises_here(self) -> bool:
        thread = threading.get_ident()
        return any(w.mode == "raise" and w._sees(thread) for w in self.watchers)

    def record(self, kind: str, frame, stall_s: float) -> None:
        """Count one sync in every watcher that sees this thread; raise if one is in raise mode."""
        thread = threading.get_ident()
        f = user_frame(frame)
        file, line = f.f_code.co_filename, f.f_lineno
        raise_site = None
        for w in self.watchers:
            if w._sees(thread):
                site, new = w.report._add(kind, file, line, stall_s)
                w._note(site, new)
                if w.mode == "raise":
                    raise_site = site
        if raise_site is not None:
            s = raise_site
            raise SyncError(f"host-device sync ({s.kind}) at {s.where()}: {s.code}\n  fix: {s.hint}", [s])

    # -- patches
    def _install(self) -> None:
        for owner, name, rule in targets():
            current = owner.__dict__.get(name, _MISSING)
            original = getattr(owner, name, _MISSING)
            if original is _MISSING:
                continue
            setattr(owner, name, _wrap(original, name, rule, self))
            self._saved.append((owner, name, current))
        self._install_warning_net()

    def _uninstall(self) -> None:
        for owner, name, current in reversed(self._saved):
            if current is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, current)
        self._saved.clear()
        self.kinds.clear()
        self._uninstall_warning_net()

    def _install_warning_net(self) -> None:
        warnings.filterwarnings("always", message=SYNC_WARNING)
        self._filter = warnings.filters[0]
        self._show = warnings._showwarnmsg
        warnings._showwarnmsg = functools.partial(_on_warning, self, self._show)
        get = getattr(torch._C, "_cuda_get_sync_debug_mode", None)
        set_ = getattr(torch._C, "_cuda_set_sync_debug_mode", None)
        if get is None or set_ is None or not torch.cuda.is_available():
            return  # a CPU build or no GPU: no CUDA sync points to switch on
        self._debug_mode = get()
        if self._debug_mode == 0:
            _set_debug_mode(set_, 1)  # warn: the C++ sync points report through Python's warnings, in the syncing thread

    def _uninstall_warning_net(self) -> None:
        if self._show is None:
            return
        if self._debug_mode == 0:
            _set_debug_mode(torch._C._cuda_set_sync_debug_mode, 0)
        warnings._showwarnmsg = self._show
        try:
            warnings.filters.remove(self._filter)
        except ValueError:
            pass  # someone replaced the filter list in the meantime (catch_warnings): nothing to undo
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()
        self._show = self._filter = self._debug_mode = None


_MISSING = object()


def _set_debug_mode(set_: Callable, mode: int) -> None:
    """Set torch's sync debug mode without its "prototype feature" warning: the detective turns the mode
    on, the user never asked for it (the filter is scoped to this one call and that one message)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PROTOTYPE_WARNING)
        set_(mode)


def _on_warning(hooks: _Hooks, show: Callable, msg) -> None:
    """Replacement for warnings._showwarnmsg while watching: sync debug warnings are counted, not shown."""
    if not str(msg.message).startswith(SYNC_WARNING):
        return show(msg)
    state = hooks.state
    if state.depth:
        state.hit = True  # the wrapped call around this one counts it, once
        return None
    frame = sys._getframe(1)
    hooks.record(hooks.kind_at(user_frame(frame)), frame, 0.0)
    return None


def _wrap(original: Callable, name: str, rule: Callable, hooks: _Hooks) -> Callable:
    """A thin wrapper: predict from the arguments whether the call syncs, time it, count it once."""
    default_kind = DEFAULT_KIND.get(name, name)
    state = hooks.state

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if state.depth:  # inside another wrapped call (print -> item): that outer call counts
            state.depth += 1
            try:
                if not state.hit and rule(args, kwargs):
                    state.hit = True
                return original(*args, **kwargs)
            finally:
                state.depth -= 1
        kind = rule(args, kwargs)
        if kind and hooks.raising and hooks.raises_here():
            hooks.record(kind, sys._getframe(1), 0.0)  # raises SyncError before the sync happens
        state.depth, state.hit = 1, False
        t0 = time.perf_counter()
        try:
            out = original(*args, **kwargs)
        finally:
            state.depth = 0
        stall = time.perf_counter() - t0
        if kind or state.hit:
            hooks.record(kind or default_kind, sys._getframe(1), stall)
        return out

    return wrapper


_HOOKS = _Hooks()


def watching() -> bool:
    """True while at least one watcher is active (and torch is patched)."""
    return bool(_HOOKS.watchers)
