"""The doctor's printed words: a summary of one report, and reports side by side.

Plain text (it lands in logs and CI output); every figure printed here is also in report.json.
"""
from __future__ import annotations

from pathlib import Path

CAUSE_WORDS = {
    "waiting_for_data": "waiting for data (H2D copy, nothing computing)",
    "data_loader": "waiting for data (host in the DataLoader's __next__)",
    "sync_blocked": "sync-blocked (host waited in a sync, then refilled)",
    "host_bound": "host-bound (next launch came late)",
    "launch_gaps": "launch gaps (< 20 us between kernels)",
    "communication": "communication alone (a collective, nothing computing)",
    "other_copies": "other copies alone (D2H, D2D, memset)",
    "other": "other (queued work not starting)",
}


def _mb(b: float) -> str:
    return f"{b / 1e6:.1f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB" if b >= 100 else f"{int(b)} B"


def summary(r: dict) -> str:
    """A few dozen lines: steps, idle and its causes, copies, syncs, kernels, what to fix, files."""
    out = []
    script = r.get("script") or "profile"
    code = r.get("exit_code")
    ranks = r.get("ranks") or {}
    state = f"exit code {code}" if code is not None else "still running: the exit code comes when it ends"
    if ranks:
        state = f"{ranks['world_size']} ranks, {state}"
    out.append(f"gobrrr doctor: {script} {' '.join(r.get('argv') or [])}   ({state})")
    st = r["steps"]
    if st["source"] == "time-window":
        out.append("  steps: none seen; the figures cover a time window of the run")
    else:
        med = f", median {st['median_ms']:.2f} ms/step" if st.get("median_ms") is not None else ""
        who = " on rank 0 (every rank recorded the same steps)" if ranks else ""
        lead = st.get("lead_in_ms") or []
        left = (f"; before them {len(lead)} recorded step(s) left out, the profiler starting up "
                f"({', '.join(f'{x:.1f}' for x in lead)} ms)") if lead else ""
        out.append(f"  steps: {st['recorded']} recorded after {st['warmup']} warmup "
                   f"({st['source']} steps){med}{who}{left}")
    ov = r.get("overhead") or {}
    marked = bool(ov.get("inflated"))
    out += _overhead_lines(ov)
    out += _line_steps_lines(r.get("lines"))
    for note in r.get("notes", []):
        out.append(f"  note: {note}")
    out += _compiled_lines(r.get("compiled"))
    out += _rank_lines(ranks)
    g = r.get("gpu")
    if g:
        busy = 100 - g["compute_idle_pct"]
        star = " (*: includes the profiler's own host time, see overhead)" if marked else ""
        out.append(f"  GPU computing {busy:.1f}% of the {g['span_ms']:.2f} ms window; "
                   f"idle (no kernel running) {g['compute_idle_pct']:.1f}%{star}:")
        pct = g["idle_breakdown_pct"]
        for cause in sorted(pct, key=lambda c: -pct[c]):
            if pct[cause] > 0:
                mark = " *" if marked and cause in ("host_bound", "launch_gaps") else ""
                out.append(f"    {pct[cause]:6.1f}%  {CAUSE_WORDS.get(cause, cause)}{mark}")
        corr = ov.get("corrected") if marked else None
        if corr:
            cp = corr["idle_breakdown_pct"]
            out.append(f"    without the profiler's {ov['added_ms']:.2f} ms/step (estimate, over a plain step): idle "
                       f"{corr['compute_idle_pct']:.1f}%, host-bound {cp.get('host_bound', 0):.1f}%, launch gaps "
                       f"{cp.get('launch_gaps', 0):.1f}%")
        out.append(f"  nothing at all running {g['idle_pct']:.1f}%")
        for row in (g.get("loader_sites") or [])[:2]:
            name = f" `{row['loader']}`" if row.get("loader") else ""
            out.append(f"  GPU idle while the host waited for the DataLoader{name}: {row['idle_ms']:.2f} ms at "
                       f"{row['site']}   {row['code'][:50]}")
        for row in (g.get("host_bound_sites") or [])[:3]:
            if row.get("site"):
                via = f" ({row['callee']})" if row.get("callee") else ""
                out.append(f"  GPU idle while the host ran {row['site']}{via}: {row['idle_ms']:.2f} ms   "
                           f"{row['code'][:50]}")
            else:  # no line of the user's held the gap: the cause, named
                out.append(f"  GPU idle for {row.get('cause', '')} (no line of yours in the trace): "
                           f"{row['idle_ms']:.2f} ms")
        if g["copy_overlap_pct"] is not None:
            hid = g.get("copy_hidden_pct")
            hid_text = f"{hid:.1f}% of H2D time off the critical path; " if hid is not None else ""
            out.append(f"  copy/compute overlap: {hid_text}{g['copy_overlap_pct']:.1f}% of copy time under a "
                       f"kernel ({g.get('overlap_pct') or 0:.1f}% of the shorter side)")
        for d, c in sorted(g["copies"].items()):
            pg = f", {c['pageable']} pageable" if c["pageable"] else ""
            out.append(f"  {d}: {c['count']} copies, {_mb(c['bytes'])}, {c['gbps']:.1f} GB/s{pg}")
        for p in g["pageable"][:3]:
            out.append(f"    pageable {p['direction']} at {p['site']}: {p['count']} x, {_mb(p['bytes'])}"
                       f"   {p['code'][:60]}")
        lead = g.get("queue_lead_ms") or {}
        if lead:
            out.append(f"  queue lead (launch -> start on GPU): median {lead['median']:.3f} ms, "
                       f"max {lead['max']:.3f} ms")
        lb = g.get("launch") or {}
        if lb.get("median_kernel_us") is not None:
            compiled = bool((r.get("compiled") or {}).get("compiled"))
            fix = "CUDA graphs (torch.compile(mode='reduce-overhead'))" if compiled else "CUDA graphs / torch.compile"
            flag = f"YES: use {fix}" if lb["launch_bound"] else "no"
            out.append(f"  launch-bound: {flag} (median kernel {lb['median_kernel_us']:.1f} us, "
                       f"launch {lb['median_launch_us']:.1f} us)")
        for k in g["top_kernels"][:3]:
            out.append(f"  kernel {k['pct']:5.1f}%  {k['count']:5d} x {k['mean_us']:8.1f} us  {k['name'][:60]}")
    syncs = (r.get("host") or {}).get("syncs") or []
    for s in syncs[:5]:
        out.append(f"  host blocked at {s['site']}: {s['count']} x {s['kind']}, {s['total_ms']:.2f} ms"
                   f"   {s['code'][:50]}")
    det = (r.get("host") or {}).get("sync_detective")
    if det is not None:  # None: an older report, or a run that never recorded
        total, stall = sum(d["count"] for d in det), sum(d["stall_ms"] for d in det)
        out.append(f"  sync detective, same window: {total} host-device syncs at {len(det)} lines, "
                   f"host blocked {stall:.2f} ms")
        for d in det[:5]:
            out.append(f"    {d['count']:4d} x {d['kind']:<18} {d['stall_ms']:8.3f} ms  {d['site']}   {d['code'][:50]}")
    if r.get("advice"):
        out.append("  what to fix (estimated GPU time saved per step):")
        for i, a in enumerate(r["advice"][:8], 1):
            saved = (f"{a['saved_ms']:7.3f} ms" if a["saved_ms"] is not None
                     else f"{'(' + a.get('source', 'lint') + ')':>10}")
            rules = f" [{', '.join(a['rules'])}]" if a.get("rules") else ""
            out.append(f"   {i}. {saved}  {a['site'] or '(the whole step)'}{rules}  {a['code'][:50]}")
            out.append(f"        -> {a['change']}")
    files = r.get("files") or {}
    out.append("  files: " + ", ".join(str(v) if not isinstance(v, list) else f"{len(v)} rank folders"
                                       for v in files.values() if v))
    return "\n".join(out)


