"""The whole training step as one CUDA graph: the host issues one launch per step, not ~1,500.

A 124M GPT step at B = 8 (T = 1024) is ~20 ms of GPU work, and Python spends as long issuing its
kernels one by one (the compiled blocks' guards and wrappers, the loss chunks, autograd, the
optimizer): the GPU waits on the host, the "host-bound" row of `gobrrr bench train`. A CUDA graph
records the kernels of one step once and replays them with one call (NVIDIA, "CUDA Graphs", CUDA C
Programming Guide; PyTorch's `torch.cuda.graph`, the whole-network capture of its CUDA-graphs
note), so the step runs at the GPU's speed whatever the host costs.

    step = GraphedStep(lambda mb: train_step(model, opt, mb, ...), opt, device)
    out = step(micro_batches, lr)          # (2,) on the device: [mean loss, grad norm]

Phase by phase:
  1. Warm-up (the first `warmup` calls): real training steps, run eagerly on a side stream, which
     waits for the caller's stream first and is waited for after (events, no host sync). They
     compile, create the optimizer state and cuBLAS workspaces, and fill the allocator.
  2. The last warm-up call already runs as the capture will: static input buffers shaped as this
     step's micro-batches (the batches are copied in); each param group's learning rate becomes a
     0-d device tensor and the group `capturable` (the fused AdamW then reads lr and its step count
     on the device). So a recompile or a kernel's first-call autotuning that this configuration
     causes (seen inside `gobrrr train`) happens in an eager step, not while recording.
     Capture (the next call, once): one call of the step is recorded on the
     side stream into a private memory pool, in "relaxed" capture mode so that CUDA calls
     elsewhere (the Prefetcher's threads) go on meanwhile, with the garbage collector paused (a
     finalizer that synchronized an event in this thread would break the recording).
     # sync: the device is synchronized once, before recording. Nothing runs while recording.
     If the recording fails, the CUDA generator gets back its state and the step stays eager.
  3. Every step from then on: the micro-batches are copied into the static buffers and the learning
     rate written into its tensor (device-to-device copies and a fill, stream-ordered, no host read),
     then one `replay()`; the result is copied out of the graph's output buffer, which the next
     replay overwrites.

What a graph needs, and how this class keeps to it: no host-device sync in the step (capture fails
on one: `gobrrr lint` and the sync detective find them; here the step falls back to eager with a
one-line notice); fixed shapes (a micro-batch of another shape raises); tensors the graph reads
keep their addresses: parameters are written in place (load_state_dict copies into them), and
`optimizer.load_state_dict` replaces the optimizer's state tensors, so it drops the graph (recaptured
at the next call). `optimizer.state_dict()` reports the learning rate as a float and capturable as
before, so checkpoints read the same with graphs on or off.

Not with: several ranks (NCCL collectives can be captured, but gobrrr's ddp has not been tested
under capture on several GPUs yet), ZeRO and TP (their hooks start collectives the same way), and a
running `gobrrr doctor`, whose step boundaries are the optimizer's `step()` calls, which a replay
does not make. `graph_blocker` says which; `gobrrr train` then runs eagerly and prints why.
"""
from __future__ import annotations

import gc
import traceback
from typing import Any, Callable, Sequence

import torch

from gobrrr.train.layout import layout_of

Batch = tuple[torch.Tensor, torch.Tensor]


def graph_blocker(device: torch.device, *, world_size: int = 1, zero: int = 0, tp: int = 1) -> str | None:
    """Why this run cannot capture its step in a CUDA graph (one line), or None when it can; the layout's reason
    comes from gobrrr.train.layout's table."""
    if device.type != "cuda":
        return "CUDA graphs need a GPU"
    if world_size > 1:
        return "not with several ranks yet (ddp's NCCL collectives are untested under graph capture)"
    if (why := layout_of(tp, zero).cuda_graph) is not None:
        return why
    if profiler_recording():
        return ("not under a profiler such as gobrrr doctor (it finds steps by the optimizer's step() calls, "
                "which a replay does not make)")
    return None


def profiler_recording() -> bool:
    """Whether torch's profiler records this process now (gobrrr doctor records from the script's start)."""
    return bool(torch.autograd.profiler._is_profiler_enabled or torch._C._autograd._profiler_enabled())


