"""The host-device diagram of a real run: one lane per host thread and per CUDA stream.

Drawn with matplotlib's Agg backend (no display needed) from a parsed trace and its figures:
host lanes show when the host thread was inside a torch op (grey) and when it sat in a
synchronising call (red, labelled with the source line that caused it); stream lanes show
kernels, H2D, D2H and other copies in distinct colours; time with nothing running on the GPU
is shaded across the stream lanes; dashed lines mark the step boundaries. Only the first
few steps are drawn so single kernels stay visible.
"""
from __future__ import annotations

from pathlib import Path

from gobrrr.doctor.timeline import SYNC_CALLS, Figures, Trace, complement, merge

COLORS = {
    "kernel": "#1f77b4", "H2D": "#ff7f0e", "D2H": "#2ca02c", "copy": "#9467bd", "memset": "#8c8c8c",
    "host": "#c7c7c7", "sync": "#d62728", "idle": "#ff9896",
}
MAX_LABELS = 10


def plot_timeline(trace: Trace, figures: Figures, path: str | Path, *, max_steps: int = 3,
                  title: str = "", sync_sites: dict[tuple[int, float], str] | None = None) -> Path:
    """Write the diagram as a PNG at `path` and return the path.

    `sync_sites` maps (host thread, call start) to a label such as `train.py:42`; without it
    syncs are labelled by the runtime call's name.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t0, t1 = _view(trace, figures, max_steps)
    host_tids = sorted({c.tid for c in trace.calls if t0 <= c.ts <= t1} |
                       {tid for tid, ol in trace.ops.items() if any(t0 <= s <= t1 for s, _, _ in ol)})
    streams = sorted({g.stream for g in trace.gpu if g.end >= t0 and g.ts <= t1})
    lanes = [("host", tid) for tid in host_tids] + [("stream", s) for s in streams]
    height = 1.6 + 0.55 * max(len(lanes), 1)
    fig, ax = plt.subplots(figsize=(14, height), dpi=110)
    ms = lambda t: (t - t0) / 1e3  # noqa: E731  (us on the trace clock -> ms from the view start)

    def bars(y, intervals, color, **kw):
        spans = [(ms(s), max((e - s) / 1e3, 1e-4)) for s, e in intervals if e >= t0 and s <= t1]
        if spans:
            ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=color, edgecolor="none", **kw)

    labels, yticks, ylabels, n_labels = set(), [], [], 0
    for y, (kind, ident) in enumerate(reversed(lanes)):
        yticks.append(y)
        if kind == "host":
            name = trace.thread_names.get(ident, "") or f"thread {ident}"
            ylabels.append(f"host: {name[:22]}")
            bars(y, merge((s, e) for s, e, _ in trace.ops.get(ident, [])), COLORS["host"])
            syncs = [c for c in trace.calls if c.tid == ident and c.name in SYNC_CALLS and t0 <= c.ts <= t1]
            bars(y, [(c.ts, c.end) for c in syncs], COLORS["sync"])
            for c in syncs:
                label = (sync_sites or {}).get((c.tid, c.ts)) or c.name
                ax.plot([ms(c.ts)], [y + 0.42], marker="v", color=COLORS["sync"], markersize=5)
                if (label, int(c.ts // 1e9)) not in labels and n_labels < MAX_LABELS and label not in labels:
                    labels.add(label)
                    n_labels += 1
                    ax.annotate(label, (ms(c.ts), y + 0.45), xytext=(2, 4 + 9 * (n_labels % 2)),
                                textcoords="offset points", fontsize=7, color=COLORS["sync"])
        else:
            ylabels.append(f"GPU stream {ident}")
            mine = [g for g in trace.gpu if g.stream == ident]
            for key, pick in (("kernel", lambda g: g.kind == "kernel"),
                              ("H2D", lambda g: g.kind == "memcpy" and g.direction == "H2D"),
                              ("D2H", lambda g: g.kind == "memcpy" and g.direction == "D2H"),
                              ("copy", lambda g: g.kind == "memcpy" and g.direction not in ("H2D", "D2H")),
                              ("memset", lambda g: g.kind == "memset")):
                bars(y, [(g.ts, g.end) for g in mine if pick(g)], COLORS[key])

    if streams:  # shade the time with nothing at all running on the GPU, on every stream lane
        w0, w1 = figures.window_us if figures.window_us[1] > figures.window_us[0] else (t0, t1)
        busy = merge((g.ts, g.end) for g in trace.gpu if g.end >= w0 and g.ts <= w1)
        idle = complement(busy, max(w0, t0), min(w1, t1))
        spans = [(ms(s), (e - s) / 1e3) for s, e in idle]
        for y in range(len(streams)):
            ax.broken_barh(spans, (y - 0.5, 1.0), facecolors=COLORS["idle"], alpha=0.35, edgecolor="none")
    for n, s, _ in trace.steps:
        if t0 <= s <= t1:
            ax.axvline(ms(s), color="black", linestyle="--", linewidth=0.8)
            ax.text(ms(s), len(lanes) - 0.4, f" step {n}", fontsize=7, va="bottom")
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_ylim(-0.7, max(len(lanes), 1) + 0.1)
    ax.set_xlim(0, max(ms(t1), 1e-3))
    ax.set_xlabel("time (ms)")
    handles = [Patch(color=COLORS[k], label=lbl) for k, lbl in (
        ("kernel", "kernel"), ("H2D", "H2D copy"), ("D2H", "D2H copy"), ("copy", "other copy"),
        ("memset", "memset"), ("host", "host in torch op"), ("sync", "host blocked in sync"),
        ("idle", "GPU idle"))]
    handles.append(Line2D([0], [0], color="black", linestyle="--", linewidth=0.8, label="step boundary"))
    fig.legend(handles=handles, loc="lower center", ncol=9, fontsize=7, frameon=False)
    ax.set_title(title or _default_title(figures), fontsize=10)
    return save(fig, ax, path, height)


def save(fig, ax, path, height: float) -> Path:
    """Grid, room for the legend below the axes (height in inches), write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.35 / height, 1, 1))
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _view(trace: Trace, figures: Figures, max_steps: int) -> tuple[float, float]:
    """The time range to draw: the first `max_steps` steps, else the GPU window, else the host range."""
    if trace.steps:  # the steps' host time, stretched to the end of the GPU work they launched
        shown = trace.steps[:max_steps]
        t0, t1 = shown[0][1], shown[-1][2]
        launched = {c.correlation for c in trace.calls if t0 <= c.ts <= t1 and c.correlation >= 0}
        ends = [g.end for g in trace.gpu if g.correlation in launched]
        return t0, max([t1] + ends)
    if figures.window_us[1] > figures.window_us[0]:
        return figures.window_us
    times = [c.ts for c in trace.calls] + [s for ol in trace.ops.values() for s, _, _ in ol]
    ends = [c.end for c in trace.calls] + [e for ol in trace.ops.values() for _, e, _ in ol]
    return (min(times), max(ends)) if times else (0.0, 1.0)


def _default_title(f: Figures) -> str:
    if not f.has_gpu:
        return "host timeline: no GPU work recorded (the stream lanes need a CUDA run)"
    cause = f.top_cause.replace("_", " ")
    return (f"GPU idle (no kernel running) {f.compute_idle_pct:.1f}% of {f.span_ms:.2f} ms"
            f"  -  top cause: {cause}  -  H2D hidden from compute "
            f"{'n/a' if f.copy_hidden_pct is None else f'{f.copy_hidden_pct:.0f}%'}")
