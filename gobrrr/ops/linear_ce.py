"""The output head and its cross-entropy, chunked over rows: no (N, V) logits are ever held whole.

    loss = linear_cross_entropy(x, head.weight, targets)   # == F.cross_entropy(x @ W.T, targets)

The plain path, `F.cross_entropy(lm_head(x), targets)` under bf16 autocast, keeps the (N, V) bf16
logits alive from forward to backward and upcasts them to float32 for the softmax: for the 124m
GPT at B = 16, T = 1024 (N = 16384 rows, V = 50304) that is 1.6 GB of logits, 3.3 GB of float32
softmax, and the same again for their gradient. Here, as in Liger-Kernel's fused linear
cross-entropy (Hsu et al. 2024, "Liger Kernel: Efficient Triton Kernels for LLM Training") and
Wijmans et al. 2024 ("Cut Your Losses in Large-Vocabulary Language Models"), the gradient is
computed during the forward pass, one chunk of rows at a time:

  forward, for each chunk c of rows (sizes equal to within one row, at most CHUNK_ELEMENTS logits):
    1. logits_c = x_c @ W.T                              (n, V) in the compute dtype (bf16 under autocast)
    2. one pass over the chunk: float32 logsumexp, the loss of the chunk, and
       d loss / d logits_c = (softmax - onehot) / n_valid in the compute dtype. On a GPU the Triton
       kernel `gobrrr.ops.ce_rows` writes it over logits_c in place; elsewhere (and as the reference)
       the torch pass `_chunk_loss_and_grad`, torch.compile'd when asked
    3. grad_x_c = dlogits_c @ W                          (n, C)
       grad_W  += dlogits_c.T @ x_c                      (V, C), one addmm: float32 inside the matmul,
                                                         rounded to the compute dtype once per chunk
    logits_c and dlogits_c are freed before the next chunk.
  backward: scale the saved grad_x and grad_W by the incoming gradient (e.g. 1/K under accumulation).

The matmul FLOPs are those of the plain path (one forward, two backward matmuls); the memory is
one chunk of logits instead of all of them. No host-device sync: the count of valid targets stays
a device tensor. Targets equal to `ignore_index` (-100, as in F.cross_entropy) count for nothing.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from gobrrr.ops import ce_rows

CHUNK_ELEMENTS = 2**29  # logits per chunk: 1 GiB in bf16 (10.7k rows of a 50k vocabulary: B=16, T=1024 in 2)


def _chunk_loss_and_grad(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor,
                         ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the chunk's losses in float32, d loss / d logits in logits' dtype); logits (n, V)."""
    lf = logits.float()                                                   # (n, V) float32
    lse = torch.logsumexp(lf, dim=-1)                                     # (n,)
    valid = targets != ignore_index                                       # (n,)
    safe = torch.where(valid, targets, torch.zeros_like(targets))         # (n,)
    picked = lf.gather(1, safe[:, None]).squeeze(1)                       # (n,)
    loss_sum = torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
    onehot = torch.arange(lf.shape[1], device=lf.device)[None, :] == safe[:, None]  # (n, V)
    weight = valid.to(lf.dtype) * scale                                  # (n,)
    grad = (torch.exp(lf - lse[:, None]) - onehot.to(lf.dtype)) * weight[:, None]  # (n, V)
    return loss_sum, grad.to(logits.dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int,
                ignore_index: int, kernel: Callable) -> torch.Tensor:
        N = x.shape[0]
        n_valid = (targets != ignore_index).sum().clamp(min=1)  # device tensor: no sync
        scale = 1.0 / n_valid.float()
        grad_x = torch.empty_like(x)       # (N, C)
        grad_w = torch.empty_like(weight)  # (V, C), in the matmul dtype, as the plain head's gradient is
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        for i, (s, e) in enumerate(chunk_bounds(N, chunk_rows)):
            x_c = x[s:e]                                                  # (n, C)
            logits = x_c @ weight.T                                       # (n, V)
            loss_c, dlogits = kernel(logits, targets[s:e], scale, ignore_index)
            del logits
            torch.mm(dlogits, weight, out=grad_x[s:e])                    # (n, C), rows are contiguous
            if i == 0:
                torch.mm(dlogits.T, x_c, out=grad_w)                      # (V, C)
            else:  # the matmul accumulates in float32 and rounds once per chunk
                grad_w.addmm_(dlogits.T, x_c)
            loss += loss_c
        ctx.save_for_backward(grad_x, grad_w)
        return loss * scale

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        return grad_x * grad_out.to(grad_x.dtype), grad_w * grad_out.to(grad_w.dtype), None, None, None, None


