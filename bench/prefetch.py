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
Every row is reported as ms/step and as a ratio to the floor that binds it:
max(copy, compute) for in-process sources, max(copy, compute, prod) for worker sources.

Every worker row, the production floor included, is one epoch of freshly forked workers over the
same dataset, timed over the same steps: the fork, the first batches and each worker's first touch
of the memory it writes (its private buffer; its 4 ring slots, batches 0-23) fall inside the 30
warmup steps, so no row pays a start-up cost the floor does not.

    python -m bench.prefetch            # full run on a GPU (about 2 minutes)
    python -m bench.prefetch --kinds workers --repeats 3
                                        # worker rows only, 3 interleaved passes: the median and the
                                        # spread (min-max), since the workers' own rate moves between runs
    python -m bench.prefetch --quick    # tiny sizes on the CPU: a smoke test of every code path
"""
from __future__ import annotations

import argparse
import gc
import inspect
import multiprocessing
import statistics
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from bench.common import add_results_option, print_table, record
from gobrrr.device.worker_ring import PinnedWorkerLoader


@dataclass
class Config:
    batch: int = 256
    side: int = 160            # images are (3, side, side) float32
    width: int = 1024          # MLP width; depth comes from the regime
    workers: int = 6
    warmup: int = 30          # > every worker's first write to each of its 4 ring slots (batches 0-23)
    steps: int = 80
    copy_ms: float = 0.8       # target compute time of the copy-bound regime
    compute_ms: float = 2.1    # target compute time of the compute-bound regime
    depths: tuple[int, ...] | None = None  # explicit (copy-bound, compute-bound) depths
    regimes: tuple[str, ...] = ("copy-bound", "compute-bound")
    device: str = "cuda"
    repeats: int = 1           # passes over the rows, interleaved (row order r1 r2 .. r1 r2 ..); median kept
    kinds: tuple[str, ...] = ("floor", "info", "in-process", "workers")  # which rows (floors always run)


QUICK = dict(batch=8, side=16, width=64, workers=2, warmup=2, steps=5, depths=(1, 2), device="cpu")


# ---------------------------------------------------------------- data and model

class Frames(Dataset):
    """`length` samples (image, label) drawn from a few distinct pageable images, as a decoded dataset."""

    def __init__(self, images: torch.Tensor, length: int):
        self.images, self.length = images, length   # images: (n, 3, side, side) float32

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.images[i % len(self.images)], i


def collate_fresh(samples):
    """Production floor, info row: stack into fresh private memory (what default_collate does), send nothing."""
    torch.stack([s[0] for s in samples])
    return len(samples)


class CollateReused:
    """Production floor: stack into one private buffer per worker (allocated once), send nothing."""

    def __init__(self):
        self.buf = None

    def __call__(self, samples):
        x = samples[0][0]
        if self.buf is None or self.buf.shape[0] != len(samples):
            self.buf = torch.empty((len(samples), *x.shape), dtype=x.dtype)
        torch.stack([s[0] for s in samples], out=self.buf)
        return len(samples)


def mlp(cfg: Config, depth: int, device: torch.device) -> nn.Module:
    """Rows of 3*side pixels through `depth` hidden layers; one scalar out."""
    feat = 3 * cfg.side
    layers: list[nn.Module] = [nn.Linear(feat, cfg.width), nn.GELU()]
    for _ in range(depth):
        layers += [nn.Linear(cfg.width, cfg.width), nn.GELU()]
    layers += [nn.Linear(cfg.width, 1)]
    net = nn.Sequential(*layers).to(device)

    def step(x: torch.Tensor) -> torch.Tensor:   # x: (B, 3, side, side)
        return net(x.reshape(-1, feat)).mean()   # (B*side, 3*side) -> ()

    return step


# ---------------------------------------------------------------- timing helpers

def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # sync: benchmark boundary, outside the timed loop body


def timed_loop(batches, step: Callable[[Any], None], cfg: Config, dev: torch.device) -> float:
    """ms/step over cfg.steps steps after cfg.warmup steps, the clock stopped after the GPU drains."""
    t0 = None
    n = 0
    for i, b in enumerate(batches):
        if i == cfg.warmup:
            sync(dev)
            t0 = time.perf_counter()
        step(b)
        n = i + 1
        if n == cfg.warmup + cfg.steps:
            break
    sync(dev)
    if t0 is None or n < cfg.warmup + cfg.steps:
        raise RuntimeError(f"source gave {n} batches, fewer than warmup + steps = {cfg.warmup + cfg.steps}")
    return (time.perf_counter() - t0) * 1e3 / cfg.steps


def first(b):
    """The image tensor of a batch: (x, y) pairs from loaders, plain tensors from lists."""
    return b[0] if isinstance(b, (list, tuple)) else b


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
        return self._prefetcher([self.pinned[i % 2] for i in range(self.n)], model)

    def prefetcher_pageable(self, model):
        return self._prefetcher([self.pageable[i % 2] for i in range(self.n)], model)

    # worker sources
    def dataloader_pinned(self, model):
        dl = self.loader(pin_memory=self.cuda)
        return timed_loop(dl, lambda b: self.acc.add_(model(b[0].to(self.dev, non_blocking=True))),
                          self.cfg, self.dev)

    def timm_prefetch(self, model):
        from timm.data.loader import PrefetchLoader
        dl = self.loader(pin_memory=True)
        kw = {"device": self.dev} if "device" in inspect.signature(PrefetchLoader).parameters else {}
        return timed_loop(PrefetchLoader(dl, **kw), lambda b: self.acc.add_(model(b[0])), self.cfg, self.dev)

    def prefetcher_workers(self, model):
        return self._prefetcher(self.loader(), model)

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
            del it, state
            ring.close()

    def _prefetcher(self, source, model):
        from gobrrr.device.prefetch import Prefetcher
        pf = Prefetcher(source, device=self.dev)
        try:
            return timed_loop(pf, lambda b: self.acc.add_(model(first(b))), self.cfg, self.dev)
        finally:
            del pf
            gc.collect()


# name, method, kind ("floor" / "info" / "in-process" / "workers"), needs
ROWS = [
    ("floor: compute only", "compute", "floor", ()),
    ("floor: copy only (pinned H2D)", "copy", "floor", ("cuda",)),
    ("floor: workers' production (reused private buffer)", "production", "floor", ()),
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
]


# issue 3's targets, as ratios to the binding floor
TARGETS = {"Prefetcher(pinned tensors)": 1.05, "Prefetcher(pageable tensors)": 2.0,
           "Prefetcher(DataLoader with workers)": 1.5}


def _available(needs, cuda: bool) -> str | None:
    """None when the row can run here, else why not."""
    if "cuda" in needs and not cuda:
        return "needs CUDA"
    if "timm" in needs:
        try:
            import timm.data.loader  # noqa: F401
        except ImportError:
            return "timm not installed"
        except Exception as e:  # e.g. a torchvision built for another torch
            return f"timm does not import here ({type(e).__name__})"
    if "prefetcher" in needs:
        try:
            from gobrrr.device.prefetch import Prefetcher  # noqa: F401
        except ImportError as e:
            return f"Prefetcher not importable ({e})"
    return None


def settle(timeout_s: float = 10.0) -> None:
    """Collect the last row's loaders and wait for their worker processes to exit."""
    gc.collect()
    deadline = time.monotonic() + timeout_s
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.02)


