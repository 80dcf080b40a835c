"""ZeRO: data parallelism that shards optimizer state, gradients and parameters over the ranks.

Rajbhandari, Rasley, Ruwase, He 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC20). Plain data parallelism keeps on every rank what only one rank needs:
each rank owns 1/N of the elements (see shard.py for the flat, padded layout) and keeps,
for the elements it does not own, only what the stage still needs.

    model, opt = gobrrr.parallel.zero(model, lambda m: torch.optim.AdamW(m.parameters()), stage=2)
    loss = model(x, y); loss.backward(); opt.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

Memory per rank, psi = trainable parameter count, N ranks (`memory_report()` prints these beside
the bytes actually held; shard.py's `formula_bytes` computes them):

    stage           holds (bf16 compute, fp32 master + Adam, K = 12)     fp32 only (K = 8)
    plain DP  (0)   params 2 + grads 2 + optimizer 12    = 16 psi         16 psi
    1 (optimizer)   2 + 2 + 12/N                         = 4 psi + 12psi/N  8 psi + 8 psi/N
    2 (+ grads)     2 + 2/N + 12/N                       = 2 psi + 14psi/N  4 psi + 12 psi/N
    3 (+ params)    2/N + 2/N + 12/N                     = 16 psi / N       16 psi / N

fp32 only (CPU, or autocast over fp32 parameters): parameters and gradients take 4 bytes and the
parameter shard *is* the master weight, so the optimizer keeps only its K = 8 bytes of moments.
Not counted (transient): one in-flight bucket (bucket_mb) of gradients, the fp32 copy of a bf16
gradient shard during `step()`, and in stage 3 the gathered parameters of at most two units.

Traffic per step per rank, in elements (a ring moves (N-1)/N of each; bytes = elements x dtype):
stages 1-2 reduce-scatter psi + all-gather psi = 2 psi (the same as DDP's all-reduce of psi, which
is a reduce-scatter followed by an all-gather); stage 3 all-gathers psi in forward, again in
backward, and reduce-scatters psi: 3 psi, less the root unit's backward gather (it stays gathered
from its forward into its backward).

`NaiveZero1` (read this first), after backward, in `step()`:
    all-reduce every gradient (as DDP) -> step my shard of the fp32 master -> all-gather the shards.
It moves 3 psi (all-reduce 2 psi + all-gather psi) and overlaps nothing; it is the idea in 40 lines.

`Zero12` (stages 1 and 2), phase by phase, rank r of N:
  0. Wrap time, once. Ranks compare model signatures and the ZeRO settings (stage, dtypes,
     bucket sizes) and raise on a difference, naming it; rank 0's weights are broadcast. Trainable
     parameters are assigned to buckets in reverse registration order (ddp's `assign_buckets`),
     one optimizer param-group and one dtype per bucket; each bucket is a `Flat` padded to N*S.
     The compute parameters become views into the bucket's `full` (P,) vector; rank r keeps an
     fp32 master of its slice [r*S, (r+1)*S) and the user's optimizer is re-pointed at the masters:

         full  [ r0 | r1 | r2 ]   every rank, compute dtype
         master       [ r1 ]      rank 1 only, fp32; optimizer state the same shape

  1. Forward: unchanged (parameters are whole on every rank).
  2. Backward, per parameter (post-accumulate-grad hook), as in ddp.py. Stage 1: `.grad` is a
     view into the bucket's full gradient buffer. Stage 2: autograd's own `.grad` tensor, copied
     into a staging vector when its bucket is complete and then dropped.
  3. Backward, per complete bucket, in bucket order (every rank issues the same sequence):
     reduce-scatter(SUM) of the bucket's gradient (cast to grad_dtype when set), divide by N.
     GPU: on the comm stream after it waits for the compute stream.
     # overlap: this bucket's reduce-scatter with the backward of the layers below it.
     Stage 1 writes the average into its own slice of the full gradient buffer; stage 2 keeps it
     as (or adds it into) the rank's gradient shard and frees the staging vector.
  4. End of backward (engine callback): names parameters without a gradient; CPU: waits for gloo;
     GPU: the compute stream waits for the comm stream (no host sync).
  5. `opt.clip_grad_norm_(c)`: squared norm of my gradient shards, all-reduce(SUM), sqrt, scale.
     # sync: none on the host; the all-reduce of one scalar is stream-ordered on NCCL.
  6. `opt.step()`: master.grad = my gradient shard (cast to fp32); the user's optimizer steps the
     masters; each master is cast into my slice of `full`; all-gather(full) fills the other slices.
     GPU: on the comm stream; the compute stream waits for it before the next forward.

After backward only this rank's slice of the gradients is averaged (stage 1: the rest of the full
buffer still holds local gradients; stage 2: there is no rest). Read gradients through `opt`, and
weights through `model.state_dict()` (gathered) or checkpoint.py; `model.load_state_dict(plain)` loads.

Gradient accumulation (micro-steps inside `model.no_sync()`):
  stage 1: gradients accumulate in the full buffers (they exist anyway); one reduce-scatter at the
           last micro-step, exactly as DDP.
  stage 2, accumulate="sharded" (default): every micro-step reduce-scatters and adds into the
           rank's gradient shard, upcast to fp32 from the second micro-step: at most +4 psi/N
           bytes, but K x the reduce-scatter traffic. no_sync() does not skip communication here.
  stage 2/3, accumulate="unsharded": inside no_sync() autograd's `.grad` tensors accumulate
           locally (+ psi x grad bytes held, 2-4 psi at any N) and one reduce-scatter runs at the
           last micro-step: 1/K of the traffic. That is FSDP2's set_requires_gradient_sync(False).

Failures. Every collective goes through gobrrr.comm.collectives: a rank that dies or raises mid-step is
named by the others' CollectiveError (gloo), or by the peer monitor's exit (NCCL); with
GOBRRR_DIST_DEBUG=1 a rank issuing a different collective (another stage, bucket layout or shape)
is named before any data moves. Ranks built with different models or settings raise at wrap time.

Choices where the paper is silent: the reduce dtype defaults to the compute dtype (as FSDP2's
reduce_dtype defaults to param_dtype); buckets are the shard unit in stages 1-2 (each bucket is
split N ways, so every reduce-scatter is one bucket); stage 3's root unit is never resharded
between its forward and backward (FSDP2 does the same); the optimizer wrapper is optim.py.

World size 1 runs the same phases; the collectives become copies. Phases 3, 4 and the cast of
phase 6 are base.py's (`_ZeroBase`, shared with stage 3); this file is what differs in stages 1
and 2 (`Zero12`) and the naive stage 1. Stage 3 is zero3.py; `zero()` (api.py) picks the stage;
sharded checkpoints (torch.distributed.checkpoint) are checkpoint.py.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from gobrrr.parallel.ddp import MiB, assign_buckets
from gobrrr.parallel.wrapper import _DataParallel
from gobrrr.parallel.zero.base import OptimizerArg, ZeroConfig, _ZeroBase
from gobrrr.parallel.zero.shard import Flat, all_gather_flat, all_reduce_sum, check_optimizer_covers, group_index, nbytes

# ---------------------------------------------------------------- stages 1 and 2

class Zero12(_ZeroBase):
    """ZeRO stages 1 and 2; build it with `zero(model, optimizer, stage=1|2)` (module docstring)."""

    def __init__(self, module: nn.Module, optimizer: OptimizerArg, cfg: ZeroConfig, group=None):
        super().__init__(module, optimizer, cfg, group)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad][::-1]  # backward order
        keys = [(self.groups[id(p)], p.device) for _, p in named]
        buckets = assign_buckets([(p.numel(), p.dtype) for _, p in named], int(cfg.bucket_mb * MiB),
                                 int(cfg.first_bucket_mb * MiB), keys=keys)
        with torch.no_grad():
            for idx in buckets:
                f = self._new_flat([named[i][0] for i in idx], [named[i][1] for i in idx], keys[idx[0]][0])
                flat32 = f.flatten([p.detach() for p in f.params], f.master_dtype)  # (P,)
                f.full = flat32 if not f.mixed else flat32.to(f.dtype)
                f.shard = f.full[f.lo:f.lo + f.S]                                    # (S,) view
                f.master = flat32[f.lo:f.lo + f.S].clone() if f.mixed else f.shard
                for p, v in zip(f.params, f.views(f.full)):
                    p.data = v  # the compute parameters live in `full` from now on
                if cfg.stage == 1:
                    f.grad = torch.zeros(f.P, dtype=f.dtype, device=f.full.device)   # (P,)
                    f.grad_views = f.views(f.grad)
                    for p, v in zip(f.params, f.grad_views):
                        p.grad = v  # autograd accumulates into the bucket, as in ddp
                    f.grad_shard = f.grad[f.lo:f.lo + f.S]
                self.flats.append(f)
                self.order.append(f)
                self._hook(f)
        if cfg.param_dtype is not None:  # frozen parameters are not sharded in stages 1-2; just cast them
            for p in module.parameters():
                if not p.requires_grad and p.is_floating_point():
                    p.data = p.data.to(cfg.param_dtype)
        self._point_optimizer_at_masters()

    def _grad_ready(self, f: Flat, j: int) -> None:
        if self.cfg.stage == 1:
            p, view = f.params[j], f.grad_views[j]
            if p.grad.data_ptr() != view.data_ptr():  # .grad was set to None or replaced: move it home
                with torch.no_grad():
                    view.copy_(p.grad)
                p.grad = view
        super()._grad_ready(f, j)

    def _launch(self, f: Flat) -> None:
        if self.cfg.stage == 1:
            self._reduce_scatter(f, f.grad)
        else:
            super()._launch(f)

    @torch.no_grad()
    def _land(self, f: Flat, out: torch.Tensor) -> None:
        if self.cfg.stage == 2:
            return super()._land(f, out)
        f.grad[f.lo:f.lo + f.S].copy_(out.div_(self.world_size))  # stage 1: my slice of the full buffer
        f.accumulated = 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.cfg.stage == 2:
            return super().zero_grad(set_to_none)
        for f in self.order:
            f.grad.zero_()
            f.accumulated = 0
            for p, v in zip(f.params, f.grad_views):
                p.grad = v

    @torch.no_grad()
    def after_step(self) -> None:
        super().after_step()
        handles = []
        for f in self.order:
            if f.full.is_cuda:
                comm = self._stream(f.full.device)
                comm.wait_stream(torch.cuda.current_stream(f.full.device))  # the step wrote the shards
                with torch.cuda.stream(comm):
                    work = all_gather_flat(f.full, f.shard, self.group, self.world_size)
                    if work is not None:
                        work.wait()
            else:
                handles.append(all_gather_flat(f.full, f.shard, self.group, self.world_size))
        for h in handles:
            if h is not None:
                h.wait()  # sync: host waits for gloo (CPU tensors)
        if self._comm_stream is not None:
            # the next forward reads the gathered parameters (stream wait, no host sync)
            torch.cuda.current_stream(self._comm_stream.device).wait_stream(self._comm_stream)

    def _held(self) -> dict[str, int]:
        grads = sum(nbytes(f.grad) for f in self.order) if self.cfg.stage == 1 else \
            sum(nbytes(f.grad_shard) for f in self.order) + sum(nbytes(p.grad) for f in self.order for p in f.params)
        return {"params": sum(nbytes(f.full) for f in self.order), "grads": grads}

    def _unsharded_frozen(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if not p.requires_grad]


# ---------------------------------------------------------------- the naive stage 1

class NaiveZero1(_DataParallel):
    """ZeRO-1 in its plainest form: backward as usual, then in `step()`: all-reduce, step my shard, all-gather.

    Each optimizer param-group's trainable parameters form one Flat; rank r's optimizer steps an
    fp32 master of its slice. Nothing overlaps and nothing is bucketed: read it for the idea.
    """

    def __init__(self, module: nn.Module, optimizer: OptimizerArg, group=None):
        super().__init__(module, group, {"wrapper": "zero naive stage 1"})
        self.cfg = ZeroConfig(stage=1)
        self.rank = dist.get_rank(group) if self.world_size > 1 else 0
        self.optimizer = optimizer(module) if callable(optimizer) else optimizer
        groups = group_index(self.optimizer)
        check_optimizer_covers(module, groups)
        self.flats: list[Flat] = []
        with torch.no_grad():
            for g in range(len(self.optimizer.param_groups)):
                named = [(n, p) for n, p in module.named_parameters() if p.requires_grad and groups[id(p)] == g]
                if not named:
                    continue
                f = Flat(len(self.flats), [n for n, _ in named], [p for _, p in named], g, self.world_size,
                         self.rank, named[0][1].dtype, named[0][1].dtype)
                f.master = f.flatten([p.detach() for p in f.params], f.master_dtype)[f.lo:f.lo + f.S].clone()
                self.flats.append(f)
        self.order = self.flats
        for g, pg in enumerate(self.optimizer.param_groups):
            pg["params"] = [f.master for f in self.flats if f.group == g]

    state_dict = _ZeroBase.state_dict            # plain, gathered
    load_state_dict = _ZeroBase.load_state_dict

    def _end_backward(self) -> None:  # nothing happens during backward
        self._callback_queued = False

    def _reset_iteration(self) -> None:
        pass

    def grad_shards(self) -> list[tuple[Flat, torch.Tensor]]:
        out = []
        for f in self.flats:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in f.params]
            full = f.flatten(grads, f.master_dtype)  # (P,)
            self.reductions += 1
            all_reduce_sum(full, self.group, self.world_size)  # sync: gloo blocks the host (the naive part)
            out.append((f, full[f.lo:f.lo + f.S].div_(self.world_size)))  # my slice of the average
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.module.parameters():
            p.grad = None

    @torch.no_grad()
    def after_step(self) -> None:
        for f in self.flats:
            full = torch.empty(f.P, dtype=f.master_dtype, device=f.master.device)
            all_gather_flat(full, f.master, self.group, self.world_size, async_op=False)
            for p, v in zip(f.params, f.views(full)):
                p.copy_(v)
