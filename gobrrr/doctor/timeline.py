"""Trace -> figures: where the GPU waits, read from a torch.profiler (Kineto) Chrome trace.

The trace holds three clocks' worth of events on one time axis (microseconds):
host calls into the CUDA runtime (`cuda_runtime`: launches, copies, syncs), the work that
ran on the GPU (`kernel`, `gpu_memcpy`, `gpu_memset`, one `tid` per CUDA stream), and, with
`with_stack=True`, the Python frames of the host thread (`python_function`). A runtime call
and the GPU work it enqueued share a `correlation` id. From these we compute:

- the window: the GPU work launched inside the recorded steps (`ProfilerStep#N`), spanning
  from the first GPU event's start to the last one's end (`span_ms`), the same window and
  definitions as Holistic Trace Analysis (HTA, Meta 2023) with `include_last_profiler_step=True`;
- `idle_pct`: share of the span with nothing at all running on the GPU (HTA's temporal
  breakdown `idle_time_pctg`);
- `compute_idle_pct`: share of the span with no compute kernel running (= 100 minus HTA's
  `compute_time_pctg`); this is the headline "GPU idle" and it is broken down, each part in ms
  and % of span, into: `waiting_for_data` (an H2D copy runs while nothing computes and compute
  waits for it: the next kernel is already queued behind it, or the host sits in the copy call,
  as a pageable `.to()` makes it), `communication` (an NCCL kernel running alone: exposed communication;
  NCCL kernels are not compute, as in HTA), `other_copies` (D2H / D2D / memset alone), and the truly empty
  gaps, each classed by what the host was doing: `sync_blocked` (the host sat in a
  synchronising call when the GPU ran dry, attributed to the source line of that call),
  `host_bound` (the next launch came after the GPU ran dry; copies that nobody waited for count
  here too), `launch_gaps` (gaps shorter than `launch_gap_us`, the cost of launching
  back-to-back small kernels) and `other`; an empty gap that ends with an H2D copy whose call
  the host had already entered (staging a pageable copy) counts as waiting for data from the
  moment of that call;
- `copy_hidden_pct`: share of H2D copy time off the critical path (what prefetching buys);
- `copy_overlap_pct`: share of memcpy time during which some compute kernel runs (closest HTA
  figure: "COMPUTATION overlapping MEMORY" / all MEMORY time of its kernel-type breakdown;
  HTA's MEMORY also counts memsets); `overlap_pct`: the same overlapped time as a share of the
  shorter of copy time and compute time, so a perfect pipeline reads 100% whichever side is
  longer (a copy-bound loop cannot hide more of its copies than it has compute);
- copies by direction (count, bytes, GB/s), pageable copies named by source line, host time
  blocked in syncs per source line, queue lead, top kernels and a launch-bound flag.

Reading the trace and interval arithmetic: timeline_trace.py. Source lines (timeline_sources.py):
a Python frame in the trace is named `file(first_line): function`, so it tells
the function, not the line inside it. We take the innermost user frame above the call (not
torch, not the standard library), take the callee just below it (`.item`, `synchronize`,
`.to`) and find that call in the function's source with `ast` (see `SourceResolver`).
"""
from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Iterable

from gobrrr.doctor.compiled import summary as compiled_summary
from gobrrr.doctor.host import HOST_OVERHEAD, HostAttribution, loader_ranges
from gobrrr.doctor.sources import Site, SourceResolver
from gobrrr.doctor.trace import (  # noqa: F401  (re-exported: the doctor's one import)
    LAUNCH_RE,
    SYNC_CALLS,
    GpuEvent,
    HostCall,
    Intervals,
    Trace,
    complement,
    intersect,
    load_trace,
    merge,
    parse,
    subtract,
    total,
)

# ----------------------------------------------------------------------------------------------
# Figures


