"""One rank's collectives, read from its trace: when it arrived at each, what it did before, and how much
of its communication ran with nothing else to do.

What the profiler records of a collective (torch 2.11-2.13):

- the call, on the thread that issued it: a CPU op `c10d::allreduce_`, `c10d::_reduce_scatter_base_`,
  `c10d::broadcast_`... (`_c10d_functional::all_reduce` for functional collectives);
- its execution: with gloo a `gloo:all_reduce` range on one of gloo's worker threads, from when the worker
  took it to when the data was exchanged; with NCCL a kernel on the communication stream
  (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`), launched from inside the call.

A rank *arrives* at a collective when it is ready to communicate: when its host issues the call (gloo),
or when its GPU reaches the kernel (NCCL: the kernel's start; stream order holds it until earlier work
is done). Nobody can finish before the last rank arrives; the time between is waiting (merge.py puts
the ranks side by side). Collectives are numbered by kind in issue order: the k-th all_reduce of every
rank is the same program point, as every rank runs the same program.

Per collective this file also keeps, for the straggler's cause, the time each line of the user's code
held the Python thread between the previous arrival and this one (`lines`: the time under each call a
user frame made, keyed by the calling line, at every depth), and the phase it was issued in (forward,
backward, optimizer, other). Per rank: communication time, and its exposed part: time some collective
ran while no compute did (GPU: no other kernel; CPU: no op on a compute thread), per step.
"""
from __future__ import annotations

import bisect
import re
import socket
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from gobrrr.doctor.host import HostAttribution
from gobrrr.doctor.sources import SourceResolver, callee_name
from gobrrr.doctor.trace import Trace, merge, subtract, total

_NCCL_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.I)
TOP_LINES = 30  # lines kept per collective interval


