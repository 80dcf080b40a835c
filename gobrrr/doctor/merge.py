"""Ranks side by side: who waited for whom in each collective, the straggler and its line, and the
communication the layout's schedule leaves exposed. Plain functions over each rank's collectives.py data.

1. Clocks. Ranks on one host share a clock. Ranks on several hosts do not: each rank's offset to rank 0
   is the median difference of the ends of their matched collectives (a collective ends at about the same
   moment on every member), applied before anything is compared.
2. Matching. The k-th collective of a kind on every rank is one program point (every rank runs the same
   program); it is compared across all ranks that recorded it. (A collective of a subgroup, e.g. tensor
   parallel within a dp x tp mesh, is compared across the world: its wait then includes other groups'.)
3. Per collective: the last arrival; each rank's wait = last arrival - its own arrival (not past its end),
   counted where nothing else of the rank's ran beside it (`waits`); the last to arrive is charged with
   the others' wait. The straggler: the rank the others waited for most, over `LATE_MS` per step.
4. The straggler's cause: over the collectives where a rank arrived last by more than `LATE_MS`, the
   user's line that held its Python thread longer than on the others (time per line since the previous
   arrival, minus the median of the other ranks, summed). The deepest line within 10% of the largest
   excess wins: `time.sleep(...)` inside `maybe_eval()` rather than the loop's call of `maybe_eval()`.
5. The layout, recognised from which collectives run in which phase (ddp, zero-1/2, zero-3, tensor
   parallel), and what its schedule promises for exposed communication (`layout()`), against the
   exposed communication measured on each rank (collectives.py).
"""
from __future__ import annotations

import statistics
from collections import defaultdict

from gobrrr.doctor.trace import intersect, merge, total

LATE_MS = 1.0  # a rank the others waited for this long per step (or more) is the straggler


def clock_offsets(comms: dict[int, dict]) -> dict[int, float]:
    """rank -> microseconds to subtract from its times to put them on rank 0's clock (0 on one host)."""
    hosts = {c.get("hostname") for c in comms.values()}
    if len(hosts) <= 1:
        return dict.fromkeys(comms, 0.0)
    ref = min(comms)
    ends = _by_point(comms)
    out = {}
    for r in comms:
        diffs = [pts[r]["end_us"] - pts[ref]["end_us"] for pts in ends.values() if r in pts and ref in pts]
        out[r] = statistics.median(diffs) if diffs else 0.0
    return out


def _by_point(comms: dict[int, dict]) -> dict[tuple[str, int], dict[int, dict]]:
    """(kind, k) -> {rank: that rank's collective}."""
    out: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)
    for r, c in comms.items():
        for row in c.get("collectives", []):
            out[(row["kind"], row["n"])][r] = row
    return out


def waits(comms: dict[int, dict]) -> dict:
    """Per-rank waiting by kind (ms per step), the straggler and its line (see the module docstring).

    A rank *waits* at a collective from its arrival until the last rank arrives (not past the collective's
    end). Only the part of that with no compute of its own beside it costs the rank time (an async bucket
    all-reduce waits while backward goes on): `blocked` is the union, over collectives, of the wait
    intersected with the collective's idle parts (collectives.py), so overlapping waits count once.
    The straggler is the rank the others spent most blocked time waiting for.
    """
    offsets = clock_offsets(comms)
    points = _by_point(comms)
    n_steps = {r: max(c.get("n_steps", 1), 1) for r, c in comms.items()}
    blocked: dict[int, dict[str, list]] = {r: defaultdict(list) for r in comms}
    point_wait: dict[int, dict[tuple[str, int], float]] = {r: {} for r in comms}
    caused = {r: 0.0 for r in comms}
    late_points: dict[int, list[tuple[str, int, float]]] = defaultdict(list)
    for (kind, k), pts in points.items():
        if len(pts) < 2:
            continue
        arr = {r: p["arrival_us"] - offsets[r] for r, p in pts.items()}
        last_r = max(arr, key=arr.get)
        last = arr[last_r]
        cost = 0.0
        for r, p in pts.items():
            end = min(last, p["end_us"] - offsets[r])
            if end <= arr[r]:
                point_wait[r][(kind, k)] = 0.0
                continue
            idle = [(a - offsets[r], b - offsets[r]) for a, b in p.get("idle", [[p["arrival_us"], p["end_us"]]])]
            part = intersect([(arr[r], end)], merge(idle))
            blocked[r][kind] += part
            point_wait[r][(kind, k)] = total(part) / 1e3
            if r != last_r:
                cost += total(part) / 1e3
        others = len(pts) - 1
        lateness = (last - statistics.median(a for r, a in arr.items() if r != last_r)) / 1e3
        if cost / others > LATE_MS / 10 and lateness > LATE_MS:
            caused[last_r] += cost / others
            late_points[last_r].append((kind, k, lateness))
    per_rank = {}
    for r in comms:
        w = {kind: round(total(merge(iv)) / 1e3 / n_steps[r], 4) for kind, iv in blocked[r].items()}
        every = merge(x for iv in blocked[r].values() for x in iv)
        per_rank[r] = {"wait_ms_per_step": w, "wait_total_ms_per_step": round(total(every) / 1e3 / n_steps[r], 4),
                       "caused_ms_per_step": round(caused[r] / n_steps[r], 4), "late_at": len(late_points[r])}
    straggler = _straggler(comms, points, caused, late_points, n_steps, per_rank)
    return {"per_rank": per_rank, "straggler": straggler, "clock_offsets_us": offsets, "point_wait": point_wait}