@dataclass
class Figures:
    """Everything the doctor reports about one trace; times in ms unless named otherwise."""
    has_gpu: bool
    steps_ms: list[float]
    span_ms: float = 0.0
    idle_pct: float = 0.0            # nothing running on the GPU (HTA temporal idle)
    compute_idle_pct: float = 0.0    # no compute kernel running (the headline "GPU idle")
    idle_breakdown_ms: dict = field(default_factory=dict)
    idle_breakdown_pct: dict = field(default_factory=dict)
    top_cause: str = ""
    copy_overlap_pct: float | None = None  # share of memcpy time with a kernel running (HTA-comparable)
    overlap_pct: float | None = None       # share of the shorter of (memcpy, kernel) time run alongside the other
    copy_hidden_pct: float | None = None   # share of H2D time off the critical path (what prefetching buys)
    h2d_overlap_pct: float | None = None
    copies: dict = field(default_factory=dict)       # direction -> {count, bytes, ms, gbps}
    pageable: list = field(default_factory=list)     # [{site, code, name, count, bytes, ms, gbps}]
    h2d_sites: list = field(default_factory=list)    # every H2D copy by source line, pinned or not
    syncs: list = field(default_factory=list)        # [{site, code, kind, count, total_ms, idle_ms}]
    host_bound_sites: list = field(default_factory=list)  # [{site, code, callee, func, idle_ms}]
    loader_sites: list = field(default_factory=list)      # [{site, code, loader, in_process, idle_ms}]
    queue_lead_ms: dict = field(default_factory=dict)
    top_kernels: list = field(default_factory=list)
    launch: dict = field(default_factory=dict)
    streams: dict = field(default_factory=dict)      # stream -> {busy_ms, busy_pct, kernels, copies}
    host_threads: dict = field(default_factory=dict)
    compiled: dict = field(default_factory=dict)     # compiled calls by line, graph breaks (doctor.compiled)
    window_us: tuple = (0.0, 0.0)

    def to_dict(self) -> dict:
        return asdict(self)


CAUSES = ("waiting_for_data", "data_loader", "sync_blocked", "host_bound", "launch_gaps", "communication",
          "other_copies", "other")
NCCL_RE = re.compile(r"^nccl.*Kernel")  # communication kernels: not compute (as HTA classes them)