def _overhead_lines(ov: dict) -> list[str]:
    """The doctor's own cost: recorded vs plain step time (overhead.py)."""
    if not ov or ov.get("recorded_ms") is None:
        return []
    sett = ov.get("settings") or {}
    on = ", ".join(k for k in ("stack", "detective", "shapes", "memory") if sett.get(k)) or "no Python stacks"
    if ov.get("plain_ms") is None:
        return [f"  overhead: no plain step timed after the recording (profiler settings: {on})"]
    se = ov.get("ratio_se") or 0.0
    pm = f" +-{se:.2f}" if se >= 0.005 else ""  # about one standard error (overhead.py)
    return [f"  overhead: recorded steps {ov['recorded_ms']:.2f} ms, plain steps {ov['plain_ms']:.2f} ms "
            f"({ov['plain_steps']} after the recording, no profiler): {ov['ratio']:.2f}x{pm} "
            f"({ov['added_ms']:+.2f} ms/step; profiler settings: {on})"]


def _line_steps_lines(li: dict | None) -> list[str]:
    """The steps recorded with Python stacks after the figure steps, for the lines (lines.py)."""
    if not li or not li.get("steps"):
        return []
    cost = f", {li['ratio']:.2f}x a plain step" if li.get("ratio") else ""
    return [f"  lines: named from {li['steps']} more steps recorded with Python stacks ({li['mean_ms']:.2f} ms/step"
            f"{cost}), their times scaled to the figure steps"]