def calibrate(cfg: Config, dev: torch.device) -> tuple[int, int]:
    """Depths whose compute time is near cfg.copy_ms and cfg.compute_ms (a line through 2 depths)."""
    if cfg.depths is not None:
        return tuple(cfg.depths)  # type: ignore[return-value]
    probe = Config(**{**asdict(cfg), "warmup": 3, "steps": 10})
    x = torch.randn(cfg.batch, 3, cfg.side, cfg.side, device=dev)
    acc = torch.zeros((), device=dev)
    t = {}
    for d in (2, 8):
        model = mlp(cfg, d, dev)
        with torch.no_grad():
            t[d] = timed_loop(range(20), lambda _: acc.add_(model(x)), probe, dev)
    per_layer = max((t[8] - t[2]) / 6, 1e-4)
    base = t[2] - 2 * per_layer

    def depth(target):
        return max(1, round((target - base) / per_layer))
    return depth(cfg.copy_ms), depth(cfg.compute_ms)


def run(cfg: Config) -> list[dict[str, Any]]:
    dev = torch.device(cfg.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    depths = dict(zip(("copy-bound", "compute-bound"), calibrate(cfg, dev)))
    rows_out = []
    bench = Rows(cfg, dev)
    for regime in cfg.regimes:
        model = mlp(cfg, depths[regime], dev)
        rows = [r for r in ROWS if r[2] == "floor" or r[2] in cfg.kinds]
        times: dict[str, list[float]] = {method: [] for _, method, _, _ in rows}
        why_not: dict[str, str | None] = {method: _available(needs, bench.cuda) for _, method, _, needs in rows}
        for r in range(cfg.repeats):  # interleaved passes: drift between passes hits every row alike
            for name, method, kind, needs in rows:
                if why_not[method] is not None:
                    continue
                try:
                    with torch.no_grad():
                        ms = getattr(bench, method)(model)
                    times[method].append(ms)
                    pass_ = f" (pass {r + 1}/{cfg.repeats})" if cfg.repeats > 1 else ""
                    print(f"  [{regime}] {name}{pass_}: {ms:.3f} ms/step", flush=True)
                except Exception as e:  # one broken row must not cost the whole (GPU) run
                    traceback.print_exc()
                    why_not[method] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
                settle()  # the row's workers are gone before the next row starts
        measured = {m: statistics.median(t) for m, t in times.items() if t and why_not[m] is None}
        regime_rows = [(name, method, kind, measured.get(method), why_not[method] or "",
                        (min(times[method]), max(times[method])) if method in measured else None)
                       for name, method, kind, _ in rows]
        for name, _, _, _, why, _ in regime_rows:
            if why:
                print(f"  [{regime}] {name}: skipped ({why})", flush=True)
        floors = {k: measured[k] for k in ("compute", "copy", "production") if k in measured}
        in_proc = max((v for k, v in floors.items() if k != "production"), default=None)
        workers = max(floors.values(), default=None)
        for name, method, kind, ms, why, spread in regime_rows:
            floor = {"in-process": in_proc, "workers": workers}.get(kind)
            rows_out.append({
                "regime": regime, "depth": depths[regime], "row": name, "kind": kind,
                "ms_per_step": ms, "x_floor": (ms / floor) if (ms is not None and floor) else None,
                "GB/s": (bench.nbytes / ms / 1e6) if (ms and method != "compute") else None,
                "min-max ms": f"{spread[0]:.2f}-{spread[1]:.2f}" if spread and cfg.repeats > 1 else "",
                "note": why or "",
            })
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
    p.add_argument("--kinds", help="comma-separated row kinds to run, from in-process,workers,info "
                                   "(floors always run; default all)")
    add_results_option(p)
    args = p.parse_args(argv)
    kw: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.depths:
        kw["depths"] = tuple(int(d) for d in args.depths.split(","))
    if args.kinds:
        kinds = tuple(k.strip() for k in args.kinds.split(","))
        bad = set(kinds) - set(Config.kinds)
        if bad:
            p.error(f"--kinds: unknown {sorted(bad)}; choose from in-process, workers, info")
        kw["kinds"] = ("floor",) + kinds
    for k in ("width", "workers", "steps", "device", "repeats"):
        if getattr(args, k) is not None:
            kw[k] = getattr(args, k)
    if args.regime != "both":
        kw["regimes"] = (args.regime,)
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
    rows = run(cfg)
    cols = ["regime", "depth", "row", "ms_per_step", "x_floor", "GB/s"]
    cols += (["min-max ms"] if cfg.repeats > 1 else []) + ["note"]
    print_table(rows, cols, title="\nms/step; x_floor = ratio to max(copy, compute) for in-process rows, "
                                  "max(copy, compute, production) for worker rows")
    figures = {}
    print("\ntargets (issue 3)" + (":" if cfg.device.startswith("cuda") else
                                    " (CPU run: copies are no-ops, verdicts are not meaningful):"))
    for r in rows:
        target = TARGETS.get(r["row"])
        if target is None or r["x_floor"] is None:
            continue
        figures[f"{r['regime']} | {r['row']} | x_floor"] = r["x_floor"]
        verdict = "met" if r["x_floor"] <= target else "MISSED"
        print(f"  {r['regime']:<14} {r['row']:<45} {r['x_floor']:.2f}x  (target <= {target}x): {verdict}")
    path = record("prefetch", config=asdict(cfg), rows=rows, figures=figures,
                  wall_s=time.perf_counter() - t0, quick=args.quick, results=args.results)
    print(f"\n{len(rows)} rows in {time.perf_counter() - t0:.0f} s; appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
