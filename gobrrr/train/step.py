"""One optimizer step of `gobrrr train`, and how the model is prepared (loss path, torch.compile).

`gobrrr train` and `gobrrr bench train` both call `train_step`, so the benchmark measures the
step users run, not a copy of it.

    notice = prepare_model(raw, device, compile=True)          # before wrapping it (ddp, ...)
    model = ddp(raw)
    out = train_step(model, opt, micro_batches, params=list(raw.parameters()), grad_clip=1.0,
                     autocast=autocast_for(device))           # (2,): mean loss, grad norm, on device

The step, phase by phase (K = number of micro-batches):
  1. micro-batches 0..K-2: forward + backward inside `model.no_sync()`: gradients accumulate
     locally, no communication;
  2. micro-batch K-1: forward + backward; a data-parallel wrapper reduces gradients bucket by
     bucket from its post-accumulate-grad hooks, # overlap: with the rest of this backward;
  3. clip the global gradient norm (one fused norm, no host read), fused AdamW step, grads to None;
  4. return [mean loss, grad norm] stacked on the device: no `# sync:` anywhere in the step.

How the model is compiled (`prepare_model`; `setup_model` picks the scope by world size), and why:
  * At world size 1: one whole-model graph (scope "model"): the embeddings, all blocks and the final
    LayerNorm in one inductor graph (the chunked head and loss stay outside it, eager around their
    own kernel). Inductor then fuses across block boundaries what per-block graphs cannot: each
    block's closing residual add with the next block's first LayerNorm, forward and backward, and
    the embedding's backward (a scatter-add) with the first block's. On an H200 (124m, bf16
    residual) the step took 116.5 ms against 118.3 ms per block at B = 64, and 452.5 ms (MFU
    50.1%) against 457.3 ms at B = 256 (BENCHMARKS.md, `train`). Nothing is lost: with one rank
    there is no gradient communication for the backward to overlap. It compiles in 12-30 s
    instead of 2-11 s (H200, cold caches), reported on its own line.
  * Past one rank: regional compilation: each transformer block is compiled in place
    (`nn.Module.compile`), as torchtitan does. The blocks share one code object, so dynamo traces
    and inductor compiles one block graph that all twelve reuse; module
    names, parameters and state_dict keys are unchanged (no `_orig_mod.` prefix), so ddp, the
    checkpoint and resume see the same model compiled or not.
  * Gradient hooks keep their overlap: each compiled block's backward is one autograd node, so
    the parameters of block i receive their gradients (and ddp's post-accumulate-grad hooks fire)
    when block i's backward ends, while blocks i-1..0 still run. A whole-model graph would
    deliver every gradient at the very end and leave nothing to overlap. ddp's end-of-backward
    engine callback is queued from such a hook, outside any compiled code.
  * The head and loss run through `gobrrr.ops.ChunkedCrossEntropy` (no (B, T, V) logits held);
    its per-chunk softmax/gradient pass is one Triton kernel on a GPU (`gobrrr.ops.ce_rows`).
  * Each MLP's fc bias add and GELU run as `gobrrr.ops.bias_gelu` (custom ops with Triton kernels,
    kept whole inside the compiled block), whose backward sums fc's bias gradient in the same pass
    (`fuse_bias_gelu`; when compiling on a GPU). At B = 64 on an H200 the step took 120.4 ms with
    it against 123.4 ms without (BENCHMARKS.md, `train`).
  * `--bf16-residual` (`bf16_residual`): the stream between blocks in bf16 instead of float32.
  * Per block, the final LayerNorm is compiled on its own too (eagerly it is separate forward,
    input-gradient, weight-gradient and cast kernels); the embedding lookups are not compiled.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import types
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from gobrrr.ops import ChunkedCrossEntropy, bias_gelu
from gobrrr.train.layout import LAYOUTS


def compile_blocker(device: torch.device, cfg: Any = None) -> str | None:
    """Why torch.compile cannot be used for this run (a one-line reason), or None when it can: the layout's
    (gobrrr.train.layout's table, from cfg.tp and cfg.zero), then the toolchain's."""
    if cfg is not None:
        row = LAYOUTS.get(((getattr(cfg, "tp", 1) or 1) > 1, getattr(cfg, "zero", 0) or 0))
        if row is not None and row.compile is not None:
            return row.compile
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile needs triton for a GPU and it is not installed"
    if device.type == "cpu" and not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        return "torch.compile on a CPU needs a C++ compiler (c++, g++ or clang++) on PATH"
    return None


def compile_options(tune: bool) -> dict[str, Any] | None:
    """Inductor options for a compiled block: with `tune`, coordinate-descent tuning of the generated
    kernels' block sizes and warps (inductor's `coordinate_descent_tuning`): each LayerNorm, GELU and
    residual kernel is timed at neighbouring configurations once, at compile time (about a minute
    for the 124m's block on 16 cores, cached by inductor across runs), instead of taking the
    heuristic's first guess."""
    return {"coordinate_descent_tuning": True} if tune else None


def _bias_gelu_mlp_forward(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """GPT's MLP with fc's bias folded into the GELU (`gobrrr.ops.bias_gelu`): the same function and
    parameters, fewer passes over the (B, T, 4C) activations in backward."""
    if type(mlp.fc) is not nn.Linear:  # a parallel wrapper (tensor parallelism) took fc's place: its own forward
        return type(mlp).forward(mlp, x)
    pre = F.linear(x, mlp.fc.weight)                          # (B, T, 4C), without the bias
    return mlp.drop(mlp.proj(bias_gelu.bias_gelu(pre, mlp.fc.bias)))  # (B, T, C)


def fuse_bias_gelu(raw: nn.Module, on: bool = True) -> int:
    """Route (on) or stop routing (off) every GPT MLP's fc bias + GELU through `gobrrr.ops.bias_gelu`,
    by setting the MLP instances' forward; names, parameters and state_dict do not change, and fc's
    own forward (with any hook on it) is no longer called while it is on. Returns how many MLPs now
    use it."""
    from gobrrr.models.gpt import MLP

    n = 0
    for m in raw.modules():
        if not isinstance(m, MLP):
            continue
        m.__dict__.pop("forward", None)
        if on and m.fc.bias is not None:
            m.forward = types.MethodType(_bias_gelu_mlp_forward, m)
            n += 1
    return n


def _to_compute_dtype(module: nn.Module, args: tuple) -> tuple | None:
    x = args[0]
    if torch.is_autocast_enabled(x.device.type):
        return (x.to(torch.get_autocast_dtype(x.device.type)), *args[1:])
    return None


def bf16_residual(raw: nn.Module, on: bool = True) -> None:
    """Carry the residual stream in the autocast dtype (on) or in float32 (off, autocast's default).

    Under autocast the embeddings are float32 and every `x = x + f(x)` stays float32, so each
    LayerNorm and residual add reads and writes 4-byte activations although every matmul reads
    bf16. With `on`, the first block's input is cast to the autocast dtype (a forward pre-hook), so
    the stream between blocks is bf16; LayerNorm still computes in float32 (autocast runs it so), and
    parameters, gradients and the optimizer stay float32. This is the stream Megatron-LM keeps unless
    `--fp32-residual-connection`, and the one FSDP2's bf16 `MixedPrecisionPolicy` gives: less precise
    sums of the residual branches, fewer bytes. Without autocast (a CPU run here) it does nothing."""
    first = raw.blocks[0]
    for key, hook in list(first._forward_pre_hooks.items()):
        if hook is _to_compute_dtype:
            del first._forward_pre_hooks[key]
    if on:
        first.register_forward_pre_hook(_to_compute_dtype)


def prepare_model(raw: nn.Module, *, compile: bool, backend: str = "inductor", mode: str | None = None,
                  scope: str = "blocks", chunked_loss: bool = True, tune: bool = False,
                  fused_mlp: bool | None = None, residual_bf16: bool = False) -> str:
    """Set the loss path, the MLP's bias-GELU and the residual stream's dtype, and compile `raw` (a
    GPT) in place; return a one-line description.

    scope: "blocks" (each transformer block, the default: right for any wrapper) or "model" (one
    whole-model graph; the chunked head and loss run eagerly outside it, around their own kernel);
    `compile_scope` picks one by world size, and the module docstring says why.
    tune: inductor's coordinate-descent kernel tuning (`compile_options`); not with `mode`.
    fused_mlp: route each MLP's fc bias + GELU through `gobrrr.ops.bias_gelu` (`fuse_bias_gelu`);
    None (the default) does so when compiling and its Triton kernels can run on the model's device.
    residual_bf16: carry the stream between blocks in the autocast dtype (`bf16_residual`).
    Call before wrapping the model (ddp, ...) and before the first forward; calling it again
    replaces the earlier choices.
    """
    if scope not in ("blocks", "model"):
        raise ValueError(f"compile scope {scope!r} is not 'blocks' or 'model'")
    if tune and mode:
        raise ValueError(f"compile tuning and mode {mode!r} cannot be combined; torch.compile takes one or the other")
    raw.fused_loss = ChunkedCrossEntropy(compile=backend if compile else False) if chunked_loss else None
    if fused_mlp is None:
        fused_mlp = compile and bias_gelu.available(next(raw.parameters()))
    fused = fuse_bias_gelu(raw, fused_mlp) > 0
    bf16_residual(raw, residual_bf16)
    what = ["chunked cross-entropy" if chunked_loss else "lm_head + F.cross_entropy"]
    what += ["bias-GELU kernels"] if fused else []
    what += ["bf16 residual stream"] if residual_bf16 else []
    if not compile:
        return "eager (not compiled), " + ", ".join(what)
    options = compile_options(tune) if backend == "inductor" else None
    if scope == "blocks":
        for block in raw.blocks:
            block.compile(backend=backend, mode=mode, options=options)
        raw.ln_f.compile(backend=backend, mode=mode, options=options)  # its casts fused with it
    else:
        raw.compile(backend=backend, mode=mode, options=options)
    how = f"torch.compile {'per block' if scope == 'blocks' else 'as one whole-model graph'}, backend {backend}"
    how += (f", mode {mode}" if mode else "") + (", tuned kernels" if options else "")
    return how + ", " + ", ".join(what)


class ComputeContext:
    """The context forward and backward run in; reusable (entered once per micro-step).

    On a GPU: bf16 autocast, and, when asked (`cudnn_attention=True`, or GOBRRR_CUDNN_ATTENTION=1
    on a Hopper GPU), SDPA's cuDNN attention put first in SDPA's priority order. It is a
    preference, not a restriction: a shape cuDNN cannot serve falls back to flash. Off by default
    because it changes nothing on torch 2.11: there SDPA already picks cuDNN for the compiled
    blocks on an H200 (the kernel tables name `cudnn_generated_..._sdpa_sm90_flash_bprop_...`), and
    cuDNN is the fastest backend it has at the 124m's shapes (B = 64, T = 1024, head size 64, fwd
    + bwd per layer: cuDNN 1.53 ms, FlashAttention-2 2.05 ms, memory-efficient 3.95 ms;
    BENCHMARKS.md, `train`). On older torch versions, whose order puts flash first, it can matter.
    The backward runs the kernel chosen in forward; a compiled block bakes in the kernel chosen
    while it was traced, which happens inside this context. On a CPU: nothing (the tests'
    bitwise resume relies on float32 there).
    """

    def __init__(self, device: torch.device, cudnn_attention: bool | None = None):
        self.device = device
        if cudnn_attention is None:  # opt-in until measured: GOBRRR_CUDNN_ATTENTION=1
            cudnn_attention = (device.type == "cuda" and os.environ.get("GOBRRR_CUDNN_ATTENTION", "0") == "1"
                               and torch.cuda.get_device_capability(device)[0] == 9)
        self.cudnn_attention = cudnn_attention
        self._stack: list[contextlib.ExitStack] = []

    def __enter__(self):
        stack = contextlib.ExitStack()
        if self.device.type == "cuda":
            stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
            if self.cudnn_attention:
                from torch.nn.attention import SDPBackend, sdpa_kernel

                order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                         SDPBackend.MATH]
                stack.enter_context(sdpa_kernel(order, set_priority=True))
        self._stack.append(stack)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.pop().close()


def autocast_for(device: torch.device, cudnn_attention: bool | None = None) -> ComputeContext:
    """The compute context for `device` (see ComputeContext)."""
    return ComputeContext(device, cudnn_attention)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
               *, accum: int, params: list[torch.Tensor], grad_clip: float, autocast, clip=None) -> torch.Tensor:
    """One optimizer step over `accum` micro-batches of (x, y), each (B, T) int64 on the device.

    `model` may be a data-parallel wrapper (it then has `no_sync()`); `params` are the parameters
    whose gradient norm is clipped (0 = no clipping); `clip(params, max_norm) -> norm` replaces
    torch.nn.utils.clip_grad_norm_ (tensor parallelism sums the shards' squares over tp ranks).
    The learning rate is the caller's to set.
    Returns a (2,) float32 tensor on the device: [mean loss over micro-batches, gradient norm].
    """
    device = params[0].device
    no_sync = getattr(model, "no_sync", None)
    loss_sum = torch.zeros((), device=device)
    batches = iter(micro_batches)
    for k in range(accum):
        x, y = next(batches)  # (B, T) each
        skip = no_sync() if (no_sync is not None and k < accum - 1) else contextlib.nullcontext()
        with skip:
            with autocast:
                _, loss = model(x, y)
            (loss / accum).backward()
        loss_sum += loss.detach()
    if grad_clip > 0 and hasattr(opt, "clip_grad_norm_"):  # ZeRO: the global norm over every rank's shards
        norm = opt.clip_grad_norm_(grad_clip)
    elif grad_clip > 0:
        norm = (clip or torch.nn.utils.clip_grad_norm_)(params, grad_clip)  # foreach kernels on a GPU
    else:
        norm = torch.zeros((), device=device)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return torch.stack([loss_sum / accum, norm.float()])


