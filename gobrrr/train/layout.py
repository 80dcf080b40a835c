"""Every parallel layout `gobrrr train` runs, in one table: what it supports and how its model is built.

    layout = layout_for(cfg)                  # the row for --tp / --zero (TrainError if refused)
    built = layout.build(raw, cfg, rank)      # model, optimizer, dp rank and size, clip, checkpoint records

  layout      flags            model (gobrrr.parallel)        compile        CUDA graph  clip                each rank saves
  ddp         (none)           ddp(gpt)                       by world size  1 rank      torch's             whole tensors, once
  zero1/2     --zero 1|2       zero(gpt, stage)               by world size  no          ZeRO's, shards      its pieces
  zero3       --zero 3         zero(gpt, 3)                   no             no          ZeRO's, shards      its pieces
  tp          --tp N           ddp(tp(gpt, mesh), dp)         no             no          tp's, shards once   its tp block
  tp+zero1/2  --tp N --zero S  zero(tp(gpt, mesh), S, dp)     no             no          ZeRO's, dp x tp     its pieces of it
  tp+zero3    refused: stage 3 gathers whole parameters per block, which tp() keeps sharded

"compile by world size": one whole-model graph at one rank, one graph per block past one, so that
ddp and ZeRO receive each block's gradients while backward goes on (gobrrr.train.step.compile_scope);
"no": the layout runs eagerly for now, and the `compile` column of its row says why (step.py's
compile_blocker prints it). A CUDA graph replays the whole step at world size 1 only, and only for
ddp (graph.py's graph_blocker reads `cuda_graph`). --sequence-parallel needs a tp row.

Checkpoints: every row writes the same records, each parameter and Adam moment in the plain model's
shape (gobrrr.parallel.tp.checkpoint, gobrrr.parallel.zero.checkpoint), into the same folder layout
(gobrrr.train.checkpoints), so a run saved in any row resumes in any other at the same global batch.

The loop reads this table and nothing else about the layout: `Built` carries the wrapped model, the
optimizer, the clip function, this rank's weights for the finite check, the checkpoint records and
the one-off lines a layout prints.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from gobrrr.train.checks import TrainError


def make_optimizer(model: nn.Module, cfg: Any, device: torch.device) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019); weight decay on matrices and embeddings, not biases or norms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device.type == "cuda"  # one kernel for the whole update on a GPU
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


@dataclass
class Built:
    """A model wrapped for its layout, and what the loop and the Checkpointer need from it."""
    model: nn.Module                       # what forward and backward run through (ddp or ZeRO)
    opt: Any                               # the optimizer (ZeRO's steps the master shards)
    raw: nn.Module                         # the GPT itself (tp-sharded under --tp)
    dp_rank: int                           # which rows of the global batch this rank reads
    dp_size: int
    clip: Callable | None                  # train_step's clip(params, max_norm); None: torch's or ZeRO's own
    records: Callable[[], dict]            # checkpoint records for dcp.save
    records_to_load: Callable[[Any], tuple[dict, Callable[[], None]]]  # (records, after) from DCP metadata
    weights: Callable[[], list[torch.Tensor]]  # this rank's weights (ZeRO: master shards), checked finite
    report: Callable[[], str | None] = lambda: None  # after the first step (ZeRO: bytes held per rank)
    load_whole: Callable[[dict, dict], None] | None = None  # a plain state_dict pair (gobrrr 0.1's checkpoint.pt)
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Layout:
    """One row of the table in the module docstring."""
    name: str
    build: Callable[[nn.Module, Any, Any], Built] | None
    refused: str | None = None             # why this combination is not built
    compile: str | None = None             # why torch.compile stays off (None: compiled, scope by world size)
    cuda_graph: str | None = None          # why the step is not captured as one CUDA graph (None: it may be)
    sequence_parallel: bool = False        # --sequence-parallel applies
    clip: str = ""
    checkpoint: str = ""


# ---------------------------------------------------------------- how each row is built

def _ddp(raw: nn.Module, cfg: Any, rank) -> Built:
    from gobrrr.parallel import ddp
    from gobrrr.parallel.tp import checkpoint as records  # a plain model's records are the tp = 1 case

    model, opt = ddp(raw), make_optimizer(raw, cfg, rank.device)

    def load_whole(model_sd: dict, opt_sd: dict) -> None:
        raw.load_state_dict(model_sd)
        opt.load_state_dict(opt_sd)

    return Built(model, opt, raw, rank.rank, rank.world_size, None, lambda: records.state_for_save(raw, opt),
                 lambda saved: records.state_for_load(raw, opt, saved), lambda: list(raw.parameters()),
                 load_whole=load_whole)


def _zero(raw: nn.Module, cfg: Any, rank, mesh=None) -> Built:
    from gobrrr.parallel import zero
    from gobrrr.parallel.zero import checkpoint as records

    group = mesh["dp"].get_group() if mesh is not None else None
    model, opt = zero(raw, lambda m: make_optimizer(m, cfg, rank.device), stage=cfg.zero, group=group,
                      param_dtype=torch.bfloat16 if rank.device.type == "cuda" else None)
    dp_rank, dp = (mesh.get_local_rank("dp"), mesh["dp"].size()) if mesh is not None else (rank.rank, rank.world_size)
    return Built(model, opt, raw, dp_rank, dp, None, lambda: records.state_for_save(model),
                 lambda saved: records.state_for_load(model, saved), lambda: [f.master for f in model.order],
                 report=lambda: str(model.step_report) if model.step_report is not None else None)


def _tensor_parallel(raw: nn.Module, cfg: Any, rank):
    """tp() over each group of --tp consecutive ranks of a (W/tp, tp) mesh: (the sharded GPT, the mesh, a line)."""
    from gobrrr.models.gpt_plan import GPT_PLAN  # the model's own plan: gobrrr.parallel knows no model
    from gobrrr.parallel.mesh import MeshError, make_mesh
    from gobrrr.parallel.tp.layers import TPError
    from gobrrr.parallel.tp.parallelize import tp
    from gobrrr.parallel.tp.report import comm_plan

    raw.fused_loss = None  # the chunked loss reads lm_head.weight whole; under tp the loss runs vocab-parallel
    try:
        mesh = make_mesh(cfg.tp)
        raw = tp(raw, mesh, plan=GPT_PLAN, sequence_parallel=cfg.sequence_parallel)
    except (MeshError, TPError) as e:
        raise TrainError(str(e)) from None
    rows = comm_plan(raw, cfg.batch_size, cfg.seq_len, 2 if rank.device.type == "cuda" else 4)  # from the formula
    mb = sum(r.wire_bytes(cfg.tp) for r in rows) / 1e6  # MB = 1e6 bytes
    line = (f"tp {cfg.tp} x dp {mesh['dp'].size()}{' with sequence parallelism' if cfg.sequence_parallel else ''}: "
            f"{len(rows)} tp collectives per micro-step, {mb:.1f} MB sent per rank")
    return raw, mesh, line


def _tp(raw: nn.Module, cfg: Any, rank) -> Built:
    from gobrrr.parallel import ddp
    from gobrrr.parallel.tp import checkpoint as records
    from gobrrr.parallel.tp.tensors import clip_grad_norm_

    raw, mesh, line = _tensor_parallel(raw, cfg, rank)
    model, opt = ddp(raw, group=mesh["dp"].get_group()), make_optimizer(raw, cfg, rank.device)
    return Built(model, opt, raw, mesh.get_local_rank("dp"), mesh["dp"].size(),
                 lambda params, max_norm: clip_grad_norm_(model, max_norm),  # each shard counted once
                 lambda: records.state_for_save(raw, opt), lambda saved: records.state_for_load(raw, opt, saved),
                 lambda: list(raw.parameters()), lines=[line])


def _tp_zero(raw: nn.Module, cfg: Any, rank) -> Built:
    raw, mesh, line = _tensor_parallel(raw, cfg, rank)
    built = _zero(raw, cfg, rank, mesh)  # its optimizer clips the norm over dp and tp
    built.lines.append(line)
    return built


# ---------------------------------------------------------------- the table

_TP_COMPILE = "--tp > 1: the tensor-parallel collectives inside a block are not traced yet"
_ZERO_GRAPH = "not with --zero yet (its hooks start collectives and swap buffers)"
_TP_GRAPH = "not with --tp > 1 yet"

LAYOUTS: dict[tuple[bool, int], Layout] = {
    (False, 0): Layout("ddp", _ddp, clip="torch.nn.utils.clip_grad_norm_ over the whole model",
                       checkpoint="whole tensors, written once"),
    (False, 1): Layout("zero1", _zero, cuda_graph=_ZERO_GRAPH, clip="ZeRO's, over every rank's shards",
                       checkpoint="each rank its pieces"),
    (False, 2): Layout("zero2", _zero, cuda_graph=_ZERO_GRAPH, clip="ZeRO's, over every rank's shards",
                       checkpoint="each rank its pieces"),
    (False, 3): Layout("zero3", _zero, compile="--zero 3: per-block parameter gathers in hooks are not traced yet",
                       cuda_graph=_ZERO_GRAPH, clip="ZeRO's, over every rank's shards",
                       checkpoint="each rank its pieces"),
    (True, 0): Layout("tp", _tp, compile=_TP_COMPILE, cuda_graph=_TP_GRAPH, sequence_parallel=True,
                      clip="tp's: each shard's square once", checkpoint="each tp rank its block"),
    (True, 1): Layout("tp+zero1", _tp_zero, compile=_TP_COMPILE, cuda_graph=_TP_GRAPH, sequence_parallel=True,
                      clip="ZeRO's, over dp and tp", checkpoint="each rank its pieces of its block"),
    (True, 2): Layout("tp+zero2", _tp_zero, compile=_TP_COMPILE, cuda_graph=_TP_GRAPH, sequence_parallel=True,
                      clip="ZeRO's, over dp and tp", checkpoint="each rank its pieces of its block"),
    (True, 3): Layout("tp+zero3", None, refused="--tp with --zero 3 is not built yet (stage 3 gathers whole "
                      "parameters per block, which tp() keeps sharded); use --tp with --zero 1 or 2, or --zero 3 "
                      "without --tp"),
}


def layout_of(tp: int | None, zero: int | None) -> Layout:
    """The row for a tensor-parallel degree and a ZeRO stage (0: ddp)."""
    return LAYOUTS[((tp or 1) > 1, zero or 0)]


def layout_for(cfg: Any) -> Layout:
    """The row for a TrainConfig; TrainError when the combination is refused."""
    layout = layout_of(cfg.tp, cfg.zero)
    if layout.build is None:
        raise TrainError(layout.refused)
    return layout

