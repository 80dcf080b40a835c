"""`gobrrr bench prefetch_busy`: the Prefetcher in the process states users have (issue 28).

One process, side by side: a fresh state, then a busy one (gobrrr/bench/prefetch_state.py: a
DataLoader(pin_memory=True) with 6 persistent workers and timm's real PrefetchLoader over another,
each iterated 45 batches and left alive). In each state, at each batch shape (default: the
independent check's 256x3x160x160 float32, 78.6 MB, then 128x3x224x224 and 64x3x224x224) and in
two regimes (an MLP of `width` whose depth makes its step take 0.6x the copy time: copy-bound, or
2.5x: compute-bound; the issue's repro is DEPTH=70 at the first shape, compute-bound):

  floor: compute   the MLP on a batch already on the GPU
  floor: copy      one pinned host-to-device copy per step
  hand-rolled      a depth-1 side stream with record_stream (the issue's)
  Prefetcher       over pinned tensors; over pageable tensors and over a DataLoader with 6 workers at
                   the first `--full-shapes` shapes
  torch peers      at those shapes, the best plain loops torch offers for the same two sources, in the same
                   state: the hand-rolled side stream over the pageable tensors (`.to(non_blocking=True)`,
                   torch's own staging), and over a DataLoader(pin_memory=True) with the same workers
  floor: workers   the worker DataLoader iterated alone (no GPU work): how fast its workers produce batches;
                   the worker rows are also set against max(compute, copy, this) (x_source)

Every row is one loop from the source's creation: 5 warm-up steps, then `--steps` timed ones, a CUDA
event after each step, so one run gives the 40-step window (steps 5-44), the whole window, the first
10 batch times and the host time spent inside next() (median). Rows run `--passes` times, the order
of the loader rows reversed every other pass; medians are kept. x_floor = ms / max(compute, copy)
measured in the same state and pass; x_hand = Prefetcher / hand-rolled, same state, pass and window.
Then, in the busy state, "just left": the other loaders are iterated again and a new loop starts at
once (their pin-memory threads are still pinning what their workers prefetched), for compute only,
the hand-rolled side stream and the Prefetcher: their first 10 batch times.

    gobrrr bench prefetch_busy                     # on a GPU, about 3 minutes; JSON to bench/results
    gobrrr bench prefetch_busy --shapes 256x160 --passes 1 --steps 200
    gobrrr bench prefetch_busy --quick             # tiny sizes on the CPU: a smoke test of the code paths
"""
from __future__ import annotations

import argparse
import gc
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from gobrrr.bench.common import Parser, add_results_option, print_table, record
from gobrrr.bench.prefetch_state import Batches, make_busy
from gobrrr.loader.prefetch import Prefetcher

TARGETS = {"Prefetcher(pinned)": 1.05, "Prefetcher(pageable)": 2.0, "Prefetcher(workers)": 1.5}
HAND_BAR = 1.03   # within 3% of the hand-rolled side stream in the same state


@dataclass
class Config:
    shapes: tuple[tuple[int, int], ...] = ((256, 160), (128, 224), (64, 224))   # (batch, side) of 3xSxS fp32
    width: int = 4096
    regimes: tuple[str, ...] = ("copy-bound", "compute-bound")
    depths: tuple[int, int] | None = None    # explicit (copy-bound, compute-bound) depths for every shape
    steps: int = 400
    window: int = 40
    warmup: int = 5
    passes: int = 2
    workers: int = 6
    full_shapes: int = 1      # pageable and worker-source rows at the first N shapes
    busy_steps: int = 45
    settle_s: float = 2.0
    device: str = "cuda"


QUICK = dict(shapes=((4, 8),), width=32, depths=(1, 2), steps=6, window=3, warmup=1, passes=1, workers=2,
             busy_steps=2, settle_s=0.0, device="cpu")
RATIO = {"copy-bound": 0.6, "compute-bound": 2.5}   # compute time / copy time


def mlp(side: int, width: int, depth: int, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """The issue's model: Flatten, Linear(3*S*S, width), ReLU, depth x (Linear(width, width), ReLU),
    Linear(width, 10)."""
    with torch.device(device):
        net = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(3 * side * side, width), torch.nn.ReLU(),
                                  *[m for _ in range(depth) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())],
                                  torch.nn.Linear(width, 10))
    return lambda x: net(x).float().sum()   # x: (B, 3, S, S); as the repro: forward only, result dropped


