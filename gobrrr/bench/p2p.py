"""`gobrrr bench p2p`: GPU-to-GPU copy bandwidth and latency, every pair, and how the GPUs are wired.

    python -m gobrrr.bench.p2p                 # all GPUs of this node, one process
    python -m gobrrr.bench.p2p --quick         # small sizes (also runs on CPU, as a smoke test)

For each ordered pair (src, dst) it times `dst_buf.copy_(src_buf)`:
  * bandwidth: a large buffer (--bytes, default 256 MiB), GB/s = bytes copied / time;
  * latency:   a 4-byte copy, microseconds per copy, averaged over many back-to-back copies.
With peer access (NVLink, or PCIe P2P) the copy goes GPU to GPU directly; without it the driver
stages through host memory, which shows up as PCIe-level bandwidth.

With one GPU there is no pair: it says so and measures the device-to-device copy on that GPU
(bytes copied / time; the memory itself moves twice that, one read and one write per byte).

The topology is `nvidia-smi topo -m` (NV# = NVLink with # links, PIX/PXB/PHB/NODE/SYS = PCIe paths
of increasing distance), printed and recorded when the tool exists.
"""
from __future__ import annotations

import shutil
import subprocess
import time

import torch

from gobrrr.bench.common import Parser, add_results_option, positive, print_table, record


def topology() -> str | None:
    """The output of `nvidia-smi topo -m`, or None where the tool is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _sync(devs: list[torch.device]) -> None:
    for d in devs:
        if d.type == "cuda":
            torch.cuda.synchronize(d)  # sync: the copy must be finished before the clock is read


def time_copy(src: torch.device, dst: torch.device, nbytes: int, iters: int) -> float:
    """Seconds per `dst_buf.copy_(src_buf)` of `nbytes`, after a warm-up copy."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=src)
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst)
    a.fill_(1)
    b.copy_(a, non_blocking=True)  # warm-up: enables peer mappings, allocates staging buffers
    _sync([src, dst])
    if src.type == "cuda":
        # the copy is issued on the source device's current stream; events time it there
        with torch.cuda.device(src):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                b.copy_(a, non_blocking=True)
            end.record()
            _sync([src, dst])
            return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        b.copy_(a)
    return (time.perf_counter() - t0) / iters


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="gobrrr bench p2p", description=__doc__.split("\n")[0])
    p.add_argument("--bytes", default=None, help="bandwidth buffer size in bytes (default 256M; K/M/G suffixes)")
    p.add_argument("--iters", type=positive(int), default=None, help="copies per bandwidth measurement (default 20)")
    p.add_argument("--quick", action="store_true", help="small buffer, few iterations (a smoke test)")
    add_results_option(p)
    args = p.parse_args(argv)
    from gobrrr.bench.comm import parse_bytes

    try:
        nbytes = parse_bytes(args.bytes or ("1M" if args.quick else "256M"))
        if nbytes < 1:
            raise ValueError
    except (ValueError, IndexError):
        p.error(f"--bytes {args.bytes!r} is not a size; use e.g. 4096, 64K, 256M")
    iters = args.iters or (3 if args.quick else 20)
    lat_iters = 20 if args.quick else 1000
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpu == 0:
        print("gobrrr bench p2p: no CUDA GPU; timing a host-memory copy only, so the code path is exercised.")
        devs = [torch.device("cpu")]
    else:
        devs = [torch.device("cuda", i) for i in range(n_gpu)]
        if n_gpu == 1:
            print("gobrrr bench p2p: one GPU, so no GPU-to-GPU pair to measure; measuring the device-to-device "
                  "copy on cuda:0 instead (memory traffic is twice the bytes copied: one read, one write).")
    topo = topology()
    if topo:
        print("nvidia-smi topo -m:\n" + topo + "\n")

    rows = []
    for s in devs:
        for d in devs:
            if len(devs) > 1 and s == d:
                continue  # a GPU to itself is D2D, shown only when there is a single device
            peer = (s.type == "cuda" and d.type == "cuda" and s != d
                    and torch.cuda.can_device_access_peer(s.index, d.index))
            t_bw = time_copy(s, d, nbytes, iters)
            t_lat = time_copy(s, d, 4, lat_iters)
            rows.append({"src": str(s), "dst": str(d), "peer_access": "yes" if peer else ("-" if s == d else "no"),
                         "bytes": nbytes, "GBs": nbytes / t_bw / 1e9, "latency_us": t_lat * 1e6})
    print_table(rows, ["src", "dst", "peer_access", "bytes", "GBs", "latency_us"],
                title=f"gobrrr bench p2p: copy bandwidth ({nbytes} B) and 4-byte latency")
    if len(devs) > 1:  # the matrix view: rows = source, columns = destination
        print("\nbandwidth matrix, GB/s (row = src, column = dst):")
        head = "        " + " ".join(f"{d.index:>8}" for d in devs)
        print(head)
        for s in devs:
            gbs = {(r["src"], r["dst"]): r["GBs"] for r in rows}
            cells = [f"{'-':>8}" if s == d else f"{gbs[(str(s), str(d))]:8.1f}"
                     for d in devs]
            print(f"{s.index:>8}" + " ".join(cells))
    figures = {"max_GBs": max(r["GBs"] for r in rows), "min_latency_us": min(r["latency_us"] for r in rows),
               "gpus": n_gpu}
    if n_gpu == 1:
        figures["d2d_read_write_GBs"] = 2 * rows[0]["GBs"]
    path = record("p2p", config={"bytes": nbytes, "iters": iters, "latency_iters": lat_iters}, rows=rows,
                  figures=figures, topology=topo, quick=args.quick, results=args.results)
    print(f"recorded to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
