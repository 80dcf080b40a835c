"""Lines from steps of their own: the figure steps record no Python stacks, `line_steps` more steps do.

Why: with Python stacks (torch.profiler's `with_stack`) the profiler traces every Python call and return.
That is what names the user's line, and it is the dearest setting by far: on an H200 a nanoGPT-like
step cost 1.30x a plain one eager and 1.96x compiled with stacks, 1.19x and 1.17x without (BENCHMARKS.md,
doctor). Time the profiler adds on the host shows up as GPU idle (host-bound), so the figures would
describe the profiler as much as the loop.

So a run records two windows, one after the other (session.py):

1. figure steps (no stacks): step times, GPU idle and its causes, copies, kernels: every figure;
2. line steps (stacks on): the same loop again, read only for *which line*: the sites of syncs, copies,
   late launches and loader waits, and the user's line above each compiled call.

`carry(fig, lines_fig, tr, lines_tr)` moves (2)'s line tables onto (1)'s figures. Their times are scaled to
the figure steps, cause by cause: a site's share of its cause is taken from the line steps, the cause's
total from the figure steps (host_bound sites share the figure steps' host-bound ms, sync sites their
sync-blocked ms, copy sites the waiting-for-data ms; counts and bytes go by the number of steps). So the
ranking of lines is the line steps', the sizes the figure steps'. timeline.png, drawn from the figure
steps, labels each sync and copy call with the line of the call in the same place of a line step (the
k-th sync of a step is the k-th of every step, in a loop that does the same each step; where the order
of calls differs a call keeps its runtime name).
"""
from __future__ import annotations

import statistics

from gobrrr.doctor.trace import SYNC_CALLS

# A table of sites: its name on Figures, the cause its idle times belong to, and which keys scale how.
_TABLES = (
    # (field, idle key, cause, per-step keys)
    ("host_bound_sites", "idle_ms", "host_bound", ()),
    ("loader_sites", "idle_ms", "data_loader", ()),
    ("syncs", "idle_ms", "sync_blocked", ("count",)),
    ("h2d_sites", "critical_ms", "waiting_for_data", ("count", "bytes", "ms")),
    ("pageable", None, None, ("count", "bytes", "ms")),
)


def carry(fig, lines_fig, tr, lines_tr) -> dict:
    """Put the line tables of `lines_fig` (steps with stacks) onto `fig` (steps without), scaled as the module
    docstring says; return what the report says about the line steps."""
    n_fig, n_lines = max(len(fig.steps_ms), 1), max(len(lines_fig.steps_ms), 1)
    per_step = n_fig / n_lines
    causes, line_causes = fig.idle_breakdown_ms or {}, lines_fig.idle_breakdown_ms or {}
    for name, idle_key, cause, counted in _TABLES:
        rows = [dict(r) for r in getattr(lines_fig, name) or []]
        ratio = _ratio(causes.get(cause, 0.0), line_causes.get(cause, 0.0), per_step) if cause else per_step
        for r in rows:
            for k in counted:
                if k in r:
                    r[k] = _scaled(r[k], per_step)
            if idle_key and idle_key in r:
                r[idle_key] = round(r[idle_key] * ratio, 4)
        if name == "syncs":  # host time blocked in syncs: the figure steps' total, shared as in the line steps
            ratio = _ratio(sum(r["total_ms"] for r in fig.syncs), sum(r["total_ms"] for r in rows), per_step)
            for r in rows:
                r["total_ms"] = round(r["total_ms"] * ratio, 4)
        setattr(fig, name, rows)
    step_ratio = _ratio(statistics.fmean(fig.steps_ms) if fig.steps_ms else 0.0,
                        statistics.fmean(lines_fig.steps_ms) if lines_fig.steps_ms else 0.0, 1.0)
    if lines_fig.compiled:  # the user's line above each compiled call needs the stacks too
        comp = dict(lines_fig.compiled)
        comp["calls"] = [{**r, "ms_per_step": round(r["ms_per_step"] * step_ratio, 4)} for r in comp.get("calls", [])]
        fig.compiled = comp
    fig.call_sites = call_sites(tr, lines_tr, getattr(lines_fig, "call_sites", {}))
    return {"steps": len(lines_fig.steps_ms), "steps_ms": list(lines_fig.steps_ms),
            "mean_ms": round(statistics.fmean(lines_fig.steps_ms), 4) if lines_fig.steps_ms else None,
            "labelled_calls": len(fig.call_sites)}


def call_sites(tr, lines_tr, lines_sites: dict) -> dict:
    """(tid, ts) of each sync and copy call of the figure steps -> the Site of the call in the same place of a
    line step (the k-th such call of figure step j <-> the k-th of line step j mod their number), as long as
    the calls' names agree; the rest of a step whose order differs stays unlabelled."""
    fig_steps, line_steps = _calls_by_step(tr), _calls_by_step(lines_tr)
    if not line_steps:
        return {}
    out = {}
    for j, calls in enumerate(fig_steps):
        ref = line_steps[j % len(line_steps)]
        for c, r in zip(calls, ref):
            if c.name != r.name:
                break
            site = lines_sites.get((r.tid, r.ts))
            if site is not None:
                out[(c.tid, c.ts)] = site
    return out


def _calls_by_step(tr) -> list[list]:
    """Per recorded step, its sync and copy runtime calls in start order."""
    wanted = [c for c in tr.calls if c.name in SYNC_CALLS or "emcpy" in c.name]
    return [[c for c in wanted if s <= c.ts <= e] for _, s, e in tr.steps]


def _ratio(fig_total: float, lines_total: float, fallback: float) -> float:
    return fig_total / lines_total if lines_total > 0 else fallback


def _scaled(v, f: float):
    return round(v * f) if isinstance(v, int) else round(v * f, 4)
