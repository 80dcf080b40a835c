"""`gobrrr bench syncwatch`: what the sync detective costs a launch-bound loop.

One step = `--kernels` tiny elementwise kernels on a (256,) tensor, then `--reads` host reads of a
scalar (`.item()`, a real sync, like reading the loss). Two scenarios in one run: reads=0 (pure
launches: what arming the detective costs when nothing syncs) and reads=1 (one sync per step).
Modes, measured side by side:

    off              gobrrr.device.syncs not imported yet (measured first, before the import)
    imported         imported, nobody watching: nothing is patched, so this must match `off`
    count            inside `watch_syncs()`                       target: <= 5% over off
    warn             inside `watch_syncs("warn")`
    torch_warn       torch.cuda.set_sync_debug_mode("warn") alone (torch's prototype, for reference)

After the import the watched modes run round-robin (repeat r of every mode before repeat r+1) so
clock drift hits them alike; the figure is the median ms/step over repeats.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

from bench.common import median, print_table, record

MODES = ("off", "imported", "count", "warn", "torch_warn")


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
    if mode in ("off", "imported"):
        return loop(x, steps, kernels, reads), 0
    if mode == "torch_warn":
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # as a user silencing the flood would; the check still runs
                return loop(x, steps, kernels, reads), 0
        finally:
            torch.cuda.set_sync_debug_mode(0)
    from gobrrr.device.syncs import watch_syncs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)  # warn mode's one warning per site, silenced
        with watch_syncs(mode) as report:
            ms = loop(x, steps, kernels, reads)
    # the two harness syncs in loop() sit inside the block: take them out of the per-step count
    harness = 2 if x.is_cuda else 0
    return ms, (report.count - harness) // steps


def patched_attributes() -> int:
    """How many torch attributes the detective has replaced right now (0 when nobody watches)."""
    from gobrrr.device import sync_rules, syncs

    mine = syncs.__file__
    return sum(1 for owner, name, _ in sync_rules.targets()
               if getattr(getattr(getattr(owner, name, None), "__code__", None), "co_filename", None) == mine)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gobrrr bench syncwatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", type=int, default=64, help="tiny kernels per step (default 64)")
    p.add_argument("--steps", type=int, default=300, help="steps per measurement (default 300)")
    p.add_argument("--repeats", type=int, default=7, help="measurements per mode; the median is reported")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a CPU smoke run in a few seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.kernels, args.steps, args.repeats = 8, 20, 3
    if "gobrrr.device.syncs" in sys.modules:
        print("note: gobrrr.device.syncs was already imported, so `off` is measured after the import too")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    modes = [m for m in MODES if cuda or m != "torch_warn"]  # sync debug mode exists only on CUDA
    x = torch.randn(256, device=device)  # (256,)

    rows, figures = [], {}
    for reads in (0, 1):
        loop(x, max(args.steps // 5, 2), args.kernels, reads)  # warm up: kernels loaded, clocks up
        times: dict[str, list[float]] = {m: [] for m in modes}
        counted: dict[str, int] = {m: 0 for m in modes}
        for _ in range(args.repeats):  # `off` first, before anything imports the detective
            times["off"].append(run_mode("off", x, args.steps, args.kernels, reads)[0])
        import gobrrr.device.syncs  # noqa: F401  (from here on: `imported`)

        for m in modes[1:]:  # one untimed pass: first-use costs (patch tables, source lines) out of the way
            run_mode(m, x, max(args.steps // 5, 2), args.kernels, reads)
        for _ in range(args.repeats):
            for m in modes[1:]:
                ms, per_step = run_mode(m, x, args.steps, args.kernels, reads)
                times[m].append(ms)
                counted[m] = per_step
        base = median(times["off"])
        for m in modes:
            ms = median(times[m])
            rows.append({"reads/step": reads, "mode": m, "ms/step": ms, "vs off": ms / base,
                         "overhead %": (ms / base - 1) * 100, "syncs counted/step": counted[m] if m in ("count", "warn") else None})
            figures[f"reads{reads}_{m}_overhead_pct"] = (ms / base - 1) * 100
    figures["patched_while_not_watching"] = patched_attributes()

    print_table(rows, title=f"sync detective overhead on {args.kernels} tiny kernels/step, {device} "
                            f"(median of {args.repeats} x {args.steps} steps)")
    print(f"torch attributes patched while nobody watches: {figures['patched_while_not_watching']} (must be 0)")
    for reads in (0, 1):
        c, i = figures[f"reads{reads}_count_overhead_pct"], figures[f"reads{reads}_imported_overhead_pct"]
        print(f"reads/step={reads}: count {c:+.2f}% (target <= 5%: {'ok' if c <= 5 else 'OVER'}), "
              f"imported {i:+.2f}% (target <= 1%: {'ok' if i <= 1 else 'OVER'})")
    path = record("syncwatch", config={"kernels": args.kernels, "steps": args.steps, "repeats": args.repeats,
                                       "device": str(device)}, rows=rows, figures=figures)
    print(f"results appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
