"""`gobrrr bench tp`: what the tensor-parallel code path costs, against the plain model and torch's TP.

    python -m gobrrr.bench.tp                                  # one GPU: plain vs tp=1 (124M GPT), syncs per step
    torchrun --nproc-per-node 4 -m gobrrr.bench.tp             # 4 GPUs: ours at tp=4 (+-SP) vs torch parallelize_module
    python -m gobrrr.bench.tp --quick                          # CPU smoke test: tiny GPT, a few seconds

Every variant holds its own copy of the same model (same init, same batch, fused AdamW on GPU,
bf16 autocast on GPU) and the variants are timed *interleaved*: round after round each runs
`--steps` optimizer steps (the order reversing every other round); a variant's step time is its
median over rounds (CUDA events on GPU, the slowest rank's). Variants:

  plain        the unmodified GPT on each rank, no communication (at world 1: the baseline)
  tp           gobrrr.parallel.tp over all ranks (at world 1: tp = 1, the same code path: sliced
               linears that are whole, the loss through vocab_parallel_cross_entropy)
  tp-sp        the same with sequence parallelism
  torch-tp     torch's parallelize_module (ColwiseParallel/RowwiseParallel, loss_parallel), world > 1
  torch-tp-sp  with SequenceParallel, world > 1

Figures: tp / plain step time (the cost of the TP path; at world 1 the target is <= 1.02), tokens/s
per variant, ours over torch's, and host-device syncs in one tp step, counted by
`gobrrr.sync_budget(0)` (the target is 0; CUDA only).
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import asdict, dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from gobrrr.bench.common import Parser, add_results_option, median, positive, print_table, record


@dataclass
class BenchConfig:
    model: str = "124m"
    batch_size: int = 8         # rows per step (the same rows on every tp rank)
    seq_len: int = 1024
    steps: int = 10             # optimizer steps per variant per round
    rounds: int = 5
    warmup: int = 3

    @staticmethod
    def quick() -> "BenchConfig":
        return BenchConfig(model="tiny", batch_size=4, seq_len=64, steps=3, rounds=2, warmup=1)


def torch_plan(sp: bool) -> dict:
    """The reference GPT for torch's parallelize_module (its fused QKV rows permuted by `qkv_rows` first)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sp:
        return {"wte": RowwiseParallel(input_layouts=Replicate()),
                "blocks.*.attn.qkv": ColwiseParallel(), "blocks.*.attn.proj": RowwiseParallel(),
                "blocks.*.mlp.fc": ColwiseParallel(), "blocks.*.mlp.proj": RowwiseParallel(),
                "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {"wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "wpe": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0)),
            "blocks.*.ln1": SequenceParallel(), "blocks.*.ln2": SequenceParallel(), "ln_f": SequenceParallel(),
            "blocks.*.attn": gather, "blocks.*.mlp": gather,
            "blocks.*.attn.qkv": ColwiseParallel(), "blocks.*.attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "blocks.*.mlp.fc": ColwiseParallel(), "blocks.*.mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}


