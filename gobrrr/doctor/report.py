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
    "other_copies": "other copies alone (D2H, D2D, memset)",
    "other": "other (queued work not starting)",
}


def _mb(b: float) -> str:
    return f"{b / 1e6:.1f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB" if b >= 100 else f"{int(b)} B"


def summary(r: dict) -> str:
    """A few dozen lines: steps, idle and its causes, copies, syncs, kernels, what to fix, files."""
    out = []
    script = r.get("script") or "profile"
    out.append(f"gobrrr doctor: {script} {' '.join(r.get('argv') or [])}   (exit code {r.get('exit_code')})")
    st = r["steps"]
    if st["source"] == "time-window":
        out.append("  steps: none seen; the figures cover a time window of the run")
    else:
        med = f", median {st['median_ms']:.2f} ms/step" if st.get("median_ms") is not None else ""
        out.append(f"  steps: {st['recorded']} recorded after {st['warmup']} warmup "
                   f"({st['source']} steps){med}")
    for note in r.get("notes", []):
        out.append(f"  note: {note}")
    g = r.get("gpu")
    if g:
        busy = 100 - g["compute_idle_pct"]
        out.append(f"  GPU computing {busy:.1f}% of the {g['span_ms']:.2f} ms window; "
                   f"idle (no kernel running) {g['compute_idle_pct']:.1f}%:")
        pct = g["idle_breakdown_pct"]
        for cause in sorted(pct, key=lambda c: -pct[c]):
            if pct[cause] > 0:
                out.append(f"    {pct[cause]:6.1f}%  {CAUSE_WORDS.get(cause, cause)}")
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
            flag = "YES: use CUDA graphs / torch.compile" if lb["launch_bound"] else "no"
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
    out.append("  files: " + ", ".join(str(v) for v in files.values() if v))
    return "\n".join(out)


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

    rows = [
        ("median step (ms)", lambda r: "-" if r["steps"]["median_ms"] is None else f"{r['steps']['median_ms']:.2f}"),
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
        ("syncs (sync detective)", lambda r: str(sum(d["count"] for d in (r.get("host") or {}).get("sync_detective") or []))),
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
        lines.append(f"{lab}: {Path(reports[lab]['files']['report']).parent}/ (report.json, timeline.png, trace.json)")
    return "\n".join(lines)