def chunk_bounds(n: int, chunk_rows: int) -> list[tuple[int, int]]:
    """[(start, end)] covering range(n) in ceil(n / chunk_rows) pieces whose sizes differ by at most 1
    (so a compiled kernel sees at most two shapes)."""
    k = max(1, math.ceil(n / max(1, chunk_rows)))
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    bounds, s = [], 0
    for size in sizes:
        bounds.append((s, s + size))
        s += size
    return bounds


@torch.compiler.disable  # inside a whole-model torch.compile this head runs eagerly; its kernel is compiled apart
def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         chunk_rows: int | None = None, ignore_index: int = -100,
                         kernel: Callable = _chunk_loss_and_grad) -> torch.Tensor:
    """Mean cross-entropy of `x @ weight.T` against `targets`, never holding all the logits.

    x: (N, C) float; weight: (V, C); targets: (N,) int64. Under autocast the matmuls run in the
    autocast dtype (x and weight are cast, differentiably, first); the softmax is float32.
    `kernel(logits, targets, scale, ignore_index) -> (loss sum, dlogits)`: the per-chunk pass, e.g.
    `torch.compile(_chunk_loss_and_grad)` or the Triton `gobrrr.ops.ce_rows.ce_rows` (which writes dlogits
    over the logits; see ChunkedCrossEntropy).
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or targets.shape != x.shape[:1]:
        raise ValueError(f"linear_cross_entropy: expected x (N, C), weight (V, C), targets (N,); got "
                         f"{tuple(x.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}; flatten (B, T) first")
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        x, weight = x.to(dtype), weight.to(dtype)
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
    with torch.autocast(kind, enabled=False):
        return _LinearCrossEntropy.apply(x, weight, targets, chunk_rows, ignore_index, kernel)


class ChunkedCrossEntropy:
    """`loss_fn(x, weight, targets)`: linear_cross_entropy with its per-chunk kernel chosen.

    kernel: "auto" (the default: the Triton kernel `gobrrr.ops.ce_rows` on a CUDA tensor when Triton is
    installed, else the torch pass), "triton" (the same, but an error where it cannot run) or "torch"
    (`_chunk_loss_and_grad`, the plain version, always).
    compile: for the torch pass, False (eager), True (torch.compile with inductor) or a backend name.
    Set on a GPT as `model.fused_loss = ChunkedCrossEntropy(compile=True)`.
    """

    def __init__(self, compile: bool | str = False, chunk_rows: int | None = None, kernel: str = "auto"):
        if kernel not in ("auto", "triton", "torch"):
            raise ValueError(f"ChunkedCrossEntropy: kernel {kernel!r} is not 'auto', 'triton' or 'torch'")
        self.chunk_rows = chunk_rows
        self.kernel_choice = kernel
        self.kernel = _chunk_loss_and_grad
        if compile:
            backend = "inductor" if compile is True else compile
            self.kernel = torch.compile(_chunk_loss_and_grad, backend=backend)

    def kernel_for(self, x: torch.Tensor) -> Callable:
        """The per-chunk pass this loss runs for inputs like `x`."""
        if self.kernel_choice != "torch" and ce_rows.available(x):
            return ce_rows.ce_rows
        if self.kernel_choice == "triton":
            raise RuntimeError("ChunkedCrossEntropy(kernel='triton') needs Triton and CUDA tensors; "
                               "use kernel='auto' to fall back to the torch pass")
        return self.kernel

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(x, weight, targets, chunk_rows=self.chunk_rows, kernel=self.kernel_for(x))
