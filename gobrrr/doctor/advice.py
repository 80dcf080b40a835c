"""What to fix: turn the doctor's figures into changes, ordered by the time they would save.

Each recommendation names a source line and the change. The saving is an estimate per step,
read off the idle breakdown: the GPU time the cause cost is the time the fix can give back
(removing a sync that left the GPU empty for 3 ms gives back at most those 3 ms). Static
lint findings (gobrrr.lint) for the same script come after the measured ones, or are
attached to the measured recommendation on the same line.
"""
from __future__ import annotations

import linecache
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gobrrr.doctor.host import HOST_OVERHEAD
from gobrrr.doctor.timeline import Figures
from gobrrr.syncs.watch import DEFAULT_HINT, HINTS

# callee of a sync (the Python call found in the trace) -> the sync detective's kind, whose fix
# (gobrrr.syncs.watch.HINTS) is the one change we recommend for it, in the doctor and the detective alike
_CALLEE_KIND = {"item": "item", "tolist": "tolist", "cpu": "cpu", "numpy": "numpy", "to": "h2d_copy",
                "synchronize": "device_synchronize", "nonzero": "nonzero", "__bool__": "bool"}
SMALL_COPY_BYTES = 64 * 1024


@dataclass
class Recommendation:
    change: str                   # what to do, one sentence
    site: str = ""                # file:line, when known
    code: str = ""                # the source line
    why: str = ""                 # the measured reason
    saved_ms: float | None = None  # estimated GPU time saved per step (None: static finding)
    source: str = "trace"         # "trace" | "detective" | "lint"
    rules: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def detective_rows(report, roots: list[str] | None = None) -> list[dict]:
    """The sync detective's sites (a gobrrr.syncs.watch.SyncReport) as report rows: the site is
    written relative to the first root it lies under (the script's folder), like the trace's sites."""
    rows = []
    for s in report.sites if report is not None else []:
        where = s.where()
        for root in roots or []:
            try:
                where = f"{Path(s.file).resolve().relative_to(Path(root).resolve())}:{s.line}"
                break
            except ValueError:
                continue
        rows.append({"site": where, "kind": s.kind, "count": s.count, "stall_ms": round(s.stall_s * 1e3, 4),
                     "code": s.code, "fix": s.hint})
    return rows


def _by_line(site: str) -> tuple[str, int] | None:
    """`dir/file.py:12` -> ("file.py", 12): how trace, detective and lint sites are matched."""
    file, _, line = site.rpartition(":")
    return (Path(file).name, int(line)) if line.isdigit() else None


def _index_by_line(recs: list[Recommendation]) -> dict[tuple[str, int], Recommendation]:
    out = {}
    for r in recs:
        key = _by_line(r.site)
        if key is not None:
            out[key] = r
    return out


