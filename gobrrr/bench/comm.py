"""`gobrrr bench comm`: collective bandwidth like nccl-tests, and our wrappers against raw torch.distributed.

    torchrun --nproc-per-node 8 -m gobrrr bench comm --ops all_reduce,all_gather --max-bytes 1G
    python -m gobrrr.bench.comm --quick                      # world size 1, CPU/gloo or one GPU

For each op and each size (powers of two from --min-bytes to --max-bytes) every rank runs `iters`
calls back to back, timed with CUDA events on GPUs (perf_counter on CPU); the time per call is
the slowest rank's. Columns, as in nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):

    size     bytes of the buffer the op is named after (all_gather: the gathered output,
             reduce_scatter: the input to scatter; the others: the tensor)
    algbw    size / time
    busbw    algbw * factor, the bytes one rank's link really carries, comparable to the link's
             peak across ops and world sizes: all_reduce 2(n-1)/n; all_gather, reduce_scatter,
             all_to_all (n-1)/n; broadcast, reduce 1.

`vs_raw` = raw time / our time for the same call through `torch.distributed` directly, measured
interleaved (ours, raw, ours, raw, ...) in the same run, so drift hits both alike; 1.0 means our
wrapper costs nothing, the target is >= 0.95.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import torch
import torch.distributed as dist

from gobrrr.bench.common import Parser, add_results_option, parse_device, parse_dtype, positive, print_table, record
from gobrrr.comm import collectives as comm
from gobrrr.comm import init, shutdown

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: how many times `size` each rank's link carries (per n)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def parse_bytes(text: str) -> int:
    """'64K' -> 65536, '1M', '2G', or a plain integer."""
    text = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def calls(op: str, size: int, dtype: torch.dtype, n: int, device: torch.device) -> tuple[Callable, Callable, int]:
    """(ours, raw, count) for one op at one size; both closures reuse the same buffers."""
    el = torch.tensor([], dtype=dtype).element_size()
    count = max(size // el // n * n, n)  # elements, a multiple of n so every rank's share is whole
    big = torch.ones(count, dtype=dtype, device=device)
    small = torch.ones(count // n, dtype=dtype, device=device)
    if op == "all_reduce":
        return (lambda: comm.all_reduce(big), lambda: dist.all_reduce(big), count)
    if op == "broadcast":
        return (lambda: comm.broadcast(big, 0), lambda: dist.broadcast(big, 0), count)
    if op == "reduce":
        return (lambda: comm.reduce(big, 0), lambda: dist.reduce(big, 0), count)
    if op == "all_gather":  # size = the gathered output
        return (lambda: comm.all_gather(big, small), lambda: comm._all_gather_tensor(big, small), count)
    if op == "reduce_scatter":  # size = the input being scattered
        return (lambda: comm.reduce_scatter(small, big), lambda: comm._reduce_scatter_tensor(small, big), count)
    if op == "all_to_all":
        out = torch.empty_like(big)
        return (lambda: comm.all_to_all(out, big), lambda: dist.all_to_all_single(out, big), count)
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def time_calls(fn: Callable, iters: int, device: torch.device) -> float:
    """Seconds per call on this rank: `iters` back-to-back calls, after a barrier so all ranks start together."""
    dist.barrier()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()  # sync: read the timer
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], 1
    while s < lo:
        s *= 2
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="gobrrr bench comm", description=__doc__.split("\n")[0])
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {','.join(OPS)}")
    p.add_argument("--min-bytes", default=None, help="smallest size (default 1K; e.g. 8, 64K, 1M)")
    p.add_argument("--max-bytes", default=None, help="largest size (default 256M on GPU, 1M on CPU)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16, float16, ...")
    p.add_argument("--iters", type=positive(int), default=None, help="timed calls per measurement (default 20; CPU 5)")
    p.add_argument("--reps", type=positive(int), default=3, help="interleaved ours/raw repetitions; the median is kept")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few iterations: a smoke test")
    add_results_option(p)
    args = p.parse_args(argv)

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            p.error(f"unknown op {o!r}; choose from {', '.join(OPS)}")
    dtype = parse_dtype(p, args.dtype)
    for flag, text in (("--min-bytes", args.min_bytes), ("--max-bytes", args.max_bytes)):
        try:
            if text is not None and parse_bytes(text) < 1:
                raise ValueError
        except (ValueError, IndexError):
            p.error(f"{flag} {text!r} is not a size; use e.g. 8, 64K, 1M, 2G")

    # the steady-state per-call cost is measured here: no leading signature check (ops #0-15 would
    # otherwise land in the first row's timing; its one-time cost is in gobrrr/comm/debug.py)
    os.environ.setdefault("GOBRRR_DIST_CHECK_FIRST", "0")
    rank = init(device=parse_device(p, args.device))
    try:
        dev, n = rank.device, rank.world_size
        gpu = dev.type == "cuda"
        lo = parse_bytes(args.min_bytes or "1K")
        hi = parse_bytes(args.max_bytes or ("64K" if args.quick else "256M" if gpu else "1M"))
        iters = args.iters or (3 if args.quick else 20 if gpu else 5)
        reps = 1 if args.quick else args.reps
        rows, times = [], []  # times: [(ours_s, raw_s)] per row, this rank
        for op in ops:
            for size in sizes(lo, hi):
                ours, raw, count = calls(op, size, dtype, n, dev)
                for fn in (ours, raw):  # warm up both paths (NCCL builds its channels lazily)
                    for _ in range(2):
                        fn()
                t_ours, t_raw = [], []
                for _ in range(reps):  # interleaved, so drift hits both alike
                    t_ours.append(time_calls(ours, iters, dev))
                    t_raw.append(time_calls(raw, iters, dev))
                times.append((sorted(t_ours)[len(t_ours) // 2], sorted(t_raw)[len(t_raw) // 2]))
                el = torch.tensor([], dtype=dtype).element_size()
                rows.append({"op": op, "size": count * el, "count": count})
                del ours, raw
        # the time of a collective is its slowest rank's: one MAX all-reduce over every measurement
        t = torch.tensor(times, dtype=torch.float64, device=dev).reshape(-1, 2)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        for row, (t_ours, t_raw) in zip(rows, t.tolist()):  # sync: once, after all measurements
            algbw = row["size"] / t_ours / 1e9
            row.update(time_us=t_ours * 1e6, algbw=algbw, busbw=algbw * bus_factor(row["op"], n),
                       raw_us=t_raw * 1e6, vs_raw=t_raw / t_ours)
        if rank.is_main:
            title = (f"gobrrr bench comm: {n} rank(s), {rank.backend} on {dev.type}, {args.dtype}, "
                     f"{iters} iters x {reps} reps (GB/s; vs_raw = raw time / our time)")
            print_table(rows, ["op", "size", "count", "time_us", "algbw", "busbw", "raw_us", "vs_raw"], title=title)
            figures = {}
            for op in ops:
                mine = [r for r in rows if r["op"] == op]
                if mine:
                    figures[f"{op}_peak_busbw_GBs"] = max(r["busbw"] for r in mine)
                    figures[f"{op}_median_vs_raw"] = sorted(r["vs_raw"] for r in mine)[len(mine) // 2]
            config = {"ops": ops, "min_bytes": lo, "max_bytes": hi, "dtype": args.dtype, "iters": iters,
                      "reps": reps, "backend": rank.backend, "device": dev.type}
            path = record("comm", config=config, rows=rows, figures=figures, world_size=n, quick=args.quick,
                          results=args.results)
            print(f"recorded to {path}")
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
