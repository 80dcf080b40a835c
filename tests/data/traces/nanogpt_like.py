"""A nanoGPT-shaped training script, written for the doctor's overhead checks (not nanoGPT's code).

    python nanogpt_like.py [--compile] [--iters 40] [--batch 12] [--accum 4] [--layers 12] [--width 768]

Its loop reads like nanoGPT's train.py: random token batches fetched from pinned host memory with
`non_blocking=True`, bf16 autocast, gradient accumulation over micro-steps, gradient clipping, a fused
AdamW, `loss.item()` once per iteration for the log line, and its own timer around each iteration.
It prints one line per iteration and, at the end, the median iteration time over the iterations after
the first `--skip`: that is "the script's own timing" that `gobrrr doctor`'s plain step time is
checked against. The model is a GPT-2-style decoder (Radford et al. 2019) in ~60 lines.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq: int, layers: int, width: int, heads: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))  # (B, T, V)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--compile", action="store_true")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--skip", type=int, default=5, help="iterations left out of the median (start-up, compile)")
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args(argv)


def make_iteration(a: argparse.Namespace):
    """The model, optimizer and data of the run; returns `iteration(it) -> loss` (one whole iteration)."""
    torch.manual_seed(1337)
    device = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(a.vocab, a.seq, a.layers, a.width, a.heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    if a.compile:
        model = torch.compile(model)
    data = torch.randint(0, a.vocab, (64, a.seq + 1), dtype=torch.int64)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def get_batch(i: int):
        rows = data[(torch.arange(a.batch) + i * a.batch) % data.shape[0]]  # (B, T + 1)
        x, y = rows[:, :-1], rows[:, 1:]
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    batch = [get_batch(0)]

    def iteration(it: int) -> float:
        lr = 6e-4 * min(1.0, (it + 1) / 10) * 0.5 * (1 + math.cos(math.pi * it / max(a.iters, 1)))
        for group in opt.param_groups:
            group["lr"] = lr
        for micro in range(a.accum):
            X, Y = batch[0]
            with ctx:
                logits, loss = model(X, Y)
                loss = loss / a.accum
            batch[0] = get_batch(it * a.accum + micro + 1)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item() * a.accum  # sync: the log line, once per iteration, as nanoGPT does

    return iteration


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    iteration = make_iteration(a)
    times = []
    t0 = time.perf_counter()
    for it in range(a.iters):
        lossf = iteration(it)
        t1 = time.perf_counter()
        dt, t0 = (t1 - t0) * 1e3, t1
        times.append(dt)
        print(f"iter {it}: loss {lossf:.4f}, time {dt:.2f}ms", flush=True)
    kept = times[a.skip:] or times
    print(f"median iteration {statistics.median(kept):.3f} ms over {len(kept)} iterations "
          f"({'compiled' if a.compile else 'eager'})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