def analyze(trace, *, source_roots: Iterable[str] = (), launch_gap_us: float = 20.0,
            sync_tolerance_us: float = 10.0, top: int = 10, user_paths: Iterable[str] = ()) -> Figures:
    """All figures for one trace (a dict, a parsed `Trace`, or a path to .json / .json.gz)."""
    tr = trace if isinstance(trace, Trace) else parse(trace)
    resolver = SourceResolver(source_roots, user_paths)
    steps_ms = [round((e - s) / 1e3, 4) for _, s, e in tr.steps]
    if tr.steps:
        h0, h1 = tr.steps[0][1], tr.steps[-1][2]
    else:
        every = [c.ts for c in tr.calls] + [s for ol in tr.ops.values() for s, _, _ in ol]
        ends = [c.end for c in tr.calls] + [e for ol in tr.ops.values() for _, e, _ in ol]
        h0, h1 = (min(every), max(ends)) if every else (0.0, 0.0)
    calls = [c for c in tr.calls if h0 <= c.ts <= h1]
    by_corr = {c.correlation: c for c in calls if c.correlation >= 0}
    if tr.calls:  # keep GPU work launched inside the window (HTA's filter)
        gpu = [g for g in tr.gpu if g.correlation in by_corr]
    else:
        gpu = [g for g in tr.gpu if h0 <= g.ts <= h1]
    fig = Figures(has_gpu=bool(gpu), steps_ms=steps_ms)
    fig.host_threads = _host_threads(tr, h0, h1)
    host = HostAttribution(tr, resolver)
    site_cache: dict[tuple[int, float], Site] = {}
    _prime_sites(tr, calls, host, site_cache)
    fig.call_sites = site_cache  # (tid, ts) -> Site for syncs and copies; not serialised
    pageable_calls = {g.correlation for g in gpu if g.pageable}
    fig.syncs = _sync_table(calls, site_cache, pageable_calls)
    fig.compiled = compiled_summary(tr, host, h0, h1, len(steps_ms))
    if not gpu:
        return fig

    w0, w1 = min(g.ts for g in gpu), max(g.end for g in gpu)
    span = w1 - w0
    fig.window_us = (w0, w1)
    fig.span_ms = span / 1e3
    every = merge((g.ts, g.end) for g in gpu)
    compute = merge((g.ts, g.end) for g in gpu if g.kind == "kernel" and not NCCL_RE.match(g.name))
    comm = merge((g.ts, g.end) for g in gpu if g.kind == "kernel" and NCCL_RE.match(g.name))
    h2d = merge((g.ts, g.end) for g in gpu if g.kind == "memcpy" and g.direction == "H2D")
    copies = merge((g.ts, g.end) for g in gpu if g.kind == "memcpy")
    empty = complement(every, w0, w1)
    no_compute = complement(compute, w0, w1)
    fig.idle_pct = _pct(total(empty), span)
    fig.compute_idle_pct = _pct(total(no_compute), span)

    cause_us = dict.fromkeys(CAUSES, 0.0)
    critical = _critical_h2d(gpu, calls, by_corr, no_compute, h2d)
    cause_us["waiting_for_data"] = total(critical)
    cause_us["host_bound"] = total(intersect(no_compute, h2d)) - total(critical)  # copies nobody waited for
    cause_us["communication"] = total(subtract(intersect(no_compute, comm), h2d))  # a collective alone: exposed
    cause_us["other_copies"] = total(subtract(subtract(intersect(no_compute, every), h2d), comm))
    syncs = [c for c in calls if c.name in SYNC_CALLS]
    sync_ends = [s.end for s in syncs]
    starts = [g.ts for g in gpu]
    sync_idle: dict[tuple[str, str], float] = defaultdict(float)
    loaders = loader_ranges(tr, host.main)
    loader_iv = [(r.ts, r.end) for r in loaders]
    late: list[tuple[int, float, float, float]] = []  # (launching thread, a, b, idle us): named below
    for c, d in empty:
        nxt = gpu[min(bisect.bisect_left(starts, d - 1e-6), len(gpu) - 1)]
        launch = by_corr.get(nxt.correlation)
        if launch is not None and nxt.kind == "memcpy" and nxt.direction == "H2D" and launch.ts < d:
            # the host was inside the copy call (staging a pageable copy): the GPU waits for data
            staged = d - max(c, launch.ts)
            cause_us["waiting_for_data"] += staged
            d = max(c, launch.ts)
            if d - c <= 0:
                continue
        gap = d - c
        blocker = _blocking_sync(syncs, sync_ends, c, d, sync_tolerance_us)
        if blocker is not None:
            cause_us["sync_blocked"] += gap
            sync_idle[(_site_of(blocker, site_cache).key, SYNC_CALLS[blocker.name])] += gap
        elif gap <= launch_gap_us:
            cause_us["launch_gaps"] += gap
        elif launch is not None and launch.ts > c:
            # the host came late: the part spent in a DataLoader's __next__ is waiting for data,
            # the rest is charged to what the Python thread was running (timeline_host)
            in_loader = intersect([(c, d)], loader_iv) if loader_iv else []
            for a, b in in_loader:
                cause_us["data_loader"] += b - a
                late.append((-1, a, b, -(b - a)))  # negative: a loader piece
            rest = gap - total(in_loader)
            if rest > 0:
                cause_us["host_bound"] += rest
                late.append((launch.tid, c, min(d, launch.ts), rest))
        else:
            cause_us["other"] += gap
    fig.host_bound_sites, fig.loader_sites = _late_sites(host, late, loaders)
    fig.idle_breakdown_ms = {k: round(v / 1e3, 4) for k, v in cause_us.items()}
    fig.idle_breakdown_pct = {k: _pct(v, span) for k, v in cause_us.items()}
    fig.top_cause = max(cause_us, key=cause_us.get) if total(no_compute) > 0 else ""
    for row in fig.syncs:
        row["idle_ms"] = round(sync_idle.get((row["site"], row["kind"]), 0.0) / 1e3, 4)

    both = total(intersect(copies, compute))
    fig.copy_overlap_pct = _pct(both, total(copies)) if copies else None
    fig.overlap_pct = _pct(both, min(total(copies), total(compute))) if copies and compute else None
    fig.h2d_overlap_pct = _pct(total(intersect(h2d, compute)), total(h2d)) if h2d else None
    fig.copy_hidden_pct = round(100.0 - _pct(total(critical), total(h2d)), 3) if h2d else None
    fig.copies, fig.pageable, fig.h2d_sites = _copy_tables(gpu, by_corr, site_cache, critical)
    fig.queue_lead_ms = _queue_lead(gpu, by_corr)
    fig.top_kernels = _top_kernels(gpu, top)
    fig.launch = _launch_bound(gpu, calls)
    fig.streams = _streams(gpu, w0, span)
    return fig