def canonical(name: str) -> str | None:
    """`c10d::_reduce_scatter_base_`, `gloo:reduce_scatter`, `ncclDevKernel_ReduceScatter_...` -> `reduce_scatter`."""
    m = _NCCL_RE.search(name)
    n = (m.group(1) if m else name.split("::")[-1].split(":")[-1]).lower().replace("_", "")
    if "wait" in n or "coalesc" in n and "start" in n:
        return None
    for key, kind in (("reducescatter", "reduce_scatter"), ("allgather", "all_gather"), ("allreduce", "all_reduce"),
                      ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"),
                      ("sendrecv", "send/recv"), ("send", "send/recv"), ("recv", "send/recv"),
                      ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter")):
        if key in n:
            return kind
    return None


def _is_issue(name: str) -> bool:
    return name.startswith(("c10d::", "_c10d_functional::", "c10d_functional::")) and canonical(name) is not None


def extract(tr: Trace, fig, *, roots: Iterable[str] = (), user_paths: Iterable[str] = (), draw_steps: int = 3) -> dict:
    """This rank's collectives and communication figures (see the module docstring), as plain data."""
    resolver = SourceResolver(roots, user_paths)
    host = HostAttribution(tr, resolver)
    h0, h1 = (tr.steps[0][1], tr.steps[-1][2]) if tr.steps else (float("-inf"), float("inf"))
    n_steps = max(len(tr.steps), 1)
    issues = sorted(((ts, end, name, tid) for tid, ol in tr.ops.items() for ts, end, name in ol
                     if h0 <= ts <= h1 and _is_issue(name)), key=lambda x: x[0])
    calls_by_tid: dict[int, list] = defaultdict(list)
    for c in tr.calls:
        calls_by_tid[c.tid].append(c)
    nccl = {g.correlation: g for g in tr.gpu if g.kind == "kernel" and _NCCL_RE.search(g.name)}
    gloo = sorted(((s, e, n, tid) for tid, al in tr.annotations.items() for s, e, n in al
                   if n.startswith("gloo:") and canonical(n)), key=lambda x: x[0])
    gloo_tids = {tid for *_, tid in gloo}
    execs = _pair_gloo(issues, gloo)
    comm_iv = merge([(g.ts, g.end) for g in nccl.values() if h0 <= g.ts <= h1 or not tr.steps] +
                    [(s, e) for s, e, _, _ in gloo if h0 <= s <= h1])
    if fig is not None and fig.has_gpu:
        compute_iv = merge((g.ts, g.end) for g in tr.gpu if g.kind == "kernel" and g.correlation not in nccl)
    else:
        compute_iv = merge((s, e) for tid, ol in tr.ops.items() if tid not in gloo_tids
                           for s, e, n in ol if not n.startswith(("c10d::", "_c10d_functional::")))
    phases = _Phases(tr, host.main)
    rows: list[dict] = []
    ordinal: dict[str, int] = defaultdict(int)
    for i, (ts, end, name, tid) in enumerate(issues):
        kind = canonical(name)
        k = {"kind": kind, "n": ordinal[kind], "op": name, "issue_us": ts, "tid": tid,
             "phase": phases.at(tid, ts), "step": _step_of(tr.steps, ts)}
        ordinal[kind] += 1
        kernels = [nccl[c.correlation] for c in _calls_in(calls_by_tid.get(tid, []), ts, end)
                   if c.correlation in nccl]
        if kernels:
            k["arrival_us"], k["end_us"], k["on"] = min(g.ts for g in kernels), max(g.end for g in kernels), "gpu"
        elif i in execs:
            s, e = execs[i]
            k["arrival_us"], k["end_us"], k["on"] = ts, max(e, end), "host"
        else:
            k["arrival_us"], k["end_us"], k["on"] = ts, end, "host"
        # the parts of [arrival, end] with no compute running: where waiting for it cost this rank time
        k["idle"] = [[a, b] for a, b in subtract([(k["arrival_us"], k["end_us"])], compute_iv)][:50]
        rows.append(k)
    spans = _line_times(tr, host, rows, h0)
    exposed = subtract(comm_iv, compute_iv)
    by_kind: dict[str, dict] = defaultdict(lambda: {"count": 0, "ms": 0.0})
    for r in rows:
        by_kind[r["kind"]]["count"] += 1
        by_kind[r["kind"]]["ms"] += (r["end_us"] - r["arrival_us"]) / 1e3
    return {
        "hostname": tr.meta.get("host_name") or socket.gethostname(),
        "steps": [[n, s, e] for n, s, e in tr.steps], "n_steps": len(tr.steps),
        "collectives": rows,
        "kinds": {k: {"per_step": round(v["count"] / n_steps, 3), "ms_per_step": round(v["ms"] / n_steps, 4)}
                  for k, v in by_kind.items()},
        "comm_ms_per_step": round(total(comm_iv) / 1e3 / n_steps, 4),
        "exposed_ms_per_step": round(total(exposed) / 1e3 / n_steps, 4),
        "backend": "nccl" if nccl else "gloo" if gloo else "",
        "lanes": _lanes(tr, host.main, nccl, gloo, fig, draw_steps, spans),
    }


def write(path: Path, comm: dict | None, report: dict) -> None:
    """This rank's collectives beside its report (rank 0 merges them)."""
    from gobrrr.doctor.files import write_json

    write_json(path, {"rank": report.get("rank"), "comm": comm})


def _pair_gloo(issues: list, gloo: list) -> dict[int, tuple[float, float]]:
    """issue index -> (start, end) of its gloo execution: each execution goes to the earliest issue of its
    kind, issued before it started, not yet paired (gloo runs a process group's work in order)."""
    pending: dict[str, list[int]] = defaultdict(list)
    out: dict[int, tuple[float, float]] = {}
    j = 0
    for s, e, name, _ in gloo:
        while j < len(issues) and issues[j][0] <= s + 1.0:
            pending[canonical(issues[j][2])].append(j)
            j += 1
        queue = pending.get(canonical(name))
        if queue:
            out[queue.pop(0)] = (s, e)
    return out


def _calls_in(calls: list, a: float, b: float) -> list:
    starts = [c.ts for c in calls]
    i = bisect.bisect_left(starts, a)
    out = []
    while i < len(calls) and calls[i].ts <= b:
        out.append(calls[i])
        i += 1
    return out


def _step_of(steps: list, ts: float) -> int:
    for i, (_, s, e) in enumerate(steps):
        if s <= ts <= e:
            return i
    return -1


class _Phases:
    """Forward / backward / optimizer / other at a moment of a thread, from the ranges the trace holds."""

    def __init__(self, tr: Trace, main: int | None):
        self.main = main
        self.ranges: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for tid, al in tr.annotations.items():
            for s, e, n in al:
                if n.startswith("Optimizer.step#"):
                    self.ranges[tid]["optimizer"].append((s, e))
        for tid, ol in tr.ops.items():
            for s, e, n in ol:
                if n.startswith("autograd::engine::evaluate_function"):
                    self.ranges[tid]["backward"].append((s, e))
        for tid, frames in tr.frames.items():
            for f in frames:
                name = callee_name(f.raw)
                if name in ("run_backward", "_engine_run_backward"):
                    self.ranges[tid]["backward"].append((f.ts, f.end))
                elif f.raw.startswith("nn.Module: ") or name == "_call_impl":
                    self.ranges[tid]["forward"].append((f.ts, f.end))
        self.merged = {tid: {k: merge(v) for k, v in d.items()} for tid, d in self.ranges.items()}

    def at(self, tid: int, ts: float) -> str:
        table = self.merged.get(tid, {})
        for phase in ("optimizer", "backward", "forward"):
            iv = table.get(phase, [])
            i = bisect.bisect_right(iv, (ts, float("inf"))) - 1
            if i >= 0 and iv[i][0] <= ts <= iv[i][1]:
                return phase
        if tid != self.main and not table.get("forward"):
            return "backward"  # the autograd engine's own thread (GPU backward)
        return "other"


def _line_times(tr: Trace, host: HostAttribution, rows: list[dict], h0: float) -> list[list]:
    """For each collective, the ms each user line held the Python thread since the previous arrival (or the
    window start): `row["lines"] = {site: ms}`, top TOP_LINES; and `row["since_us"]`. Returns the calls of
    those lines that took 1 ms or more, as [start, end, site] (the merged timeline marks the straggler's)."""
    th = host.main
    frames = tr.frames.get(th, []) if th is not None else []
    starts: list[float] = []
    prev = h0 if h0 != float("-inf") else (min((f.ts for f in frames), default=0.0))
    for r in rows:
        r["since_us"] = prev
        starts.append(prev)
        prev = max(prev, r["issue_us"])
    ends = [r["issue_us"] for r in rows]
    acc: list[dict[str, float]] = [defaultdict(float) for _ in rows]
    code: dict[str, str] = {}
    depth: dict[str, int] = {}
    spans: list[list] = []
    if frames and rows:
        user = [not host.resolver.is_library(f.file) for f in frames]
        nest = [0] * len(frames)  # user frames from the outermost down to this one
        for j, f in enumerate(frames):
            nest[j] = (nest[f.parent] if f.parent >= 0 else 0) + int(user[j])
        for g in frames:
            p = g.parent
            if p < 0 or not user[p] or g.end <= starts[0] or g.ts >= ends[-1]:
                continue
            i = max(bisect.bisect_right(starts, g.ts) - 1, 0)
            first = True
            while i < len(rows) and starts[i] < g.end:
                ov = min(g.end, ends[i]) - max(g.ts, starts[i])
                if ov > 0:
                    if first:
                        site = host._resolve(th, frames[p], g, g.ts, g.end)
                        key, first = site.key, False
                        code.setdefault(key, site.code)
                        depth[key] = max(depth.get(key, 0), nest[p])
                        if g.end - g.ts >= 1000.0:
                            spans.append([g.ts, g.end, key])
                    acc[i][key] += ov
                i += 1
    for r, a in zip(rows, acc):
        top = sorted(a.items(), key=lambda kv: -kv[1])[:TOP_LINES]
        r["lines"] = {k: round(v / 1e3, 4) for k, v in top}
        r["code"] = {k: code.get(k, "") for k, _ in top}
        r["depth"] = {k: depth.get(k, 0) for k, _ in top}
    return sorted(spans, key=lambda x: x[1] - x[0], reverse=True)[:500]


def _lanes(tr: Trace, main: int | None, nccl: dict, gloo: list, fig, draw_steps: int, spans: list) -> dict:
    """What the merged timeline draws for this rank (first `draw_steps` steps), as [start, end] us lists."""
    if tr.steps:
        t0, t1 = tr.steps[0][1], tr.steps[min(draw_steps, len(tr.steps)) - 1][2]
    else:
        t0, t1 = float("-inf"), float("inf")

    def clip(iv):
        return [[s, e] for s, e in merge(iv) if e >= t0 and s <= t1]

    host_ops = tr.ops.get(main, []) if main is not None else []
    out = {"t0": t0, "t1": t1, "host": clip((s, e) for s, e, _ in host_ops),
           "comm": clip([(g.ts, g.end) for g in nccl.values()] + [(s, e) for s, e, _, _ in gloo]),
           "compute": clip((g.ts, g.end) for g in tr.gpu if g.kind == "kernel" and g.correlation not in nccl)
           if fig is not None and fig.has_gpu else []}
    out["lines"] = [x for x in spans if x[1] >= t0 and x[0] <= t1]
    # the view ends with the last step drawn, or with the GPU work it launched
    ends = [e for _, e in out["comm"] + out["compute"]]
    out["t1"] = max([t1] + [e for e in ends if e > t1 and e - t1 < (t1 - t0)]) if tr.steps else t1
    return out