def recommend(fig: Figures | None, lint_findings: list | None = None,
              detective: list[dict] | None = None) -> list[Recommendation]:
    """Recommendations from one trace's figures (None: no trace), the sync detective's rows
    (detective_rows) and lint findings: measured savings first, largest first; then syncs only the
    detective saw; then lint."""
    if fig is None:
        return _merge_lint(_merge_detective([], detective or []), lint_findings or [])
    n = max(len(fig.steps_ms), 1)
    per_step = lambda ms: round(ms / n, 4)  # noqa: E731
    recs: list[Recommendation] = []
    br = fig.idle_breakdown_ms or {}

    # Waiting for data: H2D copies while nothing computes (each site's copy time on the critical path).
    for s in fig.h2d_sites:
        share = s.get("critical_ms", 0.0)
        if share <= 0:
            continue
        mean_bytes = s["bytes"] / max(s["count"], 1)
        if mean_bytes < SMALL_COPY_BYTES:
            change = "create the tensor on the device (torch.tensor(..., device=device)) instead of copying it over"
        elif s["pageable"]:
            change = ("pin the host memory and copy with non_blocking=True, or wrap the loader in gobrrr.Prefetcher "
                      "(pinned staging, copies on a side stream overlapped with compute)")
        else:
            change = "overlap the copy with compute: wrap the loader in gobrrr.Prefetcher (side-stream copies)"
        kind = "pageable" if s["pageable"] else "pinned"
        recs.append(Recommendation(
            change, s["site"], s["code"], saved_ms=per_step(share),
            why=f"{s['count']} {kind} H2D copies ({s['bytes'] / 1e6:.1f} MB, {s['gbps']:.1f} GB/s) ran while "
                f"no kernel could: {per_step(share):.3f} ms/step of waiting for data"))

    # Syncs that left the GPU empty.
    for row in fig.syncs:
        idle = row.get("idle_ms", 0.0)
        if idle <= 0 and row["total_ms"] <= 0:
            continue
        change = HINTS.get(_CALLEE_KIND.get(row.get("callee", ""), ""), DEFAULT_HINT)
        recs.append(Recommendation(
            change, row["site"], row["code"], saved_ms=per_step(idle),
            why=f"{row['count']} x {row['call']} ({row['kind']}): host blocked {row['total_ms']:.3f} ms, "
                f"GPU left empty {idle:.3f} ms afterwards"))

    # Waiting for the DataLoader: the host sat in its __next__ while the GPU had nothing to do.
    for s in getattr(fig, "loader_sites", []) or []:
        recs.append(Recommendation(
            loader_change(s.get("loader", ""), s.get("in_process", False), s.get("ours", False)), s["site"],
            s.get("code", ""),
            saved_ms=per_step(s["idle_ms"]),
            why=f"the host waited in the DataLoader's __next__ while the GPU had no work: "
                f"{per_step(s['idle_ms']):.3f} ms/step"))

    # Host-bound: the next launch came late, the host was busy elsewhere.
    # (each line's own; a launch-bound step gets the CUDA-graph advice for its launch gaps on top)
    launch = fig.launch or {}
    comp = getattr(fig, "compiled", None) or {}
    compiled = bool(comp.get("compiled"))
    for s in fig.host_bound_sites[:5]:
        recs.append(Recommendation(host_change(s, compiled), s["site"], s.get("code", ""),
                                   saved_ms=per_step(s["idle_ms"]),
                                   why=f"the GPU waited for the host here: {s['idle_ms']:.3f} ms empty "
                                       f"({per_step(s['idle_ms']):.3f} ms/step)"
                                       + ("; this call runs compiled graphs" if s.get("detail") == "compiled" else "")))
    if launch.get("launch_bound"):
        recs.append(Recommendation(
            "capture the step in a CUDA graph (torch.compile(mode='reduce-overhead') or torch.cuda.graphs), "
            "or fuse the small ops", saved_ms=per_step(br.get("launch_gaps", 0.0)),
            why=f"launch-bound: the median kernel runs {launch['median_kernel_us']:.1f} us, shorter than its "
                f"launch ({launch['median_launch_us']:.1f} us); {launch['kernels']} kernels"))
    else:
        if br.get("launch_gaps", 0.0) > 0.05 * max(fig.span_ms, 1e-9):
            recs.append(Recommendation(
                "launch gaps: " + ("the compiled graphs still launch kernel by kernel: capture them in CUDA graphs "
                                   "(torch.compile(mode='reduce-overhead'))" if compiled else
                                   "fewer, larger kernels: torch.compile or CUDA graphs remove the launch gaps"),
                saved_ms=per_step(br["launch_gaps"]),
                why=f"{br['launch_gaps']:.3f} ms of gaps shorter than a launch between kernels"))
    for b in comp.get("graph_breaks", []):
        recs.append(Recommendation(
            "a graph break: torch.compile runs this function as several graphs with Python between them; "
            "make the line traceable (or move it out of the compiled function) so it compiles as one graph",
            b["site"], b.get("code", ""), why=f"dynamo resumes after this line {b['per_step']:g} x per step"
            + (f" ({'; '.join(comp.get('reasons') or [])[:200]})" if comp.get("reasons") else "")))

    recs.sort(key=lambda r: -(r.saved_ms or 0.0))
    return _merge_lint(_merge_detective(_merge_same_site(recs), detective or []), lint_findings or [])


