"""The seed loop: a training loop as people write it, then the same loop after three lines of gobrrr.

    python examples/seed_loop.py                       # both loops, side by side, and the speedup
    python examples/seed_loop.py --mode naive          # just one loop (what `gobrrr doctor` profiles)
    python examples/seed_loop.py --device cpu --steps 3

The naive loop moves each batch with a pageable `.to(device)` (a synchronous copy at a fraction of
the link's speed, on the compute stream) and reads the loss with `.item()` every step (the host
waits for the GPU to drain, so the next copy cannot start early). The gobrrr loop changes three lines:

    loader = gobrrr.Prefetcher(loader, device=device)   # 1. batches pinned by threads, copied on a side stream
    total += loss.detach()                                # 2. the loss stays on the device
    print(total.item() / steps)                           # 3. read once, at the end

Both loops see the same batches (pageable CPU tensors, as a dataset in memory gives them), the
same model (an MLP classifier with TF32 matmuls) and step an AdamW optimizer every step.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from torch import nn

import gobrrr


@dataclass
class SeedConfig:
    batch: int = 256
    side: int = 128            # images are (3, side, side) float32: 256x3x128x128 = 50 MB a batch
    classes: int = 100
    hidden: int = 1024
    steps: int = 50
    warmup: int = 5
    distinct: int = 8          # distinct batches in memory, cycled through


class Batches:
    """`steps` pageable (images, labels) batches cycled from `distinct` made once: an in-memory dataset."""

    def __init__(self, cfg: SeedConfig, steps: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = [(torch.randn(cfg.batch, 3, cfg.side, cfg.side, generator=g),       # (B, 3, S, S)
                      torch.randint(0, cfg.classes, (cfg.batch,), generator=g))          # (B,)
                     for _ in range(cfg.distinct)]
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for i in range(self.steps):
            yield self.data[i % len(self.data)]


def make_model(cfg: SeedConfig, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * cfg.side * cfg.side, cfg.hidden), nn.GELU(),
                          nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.classes)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, opt


def naive_loop(cfg: SeedConfig, device: torch.device) -> tuple[float, float]:
    """The loop as usually written. Returns (ms per step, mean loss)."""
    model, opt = make_model(cfg, device)
    loader = Batches(cfg, cfg.warmup + cfg.steps)
    total, t0 = 0.0, None
    for step, (x, y) in enumerate(loader):
        if step == cfg.warmup:
            _drain(device)
            t0, total = time.perf_counter(), 0.0
        x, y = x.to(device), y.to(device)              # pageable, synchronous copy
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total += loss.item()                           # the host waits for the GPU, every step
    _drain(device)
    return (time.perf_counter() - t0) * 1e3 / cfg.steps, total / cfg.steps


def gobrrr_loop(cfg: SeedConfig, device: torch.device) -> tuple[float, float, gobrrr.loader.prefetch.PrefetchStats]:
    """The same loop with three lines changed. Returns (ms per step, mean loss, Prefetcher stats)."""
    model, opt = make_model(cfg, device)
    loader = gobrrr.Prefetcher(Batches(cfg, cfg.warmup + cfg.steps), device=device)   # 1.
    total, t0 = torch.zeros((), device=device), None
    for step, (x, y) in enumerate(loader):
        if step == cfg.warmup:
            _drain(device)
            t0, total = time.perf_counter(), torch.zeros((), device=device)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total += loss.detach()                         # 2. stays on the device
        if step == cfg.warmup - 1:
            loader.reset_stats()                       # the stats cover the timed steps' batches
    mean_loss = total.item() / cfg.steps               # 3. one read, at the end
    _drain(device)
    return (time.perf_counter() - t0) * 1e3 / cfg.steps, mean_loss, loader.stats()


def _drain(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync: timing boundary, outside the measured steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the seed loop: naive vs gobrrr, side by side")
    p.add_argument("--mode", choices=("naive", "gobrrr", "both"), default="both")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 50 on a GPU, 3 on the CPU)")
    p.add_argument("--device", default=None, help="'cuda' or 'cpu' (default: the GPU if any)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--side", type=int, default=None, help="image side (default 128 on a GPU, 16 on the CPU)")
    args = p.parse_args(argv)
    device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    cfg = SeedConfig(steps=args.steps or (50 if gpu else 3), warmup=5 if gpu else 1)
    if not gpu:
        cfg.side, cfg.batch, cfg.hidden, cfg.distinct = 16, 32, 64, 2
    cfg.side = args.side or cfg.side
    cfg.batch = args.batch or cfg.batch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    mb = cfg.batch * 3 * cfg.side * cfg.side * 4 / 1e6
    print(f"seed loop on {device}: batch {cfg.batch}x3x{cfg.side}x{cfg.side} float32 ({mb:.1f} MB), "
          f"MLP hidden {cfg.hidden}, AdamW, {cfg.steps} timed steps after {cfg.warmup} warm-up")
    results = {}
    if args.mode in ("naive", "both"):
        ms, loss = naive_loop(cfg, device)
        results["naive"] = ms
        print(f"  naive  (pageable .to(), .item() every step): {ms:8.2f} ms/step   mean loss {loss:.4f}")
    if args.mode in ("gobrrr", "both"):
        ms, loss, stats = gobrrr_loop(cfg, device)
        results["gobrrr"] = ms
        print(f"  gobrrr (Prefetcher, loss kept on device):    {ms:8.2f} ms/step   mean loss {loss:.4f}")
        print(f"  {stats}")
    if len(results) == 2 and gpu:
        print(f"  speedup: {results['naive'] / results['gobrrr']:.2f}x")
    elif len(results) == 2:  # nothing crosses a bus on a CPU: the two times differ by noise, not by overlap
        print("  speedup: not measured on a CPU (batches pass through, no copy to hide); run it on a GPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
