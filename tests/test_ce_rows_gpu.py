"""The Triton loss pass (gobrrr.ops.ce_rows) against the plain torch pass it replaces on a GPU:
the same loss and gradient at vocabularies that are and are not a multiple of its slice, with ignored
rows, extreme logits and float32 logits, and replayed from a CUDA graph inside the chunked head
(tests/test_train_gpu.py checks that head against F.cross_entropy with each pass)."""
from __future__ import annotations

import pytest
import torch

from gobrrr.ops import ChunkedCrossEntropy, ce_rows
from gobrrr.ops.linear_ce import _chunk_loss_and_grad

pytestmark = pytest.mark.gpu


def _case(n, V, dtype, spread=3.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(n, V, device="cuda", generator=g) * spread).to(dtype)  # (n, V)
    t = torch.randint(V, (n,), device="cuda", generator=g)                      # (n,)
    t[::7] = -100
    scale = 1.0 / (t != -100).sum().float()
    return logits, t, scale


@pytest.mark.parametrize("V", [50304, 4096, 4097, 1000, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ce_rows_equals_the_torch_pass(V, dtype):
    logits, t, scale = _case(300, V, dtype)
    ref_loss, ref_grad = _chunk_loss_and_grad(logits, t, scale, -100)
    work = logits.clone()
    loss, grad = ce_rows.ce_rows(work, t, scale, -100)
    assert grad.data_ptr() == work.data_ptr()  # written over the logits
    assert grad.dtype == dtype
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-6)
    assert torch.all(grad[::7] == 0)  # ignored rows get no gradient


def test_ce_rows_keeps_its_range_at_extreme_logits():
    logits, t, scale = _case(64, 50304, torch.float32, spread=1.0)
    logits[0] += 3e4          # a row far above zero
    logits[1] -= 3e4          # and far below
    logits[2, :] = 5.0        # a flat row
    logits[3, 17] = 1e4       # one logit dominates
    ref_loss, ref_grad = _chunk_loss_and_grad(logits, t, scale, -100)
    loss, grad = ce_rows.ce_rows(logits.clone(), t, scale, -100)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)


def test_the_triton_head_replays_from_a_cuda_graph():
    torch.manual_seed(0)
    N, C, V = 2048, 64, 5000
    x = torch.randn(N, C, device="cuda", requires_grad=True)
    w = (torch.randn(V, C, device="cuda") * 0.02).requires_grad_()
    t = torch.randint(V, (N,), device="cuda")
    loss_fn = ChunkedCrossEntropy(chunk_rows=700, kernel="triton")

    def step():
        x.grad = w.grad = None
        loss = loss_fn(x, w, t)
        loss.backward()
        return loss.detach()

    before = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm on a side stream, as capture wants
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    t.copy_(torch.randint(V, (N,), device="cuda"))  # new targets into the captured buffer
    graph.replay()
    got = (out.clone(), x.grad.clone(), w.grad.clone())  # the replay's loss and gradients
    assert not torch.equal(got[0], before)
    x.grad = w.grad = None
    ref = ChunkedCrossEntropy(chunk_rows=700, kernel="torch")(x, w, t)
    ref.backward()
    torch.testing.assert_close(got[0], ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[2], w.grad, rtol=1e-5, atol=1e-6)
