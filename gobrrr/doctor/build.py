"""A recording window -> report.json, timeline.png and (under torchrun) the rank's collective records.

`build_report(session)` runs once per recording window, after its plain steps were timed (see
session.py): the trace goes through timeline.analyze (figures), plot (timeline.png), advice (what to
fix, merged with gobrrr lint and the sync detective), overhead (recorded vs plain steps) and, in a
ranked run, collectives.extract (this rank's collectives, for rank 0's merge). Whatever fails on the
way becomes a note: a report is always written.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from gobrrr.doctor.files import write_json
from gobrrr.doctor.overhead import overhead_figures

NO_GPU_NOTE = ("GPU figures need a CUDA GPU: torch.cuda.is_available() is False here, so this report "
               "has the host timeline, lint and the time per step only.")


def build_report(s) -> dict:
    """The report of session `s`'s last recording window (see the module docstring); also writes the files."""
    from gobrrr.doctor import advice, collectives, timeline
    from gobrrr.doctor import plot as timeline_plot

    torch = s.torch
    s.out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = [] if s.cuda else [NO_GPU_NOTE]
    roots = list(s.cfg.source_roots)
    if s.script:
        roots.insert(0, str(Path(s.script).resolve().parent))
    fig = tr = None
    lead_in_ms: list[float] = []
    comm = None
    sync_report = s.sync_report
    if s._trace_path is not None and s._trace_path.exists():
        mb = s._trace_path.stat().st_size / 1e6
        if mb > 50:
            notes.append(f"trace.json is {mb:.0f} MB: pass fewer --steps for a lighter trace")
        try:
            tr = timeline.parse(s._trace_path)
            complete = s._complete_steps()
            if 1 <= complete < len(tr.steps) and s.boundaries:
                tr.steps = tr.steps[:complete]  # the partial step the script ended in is not a step
                sync_report = s._sync_at_step if s._sync_at_step is not None else sync_report
                notes.append(f"the script ended inside step {complete + 1} of the recording: that partial "
                             "step is left out of the figures (it is in trace.json)")
            lead_in_ms = lead_in(tr, s.lead_in)
            fig = timeline.analyze(tr, source_roots=roots, user_paths=s.cfg.user_paths)
        except Exception as e:  # keep the run's report (steps, exit code, lint) even then
            notes.append(f"the trace could not be analysed ({type(e).__name__}: {e}); trace.json is kept "
                         "for Perfetto; please report this")
    lines_tr, lines_info = None, None
    if fig is not None and s.split and s._fig_step0:  # the figure steps were recorded without stacks
        lines_tr, lines_info = _lines(s, tr, fig, roots, notes)
    if fig is not None:
        sites = {k: v.key for k, v in getattr(fig, "call_sites", {}).items()}
        title = f"gobrrr doctor: {Path(s.script).name if s.script else 'profile'}  -  "
        if s.rank is not None:
            title += f"rank {s.rank.rank}/{s.rank.world_size}  -  "
        try:
            timeline_plot.plot_timeline(tr, fig, s.out / "timeline.png", max_steps=s.cfg.draw_steps,
                                        title=title + timeline_plot._default_title(fig), sync_sites=sites)
        except Exception as e:  # a drawing failure must not lose the figures
            notes.append(f"timeline.png not drawn: {type(e).__name__}: {e}")
        if s.cuda and not fig.has_gpu:
            notes.append("no GPU work was recorded in the window: is the script using the GPU?")
        try:
            comm = collectives.extract(tr, fig, roots=roots, user_paths=s.cfg.user_paths,
                                       draw_steps=s.cfg.draw_steps)
        except Exception as e:
            notes.append(f"collectives not read from the trace ({type(e).__name__}: {e})")
    elif s._trace_path is None:
        notes.append("nothing was recorded (the script ended before the profiler started)")
    if s.warmup != s.cfg.warmup:
        notes.append(f"--warmup {s.cfg.warmup} ran as {s.warmup}: the profiler cannot "
                     "stop its start-up trace and start recording in the same step")
    findings, lint_note = advice.lint_script([s.script]) if s.script else ([], "")
    if lint_note:
        notes.append(lint_note)
    if tr is not None and findings:
        ran = advice.ran_in_window(findings, lines_tr or tr)  # which code ran: the steps with Python stacks
        if len(ran) < len(findings):
            notes.append(f"{len(findings) - len(ran)} lint finding(s) in code that did not run in the recorded "
                         "steps left out (`gobrrr lint` lists them all)")
        findings = ran
    detective = advice.detective_rows(sync_report, roots)
    recs = advice.recommend(fig, findings, detective)
    steps_ms = fig.steps_ms if fig else []
    source = s.step_source
    if s.boundaries == 0:
        source, steps_ms = "time-window", []
        notes.append("no step boundary was seen (no optimizer.step() and no gobrrr.doctor.step()): "
                     "the report covers a time window of the run")
    elif s.boundaries < s.warmup:
        steps_ms = []
        notes.append(f"the script ended after {s.boundaries} step(s), before the {s.warmup} warmup "
                     "steps were over: nothing was recorded; rerun with a smaller --warmup")
    elif s.late_reason == "compile" and s._trace_path is not None:
        notes.append(f"torch.compile compiled before the first step: that start-up recording was dropped, and "
                     f"steps {_figure_steps(s)} were recorded by a fresh profiler")
    elif s.late_reason == "window" and s._trace_path is not None:
        notes.append(f"no step came within the {s.cfg.window_s:g} s time window; steps {_figure_steps(s)} were "
                     "recorded when they came")
    elif s.boundaries < s.warmup + s.lead_in + s.cfg.steps and not s.late_reason:
        notes.append(f"the script ended after {max(s.boundaries - s.warmup - s.lead_in, 0)} recorded step(s) of "
                     f"{s.cfg.steps}")
    fig_dict = fig.to_dict() if fig else {}
    gpu = _gpu_part(fig_dict) if fig is not None and fig.has_gpu else None
    over = overhead_figures(steps_ms, s.plain_ms, s.figure_settings, gpu)
    if lines_info is not None and over.get("plain_ms"):
        lines_info["ratio"] = round(lines_info["mean_ms"] / over["plain_ms"], 4) if lines_info["mean_ms"] else None
    if steps_ms and s.cfg.plain_steps and len(s.plain_ms) < s.cfg.plain_steps:
        notes.append(f"plain step time from {len(s.plain_ms)} of {s.cfg.plain_steps} steps: the script ended "
                     "first" if s.plain_ms else "no plain step was timed: the script ended right after the "
                     "recording (run it for a few more steps to see what the profiler costs)")
    report = {
        "script": s.script, "argv": s.argv, "exit_code": None, "error": None,
        "cuda": s.cuda, "device": torch.cuda.get_device_name() if s.cuda else "cpu",
        "torch": torch.__version__,
        "rank": s.rank.to_dict() if s.rank is not None else None,
        "steps": {"source": source, "requested": s.cfg.steps, "warmup": s.warmup,
                  "seen": s.boundaries, "recorded": len(steps_ms), "ms": steps_ms, "lead_in_ms": lead_in_ms,
                  "median_ms": round(statistics.median(steps_ms), 4) if steps_ms else None},
        "overhead": over,
        "lines": lines_info,
        "gpu": gpu,
        # syncs: blocking CUDA calls seen in the trace; sync_detective: the runtime detective's
        # sites over the same window (None when it did not watch: --detective turns it on)
        "host": {"threads": fig_dict.get("host_threads", {}), "syncs": fig_dict.get("syncs", []),
                 "sync_detective": detective if s.cfg.settings.detective else None},
        "compiled": fig_dict.get("compiled") or None,
        "advice": [r.to_dict() for r in recs],
        "lint": [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in findings],
        "notes": notes,
        "files": {"report": str(s.out / "report.json"),
                  "timeline": str(s.out / "timeline.png") if (s.out / "timeline.png").exists() else None,
                  "trace": str(s._trace_path) if s._trace_path else None,
                  "trace_lines": str(s._lines_path) if lines_tr is not None else None},
    }
    if s.rank is not None:
        collectives.write(s.out / "comm.json", comm, report)
    write_json(s.out / "report.json", report)
    return report