class Clock:
    """A timestamp after each step: a CUDA event on the current stream, or perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []
        self.start = self._mark()

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def tick(self) -> None:
        self.marks.append(self._mark())

    def times_ms(self) -> list[float]:
        """Milliseconds from the start to each tick (waits for the GPU: call after the loop)."""
        if not self.cuda:
            return [(m - self.start) * 1e3 for m in self.marks]
        torch.cuda.synchronize()   # sync: the loop is over
        return [self.start.elapsed_time(m) for m in self.marks]


def run_loop(batches, step: Callable, cfg: Config, device: torch.device, steps: int | None = None) -> dict:
    """One loop from the source's creation; per-step times from one clock."""
    steps = steps or cfg.steps
    if device.type == "cuda":
        torch.cuda.synchronize(device)   # sync: bench boundary
    clock = Clock(device)
    it = iter(batches)
    host: list[float] = []
    for _ in range(cfg.warmup + steps):
        t = time.perf_counter()
        x = next(it)
        host.append(time.perf_counter() - t)
        step(x)
        clock.tick()
    ts = clock.times_ms()
    per = [ts[0]] + [b - a for a, b in zip(ts, ts[1:])]
    w, base = min(cfg.window, steps), ts[cfg.warmup - 1] if cfg.warmup else 0.0
    return {"w_window": (ts[cfg.warmup + w - 1] - base) / w, "w_steps": (ts[-1] - base) / steps,
            "first10": [round(p, 2) for p in per[:10]], "max_ms": max(per[cfg.warmup:]),
            "host_next_ms": statistics.median(host[cfg.warmup:]) * 1e3}


def cycle(xs: list, n: int):
    for i in range(n):
        yield xs[i % len(xs)]


def hand_rolled(source, device: torch.device, n: int):
    """The issue's depth-1 side stream: copy batch i+1 on a side stream while batch i computes. `source`: a
    list of host tensors (cycled) or an iterable of them."""
    side = torch.cuda.Stream(device)
    it = cycle(source, n + 1) if isinstance(source, list) else iter(source)

    def load():
        with torch.cuda.stream(side):
            x = next(it).to(device, non_blocking=True)
        e = torch.cuda.Event()
        e.record(side)
        return x, e
    nxt = load()
    for _ in range(n):
        x, e = nxt
        torch.cuda.current_stream(device).wait_event(e)
        x.record_stream(torch.cuda.current_stream(device))
        nxt = load()   # overlap: the copy of batch i+1 with the step on batch i
        yield x


class Rows:
    """The rows of one shape: its batches, its models per regime, and how each row is run."""

    def __init__(self, cfg: Config, shape: tuple[int, int], device: torch.device):
        self.cfg, self.device, (self.batch, self.side) = cfg, device, shape
        self.cuda = device.type == "cuda"
        g = torch.Generator().manual_seed(0)
        self.pageable = [torch.randn(self.batch, 3, self.side, self.side, generator=g) for _ in range(4)]
        self.pinned = [t.pin_memory() for t in self.pageable] if self.cuda else self.pageable
        self.resident = self.pinned[0].to(device)
        self.mb = self.pageable[0].numel() * 4 / 1e6
        self.n = cfg.warmup + cfg.steps
        self.copy_ms = self.floor_copy()["w_steps"] if self.cuda else 1.0
        self.models: dict[str, Callable] = {}
        self.depths: dict[str, int] = {}

    def calibrate(self) -> None:
        """Depth per regime so that the step takes RATIO x the copy time (a line through two depths)."""
        probe = Config(**{**asdict(self.cfg), "warmup": 2, "steps": 10, "window": 10})
        t = {}
        for d in (2, 12):
            step = mlp(self.side, self.cfg.width, d, self.device)
            t[d] = run_loop(cycle([self.resident], 12), step, probe, self.device)["w_steps"]
            del step
        per_layer = max((t[12] - t[2]) / 10, 1e-4)
        for i, regime in enumerate(self.cfg.regimes):
            if self.cfg.depths is not None:
                depth = self.cfg.depths[i]
            else:
                depth = max(1, round(2 + (RATIO[regime] * self.copy_ms - t[2]) / per_layer))
            self.depths[regime] = depth
            self.models[regime] = mlp(self.side, self.cfg.width, depth, self.device)

    # rows: name -> fn(step) -> result dict
    def floor_compute(self, step=None) -> dict:
        step = step or self.models[self.cfg.regimes[0]]
        return run_loop(cycle([self.resident], self.n), step, self.cfg, self.device)

    def floor_copy(self, step=None) -> dict:
        dst = torch.empty_like(self.resident)
        return run_loop(cycle(self.pinned, self.n), lambda x: dst.copy_(x, non_blocking=True), self.cfg, self.device)

    def hand(self, step) -> dict:
        return run_loop(hand_rolled(self.pinned, self.device, self.n), step, self.cfg, self.device)

    def prefetcher(self, source, step, steps: int | None = None) -> dict:
        pf = Prefetcher(source, device=self.device)
        try:
            out = run_loop(pf, step, self.cfg, self.device, steps)
            out["setup"] = pf.describe()
            return out
        finally:
            pf.close()
            close = getattr(pf.source, "close", None)
            if callable(close) and pf.source is not source:
                close()   # the PinnedWorkerLoader made for the DataLoader: its slots go now
            del pf
            gc.collect()

    def pf_pinned(self, step, steps: int | None = None) -> dict:
        return self.prefetcher([self.pinned[i % 4] for i in range(self.n)], step, steps)

    def pf_pageable(self, step) -> dict:
        return self.prefetcher([self.pageable[i % 4] for i in range(self.n)], step)

    def worker_loader(self, pin: bool) -> DataLoader:
        return DataLoader(Batches(self.pageable, self.n + 8), batch_size=None, num_workers=self.cfg.workers,
                          persistent_workers=True, pin_memory=pin and self.cuda)

    def pf_workers(self, step) -> dict:
        return self.prefetcher(self.worker_loader(pin=False), step)

    def torch_pageable(self, step) -> dict:
        return run_loop(hand_rolled(self.pageable, self.device, self.n), step, self.cfg, self.device)

    def torch_workers(self, step) -> dict:
        dl = self.worker_loader(pin=True)
        try:
            return run_loop(hand_rolled(dl, self.device, self.n), step, self.cfg, self.device)
        finally:
            del dl
            gc.collect()

    def floor_workers(self, step=None) -> dict:
        dl = self.worker_loader(pin=False)
        try:
            return run_loop(dl, lambda x: None, self.cfg, torch.device("cpu"))
        finally:
            del dl
            gc.collect()