def _compiled_lines(c: dict | None) -> list[str]:
    """What runs compiled (torch.compile) and where its graphs break."""
    if not c or not c.get("compiled"):
        return []
    out = []
    for row in c.get("calls", [])[:3]:
        where = f"{row['site']}  {row['code'][:50]}" if row.get("site") else "(no line of yours above it)"
        out.append(f"  compiled: {where}  runs compiled graphs ({row['calls_per_step']:g} entries/step)")
    breaks = c.get("graph_breaks", [])
    for b in breaks[:3]:
        out.append(f"  graph break: {b['site']}  {b['code'][:50]}  ({b['per_step']:g} x per step)")
    if not breaks:
        out.append("  no graph break seen in the recorded steps")
    return out


def _rank_lines(ranks: dict) -> list[str]:
    """Under torchrun: per rank step times and waits, the straggler, the layout and its exposed communication."""
    if not ranks:
        return []
    out = [f"  ranks: {len(ranks['reported'])} of {ranks['world_size']} reported"
           + (f" (missing: {', '.join(map(str, ranks['missing']))})" if ranks.get("missing") else "")]
    out.append("    rank  recorded ms  plain ms  ratio  comm ms/step  exposed ms/step  waited ms/step (share)  by collective")
    for row in ranks.get("per_rank", []):
        f = lambda x, w=8, d=2: ("-" if x is None else f"{x:.{d}f}").rjust(w)  # noqa: E731
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in (row.get("wait_ms_per_step") or {}).items() if v >= 0.05)
        share = f" ({row['wait_pct']:.0f}%)" if row.get("wait_pct") is not None else ""
        out.append(f"    {row['rank']:>4}  {f(row.get('recorded_ms'), 11)}  {f(row.get('plain_ms'))}  "
                   f"{f(row.get('ratio'), 5)}  {f(row.get('comm_ms_per_step'), 12)}  {f(row.get('exposed_ms_per_step'), 15)}"
                   f"  {f(row.get('wait_total_ms_per_step'), 14)}{share:<8}  {kinds}")
    st = ranks.get("straggler")
    if st:
        where = f"{st['site']}  {st['code'][:50]}" if st.get("site") else "no line of its own stood out"
        out.append(f"  straggler: rank {st['rank']}, last to arrive at {st['late_at']} collective(s) ({st['at']}), up to "
                   f"{st.get('max_late_ms', 0):.2f} ms late: {where}")
        waited = ", ".join(f"rank {r} {ms:.2f} ms/step" for r, ms in sorted(st["others_wait_ms_per_step"].items()))
        out.append(f"    the others waited for it: {waited}")
    else:
        out.append("  straggler: none (no rank arrived last by more than 1 ms at a collective)")
    lay = ranks.get("layout") or {}
    if lay:
        comm = "; ".join(f"{k} x{v['per_step']:g}" for k, v in (lay.get("communication") or {}).items())
        out.append(f"  layout: {lay.get('name')}: {comm or 'no collectives recorded'} (per step, rank 0)")
        for sched, promise in zip(lay.get("schedule", []), lay.get("promise", [])):
            out.append(f"    schedule: {sched}; promise: {promise}")
        if lay.get("expected_exposed_ms_per_step") is not None:
            wait = f", {lay['waiting_ms_per_step']:.2f} of it waiting for a later rank" if lay.get("waiting_ms_per_step") else ""
            beyond = lay.get("exposed_beyond_promise_ms_per_step") or 0.0
            out.append(f"    exposed communication (no compute beside it) {lay['exposed_ms_per_step']:.2f} ms/step of "
                       f"{lay['comm_ms_per_step']:.2f}{wait}; the schedule allows "
                       f"{lay['expected_exposed_ms_per_step']:.2f} for its transfers"
                       + (f": {beyond:.2f} ms/step more is exposed than it promises" if beyond > 0.05 else ": as promised"))
    return out


