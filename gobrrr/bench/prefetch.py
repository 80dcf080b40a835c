"""`gobrrr bench prefetch`: how close each way of feeding a batch gets to the floor that binds it.

One run, side by side, on an image batch of 256x3x160x160 float32 (78.6 MB) and an MLP in TF32
whose depth sets two regimes: copy-bound (compute ~0.8 ms) and compute-bound (~2.1 ms on an H200).
The depth is chosen at start by timing the MLP alone (or given with --depths).

Floors (each measured here, in this run):
  compute   the MLP on a batch already on the GPU
  copy      one pinned host-to-device copy of the batch
  prod      the 6 DataLoader workers building batches into private memory (a reused buffer),
            nothing crossing to the main process or the GPU; the same workers building into
            fresh memory (what default_collate does) is shown as an info row
  prod, pre-batched   the same workers taking whole batches from a dataset (DataLoader with
            batch_size=None) and copying each into a reused private buffer: what a worker must do
            at least to hand a batch over
  memcpy    the host's pageable -> pinned copy of one batch (libc memmove and the ring's streaming
            copy, on 12 and 16 threads, the best kept) into 5 pinned buffers in turn while the copy
            engine reads another: the ceiling for pageable in-process tensors, which must cross host
            memory once more
Every row is reported as ms/step and as a ratio to the floor that binds it:
max(copy, compute) for in-process sources, max(copy, compute, prod) for worker sources,
max(copy, compute, prod pre-batched) for the batch_size=None and IterableDataset sources; the
pageable row also as a share of max(memcpy, copy, compute). Prefetcher rows print the depth and
the ring they ran through (slots per worker, pinned slots).

Then a pass in a busy process (gobrrr/bench/prefetch_state.py): a DataLoader(pin_memory=True) with 6 persistent
workers and timm's PrefetchLoader over another are iterated and left alive mid-epoch, and
the in-process rows run again 1.5 s later (steady state; gobrrr/bench/prefetch_busy.py looks at the
first half second, while their pin-memory threads are still filling their queues).

Every worker row, the production floor included, is one epoch of freshly forked workers over the
same dataset, timed over the same steps: the fork, the first batches and each worker's first touch
of the memory it writes (its private buffer; its 4 ring slots, batches 0-23) fall inside the 30
warmup steps, so no row pays a start-up cost the floor does not.

    python -m gobrrr.bench.prefetch            # full run on a GPU (about 3 minutes; --no-busy skips the busy pass)
    python -m gobrrr.bench.prefetch --kinds workers --repeats 3
                                        # worker rows only, 3 interleaved passes: the median and the
                                        # spread (min-max), since the workers' own rate moves between runs
    python -m gobrrr.bench.prefetch --quick    # tiny sizes on the CPU: a smoke test of every code path
"""
from __future__ import annotations

import argparse
import gc
import multiprocessing
import signal
import statistics
import time
import traceback
from dataclasses import asdict
from typing import Any

import torch
from torch.utils.data import DataLoader

from gobrrr.bench.common import add_results_option, print_table, record
from gobrrr.bench.prefetch_data import (
    QUICK,
    BatchStream,
    CollateReused,
    Config,
    CopyReused,
    Frames,
    PreBatched,
    calibrate,
    collate_fresh,
    first,
    memcpy_floor,
    mlp,
    settle,
    timed_loop,
)
from gobrrr.bench.prefetch_state import make_busy, timm_prefetch_loader
from gobrrr.loader.worker_ring import PinnedWorkerLoader

# ---------------------------------------------------------------- the rows