LOADER_ROWS = [("hand-rolled side stream", "hand", True), ("Prefetcher(pinned)", "pf_pinned", True),
               ("Prefetcher(pageable)", "pf_pageable", False), ("Prefetcher(workers)", "pf_workers", False),
               ("torch: pageable side stream", "torch_pageable", False),
               ("torch: DataLoader(pin_memory) side stream", "torch_workers", False)]
PEER = {"Prefetcher(pageable)": "torch: pageable side stream",
        "Prefetcher(workers)": "torch: DataLoader(pin_memory) side stream"}
WORKER_ROWS = ("Prefetcher(workers)", "torch: DataLoader(pin_memory) side stream")


def measure(rows: Rows, state: str, regime: str, full: bool) -> list[dict]:
    """Every row of one (state, shape, regime), `passes` times; one result row each, medians kept."""
    cfg, step = rows.cfg, rows.models[regime]
    names = [(n, m) for n, m, every_shape in LOADER_ROWS if (every_shape or full)
             and (rows.cuda or not (m == "hand" or m.startswith("torch_")))]
    res: dict[str, list[dict]] = {}
    for p in range(cfg.passes):
        floors = [("floor: compute", rows.floor_compute), ("floor: copy", rows.floor_copy)]
        for name, fn in floors + ([("floor: workers", rows.floor_workers)] if full else []):
            if fn is rows.floor_copy and not rows.cuda:
                continue
            res.setdefault(name, []).append(fn(step))
        for name, method in (names if p % 2 == 0 else names[::-1]):
            res.setdefault(name, []).append(getattr(rows, method)(step))
            print(f"  [{state} {rows.batch}x{rows.side} {regime} pass {p + 1}] {name}: "
                  f"{res[name][-1]['w_steps']:.3f} ms/step", flush=True)
    out = []
    for name, rs in res.items():
        floors = [max(c["w_steps"], x["w_steps"]) for c, x in zip(res["floor: compute"], res.get("floor: copy",
                                                                                                  res["floor: compute"]))]
        floors_w = [max(c["w_window"], x["w_window"]) for c, x in zip(res["floor: compute"],
                                                                      res.get("floor: copy", res["floor: compute"]))]
        row = {"state": state, "shape": f"{rows.batch}x3x{rows.side}x{rows.side}", "regime": regime,
               "depth": rows.depths[regime], "row": name,
               "ms": statistics.median(r["w_steps"] for r in rs),
               f"ms_{cfg.window}": statistics.median(r["w_window"] for r in rs),
               "x_floor": statistics.median(r["w_steps"] / f for r, f in zip(rs, floors)),
               f"x_floor_{cfg.window}": statistics.median(r["w_window"] / f for r, f in zip(rs, floors_w)),
               "host_next_ms": statistics.median(r["host_next_ms"] for r in rs),
               "max_ms": max(r["max_ms"] for r in rs), "first10": rs[0]["first10"],
               "setup": rs[0].get("setup", "")}
        if name in WORKER_ROWS and "floor: workers" in res:   # the source's own rate bounds these rows too
            src = [max(f, w["w_steps"]) for f, w in zip(floors, res["floor: workers"])]
            src_w = [max(f, w["w_window"]) for f, w in zip(floors_w, res["floor: workers"])]
            row["x_source"] = statistics.median(r["w_steps"] / f for r, f in zip(rs, src))
            row[f"x_source_{cfg.window}"] = statistics.median(r["w_window"] / f for r, f in zip(rs, src_w))
        peer = res.get(PEER.get(name, ""))
        if peer:
            row["x_peer"] = statistics.median(r["w_steps"] / h["w_steps"] for r, h in zip(rs, peer))
            row[f"x_peer_{cfg.window}"] = statistics.median(r["w_window"] / h["w_window"] for r, h in zip(rs, peer))
        hand = res.get("hand-rolled side stream")
        if name.startswith("Prefetcher") and hand:
            row["x_hand"] = statistics.median(r["w_steps"] / h["w_steps"] for r, h in zip(rs, hand))
            row[f"x_hand_{cfg.window}"] = statistics.median(r["w_window"] / h["w_window"] for r, h in zip(rs, hand))
        out.append(row)
    return out