def _straggler(comms, points, caused, late_points, n_steps, per_rank) -> dict | None:
    """The rank the others waited for most, when that is more than LATE_MS per step, and its line."""
    if not caused:
        return None
    r = max(caused, key=caused.get)
    if caused[r] / n_steps[r] <= LATE_MS:
        return None
    excess: dict[str, float] = defaultdict(float)
    code: dict[str, str] = {}
    kinds: dict[str, int] = defaultdict(int)
    for kind, k, _ in late_points[r]:
        pts = points[(kind, k)]
        kinds[kind] += 1
        mine = pts[r].get("lines", {})
        code.update(pts[r].get("code", {}))
        for key, ms in mine.items():
            others = [pts[o].get("lines", {}).get(key, 0.0) for o in pts if o != r]
            excess[key] += ms - (statistics.median(others) if others else 0.0)
    n = n_steps[r]
    site = None
    if excess:
        best = max(excess.values())
        if best > 0:
            close = [key for key, v in excess.items() if v >= 0.9 * best]
            site = max(close, key=lambda key: (_depth(key, comms[r]), excess[key]))
    others_wait = {o: per_rank[o]["wait_total_ms_per_step"] for o in per_rank if o != r}
    late = [x for _, _, x in late_points[r]]
    return {"rank": r, "late_ms_per_step": round(caused[r] / n, 4), "late_at": len(late_points[r]),
            "max_late_ms": round(max(late), 4) if late else 0.0,
            "at": max(kinds, key=kinds.get) if kinds else "", "kinds": dict(kinds),
            "site": site or "", "code": code.get(site, "") if site else "",
            "excess_ms_per_step": round(excess[site] / n, 4) if site else None,
            "others_wait_ms_per_step": others_wait}


def _depth(key: str, comm: dict) -> int:
    """How many frames of the user's sit above the function holding this line (collectives.py)."""
    return max((row.get("depth", {}).get(key, 0) for row in comm.get("collectives", [])), default=0)


# ---------------------------------------------------------------------------------------------------
# The layout and its promise

PROMISES = {
    "ddp": ("gradient buckets all-reduced during backward (Li et al. 2020)",
            "every bucket but the last hides under backward: exposed <= the last bucket's all-reduce"),
    "zero-1/2": ("gradients reduce-scattered during backward, updated shards all-gathered after the step "
                 "(Rajbhandari et al. 2020)",
                 "reduce-scatters hide under backward except the last; the all-gathers after the step are exposed"),
    "zero-3": ("parameters all-gathered ahead of each block in forward and backward, gradients "
               "reduce-scattered in backward (Rajbhandari et al. 2020)",
               "each block's gather is prefetched during the previous block: only the first gather and the last "
               "reduce-scatter are exposed"),
    "tensor parallel": ("activations all-reduced (or all-gathered / reduce-scattered with sequence parallelism) "
                        "inside every block, forward and backward (Shoeybi et al. 2019)",
                        "none hidden: each block waits for its collectives (the layer's output needs them)"),
}


