"""The MLP's bias add and GELU as one op whose backward also sums the bias gradient: Megatron-LM's
bias-GELU fusion (Shoeybi et al. 2019, "Megatron-LM"), as Triton kernels.

    h = bias_gelu(x @ W.T, b)        # == F.gelu(F.linear(x, W, b)), the erf GELU (to 1.5e-7)

Why: in the 124m's compiled block the fc matmul writes its output with the bias added, inductor
saves that output and, in backward, one kernel recomputes GELU(pre) (proj's weight gradient needs
it) while it computes GELU's gradient, and a second kernel reads the same tensors again to sum
fc's bias gradient. Per layer at B = 64 that is four (B*T, 4C) bf16 passes in backward (400 MB
each) plus two more for the bias sum. Here (B*T rows, N = 4C columns):

  forward   read x (the matmul's output, no bias), add b, GELU in float32, write h in x's dtype;
            save x and b (h is saved by proj for its weight gradient, so it is never recomputed)
  backward  one pass over row tiles: read dh and x, write dx = dh * GELU'(x + b) and keep per-column
            float32 partial sums of dx in registers; each program writes its partial sums to a
            (P, N) buffer that is summed in a fixed order (no atomics: the same bits every run)
            -> db (N,) in b's dtype

Three (B*T, 4C) passes in backward instead of six. GELU'(z) = Phi(z) + z * phi(z) (standard normal
CDF and density). No host-device sync; capturable in a CUDA graph. Registered as custom ops
(`gobrrr::bias_gelu`, `gobrrr::bias_gelu_backward`), so torch.compile keeps them whole, never
recomputes them, and fuses nothing into them.

Measured on an H200 (torch 2.11; 65536 x 3072 bf16, the 124m's MLP at B = 64): forward 0.22 ms
(aten's F.gelu, without a bias, 0.26 ms; a copy of the same bytes 0.19 ms), backward with the bias
sum 0.32 ms. Two choices made that: the normal CDF by Abramowitz & Stegun's erf (`_normal_cdf_and_exp`;
with libdevice's erf the two took 0.29 and 0.42 ms: GELU at these sizes is as much arithmetic as
memory), and tiles that are the best of a sweep there (forward 8-32 rows x 128-512 columns, backward
32-128 x 32-128 at 4 or 8 warps and 264-4096 programs; folding db over the rows at every tile,
instead of once per program at the end, was 1.05-1.25x slower). In a B = 64 step with the bf16
residual stream the step took 120.4 ms against 123.4 ms with the MLP as written (four interleaved
rounds; BENCHMARKS.md, `train`).

The torch version (`_reference`, float32 math through aten's gelu and gelu_backward) runs where the
kernels cannot (no Triton, not a CUDA tensor) and is what the tests compare the kernels against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # Triton ships with torch's CUDA wheels; a CPU build has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

FWD_BM, FWD_BN = 16, 256  # forward row x column tile
BWD_BM, BWD_BN = 32, 128  # backward row x column tile
BWD_PROGRAMS = 2048       # about this many backward programs (column blocks x row groups)
NUM_WARPS = 8


def available(t: torch.Tensor) -> bool:
    """True when the Triton kernels can run on `t` (a CUDA tensor, Triton importable)."""
    return triton is not None and t.is_cuda


if triton is not None:
    @triton.jit
    def _normal_cdf_and_exp(z):
        """(Phi(z), exp(-z^2 / 2)): the standard normal CDF through erf(|z| / sqrt 2) by Abramowitz &
        Stegun 7.1.26 (Handbook of Mathematical Functions, 1964; |error| <= 1.5e-7, 1e5 times finer
        than bf16's spacing near 1), whose exponential is the density's: one exp2, one approximate
        reciprocal and five FMAs, where libdevice's erf costs about twenty instructions and branches.
        The tail is computed directly (Phi(-|z|) = erfc(|z| / sqrt 2) / 2), not as 1 - Phi(|z|)."""
        x = tl.abs(z) * 0.7071067811865476
        t = tl.fdiv(1.0, 1.0 + 0.3275911 * x)
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        e = tl.exp2(z * z * -0.7213475204444817)                        # exp(-z^2 / 2) = exp(-x^2)
        tail = 0.5 * poly * e                                            # Phi(-|z|)
        return tl.where(z >= 0, 1.0 - tail, tail), e

    @triton.jit
    def _bias_gelu_fwd_kernel(x_ptr, b_ptr, h_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        rows = tl.program_id(0) * BM + tl.arange(0, BM)                  # (BM,)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)                  # (BN,)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]             # (BM, BN)
        b = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        z = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) + b[None, :]
        cdf, _ = _normal_cdf_and_exp(z)
        tl.store(h_ptr + offs, (z * cdf).to(h_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _bias_gelu_bwd_kernel(g_ptr, x_ptr, b_ptr, dx_ptr, part_ptr, M, N, rows_per_program,
                              BM: tl.constexpr, BN: tl.constexpr):
        cols = tl.program_id(0) * BN + tl.arange(0, BN)                 # (BN,)
        cmask = cols < N
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        first = tl.program_id(1) * rows_per_program
        acc = tl.zeros([BM, BN], tl.float32)                             # this program's share of db,
        for r in range(0, rows_per_program, BM):                         # folded over rows at the end
            local = r + tl.arange(0, BM)                                 # (BM,)
            rows = first + local
            mask = ((rows < M) & (local < rows_per_program))[:, None] & cmask[None, :]  # (BM, BN)
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            z = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) + b[None, :]
            cdf, e = _normal_cdf_and_exp(z)
            d = g * (cdf + z * (0.3989422804014327 * e))                 # masked lanes: g = 0, so d = 0
            tl.store(dx_ptr + offs, d.to(dx_ptr.dtype.element_ty), mask=mask)
            acc += d
        tl.store(part_ptr + tl.program_id(1).to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cmask)


def _reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(x.float() + bias.float()).to(x.dtype)


def _reference_backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = torch.ops.aten.gelu_backward(grad.float(), x.float() + bias.float())  # (..., N) float32
    return d.to(x.dtype), d.reshape(-1, d.shape[-1]).sum(0).to(bias.dtype)


def _check(x: torch.Tensor, bias: torch.Tensor) -> None:
    if bias.dim() != 1 or x.shape[-1] != bias.shape[0]:
        raise ValueError(f"bias_gelu: expected x (..., N) and bias (N,), got {tuple(x.shape)} and {tuple(bias.shape)}")


@torch.library.custom_op("gobrrr::bias_gelu", mutates_args=())
def _bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    if not available(x):
        return _reference(x, bias)
    x = x.contiguous()
    h = torch.empty_like(x)
    N = x.shape[-1]
    M = x.numel() // N if N else 0
    if M:
        grid = (triton.cdiv(M, FWD_BM), triton.cdiv(N, FWD_BN))
        _bias_gelu_fwd_kernel[grid](x, bias.contiguous(), h, M, N, BM=FWD_BM, BN=FWD_BN, num_warps=NUM_WARPS)
    return h


@_bias_gelu.register_fake
def _(x, bias):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("gobrrr::bias_gelu_backward", mutates_args=())
def _bias_gelu_backward(grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not available(x):
        return _reference_backward(grad, x, bias)
    x, grad = x.contiguous(), grad.contiguous()
    N = x.shape[-1]
    M = x.numel() // N if N else 0
    dx = torch.empty_like(x)
    if M == 0:
        return dx, torch.zeros_like(bias)
    col_blocks = triton.cdiv(N, BWD_BN)
    groups = max(1, min(triton.cdiv(M, BWD_BM), BWD_PROGRAMS // col_blocks))
    rows_per_program = triton.cdiv(triton.cdiv(M, groups), BWD_BM) * BWD_BM
    groups = triton.cdiv(M, rows_per_program)
    part = torch.empty(groups, N, dtype=torch.float32, device=x.device)  # (P, N) partial sums of db
    _bias_gelu_bwd_kernel[(col_blocks, groups)](grad, x, bias.contiguous(), dx, part, M, N, rows_per_program,
                                                BM=BWD_BM, BN=BWD_BN, num_warps=NUM_WARPS)
    return dx, part.sum(0).to(bias.dtype)


@_bias_gelu_backward.register_fake
def _(grad, x, bias):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(bias)


def _setup_context(ctx, inputs, output):
    x, bias = inputs
    ctx.save_for_backward(x, bias)


def _backward(ctx, grad):
    x, bias = ctx.saved_tensors
    return _bias_gelu_backward(grad, x, bias)  # (dx, db)


_bias_gelu.register_autograd(_backward, setup_context=_setup_context)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """GELU(x + bias), the erf form (erf to within 1.5e-7 on a GPU), in x's dtype with float32 math inside.

    x: (..., N), e.g. a linear layer's output computed without its bias; bias: (N,). Differentiable
    in both; the bias gradient is summed inside GELU's backward pass (see the module docstring)."""
    _check(x, bias)
    return _bias_gelu(x, bias)