def _critical_h2d(gpu: list[GpuEvent], calls: list[HostCall], by_corr, no_compute: Intervals,
                  h2d: Intervals) -> Intervals:
    """The H2D copy time on the critical path: no kernel runs, and compute is waiting for the copy.

    A copy that runs while no kernel does holds up compute when the next kernel was already
    launched (queued behind the copy: a stream or event dependency), or when the thread that
    launches it sat in a copy or sync call (a pageable `.to()` blocks the host until the data
    is over). A copy that merely coincides with idle time the host caused is not critical.
    """
    kernels = [g for g in gpu if g.kind == "kernel"]
    kstarts = [k.ts for k in kernels]
    blocking: dict[int, list] = defaultdict(list)
    for c in calls:
        if c.name in SYNC_CALLS or "emcpy" in c.name:
            blocking[c.tid].append((c.ts, c.end))
    blocked = {tid: merge(v) for tid, v in blocking.items()}
    out: Intervals = []
    for a, b in intersect(no_compute, h2d):
        i = bisect.bisect_left(kstarts, b - 1e-6)
        if i >= len(kernels):
            continue  # no compute after it in the window: nothing waits for this copy
        launch = by_corr.get(kernels[i].correlation)
        r = launch.ts if launch is not None else a
        if r < b:
            out.append((max(a, r), b))  # the kernel was queued behind the copy
        if r > a:
            out += intersect([(a, min(b, r))], blocked.get(launch.tid, []))
    return merge(out)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole > 0 else 0.0


def _blocking_sync(syncs, sync_ends, c, d, tol):
    """A sync call that had already started when the GPU ran dry at `c` and returned by `d`."""
    i = bisect.bisect_left(sync_ends, c - tol)
    while i < len(syncs) and syncs[i].end <= d + tol:
        s = syncs[i]
        if s.ts <= c + tol:
            return s
        i += 1
    return None


def _prime_sites(tr: Trace, calls: list[HostCall], host: HostAttribution, cache) -> None:
    """Attribute every sync and memcpy call to a source line (timeline_host), one sweep per thread."""
    wanted = [c for c in calls if c.name in SYNC_CALLS or "Memcpy" in c.name or "memcpy" in c.name]
    sites = host.locate([(c.tid, c.ts, c.ts) for c in wanted])
    for c, site in zip(wanted, sites):
        cache[(c.tid, c.ts)] = site if site is not None else Site(callee=f"{_innermost_op(tr, c)} in torch "
                                                                         "(no frame of your code in the trace)")


def _innermost_op(tr: Trace, c: HostCall) -> str:
    best = ""
    for s, e, name in tr.ops.get(c.tid, []):
        if s > c.ts:
            break
        if e >= c.end:
            best = name
    return best or c.name


def _site_of(c: HostCall, cache) -> Site:
    return cache.get((c.tid, c.ts)) or Site(callee=c.name)


