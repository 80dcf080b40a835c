"""`gobrrr bench syncwatch`: what the sync detective costs a launch-bound loop.

One step = `--kernels` tiny elementwise kernels on a (256,) tensor, then `--reads` host reads of a
scalar (`.item()`, a real sync, like reading the loss). Two scenarios in one run: reads=0 (pure
launches: what arming the detective costs when nothing syncs) and reads=1 (one sync per step).
Modes, measured side by side:

    off              gobrrr.syncs.watch never imported: a fresh child process, alternated with ...
    imported         ... a child that imports it first (nobody watching): A/B/A/B child pairs,
                     so the import's cost is measured against clock drift, not beside it
    not_watching     in this process, imported, nobody watching: the baseline of the rows below
    count            inside `watch_syncs()`                       target: <= 5% over not_watching
    warn             inside `watch_syncs("warn")`
    torch_warn       torch.cuda.set_sync_debug_mode("warn") alone (torch's prototype, for reference)

The in-process modes run round-robin (repeat r of every mode before repeat r+1) so clock drift
hits them alike. The process (and its children) is pinned to two CPUs, so that every measurement
runs on the same cores: on the H200 host an unpinned launch-bound loop moved by +-10% between
repeats, more than the effect measured. Every figure is the best (min) ms/step over repeats, as
timeit reports: interference only adds time, so the best run is the loop's own cost (--stat median
for the median).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings

import torch

from gobrrr.bench.common import Parser, add_results_option, median, parse_device, positive, print_table, record

MODES = ("not_watching", "count", "warn", "torch_warn")  # in-process, round-robin
CHILD_MODES = ("off", "imported")  # fresh child processes, alternated


def loop(x: torch.Tensor, steps: int, kernels: int, reads: int) -> float:
    """Run `steps` steps; return ms per step (wall clock, the queue drained at both ends)."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()  # sync: drain the queue before the clock starts (benchmark harness, outside any watch)
    t0 = time.perf_counter()
    for _ in range(steps):
        for _ in range(kernels):
            x = x * 0.999 + 0.001           # two tiny kernels' worth of launch overhead per line
        for _ in range(reads):
            x.sum().item()  # gobrrr: ignore[GB002] the sync under test
    sync()  # sync: end of the timed region
    return (time.perf_counter() - t0) * 1e3 / steps


def run_mode(mode: str, x: torch.Tensor, steps: int, kernels: int, reads: int) -> tuple[float, int]:
    """ms/step and syncs counted per step for one mode."""
    if mode == "not_watching":
        return loop(x, steps, kernels, reads), 0
    if mode == "torch_warn":
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # as a user silencing the flood would; the check still runs
                return loop(x, steps, kernels, reads), 0
        finally:
            torch.cuda.set_sync_debug_mode(0)
    from gobrrr.syncs.watch import watch_syncs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)  # warn mode's one warning per site, silenced
        with watch_syncs(mode) as report:
            ms = loop(x, steps, kernels, reads)
    # the two harness syncs in loop() sit inside the block: take them out of the per-step count
    harness = 2 if x.is_cuda else 0
    return ms, (report.count - harness) // steps


