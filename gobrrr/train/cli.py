"""`gobrrr train`: train the reference GPT on one rank or many, resumable bit for bit.

    gobrrr train --model tiny --steps 200 --out runs/tiny                     # CPU or one GPU
    torchrun --nproc-per-node 8 -m gobrrr train --model 124m --steps 2000 --out runs/124m
    gobrrr train ... --resume                                                 # continue after a kill

One step, per rank (the same code at every world size; at world size 1 communication is a no-op):
  1. K micro-batches (--grad-accum K) arrive through `gobrrr.Prefetcher`; micro-batch i of the
     run is a pure function of (seed, i), and each rank keeps its rows of the global batch;
  2. forward + backward under bf16 autocast on a GPU; the first K-1 inside `model.no_sync()`,
     so gradients are reduced once, by `gobrrr.parallel.ddp`, during the last backward (steps 2-3
     are `gobrrr.train.step.train_step`; on a GPU the blocks are torch.compile'd, and the loss never
     holds the (B, T, V) logits; the first step, which compiles, is timed apart from tokens/s);
  3. clip the gradient norm, set the warmup+cosine learning rate, AdamW step;
  4. the loss stays on the device; every --log-every steps the stacked losses are averaged over
     ranks and read in one go (the only host-device sync in the loop), then appended to
     DIR/metrics.jsonl, one object per step;
  5. every --ckpt-every steps rank 0 writes DIR/checkpoint.pt atomically (gobrrr.train.checkpoint_io);
     with --zero 1|2|3 (gobrrr.parallel.zero instead of ddp) every rank writes its shards to
     DIR/zero_checkpoints through torch.distributed.checkpoint, resumable at another world size.

With --tp N the W ranks form a (W/N, N) mesh (gobrrr.parallel.mesh): the model is tensor-parallel
over each group of N consecutive ranks (gobrrr.parallel.tp; --sequence-parallel adds SP) and ddp
averages over the W/N data-parallel ranks, which alone read different rows; the gradient norm is
taken over both dimensions, and every rank writes its shards through torch.distributed.checkpoint
(gobrrr.parallel.tp.checkpoint.save_run), so a run resumes at another N. With --tp N --zero 1|2,
ZeRO replaces ddp over the data-parallel ranks (zero(tp(model), ..., group=mesh["dp"])); its
optimizer clips the norm over dp and tp, and its checkpoint in DIR/zero_checkpoints holds each
parameter in the plain model's shape (gobrrr.parallel.zero.pieces), so the run resumes at another
dp, another N or without --tp. --tp with --zero 3 is refused (stage 3 gathers whole parameters).

Why a resumed run equals an uninterrupted one: `--steps` is the schedule's length (the LR at
step s does not depend on where the run stopped), the data position is the step, and the
checkpoint holds model, optimizer (with Adam's step counts), the RNG states and that position.
On a CPU the result is bitwise identical; tests/test_train.py checks it.

metrics.jsonl is only ever appended to, one whole flush at a time (gobrrr.train.rundir.MetricsLog: a
full disk cuts the file back to its last whole record and stops the run). After a resume the steps
between the checkpoint and the kill appear twice (the later record wins; `read_metrics` does that)
and a {"event": "resume", "step": s} record marks the seam; a torn last line left by a crash is cut
off first ("repaired_bytes"). DIR belongs to one live run: rank 0 holds DIR/run.lock (a lock the
kernel drops when its process dies) and a second run into DIR stops at once, naming the first.

Failures end the run with one line and a non-zero exit: 2 for what the user can fix (arguments,
--out, a full disk, a checkpoint that does not fit), 1 for a run that diverged (a non-finite loss
or weights: nothing non-finite is ever checkpointed, see gobrrr.train.checks) or lost a rank
(named by gobrrr.comm). Ranks started by torchrun exit within about a second of the launcher's
death (gobrrr.comm.lifeline).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gobrrr.comm import collectives as comm
from gobrrr.comm.debug import CollectiveError, DistConfigError
from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.plan.machine import peak_flops
from gobrrr.train import checks, rundir
from gobrrr.train.checkpoint_io import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from gobrrr.train.data import CharCorpus, SyntheticTokens
from gobrrr.train.graph import GraphedStep, graph_blocker
from gobrrr.train.step import autocast_for, setup_model, train_step

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
FORMAT = "gobrrr-train-v1"


class TrainError(RuntimeError):
    """The run cannot start or continue as asked; the message says what to change."""


@dataclass
class TrainConfig:
    """Everything a run depends on. Batch sizes are per rank and per micro-step."""

    model: str = "tiny"              # tiny | small | 124m (gobrrr.models.gpt)
    steps: int = 200                 # optimizer steps in the whole schedule
    out: str = "runs/gobrrr"         # folder for checkpoint.pt and metrics.jsonl
    device: str | None = None        # cpu | cuda; default cuda when available
    batch_size: int | None = None    # sequences per rank per micro-step; default 8 on CPU, probed on GPU
    seq_len: int | None = None       # default: the model's block_size
    grad_accum: int = 1              # micro-steps per optimizer step
    data: str = "shakespeare"        # shakespeare (shipped text) | synthetic (random tokens)
    lr: float = 1e-3                 # peak learning rate
    min_lr: float = 1e-4             # end of the cosine
    warmup: int | None = None        # linear warmup steps; default min(100, steps // 10)
    warmup_default: bool = False     # warmup was not given: a resume keeps the checkpoint's (not one from --steps)
    weight_decay: float = 0.1
    grad_clip: float = 1.0           # max global gradient norm (0 = off)
    ckpt_every: int = 100            # checkpoint every M steps (and at the end)
    log_every: int = 10              # read losses back every N steps (one host sync per N steps)
    resume: bool = False
    seed: int = 0
    progress: bool = True            # progress bar / progress lines on rank 0
    crash_after_step: int | None = None  # testing aid: SIGKILL this process after that step
    zero: int = 0                    # 0: ddp; 1|2|3: ZeRO stage (gobrrr.parallel.zero), sharded checkpoints
    compile: bool | None = None      # torch.compile the blocks; default on for a GPU, off for a CPU
    compile_backend: str = "inductor"  # testing aid: "aot_eager" traces without generating code
    tp: int = 1                      # tensor-parallel degree (gobrrr.parallel.tp); world = dp x tp
    sequence_parallel: bool = False  # with --tp: shard LayerNorm/dropout activations along the sequence
    cuda_graph: bool | None = None   # replay the step as one CUDA graph; default on where graph_blocker allows
    bf16_residual: bool = False      # the stream between blocks in bf16 under autocast (train_step.bf16_residual)

    def __post_init__(self):
        if self.warmup is None:  # marked: a resumed run with a longer --steps keeps the run's own warmup
            self.warmup, self.warmup_default = min(100, self.steps // 10), True
        for name in ("steps", "batch_size", "grad_accum", "ckpt_every", "log_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise TrainError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.data not in ("shakespeare", "synthetic"):
            raise TrainError(f"--data must be 'shakespeare' or 'synthetic', got {self.data!r}")
        if self.tp < 1:
            raise TrainError(f"--tp must be >= 1, got {self.tp}")
        if self.zero not in (0, 1, 2, 3):
            raise TrainError(f"--zero must be 1, 2 or 3 (or 0 for ddp), got {self.zero}")
        if self.tp > 1 and self.zero == 3:
            raise TrainError("--tp with --zero 3 is not built yet (stage 3 gathers whole parameters per block, which "
                             "tp() keeps sharded); use --tp with --zero 1 or 2, or --zero 3 without --tp")
        if not 0 <= self.warmup <= self.steps:
            raise TrainError(f"--warmup {self.warmup} must be between 0 and --steps {self.steps}")
        if (problem := checks.numbers_problem(self)) is not None:
            raise TrainError(problem)


# These must match between a checkpoint and the run resuming it, or the continuation is not the
# same run; --steps may change (a longer schedule), the rest (device, logging, out) may too.
_SAME_ON_RESUME = ("model", "seq_len", "grad_accum", "data", "lr", "min_lr", "warmup", "weight_decay",
                   "grad_clip", "seed")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then cosine to min_lr
    (Loshchilov & Hutter 2017, "SGDR", without restarts)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def make_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019); weight decay on matrices and embeddings, not biases or norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device.type == "cuda"  # one kernel for the whole update on a GPU
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


def make_data(cfg: TrainConfig, model_cfg: GPTConfig, seq_len: int, rank: int, world_size: int):
    if cfg.data == "synthetic":
        return SyntheticTokens(model_cfg.vocab_size, seq_len, cfg.batch_size, cfg.seed, rank=rank,
                               world_size=world_size)
    if model_cfg.vocab_size < CharCorpus.vocab_size:
        raise TrainError(f"model {cfg.model} has vocab {model_cfg.vocab_size} < 256 bytes; use --data synthetic")
    return CharCorpus(seq_len, cfg.batch_size, cfg.seed, rank=rank, world_size=world_size)


def read_metrics(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """metrics.jsonl as {step: record}; for a step logged twice (before a kill and after the resume)
    the later record wins. Event records ({"event": ...}) are skipped."""
    records: dict[int, dict[str, Any]] = {}
    for rec in rundir.read_jsonl(path):  # a torn last line (a crash mid-write) is skipped
        if "event" not in rec:
            records[rec["step"]] = rec
    return records


class _Progress:
    """A rich progress bar on a terminal; otherwise one plain line per log interval. Rank 0 only."""

    def __init__(self, enabled: bool, total: int, start: int, title: str):
        self.bar = None
        self.enabled = enabled
        self.total = total
        if not enabled:
            return
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[stats]}"), TimeRemainingColumn(), console=console)
            self.task = self.bar.add_task(title, total=total, completed=start, stats="")
            self.bar.start()

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def report(self, step: int, loss: float, tokens_per_s: float | None, mfu: float | None) -> None:
        if not self.enabled:
            return
        stats = (f"loss {loss:.4f}" + (f"  {tokens_per_s:,.0f} tok/s" if tokens_per_s else "")
                 + (f"  MFU {mfu:.1%}" if mfu is not None else ""))
        if self.bar is not None:
            self.bar.update(self.task, stats=stats)
        else:
            print(f"step {step}/{self.total}  {stats}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or continue) the training described by `cfg`; join the torchrun group if there is one.

    Returns {"step", "losses": {step: loss} logged by this call, "tokens_per_s", "mfu", "peak"}.
    """
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TrainError("--device cuda was asked for but torch sees no GPU; use --device cpu")
    from gobrrr.comm import session  # the rank runtime (engineer D)

    with session(device=device, seed=cfg.seed) as rank, rundir.claim(cfg.out, rank.is_main, rank.device):
        return _train(cfg, rank)


