"""`gobrrr bench zero`: ZeRO stages 1/2/3 against our ddp and against torch FSDP2, side by side.

    python -m gobrrr.bench.zero                         # one GPU: 124M GPT, B=8, T=1024
    torchrun --nproc-per-node 8 -m gobrrr.bench.zero    # any number of GPUs, no code change
    python -m gobrrr.bench.zero --quick                 # CPU smoke: tiny GPT, gloo, a few seconds

Variants (same initial weights, same batches, AdamW, bf16 autocast on a GPU):

  ddp      gobrrr.parallel.ddp: fp32 parameters, bf16 autocast (the baseline)
  zero1/2/3  gobrrr.parallel.zero(stage=S, param_dtype=bf16): bf16 parameters, fp32 masters
  fsdp2    torch's fully_shard per block + root, MixedPrecisionPolicy(param_dtype=bf16,
           reduce_dtype=fp32): the same memory model as zero3

Each variant is built, warmed up, timed for `--steps` steps per round over `--rounds` rounds
(median; CUDA events on a GPU; the slowest rank's time), then freed, so that its peak memory
(torch.cuda.max_memory_allocated, reset after the warm-up steps) is its own steady state. Figures: step time over ddp's and
over fsdp2's; peak over (stage formula + activations), where activations = ddp's peak minus its
formula (16 psi: fp32 parameters, gradients and Adam moments), measured in the same run.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from gobrrr.bench.common import device_name, median, print_table, record

MB = 1e6  # decimal megabytes, as every byte figure gobrrr prints


@dataclass
class BenchConfig:
    model: str = "124m"
    batch_size: int = 8
    seq_len: int = 1024
    steps: int = 5
    rounds: int = 3
    warmup: int = 3
    variants: tuple[str, ...] = ("ddp", "zero1", "zero2", "zero3", "fsdp2")

    @staticmethod
    def quick() -> "BenchConfig":
        return BenchConfig(model="tiny", batch_size=2, seq_len=32, steps=2, rounds=1, warmup=1)


def _adamw(model_or_params, fused: bool):
    params = model_or_params.parameters() if hasattr(model_or_params, "parameters") else model_or_params
    return torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)


def build(name: str, cfg: BenchConfig, device: torch.device):
    """(model, optimizer, clip function) for one variant, from the same seed."""
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.parallel import ddp, zero

    torch.manual_seed(0)
    base = GPT(GPTConfig.from_name(cfg.model)).to(device)
    fused = device.type == "cuda"
    bf16 = torch.bfloat16 if device.type == "cuda" else None
    if name == "ddp":
        model = ddp(base)
        opt = _adamw(base, fused)
        return model, opt, lambda: torch.nn.utils.clip_grad_norm_(base.parameters(), 1.0)
    if name.startswith("zero"):
        model, opt = zero(base, lambda m: _adamw(m, fused), stage=int(name[-1]), param_dtype=bf16)
        return model, opt, lambda: opt.clip_grad_norm_(1.0)
    if name == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
                                  reduce_dtype=torch.float32)
        for block in base.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(base, mp_policy=mp)
        opt = _adamw(base, fused)
        return base, opt, lambda: torch.nn.utils.clip_grad_norm_(base.parameters(), 1.0)
    raise ValueError(f"bench zero: unknown variant {name!r}; choose from ddp, zero1, zero2, zero3, fsdp2")


def _step(model, opt, clip, x, y, autocast) -> None:
    with autocast():
        _, loss = model(x, y)
    loss.backward()
    clip()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()  # sync: benchmark boundary, outside the timed work
        s = a.elapsed_time(b) / 1e3
    else:
        t0 = time.perf_counter()
        fn()
        s = time.perf_counter() - t0
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([s], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        s = t.item()  # sync: benchmark boundary
    return s


def formula_mb(name: str, psi: int, world: int, cuda: bool) -> float | None:
    from gobrrr.parallel.zero.shard import formula_bytes

    if name == "ddp":  # fp32 parameters (autocast computes in bf16): the fp32-only row
        return formula_bytes(0, psi, world, mixed=False)["total"] / MB
    stage = {"zero1": 1, "zero2": 2, "zero3": 3, "fsdp2": 3}[name]
    return formula_bytes(stage, psi, world, mixed=cuda)["total"] / MB


def run_variant(name: str, cfg: BenchConfig, rank, batches, autocast) -> dict:
    dev = rank.device
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()  # sync: between variants, outside any timing
        torch.cuda.empty_cache()
    model, opt, clip = build(name, cfg, dev)
    for i in range(cfg.warmup):
        _step(model, opt, clip, *batches[i % len(batches)], autocast)
    if cuda:  # the steady state's peak: not the build's transients (the fp32 model before sharding)
        torch.cuda.synchronize()  # sync: outside any timing
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(cfg.rounds):
        def work():
            for i in range(cfg.steps):
                _step(model, opt, clip, *batches[i % len(batches)], autocast)
        times.append(_timed(work, dev) / cfg.steps)
    psi = sum(p.numel() for p in (model.module if hasattr(model, "module") else model).parameters())
    row = {"variant": name, "ms_per_step": median(times) * 1e3,
           "tokens_per_s": cfg.batch_size * cfg.seq_len * rank.world_size / median(times),
           "peak_mb": torch.cuda.max_memory_allocated(dev) / MB if cuda else None,
           "formula_mb": formula_mb(name, psi, rank.world_size, cuda)}
    model = opt = clip = None  # free them before the next variant (the closures are done with them)
    gc.collect()
    return row


def run_bench(rank, cfg: BenchConfig) -> dict:
    from gobrrr.train.data import SyntheticTokens

    dev = rank.device
    src = SyntheticTokens(50304 if cfg.model == "124m" else 256, cfg.seq_len, cfg.batch_size, seed=rank.rank)
    batches = [tuple(t.to(dev) for t in src.batch(i)) for i in range(4)]  # (B, T) each
    autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev.type == "cuda"
                else contextlib.nullcontext)
    rows = [run_variant(v, cfg, rank, batches, autocast) for v in cfg.variants]
    by = {r["variant"]: r for r in rows}
    act = None
    if "ddp" in by and by["ddp"]["peak_mb"] is not None:
        act = by["ddp"]["peak_mb"] - by["ddp"]["formula_mb"]  # activations + transients, measured
    for r in rows:
        r["over_ddp"] = r["ms_per_step"] / by["ddp"]["ms_per_step"] if "ddp" in by else None
        r["over_fsdp2"] = r["ms_per_step"] / by["fsdp2"]["ms_per_step"] if "fsdp2" in by else None
        r["peak_over_formula_plus_act"] = (r["peak_mb"] / (r["formula_mb"] + act)
                                          if act is not None and r["peak_mb"] is not None else None)
    return {"rows": rows, "figures": {"activations_mb": act}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gobrrr bench zero", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke test: tiny GPT, nothing recorded")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--variants", default=None, help="comma list of ddp,zero1,zero2,zero3,fsdp2")
    a = p.parse_args(argv)
    cfg = BenchConfig.quick() if a.quick else BenchConfig()
    if a.steps is not None:
        cfg.steps = a.steps
    if a.batch_size is not None:
        cfg.batch_size = a.batch_size
    if a.variants:
        cfg.variants = tuple(v.strip() for v in a.variants.split(",") if v.strip())
        bad = [v for v in cfg.variants if v not in BenchConfig().variants]
        if bad:
            p.error(f"unknown variants {bad}; choose from {', '.join(BenchConfig().variants)}")
    device = "cpu" if a.quick or not torch.cuda.is_available() else None

    import gobrrr.comm as gd

    with gd.session(device=device) as rank:  # adopts a live group (and leaves it alive), else makes one and ends it
        result = run_bench(rank, cfg)
    if rank.is_main:
        title = (f"bench zero: GPT {cfg.model}, {rank.world_size} rank(s) on {device_name(rank.device)}, "
                 f"B={cfg.batch_size} T={cfg.seq_len} per rank, median of {cfg.rounds} rounds x {cfg.steps} steps; "
                 "MB = 1e6 bytes")
        print_table(result["rows"], ["variant", "ms_per_step", "tokens_per_s", "over_ddp", "over_fsdp2", "peak_mb",
                                     "formula_mb", "peak_over_formula_plus_act"], title=title)
        act = result["figures"]["activations_mb"]
        if act is not None:
            print(f"  activations (ddp peak - 16 psi): {act:.0f} MB")
        if not a.quick:
            path = record("zero", config=asdict(cfg), rows=result["rows"], figures=result["figures"],
                          world_size=rank.world_size)
            print(f"  appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
