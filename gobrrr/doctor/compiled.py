"""Compiled code in a trace: which of the user's lines call torch.compile'd functions, and where graphs break.

torch.compile (Ansel et al. 2024, "PyTorch 2") runs a function's frame through dynamo: its bytecode is
replaced by calls into compiled graphs, whose kernels inductor wrote into generated files
(`/tmp/torchinductor_<user>/xx/cxxxx.py`). In a trace with Python stacks this shows as:

- a frame of `torch/_dynamo/eval_frame.py` (`_fn`, `compile_wrapper`) around the compiled call, below the
  user's line that called it (`logits, loss = model(X, Y)`), with the user's own `forward` below it;
- frames of the generated files (`call`, `triton_poi_fused_...run`) and AOTAutograd's runtime wrappers,
  on the Python thread for forward and on the autograd thread for a compiled backward;
- after a graph break, dynamo's resume function: a frame named `torch_dynamo_resume_in_<func>_at_<line>`
  in the user's file; `<line>` is the line where the graph broke (the break's line).

From these: `summary()` lists the lines that call compiled code (with calls per step) and the graph
breaks (line, source, count per step), plus dynamo's own reasons when this process compiled
(`torch._dynamo.utils.counters["graph_break"]`). The advice uses it never to suggest torch.compile for
what already runs compiled, and to point at the breaks instead.
"""
from __future__ import annotations

import bisect
import re
import sys

from gobrrr.doctor.host import HostAttribution
from gobrrr.doctor.sources import Frame, is_dynamo_frame, is_graph_frame
from gobrrr.doctor.trace import Trace

RESUME_RE = re.compile(r"^torch_dynamo_resume_in_(?P<func>.+)_at_(?P<line>\d+)$")


def _outermost_compiled(frames: list[Frame]) -> list[Frame]:
    """Entries into compiled code from eager code: a frame of dynamo's frame evaluation with no such frame
    above it, and a compiled graph running below it (not a `_disable_dynamo` wrapper)."""
    graph_starts = [f.ts for f in frames if is_graph_frame(f)]
    out = []
    for f in frames:
        if not is_dynamo_frame(f):
            continue
        p, outer = f.parent, True
        while p >= 0:
            if is_dynamo_frame(frames[p]):
                outer = False
                break
            p = frames[p].parent
        i = bisect.bisect_left(graph_starts, f.ts)
        if outer and i < len(graph_starts) and graph_starts[i] <= f.end:
            out.append(f)
    return out


def summary(tr: Trace, host: HostAttribution, h0: float, h1: float, n_steps: int) -> dict:
    """Compiled calls by the user's line and graph breaks by line, inside the host window [h0, h1]."""
    n = max(n_steps, 1)
    calls: dict[str, dict] = {}
    breaks: dict[str, dict] = {}
    for tid, frames in tr.frames.items():
        entries = [f for f in _outermost_compiled(frames) if h0 <= f.ts <= h1]
        sites = host.locate([(tid, f.ts + 0.001, f.ts + 0.001) for f in entries]) if entries else []
        for f, site in zip(entries, sites):
            key = site.key if site is not None else "compiled code (no line of yours above it)"
            row = calls.setdefault(key, {"site": key if site is not None and site.line else "",
                                         "code": site.code if site else "", "calls": 0, "ms": 0.0})
            row["calls"] += 1
            row["ms"] += (f.end - f.ts) / 1e3
        for f in frames:
            m = RESUME_RE.match(f.func)
            if m is None or not (h0 <= f.ts <= h1):
                continue
            line = int(m.group("line"))
            key = f"{f.file}:{line}"
            row = breaks.setdefault(key, {"site": key, "code": host.resolver.code(f.file, line),
                                          "func": m.group("func"), "count": 0})
            row["count"] += 1
    for row in calls.values():
        row["calls_per_step"] = round(row.pop("calls") / n, 3)
        row["ms_per_step"] = round(row.pop("ms") / n, 4)
    for row in breaks.values():
        row["per_step"] = round(row.pop("count") / n, 3)
    return {"compiled": bool(calls), "calls": sorted(calls.values(), key=lambda r: -r["ms_per_step"]),
            "graph_breaks": sorted(breaks.values(), key=lambda r: r["site"]), "reasons": dynamo_reasons()}


def dynamo_reasons(limit: int = 5) -> list[str]:
    """The first line of each graph-break reason dynamo counted in this process (empty when it never ran)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None) if utils is not None else None
    if not counters:
        return []
    out = []
    for reason, count in dict(counters.get("graph_break", {})).items():
        first = next((ln.strip() for ln in str(reason).splitlines() if ln.strip()), "")
        out.append(f"{first} (x{count})")
    return out[:limit]
