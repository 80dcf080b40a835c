"""What a `gobrrr train` run depends on, checked once, before any folder is touched.

    cfg = TrainConfig(model="tiny", steps=200, out="runs/tiny")   # flags alone: checked here (TrainError)
    check_world(cfg, world_size)                                   # flags against the ranks and the model
    check_folder(cfg)                                              # --out against the disk, still untouched

As torchtitan's ParallelDims validates the mesh once, every combination of flags is checked in this
file: numbers (gobrrr.train.checks.numbers_problem), the model against --seq-len, --data and --tp,
the layout against the table of what is built (gobrrr.train.layout: --tp with --zero 3 is not),
--sequence-parallel without --tp, --tp against the world size. Nothing later refuses a flag, so a
refused run leaves nothing behind (no folder holding only run.lock).

`check_resume` is the same idea at --resume: the settings that make a continuation the same run
must match the checkpoint's; --steps may grow, the layout (ranks, --tp, --zero) may change as long
as the global batch does not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gobrrr.models.gpt import GPTConfig
from gobrrr.train.checks import TrainError, numbers_problem
from gobrrr.train.layout import layout_of

FORMAT = "gobrrr-train-v1"  # the trainer's state in every checkpoint (unchanged since 0.1)


@dataclass
class TrainConfig:
    """Everything a run depends on. Batch sizes are per rank and per micro-step."""

    model: str = "tiny"              # tiny | small | 124m (gobrrr.models.gpt)
    steps: int = 200                 # optimizer steps in the whole schedule
    out: str = "runs/gobrrr"         # the run folder: checkpoints/, metrics.jsonl, run.lock
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
    progress: bool = True            # a progress bar on a terminal (rank 0); off: plain lines (--no-progress)
    crash_after_step: int | None = None  # testing aid: SIGKILL this process after that step
    zero: int = 0                    # 0: ddp; 1|2|3: ZeRO stage (gobrrr.parallel.zero)
    compile: bool | None = None      # torch.compile the model; default on for a GPU, off for a CPU
    compile_backend: str = "inductor"  # testing aid: "aot_eager" traces without generating code
    tp: int = 1                      # tensor-parallel degree (gobrrr.parallel.tp); world = dp x tp
    sequence_parallel: bool = False  # with --tp: shard LayerNorm/dropout activations along the sequence
    cuda_graph: bool | None = None   # replay the step as one CUDA graph; default on where the layout allows
    bf16_residual: bool = False      # the stream between blocks in bf16 under autocast (step.bf16_residual)

    def __post_init__(self):
        if self.warmup is None:  # marked: a resumed run with a longer --steps keeps the run's own warmup
            self.warmup, self.warmup_default = min(100, self.steps // 10), True
        if (problem := flags_problem(self)) is not None:
            raise TrainError(problem)


def flags_problem(cfg: TrainConfig) -> str | None:
    """Why these flags cannot make a run (one sentence and the fix), or None. The world size is not known yet."""
    if not str(cfg.out).strip():
        return "--out is empty; name a folder for the run (it is created if needed)"
    for name in ("steps", "batch_size", "grad_accum", "ckpt_every", "log_every"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}"
    if cfg.data not in ("shakespeare", "synthetic"):
        return f"--data must be 'shakespeare' or 'synthetic', got {cfg.data!r}"
    if cfg.tp < 1:
        return f"--tp must be >= 1, got {cfg.tp}"
    if cfg.zero not in (0, 1, 2, 3):
        return f"--zero must be 1, 2 or 3 (or 0 for ddp), got {cfg.zero}"
    layout = layout_of(cfg.tp, cfg.zero)
    if layout.refused is not None:
        return layout.refused
    if cfg.sequence_parallel and not layout.sequence_parallel:
        return "--sequence-parallel shards activations over the tensor-parallel ranks; pass it with --tp 2 or more"
    if not 0 <= cfg.warmup <= cfg.steps:
        return f"--warmup {cfg.warmup} must be between 0 and --steps {cfg.steps}"
    if (problem := numbers_problem(cfg)) is not None:
        return problem
    try:
        model = GPTConfig.from_name(cfg.model)
    except (KeyError, ValueError):
        return f"--model {cfg.model!r} is not one of tiny, small, 124m; pick one of those"
    if cfg.seq_len is not None and cfg.seq_len > model.block_size:
        return f"--seq-len {cfg.seq_len} exceeds model {cfg.model}'s block_size {model.block_size}; pass at most that"
    if cfg.data == "shakespeare" and model.vocab_size < 256:
        return f"model {cfg.model} has vocab {model.vocab_size} < 256 bytes; use --data synthetic"
    return None


def check_world(cfg: TrainConfig, world_size: int) -> None:
    """Refuse --tp that does not divide the ranks or the model (heads, vocabulary), before any folder is touched."""
    if cfg.tp == 1:
        return
    if world_size % cfg.tp:
        raise TrainError(f"tp={cfg.tp} does not divide the world size {world_size}; choose a tp that divides "
                         f"{world_size}")
    model = GPTConfig.from_name(cfg.model)
    for what, n in (("heads", model.n_head), ("vocabulary rows", model.vocab_size)):
        if n % cfg.tp:
            raise TrainError(f"--tp {cfg.tp} does not divide model {cfg.model}'s {n} {what}; choose a --tp that "
                             f"divides {n}")
    T = cfg.seq_len or model.block_size
    if cfg.sequence_parallel and T % cfg.tp:
        raise TrainError(f"--sequence-parallel cuts the sequence of {T} tokens over --tp {cfg.tp}, which does not "
                         "divide it; choose a --seq-len that --tp divides")


def check_folder(cfg: TrainConfig) -> None:
    """--resume needs a folder to continue; say so before one is created."""
    out = Path(cfg.out)
    if cfg.resume and not out.is_dir():
        raise TrainError(f"--resume: {out} does not exist, so there is no run to continue; check the path, or "
                         "start without --resume")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then cosine to min_lr
    (Loshchilov & Hutter 2017, "SGDR", without restarts)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


# These must match between a checkpoint and the run resuming it, or the continuation is not the
# same run; --steps may change (a longer schedule), the layout and the rest (device, logging) may too.
SAME_ON_RESUME = ("model", "seq_len", "grad_accum", "data", "lr", "min_lr", "warmup", "weight_decay",
                  "grad_clip", "seed")


def check_resume(state: dict[str, Any], cfg: TrainConfig, dp_size: int) -> None:
    """Refuse to continue the checkpoint's trainer `state` with settings that would make another run. A --warmup
    that was not given is taken from the checkpoint (cfg is the run's own copy)."""
    if state.get("format") != FORMAT:
        raise TrainError(f"checkpoint format {state.get('format')!r} is not {FORMAT!r}; start a new run")
    lacking = [k for k in ("step", "rng", "data", "config", "world_size") if k not in state]
    if lacking:
        raise TrainError(f"checkpoint lacks {', '.join(lacking)}: it is damaged or edited; restore a copy or "
                         "start a new run")
    old = state["config"]
    if cfg.warmup_default and "warmup" in old:
        cfg.warmup = old["warmup"]
    diffs = [f"--{k.replace('_', '-')} {old.get(k)} -> {getattr(cfg, k)}" for k in SAME_ON_RESUME
             if old.get(k) != getattr(cfg, k)]
    if old["batch_size"] * state["world_size"] != cfg.batch_size * dp_size:
        diffs.append(f"global batch (batch size x ranks) {old['batch_size']}x{state['world_size']} -> "
                     f"{cfg.batch_size}x{dp_size}")
    if diffs:
        raise TrainError("cannot resume: the run was started with different settings ("
                         + "; ".join(diffs) + "); resume with the original arguments")
    if state["step"] > cfg.steps:
        raise TrainError(f"the checkpoint is at step {state['step']}, past --steps {cfg.steps}; pass --steps "
                         f">= {state['step']}")