class Rows:
    """Every way of feeding the model, each a method returning ms/step."""

    def __init__(self, cfg: Config, dev: torch.device):
        self.cfg, self.dev = cfg, dev
        self.cuda = dev.type == "cuda"
        g = torch.Generator().manual_seed(0)
        shape = (cfg.batch, 3, cfg.side, cfg.side)
        self.pageable = [torch.randn(shape, generator=g) for _ in range(2)]   # 2 x (B, 3, S, S)
        self.pinned = [t.pin_memory() for t in self.pageable] if self.cuda else self.pageable
        self.images = torch.cat(self.pageable)                                # (2B, 3, S, S)
        self.nbytes = self.pageable[0].numel() * 4
        self.n = cfg.warmup + cfg.steps
        self.acc = torch.zeros((), device=dev)
        self.setup: dict[str, str] = {}   # method -> what the row ran through (Prefetcher depth, ring slots)

    def dataset(self) -> Frames:
        return Frames(self.images, (self.n + 2) * self.cfg.batch)

    def loader(self, **kw) -> DataLoader:
        return DataLoader(self.dataset(), batch_size=self.cfg.batch, num_workers=self.cfg.workers, **kw)

    # floors
    def compute(self, model):
        x = self.pageable[0].to(self.dev)
        return timed_loop(range(self.n), lambda _: self.acc.add_(model(x)), self.cfg, self.dev)

    def copy(self, model):
        dst = torch.empty_like(self.pinned[0], device=self.dev)
        return timed_loop(range(self.n), lambda i: dst.copy_(self.pinned[i % 2], non_blocking=True),
                          self.cfg, self.dev)

    def production(self, model, collate=None):
        dl = self.loader(collate_fn=collate or CollateReused())
        return timed_loop(dl, lambda _: None, self.cfg, self.dev)

    def production_fresh(self, model):
        return self.production(model, collate_fresh)

    def production_prebatched(self, model):
        dl = self.prebatched_loader(collate_fn=CopyReused())
        return timed_loop(dl, lambda _: None, self.cfg, self.dev)

    def memcpy(self, model):
        """Host memcpy ceiling (bench/prefetch_data.memcpy_floor); what was tried goes to `setup`."""
        best, self.setup["memcpy"] = memcpy_floor(self.pageable, self.nbytes, self.cfg, self.dev)
        return best

    def prebatched_loader(self, stream: bool = False, **kw) -> DataLoader:
        ds = (BatchStream if stream else PreBatched)(self.pageable, self.n + 2)
        return DataLoader(ds, batch_size=None, num_workers=self.cfg.workers, **kw)

    def ring_alone(self, model):
        """The worker ring's own rate: each lease released at once, nothing copied to the GPU."""
        ring = PinnedWorkerLoader.from_dataloader(self.loader())
        try:
            return timed_loop(ring, lambda lease: lease.release(None), self.cfg, self.dev)
        finally:
            ring.close()

    # in-process sources
    def naive(self, model):
        def step(i):
            x = self.pageable[i % 2].to(self.dev)
            model(x).item()  # the habit being measured: a host sync every step
        return timed_loop(range(self.n), step, self.cfg, self.dev)

    def pinned_same_stream(self, model):
        def step(i):
            x = self.pinned[i % 2].to(self.dev, non_blocking=True)
            self.acc.add_(model(x))
        return timed_loop(range(self.n), step, self.cfg, self.dev)

    def side_stream(self, model):
        """Hand-rolled: copy batch i+1 on a side stream while batch i computes."""
        copy_stream = torch.cuda.Stream(self.dev)

        def fetch(i):
            with torch.cuda.stream(copy_stream):
                x = self.pinned[i % 2].to(self.dev, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(copy_stream)
            return x, ev

        state = {"next": fetch(0)}

        def step(i):
            x, ev = state["next"]
            torch.cuda.current_stream(self.dev).wait_event(ev)
            x.record_stream(torch.cuda.current_stream(self.dev))
            state["next"] = fetch(i + 1)   # overlap: copy of batch i+1 with the compute of batch i
            self.acc.add_(model(x))
        return timed_loop(range(self.n), step, self.cfg, self.dev)

    def prefetcher_pinned(self, model):
        return self._prefetcher([self.pinned[i % 2] for i in range(self.n)], model, "prefetcher_pinned")

    def prefetcher_pageable(self, model):
        return self._prefetcher([self.pageable[i % 2] for i in range(self.n)], model, "prefetcher_pageable")

    # worker sources
    def dataloader_pinned(self, model):
        dl = self.loader(pin_memory=self.cuda)
        return timed_loop(dl, lambda b: self.acc.add_(model(b[0].to(self.dev, non_blocking=True))),
                          self.cfg, self.dev)

    def timm_prefetch(self, model):
        prefetch_loader, _ = timm_prefetch_loader()   # the real timm (the row needs it)
        dl = self.loader(pin_memory=True)
        pl = prefetch_loader(dl, mean=(0.0,) * 3, std=(1.0,) * 3, channels=3, device=self.dev)
        return timed_loop(pl, lambda b: self.acc.add_(model(b[0])), self.cfg, self.dev)

    def prefetcher_workers(self, model):
        return self._prefetcher(self.loader(), model, "prefetcher_workers")

    def dataloader_prebatched(self, model):
        dl = self.prebatched_loader(pin_memory=self.cuda)
        return timed_loop(dl, lambda b: self.acc.add_(model(b[0].to(self.dev, non_blocking=True))),
                          self.cfg, self.dev)

    def prefetcher_prebatched(self, model):
        return self._prefetcher(self.prebatched_loader(), model, "prefetcher_prebatched")

    def prefetcher_stream(self, model):
        return self._prefetcher(self.prebatched_loader(stream=True), model, "prefetcher_stream")

    def ring_side_stream(self, model):
        """Our worker ring with a hand-rolled side-stream copy: the ring alone, without the Prefetcher."""
        ring = PinnedWorkerLoader.from_dataloader(self.loader())
        copy_stream = torch.cuda.Stream(self.dev) if self.cuda else None
        it = iter(ring)

        def fetch():
            lease = next(it)
            x = lease.batch[0]                       # (B, 3, S, S) view of a page-locked slot
            if not self.cuda:
                x = x.clone()
                lease.release(None)
                return x, None
            with torch.cuda.stream(copy_stream):
                x = x.to(self.dev, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(copy_stream)
            lease.release(ev)                        # the slot is reused once this copy is done
            return x, ev

        state = {"next": fetch()}

        def step(_):
            x, ev = state["next"]
            if ev is not None:
                torch.cuda.current_stream(self.dev).wait_event(ev)
                x.record_stream(torch.cuda.current_stream(self.dev))
            try:
                state["next"] = fetch()              # overlap: copy of the next batch with this compute
            except StopIteration:
                pass
            self.acc.add_(model(x))
        try:
            return timed_loop(range(self.n), step, self.cfg, self.dev)
        finally:
            it = state = None  # free the ring and its batches (the closures are done with them)
            ring.close()

    def _prefetcher(self, source, model, method: str):
        from gobrrr.loader.prefetch import Prefetcher
        pf = Prefetcher(source, device=self.dev)
        try:
            it = iter(pf)
            ms = timed_loop(it, lambda b: self.acc.add_(model(first(b))), self.cfg, self.dev)
            self.setup[method] = pf.describe()   # while the epoch is open: the ring is made and live
            return ms
        finally:
            it = None
            del pf
            gc.collect()


# name, method, kind ("floor" / "info" / "in-process" / "workers"), needs
ROWS = [
    ("floor: compute only", "compute", "floor", ()),
    ("floor: copy only (pinned H2D)", "copy", "floor", ("cuda",)),
    ("floor: workers' production (reused private buffer)", "production", "floor", ()),
    ("floor: workers' production, pre-batched (copy into a reused buffer)", "production_prebatched", "floor", ()),
    ("floor: host memcpy pageable -> pinned (DMA running)", "memcpy", "floor", ()),
    ("info: workers' production into fresh memory", "production_fresh", "info", ()),
    ("info: PinnedWorkerLoader alone (no copy)", "ring_alone", "info", ()),
    ("naive: pageable .to() + .item()", "naive", "in-process", ()),
    ("pinned non_blocking, compute stream", "pinned_same_stream", "in-process", ("cuda",)),
    ("hand-rolled side-stream prefetch", "side_stream", "in-process", ("cuda",)),
    ("Prefetcher(pinned tensors)", "prefetcher_pinned", "in-process", ("prefetcher",)),
    ("Prefetcher(pageable tensors)", "prefetcher_pageable", "in-process", ("prefetcher",)),
    ("DataLoader(workers, pin_memory) + non_blocking", "dataloader_pinned", "workers", ()),
    ("timm PrefetchLoader(that DataLoader)", "timm_prefetch", "workers", ("cuda", "timm")),
    ("Prefetcher(DataLoader with workers)", "prefetcher_workers", "workers", ("prefetcher",)),
    ("PinnedWorkerLoader + hand-rolled side stream", "ring_side_stream", "workers", ()),
    ("DataLoader(batch_size=None, workers, pin_memory) + non_blocking", "dataloader_prebatched", "prebatched", ()),
    ("Prefetcher(DataLoader batch_size=None, workers)", "prefetcher_prebatched", "prebatched", ("prefetcher",)),
    ("Prefetcher(DataLoader(IterableDataset of batches), workers)", "prefetcher_stream", "prebatched", ("prefetcher",)),
]

# the busy pass: these rows again, in a process where other loaders ran first and were left alive
BUSY_ROWS = ("compute", "copy", "side_stream", "prefetcher_pinned", "prefetcher_pageable")


# issue 3's targets, as ratios to the binding floor
TARGETS = {"Prefetcher(pinned tensors)": 1.05, "Prefetcher(pageable tensors)": 2.0,
           "Prefetcher(DataLoader with workers)": 1.5,
           "Prefetcher(DataLoader batch_size=None, workers)": 1.5,
           "Prefetcher(DataLoader(IterableDataset of batches), workers)": 1.5}


def _available(needs, cuda: bool) -> str | None:
    """None when the row can run here, else why not."""
    if "cuda" in needs and not cuda:
        return "needs CUDA"
    if "timm" in needs:
        loader, why = timm_prefetch_loader()
        if loader is None:
            return why
    if "prefetcher" in needs:
        try:
            from gobrrr.loader.prefetch import Prefetcher  # noqa: F401
        except ImportError as e:
            return f"Prefetcher not importable ({e})"
    return None


def _measure(bench: "Rows", cfg: Config, regime: str, depth: int, model, rows: list) -> list[dict[str, Any]]:
    """Run `rows` (ROWS entries) `cfg.repeats` times interleaved; one result row each, with x_floor."""
    times: dict[str, list[float]] = {method: [] for _, method, _, _ in rows}
    why_not: dict[str, str | None] = {method: _available(needs, bench.cuda) for _, method, _, needs in rows}
    alive = frozenset(p.pid for p in multiprocessing.active_children())   # a busy pass's loaders
    for r in range(cfg.repeats):  # interleaved passes: drift between passes hits every row alike
        for name, method, kind, needs in rows:
            if why_not[method] is not None:
                continue
            try:
                with torch.no_grad():
                    ms = getattr(bench, method)(model)
                times[method].append(ms)
                pass_ = f" (pass {r + 1}/{cfg.repeats})" if cfg.repeats > 1 else ""
                setup = f"  [{bench.setup[method]}]" if method in bench.setup else ""
                print(f"  [{regime}] {name}{pass_}: {ms:.3f} ms/step{setup}", flush=True)
            except Exception as e:  # one broken row must not cost the whole (GPU) run
                traceback.print_exc()
                why_not[method] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
            settle(keep=alive)  # the row's workers are gone before the next row starts
    measured = {m: statistics.median(t) for m, t in times.items() if t and why_not[m] is None}
    for name, method, _, _ in rows:
        if why_not[method]:
            print(f"  [{regime}] {name}: skipped ({why_not[method]})", flush=True)
    # the floor that binds each kind of row
    in_proc = max((measured[k] for k in ("compute", "copy") if k in measured), default=None)
    floor_of = {"in-process": in_proc,
                "workers": max((measured[k] for k in ("compute", "copy", "production") if k in measured), default=None),
                "prebatched": max((measured[k] for k in ("compute", "copy", "production_prebatched")
                                   if k in measured), default=None)}
    out = []
    for name, method, kind, _ in rows:
        ms = measured.get(method)
        floor = floor_of.get(kind)
        row = {"regime": regime, "depth": depth, "row": name, "kind": kind, "ms_per_step": ms,
               "x_floor": (ms / floor) if (ms is not None and floor) else None,
               "GB/s": (bench.nbytes / ms / 1e6) if (ms and method != "compute") else None,
               "min-max ms": (f"{min(times[method]):.2f}-{max(times[method]):.2f}"
                              if method in measured and cfg.repeats > 1 else ""),
               "setup": bench.setup.get(method, ""), "note": why_not[method] or ""}
        if method == "prefetcher_pageable" and ms and "memcpy" in measured:
            # pageable batches cannot cross faster than the host copies them into pinned memory
            row["pct_of_memcpy_ceiling"] = 100 * max(measured["memcpy"], in_proc or 0) / ms
        out.append(row)
    return out


def run(cfg: Config, rows_out: list | None = None) -> list[dict[str, Any]]:
    """Every regime's rows, then the busy pass; each regime's rows are appended to `rows_out` as
    soon as they are measured (what a run stopped early still records)."""
    dev = torch.device(cfg.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    depths = dict(zip(("copy-bound", "compute-bound"), calibrate(cfg, dev)))
    rows_out = [] if rows_out is None else rows_out
    bench = Rows(cfg, dev)
    rows = [r for r in ROWS if r[2] == "floor" or r[2] in cfg.kinds]
    for regime in cfg.regimes:
        rows_out += _measure(bench, cfg, regime, depths[regime], mlp(cfg, depths[regime], dev), rows)
    if cfg.busy and "in-process" in cfg.kinds:
        busy_rows = [r for r in ROWS if r[1] in BUSY_ROWS]
        print(f"busy process: a DataLoader(pin_memory=True, {cfg.workers} persistent workers) and timm's "
              "PrefetchLoader over another, iterated and left alive", flush=True)
        model = mlp(cfg, depths[cfg.regimes[-1]], dev)
        keep = make_busy(bench.pageable, lambda x: bench.acc.add_(model(x)), dev, cfg.workers,
                         n=min(40, cfg.warmup + cfg.steps))
        if keep.note:
            print(f"busy process: {keep.note}", flush=True)
        # steady busy state: the other loaders' workers and pin threads have filled their queues
        # (about 0.5 s); what happens in that first half second is gobrrr/bench/prefetch_busy.py --stalls-only
        time.sleep(1.5 if bench.cuda else 0.0)
        try:
            for regime in cfg.regimes:
                rows_out += _measure(bench, cfg, f"{regime}, busy", depths[regime],
                                     mlp(cfg, depths[regime], dev), busy_rows)
        finally:
            keep.close()
            del keep
            settle()
    return rows_out


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="gobrrr bench prefetch", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes on the CPU: a smoke test (seconds)")
    p.add_argument("--regime", choices=["copy-bound", "compute-bound", "both"], default="both")
    p.add_argument("--depths", help="explicit MLP depths 'COPY,COMPUTE' instead of calibrating")
    p.add_argument("--width", type=int, help="MLP width (default 1024)")
    p.add_argument("--workers", type=int, help="DataLoader workers (default 6)")
    p.add_argument("--steps", type=int, help="timed steps per row (default 80)")
    p.add_argument("--device", help="device (default cuda; cpu with --quick)")
    p.add_argument("--repeats", type=int, help="interleaved passes over the rows; the median is kept (default 1)")
    p.add_argument("--kinds", help="comma-separated row kinds to run, from in-process,workers,prebatched,info "
                                   "(floors always run; default all)")
    p.add_argument("--no-busy", action="store_true", help="skip the pass in a busy process")
    add_results_option(p)
    args = p.parse_args(argv)
    kw: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.depths:
        kw["depths"] = tuple(int(d) for d in args.depths.split(","))
    if args.kinds:
        kinds = tuple(k.strip() for k in args.kinds.split(","))
        bad = set(kinds) - set(Config.kinds)
        if bad:
            p.error(f"--kinds: unknown {sorted(bad)}; choose from in-process, workers, prebatched, info")
        kw["kinds"] = ("floor",) + kinds
    for k in ("width", "workers", "steps", "device", "repeats"):
        if getattr(args, k) is not None:
            kw[k] = getattr(args, k)
    if args.regime != "both":
        kw["regimes"] = (args.regime,)
    if args.no_busy:
        kw["busy"] = False
    cfg = Config(**kw)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("no CUDA device here; run with --quick (CPU smoke test) or on a GPU machine")
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse(argv)
    mb = cfg.batch * 3 * cfg.side * cfg.side * 4 / 1e6
    print(f"bench prefetch: batch {cfg.batch}x3x{cfg.side}x{cfg.side} float32 ({mb:.1f} MB), "
          f"MLP width {cfg.width}, {cfg.workers} workers, {cfg.steps} steps per row"
          + (f", {cfg.repeats} interleaved passes" if cfg.repeats > 1 else "") + f" on {cfg.device}")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    partial = ""

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    old = signal.signal(signal.SIGTERM, stop)   # `timeout` sends SIGTERM: keep what was measured
    try:
        run(cfg, rows)
    except KeyboardInterrupt as e:
        partial = f"stopped early ({e or 'Ctrl-C'}); the regimes measured before that are recorded"
        print(f"\nbench prefetch: {partial}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, old)
    cols = ["regime", "depth", "row", "ms_per_step", "x_floor", "GB/s"]
    cols += (["min-max ms"] if cfg.repeats > 1 else []) + ["note"]
    setups = sorted({(r["row"], r["setup"]) for r in rows if r.get("setup")})
    print_table(rows, cols, title="\nms/step; x_floor = ratio to max(copy, compute) for in-process rows, "
                                  "max(copy, compute, production) for worker rows (pre-batched production "
                                  "for the batch_size=None / IterableDataset rows)")
    print("\nwhat each Prefetcher row ran through (ring depth and slots, as measured):")
    for name, setup in setups:
        print(f"  {name}: {setup}")
    for r in rows:
        if r.get("pct_of_memcpy_ceiling"):
            print(f"  [{r['regime']}] Prefetcher(pageable): {r['pct_of_memcpy_ceiling']:.0f}% of the host memcpy "
                  f"ceiling (max(memcpy, copy, compute) / its time; target >= 90%)")
    figures = {}
    print("\ntargets (issues 3 and 14)" + (":" if cfg.device.startswith("cuda") else
                                    " (CPU run: copies are no-ops, verdicts are not meaningful):"))
    for r in rows:
        target = TARGETS.get(r["row"])
        if target is None or r["x_floor"] is None:
            continue
        figures[f"{r['regime']} | {r['row']} | x_floor"] = r["x_floor"]
        if r.get("pct_of_memcpy_ceiling"):
            figures[f"{r['regime']} | {r['row']} | pct_of_memcpy_ceiling"] = r["pct_of_memcpy_ceiling"]
        verdict = "met" if r["x_floor"] <= target else "MISSED"
        print(f"  {r['regime']:<14} {r['row']:<45} {r['x_floor']:.2f}x  (target <= {target}x): {verdict}")
    extra = {"partial": partial} if partial else {}
    path = record("prefetch", config=asdict(cfg), rows=rows, figures=figures,
                  wall_s=time.perf_counter() - t0, quick=args.quick, results=args.results, **extra)
    print(f"\n{len(rows)} rows in {time.perf_counter() - t0:.0f} s; appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