def _late_sites(host: HostAttribution, late: list, loaders: list) -> tuple[list[dict], list[dict]]:
    """Host-bound idle by the user's line (or the named cause), and DataLoader waits by `for` line."""
    sites = host.locate([(tid if tid >= 0 else (host.main or 0), a, b) for tid, a, b, _ in late])
    rows: dict[str, dict] = {}
    lrows: dict[str, dict] = {}
    starts = [r.ts for r in loaders]
    for (tid, a, b, us), site in zip(late, sites):
        if us < 0:  # waiting in a DataLoader's __next__
            r = loaders[max(bisect.bisect_right(starts, a) - 1, 0)]
            key = site.key if site is not None else "DataLoader"
            row = lrows.setdefault(key, {
                "site": key, "code": site.code if site else "", "in_process": r.in_process, "ours": r.ours,
                "idle_ms": 0.0,
                "loader": host.resolver.loader_name(site.file, site.line) if site and site.line else ""})
            row["idle_ms"] += -us / 1e3
            continue
        if site is None:
            site = Site(callee=HOST_OVERHEAD)
        row = rows.setdefault(site.key, {"site": site.key if site.line else "", "cause": site.key,
                                         "code": site.code, "callee": site.callee, "func": site.func,
                                         "detail": site.detail, "idle_ms": 0.0})
        row["detail"] = row["detail"] or site.detail
        row["idle_ms"] += us / 1e3
    out = []
    for table in (rows, lrows):
        for row in table.values():
            row["idle_ms"] = round(row["idle_ms"], 4)
        out.append(sorted(table.values(), key=lambda r: -r["idle_ms"]))
    return out[0], out[1]


def _sync_table(calls: list[HostCall], cache, pageable_calls: set[int] = frozenset()) -> list[dict]:
    """Host time blocked per source line: sync calls, and copy calls that block on pageable memory."""
    rows: dict[tuple[str, str], dict] = {}
    for c in calls:
        kind = SYNC_CALLS.get(c.name)
        if kind is None and c.correlation in pageable_calls:
            kind = "pageable copy"
        if kind is None:
            continue
        site = _site_of(c, cache)
        row = rows.setdefault((site.key, kind), {
            "site": site.key, "code": site.code, "callee": site.callee, "kind": kind, "call": c.name,
            "count": 0, "total_ms": 0.0, "idle_ms": 0.0})
        row["count"] += 1
        row["total_ms"] += c.dur / 1e3
    out = sorted(rows.values(), key=lambda r: -r["total_ms"])
    for r in out:
        r["total_ms"] = round(r["total_ms"], 4)
    return out


def _copy_tables(gpu: list[GpuEvent], by_corr, cache, critical: Intervals) -> tuple[dict, list, list]:
    """Copies by direction; pageable copies by source line; H2D copies by source line.

    `critical_ms` of a site: its copy time on the critical path (see `_critical_h2d`).
    """
    nc_starts = [s for s, _ in critical]
    table: dict[str, dict] = {}
    sites: dict[tuple[str, str, bool], dict] = {}
    for g in gpu:
        if g.kind != "memcpy":
            continue
        row = table.setdefault(g.direction, {"count": 0, "bytes": 0, "ms": 0.0, "gbps": 0.0, "pageable": 0})
        row["count"] += 1
        row["bytes"] += g.nbytes
        row["ms"] += g.dur / 1e3
        row["pageable"] += int(g.pageable)
        launch = by_corr.get(g.correlation)
        site = _site_of(launch, cache) if launch else Site(callee=g.name)
        p = sites.setdefault((site.key, g.direction, g.pageable), {
            "site": site.key, "code": site.code, "name": g.name, "direction": g.direction,
            "pageable": g.pageable, "count": 0, "bytes": 0, "ms": 0.0, "gbps": 0.0, "critical_ms": 0.0})
        p["critical_ms"] += _covered(critical, nc_starts, g.ts, g.end) / 1e3 if g.direction == "H2D" else 0.0
        p["count"] += 1
        p["bytes"] += g.nbytes
        p["ms"] += g.dur / 1e3
    for row in list(table.values()) + list(sites.values()):
        row["gbps"] = round(row["bytes"] / (row["ms"] * 1e6), 3) if row["ms"] > 0 else 0.0
        row["ms"] = round(row["ms"], 4)
        if "critical_ms" in row:
            row["critical_ms"] = round(row["critical_ms"], 4)
    ordered = sorted(sites.values(), key=lambda p: -p["ms"])
    return table, [p for p in ordered if p["pageable"]], [p for p in ordered if p["direction"] == "H2D"]


