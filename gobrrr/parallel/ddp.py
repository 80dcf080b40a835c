"""Data parallelism: every rank holds the whole model; gradients are averaged over ranks.

Two versions sit side by side (as in picotron), so a reader meets the idea before the
optimization:

`NaiveDDP`  When backward is done, all-reduce every gradient tensor, one after another.
            Correct and short, but the network idles during the whole backward, the GPU
            idles during the whole communication, and a GPT-2 pays a collective's latency
            about 150 times per step.

`ddp(model)` Gradients are packed into a few flat buckets; a bucket's all-reduce starts
            while backward is still computing the gradients of earlier layers (Li et al.
            2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
            VLDB). Its schedule, phase by phase:

  0. Wrap time, once. All ranks exchange a signature of their model (name, shape, dtype and
     requires_grad of every parameter and buffer, plus the bucket settings) and raise, all of
     them, on the first difference. Rank 0's parameters and buffers are broadcast. Trainable
     parameters are assigned to buckets in *reverse registration order*, which is roughly the
     order backward produces their gradients; the first bucket is small (first_bucket_mb) so
     that communication starts early. Each bucket owns a flat buffer of one dtype and every
     `.grad` becomes a view into it: autograd accumulates straight into the memory that is
     communicated, with no copy.
  1. Forward: a pass-through that only notes whether this iteration communicates (it does
     not inside `no_sync()`).
  2. Backward, per parameter: autograd accumulates the gradient into `.grad`, then calls our
     post-accumulate-grad hook. The first hook of the iteration queues an end-of-backward
     callback with the autograd engine (phase 4). The hook marks the parameter ready (if the
     user had set `.grad` to None, the fresh gradient is first copied into its bucket view).
  3. Backward, per bucket: when the last gradient of a bucket is ready, and every bucket
     before it has been launched (so that every rank issues its collectives in the same
     order), the bucket's all-reduce is launched without waiting for it:
       GPU: the comm stream waits for the compute stream (the gradients are written there);
            [bf16 compression: cast the bucket into its bf16 twin]; all-reduce(SUM) on the
            comm stream; `work.wait()` makes the comm stream (not the host) wait for NCCL;
            divide by the world size [bf16: written back into the fp32 bucket].
            # overlap: this bucket's all-reduce with the backward of the layers below it.
       CPU (gloo): the all-reduce runs on gloo's own thread; the division waits for phase 4.
  4. End of backward (the engine callback). Every bucket must have been launched; one that
     was not names the parameters that got no gradient and raises (instead of a hang in the
     next collective). GPU: the caller's stream waits for the comm stream - stream waits
     only, no host sync. CPU: wait for each bucket and divide. So when `loss.backward()`
     returns, every `.grad` holds the average over ranks and `optimizer.step()` needs
     nothing else.

Gradient accumulation: a backward whose forward ran inside `model.no_sync()` (or which runs
inside it itself) skips phases 3-4: gradients just accumulate in the buckets, and the next
backward outside `no_sync()` reduces the sum once.

World size 1 runs the same phases; the collective and the division are no-ops.

Limits, on purpose: one device per rank, and the model is wrapped after it is moved there.
Buckets keep their wrap-time order (torch's DDP re-buckets after the first iteration in the
order gradients actually arrived; for a GPT, reverse registration order already is that
order). A parameter unused on *some* ranks only: those ranks raise, the others wait in their
next collective until the process-group timeout.

Phase 0, the forward pass-through, `no_sync()` and the hook plumbing are wrapper.py's, shared
with the ZeRO stages. ZeRO (Rajbhandari et al. 2020) is built on this schedule in zero/: stages
1-2 (zero/stages.py) reduce-scatter flat buckets like these, padded to a multiple of the world
size (zero/shard.py's `Flat`), so each rank keeps only the shard of gradients its optimizer owns,
and all-gather the updated shards after the step; stage 3 (zero/zero3.py) shards the parameters too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gobrrr.parallel.wrapper import _DataParallel, _explain, _no_gradient_error, weak_grad_hook

MiB = 1 << 20  # bucket_mb and first_bucket_mb are in MiB (2**20 bytes), as torch DDP's bucket_cap_mb


# ---------------------------------------------------------------- bucket assignment

def assign_buckets(sizes: list[tuple[int, torch.dtype]], bucket_bytes: int, first_bucket_bytes: int,
                   keys: list[Any] | None = None) -> list[list[int]]:
    """Group parameters, given in the order backward produces them, into buckets of one dtype.

    `sizes[i] = (numel, dtype)`. One bucket is open per (dtype, key); a parameter joins the
    open bucket of its kind, which closes once it holds at least the cap: `first_bucket_bytes`
    until the first bucket has closed, `bucket_bytes` after. A parameter of `bucket_bytes` or
    more travels alone, and first closes the open bucket so it does not hold that one back.
    Buckets are returned in the order they complete (by their last index).
    """
    closed: list[list[int]] = []
    open_: dict[Any, list[int]] = {}
    open_bytes: dict[Any, int] = {}
    for i, (numel, dtype) in enumerate(sizes):
        kind = (dtype, None if keys is None else keys[i])
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        cap = first_bucket_bytes if not closed else bucket_bytes
        if nbytes >= bucket_bytes:
            if kind in open_:
                closed.append(open_.pop(kind))
                del open_bytes[kind]
            closed.append([i])
            continue
        open_.setdefault(kind, []).append(i)
        open_bytes[kind] = open_bytes.get(kind, 0) + nbytes
        if open_bytes[kind] >= cap:
            closed.append(open_.pop(kind))
            del open_bytes[kind]
    return sorted(closed + list(open_.values()), key=lambda b: b[-1])


@dataclass
class Bucket:
    """A flat gradient buffer of one dtype shared by a few parameters, reduced as one collective."""
    index: int
    names: list[str]
    params: list[nn.Parameter]
    views: list[torch.Tensor]            # views[j] is params[j].grad's home: a view of `buffer`
    buffer: torch.Tensor                 # (numel,) in the parameters' dtype
    comm_buffer: torch.Tensor | None     # (numel,) in grad_dtype when compressing, else None
    ready: list[bool] = field(default_factory=list)
    n_ready: int = 0
    work: Any = None                     # the in-flight collective's handle (CPU path)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


# ---------------------------------------------------------------- the naive version

class NaiveDDP(_DataParallel):
    """After backward, all-reduce each gradient, one tensor at a time, then divide by the world size.

    Same contract as `ddp(model)`: after `loss.backward()` returns, `.grad` holds the average.
    """

    def __init__(self, module: nn.Module, group=None):
        super().__init__(module, group, {"wrapper": "NaiveDDP"})
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._got_grad = [False] * len(self._named)
        for i, (_, p) in enumerate(self._named):
            self._hooks.append(p.register_post_accumulate_grad_hook(
                weak_grad_hook(self, lambda s, i=i: s._grad_ready(i))))

    def _grad_ready(self, i: int) -> None:
        if self._syncing():
            self._queue_end_of_backward()
            self._got_grad[i] = True

    def _reset_iteration(self) -> None:
        self._got_grad = [False] * len(self._named)

    def _end_backward(self) -> None:
        self._callback_queued = False
        missing = [n for (n, _), got in zip(self._named, self._got_grad) if not got]
        self._reset_iteration()
        if missing:
            raise _no_gradient_error(missing)
        for n, p in self._named:
            self.reductions += 1
            if self._communicate:
                # sync: on gloo the host waits for each tensor (that is the naive part); NCCL only orders streams
                try:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group)
                except RuntimeError as exc:
                    raise _explain(exc, self.group, f"NaiveDDP all_reduce of {n}'s gradient") from exc
                p.grad.div_(self.world_size)


# ---------------------------------------------------------------- the bucketed, overlapped version

class DDP(_DataParallel):
    """Bucketed data parallel wrapper; build it with `ddp(model, ...)` (see the module docstring)."""

    def __init__(self, module: nn.Module, *, bucket_mb: float = 25, first_bucket_mb: float = 1, group=None,
                 grad_dtype: torch.dtype | None = None, _force_communication: bool = False):
        if bucket_mb <= 0 or first_bucket_mb <= 0:
            raise ValueError(f"ddp: bucket_mb ({bucket_mb}) and first_bucket_mb ({first_bucket_mb}) must be > 0.")
        settings = {"wrapper": "DDP", "bucket_mb": bucket_mb, "first_bucket_mb": first_bucket_mb,
                    "grad_dtype": str(grad_dtype)}
        super().__init__(module, group, settings, _force_communication)
        self.grad_dtype = grad_dtype
        self._comm_stream: torch.cuda.Stream | None = None
        self._next_bucket = 0
        # backward produces gradients roughly in reverse registration order
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad][::-1]
        groups = assign_buckets([(p.numel(), p.dtype) for _, p in named], int(bucket_mb * MiB),
                                int(first_bucket_mb * MiB), keys=[p.device for _, p in named])
        self.buckets: list[Bucket] = [self._make_bucket(k, [named[i] for i in idx]) for k, idx in enumerate(groups)]
        for k, b in enumerate(self.buckets):
            for j, p in enumerate(b.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    weak_grad_hook(self, lambda s, k=k, j=j: s._grad_ready(s.buckets[k], j))))

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{b.nbytes / MiB:.1f}" for b in self.buckets)
        return f"world_size={self.world_size}, buckets MiB=[{sizes}], grad_dtype={self.grad_dtype}"

    @torch.no_grad()
    def _make_bucket(self, index: int, named: list[tuple[str, nn.Parameter]]) -> Bucket:
        p0 = named[0][1]
        total = sum(p.numel() for _, p in named)
        buffer = torch.zeros(total, dtype=p0.dtype, device=p0.device)  # (numel,)
        views, offset = [], 0
        for _, p in named:
            view = buffer[offset:offset + p.numel()].view(p.shape)
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view  # from now on autograd accumulates into the bucket
            views.append(view)
            offset += p.numel()
        compress = (self.grad_dtype is not None and self.grad_dtype != p0.dtype and p0.is_floating_point()
                    and self._communicate)
        comm_buffer = torch.empty(total, dtype=self.grad_dtype, device=p0.device) if compress else None
        return Bucket(index, [n for n, _ in named], [p for _, p in named], views, buffer, comm_buffer,
                      ready=[False] * len(named))

    # -- phase 2: one gradient is ready
    def _grad_ready(self, b: Bucket, j: int) -> None:
        p, view = b.params[j], b.views[j]
        if p.grad.data_ptr() != view.data_ptr():
            # .grad had been set to None (zero_grad) or replaced: move the fresh gradient home
            with torch.no_grad():
                view.copy_(p.grad)
            p.grad = view
        if not self._syncing():
            return  # no_sync(): accumulate only
        self._queue_end_of_backward()
        if b.ready[j]:
            return
        b.ready[j] = True
        b.n_ready += 1
        # phase 3: launch, in bucket order, every bucket that is complete
        while self._next_bucket < len(self.buckets):
            nxt = self.buckets[self._next_bucket]
            if nxt.n_ready < len(nxt.params):
                break
            self._launch(nxt)
            self._next_bucket += 1

    # -- phase 3: one bucket is complete
    def _launch(self, b: Bucket) -> None:
        self.reductions += 1
        if not self._communicate:
            return
        if b.buffer.is_cuda:
            comm = self._stream(b.buffer.device)
            comm.wait_stream(torch.cuda.current_stream(b.buffer.device))  # the gradients were written on compute
            with torch.cuda.stream(comm):
                # overlap: this bucket's all-reduce (and cast/divide) with the rest of backward on the compute stream
                work = self._reduce(b)
                work.wait()  # NCCL: the comm stream waits for the collective; the host does not
                self._finish(b)
        else:
            b.work = self._reduce(b)  # gloo reduces on its own thread; waited for in phase 4

    def _reduce(self, b: Bucket):
        """Start the bucket's all-reduce (ZeRO reduce-scatters instead: zero/base.py's `_reduce_scatter`)."""
        if b.comm_buffer is not None:
            b.comm_buffer.copy_(b.buffer)  # fp32 -> bf16: half the bytes on the wire
        tensor = b.comm_buffer if b.comm_buffer is not None else b.buffer
        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _finish(self, b: Bucket) -> None:
        """Turn the reduced sum into the average, back in the gradients' own dtype."""
        if b.comm_buffer is not None:
            b.buffer.copy_(b.comm_buffer)
        b.buffer.div_(self.world_size)

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if self._comm_stream is None:
            self._comm_stream = torch.cuda.Stream(device)
            for b in self.buckets:  # these buffers are used on the comm stream from now on
                b.buffer.record_stream(self._comm_stream)
                if b.comm_buffer is not None:
                    b.comm_buffer.record_stream(self._comm_stream)
        return self._comm_stream

    # -- phase 4: the autograd engine is done
    def _end_backward(self) -> None:
        self._callback_queued = False
        try:
            missing = [n for b in self.buckets[self._next_bucket:] for n, r in zip(b.names, b.ready) if not r]
            for b in self.buckets[:self._next_bucket]:
                if b.work is not None:  # CPU: gloo worked in the background during backward
                    try:
                        b.work.wait()  # sync: host waits for gloo's thread (CPU tensors, no device involved)
                    except RuntimeError as exc:  # a peer died or left: name it, as gobrrr.comm.collectives does
                        raise _explain(exc, self.group, f"ddp all_reduce of gradient bucket {b.index}") from exc
                    b.work = None
                    self._finish(b)
            if self._comm_stream is not None:
                # the optimizer runs on the caller's stream: it must see the averaged gradients (stream wait, no host sync)
                torch.cuda.current_stream(self._comm_stream.device).wait_stream(self._comm_stream)
            if missing:
                raise _no_gradient_error(missing)
        finally:
            self._reset_iteration()

    def _reset_iteration(self) -> None:
        self._next_bucket = 0
        for b in self.buckets:
            b.ready = [False] * len(b.params)
            b.n_ready = 0
            b.work = None


def ddp(model: nn.Module, *, bucket_mb: float = 25, first_bucket_mb: float = 1, group=None,
        grad_dtype: torch.dtype | None = None) -> DDP:
    """Wrap `model` for data parallel training: bucketed all-reduce overlapped with backward.

    Wrap after moving the model to its device. Buckets hold about `bucket_mb` MiB of gradients
    (the first `first_bucket_mb`), as torch DDP's bucket_cap_mb. `grad_dtype=torch.bfloat16` reduces
    in bf16 and writes the averages back into the fp32 gradients (half the bytes, ~3 significant digits).
    """
    return DDP(model, bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb, group=group, grad_dtype=grad_dtype)


def no_sync(model: nn.Module):
    """`with no_sync(model):` skip gradient communication (accumulation micro-steps) on a wrapped model."""
    if not isinstance(model, _DataParallel):
        raise TypeError(f"no_sync: {type(model).__name__} is not wrapped by gobrrr.parallel (ddp or NaiveDDP), so "
                        "there is no communication to skip; wrap it first with model = gobrrr.parallel.ddp(model).")
    return model.no_sync()