def compile_scope(world_size: int) -> str:
    """The compile scope for `world_size` ranks: one whole-model graph ("model") for a single rank;
    past one, per-block graphs ("blocks"), whose gradients arrive block by block so that ddp and ZeRO
    overlap their communication with the rest of backward. The module docstring gives the figures."""
    return "model" if world_size == 1 else "blocks"


def setup_model(raw: nn.Module, cfg: Any, device: torch.device, seq_len: int,
                world_size: int = 1) -> tuple[int, bool, list[str]]:
    """Before wrapping `raw`: pick the batch size (cfg.batch_size, or probed on a GPU, 8 on a CPU),
    decide on torch.compile (cfg.compile, default: on for a GPU) and prepare the model, compiled as
    `compile_scope(world_size)` says.

    Returns (batch size, compiled?, lines to print on rank 0). Where the run asked for compile (or
    defaulted to it) but `compile_blocker` names a reason, the model runs eagerly and one line says why.
    """
    from gobrrr.train.auto_batch import auto_batch_size

    lines = []
    prepare_model(raw, compile=False)  # the eager model with the chunked loss: what the probe measures
    batch = cfg.batch_size
    if batch is None and device.type == "cuda":
        batch, line = auto_batch_size(raw, device, seq_len)
        lines.append(line)
    elif batch is None:
        batch = 8
    want = cfg.compile if cfg.compile is not None else device.type == "cuda"
    why = compile_blocker(device, cfg) if want else None
    if why:
        lines.append(f"notice: running without torch.compile: {why}")
    on = want and why is None
    res16 = getattr(cfg, "bf16_residual", False)
    if res16 and device.type != "cuda":
        lines.append("notice: --bf16-residual changes nothing here: a CPU run has no bf16 autocast")
    lines.append("model: " + prepare_model(raw, compile=on, backend=getattr(cfg, "compile_backend", "inductor"),
                                           scope=compile_scope(world_size),
                                           residual_bf16=res16 and device.type == "cuda"))
    return batch, on, lines
