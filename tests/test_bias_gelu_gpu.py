"""The bias-GELU kernels (gobrrr.ops.bias_gelu) on a GPU: forward and backward against the float32
torch version and against F.gelu(F.linear(...)) under autocast, at widths that are and are not a
multiple of the kernels' tiles; inside a compiled GPT block; replayed from a CUDA graph."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from gobrrr.ops import bias_gelu as bg

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("M,N", [(4096, 3072), (1000, 300), (3, 5), (0, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernels_equal_the_torch_version(M, N, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(M, N, device="cuda", generator=g) * 3).to(dtype)
    b = torch.randn(N, device="cuda", generator=g)
    dh = torch.randn(M, N, device="cuda", generator=g).to(dtype)
    h = bg._bias_gelu(x, b)
    dx, db = bg._bias_gelu_backward(dh, x, b)
    rdx, rdb = bg._reference_backward(dh, x, b)
    tol = dict(rtol=1.6e-2, atol=1e-5) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    assert h.dtype == dx.dtype == dtype and db.dtype == b.dtype
    torch.testing.assert_close(h, bg._reference(x, b), **tol)
    torch.testing.assert_close(dx, rdx, **tol)
    torch.testing.assert_close(db, rdb, rtol=1e-4, atol=1e-3)  # float32 sums in another order


def test_the_fused_mlp_matches_linear_then_gelu_under_autocast():
    torch.manual_seed(0)
    fc = torch.nn.Linear(256, 1024, device="cuda")
    x = torch.randn(8, 128, 256, device="cuda", requires_grad=True)
    dh = torch.randn(8, 128, 1024, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = F.gelu(fc(x))
        out = bg.bias_gelu(F.linear(x, fc.weight), fc.bias)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=2e-3)
    grads_ref = torch.autograd.grad(ref, [x, fc.weight, fc.bias], dh)
    grads = torch.autograd.grad(out, [x, fc.weight, fc.bias], dh)
    for got, want, name in zip(grads, grads_ref, ("x", "weight", "bias")):
        assert got.dtype == want.dtype, name
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item(), msg=name)


def test_a_compiled_block_with_the_fused_mlp_replays_from_a_cuda_graph():
    from gobrrr.models.gpt import Block, GPTConfig
    from gobrrr.train.step import fuse_bias_gelu

    torch.manual_seed(0)
    ref = Block(GPTConfig(n_embd=128, n_head=2, block_size=64)).cuda()
    blk = copy.deepcopy(ref)
    holder = torch.nn.Module()
    holder.blk = blk
    assert fuse_bias_gelu(holder) == 1
    blk.compile()
    x = torch.randn(4, 64, 128, device="cuda", requires_grad=True)

    def run(m):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        y.float().square().mean().backward()

    for _ in range(3):  # compile and warm up on a side stream, as graph capture asks
        run(blk)
    graph = torch.cuda.CUDAGraph()
    for p in blk.parameters():
        p.grad = None
    x.grad = None
    with torch.cuda.graph(graph):
        run(blk)
    x.data.copy_(torch.randn_like(x))
    for p in blk.parameters():
        p.grad.zero_()
    x.grad.zero_()
    graph.replay()
    got = [x.grad.clone()] + [p.grad.clone() for p in blk.parameters()]
    x.grad = None
    run(ref)
    want = [x.grad] + [p.grad for p in ref.parameters()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=3e-2, atol=3e-2 * w.abs().max().item())
