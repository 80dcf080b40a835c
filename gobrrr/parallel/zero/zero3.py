"""ZeRO stage 3: parameters live sharded too; each unit gathers its own just before it computes.

Rajbhandari et al. 2020 (ZeRO, stage "P_os+g+p"); the unit-by-unit gathering and prefetching is
what PyTorch FSDP does (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded
Data Parallel"). Build it with `zero(model, optimizer, stage=3)`.

Units. `wrap_rule(model)` returns the modules whose parameters are sharded and gathered
together (default `blocks_rule`: every child of every nn.ModuleList, i.e. the GPT's blocks).
The root unit holds every other parameter (embeddings, final norm, the tied head). A parameter
used by two units (tied weights) belongs to the root. Each unit has one `Flat` per (optimizer
param-group, dtype, trainable) and rank r keeps only its slice; `full` exists only while gathered:

    between steps      unit k:  shard [r]                        (S elements per Flat)
    while gathered     unit k:  full  [ r0 | r1 | r2 ]           (P = N*S elements)

The schedule, phase by phase (units u0..uL-1 in forward order, root R):
  1. Forward, at the wrapper: gather R (all-gather its Flats into `full`); prefetch u0.
  2. Forward, before unit k (forward pre-hook): wait for u_k's gather, then launch u_{k+1}'s.
     GPU: the gather runs on the comm stream, after that stream waited for everything queued so
     far on compute; compute waits for the gather's event just before u_k's first kernel.
     # overlap: u_{k+1}'s all-gather with u_k's forward compute.
  3. Forward, after unit k (forward hook): reshard_after_forward=True frees u_k's `full` (its
     storage is resized to 0; autograd's saved references keep the tensor objects, not the
     bytes); a hook is put on u_k's output for phase 4.
  4. Backward, before unit k (the hook on its output fires when the output's gradient is ready):
     gather u_k again (a no-op if it stayed gathered), prefetch u_{k-1}'s gather.
     # overlap: u_{k-1}'s all-gather with u_k's backward compute.
  5. Backward, after unit k (post-accumulate-grad hooks): when every trainable parameter of u_k
     has its gradient, u_k's `full` is freed and its Flats are reduce-scattered in order, as in
     stage 2 (stages.py phase 3, base.py). # overlap: this reduce-scatter with u_{k-1}'s backward.
  6. End of backward: wait for the reduce-scatters (CPU) or make compute wait for comm (GPU);
     free R and anything still gathered. Only shards remain: 16 psi / N bytes (mixed or fp32).
  7. `opt.step()` steps the masters and copies them into the compute shards; nothing is
     gathered until the next forward. (A forward under torch.no_grad() frees R at its end.)

Traffic per step per rank: forward psi + backward (psi - root's) + reduce-scatter psi; with
reshard_after_forward=False the backward gathers are skipped (2 psi) and every unit stays
gathered from its forward to its backward (more memory). Memory while running: the shards,
root's `full`, and at most two gathered units (this one and the prefetched one).

Accumulation: as stage 2 (stages.py): "sharded" reduce-scatters every micro-step into the fp32
gradient shard; "unsharded" keeps autograd's full `.grad` tensors through no_sync() micro-steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from gobrrr.parallel.zero.base import OptimizerArg, ZeroConfig, _ZeroBase
from gobrrr.parallel.zero.shard import Flat, all_gather_flat, nbytes


def blocks_rule(model: nn.Module) -> list[nn.Module]:
    """The default wrap rule: every child of every nn.ModuleList (a GPT's blocks), in registration order."""
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


@dataclass
class Unit:
    """A group of parameters gathered and freed together."""
    index: int                       # forward order; -1 for the root
    module: nn.Module
    flats: list[Flat] = field(default_factory=list)
    state: str = "free"              # free | gathering | gathered
    pending: Any = None              # CPU: list of works; GPU: the gather's event
    backward_started: bool = False


class Zero3(_ZeroBase):
    """ZeRO stage 3 (see the module docstring)."""

    def __init__(self, module: nn.Module, optimizer: OptimizerArg, cfg: ZeroConfig, group=None,
                 wrap_rule: Callable[[nn.Module], list[nn.Module]] | None = None):
        super().__init__(module, optimizer, cfg, group)
        self.gathers = 0  # all-gathers of units launched (tests count them)
        self.record_gathers = False  # GPU: keep (phase, unit, start event, end event) per gather (tests, figures)
        self.gather_events: list[tuple[str, int, torch.cuda.Event, torch.cuda.Event]] = []
        self._phase = "forward"
        modules = (wrap_rule or blocks_rule)(module)
        owners: dict[int, list[int]] = {}
        for k, m in enumerate(modules):
            for p in m.parameters():
                owners.setdefault(id(p), []).append(k)
        self.units = [Unit(k, m) for k, m in enumerate(modules)]
        self.root = Unit(-1, module)
        members: dict[int, list[tuple[str, nn.Parameter]]] = {}
        for n, p in module.named_parameters():
            own = owners.get(id(p), [])
            members.setdefault(own[0] if len(own) == 1 else -1, []).append((n, p))
        self._unit_of: dict[int, Unit] = {}
        with torch.no_grad():
            for u in [*self.units, self.root]:
                by_key: dict[tuple, list[tuple[str, nn.Parameter]]] = {}
                for n, p in members.get(u.index, []):
                    key = (self.groups.get(id(p), -1) if p.requires_grad else -1, p.dtype, p.device)
                    by_key.setdefault(key, []).append((n, p))
                for (g, _, _), named in by_key.items():
                    u.flats.append(self._build_flat([n for n, _ in named], [p for _, p in named], g))
                    self._unit_of[id(u.flats[-1])] = u
        # reduce-scatters launch in backward order: units last to first, then the root
        self.order = [f for u in [*reversed(self.units), self.root] for f in u.flats if f.trainable]
        for f in self.order:
            self._hook(f)
        for u in self.units:
            self._hooks.append(u.module.register_forward_pre_hook(lambda m, a, u=u: self._pre_forward(u)))
            self._hooks.append(u.module.register_forward_hook(lambda m, a, out, u=u: self._post_forward(u, out)))
        self._point_optimizer_at_masters()

    def _build_flat(self, names: list[str], params: list[nn.Parameter], group: int) -> Flat:
        f = self._new_flat(names, params, group)
        flat32 = f.flatten([p.detach() for p in params], f.master_dtype)           # (P,), transient
        f.shard = flat32[f.lo:f.lo + f.S].to(f.dtype).clone()                     # (S,) compute dtype
        f.master = flat32[f.lo:f.lo + f.S].clone() if f.mixed else f.shard       # (S,) fp32
        f.full = torch.empty(f.P, dtype=f.dtype, device=flat32.device)            # (P,) storage freed below
        for p, v in zip(params, f.views(f.full)):
            p.data = v  # parameters are views into `full`; they have bytes only while gathered
        f.full.untyped_storage().resize_(0)
        self.flats.append(f)
        return f

    # -- gather / free
    def _gather(self, u: Unit, wait: bool) -> None:
        if u.state == "free" and u.flats:
            self.gathers += 1
            for f in u.flats:
                f.full.untyped_storage().resize_(f.P * f.full.element_size())  # allocated on the compute stream
            dev = u.flats[0].full.device
            if dev.type == "cuda":
                comm = self._stream(dev)
                comm.wait_stream(torch.cuda.current_stream(dev))  # shards written by the step; memory free to reuse
                with torch.cuda.stream(comm):
                    if self.record_gathers:
                        start = torch.cuda.Event(enable_timing=True)
                        start.record(comm)
                    for f in u.flats:
                        work = all_gather_flat(f.full, f.shard, self.group, self.world_size)
                        if work is not None:
                            work.wait()  # comm stream waits for NCCL; the host does not
                    u.pending = torch.cuda.Event(enable_timing=self.record_gathers)
                    u.pending.record(comm)
                    if self.record_gathers:
                        self.gather_events.append((self._phase, u.index, start, u.pending))
            else:
                u.pending = [all_gather_flat(f.full, f.shard, self.group, self.world_size) for f in u.flats]
            u.state = "gathering"
        if wait and u.state == "gathering":
            if isinstance(u.pending, torch.cuda.Event):
                torch.cuda.current_stream(u.flats[0].full.device).wait_event(u.pending)  # stream wait, no host sync
            else:
                for w in u.pending:
                    if w is not None:
                        w.wait()  # sync: host waits for gloo (CPU tensors)
            u.pending, u.state = None, "gathered"

    def _free(self, u: Unit) -> None:
        if u.state == "free":
            return
        self._gather(u, wait=True)  # never free under an in-flight gather
        for f in u.flats:
            f.full.untyped_storage().resize_(0)
        u.state = "free"

    # -- forward and backward hooks
    def forward(self, *args, **kwargs):
        self._phase = "forward"
        self._gather(self.root, wait=True)
        if self.units:
            self._gather(self.units[0], wait=False)  # overlap: u0's gather with the root's first layers
        out = super().forward(*args, **kwargs)
        if not torch.is_grad_enabled() and self.cfg.reshard_after_forward:
            self._free(self.root)  # no backward follows (evaluation): back to shards only
        return out

    def _pre_forward(self, u: Unit) -> None:
        self._gather(u, wait=True)
        if u.index + 1 < len(self.units):
            self._gather(self.units[u.index + 1], wait=False)  # overlap: next unit's gather with this compute

    def _post_forward(self, u: Unit, out) -> None:
        if self.cfg.reshard_after_forward:
            self._free(u)
        if torch.is_grad_enabled():
            outs = out if isinstance(out, (tuple, list)) else [out]
            for t in outs:
                if torch.is_tensor(t) and t.requires_grad:
                    t.register_hook(lambda g, u=u: self._pre_backward(u))

    def _pre_backward(self, u: Unit) -> None:
        self._queue_end_of_backward()
        if u.backward_started:
            return
        u.backward_started = True
        self._phase = "backward"
        self._gather(u, wait=True)
        if u.index > 0:
            self._gather(self.units[u.index - 1], wait=False)  # overlap: previous unit's gather with this backward

    def _flat_complete_hook(self, f: Flat) -> None:
        u = self._unit_of[id(f)]
        if u is not self.root and all(g.n_ready == len(g.params) for g in u.flats if g.trainable):
            self._free(u)  # every gradient of this unit exists: its parameters are no longer needed

    def _backward_done_hook(self) -> None:
        for u in [*self.units, self.root]:
            self._free(u)
            u.backward_started = False

    def _end_backward(self) -> None:
        try:
            super()._end_backward()
        finally:
            for u in [*self.units, self.root]:  # also after no_sync micro-steps and failures
                if u.state != "free":
                    self._free(u)
                u.backward_started = False

    # -- accounting
    def _held(self) -> dict[str, int]:
        params = sum(nbytes(f.shard) + nbytes(f.full) for f in self.order)
        grads = sum(nbytes(f.grad_shard) for f in self.order) + sum(nbytes(p.grad) for f in self.order for p in f.params)
        return {"params": params, "grads": grads}