def layout(comm: dict, point_wait: dict[tuple[str, int], float] | None = None) -> dict:
    """Which schedule this rank's collectives follow, what it promises, and how the measurement compares.

    Recognised from (kind, phase) counts: all_reduce or reduce_scatter in forward -> tensor parallel (its
    vocab-parallel loss may all-gather too); otherwise all_gather in forward with reduce_scatter in backward
    -> zero-3; reduce_scatter in backward -> zero-1/2; all_reduce in backward alone -> ddp. Expected exposed ms per step:
    ddp, the last bucket's all-reduce; zero-1/2, the last reduce-scatter plus the all-gathers after the
    step; zero-3, the first gather plus the last reduce-scatter; tensor parallel, all of its collectives.
    Each counts its transfer only: `point_wait` ((kind, k) -> ms this rank waited for a later rank, from
    waits()) is no part of any schedule's promise, and is reported beside it.
    """
    point_wait = point_wait or {}
    rows = comm.get("collectives", [])
    n = max(comm.get("n_steps", 1), 1)
    seen = defaultdict(int)
    for r in rows:
        seen[(r["kind"], r["phase"])] += 1
    names = []
    tp = bool(seen[("all_reduce", "forward")] or seen[("reduce_scatter", "forward")])
    if seen[("all_gather", "forward")] and seen[("reduce_scatter", "backward")] and not tp:
        names.append("zero-3")
    elif seen[("reduce_scatter", "backward")]:
        names.append("zero-1/2")
    if tp:
        names.append("tensor parallel")
    if seen[("all_reduce", "backward")] and not names:
        names.append("ddp")
    comm_table = defaultdict(lambda: {"count": 0, "ms": 0.0})
    for r in rows:
        key = f"{r['kind']} in {r['phase']}"
        comm_table[key]["count"] += 1
        comm_table[key]["ms"] += (r["end_us"] - r["arrival_us"]) / 1e3
    communication = {k: {"per_step": round(v["count"] / n, 3), "ms_per_step": round(v["ms"] / n, 4)}
                     for k, v in sorted(comm_table.items(), key=lambda kv: -kv[1]["count"])}
    expected = _expected_exposed(rows, names, n, point_wait) if names else None
    waited = round(sum(point_wait.values()) / n, 4)
    out = {"name": " + ".join(names) or ("collectives outside a known schedule" if rows else "no collectives"),
           "communication": communication,
           "schedule": [PROMISES[x][0] for x in names], "promise": [PROMISES[x][1] for x in names],
           "expected_exposed_ms_per_step": expected,
           "exposed_ms_per_step": comm.get("exposed_ms_per_step"), "comm_ms_per_step": comm.get("comm_ms_per_step"),
           "waiting_ms_per_step": waited}
    if expected is not None and comm.get("exposed_ms_per_step") is not None:
        extra = comm["exposed_ms_per_step"] - waited - expected
        out["exposed_beyond_promise_ms_per_step"] = round(max(extra, 0.0), 4)
    return out


def _expected_exposed(rows: list[dict], names: list[str], n: int, point_wait: dict) -> float:
    by_step: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_step[r["step"]].append(r)
    total = 0.0
    for step_rows in by_step.values():
        step_rows.sort(key=lambda r: r["issue_us"])
        dur = lambda r: max((r["end_us"] - r["arrival_us"]) / 1e3 - point_wait.get((r["kind"], r["n"]), 0.0), 0.0)  # noqa: E731
        if "tensor parallel" in names:
            total += sum(dur(r) for r in step_rows if r["phase"] in ("forward", "backward")
                         and r["kind"] in ("all_reduce", "reduce_scatter", "all_gather") and "zero-3" not in names)
        if "ddp" in names:
            last = [r for r in step_rows if r["kind"] == "all_reduce" and r["phase"] == "backward"]
            total += dur(last[-1]) if last else 0.0
        if "zero-1/2" in names:
            rs = [r for r in step_rows if r["kind"] == "reduce_scatter" and r["phase"] == "backward"]
            total += (dur(rs[-1]) if rs else 0.0) + sum(dur(r) for r in step_rows if r["kind"] == "all_gather"
                                                         and r["phase"] in ("optimizer", "other"))
        if "zero-3" in names:
            ag = [r for r in step_rows if r["kind"] == "all_gather"]
            rs = [r for r in step_rows if r["kind"] == "reduce_scatter"]
            total += (dur(ag[0]) if ag else 0.0) + (dur(rs[-1]) if rs else 0.0)
    return round(total / n, 4)
