"""The training loop of `gobrrr train`, top to bottom: one function, the same at every world size and layout.

    result = train(TrainConfig(model="tiny", steps=200, out="runs/tiny"))   # joins torchrun's group if any

One step, per rank (at world size 1 communication is a no-op):
  1. K micro-batches (--grad-accum K) arrive through `gobrrr.Prefetcher`; micro-batch i of the run is
     a pure function of (seed, i), and each data-parallel rank keeps its rows of the global batch;
  2. forward + backward (bf16 autocast on a GPU), gradients reduced by the layout's wrapper during
     the last backward, the gradient norm clipped, the warmup+cosine learning rate set, AdamW
     (gobrrr.train.step.train_step; on a GPU at one rank the whole step replays as one CUDA graph,
     gobrrr.train.graph);
  3. the loss stays on the device; every --log-every steps the losses are averaged over ranks and
     read in one go, the only host-device sync in the loop (gobrrr.train.metrics);
  4. every --ckpt-every steps (and at the end) every rank writes its part of the checkpoint
     (gobrrr.train.checkpoints), atomically.

Which layout (ddp, ZeRO 1-3, tp, tp + ZeRO) and how it is built is gobrrr.train.layout's table;
where checkpoints go and how a run resumes (at another layout too) is the Checkpointer's. The loop
asks both and branches on neither.

Why a resumed run equals an uninterrupted one: --steps is the schedule's length (the LR at step s
does not depend on where the run stopped), the data position is the step, and the checkpoint holds
model, optimizer (with Adam's step counts), the RNG states and that position. On a CPU the result
is bitwise identical (tests/test_train.py).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.plan.machine import peak_flops
from gobrrr.train import checks, rundir
from gobrrr.train.checkpoints import Checkpointer
from gobrrr.train.config import TrainConfig, check_folder, check_resume, check_world, lr_at
from gobrrr.train.data import CharCorpus, SyntheticTokens
from gobrrr.train.graph import GraphedStep, graph_blocker
from gobrrr.train.layout import Built, layout_for
from gobrrr.train.metrics import StepLog
from gobrrr.train.step import autocast_for, setup_model, train_step


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or continue) the training described by `cfg`; join the torchrun group if there is one. Every flag
    is checked before the run folder is touched.

    Returns {"step", "losses": {step: loss} logged by this call, "tokens_per_s", "mfu", "peak"}.
    """
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise checks.TrainError("--device cuda was asked for but torch sees no GPU; use --device cpu")
    from gobrrr.comm import session  # the rank runtime

    with session(device=device, seed=cfg.seed) as rank:
        try:
            check_world(cfg, rank.world_size)
            check_folder(cfg)
            with rundir.claim(cfg.out, rank.is_main, rank.device):
                return run(cfg, rank)
        except Exception as e:
            if getattr(e, "all_ranks", False) and rank.world_size > 1:
                _say_once(e, rank)
            raise


def _say_once(e: Exception, rank) -> None:
    """An error every rank raised alike: rank 0 prints it, then every rank leaves together. A launcher stops the
    other ranks as soon as one exits, so the line is printed before any rank may leave (one barrier)."""
    from gobrrr.comm import collectives as comm

    if rank.is_main:
        print(checks.error_line(e), file=sys.stderr, flush=True)
    e.printed = True
    try:
        comm.barrier()
    except Exception:  # a rank that is gone cannot wait: the line is out either way
        pass