def _fix_name(a: dict) -> str:
    """A recommendation's line, or the cause it names when it has none ("host launch overhead")."""
    return a.get("site") or a.get("change", "").split(":")[0][:40] or "-"


def side_by_side(reports: dict[str, dict]) -> str:
    """Before/after figures of several reports, one column each."""
    def g(r, *keys, fmt="{:.1f}"):
        x = r.get("gpu")
        for k in keys:
            x = x.get(k) if isinstance(x, dict) else None
        return "-" if x is None else fmt.format(x) if not isinstance(x, str) else x

    def over(r, key, fmt):
        v = (r.get("overhead") or {}).get(key)
        return "-" if v is None else fmt.format(v)

    def recorded(r):  # the mean the overhead ratio below divides (the median where there is no plain figure)
        ms = (r.get("overhead") or {}).get("recorded_ms")
        ms = r["steps"]["median_ms"] if ms is None else ms
        return "-" if ms is None else f"{ms:.2f}"

    rows = [
        ("recorded step (ms)", recorded),
        ("plain step, no profiler (ms)", lambda r: over(r, "plain_ms", "{:.2f}")),
        ("profiler overhead (x)", lambda r: over(r, "ratio", "{:.2f}")),
        ("GPU idle, no kernel (%)", lambda r: g(r, "compute_idle_pct")),
        ("  waiting for data (%)", lambda r: g(r, "idle_breakdown_pct", "waiting_for_data")),
        ("  the DataLoader (%)", lambda r: g(r, "idle_breakdown_pct", "data_loader")),
        ("  sync-blocked (%)", lambda r: g(r, "idle_breakdown_pct", "sync_blocked")),
        ("  host-bound (%)", lambda r: g(r, "idle_breakdown_pct", "host_bound")),
        ("  launch gaps (%)", lambda r: g(r, "idle_breakdown_pct", "launch_gaps")),
        ("top cause", lambda r: g(r, "top_cause", fmt="{}")),
        ("H2D hidden from compute (%)", lambda r: g(r, "copy_hidden_pct")),
        ("copy time under a kernel (%)", lambda r: g(r, "copy_overlap_pct")),
        ("  overlap of the shorter (%)", lambda r: g(r, "overlap_pct")),
        ("H2D GB/s", lambda r: g(r, "copies", "H2D", "gbps")),
        ("pageable copies", lambda r: str(sum(p["count"] for p in (r.get("gpu") or {}).get("pageable", [])))
         if r.get("gpu") else "-"),
        ("blocking calls in window", lambda r: str(sum(s["count"] for s in (r.get("host") or {}).get("syncs", [])))),
        ("syncs (sync detective)", lambda r: "-" if (r.get("host") or {}).get("sync_detective") is None
         else str(sum(d["count"] for d in r["host"]["sync_detective"]))),
        ("top fix", lambda r: (_fix_name(r["advice"][0]) if r.get("advice") else "-")),
    ]
    labels = list(reports)
    w0 = max(len(n) for n, _ in rows) + 2
    cols = {lab: [fn(reports[lab]) for _, fn in rows] for lab in labels}
    widths = {lab: max(len(lab), *(len(v) for v in cols[lab])) + 2 for lab in labels}
    lines = ["".ljust(w0) + "".join(lab.rjust(widths[lab]) for lab in labels)]
    for i, (name, _) in enumerate(rows):
        lines.append(name.ljust(w0) + "".join(cols[lab][i].rjust(widths[lab]) for lab in labels))
    for lab in labels:
        files = reports[lab]["files"]
        names = "report.json, timeline.png, trace.json" + (", trace-lines.json" if files.get("trace_lines") else "")
        lines.append(f"{lab}: {Path(files['report']).parent}/ ({names})")
    return "\n".join(lines)