def _covered(merged: Intervals, starts: list[float], s: float, e: float) -> float:
    """Length of [s, e] covered by a merged interval list (`starts` its start times)."""
    i = max(bisect.bisect_right(starts, s) - 1, 0)
    out = 0.0
    while i < len(merged) and merged[i][0] < e:
        out += max(0.0, min(e, merged[i][1]) - max(s, merged[i][0]))
        i += 1
    return out


def _queue_lead(gpu: list[GpuEvent], by_corr) -> dict:
    """How long GPU work waited between its launch call and its start: how far the host runs ahead."""
    leads = [(g.ts - by_corr[g.correlation].ts) / 1e3 for g in gpu if g.correlation in by_corr]
    if not leads:
        return {}
    return {"median": round(statistics.median(leads), 4), "max": round(max(leads), 4),
            "min": round(min(leads), 4)}


def _top_kernels(gpu: list[GpuEvent], top: int) -> list[dict]:
    agg: dict[str, list[float]] = defaultdict(list)
    for g in gpu:
        if g.kind == "kernel":
            agg[g.name].append(g.dur)
    all_us = sum(sum(v) for v in agg.values()) or 1.0
    rows = [{"name": _short(n), "count": len(v), "total_ms": round(sum(v) / 1e3, 4),
             "mean_us": round(sum(v) / len(v), 3), "pct": round(100 * sum(v) / all_us, 2)}
            for n, v in agg.items()]
    return sorted(rows, key=lambda r: -r["total_ms"])[:top]


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _launch_bound(gpu: list[GpuEvent], calls: list[HostCall]) -> dict:
    """Launch-bound when the median kernel runs for less time than the median launch call takes."""
    kernels = [g.dur for g in gpu if g.kind == "kernel"]
    launches = [c.dur for c in calls if LAUNCH_RE.search(c.name)]
    if not kernels or not launches:
        return {"launch_bound": False, "kernels": len(kernels), "launches": len(launches)}
    mk, ml = statistics.median(kernels), statistics.median(launches)
    return {"launch_bound": mk < ml, "median_kernel_us": round(mk, 3), "median_launch_us": round(ml, 3),
            "kernels": len(kernels), "launches": len(launches)}


def _streams(gpu: list[GpuEvent], w0: float, span: float, max_intervals: int = 200) -> dict:
    """Per CUDA stream: busy time and its merged busy intervals (ms from the window start, the first 200)."""
    out: dict[str, dict] = {}
    for stream in sorted({g.stream for g in gpu}):
        mine = [g for g in gpu if g.stream == stream]
        busy = merge((g.ts, g.end) for g in mine)
        out[str(stream)] = {"busy_ms": round(total(busy) / 1e3, 4), "busy_pct": _pct(total(busy), span),
                            "kernels": sum(g.kind == "kernel" for g in mine),
                            "copies": sum(g.kind == "memcpy" for g in mine),
                            "memsets": sum(g.kind == "memset" for g in mine),
                            "busy_intervals_ms": [[round((s - w0) / 1e3, 4), round((e - w0) / 1e3, 4)]
                                                  for s, e in busy[:max_intervals]]}
    return out


def _host_threads(tr: Trace, h0: float, h1: float) -> dict:
    out = {}
    for tid, ol in tr.ops.items():
        busy = total(merge((s, e) for s, e, _ in ol if e >= h0 and s <= h1))
        out[str(tid)] = {"name": tr.thread_names.get(tid, ""), "busy_ms": round(busy / 1e3, 4),
                         "ops": len(ol)}
    return out
