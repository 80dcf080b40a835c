"""What the optimized ZeRO stages share: `ZeroConfig` and `_ZeroBase` (Zero12 in stages.py, Zero3 in zero3.py).

`ZeroConfig` is what must be identical on every rank (compared at wrap time, wrapper.py). `_ZeroBase`
owns the `Flat`s (shard.py) and runs the parts of the schedule every stage has in common, numbered as
in stages.py's docstring:
  3. a Flat whose gradients are all ready is staged into one padded vector and reduce-scattered, in
     launch order (every rank issues the same sequence); on a GPU on the comm stream after it waited
     for compute. # overlap: that reduce-scatter with the backward of the layers below it.
     `_land` turns the rank's slice of the sum into the average (accumulating in fp32 across micro-steps).
  4. end of backward: names parameters without a gradient; CPU: waits for gloo; GPU: compute waits
     for the comm stream (no host sync).
  6. after the optimizer stepped the fp32 masters, `after_step` casts them into the compute shards.
It also gives the optimizer wrapper (optim.py) the gradient shards, accounts the bytes held
(`memory_report`, beside shard.py's `formula_bytes`), and reads/loads whole-model state dicts
through checkpoint.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from gobrrr.parallel.wrapper import _DataParallel, _no_gradient_error, weak_grad_hook
from gobrrr.parallel.zero.shard import (
    Flat,
    MemoryReport,
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
    bucket_mb: float = 25                    # stages 1-2: bucket size, MiB (as ddp's)
    first_bucket_mb: float = 1
    accumulate: str = "sharded"              # "sharded" | "unsharded" (stages 2-3; stages.py's docstring)
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