def just_left(rows: Rows, busy, regime: str) -> list[dict]:
    """A loop started right after the other loaders ran again: first 10 batch times, per loop kind."""
    step = rows.models[regime]
    out = []
    kinds = [("floor: compute", lambda: rows.floor_compute(step)),
             ("Prefetcher(pinned)", lambda: rows.pf_pinned(step))]
    if rows.cuda:
        kinds.insert(1, ("hand-rolled side stream", lambda: rows.hand(step)))
    for name, fn in kinds:
        busy.touch(step, rows.device, rows.cfg.busy_steps)
        r = fn()
        out.append({"row": name, "regime": regime, "first10": r["first10"], f"ms_{rows.cfg.window}": r["w_window"],
                    "ms": r["w_steps"], "max_ms": r["max_ms"]})
        print(f"  [just left] {name}: first 10 batches {r['first10']}", flush=True)
    return out


def run(cfg: Config, results: list[dict]) -> tuple[list[dict], str]:
    """Every (state, shape, regime), rows appended to `results` as they are measured (what a run stopped
    early still records); then the "just left" loops. Returns those and the busy state's note."""
    device = torch.device(cfg.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    shapes = [Rows(cfg, s, device) for s in cfg.shapes]
    for r in shapes:
        r.calibrate()
        print(f"{r.batch}x3x{r.side}x{r.side} ({r.mb:.1f} MB): copy {r.copy_ms:.2f} ms; depths {r.depths}", flush=True)
    for state in ("fresh", "busy"):
        if state == "busy":
            first = shapes[0]
            busy = make_busy(first.pageable, first.models[cfg.regimes[-1]], device, cfg.workers, cfg.busy_steps)
            print(f"busy state built in {busy.built_s:.1f} s" + (f"; {busy.note}" if busy.note else ""), flush=True)
            time.sleep(cfg.settle_s)   # the other loaders' pin-memory threads finish their queues
        for i, r in enumerate(shapes):
            for regime in cfg.regimes:
                results += measure(r, state, regime, full=i < cfg.full_shapes)
    startup = just_left(shapes[0], busy, cfg.regimes[-1])
    note = busy.note
    busy.close()
    return startup, note


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    p = Parser(prog="gobrrr bench prefetch_busy", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes on the CPU: a smoke test of the code paths")
    p.add_argument("--shapes", help="batch shapes BxS (3xSxS fp32), comma-separated, e.g. 256x160,64x224")
    p.add_argument("--steps", type=int, help="timed steps per row (default 400; the short window is 40)")
    p.add_argument("--passes", type=int, help="passes over the rows (default 2)")
    p.add_argument("--full-shapes", type=int, help="shapes that also run the pageable and worker rows (default 1)")
    p.add_argument("--depths", help="explicit MLP depths COPY,COMPUTE instead of calibrating")
    add_results_option(p)
    args = p.parse_args(argv)
    kw: dict[str, Any] = dict(QUICK) if args.quick else {}
    try:
        if args.shapes:
            kw["shapes"] = tuple(tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(","))
            if any(len(s) != 2 or min(s) < 1 for s in kw["shapes"]):
                raise ValueError
        if args.depths:
            kw["depths"] = tuple(int(d) for d in args.depths.split(","))
    except ValueError:
        p.error("--shapes takes BxS pairs such as 256x160 and --depths two integers such as 20,70")
    for k in ("steps", "passes", "full_shapes"):
        if getattr(args, k) is not None:
            kw[k] = getattr(args, k)
    cfg = Config(**kw)
    if cfg.steps < cfg.window or cfg.passes < 1:
        p.error(f"--steps must be at least the {cfg.window}-step window and --passes at least 1")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device here; run it on a GPU machine (or --quick on the CPU)")
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse(argv)
    t0 = time.perf_counter()
    rows: list[dict] = []
    startup, note, partial = [], "", ""

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    old = signal.signal(signal.SIGTERM, stop)   # `timeout` sends SIGTERM: keep what was measured
    try:
        startup, note = run(cfg, rows)
    except KeyboardInterrupt as e:
        partial = f"stopped early ({e or 'Ctrl-C'}); the rows measured before that are recorded"
        print(f"\ngobrrr bench prefetch_busy: {partial}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, old)
    w = cfg.window
    print_table(rows, ["state", "shape", "regime", "depth", "row", "ms", f"ms_{w}", "x_floor", f"x_floor_{w}",
                       "x_hand", f"x_hand_{w}", "x_peer", f"x_peer_{w}", "x_source", "host_next_ms", "max_ms"],
                title=f"\nms/step over {cfg.steps} steps and the first {w} (after {cfg.warmup} warm-up); median of "
                      f"{cfg.passes} pass(es); x_floor: / max(compute, copy) of that state; x_hand: / hand-rolled; "
                      "x_peer: / torch's own loop over the same source; x_source: / max(compute, copy, workers alone)")
    print("\nfirst 10 batch times (ms) of each Prefetcher, busy state:")
    for r in rows:
        if r["state"] == "busy" and r["row"].startswith("Prefetcher"):
            print(f"  {r['shape']} {r['regime']:<13} {r['row']:<20} {r['first10']}")
    print("\njust left (a loop started right after the other loaders ran again):")
    for r in startup:
        print(f"  {r['row']:<24} first 10 {r['first10']}  ({r[f'ms_{w}']:.2f} ms/step over {w})")
    if note:
        print(f"\nnote: {note}")
    print("\ntargets (issue 28)" + ("" if cfg.device.startswith("cuda") else " (CPU run: not meaningful)") + ":")
    figures: dict[str, float] = {}
    for r in rows:
        t = TARGETS.get(r["row"])
        if t is None:
            continue
        for win, xf, xh in (("all", "x_floor", "x_hand"), (str(w), f"x_floor_{w}", f"x_hand_{w}")):
            key = f"{r['state']} | {r['shape']} | {r['regime']} | {r['row']} | {win}"
            figures[key + " | x_floor"] = r[xf]
            verdict = "met" if r[xf] <= t else "MISSED"
            tail = ""
            if r["row"] == "Prefetcher(pinned)" and xh in r:
                figures[key + " | x_hand"] = r[xh]
                tail = f"; {r[xh]:.3f}x hand-rolled (<= {HAND_BAR}): {'met' if r[xh] <= HAND_BAR else 'MISSED'}"
            xp, xs = ("x_peer", "x_source") if win == "all" else (f"x_peer_{w}", f"x_source_{w}")
            if xp in r:
                figures[key + " | x_peer"] = r[xp]
                tail += f"; {r[xp]:.2f}x torch's own loop"
            if xs in r:
                figures[key + " | x_source"] = r[xs]
                tail += f"; {r[xs]:.2f}x max(compute, copy, workers alone)"
            print(f"  {r['state']:<5} {r['shape']:<15} {r['regime']:<13} {r['row']:<20} {win:>3} steps: "
                  f"{r[xf]:.2f}x floor (<= {t}): {verdict}{tail}")
    extra = {"partial": partial} if partial else {}
    path = record("prefetch_busy", config=asdict(cfg), rows=rows, figures=figures, startup=startup, note=note,
                  wall_s=time.perf_counter() - t0, quick=args.quick, results=args.results, **extra)
    print(f"\n{len(rows)} rows in {time.perf_counter() - t0:.0f} s; appended to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