LAUNCH_OVERHEAD_FIX = "host launch overhead: try torch.compile or CUDA graphs"
COMPILED_FIX = ("it already runs compiled (torch.compile): what is left on the host is launching the compiled "
                "kernels one by one; capture them in CUDA graphs with torch.compile(mode='reduce-overhead') "
                "(or torch.cuda.graphs), and keep the graph count low (no graph breaks)")


def loader_change(name: str, in_process: bool, ours: bool = False) -> str:
    """What to do about a DataLoader the GPU waited for (`name`: what the `for` line iterates)."""
    if ours:
        which = f"`{name}`" if name else "the gobrrr.Prefetcher"
        return (f"{which} waited for its source: the copies are hidden, the loading is not; give the DataLoader "
                "it wraps more workers (num_workers), or raise the Prefetcher's depth")
    which = f"the DataLoader `{name}`" if name else "the DataLoader"
    if in_process:
        return (f"{which} loads in the main process (num_workers=0): give it workers (num_workers > 0) and "
                "pin_memory=True, or wrap it in gobrrr.Prefetcher to load and copy ahead")
    return (f"{which} cannot keep up: raise its num_workers, set pin_memory=True, or wrap it in gobrrr.Prefetcher "
            "to load and copy ahead")


def host_change(row: dict, compiled: bool = False) -> str:
    """The change for host-bound idle time at one line, by what the line calls (timeline_host).
    `compiled`: the step runs torch.compile'd code, so torch.compile is never the advice."""
    callee, code = row.get("callee", ""), row.get("code", "")
    if row.get("detail") == "compiled":
        what = "backward" if callee == "backward" else "this call"
        return f"{what}: {COMPILED_FIX}"
    if callee == HOST_OVERHEAD or not row.get("site"):
        where = f" in {row['func']}()" if row.get("func") else ""
        if compiled:
            return (f"host launch overhead (the GPU waited for the host's launches{where}): capture the step in CUDA "
                    "graphs (torch.compile(mode='reduce-overhead') or torch.cuda.graphs)")
        return f"{LAUNCH_OVERHEAD_FIX} (the GPU waited for the host's launches{where})"
    if callee == "__next__" or any(k in code for k in ("next(", "loader", "DataLoader")):
        return loader_change("", False)
    if callee == "module call" and row.get("detail") == "DataParallel":
        return ("nn.DataParallel walks the model's parameters and buffers on the host every step (and on several "
                "GPUs replicates it): on one GPU call the module directly; on several use DistributedDataParallel "
                "(or gobrrr.parallel.ddp), one process per GPU")
    if callee == "module call":
        return ("host launch overhead in this forward (its kernels launch slower than the GPU runs them): "
                + ("capture it in CUDA graphs" if compiled else "try torch.compile or CUDA graphs"))
    if callee == "backward":
        return ("host launch overhead in backward (many small kernels): "
                + ("capture it in CUDA graphs" if compiled else "try torch.compile (it compiles backward too) or CUDA graphs"))
    if callee == "step":
        return ("the optimizer step is Python-bound: pass foreach=True or fused=True to the optimizer"
                + ("" if compiled else ", or torch.compile the step"))
    if callee == "zero_grad":
        return ("zero_grad walks every parameter in Python: keep set_to_none=True (the default), and capture "
                "the step " + ("in CUDA graphs" if compiled else "with torch.compile or CUDA graphs"))
    kind = _CALLEE_KIND.get(callee)
    if kind:
        return HINTS.get(kind, DEFAULT_HINT)
    return ("Python work at this line kept the GPU waiting: move it off the hot path (precompute, batch small "
            "ops, or do it in a DataLoader worker)" + ("" if compiled else f", or {LAUNCH_OVERHEAD_FIX.split(': ', 1)[1]}"))


