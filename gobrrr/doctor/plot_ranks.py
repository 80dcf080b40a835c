"""The merged timeline of a torchrun run: a lane group per rank, on one clock.

Per rank, top to bottom: its Python thread (grey: inside a torch op; a tick where it issued a collective;
orange on the straggler's: the calls of the line that made it late),
its communication (purple: a collective running on gloo's thread or NCCL's stream; red over it: the part
spent waiting for the last rank to arrive) and, on a GPU, its compute kernels (blue). Dashed lines mark
each rank's step boundaries. The straggler's lane label is red and names the line that made it late.
Drawn with matplotlib's Agg backend from each rank's collectives.py data (no trace is re-read).
"""
from __future__ import annotations

from pathlib import Path

from gobrrr.doctor.merge import _by_point
from gobrrr.doctor.plot import save

COLORS = {"host": "#c7c7c7", "comm": "#9467bd", "wait": "#d62728", "compute": "#1f77b4", "issue": "#000000",
          "late": "#ff7f0e"}


def _waits(comms: dict[int, dict], offsets: dict[int, float]) -> dict[int, list[tuple[float, float]]]:
    out: dict[int, list[tuple[float, float]]] = {r: [] for r in comms}
    for pts in _by_point(comms).values():
        if len(pts) < 2:
            continue
        last = max(p["arrival_us"] - offsets.get(r, 0.0) for r, p in pts.items())
        for r, p in pts.items():
            a = p["arrival_us"] - offsets.get(r, 0.0)
            e = min(last, p["end_us"] - offsets.get(r, 0.0))
            if e > a:
                out[r].append((a, e))
    return out


def plot_ranks(comms: dict[int, dict], path: str | Path, *, title: str = "", straggler: dict | None = None,
               offsets: dict[int, float] | None = None) -> Path:
    """Write the merged timeline PNG at `path` and return the path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    offsets = offsets or {}
    ranks = sorted(comms)
    lanes = {r: comms[r].get("lanes") or {} for r in ranks}
    t0 = min((lanes[r].get("t0", 0.0) - offsets.get(r, 0.0) for r in ranks if lanes[r]), default=0.0)
    t1 = max((lanes[r].get("t1", 0.0) - offsets.get(r, 0.0) for r in ranks if lanes[r]), default=1.0)
    waits = _waits(comms, offsets)
    rows = []  # (rank, kind)
    for r in ranks:
        rows += [(r, "host"), (r, "comm")] + ([(r, "compute")] if lanes[r].get("compute") else [])
    height = 1.8 + 0.42 * len(rows)
    fig, ax = plt.subplots(figsize=(14, height), dpi=110)
    ms = lambda t: (t - t0) / 1e3  # noqa: E731

    def bars(y, iv, color, h=0.7, **kw):
        spans = [(ms(s), max((e - s) / 1e3, 1e-4)) for s, e in iv if e >= t0 and s <= t1]
        if spans:
            ax.broken_barh(spans, (y - h / 2, h), facecolors=color, edgecolor="none", **kw)

    yticks, ylabels = [], []
    for y, (r, kind) in enumerate(reversed(rows)):
        off = offsets.get(r, 0.0)
        shift = lambda iv, off=off: [(s - off, e - off) for s, e in iv]  # noqa: E731
        yticks.append(y)
        late = straggler is not None and straggler.get("rank") == r
        if kind == "host":
            label = f"rank {r}: Python thread"
            bars(y, shift(lanes[r].get("host", [])), COLORS["host"])
            for c in comms[r].get("collectives", []):
                x = c["issue_us"] - off
                if t0 <= x <= t1:
                    ax.plot([ms(x)], [y + 0.42], marker="v", color=COLORS["issue"], markersize=3)
            if late and straggler.get("site"):
                label += f"  (late: {straggler['site']})"
                mine = [(a, b) for a, b, key in lanes[r].get("lines", []) if key == straggler["site"]]
                bars(y, shift(mine), COLORS["late"], h=0.5)
                shown = [a - off for a, _ in mine if t0 <= a - off <= t1]
                if shown:
                    text = f"{straggler['site']}  {straggler.get('code', '')[:40]}"
                    ax.annotate(text, (ms(min(shown)), y - 0.45), xytext=(2, -9), textcoords="offset points",
                                fontsize=7, color=COLORS["late"])
        elif kind == "comm":
            label = f"rank {r}: collectives"
            bars(y, shift(lanes[r].get("comm", [])), COLORS["comm"])
            bars(y, waits.get(r, []), COLORS["wait"], h=0.35, alpha=0.85)
        else:
            label = f"rank {r}: GPU compute"
            bars(y, shift(lanes[r].get("compute", [])), COLORS["compute"])
        ylabels.append(label)
        if kind == "host":
            for _, s, _ in comms[r].get("steps", []):
                x = s - off
                if t0 <= x <= t1:
                    ax.plot([ms(x), ms(x)], [y - 0.5, y + 0.5], color="black", linestyle="--", linewidth=0.7)
    for i in range(1, len(ranks)):  # separate the rank groups
        n_below = sum(1 for r, _ in rows if r in ranks[len(ranks) - i:])
        ax.axhline(n_below - 0.5, color="#555555", linewidth=0.6)
    ax.set_yticks(yticks, ylabels, fontsize=8)
    for tick, (r, _) in zip(ax.get_yticklabels(), list(reversed(rows))):
        if straggler is not None and straggler.get("rank") == r:
            tick.set_color(COLORS["wait"])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlim(0, max(ms(t1), 1e-3))
    ax.set_xlabel("time (ms)")
    handles = [Patch(color=COLORS["host"], label="host in a torch op"),
               Patch(color=COLORS["comm"], label="collective running"),
               Patch(color=COLORS["wait"], label="waiting for the last rank"),
               Patch(color=COLORS["compute"], label="GPU compute"),
               Patch(color=COLORS["late"], label="the straggler's late line"),
               Line2D([0], [0], color=COLORS["issue"], marker="v", linestyle="none", markersize=4,
                      label="collective issued"),
               Line2D([0], [0], color="black", linestyle="--", linewidth=0.8, label="step boundary")]
    fig.legend(handles=handles, loc="lower center", ncol=7, fontsize=7, frameon=False)
    sub = ""
    if straggler is not None:
        sub = (f"  -  straggler: rank {straggler['rank']} (the others waited {straggler['late_ms_per_step']:.1f} ms/step "
               f"at {straggler['at']})" + (f", late at {straggler['site']}" if straggler.get("site") else ""))
    ax.set_title((title or "gobrrr doctor: ranks") + sub, fontsize=10)
    return save(fig, ax, path, height)