def _train(cfg: TrainConfig, rank) -> dict[str, Any]:
    from gobrrr import Prefetcher
    from gobrrr.parallel.tp.checkpoint import latest_run, load_run, save_run

    device, W, main = rank.device, rank.world_size, rank.is_main
    out = Path(cfg.out)
    ckpt_path, metrics_path = out / CHECKPOINT, out / METRICS
    model_cfg = GPTConfig.from_name(cfg.model)
    cfg = replace(cfg, seq_len=cfg.seq_len or model_cfg.block_size)
    T, B, K = cfg.seq_len, cfg.batch_size, cfg.grad_accum
    if T > model_cfg.block_size:
        raise TrainError(f"--seq-len {T} exceeds model {cfg.model}'s block_size {model_cfg.block_size}")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 leftovers outside autocast use TF32 tensor cores
        torch.backends.cudnn.allow_tf32 = True

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank and at every world size
    raw = GPT(model_cfg).to(device)
    flops_per_token = raw.flops_per_token(T)  # the whole model's, before --tp shards it
    auto_batch = cfg.batch_size is None
    B, compiled, setup_lines = setup_model(raw, cfg, device, T, W)  # batch size, loss path, torch.compile
    cfg = replace(cfg, batch_size=B)
    if cfg.tp > 1:  # a (dp, tp) mesh: tp() on tp, ddp (or ZeRO 1-2 with --zero) on dp
        model, opt, raw, dp_rank, DP = parallelize(raw, cfg, rank)
    else:
        model, opt = wrap_model(raw, cfg, device)  # ddp, or ZeRO with --zero
        dp_rank, DP = rank.rank, W
    data = make_data(cfg, model_cfg, T, dp_rank, DP)  # the tp ranks of one dp rank read the same rows

    start = 0
    tp_ckpt = latest_run(out)
    if ckpt_path.exists() or zero_checkpoint(out) is not None or tp_ckpt is not None:
        if not cfg.resume:
            raise TrainError(f"{out} already holds a run ({CHECKPOINT if tp_ckpt is None else tp_ckpt.name}); "
                             "pass --resume to continue it or choose a new --out")
        if tp_ckpt is not None and (cfg.tp == 1 or cfg.zero):
            raise TrainError(f"{out} holds a --tp > 1 run with ddp; resume it with --tp 2 or more (any degree that "
                             "divides the heads) and without --zero")
        if cfg.tp > 1 and not cfg.zero and tp_ckpt is None:
            held = zero_checkpoint(out) is not None
            raise TrainError(f"{out} holds a {'--zero' if held else '--tp 1'} run; resume it with "
                             f"{'--zero 1, 2 or 3 (--tp only with 1 or 2)' if held else '--tp 1'}")
        if cfg.tp > 1 and not cfg.zero:
            state = load_run(out, model, opt)  # every rank reads its shards, at any tp degree
        else:  # --zero at any --tp: the shards of every dp x tp rank (gobrrr.parallel.zero.checkpoint)
            state = load_model_state(out, raw, model, opt, cfg)  # model + optimizer restored; the trainer's state
        old_global = state["config"]["batch_size"] * state["world_size"]
        if auto_batch and old_global % DP == 0 and old_global // DP != B:  # resume keeps the run's global batch
            B = old_global // DP
            cfg = replace(cfg, batch_size=B)
            data = make_data(cfg, model_cfg, T, dp_rank, DP)
            setup_lines.append(f"batch size {B} per rank: the checkpoint's global batch {old_global} over {DP} rank(s)")
        _check_resumable(state, cfg, DP)
        if not cfg.zero and cfg.tp == 1:  # with --zero or --tp the shards were loaded above
            if (problem := checks.misfit(ckpt_path, state, raw, opt)) is not None:
                raise TrainError(problem)
            raw.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"], device)
        start = state["step"]
        if data.check_state(state["data"]) != start * K:
            raise TrainError(f"checkpoint data position {state['data']['position']} is not step {start} x "
                             f"--grad-accum {K}; the checkpoint is inconsistent, start afresh")
    elif metrics_path.exists() and not cfg.resume:
        raise TrainError(f"{out} already has {METRICS} from another run; choose a new --out (or --resume)")

    dist.barrier()  # sync: once, at start: every rank has looked at DIR before rank 0 writes to it
    if main:
        out.mkdir(parents=True, exist_ok=True)
    peak, peak_src = peak_flops(device)
    tokens_per_step = B * T * K * DP
    autocast = autocast_for(device)
    params = list(raw.parameters())
    clip = tp_clip(model) if cfg.tp > 1 else None  # --tp: the norm over every shard, each counted once
    if main and cfg.progress and device.type == "cuda":  # the plan's row for this layout (gobrrr plan, docs/plan.md)
        from gobrrr.plan.formulas import summary, train_row
        try:
            setup_lines.append(summary(train_row(model_cfg, world_size=W, micro_batch=B, seq_len=T, grad_accum=K,
                                                 gpu=torch.cuda.get_device_name(device), zero=cfg.zero or 0,
                                                 tp=cfg.tp, sequence_parallel=cfg.sequence_parallel,
                                                 name=cfg.model, loss="chunked" if raw.fused_loss else "full")))
        except ValueError as e:  # e.g. a GPU the plan has no peak for: say so, train anyway
            setup_lines.append(f"plan: not available ({e})")
    def one_step(micro_batches) -> torch.Tensor:  # (2,): loss, grad norm; the step lives in gobrrr/train/step.py
        return train_step(model, opt, micro_batches, accum=K, params=params, grad_clip=cfg.grad_clip,
                          autocast=autocast, clip=clip)

    graphed = None  # --cuda-graph: one_step captured once and replayed (gobrrr/train/graph.py)
    if cfg.cuda_graph is not False:
        why = graph_blocker(device, world_size=W, zero=cfg.zero, tp=cfg.tp)
        if why is None:
            graphed = GraphedStep(one_step, opt, device)
            setup_lines.append("step: one CUDA graph, captured after 2 eager steps (--no-cuda-graph: eager)")
        elif cfg.cuda_graph:  # asked for and not possible; the default says nothing
            setup_lines.append(f"notice: running without a CUDA graph: {why}")
    if main and cfg.progress and setup_lines:
        print("\n".join(setup_lines), file=sys.stderr, flush=True)

    metrics = rundir.MetricsLog(metrics_path) if main else None  # whole records only; a torn tail is cut
    if main and start > 0:
        metrics.write(json.dumps({"event": "resume", "step": start, "time": time.time(),
                                  "repaired_bytes": metrics.repaired_bytes}) + "\n")
        metrics.flush()
    progress = _Progress(main and cfg.progress, cfg.steps, start,
                         f"{cfg.model} x{W}{f' (tp {cfg.tp})' if cfg.tp > 1 else ''} "
                         f"{'cuda' if device.type == 'cuda' else 'cpu'}")
    logged: dict[int, float] = {}
    rates: list[float] = []
    pending: list[torch.Tensor] = []   # per step: (loss, grad_norm) stacked, still on the device
    t_last, t_step = time.perf_counter(), start  # the clock of the current log interval, and its first step
    loader = Prefetcher(data.batches(start * K, cfg.steps * K), device=device)
    batches = iter(loader)

    def flush(step: int) -> None:
        nonlocal t_last, t_step
        if not pending:
            return
        both = torch.stack(pending)             # (n, 2): loss, grad norm per step
        comm.all_reduce(both)                   # one collective per log interval, not per step (names a dead rank)
        rows = (both / W).tolist()              # sync: the one device->host read per log interval
        now = time.perf_counter()
        dt = (now - t_last) / (step - t_step) if step > t_step else None  # the first step is timed apart
        tok_s = tokens_per_step / dt if dt else None
        mfu = flops_per_token * tok_s / (peak * W) if (peak and tok_s) else None
        first = step - len(rows) + 1
        for i, (loss, norm) in enumerate(rows):
            s = first + i
            logged[s] = loss
            if metrics is not None:
                metrics.write(json.dumps({"step": s, "loss": loss, "lr": lr_at(s - 1, cfg), "grad_norm": norm,
                                          "tokens_per_s": tok_s, "step_ms": dt * 1e3 if dt else None,
                                          "mfu": mfu}) + "\n")
        if metrics is not None:
            metrics.flush()
        if tok_s:
            rates.append(tok_s)
        progress.report(step, rows[-1][0], tok_s, mfu)
        pending.clear()
        t_last, t_step = now, step

    def trainer_state(done: int) -> dict[str, Any]:  # what every kind of checkpoint holds beside the weights
        return {"format": FORMAT, "step": done, "rng": rng_state(device), "data": data.state_dict(done * K),
                "config": asdict(cfg), "world_size": DP}

    try:
        for step in range(start, cfg.steps):
            lr = lr_at(step, cfg)
            # x, y: (B, T) int64 each, already on the device
            if graphed is not None:
                pending.append(graphed([next(batches) for _ in range(K)], lr))
                if (notice := graphed.pop_notice()) and main:  # capture failed: eager from now on
                    trace = out / "cuda_graph_failure.txt"   # the whole traceback, for a bug report
                    try:
                        trace.write_text(graphed.failed_trace or "")
                        notice += f" (traceback: {trace})"
                    except OSError:  # a full disk must not stop the run over a report
                        pass
                    if cfg.progress:
                        print(notice, file=sys.stderr, flush=True)
            else:
                for group in opt.param_groups:
                    group["lr"] = lr
                pending.append(one_step(next(batches) for _ in range(K)))
            if cfg.zero and step == start and main and cfg.progress:  # gobrrr: ignore[GB007] (ints, not tensors)
                print(model.step_report, file=sys.stderr, flush=True)  # gobrrr: ignore[GB003] (once: bytes held)
            progress.advance()
            done = step + 1
            if step == start:
                t_last, t_step = _first_step_done(t_last, device, compiled, main and cfg.progress,
                                                  None if auto_batch else (B, T), sum(p.numel() for p in params)), done
            last = done == cfg.steps
            if done % cfg.log_every == 0 or done % cfg.ckpt_every == 0 or last:
                flush(done)
                checks.stop_if_diverged(logged, done - start, cfg)
            checkpoint = done % cfg.ckpt_every == 0 or last
            if cfg.zero and checkpoint:  # every rank writes its shards
                save_zero_checkpoint(model, out, trainer_state(done), cfg)
            elif checkpoint:
                error = checks.nonfinite_weights(raw, done, cfg)  # never checkpoint NaN/inf (a TP/ZeRO shard counts too)
                if cfg.tp > 1:  # every rank writes its shards (DCP), once all have finite weights
                    error = _save_tp_run(save_run, out, model, opt, error, trainer_state(done))
                elif main and error is None:
                    try:
                        save_checkpoint({**trainer_state(done), "model": raw.state_dict(),
                                         "optimizer": opt.state_dict()}, ckpt_path)
                    except CheckpointError as e:
                        error = e
                failed = torch.tensor([0.0 if error is None else 1.0], device=device)
                comm.all_reduce(failed)  # every rank learns whether rank 0's write failed
                if failed.item():  # sync: once per checkpoint, so all ranks stop together instead of hanging
                    raise error or CheckpointError("another rank could not check or write the checkpoint; see "
                                                   "its error message")
            if cfg.crash_after_step == done:
                os.kill(os.getpid(), signal.SIGKILL)  # testing aid: die like a killed job, no cleanup
    finally:
        progress.close()
        loader.close()
        if metrics is not None:
            metrics.close()

    steady = rates[1:] or rates  # the first step (compilation, allocation) is timed apart; skip one more interval
    tok_s = sorted(steady)[len(steady) // 2] if steady else None
    mfu = flops_per_token * tok_s / (peak * W) if (peak and tok_s) else None
    if main and cfg.progress and logged:
        last_step = max(logged)
        print(f"done: step {last_step}, loss {logged[last_step]:.4f}, "
              + (f"{tok_s:,.0f} tok/s" if tok_s else "")
              + (f", MFU {mfu:.1%} of {peak / 1e12:.0f} TFLOP/s ({peak_src}) per GPU" if mfu else f" ({peak_src})"),
              file=sys.stderr, flush=True)
    return {"step": cfg.steps, "losses": logged, "tokens_per_s": tok_s, "mfu": mfu, "peak": peak}


ZERO_CHECKPOINTS = "zero_checkpoints"  # DIR/zero_checkpoints/{latest, step-<s>.<ns>/}: sharded (DCP)


def wrap_model(raw: GPT, cfg: TrainConfig, device: torch.device, group=None):
    """(model, optimizer): `ddp` with AdamW, or with --zero S, `zero(..., stage=S)` (bf16 parameters on a GPU),
    over `group` (default: every rank; --tp passes its data-parallel group)."""
    from gobrrr.parallel import ddp, zero

    if not cfg.zero:
        return ddp(raw, group=group), make_optimizer(raw, cfg, device)
    return zero(raw, lambda m: make_optimizer(m, cfg, device), stage=cfg.zero, group=group,
                param_dtype=torch.bfloat16 if device.type == "cuda" else None)


def zero_checkpoint(out: Path) -> Path | None:
    from gobrrr.parallel.zero.checkpoint import latest

    return latest(out / ZERO_CHECKPOINTS)


def save_zero_checkpoint(model, out: Path, state: dict[str, Any], cfg: TrainConfig) -> None:
    """Every rank writes its shards (DCP); rank 0 adds the trainer's state; atomic (see zero_ckpt).
    Never NaN/inf: each rank checks its own master shards and all ranks stop together."""
    from types import SimpleNamespace

    from gobrrr.parallel.zero.checkpoint import save

    bad = checks.nonfinite_weights(SimpleNamespace(parameters=lambda: [f.master for f in model.order]),
                                   state["step"], cfg)
    flag = torch.tensor([0.0 if bad is None else 1.0], device=model.order[0].master.device)
    dist.all_reduce(flag)  # every rank learns whether any shard diverged
    if flag.item():  # sync: once per checkpoint
        raise bad or checks.DivergedError(f"another rank's weights hold NaN/inf after step {state['step']}; "
                                          "start a new run with a lower --lr or --grad-clip")
    try:
        save(model, out / ZERO_CHECKPOINTS, state["step"], extra=state)
    except OSError as e:
        raise CheckpointError(f"could not write the sharded checkpoint in {out / ZERO_CHECKPOINTS}: {e}; the "
                              "previous one is untouched; check the disk") from e


def load_model_state(out: Path, raw: GPT, model, opt, cfg: TrainConfig) -> dict[str, Any]:
    """DIR's checkpoint: with --zero, load the shards into `model` and `opt` now and return the trainer's
    state; without, return the plain checkpoint (the caller checks it fits, then loads it)."""
    ckpt = zero_checkpoint(out)
    if cfg.zero and ckpt is None:
        raise TrainError(f"{out} holds a ddp run ({CHECKPOINT}); resume it without --zero")
    if not cfg.zero and ckpt is not None:
        raise TrainError(f"{out} holds a --zero run (sharded checkpoint); resume it with --zero 1, 2 or 3")
    if cfg.zero:
        from gobrrr.parallel.zero.checkpoint import load

        return load(model, out / ZERO_CHECKPOINTS)["extra"]  # any world size, any stage
    return load_checkpoint(out / CHECKPOINT)


def _first_step_done(t0: float, device: torch.device, compiled: bool, verbose: bool,
                     given_batch: tuple[int, int] | None, n_params: int) -> float:
    """Time the first step apart (torch.compile, allocator and cuBLAS warm-up) and say so on its own line;
    return the clock for the next interval, so tokens/s never includes it. With a hand-picked batch
    size on a GPU, add a hint when the step's peak memory says a much larger one would fit."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync: once, after the first step, to time it apart
    now = time.perf_counter()
    if verbose:
        what = "torch.compile + first step" if compiled else "first step (warm-up)"
        print(f"{what}: {now - t0:.1f} s (not counted in tokens/s)", file=sys.stderr, flush=True)
        if given_batch is not None and device.type == "cuda":
            from gobrrr.train.auto_batch import underuse_hint

            hint = underuse_hint(*given_batch, torch.cuda.max_memory_allocated(device),
                                 torch.cuda.get_device_properties(device).total_memory, n_params)
            if hint:
                print(hint, file=sys.stderr, flush=True)
    return now


def parallelize(raw: GPT, cfg: TrainConfig, rank):
    """--tp N: (model, optimizer, raw, dp_rank, dp_size) with tp() over each group of N consecutive ranks of a
    (W/N, N) mesh and ddp over the other dimension, or with --zero 1|2, ZeRO over it (its optimizer clips
    the norm over dp and tp); raw is then the sharded GPT."""
    from gobrrr.models.gpt_plan import GPT_PLAN
    from gobrrr.parallel.mesh import MeshError, make_mesh
    from gobrrr.parallel.tp.parallelize import TPError, tp
    from gobrrr.parallel.tp.report import comm_plan

    raw.fused_loss = None  # the chunked loss reads lm_head.weight whole; under tp the loss runs vocab-parallel
    try:
        mesh = make_mesh(cfg.tp)
        raw = tp(raw, mesh, GPT_PLAN, sequence_parallel=cfg.sequence_parallel)
    except (MeshError, TPError) as e:
        raise TrainError(str(e)) from None
    if rank.is_main and cfg.progress:  # what TP will cost on the wire, from the formula (tp_report)
        rows = comm_plan(raw, cfg.batch_size, cfg.seq_len, 2 if rank.device.type == "cuda" else 4)
        mb = sum(r.wire_bytes(cfg.tp) for r in rows) / 1e6  # MB = 1e6 bytes
        print(f"tp {cfg.tp} x dp {mesh['dp'].size()}{' with sequence parallelism' if cfg.sequence_parallel else ''}: "
              f"{len(rows)} tp collectives per micro-step, {mb:.1f} MB sent per rank", file=sys.stderr, flush=True)
    # ddp, or ZeRO stages 1-2 (--zero 3 was refused in TrainConfig), over the dp ranks of the tp model
    model, opt = wrap_model(raw, cfg, rank.device, group=mesh["dp"].get_group())
    return model, opt, raw, mesh.get_local_rank("dp"), mesh["dp"].size()


def tp_clip(model):
    """For train_step: the gradient norm over every tp shard (gobrrr.parallel.tp.tensors)."""
    from gobrrr.parallel.tp.tensors import clip_grad_norm_

    return lambda params, max_norm: clip_grad_norm_(model, max_norm)


def _save_tp_run(save_run, out: Path, model, opt, error: Exception | None, state: dict[str, Any]) -> Exception | None:
    """Every rank writes its shards once all ranks' weights are finite; the error to raise on all ranks, or None."""
    bad = torch.tensor([0.0 if error is None else 1.0], device=next(model.parameters()).device)
    comm.all_reduce(bad)
    if bad.item():  # sync: once per checkpoint, so that every rank skips the collective write together
        return error or CheckpointError("another rank holds NaN/inf weights; see its error message")
    try:
        save_run(out, model, opt, state)
    except OSError as e:
        return CheckpointError(f"could not write the tensor-parallel checkpoint in {out}: {e}; the previous one is "
                               "untouched; check the disk")
    return None


def _check_resumable(state: dict[str, Any], cfg: TrainConfig, world_size: int) -> None:
    if state.get("format") != FORMAT:
        raise TrainError(f"checkpoint format {state.get('format')!r} is not {FORMAT!r}; start a new run")
    lacking = [k for k in ("step", "rng", "data", "config", "world_size") if k not in state]
    if lacking:
        raise TrainError(f"checkpoint lacks {', '.join(lacking)}: it is damaged or edited; restore a copy or "
                         "start a new run")
    old = state["config"]
    if cfg.warmup_default and "warmup" in old:  # --warmup not given: the run keeps its own (cfg is _train's copy)
        cfg.warmup = old["warmup"]
    diffs = [f"--{k.replace('_', '-')} {old.get(k)} -> {getattr(cfg, k)}" for k in _SAME_ON_RESUME
             if old.get(k) != getattr(cfg, k)]
    old_global = old["batch_size"] * state["world_size"]
    if old_global != cfg.batch_size * world_size:
        diffs.append(f"global batch (batch size x ranks) {old['batch_size']}x{state['world_size']} -> "
                     f"{cfg.batch_size}x{world_size}")
    if diffs:
        raise TrainError("cannot resume: the run was started with different settings ("
                         + "; ".join(diffs) + "); resume with the original arguments")
    if state["step"] > cfg.steps:
        raise TrainError(f"the checkpoint is at step {state['step']}, past --steps {cfg.steps}")


def parse_args(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser(prog="gobrrr train", description="Train the reference GPT (works under torchrun).")
    d = TrainConfig()
    p.add_argument("--model", default=d.model, choices=["tiny", "small", "124m"])
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps in the whole schedule")
    p.add_argument("--out", required=True, help="folder for checkpoint.pt and metrics.jsonl")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="sequences per rank per micro-step (default: 8 on a CPU; on a GPU the largest power of two "
                        "that fits in free memory, up to 64k tokens per micro-step, found by a short probe)")
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's block size")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-steps per optimizer step")
    p.add_argument("--data", choices=["shakespeare", "synthetic"], default=d.data)
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    p.add_argument("--min-lr", type=float, default=d.min_lr)
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default min(100, steps // 10))")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--grad-clip", type=float, default=d.grad_clip, help="max gradient norm, 0 = off")
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    p.add_argument("--log-every", type=int, default=d.log_every, help="steps between loss reads (host syncs)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress output")
    p.add_argument("--compile", dest="compile", action="store_true", default=None,
                   help="torch.compile each transformer block (default on a GPU; on a CPU it needs a C++ compiler). "
                        "Not yet with --tp > 1 or --zero 3: those run eagerly with a one-line notice")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="run eagerly")
    p.add_argument("--compile-backend", default=d.compile_backend, help=argparse.SUPPRESS)
    p.add_argument("--cuda-graph", dest="cuda_graph", action="store_true", default=None,
                   help="capture the whole step (forward, backward, clip, AdamW) in one CUDA graph after 2 eager "
                        "steps and replay it: one launch per step instead of ~1,500 (default on a GPU at world "
                        "size 1; not yet with several ranks, --zero, --tp > 1 or under gobrrr doctor: those run "
                        "eagerly with a one-line notice)")
    p.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", help="issue every kernel from Python")
    p.add_argument("--bf16-residual", action="store_true",
                   help="carry the residual stream between blocks in bf16 instead of float32 (a GPU's autocast "
                        "only): fewer bytes for every LayerNorm and residual add, as Megatron-LM and FSDP2's bf16 "
                        "mixed precision run; parameters, gradients and AdamW stay float32")
    p.add_argument("--crash-after-step", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--zero", type=int, default=0,
                   help="ZeRO stage 1, 2 or 3 instead of ddp (sharded checkpoints, resumable at another world size); "
                        "with --tp, stages 1-2 over the dp ranks (stage 3 with --tp is refused)")
    p.add_argument("--tp", type=int, default=d.tp,
                   help="tensor-parallel degree: world size = dp x tp (torchrun); ddp, or --zero 1|2, over dp")
    p.add_argument("--sequence-parallel", action="store_true", help="with --tp: sequence parallelism as well")
    args = p.parse_args(argv)
    return TrainConfig(**{f.name: getattr(args, f.name, f.default) for f in fields(TrainConfig)})


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        train(parse_args(argv))
    except (TrainError, CheckpointError, rundir.RunDirError, DistConfigError) as e:
        print(f"gobrrr train: error: {e}", file=sys.stderr)
        return 2
    except (checks.DivergedError, CollectiveError) as e:  # the run failed: diverged, or a rank died (named)
        print(f"gobrrr train: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