def _merge_detective(recs: list[Recommendation], rows: list[dict]) -> list[Recommendation]:
    """The runtime sync detective names the exact kind of each sync (`bool`, `item`, a pageable
    `copy_`...): on a line the trace already recommends, its fix and counts join that recommendation;
    a line only the detective saw (no GPU idle measured after it) gets its own, after the measured ones."""
    by_line = _index_by_line(recs)
    extra = []
    for row in rows:
        seen = f"sync detective: {row['count']} x {row['kind']}, host blocked {row['stall_ms']:.3f} ms"
        r = by_line.get(_by_line(row["site"]))
        if r is not None:
            r.why += "; " + seen
            if r.change in HINTS.values() or r.change == DEFAULT_HINT or not r.change:
                r.change = row["fix"]  # the detective's kind is the precise one
            continue
        extra.append(Recommendation(row["fix"], row["site"], row["code"], why=seen, source="detective"))
        by_line[_by_line(row["site"])] = extra[-1]
    return recs + extra


def _merge_same_site(recs: list[Recommendation]) -> list[Recommendation]:
    """One recommendation per source line: a pageable `.to()` both waits for data and syncs."""
    out: list[Recommendation] = []
    seen: dict[str, Recommendation] = {}
    for r in recs:
        first = seen.get(r.site) if r.site else None
        if first is None:
            out.append(r)
            if r.site:
                seen[r.site] = r
            continue
        first.saved_ms = round((first.saved_ms or 0.0) + (r.saved_ms or 0.0), 4)
        first.why += "; " + r.why
    out.sort(key=lambda r: -(r.saved_ms or 0.0))
    return out


def _merge_lint(recs: list[Recommendation], findings: list) -> list[Recommendation]:
    by_line = _index_by_line(recs)
    static = []
    for f in findings:
        d = f.to_dict() if hasattr(f, "to_dict") else dict(f)
        key = (Path(str(d.get("path", ""))).name, int(d.get("line", 0)))
        if key in by_line:
            by_line[key].rules.append(d.get("rule", ""))
            continue
        path, line = str(d.get("path", "")), int(d.get("line", 0))
        static.append(Recommendation(
            d.get("fix") or d.get("message", ""), f"{Path(path).name}:{line}",
            linecache.getline(path, line).strip(), why=d.get("message", ""), source="lint",
            rules=[d.get("rule", "")]))
    return recs + static


def lint_script(paths: list[str]) -> tuple[list, str]:
    """Lint findings for the profiled script, and a note when the linter is not available."""
    try:
        from gobrrr.lint.check import lint_paths
    except ImportError as e:  # the linter lives in its own module; the doctor works without it
        return [], f"lint skipped: gobrrr.lint is not importable ({e})"
    try:
        return list(lint_paths(paths)), ""
    except Exception as e:  # a linter failure must not lose the profile
        return [], f"lint failed on {paths}: {type(e).__name__}: {e}"


def ran_in_window(findings: list, tr) -> list:
    """The lint findings in code that ran in the recorded steps: a finding in a function the trace never
    entered (the naive loop, when the script ran its other loop) is not about this run. Files the trace
    holds no frame of (a trace without Python stacks) keep all their findings."""
    ran = {(Path(f.file).name, f.func) for frames in tr.frames.values() for f in frames}
    files = {name for name, _ in ran}
    keep = []
    for f in findings:
        d = f.to_dict() if hasattr(f, "to_dict") else dict(f)
        path, line = str(d.get("path", "")), int(d.get("line", 0))
        name = Path(path).name
        if name not in files or (name, _enclosing_function(path, line)) in ran:
            keep.append(f)
    return keep


def _enclosing_function(path: str, line: int) -> str:
    """The name of the innermost function whose body holds `line` ("<module>" at the top level)."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return "<module>"
    best, best_start = "<module>", -1
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.lineno <= line <= (node.end_lineno or node.lineno) and node.lineno > best_start:
            best, best_start = node.name, node.lineno
    return best
