"""Why is the Prefetcher slower in a busy process? One experiment, every suspect side by side.

Issue 14 saw `Prefetcher` from pinned tensors at 2.4-2.9x the compute floor in a process where a
DataLoader(pin_memory=True) with persistent workers and a timm-style PrefetchLoader had run first
and were left alive, while a hand-rolled depth-1 side-stream prefetch in the same process stayed at
1.01-1.09x. The suspects, read off prefetch.py / pinned.py, and the variant that isolates each:

  allocator   device batches are allocated in the consumer stream's order and the copy stream waits
              for an `allocated` event; the hand-rolled loop allocates on the copy stream and uses
              record_stream                             -> variant "alloc on copy stream"
  events      four timing events per step for stats()   -> variant "no timing events"
  depth       depth 2 vs the hand-rolled depth 1        -> variants "depth 1", "depth 3"
  Python GC   the busy process holds many more objects  -> variant "gc off"
  host calls  is_pinned (cudaPointerGetAttributes), event record, empty_like, current_stream:
              microbenchmarked per call in each phase
  threads     torch's pin-memory thread calls torch.set_num_threads(1), which new threads inherit;
              affinity; live thread count               -> printed per phase
  and a cProfile of the Prefetcher loop (fresh vs busy) for what the host waits in.

Phases, in one process: fresh; busy (bench.prefetch.make_busy); after dropping the busy loaders.
Every variant runs in both regimes, `--repeats` interleaved passes, median kept, with the host time
spent inside `next()` (mean and max) beside the step time. Then host memcpy methods
(pageable -> pinned, while a DMA runs) for the pageable path.

    gobrrr bench prefetch_busy               # on a GPU, about a minute; JSON to $GOBRRR_BENCH_RESULTS or bench/results
    gobrrr bench prefetch_busy --stalls-only # the stall probe alone (fresh busy state before each run)
"""
from __future__ import annotations

import argparse
import cProfile
import ctypes
import gc
import io
import os
import pstats
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import numpy as np
import torch

from gobrrr.bench.common import print_table, record
from gobrrr.bench.prefetch import Config, Rows, calibrate, first, make_busy, mlp, settle, sync
from gobrrr.loader.prefetch import Prefetcher


def loop(bench: Rows, batches, model, gc_off: bool = False) -> dict:
    """ms/step over cfg.steps after cfg.warmup, and the host ms spent inside next() (mean, max)."""
    cfg, dev = bench.cfg, bench.dev
    it = iter(batches)
    host: list[float] = []
    if gc_off:
        gc.disable()
    try:
        for i in range(cfg.warmup + cfg.steps):
            if i == cfg.warmup:
                sync(dev)
                t0 = time.perf_counter()
            h = time.perf_counter()
            b = next(it)
            if i >= cfg.warmup:
                host.append((time.perf_counter() - h) * 1e3)
            bench.acc.add_(model(first(b)))
        sync(dev)
        ms = (time.perf_counter() - t0) * 1e3 / cfg.steps
    finally:
        if gc_off:
            gc.enable()
    return {"ms": ms, "next_mean_ms": statistics.fmean(host), "next_max_ms": max(host)}


