"""Shared plumbing for benchmarks: the command line, the environment record, the results file, the table.

Every benchmark appends one JSON object per run to `<results>/<name>.jsonl`, where <results> is,
first match wins:
  1. `--results DIR` on the command line;
  2. `$GOBRRR_BENCH_RESULTS` (e.g. `$OUT` on a lent GPU machine; the test suite sets a temp dir);
  3. for a `--quick` smoke run: `$XDG_CACHE_HOME/gobrrr/bench-results` (~/.cache/...), so smoke
     runs and CPU checks never land in the committed records;
  4. `bench/results/` (the committed figures: real runs only).

    {"bench": "prefetch", "time": "...", "git_sha": "...", "device": "NVIDIA H200",
     "torch": "2.11.0+cu130", "cuda": "13.0", "world_size": 1, "config": {...}, "rows": [...], "figures": {...}}
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

RESULTS_DIR = Path(__file__).resolve().parents[2] / "bench" / "results"


def git_sha() -> str:
    """Short sha of the checkout (with '+dirty' when there are uncommitted changes), or 'unknown'.
    `GOBRRR_GIT_SHA`, when set, wins: a copied tree (a lent GPU machine) can carry a stale .git."""
    if os.environ.get("GOBRRR_GIT_SHA"):
        return os.environ["GOBRRR_GIT_SHA"]
    root = Path(__file__).resolve().parents[2]
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


def results_dir(quick: bool = False, results: str | os.PathLike | None = None) -> Path:
    """Where a run's record goes (see the module docstring for the order)."""
    if results:
        return Path(results)
    if os.environ.get("GOBRRR_BENCH_RESULTS"):
        return Path(os.environ["GOBRRR_BENCH_RESULTS"])
    if quick:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(cache) / "gobrrr" / "bench-results"
    return RESULTS_DIR


def record(bench: str, *, config: dict[str, Any], rows: Sequence[dict[str, Any]] = (),
           figures: dict[str, Any] | None = None, quick: bool = False, results: str | os.PathLike | None = None,
           **extra: Any) -> Path:
    """Append one JSON line for this run to `<results_dir>/<bench>.jsonl`; return the path.
    `quick` (a --quick smoke run) and `results` (--results DIR) pick the folder: see results_dir."""
    out = results_dir(quick, results)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{bench}.jsonl"
    entry = {"bench": bench, **environment(), "config": config, "rows": list(rows),
             "figures": figures or {}, **extra}
    with path.open("a") as f:
        f.write(json.dumps(entry, default=_jsonable) + "\n")
    return path


# ---------------------------------------------------------------- the command line

class Parser(argparse.ArgumentParser):
    """argparse with the gobrrr error shape: one line `gobrrr bench NAME: error: ...; see --help`, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def add_results_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", metavar="DIR", default=None,
                   help="folder for the JSON record (default bench/results/; with --quick a cache folder)")


def positive(kind: type = int) -> Any:
    """An argparse `type=` accepting finite numbers > 0 of `kind`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def parse_device(p: argparse.ArgumentParser, text: str | None, default: str | None = None) -> torch.device | None:
    """'cpu', 'cuda' or 'cuda:N', checked against this machine; `p.error` (exit 2) otherwise."""
    text = text or default
    if text is None:
        return None
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        p.error(f"--device {text!r} is not a device here; use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            p.error(f"--device {text} asks for a GPU but torch sees none; use --device cpu (or --quick)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            p.error(f"--device {text}: this machine has {torch.cuda.device_count()} GPU(s); pick cuda:0..")
    return dev


DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64")


def parse_dtype(p: argparse.ArgumentParser, name: str) -> torch.dtype:
    """A torch dtype by name, one of DTYPES (torch also names sub-byte placeholders such as int7 that
    hold no data); `p.error` (exit 2) otherwise."""
    if name not in DTYPES:
        p.error(f"--dtype {name!r} is not one of {', '.join(DTYPES)}")
    return getattr(torch, name)


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
