"""Shared plumbing for benchmarks: the environment record, the results file and the table.

Every benchmark appends one JSON object per run to `bench/results/<name>.jsonl` (or to
`$GOBRRR_BENCH_RESULTS/<name>.jsonl` when that is set, e.g. `$OUT` on a lent GPU machine):

    {"bench": "prefetch", "time": "...", "git_sha": "...", "device": "NVIDIA H200",
     "torch": "2.11.0+cu130", "cuda": "13.0", "world_size": 1, "config": {...}, "rows": [...], "figures": {...}}
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def git_sha() -> str:
    """Short sha of the checkout (with '+dirty' when there are uncommitted changes), or 'unknown'."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("GOBRRR_GIT_SHA", "unknown")
    if not sha:
        return os.environ.get("GOBRRR_GIT_SHA", "unknown")
    return sha + ("+dirty" if dirty else "")


def device_name(device: torch.device | str | None = None) -> str:
    """'NVIDIA H200' for a CUDA device, the CPU model (or 'cpu') otherwise."""
    dev = torch.device(device) if device is not None else None
    if torch.cuda.is_available() and (dev is None or dev.type == "cuda"):
        return torch.cuda.get_device_name(dev if dev is not None and dev.index is not None else None)
    return platform.processor() or platform.machine() or "cpu"


def environment() -> dict[str, Any]:
    """What produced a figure: git sha, device, torch and CUDA versions, host CPU count."""
    return {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "device": device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def results_dir() -> Path:
    return Path(os.environ.get("GOBRRR_BENCH_RESULTS", RESULTS_DIR))


def record(bench: str, *, config: dict[str, Any], rows: Sequence[dict[str, Any]] = (),
           figures: dict[str, Any] | None = None, **extra: Any) -> Path:
    """Append one JSON line for this run to `<results_dir>/<bench>.jsonl`; return the path."""
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{bench}.jsonl"
    entry = {"bench": bench, **environment(), "config": config, "rows": list(rows),
             "figures": figures or {}, **extra}
    with path.open("a") as f:
        f.write(json.dumps(entry, default=_jsonable) + "\n")
    return path


def _jsonable(x: Any) -> Any:
    if isinstance(x, (torch.device, torch.dtype, Path)):
        return str(x)
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                 floatfmt: str = ".3g") -> str:
    """Plain-text table (right-aligned numbers) that reads well in a terminal and in a log."""
    rows = list(rows)
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return format(v, floatfmt)
        return "" if v is None else str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows) for c in columns]

    def line(cells: Iterable[str]) -> str:
        return "  ".join(x.rjust(w) if num else x.ljust(w) for x, w, num in zip(cells, widths, numeric)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(columns), sep, *(line(b) for b in body)])


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, title: str = "") -> None:
    if title:
        print(title)
    print(format_table(rows, columns))


def median(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))