def hand_rolled(bench: Rows, n: int):
    """The depth-1 side-stream prefetch of the issue, as a generator of device batches."""
    dev = bench.dev
    stream = torch.cuda.Stream(dev)

    def fetch(i):
        with torch.cuda.stream(stream):
            x = bench.pinned[i % 2].to(dev, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(stream)
        return x, ev

    nxt = fetch(0)
    for i in range(n):
        x, ev = nxt
        torch.cuda.current_stream(dev).wait_event(ev)
        x.record_stream(torch.cuda.current_stream(dev))
        nxt = fetch(i + 1)
        yield x


def prefetcher(bench: Rows, depth: int = 2, timed: bool = True, alloc_copy: bool = False, pageable=False):
    src = bench.pageable if pageable else bench.pinned
    pf = Prefetcher([src[i % 2] for i in range(bench.n)], device=bench.dev, depth=depth)
    pf._timed, pf._alloc_on_copy_stream = timed, alloc_copy
    return pf


VARIANTS = {
    "hand-rolled depth 1": lambda b: hand_rolled(b, b.n),
    "Prefetcher (as is)": lambda b: prefetcher(b),
    "Prefetcher, no timing events": lambda b: prefetcher(b, timed=False),
    "Prefetcher, alloc on copy stream": lambda b: prefetcher(b, alloc_copy=True),
    "Prefetcher, both": lambda b: prefetcher(b, timed=False, alloc_copy=True),
    "Prefetcher, depth 1": lambda b: prefetcher(b, depth=1),
    "Prefetcher, depth 3": lambda b: prefetcher(b, depth=3),
    "Prefetcher, gc off": lambda b: prefetcher(b),
    "Prefetcher(pageable)": lambda b: prefetcher(b, pageable=True),
}


def per_call_us(fn, n: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) * 1e6 / n


def environment_probe(bench: Rows) -> dict:
    """Host-side costs and settings that a busy process might have changed."""
    dev = bench.dev
    x = bench.pinned[0]
    out = {"threads_alive": threading.active_count(), "affinity": len(os.sched_getaffinity(0)),
           "torch_threads_main": torch.get_num_threads(), "switch_interval_s": sys.getswitchinterval(),
           "gc_objects": len(gc.get_objects())}
    got = []
    t = threading.Thread(target=lambda: got.append(torch.get_num_threads()))
    t.start()
    t.join()
    out["torch_threads_new_thread"] = got[0]
    out["is_pinned_us"] = per_call_us(x.is_pinned)
    out["current_stream_us"] = per_call_us(lambda: torch.cuda.current_stream(dev))

    def ev():
        e = torch.cuda.Event(enable_timing=True)
        e.record()
    out["timing_event_record_us"] = per_call_us(ev)
    out["empty_like_78MB_us"] = per_call_us(lambda: torch.empty_like(x, device=dev), 500)
    sync(dev)
    return out


def profile(bench: Rows, make, model, top: int = 14) -> str:
    """cProfile of one timed loop; the functions with the most own time."""
    prof = cProfile.Profile()
    prof.enable()
    loop(bench, make(bench), model)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return "\n".join(line for line in s.getvalue().splitlines() if line.strip())[-4000:]


def run_variants(bench: Rows, phase: str, models: dict, repeats: int) -> list[dict]:
    rows = []
    for regime, model in models.items():
        res: dict[str, list[dict]] = {k: [] for k in VARIANTS}
        for _ in range(repeats):
            for name, make in VARIANTS.items():
                with torch.no_grad():
                    res[name].append(loop(bench, make(bench), model, gc_off=name.endswith("gc off")))
                gc.collect()
        for name, rs in res.items():
            ms = statistics.median(r["ms"] for r in rs)
            rows.append({"phase": phase, "regime": regime, "variant": name, "ms": ms,
                         "min-max": f"{min(r['ms'] for r in rs):.2f}-{max(r['ms'] for r in rs):.2f}",
                         "next_mean_ms": statistics.median(r["next_mean_ms"] for r in rs),
                         "next_max_ms": max(r["next_max_ms"] for r in rs)})
        floor = {}
        with torch.no_grad():
            floor["compute"] = bench.compute(model)
            floor["copy"] = bench.copy(model)
        f = max(floor.values())
        for r in rows:
            if r["phase"] == phase and r["regime"] == regime:
                r["x_floor"] = r["ms"] / f
                r["floor"] = f"compute {floor['compute']:.2f} / copy {floor['copy']:.2f}"
        print_table([r for r in rows if r["regime"] == regime],
                    ["phase", "regime", "variant", "ms", "x_floor", "min-max", "next_mean_ms", "next_max_ms", "floor"],
                    title=f"\n[{phase}] {regime}")
        sys.stdout.flush()
    return rows


def memcpy_methods(bench: Rows) -> list[dict]:
    """GB/s of pageable -> pinned copies of one batch by method and threads, while a DMA runs."""
    n = bench.nbytes
    dst = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    srcs = [t.reshape(-1).view(torch.uint8) for t in bench.pageable]
    dma_src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dma_dst = torch.empty(n, dtype=torch.uint8, device=bench.dev)
    side = torch.cuda.Stream(bench.dev)
    rows = []

    def np_copy(d, s):
        np.copyto(d.numpy(), s.numpy())

    def torch_copy(d, s):
        d.copy_(s)

    def c_memmove(d, s):
        ctypes.memmove(d.data_ptr(), s.data_ptr(), d.numel())

    for method, fn in (("numpy copyto", np_copy), ("torch copy_", torch_copy), ("ctypes.memmove", c_memmove)):
        for threads in (4, 8, 12, 16):
            if method != "numpy copyto" and threads not in (12, 16):
                continue
            cuts = [min(n, k * (-(-n // threads) // 4096 + 1) * 4096) for k in range(threads + 1)]
            cuts[-1] = n
            with ThreadPoolExecutor(threads, initializer=torch.set_num_threads, initargs=(1,)) as pool:
                times = []
                for rep in range(12):
                    s = srcs[rep % 2]
                    with torch.cuda.stream(side):
                        dma_dst.copy_(dma_src, non_blocking=True)   # the copy engine reads meanwhile
                    t0 = time.perf_counter()
                    list(pool.map(lambda k: fn(dst[cuts[k]:cuts[k + 1]], s[cuts[k]:cuts[k + 1]]), range(threads)))
                    times.append(time.perf_counter() - t0)
                sync(bench.dev)
            t = statistics.median(times[2:])
            rows.append({"method": method, "threads": threads, "ms": t * 1e3, "GB/s": n / t / 1e9})
    print_table(rows, title="\nhost memcpy pageable -> pinned, one 78.6 MB batch, DMA running (median of 10)")
    return rows


def guarded(fn, *args):
    """fn(*args), or None with the traceback printed: one broken part must not cost the GPU run."""
    try:
        return fn(*args)
    except Exception:
        import traceback
        traceback.print_exc()
        return None


def stall_probe(bench: Rows, model, variants: list[str], reps: int = 2, stall_ms: float = 5.0) -> list[dict]:
    """Each variant right after a fresh busy state (the other loaders just left alive, their workers and
    pin-memory threads still filling their queues), interleaved. A watchdog thread samples the main
    thread's Python stack, and the pin-memory threads', whenever a next() has taken > stall_ms;
    gc.callbacks time every collection. Says where the host waits when it stalls."""
    import traceback
    main_id = threading.get_ident()
    state = {"since": None, "samples": [], "run": True}

    def watchdog():
        while state["run"]:
            since = state["since"]
            if since is not None and time.perf_counter() - since > stall_ms / 1e3:
                frames = sys._current_frames()
                main = frames.get(main_id)
                where = "".join(traceback.format_stack(main, limit=3)[-2:]).strip() if main else "?"
                pins = [t for t in threading.enumerate() if "pin_memory" in t.name]
                pin_where = [" | ".join(f"{s.name}:{s.lineno}" for s in traceback.extract_stack(frames[t.ident])[-3:])
                             for t in pins if t.ident in frames]
                state["samples"].append({"at_ms": (time.perf_counter() - since) * 1e3, "main": where[-400:],
                                         "pin_threads": pin_where})
            time.sleep(0.001)

    gcs: list[tuple[int, float]] = []
    t_gc = {}

    def on_gc(phase, info):
        if phase == "start":
            t_gc["t"] = time.perf_counter()
        elif "t" in t_gc:
            gcs.append((info["generation"], (time.perf_counter() - t_gc.pop("t")) * 1e3))

    dog = threading.Thread(target=watchdog, daemon=True, name="stall-watchdog")
    dog.start()
    gc.callbacks.append(on_gc)
    cfg, dev = bench.cfg, bench.dev
    rows = []
    try:
        for rep in range(reps):
            for name in variants:
                keep = make_busy(bench, model, steps=30)
                gcs.clear()
                state["samples"] = []
                it = iter(VARIANTS[name](bench))
                host = []
                sync(dev)
                t0 = time.perf_counter()
                if name.endswith("gc off"):
                    gc.disable()
                try:
                    with torch.no_grad():
                        for i in range(cfg.warmup + cfg.steps):
                            state["since"] = time.perf_counter()
                            b = next(it)
                            host.append((time.perf_counter() - state["since"]) * 1e3)
                            state["since"] = None
                            bench.acc.add_(model(first(b)))
                    sync(dev)
                finally:
                    gc.enable()
                ms = (time.perf_counter() - t0) * 1e3 / (cfg.warmup + cfg.steps)
                stalls = [round(h, 1) for h in host if h > stall_ms]
                by_site: dict[str, int] = {}
                for s in state["samples"]:
                    key = s["main"].splitlines()[-1].strip() if s["main"] else "?"
                    by_site[key] = by_site.get(key, 0) + 1
                rows.append({"rep": rep, "variant": name, "ms_per_step_all_steps": ms, "stalls_ms": stalls,
                             "gc_ms": [(g, round(t, 1)) for g, t in gcs if t > 1.0],
                             "stall_sites": by_site,
                             "pin_threads_at_stalls": sorted({p for s in state["samples"] for p in s["pin_threads"]})[:6]})
                print(f"  [stall probe] {rows[-1]}", flush=True)
                del it, keep
                settle()
    finally:
        state["run"] = False
        gc.callbacks.remove(on_gc)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gobrrr.bench.prefetch_busy", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--stalls-only", action="store_true", help="only the stall probe (fresh busy state per variant)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gobrrr bench prefetch_busy: error: no CUDA device here ; run it on a GPU machine",
              file=sys.stderr)
        return 2
    cfg = Config(steps=args.steps)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    depths = dict(zip(("copy-bound", "compute-bound"), calibrate(cfg, dev)))
    bench = Rows(cfg, dev)
    models = {r: mlp(cfg, d, dev) for r, d in depths.items()}
    out: dict = {"depths": depths, "env": {}, "rows": [], "profiles": {}}
    t0 = time.perf_counter()
    if args.stalls_only:
        names = ["hand-rolled depth 1", "Prefetcher (as is)", "Prefetcher, alloc on copy stream", "Prefetcher, gc off"]
        rows = stall_probe(bench, models["copy-bound"], names)
        path = record("prefetch_busy", config={**asdict(cfg), "stalls_only": True}, rows=rows,
                      wall_s=time.perf_counter() - t0)
        print(f"\n{len(rows)} stall-probe rows in {time.perf_counter() - t0:.0f} s; appended to {path}")
        return 0
    out["memcpy"] = guarded(memcpy_methods, bench) or []
    for phase in ("fresh", "busy", "after"):
        if phase == "busy":
            keep = make_busy(bench, models["compute-bound"])
        if phase == "after":
            del keep
            settle()
        out["env"][phase] = guarded(environment_probe, bench)
        print(f"\n[{phase}] {out['env'][phase]}", flush=True)
        out["rows"] += run_variants(bench, phase, models, args.repeats if phase != "after" else 1)
        if phase in ("fresh", "busy"):
            for name in ("Prefetcher (as is)", "hand-rolled depth 1"):
                with torch.no_grad():
                    text = guarded(profile, bench, VARIANTS[name], models["compute-bound"])
                out["profiles"][f"{phase} | {name}"] = text
                print(f"\n[{phase}] cProfile, {name} (compute-bound), by own time:\n{text}", flush=True)
    path = record("prefetch_busy", config={**asdict(cfg), "repeats": args.repeats}, rows=out["rows"],
                  figures={"env": out["env"], "memcpy": out["memcpy"]}, profiles=out["profiles"],
                  wall_s=time.perf_counter() - t0)
    print(f"\n{len(out['rows'])} rows in {time.perf_counter() - t0:.0f} s; appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