class GraphedStep:
    """Calls `step(micro_batches)` eagerly `warmup` times, then captures it and replays it."""

    def __init__(self, step: Callable[[Sequence[Batch]], torch.Tensor], opt: torch.optim.Optimizer,
                 device: torch.device, *, warmup: int = 2):
        if device.type != "cuda":
            raise ValueError(f"GraphedStep: CUDA graphs need a CUDA device, got {device}")
        self.step, self.opt, self.device, self.warmup = step, opt, device, max(1, warmup)
        self.side = torch.cuda.Stream(device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_in: list[Batch] = []
        self.static_out: torch.Tensor | None = None
        self.lr_tensors: list[torch.Tensor] = []
        self.lr = 0.0
        self.calls = 0
        self.captures = 0
        self.replays = 0
        self.failed: str | None = None  # why capture failed: the step then stays eager for good
        self.failed_trace: str | None = None  # the whole traceback of that failure, for a bug report
        self.notice: str | None = None  # the same, once, for the caller to print (`pop_notice`)
        opt.register_state_dict_post_hook(self._plain_state_dict)
        opt.register_load_state_dict_post_hook(self._after_load)

    # -- the step
    def __call__(self, micro_batches: Sequence[Batch] | Any, lr: float) -> torch.Tensor:
        batches = list(micro_batches)
        self.lr = float(lr)
        if self.graph is None and self.failed is None and self.calls >= self.warmup - 1:
            if not self.static_in:
                self._prepare(batches)   # the last warm-up runs as the capture will
            elif self.calls >= self.warmup:
                self._capture()
        self.calls += 1
        if self.graph is None and not self.static_in:
            return self._eager(batches)
        self._feed(batches)
        if self.graph is None:
            return self._eager(self.static_in)
        self.replays += 1
        self.graph.replay()
        return self.static_out.clone()  # the next replay overwrites the graph's output buffer

    def _feed(self, batches: list[Batch]) -> None:
        """Copy this step's micro-batches into the static buffers and its lr into the lr tensors."""
        if len(batches) != len(self.static_in):
            raise ValueError(f"GraphedStep: {len(batches)} micro-batches, the graph was captured with "
                             f"{len(self.static_in)}; keep --grad-accum fixed within a run")
        for (sx, sy), (x, y) in zip(self.static_in, batches):
            if x.shape != sx.shape or y.shape != sy.shape:
                raise ValueError(f"GraphedStep: micro-batch of shape {tuple(x.shape)}, the graph was captured "
                                 f"with {tuple(sx.shape)}; CUDA graphs replay fixed shapes")
            sx.copy_(x, non_blocking=True)
            sy.copy_(y, non_blocking=True)
        for t in self.lr_tensors:
            t.fill_(self.lr)

    def pop_notice(self) -> str | None:
        """A line to print once (capture failed, the step goes on eagerly), or None."""
        notice, self.notice = self.notice, None
        return notice

    def _eager(self, batches: list[Batch]) -> torch.Tensor:
        if not self.lr_tensors:  # (else _feed has written the lr into the groups' tensors)
            for group in self.opt.param_groups:
                group["lr"] = self.lr
        caller = torch.cuda.current_stream(self.device)
        self.side.wait_stream(caller)  # the batches were made ready on the caller's stream
        with torch.cuda.stream(self.side):
            out = self.step(batches)
        caller.wait_stream(self.side)  # the caller's next work sees this step's results (no host sync)
        for x, y in batches:
            x.record_stream(self.side)
            y.record_stream(self.side)
        out.record_stream(caller)
        return out

    # -- phase 2: the last warm-up step in the capture's configuration, then capture once
    def _prepare(self, batches: list[Batch]) -> None:
        """Static input buffers and device learning rates, before the last warm-up step: that step then
        runs on exactly what the capture records (the same tensors, the optimizer capturable), so any
        compile, recompile or first-call autotuning they cause happens there, not while recording."""
        self.static_in = [(torch.empty_like(x), torch.empty_like(y)) for x, y in batches]
        self.lr_tensors = []
        for group in self.opt.param_groups:
            group["lr"] = torch.tensor(self.lr, dtype=torch.float32, device=self.device)
            group["capturable"] = True
            self.lr_tensors.append(group["lr"])

    def _capture(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(self.device)  # sync: once per capture, as torch.cuda.graph does: nothing in flight
        torch.cuda.empty_cache()  # the warm-up's cached blocks go back, so the graph's pool can grow
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        rng = torch.cuda.default_generators[index]
        rng_before = rng.clone_state()
        graph = torch.cuda.CUDAGraph()
        gc.collect()  # no finalizer (of a pinned buffer, an event) may run in this thread while it records
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.stream(self.side):  # left whatever happens: the caller's stream is current again
                # "relaxed": CUDA calls that do not touch the recording stream (the Prefetcher's threads,
                # the NCCL watchdog's event queries) go on; a host sync inside the step still fails it
                graph.capture_begin(capture_error_mode="relaxed")
                try:
                    out = self.step(self.static_in)   # recorded, not run: _feed fills static_in first
                finally:
                    graph.capture_end()
        except Exception as e:  # e.g. a host sync inside the step: say so once, stay eager
            # a capture that ends in an error leaves the CUDA generator marked as capturing, and every
            # later random op outside a graph would fail: give it back its state from before
            rng.graphsafe_set_state(rng_before)
            first = e.__context__ or e  # capture_end's "previous error" hides the one that broke the capture
            self.failed = f"{type(first).__name__}: {(str(first).splitlines() or [''])[0][:160]}"
            self.failed_trace = "".join(traceback.format_exception(e))
            self.notice = f"notice: the step runs without a CUDA graph: capture failed: {self.failed}"
            self._uncapture()
            return
        finally:
            if gc_was_on:
                gc.enable()
        self.graph, self.static_out = graph, out
        self.captures += 1

    def _uncapture(self) -> None:
        self.graph, self.static_out, self.static_in = None, None, []
        for group in self.opt.param_groups:
            group["lr"] = self.lr
            group["capturable"] = False
        self.lr_tensors = []
        self.opt.zero_grad(set_to_none=True)  # gradients made during a failed capture are not real

    # -- checkpoints read the same with graphs on or off
    def _plain_state_dict(self, opt, state: dict) -> dict:
        for group in state["param_groups"]:
            if isinstance(group.get("lr"), torch.Tensor):
                group["lr"] = self.lr
                group["capturable"] = False
        return state

    def _after_load(self, opt) -> None:
        if self.static_in:  # the optimizer's state tensors were replaced: warm up once more, record again
            self._uncapture()
            self.calls = self.warmup - 1
