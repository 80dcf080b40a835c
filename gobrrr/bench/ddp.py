"""`gobrrr bench ddp`: our bucketed ddp against a plain step, NaiveDDP and torch's DistributedDataParallel.

    python -m gobrrr.bench.ddp                                   # one GPU: ddp/plain step time, tokens/s, MFU (124M GPT)
    torchrun --nproc-per-node 8 -m gobrrr.bench.ddp              # 8 GPUs: + ddp vs torch DDP, scaling, accumulation
    python -m gobrrr.bench.ddp --quick                           # CPU smoke: tiny GPT, gloo, a few seconds

Every variant holds its own copy of the same model (same init, same batch, AdamW, bf16
autocast on GPU) and they are timed *interleaved*: round after round, each variant runs
`--steps` optimizer steps, the round order reversing every other round, and a variant's step
time is the median over rounds (each round's time is the slowest rank's, from CUDA events on
GPU). Variants:

  plain          the unwrapped model, no communication: what one GPU does alone
  ddp            gobrrr.parallel.ddp (bucketed, overlapped)          ddp-bf16: with bf16 compression
  naive          gobrrr.parallel.NaiveDDP (one all-reduce per tensor after backward)
  torch-ddp      torch.nn.parallel.DistributedDataParallel, default settings, same bucket size
  ddp-accumK     K micro-steps per optimizer step under no_sync(): one reduction per step
  ddp-accumK-sync  the same K micro-steps, communicating after every micro-step

Figures: ddp step time / plain step time; tokens/s and MFU (of the peak in gobrrr/plan/machine.py's GPUS
table); ddp tokens/s over torch-ddp's;
scaling efficiency = ddp tokens/s per GPU over plain tokens/s per GPU measured in the same run
(every GPU stepping alone at the same moment is the single-GPU baseline; `--baseline-json` adds
the same ratio against a separate world-size-1 record); accumulation's saving =
1 - t(accumK) / t(accumK-sync). The fraction of all-reduce time hidden under backward is
*estimated from CUDA-event step times*, not from a trace: 1 - (t_ddp - t_plain) / t_allreduce,
where t_allreduce is the time to all-reduce every bucket back to back with no compute.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import time
from dataclasses import asdict, dataclass, replace

import torch
import torch.distributed as dist

from gobrrr.bench.common import (
    Parser,
    add_results_option,
    device_name,
    median,
    parse_device,
    positive,
    print_table,
    record,
)
from gobrrr.plan.machine import peak_flops


@dataclass
class BenchConfig:
    model: str = "124m"
    batch_size: int = 16        # rows per rank per micro-step
    seq_len: int = 1024
    steps: int = 8              # optimizer steps per variant per round
    rounds: int = 5
    warmup: int = 3             # untimed steps per variant before the first round
    grad_accum: int = 4         # K for the accumulation variants (0 or 1 skips them)
    bucket_mb: float = 25
    variants: tuple[str, ...] = ("plain", "ddp", "torch-ddp", "naive", "ddp-bf16", "accum")
    baseline_json: str | None = None

    @staticmethod
    def quick() -> "BenchConfig":
        return BenchConfig(model="tiny", batch_size=4, seq_len=32, steps=2, rounds=2, warmup=1, grad_accum=2)


@dataclass
class Variant:
    name: str
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    accum: int = 1
    no_sync: bool = False       # skip communication on all but the last micro-step


def _build(cfg: BenchConfig, device: torch.device, world: int):
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.parallel import NaiveDDP, ddp

    torch.manual_seed(0)
    base = GPT(GPTConfig.from_name(cfg.model)).to(device)
    fused = device.type == "cuda"

    def variant(name, model, **kw):
        return Variant(name, model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused), **kw)

    out = []
    want = set(cfg.variants)
    if "plain" in want:
        out.append(variant("plain", copy.deepcopy(base)))
    if "ddp" in want or "accum" in want:
        ours = variant("ddp", ddp(copy.deepcopy(base), bucket_mb=cfg.bucket_mb))
        if "ddp" in want:
            out.append(ours)
        if "accum" in want and cfg.grad_accum > 1:
            k = cfg.grad_accum  # same model and optimizer, two ways of accumulating
            out.append(replace(ours, name=f"ddp-accum{k}", accum=k, no_sync=True))
            out.append(replace(ours, name=f"ddp-accum{k}-sync", accum=k, no_sync=False))
    if "torch-ddp" in want and dist.is_initialized():
        ids = [device.index] if device.type == "cuda" else None
        out.append(variant("torch-ddp", torch.nn.parallel.DistributedDataParallel(
            copy.deepcopy(base), device_ids=ids, bucket_cap_mb=cfg.bucket_mb)))
    if "naive" in want:
        out.append(variant("naive", NaiveDDP(copy.deepcopy(base))))
    if "ddp-bf16" in want and world > 1:  # at world size 1 there is nothing to compress
        out.append(variant("ddp-bf16", ddp(copy.deepcopy(base), bucket_mb=cfg.bucket_mb, grad_dtype=torch.bfloat16)))
    return base, out


def _step(v: Variant, batches, autocast) -> None:
    for i, (x, y) in enumerate(batches[:v.accum]):
        skip = v.no_sync and i < v.accum - 1
        ctx = v.model.no_sync() if skip else contextlib.nullcontext()
        with ctx:
            with autocast():
                _, loss = v.model(x, y)
            (loss / v.accum).backward()
    v.opt.step()
    v.opt.zero_grad(set_to_none=True)


class _Clock:
    """Elapsed seconds of a block: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            self.end.synchronize()  # sync: benchmark boundary, outside the timed work
            self.seconds = self.start.elapsed_time(self.end) / 1e3
        else:
            self.seconds = time.perf_counter() - self.t0