def qkv_rows(n: int, C: int, inverse: bool = False) -> torch.Tensor:
    """Row order that groups a fused QKV by tp rank, [q_0 k_0 v_0 | q_1 k_1 v_1 ...], so that torch's
    contiguous Shard(0) gives rank r what our Colwise(chunks=3) gives it (or the inverse order)."""
    order = torch.arange(3 * C).view(3, n, C // n).transpose(0, 1).reshape(-1)
    return torch.argsort(order) if inverse else order


def torch_tp(model: nn.Module, n: int, device: torch.device, sp: bool) -> nn.Module:
    """`model` (a GPT) through torch's parallelize_module over all ranks; lm_head untied (DTensor unties it)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    model.lm_head.weight = nn.Parameter(model.wte.weight.detach().clone())
    rows = qkv_rows(n, model.config.n_embd).to(device)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight.copy_(blk.attn.qkv.weight[rows])
            if blk.attn.qkv.bias is not None:
                blk.attn.qkv.bias.copy_(blk.attn.qkv.bias[rows])
            blk.attn.n_head //= n
    return parallelize_module(model, init_device_mesh(device.type, (n,)), torch_plan(sp))


class _Timer:
    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.end.record()
            self.end.synchronize()  # sync: once per timed round, outside the steps
            self.seconds = self.start.elapsed_time(self.end) / 1e3
        else:
            self.seconds = time.perf_counter() - self.t0


def _variants(cfg: BenchConfig, device: torch.device, world: int) -> dict:
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.models.gpt_plan import GPT_PLAN
    from gobrrr.parallel.tp.parallelize import tp

    torch.manual_seed(0)
    base = GPT(GPTConfig.from_name(cfg.model)).to(device)
    made = {"plain": copy.deepcopy(base), "tp": tp(copy.deepcopy(base), plan=GPT_PLAN),
            "tp-sp": tp(copy.deepcopy(base), plan=GPT_PLAN, sequence_parallel=True)}
    if world > 1:
        made["torch-tp"] = torch_tp(copy.deepcopy(base), world, device, sp=False)
        made["torch-tp-sp"] = torch_tp(copy.deepcopy(base), world, device, sp=True)
    fused = device.type == "cuda"
    return {name: (m, torch.optim.AdamW(m.parameters(), lr=1e-4, fused=fused)) for name, m in made.items()}


def _step(name: str, model, opt, x, y, autocast) -> None:
    from torch.distributed.tensor.parallel import loss_parallel

    def ctx():  # torch's loss_parallel is a one-shot context manager: a fresh one per use
        return loss_parallel() if name.startswith("torch") else contextlib.nullcontext()

    with ctx(), autocast:
        _, loss = model(x, y)
    with ctx():
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _slowest(seconds: float, device: torch.device) -> float:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return seconds
    t = torch.tensor([seconds], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()  # sync: once per round, after the timed steps


def run_bench(cfg: BenchConfig, device: torch.device, world: int) -> dict:
    from gobrrr.syncs.watch import watch_syncs

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext())
    variants = _variants(cfg, device, world)
    g = torch.Generator().manual_seed(1)
    vocab = next(iter(variants.values()))[0].config.vocab_size
    # once, before timing: a CPU generator gives every rank and device the same batch
    x = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len), generator=g).to(device)  # gobrrr: ignore[GB001]
    y = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len), generator=g).to(device)  # gobrrr: ignore[GB001]
    for name, (m, opt) in variants.items():
        for _ in range(cfg.warmup):
            _step(name, m, opt, x, y, autocast)
    syncs = None
    if device.type == "cuda":
        m, opt = variants["tp"]
        with watch_syncs() as w:  # the same check as gobrrr.sync_budget(0), reported instead of raised
            _step("tp", m, opt, x, y, autocast)
        syncs = w.count
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(cfg.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            m, opt = variants[name]
            with _Timer(device) as t:
                for _ in range(cfg.steps):
                    _step(name, m, opt, x, y, autocast)
            times[name].append(_slowest(t.seconds, device) / cfg.steps)
    tokens = cfg.batch_size * cfg.seq_len
    rows = [{"variant": n, "tp": 1 if n == "plain" else world, "ms_per_step": median(ts) * 1e3,
             "tokens_per_s": tokens / median(ts), "min_ms": min(ts) * 1e3, "max_ms": max(ts) * 1e3}
            for n, ts in times.items()]
    by = {r["variant"]: r for r in rows}
    figures = {"tp_over_plain": by["tp"]["ms_per_step"] / by["plain"]["ms_per_step"],
               "tp_sp_over_plain": by["tp-sp"]["ms_per_step"] / by["plain"]["ms_per_step"],
               "syncs_per_tp_step": syncs}
    if world > 1:
        figures["tp_over_torch_tp"] = by["torch-tp"]["ms_per_step"] / by["tp"]["ms_per_step"]
        figures["tp_sp_over_torch_tp_sp"] = by["torch-tp-sp"]["ms_per_step"] / by["tp-sp"]["ms_per_step"]
    return {"rows": rows, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="gobrrr bench tp", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke test: tiny GPT, few steps, no record written")
    p.add_argument("--model", choices=["tiny", "small", "124m"])
    p.add_argument("--batch-size", type=positive(int))
    p.add_argument("--seq-len", type=positive(int))
    p.add_argument("--steps", type=positive(int))
    p.add_argument("--rounds", type=positive(int))
    add_results_option(p)
    args = p.parse_args(argv)
    cfg = BenchConfig.quick() if args.quick else BenchConfig()
    cfg = replace(cfg, **{k: v for k, v in vars(args).items() if k not in ("quick", "results") and v is not None})
    import gobrrr.comm as gd

    device = "cpu" if args.quick or not torch.cuda.is_available() else None
    with gd.session(device=device) as rank:
        result = run_bench(cfg, rank.device, rank.world_size)
        if rank.is_main:
            print_table(result["rows"], ["variant", "tp", "ms_per_step", "tokens_per_s", "min_ms", "max_ms"],
                        title=f"tp bench: {cfg.model}, batch {cfg.batch_size} x {cfg.seq_len}, {rank.world_size} rank(s), "
                              f"{rank.device.type}")
            for k, v in result["figures"].items():
                print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
            if not args.quick:
                path = record("tp", config=asdict(cfg), rows=result["rows"], figures=result["figures"],
                              world_size=rank.world_size, results=args.results)
                print(f"appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
