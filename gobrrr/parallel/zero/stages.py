"""ZeRO: data parallelism that shards optimizer state, gradients and parameters over the ranks.

Rajbhandari, Rasley, Ruwase, He 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC20). Plain data parallelism keeps on every rank what only one rank needs:
each rank owns 1/N of the elements (see zero_shard.py for the flat, padded layout) and keeps,
for the elements it does not own, only what the stage still needs.

    model, opt = gobrrr.parallel.zero(model, lambda m: torch.optim.AdamW(m.parameters()), stage=2)
    loss = model(x, y); loss.backward(); opt.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

Memory per rank, psi = trainable parameter count, N ranks (`memory_report()` prints these beside
the bytes actually held; `formula_bytes` computes them):

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
weights through `model.state_dict()` (gathered) or zero_ckpt; `model.load_state_dict(plain)` loads.

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
between its forward and backward (FSDP2 does the same); the optimizer wrapper is zero_optim.py.

World size 1 runs the same phases; the collectives become copies. Stage 3 is zero3.py;
sharded checkpoints (torch.distributed.checkpoint) are zero_ckpt.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from gobrrr.parallel.ddp import MB, _DataParallel, _no_gradient_error, assign_buckets, weak_grad_hook
from gobrrr.parallel.zero.optim import ZeroOptimizer
from gobrrr.parallel.zero.shard import (
    Flat,
    MemoryReport,
    all_gather_flat,
    all_reduce_sum,
    check_optimizer_covers,
    formula_bytes,
    group_index,
    nbytes,
    reduce_scatter_flat,
)

OptimizerArg = Callable[[nn.Module], torch.optim.Optimizer] | torch.optim.Optimizer


@dataclass
class ZeroConfig:
    """What must be identical on every rank (checked at wrap time)."""
    stage: int = 2
    param_dtype: torch.dtype | None = None   # compute dtype of the parameters (torch.bfloat16: mixed)
    grad_dtype: torch.dtype | None = None    # reduce-scatter dtype (default: the compute dtype)
    bucket_mb: float = 25                    # stages 1-2: bucket size
    first_bucket_mb: float = 1
    accumulate: str = "sharded"              # "sharded" | "unsharded" (stages 2-3; see the docstring)
    reshard_after_forward: bool = True       # stage 3

    def __post_init__(self):
        if self.stage not in (1, 2, 3):
            raise ValueError(f"zero: stage must be 1, 2 or 3, got {self.stage!r}; pick one of 1, 2, 3.")
        if self.accumulate not in ("sharded", "unsharded"):
            raise ValueError(f"zero: accumulate must be 'sharded' or 'unsharded', got {self.accumulate!r}.")
        if self.bucket_mb <= 0 or self.first_bucket_mb <= 0:
            raise ValueError(f"zero: bucket_mb ({self.bucket_mb}) and first_bucket_mb must be > 0.")

    def settings(self) -> dict[str, Any]:
        return {"wrapper": f"zero stage {self.stage}", "param_dtype": str(self.param_dtype),
                "grad_dtype": str(self.grad_dtype), "bucket_mb": self.bucket_mb,
                "first_bucket_mb": self.first_bucket_mb, "accumulate": self.accumulate,
                "reshard_after_forward": self.reshard_after_forward}


# ---------------------------------------------------------------- what every optimized stage shares

class _ZeroBase(_DataParallel):
    """Flats, ordered reduce-scatter launching, the optimizer glue, clipping and memory accounting."""

    def __init__(self, module: nn.Module, optimizer: OptimizerArg, cfg: ZeroConfig, group=None):
        super().__init__(module, group, cfg.settings())
        self.cfg = cfg
        self.rank = dist.get_rank(group) if self.world_size > 1 else 0
        self.optimizer = optimizer(module) if callable(optimizer) else optimizer
        if self.optimizer.state:
            raise ValueError("zero: the optimizer already has state; wrap before the first optimizer step.")
        self.groups = group_index(self.optimizer)
        check_optimizer_covers(module, self.groups)
        self.flats: list[Flat] = []       # every Flat this wrapper owns
        self.order: list[Flat] = []       # trainable flats in the order their reduce-scatters launch
        self._next = 0
        self._comm_stream: torch.cuda.Stream | None = None
        self.step_report: MemoryReport | None = None  # bytes held at the end of the first opt.step()

    # -- building
    def _new_flat(self, names: list[str], params: list[nn.Parameter], group: int) -> Flat:
        p0 = params[0]
        dtype = self.cfg.param_dtype if (self.cfg.param_dtype and p0.is_floating_point()) else p0.dtype
        return Flat(len(self.flats), names, params, group, self.world_size, self.rank, dtype, p0.dtype)

    def _point_optimizer_at_masters(self) -> None:
        """The user's optimizer now steps one fp32 master shard per trainable Flat (same hyper-parameters)."""
        for g, pg in enumerate(self.optimizer.param_groups):
            pg["params"] = [f.master for f in self.flats if f.group == g]

    def _hook(self, f: Flat) -> None:
        for j, p in enumerate(f.params):
            self._hooks.append(p.register_post_accumulate_grad_hook(
                weak_grad_hook(self, lambda s, i=f.index, j=j: s._grad_ready(s.flats[i], j))))

    # -- backward
    def _communicating(self) -> bool:
        """Does this backward reduce? Outside no_sync always; inside it only with sharded accumulation (2-3)."""
        return self._syncing() or (self.cfg.stage >= 2 and self.cfg.accumulate == "sharded")

    def _grad_ready(self, f: Flat, j: int) -> None:
        if not self._communicating():
            return  # no_sync(): gradients accumulate where autograd put them
        self._queue_end_of_backward()
        if f.ready[j]:
            return
        f.ready[j] = True
        f.n_ready += 1
        self._flat_complete_hook(f)
        while self._next < len(self.order) and self.order[self._next].n_ready == len(self.order[self._next].params):
            self._launch(self.order[self._next])
            self._next += 1

    def _flat_complete_hook(self, f: Flat) -> None:
        """Stage 3 frees a unit's gathered parameters here."""

    def _launch(self, f: Flat) -> None:
        """Stage 2-3: stage the complete gradients into one padded vector and reduce-scatter it."""
        rdt = self.cfg.grad_dtype or f.dtype
        with torch.no_grad():
            staging = f.flatten([p.grad for p in f.params], rdt)  # (P,)
        for p in f.params:
            p.grad = None  # stage 2-3: the full gradient is not kept
        self._reduce_scatter(f, staging)

    def _reduce_scatter(self, f: Flat, full_grad: torch.Tensor) -> None:
        self.reductions += 1
        rdt = self.cfg.grad_dtype or f.dtype
        send = full_grad if full_grad.dtype == rdt else full_grad.to(rdt)
        if send.is_cuda:
            comm = self._stream(send.device)
            comm.wait_stream(torch.cuda.current_stream(send.device))  # the gradients were written on compute
            with torch.cuda.stream(comm):
                # overlap: this reduce-scatter (and the divide) with the backward of the layers below it
                out = torch.empty(f.S, dtype=rdt, device=send.device)
                work = reduce_scatter_flat(out, send, self.group, self.world_size)
                if work is not None:
                    work.wait()  # the comm stream waits for NCCL; the host does not
                self._land(f, out)
            send.record_stream(comm)  # dropped by the host now: the allocator must wait for the comm stream
        else:
            out = torch.empty(f.S, dtype=rdt, device=send.device)
            work = reduce_scatter_flat(out, send, self.group, self.world_size)
            if work is None:
                self._land(f, out)
            else:
                f.work = (work, out, send)  # gloo reduces on its own thread; finished in _end_backward

    @torch.no_grad()
    def _land(self, f: Flat, out: torch.Tensor) -> None:
        """The reduced sum of this rank's slice: turn it into the average and keep it (stage 2-3)."""
        out.div_(self.world_size)
        if f.grad_shard is None:
            f.grad_shard = out
        else:
            if f.grad_shard.dtype != f.master_dtype:  # accumulating: sum the micro-steps in fp32 (+4 psi/N at most)
                f.grad_shard = f.grad_shard.to(f.master_dtype)
            f.grad_shard.add_(out)
        f.accumulated += 1

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if self._comm_stream is None:
            self._comm_stream = torch.cuda.Stream(device)
        return self._comm_stream

    def _end_backward(self) -> None:
        self._callback_queued = False
        try:
            missing = [n for f in self.order[self._next:] for n, r in zip(f.names, f.ready) if not r]
            if not self._communicating():
                missing = []  # an unsharded no_sync() micro-step: nothing was meant to reduce
            for f in self.order[:self._next]:
                if f.work is not None:
                    work, out, _send = f.work
                    work.wait()  # sync: host waits for gloo's thread (CPU tensors, no device involved)
                    f.work = None
                    self._land(f, out)
            if self._comm_stream is not None:
                # the optimizer runs on the caller's stream (stream wait, no host sync)
                torch.cuda.current_stream(self._comm_stream.device).wait_stream(self._comm_stream)
            if missing:
                raise _no_gradient_error(missing)
            self._backward_done_hook()
        finally:
            self._reset_iteration()

    def _backward_done_hook(self) -> None:
        """Stage 3 frees whatever is still gathered here."""

    def _reset_iteration(self) -> None:
        self._next = 0
        for f in self.order:
            f.reset_ready()
            f.work = None

    # -- optimizer side (called by ZeroOptimizer)
    def grad_shards(self) -> list[tuple[Flat, torch.Tensor]]:
        return [(f, f.grad_shard) for f in self.order if f.grad_shard is not None and f.accumulated]

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 - shards are always dropped
        for f in self.order:
            f.grad_shard, f.accumulated = None, 0
        for p in self.module.parameters():
            p.grad = None

    @torch.no_grad()
    def after_step(self) -> None:
        """Masters -> compute shards (stage 3 stops here; stages 1-2 then all-gather)."""
        for f in self.order:
            if f.mixed:
                f.shard.copy_(f.master)
        if self.step_report is None:  # gradients and optimizer state both exist now: the formula's moment
            self.step_report = self.memory_report()

    # -- accounting
    def _held(self) -> dict[str, int]:
        raise NotImplementedError

    def memory_report(self) -> MemoryReport:
        held = self._held()
        opt_b = 0
        per_elem = 0
        for f in self.order:
            if f.mixed:
                opt_b += nbytes(f.master)
            st = self.optimizer.state.get(f.master, {})
            for v in st.values():
                if torch.is_tensor(v) and v.dim() > 0:  # the scalar step counters are not counted
                    opt_b += nbytes(v)
                    per_elem += v.element_size() if f is self.order[0] else 0
        held["optimizer"] = opt_b
        held["total"] = held["params"] + held["grads"] + held["optimizer"]
        psi = sum(f.P for f in self.order)
        mixed = any(f.mixed for f in self.order)
        formula = formula_bytes(self.cfg.stage, psi, self.world_size, mixed, state_bytes=per_elem or 8,
                                unsharded_grads=False)
        frozen = sum(nbytes(f.full if self.cfg.stage < 3 else f.shard) for f in self.flats if not f.trainable)
        frozen += sum(p.numel() * p.element_size() for p in self._unsharded_frozen())
        peak = None
        dev = next(iter(self.module.parameters())).device
        if dev.type == "cuda":
            peak = torch.cuda.max_memory_allocated(dev)
        return MemoryReport(self.cfg.stage, self.rank, self.world_size, psi, mixed, held, formula, frozen, peak)

    def _unsharded_frozen(self) -> list[nn.Parameter]:
        return []

    # -- the whole model's weights, as a plain state_dict (FSDP's "full state dict")
    def state_dict(self, *args, **kwargs) -> dict[str, torch.Tensor]:  # noqa: ARG002 - nn.Module's signature
        """Every parameter at master precision, gathered on every rank (a collective), plus the buffers."""
        from gobrrr.parallel.zero.checkpoint import full_state_dict
        return full_state_dict(self)

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True, assign: bool = False):
        """Load a plain (unwrapped) state_dict: each rank keeps its own slices; the same dict on every rank."""
        from gobrrr.parallel.zero.checkpoint import load_full_state_dict
        load_full_state_dict(self, state_dict)