def child_ms(mode: str, args: argparse.Namespace, reads: int) -> float:
    """Median ms/step of `loop` in a fresh interpreter that imports the detective only if `mode` says so."""
    code = (
        "import sys, torch\n"
        + ("import gobrrr.syncs.watch\n" if mode == "imported" else "")
        + "from gobrrr.bench.syncwatch import loop\n"
        + "from statistics import median\n"
        + f"x = torch.randn(256, device={args.device!r})\n"
        + f"loop(x, {max(args.steps // 5, 2)}, {args.kernels}, {reads})\n"
        + f"print({args.stat}([loop(x, {args.steps}, {args.kernels}, {reads}) for _ in range({args.repeats})]))\n"
        + ("assert 'gobrrr.syncs.watch' not in sys.modules\n" if mode == "off" else "")
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return float(out.stdout.strip().splitlines()[-1])


def patched_attributes() -> int:
    """How many torch attributes the detective has replaced right now (0 when nobody watches)."""
    from gobrrr.syncs import rules as sync_rules
    from gobrrr.syncs import watch as syncs

    mine = syncs.__file__
    return sum(1 for owner, name, _ in sync_rules.targets()
               if getattr(getattr(getattr(owner, name, None), "__code__", None), "co_filename", None) == mine)


def _pin_two_cpus() -> list[int] | None:
    """Pin this process (children inherit it) to two of its CPUs: the host thread plus one for the
    CUDA driver's helper threads. None where the OS has no affinity call."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, cpus)
    return cpus


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="gobrrr bench syncwatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", type=positive(int), default=64, help="tiny kernels per step (default 64)")
    p.add_argument("--steps", type=positive(int), default=300, help="steps per measurement (default 300)")
    p.add_argument("--repeats", type=positive(int), default=9, help="measurements per mode (default 9)")
    p.add_argument("--stat", choices=("min", "median"), default="min",
                   help="figure over the repeats: min (default, as timeit) or median")
    p.add_argument("--no-pin", action="store_true", help="do not pin the process to two CPUs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--child-pairs", type=positive(int), default=4,
                   help="off/imported child-process pairs, alternated (default 4)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke run in a few seconds")
    add_results_option(p)
    args = p.parse_args(argv)
    parse_device(p, args.device)  # a one-line error for a device this machine lacks, before any timing
    old_cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pinned = _pin_two_cpus() if not args.no_pin else None
    try:
        return _run(args, pinned)
    finally:
        if pinned and old_cpus:
            os.sched_setaffinity(0, old_cpus)  # main() may run inside a larger process (the CLI, tests)


def _run(args: argparse.Namespace, pinned: list[int] | None) -> int:
    if args.quick:
        args.kernels, args.steps, args.repeats, args.child_pairs = 8, 20, 3, 1
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    modes = [m for m in MODES if cuda or m != "torch_warn"]  # sync debug mode exists only on CUDA
    x = torch.randn(256, device=device)  # (256,)

    rows, figures = [], {}
    stat = min if args.stat == "min" else median
    import gobrrr.syncs.watch  # noqa: F401  (in this process: imported, nobody watching)

    for reads in (0, 1):
        loop(x, max(args.steps // 5, 2), args.kernels, reads)  # warm up: kernels loaded, clocks up
        times: dict[str, list[float]] = {m: [] for m in list(CHILD_MODES) + modes}
        counted: dict[str, int] = {m: 0 for m in modes}
        for _ in range(args.child_pairs):  # off / imported: A, B, A, B ... in fresh processes
            for m in CHILD_MODES:
                times[m].append(child_ms(m, args, reads))
        for m in modes:  # one untimed pass: first-use costs (patch tables, source lines) out of the way
            run_mode(m, x, max(args.steps // 5, 2), args.kernels, reads)
        for _ in range(args.repeats):
            for m in modes:
                ms, per_step = run_mode(m, x, args.steps, args.kernels, reads)
                times[m].append(ms)
                counted[m] = per_step
        for m in list(CHILD_MODES) + modes:
            base = stat(times["off" if m in CHILD_MODES else "not_watching"])
            ms = stat(times[m])
            rows.append({"reads/step": reads, "mode": m, "ms/step": ms,
                         "vs": "off" if m in CHILD_MODES else "not_watching", "ratio": ms / base,
                         "overhead %": (ms / base - 1) * 100,
                         "syncs counted/step": counted[m] if m in ("count", "warn") else None})
            figures[f"reads{reads}_{m}_overhead_pct"] = (ms / base - 1) * 100
    figures["patched_while_not_watching"] = patched_attributes()

    print_table(rows, title=f"sync detective overhead on {args.kernels} tiny kernels/step, {device} "
                            f"({args.stat} of {args.repeats} x {args.steps} steps; CPUs {pinned or 'not pinned'})")
    print(f"torch attributes patched while nobody watches: {figures['patched_while_not_watching']} (must be 0)")
    for reads in (0, 1):
        c, i = figures[f"reads{reads}_count_overhead_pct"], figures[f"reads{reads}_imported_overhead_pct"]
        print(f"reads/step={reads}: count {c:+.2f}% (target <= 5%: {'ok' if c <= 5 else 'OVER'}), "
              f"imported {i:+.2f}% (target <= 1%: {'ok' if i <= 1 else 'OVER'})")
    path = record("syncwatch", config={"kernels": args.kernels, "steps": args.steps, "repeats": args.repeats,
                                       "child_pairs": args.child_pairs, "device": str(device),
                                       "stat": args.stat, "cpus": pinned}, rows=rows, figures=figures,
                  quick=args.quick, results=args.results)
    print(f"results appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
