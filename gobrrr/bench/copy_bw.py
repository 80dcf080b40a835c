"""`gobrrr bench copy`: how fast bytes cross between host and device, by direction, memory kind and size.

    gobrrr bench copy                 # on a GPU: H2D pageable / pinned, D2H pageable / pinned, D2D
    python -m gobrrr.bench.copy_bw --quick   # tiny sizes; on the CPU it times a host memcpy only (a smoke test)

Each figure is the median of `--repeats` timings, each timing `reps` back-to-back copies between one
pair of CUDA events on the current stream, read after the last copy (one wait per timing, none per
copy). GB/s is bytes moved / time (1 GB = 1e9 bytes); D2D also shows read+write traffic, the figure
a memory-bandwidth spec quotes. "% of pinned peak" relates every row to the best pinned H2D figure
of this run: the ceiling the Prefetcher's copy-bound case is measured against (target >= 95%).
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from gobrrr.bench.common import Parser, add_results_option, median, parse_device, positive, print_table, record

KINDS = ("h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned", "d2d")
MiB = 1 << 20  # --sizes are in MiB


def _buffers(kind: str, nbytes: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) uint8 buffers of `nbytes` for one copy kind."""
    n = nbytes
    host_pinned = kind.endswith("pinned")
    if kind.startswith("h2d"):
        src = torch.ones(n, dtype=torch.uint8, pin_memory=host_pinned)
        return src, torch.empty(n, dtype=torch.uint8, device=device)
    if kind.startswith("d2h"):
        dst = torch.empty(n, dtype=torch.uint8, pin_memory=host_pinned)
        return torch.ones(n, dtype=torch.uint8, device=device), dst
    if kind == "d2d":
        return torch.ones(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device)
    if kind == "host_memcpy":
        return torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
    raise ValueError(f"unknown copy kind {kind!r}; choose one of {', '.join(KINDS + ('host_memcpy',))}")


def _timer(device: torch.device) -> Callable[[Callable[[], None], int], float]:
    """A function timing `reps` calls of `fn`, in ms per call: CUDA events on a GPU, perf_counter on the CPU."""
    if device.type != "cuda":
        def cpu_time(fn, reps):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) * 1e3 / reps
        return cpu_time

    def cuda_time(fn, reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()  # sync: end of one timing (reps copies), not per copy
        return start.elapsed_time(end) / reps
    return cuda_time


def measure(kind: str, nbytes: int, device: torch.device, reps: int = 0, repeats: int = 5) -> float:
    """Median milliseconds per copy of `nbytes` for `kind` (see KINDS) on `device`."""
    src, dst = _buffers(kind, nbytes, device)
    non_blocking = kind.endswith("pinned") or kind == "d2d"

    def copy():
        dst.copy_(src, non_blocking=non_blocking)

    reps = reps or max(3, min(50, int(2e9 // max(nbytes, 1))))
    timer = _timer(device)
    timer(copy, 2)  # warm-up: first-touch of the buffers, driver paths
    return median(timer(copy, reps) for _ in range(repeats))


def run(sizes_mb: list[float], device: torch.device, kinds: tuple[str, ...], repeats: int) -> list[dict]:
    rows = []
    for kind in kinds:
        for size in sizes_mb:
            nbytes = int(size * MiB)
            ms = measure(kind, nbytes, device, repeats=repeats)
            gbps = nbytes / (ms * 1e6)
            rows.append({"copy": kind, "size_MB": size, "ms": ms, "GB/s": gbps,
                         "rw_GB/s": 2 * gbps if kind in ("d2d", "host_memcpy") else None})
    peak = max((r["GB/s"] for r in rows if r["copy"] == "h2d_pinned"), default=None)
    for r in rows:
        r["pct_of_pinned_peak"] = 100 * r["GB/s"] / peak if peak else None
    return rows


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="gobrrr bench copy", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=positive(float), nargs="+", default=None, help="sizes in MiB (default 1 8 64 256)")
    p.add_argument("--device", default=None, help="'cuda', 'cuda:N' or 'cpu' (default: the GPU if any)")
    p.add_argument("--repeats", type=positive(int), default=5, help="timings per figure; the median is reported")
    p.add_argument("--quick", action="store_true", help="small sizes and few repeats (a smoke test)")
    add_results_option(p)
    args = p.parse_args(argv)
    device = parse_device(p, args.device) or (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    sizes = args.sizes or ([1, 4] if args.quick else [1, 8, 64, 256])
    repeats = 2 if args.quick else args.repeats
    kinds = KINDS if device.type == "cuda" else ("host_memcpy",)
    if device.type != "cuda":
        print("bench copy: no CUDA device; timing a host memcpy only (the GPU rows need a GPU)")
    rows = run(sizes, device, kinds, repeats)
    print_table(rows, ["copy", "size_MB", "ms", "GB/s", "rw_GB/s", "pct_of_pinned_peak"],
                title=f"bench copy on {device} (median of {repeats}; GB = 1e9 bytes; size_MB: the --sizes given, "
                      "in MiB = 2**20 bytes)")
    pinned = [r["GB/s"] for r in rows if r["copy"] == "h2d_pinned"]
    pageable = [r["GB/s"] for r in rows if r["copy"] == "h2d_pageable"]
    figures = {"h2d_pinned_peak_GBps": max(pinned) if pinned else None,
               "h2d_pageable_peak_GBps": max(pageable) if pageable else None,
               "pinned_over_pageable": (max(pinned) / max(pageable)) if pinned and pageable else None}
    path = record("copy", config={"sizes_MB": sizes, "device": str(device), "repeats": repeats},
                  rows=rows, figures=figures, quick=args.quick, results=args.results)
    if pinned:
        print(f"pinned H2D peak {figures['h2d_pinned_peak_GBps']:.1f} GB/s, "
              f"{figures['pinned_over_pageable']:.1f}x the pageable peak")
    print(f"recorded in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