def _lines(s, tr, fig, roots: list[str], notes: list[str]):
    """The line steps (recorded with Python stacks after the figure steps): their sites carried onto `fig`
    (lines.py). Returns (their trace, what the report says of them), or (None, None) with a note."""
    from gobrrr.doctor import lines, timeline

    path, complete = s._lines_path, s._complete_steps("lines")
    if path is None or not path.exists() or complete <= s.lead_in:
        notes.append("no line steps were recorded (the script ended first): the figures name no line of yours; "
                     "run it for a few more steps, or pass --line-steps 0 to record the stacks in the figure steps")
        return None, None
    try:
        ltr = timeline.parse(path)
        ltr.steps = ltr.steps[:complete]  # a step the script ended in is not a step
        lead_in(ltr, s.lead_in)
        lfig = timeline.analyze(ltr, source_roots=roots, user_paths=s.cfg.user_paths)
        info = lines.carry(fig, lfig, tr, ltr)
    except Exception as e:
        notes.append(f"the line steps could not be read ({type(e).__name__}: {e}); the figures stand without "
                     "lines; please report this")
        return None, None
    info["first_step"] = s._line_step0 + s.lead_in
    return ltr, info


def _figure_steps(s) -> str:
    """The step numbers in the figures, "first..last": after the recording's lead-in."""
    first = s._fig_step0 + s.lead_in
    return f"{first}..{first + s.cfg.steps - 1}"


def lead_in(tr, n: int) -> list[float]:
    """Leave the first `n` recorded steps out of the figures (the profiler starts up in them; Session.lead_in)
    and return their ms. A recording of no more steps than that keeps them all."""
    if n <= 0 or len(tr.steps) <= n:
        return []
    out = [round((e - st) / 1e3, 4) for _, st, e in tr.steps[:n]]
    tr.steps = tr.steps[n:]
    return out


def snapshot(report):
    """A copy of a SyncReport's counts as they stand (the detective keeps adding to the original)."""
    if report is None:
        return None
    from dataclasses import replace

    from gobrrr.syncs.watch import SyncReport

    copy = SyncReport(report.mode)
    copy._sites = {(x.kind, x.file, x.line): replace(x) for x in report.sites}
    return copy


def _gpu_part(d: dict) -> dict:
    keys = ("span_ms", "idle_pct", "compute_idle_pct", "idle_breakdown_ms", "idle_breakdown_pct", "top_cause",
            "copy_overlap_pct", "overlap_pct", "copy_hidden_pct", "h2d_overlap_pct", "copies", "pageable", "h2d_sites",
            "host_bound_sites", "loader_sites",
            "queue_lead_ms", "top_kernels", "launch", "streams")
    return {k: d.get(k) for k in keys}