def run(cfg: TrainConfig, rank) -> dict[str, Any]:
    """The loop, inside a rank session and a claimed run folder."""
    from gobrrr import Prefetcher

    device, W, main, K = rank.device, rank.world_size, rank.is_main, cfg.grad_accum
    model_cfg = GPTConfig.from_name(cfg.model)
    cfg = replace(cfg, seq_len=cfg.seq_len or model_cfg.block_size)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 leftovers outside autocast use TF32 tensor cores
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and at every world size
    raw = GPT(model_cfg).to(device)
    flops_per_token = raw.flops_per_token(cfg.seq_len)  # the whole model's, before --tp shards it
    B, compiled, lines = setup_model(raw, cfg, device, cfg.seq_len, W)  # batch size, loss path, torch.compile

    given = (cfg.batch_size, cfg.seq_len) if cfg.batch_size else None  # a batch size picked by hand
    ckpt = Checkpointer(cfg.out, rank)
    state = ckpt.trainer_state(cfg)  # the checkpoint --resume continues, or None
    cfg = replace(cfg, batch_size=_batch_size(B, given, state, W // cfg.tp, lines))  # a resume keeps the global batch
    if state is None and cfg.resume:
        lines.append(f"notice: {cfg.out} holds no checkpoint yet; --resume starts at step 1")
    if state is not None:
        check_resume(state, cfg, W // cfg.tp)
        if state["step"] == cfg.steps:
            if main:
                print(f"gobrrr train: {cfg.out} is already at step {cfg.steps}; pass --steps > {cfg.steps} to train "
                      "further", file=sys.stderr, flush=True)
            return {"step": cfg.steps, "losses": {}, "tokens_per_s": None, "mfu": None, "peak": None}
    built = layout_for(cfg).build(raw, cfg, rank)  # ddp, ZeRO, tp or tp + ZeRO: gobrrr.train.layout
    data = _data(cfg, model_cfg, built)
    start = ckpt.load(built, state, data, cfg)  # model, optimizer, RNG; at any layout

    lines += built.lines
    step = _stepper(built, cfg, device, W, main, lines)
    peak, peak_src = peak_flops(device)
    lines += _plan_line(cfg, model_cfg, built, W) if main and device.type == "cuda" else []
    if main and lines:
        print("\n".join(lines), file=sys.stderr, flush=True)
    log = StepLog(cfg, rank, start, tokens_per_step=cfg.batch_size * cfg.seq_len * K * built.dp_size,
                  flops_per_token=flops_per_token, peak=peak,
                  title=f"{cfg.model} x{W}{f' (tp {cfg.tp})' if cfg.tp > 1 else ''} {device.type}")
    loader = Prefetcher(data.batches(start * K, cfg.steps * K), device=device)
    batches = iter(loader)  # x, y: (B, T) int64 each, already on the device
    try:
        for s in range(start, cfg.steps):
            log.add(step([next(batches) for _ in range(K)], lr_at(s, cfg)))
            done = s + 1
            if s == start:  # compilation and warm-up are timed apart, never inside tokens/s
                log.restart_clock(_first_step_done(log.t_last, device, compiled, main, built, given), done)
            if done % cfg.log_every == 0 or done % cfg.ckpt_every == 0 or done == cfg.steps:
                log.flush(done)
                checks.stop_if_diverged(log.logged, done - start, cfg)
            if done % cfg.ckpt_every == 0 or done == cfg.steps:
                ckpt.save(built, done, cfg, data)
            if cfg.crash_after_step == done:
                os.kill(os.getpid(), signal.SIGKILL)  # testing aid: die like a killed job, no cleanup
    finally:
        loader.close()
        log.close()

    tok_s, mfu = log.summary()
    if main and log.logged:
        last = max(log.logged)
        print(f"done: step {last}, loss {log.logged[last]:.4f}, " + (f"{tok_s:,.0f} tok/s" if tok_s else "")
              + (f", MFU {mfu:.1%} of {peak / 1e12:.0f} TFLOP/s ({peak_src}) per GPU" if mfu else f" ({peak_src})"),
              file=sys.stderr, flush=True)
    return {"step": cfg.steps, "losses": log.logged, "tokens_per_s": tok_s, "mfu": mfu, "peak": peak}


# ---------------------------------------------------------------- the loop's helpers

def _batch_size(B: int, given: tuple | None, state: dict | None, dp: int, lines: list[str]) -> int:
    """The batch size: the given one, the probed one `B`, or, on a resume of a run whose size was probed, the one
    that keeps the checkpoint's global batch over this run's `dp` ranks."""
    if given is None and state is not None:
        old = state["config"]["batch_size"] * state["world_size"]
        if old % dp == 0 and old // dp != B:
            B = old // dp
            lines.append(f"batch size {B} per rank: the checkpoint's global batch {old} over {dp} rank(s)")
    return B


def _data(cfg: TrainConfig, model_cfg: GPTConfig, built: Built):
    """The token source; the tp ranks of one dp rank read the same rows."""
    if cfg.data == "synthetic":
        return SyntheticTokens(model_cfg.vocab_size, cfg.seq_len, cfg.batch_size, cfg.seed, rank=built.dp_rank,
                               world_size=built.dp_size)
    return CharCorpus(cfg.seq_len, cfg.batch_size, cfg.seed, rank=built.dp_rank, world_size=built.dp_size)


def _stepper(built: Built, cfg: TrainConfig, device: torch.device, world: int, main: bool, lines: list[str]):
    """step(micro_batches, lr) -> (2,) [loss, grad norm] on the device: train_step, or it replayed as one CUDA graph
    where graph_blocker allows (--cuda-graph; a capture that fails says so once and the step goes on eagerly)."""
    params, autocast = list(built.raw.parameters()), autocast_for(device)

    def eager(micro_batches) -> torch.Tensor:
        return train_step(built.model, built.opt, micro_batches, accum=cfg.grad_accum, params=params,
                          grad_clip=cfg.grad_clip, autocast=autocast, clip=built.clip)

    why = graph_blocker(device, world_size=world, zero=cfg.zero, tp=cfg.tp) if cfg.cuda_graph is not False else "off"
    if why is not None:
        if cfg.cuda_graph:  # asked for and not possible; the default says nothing
            lines.append(f"notice: running without a CUDA graph: {why}")

        def step(micro_batches, lr: float) -> torch.Tensor:
            for group in built.opt.param_groups:
                group["lr"] = lr
            return eager(micro_batches)
        return step

    graphed = GraphedStep(eager, built.opt, device)
    lines.append("step: one CUDA graph, captured after 2 eager steps (--no-cuda-graph: eager)")

    def replayed(micro_batches, lr: float) -> torch.Tensor:
        out = graphed(micro_batches, lr)
        if (notice := graphed.pop_notice()) and main:  # capture failed: eager from now on
            trace = Path(cfg.out) / "cuda_graph_failure.txt"   # the whole traceback, for a bug report
            try:
                trace.write_text(graphed.failed_trace or "")
                notice += f" (traceback: {trace})"
            except OSError:  # a full disk must not stop the run over a report
                pass
            print(notice, file=sys.stderr, flush=True)
        return out
    return replayed


def _first_step_done(t0: float, device: torch.device, compiled: bool, main: bool, built: Built,
                     given_batch: tuple[int, int] | None) -> float:
    """Time the first step apart (torch.compile, allocator and cuBLAS warm-up) and say so on its own line, with
    the layout's report (ZeRO: bytes held per rank); return the clock for the next interval. With a hand-picked
    batch size on a GPU, add a hint when the step's peak memory says a much larger one would fit."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync: once, after the first step, to time it apart
    now = time.perf_counter()
    if not main:
        return now
    what = "torch.compile + first step" if compiled else "first step (warm-up)"
    print(f"{what}: {now - t0:.1f} s (not counted in tokens/s)", file=sys.stderr, flush=True)
    if (report := built.report()) is not None:
        print(report, file=sys.stderr, flush=True)
    if given_batch is not None and device.type == "cuda":
        from gobrrr.train.auto_batch import underuse_hint

        hint = underuse_hint(*given_batch, torch.cuda.max_memory_allocated(device),
                             torch.cuda.get_device_properties(device).total_memory,
                             sum(p.numel() for p in built.raw.parameters()))
        if hint:
            print(hint, file=sys.stderr, flush=True)
    return now


def _plan_line(cfg: TrainConfig, model_cfg: GPTConfig, built: Built, world: int) -> list[str]:
    """The plan's row for this layout (gobrrr plan, docs/plan.md), or why there is none."""
    from gobrrr.plan.formulas import summary, train_row

    try:
        return [summary(train_row(model_cfg, world_size=world, micro_batch=cfg.batch_size, seq_len=cfg.seq_len,
                                  grad_accum=cfg.grad_accum, gpu=torch.cuda.get_device_name(), zero=cfg.zero,
                                  tp=cfg.tp, sequence_parallel=cfg.sequence_parallel, name=cfg.model,
                                  loss="chunked" if built.raw.fused_loss else "full"))]
    except ValueError as e:  # e.g. a GPU the plan has no peak for: say so, train anyway
        return [f"plan: not available ({e})"]