def _slowest(seconds: float, device: torch.device) -> float:
    """The slowest rank's time (every rank gets the same number)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())  # sync: benchmark bookkeeping between rounds


def _allreduce_alone(model, device: torch.device, reps: int) -> float:
    """Seconds to all-reduce every bucket of `model` (a gobrrr DDP) back to back, no compute."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return 0.0
    times = []
    for _ in range(reps + 1):
        with _Clock(device) as c:
            for b in model.buckets:
                dist.all_reduce(b.buffer)
        times.append(_slowest(c.seconds, device))
    return median(times[1:])


def run_bench(rank, cfg: BenchConfig) -> dict:
    """Run every variant interleaved on this rank (all ranks call it); return rows and figures."""
    from gobrrr.train.data import SyntheticTokens

    device, world = rank.device, rank.world_size
    base, variants = _build(cfg, device, world)
    k = max(1, cfg.grad_accum)
    src = SyntheticTokens(base.config.vocab_size, cfg.seq_len, cfg.batch_size, seed=0, rank=rank.rank,
                          world_size=world)
    batches = [tuple(t.to(device) for t in src.batch(i)) for i in range(k)]  # (B, T) each
    if device.type == "cuda":
        autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    steps_of = {v.name: max(1, cfg.steps // v.accum) for v in variants}  # keep each variant's round similar

    for v in variants:
        for _ in range(cfg.warmup):
            _step(v, batches, autocast)
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    for r in range(cfg.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            with _Clock(device) as c:
                for _ in range(steps_of[v.name]):
                    _step(v, batches, autocast)
            times[v.name].append(_slowest(c.seconds, device) / steps_of[v.name])

    flops_tok = base.flops_per_token(cfg.seq_len)
    peak = peak_flops(device)[0]
    step_s = {name: median(ts) for name, ts in times.items()}
    rows = []
    for v in variants:
        tok_gpu = cfg.batch_size * cfg.seq_len * v.accum / step_s[v.name]
        rows.append({"variant": v.name, "accum": v.accum, "ms_per_step": step_s[v.name] * 1e3,
                     "tokens_per_s": tok_gpu * world, "tokens_per_s_per_gpu": tok_gpu,
                     "mfu": None if peak is None else flops_tok * tok_gpu / peak,
                     "step_min_ms": min(times[v.name]) * 1e3, "step_max_ms": max(times[v.name]) * 1e3})
    figures = _figures(rows, cfg, world)
    ours = next((v.model for v in variants if v.name == "ddp"), None)
    if ours is not None:
        figures["buckets"] = len(ours.buckets)
        figures["grad_mb"] = sum(b.nbytes for b in ours.buckets) / 1e6  # MB = 1e6 bytes
    if ours is not None and world > 1 and "plain" in step_s:
        t_ar = _allreduce_alone(ours, device, reps=max(2, cfg.rounds))
        figures["allreduce_alone_ms"] = t_ar * 1e3
        for name in ("ddp", "torch-ddp", "naive"):
            if t_ar > 0 and name in step_s:  # exposed communication = step time beyond the plain step's
                exposed = max(0.0, step_s[name] - step_s["plain"])
                figures[f"hidden_allreduce_fraction_est_{name}"] = max(0.0, min(1.0, 1 - exposed / t_ar))
    return {"rows": rows, "figures": figures}


def _figures(rows: list[dict], cfg: BenchConfig, world: int) -> dict:
    by = {r["variant"]: r for r in rows}
    f: dict = {"world_size": world}
    if "ddp" in by and "plain" in by:
        f["ddp_over_plain_step_time"] = by["ddp"]["ms_per_step"] / by["plain"]["ms_per_step"]
        f["scaling_efficiency_same_run"] = by["ddp"]["tokens_per_s_per_gpu"] / by["plain"]["tokens_per_s_per_gpu"]
    for name in ("ddp", "naive", "ddp-bf16"):
        if name in by and "torch-ddp" in by:
            f[f"{name}_over_torch_ddp_tokens_per_s"] = by[name]["tokens_per_s"] / by["torch-ddp"]["tokens_per_s"]
    k = cfg.grad_accum
    if f"ddp-accum{k}" in by and f"ddp-accum{k}-sync" in by:
        f["accum_k"] = k
        f["accum_time_saving"] = 1 - by[f"ddp-accum{k}"]["ms_per_step"] / by[f"ddp-accum{k}-sync"]["ms_per_step"]
        f["accum_collectives_saved"] = 1 - 1 / k
    if cfg.baseline_json and "ddp" in by:
        base = _baseline_tokens_per_gpu(cfg.baseline_json)
        f["baseline_plain_tokens_per_s_per_gpu"] = base
        f["scaling_efficiency_vs_baseline"] = by["ddp"]["tokens_per_s_per_gpu"] / base
    return f


def _baseline_tokens_per_gpu(path: str) -> float:
    """The plain variant's tokens/s per GPU from the last world-size-1 record of a bench/ddp JSONL file."""
    with open(path) as fh:
        records = [json.loads(ln) for ln in fh if ln.strip()]
    for rec in reversed(records):
        plain = [r for r in rec.get("rows", []) if r.get("variant") == "plain"]
        if rec.get("world_size") == 1 and plain:
            return float(plain[0]["tokens_per_s_per_gpu"])
    raise ValueError(f"--baseline-json {path} holds no world-size-1 record with a 'plain' row; "
                     "run `gobrrr bench ddp` on one GPU first.")


def main(argv: list[str] | None = None) -> int:
    d = BenchConfig()
    p = Parser(prog="gobrrr bench ddp", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke: tiny GPT, gloo, a few seconds")
    p.add_argument("--model", default=None, help=f"GPT config name (default {d.model})")
    p.add_argument("--batch-size", type=positive(int), default=None, help=f"rows per rank per micro-step ({d.batch_size})")
    p.add_argument("--seq-len", type=positive(int), default=None, help=f"({d.seq_len})")
    p.add_argument("--steps", type=positive(int), default=None, help=f"optimizer steps per variant per round ({d.steps})")
    p.add_argument("--rounds", type=positive(int), default=None, help=f"({d.rounds})")
    p.add_argument("--warmup", type=int, default=None, help=f"({d.warmup})")
    p.add_argument("--grad-accum", type=positive(int), default=None, help=f"K of the accumulation variants ({d.grad_accum})")
    p.add_argument("--bucket-mb", type=positive(float), default=None, help=f"MiB, as torch DDP's bucket_cap_mb ({d.bucket_mb})")
    p.add_argument("--variants", default=None, help=f"comma list from {','.join(d.variants)}")
    p.add_argument("--baseline-json", default=None, help="a world-size-1 ddp.jsonl: scaling efficiency against it")
    p.add_argument("--device", default=None, help="cpu or cuda (default cuda when available; --quick: cpu)")
    add_results_option(p)
    a = p.parse_args(argv)
    from gobrrr.models.gpt import _CONFIGS

    if a.model is not None and a.model not in _CONFIGS:
        p.error(f"--model {a.model!r} is not a GPT config; choose one of {', '.join(_CONFIGS)}")
    if a.warmup is not None and a.warmup < 0:
        p.error(f"--warmup {a.warmup} must be >= 0")

    cfg = BenchConfig.quick() if a.quick else BenchConfig()
    for field in ("model", "batch_size", "seq_len", "steps", "rounds", "warmup", "grad_accum", "bucket_mb",
                  "baseline_json"):
        if getattr(a, field) is not None:
            cfg = replace(cfg, **{field: getattr(a, field)})
    if a.variants:
        cfg = replace(cfg, variants=tuple(x.strip() for x in a.variants.split(",") if x.strip()))
    device = parse_device(p, a.device) or ("cpu" if a.quick or not torch.cuda.is_available() else None)
    if cfg.baseline_json:  # fail before the run, not after it
        if not os.path.exists(cfg.baseline_json):
            p.error(f"--baseline-json {cfg.baseline_json} does not exist; run `gobrrr bench ddp` on one GPU first "
                    "or drop the flag (the same-run scaling figure needs no baseline).")
        _baseline_tokens_per_gpu(cfg.baseline_json)

    import gobrrr.comm as gd

    with gd.session(device=device) as rank:  # adopts a live group (and leaves it alive), else makes one and ends it
        result = run_bench(rank, cfg)
    if rank.is_main:
        title = (f"bench ddp: GPT {cfg.model}, {rank.world_size} rank(s) on {device_name(rank.device)}, "
                 f"B={cfg.batch_size} T={cfg.seq_len} per rank, median of {cfg.rounds} interleaved rounds")
        print_table(result["rows"], ["variant", "accum", "ms_per_step", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
                                     "step_min_ms", "step_max_ms"], title=title)
        for key, value in result["figures"].items():
            print(f"  {key.replace('ddp_over_plain', 'ddp/plain')}: {value:.4g}" if isinstance(value, float)
                  else f"  {key}: {value}")
        path = record("ddp", config=asdict(cfg), rows=result["rows"], figures=result["figures"],
                      world_size=rank.world_size, quick=a.quick, results=a.results)
        print(f"  appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
