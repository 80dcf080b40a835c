"""Record the small profiler traces that the doctor's tests read (tests/data/traces/*.json.gz).

    PYTHONPATH=. python tests/data/record_traces.py OUT_DIR [--device cuda|cpu]

Four loops, a few profiled steps each, recorded exactly the way `gobrrr doctor` records
(torch.profiler, CPU + CUDA activities, Python stacks, one `ProfilerStep#N` per step):

- naive:        pageable `.to(device)` of the batch on the compute stream, `.item()` every step
- prefetched:   pinned batches copied on a side stream one step ahead, overlapping compute
- sync_heavy:   `torch.cuda.synchronize()` and `.item()` inside the step
- launch_bound: hundreds of tiny elementwise kernels per step

Each trace is gzipped (well under 1 MB) and described in OUT_DIR/traces.json (torch version,
device name, loop sizes, host wall time per step). The script is self-contained on purpose:
the traces must not change when the doctor's code does.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

import torch

WAIT, WARMUP, ACTIVE = 1, 2, 3  # profiler schedule: steps skipped, warmed up, recorded


def _mlp(d_in: int, d_hidden: int, device: torch.device) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(d_in, d_hidden), torch.nn.ReLU(), torch.nn.Linear(d_hidden, 1)
    ).to(device)


def naive(device: torch.device):
    """The seed loop's naive form: a fresh pageable batch, `.to()` on the compute stream, `.item()` per step."""
    B, D = 1024, 4096  # 16 MB float32 batch per step
    model = _mlp(D, 256, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    host = [torch.randn(B, D) for _ in range(2)]  # pageable host memory

    def step(i: int) -> float:
        x = host[i % 2].to(device)  # (B, D) pageable copy: the host waits for it
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # sync: the loop prints/logs the loss every step

    return step, {"batch": [B, D], "batch_mb": B * D * 4 / 1e6}


def prefetched(device: torch.device):
    """Pinned batches copied on a side stream one step ahead; compute waits on an event, never the host."""
    if device.type != "cuda":
        raise RuntimeError("the prefetched loop needs CUDA streams")
    B, D, N = 2048, 4096, 2048  # 32 MB batch; compute: 6 matmuls of (N, N) per step
    host = [torch.randn(B, D).pin_memory() for _ in range(2)]
    dev = [torch.empty(B, D, device=device) for _ in range(2)]
    w = torch.randn(N, N, device=device) / N**0.5
    copy_stream = torch.cuda.Stream()
    copied = [torch.cuda.Event() for _ in range(2)]
    consumed = [torch.cuda.Event() for _ in range(2)]
    for e in consumed:
        e.record()
    state = {"acc": torch.zeros((), device=device)}

    def issue_copy(i: int) -> None:
        slot = i % 2
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_event(consumed[slot])  # the buffer's last reader has finished
            dev[slot].copy_(host[slot], non_blocking=True)  # overlap: H2D of batch i with compute of batch i-1
            copied[slot].record(copy_stream)

    issue_copy(0)

    def step(i: int) -> float:
        slot = i % 2
        issue_copy(i + 1)
        torch.cuda.current_stream().wait_event(copied[slot])
        x = dev[slot]  # (B, D)
        h = x[:N, :N]
        for _ in range(6):
            h = torch.tanh(h @ w)  # (N, N)
        state["acc"] = state["acc"] + h.mean() + x.mean()
        consumed[slot].record()
        return 0.0  # no sync in the loop

    return step, {"batch": [B, D], "batch_mb": B * D * 4 / 1e6, "matmul": N, "matmuls_per_step": 6}


def sync_heavy(device: torch.device):
    """A step that synchronises the device and reads scalars back several times."""
    N = 1024
    a = torch.randn(N, N, device=device)
    on_gpu = device.type == "cuda"

    def step(i: int) -> float:
        total = 0.0
        for _ in range(4):
            b = torch.relu(a @ a)  # (N, N)
            if on_gpu:
                torch.cuda.synchronize()  # sync: timing the matmul the wrong way
            total += b.mean().item()  # sync: reading a metric every inner iteration
        return total

    return step, {"matmul": N, "syncs_per_step": 4, "items_per_step": 4}


def launch_bound(device: torch.device):
    """Hundreds of tiny elementwise kernels: each runs for less time than its launch takes."""
    x = torch.randn(256, device=device)
    K = 150

    def step(i: int) -> float:
        y = x
        for _ in range(K):
            y = y * 1.0001 + 0.0001  # two tiny kernels, each ~2 us on the GPU
        x.copy_(y)
        return 0.0

    return step, {"elements": 256, "kernels_per_step": 2 * K + 1}


LOOPS = {"naive": naive, "prefetched": prefetched, "sync_heavy": sync_heavy, "launch_bound": launch_bound}


def record(name: str, device: torch.device, out_dir: str) -> dict:
    step, meta = LOOPS[name](device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    tmp = tempfile.mkdtemp()
    raw = os.path.join(tmp, "trace.json")
    step_s = []
    sched = torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)
    with torch.profiler.profile(
        activities=activities, schedule=sched, with_stack=True, record_shapes=False,
        on_trace_ready=lambda p: p.export_chrome_trace(raw),
    ) as prof:
        for i in range(WAIT + WARMUP + ACTIVE):
            t0 = time.perf_counter()
            step(i)
            step_s.append(time.perf_counter() - t0)
            prof.step()
        if device.type == "cuda":
            torch.cuda.synchronize()  # sync: the last step's kernels belong in the trace
    path = os.path.join(out_dir, f"{name}.json.gz")
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    shutil.rmtree(tmp, ignore_errors=True)
    meta.update(
        file=os.path.basename(path), bytes=os.path.getsize(path),
        host_step_ms=[round(s * 1e3, 3) for s in step_s[-ACTIVE:]],
    )
    return meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--only", nargs="*", choices=sorted(LOOPS), help="record only these loops")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    os.makedirs(args.out_dir, exist_ok=True)
    info = {
        "torch": torch.__version__, "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "schedule": {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE}, "loops": {},
    }
    for name in args.only or list(LOOPS):
        if name == "prefetched" and device.type != "cuda":
            print(f"skip {name}: needs CUDA")
            continue
        meta = record(name, device, args.out_dir)
        info["loops"][name] = meta
        print(f"{name:<13} {meta['bytes'] / 1e3:8.1f} kB  host ms/step {meta['host_step_ms']}")
    with open(os.path.join(args.out_dir, "traces.json"), "w") as f:
        json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