# ---------------------------------------------------------------- stages 1 and 2

class Zero12(_ZeroBase):
    """ZeRO stages 1 and 2; build it with `zero(model, optimizer, stage=1|2)` (module docstring)."""

    def __init__(self, module: nn.Module, optimizer: OptimizerArg, cfg: ZeroConfig, group=None):
        super().__init__(module, optimizer, cfg, group)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad][::-1]  # backward order
        keys = [(self.groups[id(p)], p.device) for _, p in named]
        buckets = assign_buckets([(p.numel(), p.dtype) for _, p in named], int(cfg.bucket_mb * MB),
                                 int(cfg.first_bucket_mb * MB), keys=keys)
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


def zero(model: nn.Module, optimizer: OptimizerArg, *, stage: int = 2, group=None, naive: bool = False,
         param_dtype: torch.dtype | None = None, grad_dtype: torch.dtype | None = None, bucket_mb: float = 25,
         first_bucket_mb: float = 1, accumulate: str = "sharded", reshard_after_forward: bool = True,
         wrap_rule: Callable[[nn.Module], list[nn.Module]] | None = None):
    """Shard `model` and its optimizer over the ranks of `group`; return (wrapped model, optimizer).

    optimizer: an optimizer over `model`'s parameters that has not stepped yet, or a function
    model -> optimizer. Its param groups and hyper-parameters are kept; its parameters become this
    rank's fp32 master shards. param_dtype=torch.bfloat16: bf16 compute parameters, fp32 masters.
    naive=True (stage 1 only): `NaiveZero1`. wrap_rule (stage 3): model -> the modules to shard as
    units (default: every child of every nn.ModuleList); the root unit holds the rest.
    """
    if naive:
        if stage != 1:
            raise ValueError(f"zero: the naive version is stage 1 only, got stage {stage}; drop naive=True.")
        wrapped = NaiveZero1(model, optimizer, group)
        return wrapped, ZeroOptimizer(wrapped)
    cfg = ZeroConfig(stage, param_dtype, grad_dtype, bucket_mb, first_bucket_mb, accumulate, reshard_after_forward)
    if stage == 3:
        from gobrrr.parallel.zero.zero3 import Zero3
        wrapped = Zero3(model, optimizer, cfg, group, wrap_rule)
    else:
        wrapped = Zero12(model, optimizer, cfg, group)
    return wrapped, ZeroOptimizer(wrapped)


def memory_report(model: nn.Module) -> MemoryReport:
    """Bytes of parameters, gradients and optimizer state this rank holds, beside the stage's formula."""
    if not isinstance(model, _ZeroBase):
        raise TypeError(f"memory_report: {type(model).__name__} is not wrapped by gobrrr.parallel.zero; "
                        "wrap it first with model, opt = gobrrr.parallel.zero(model, optimizer, stage=...).")
    return model.memory_report()
