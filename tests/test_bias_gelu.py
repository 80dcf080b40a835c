"""The bias-GELU op (gobrrr.ops.bias_gelu) on a CPU: its torch version against autograd through
F.gelu(F.linear(...)), the GPT with its MLPs routed through it (eager and torch.compile'd, the same
loss, gradients and state_dict keys), switching the routing off again, the bf16 residual stream, and
the Triton kernels' arithmetic through Triton's interpreter (tests/test_bias_gelu_gpu.py runs them
compiled on a GPU)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.ops import bias_gelu as bg
from gobrrr.train.step import bf16_residual, compile_blocker, fuse_bias_gelu
from tests.test_ce_rows_interp import MISSING, run_interpreted


def test_the_op_and_its_gradients_equal_linear_then_gelu():
    torch.manual_seed(0)
    x = torch.randn(5, 7, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(24, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(24, dtype=torch.float64, requires_grad=True)
    dh = torch.randn(5, 7, 24, dtype=torch.float64)
    want = F.gelu(F.linear(x, w, b))
    got = bg.bias_gelu(F.linear(x, w), b)
    torch.testing.assert_close(got.to(want.dtype), want, rtol=1e-6, atol=1e-6)  # float32 math inside
    for g, r in zip(torch.autograd.grad(got, [x, w, b], dh), torch.autograd.grad(want, [x, w, b], dh)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"bias \(N,\)"):
        bg.bias_gelu(torch.randn(4, 8), torch.randn(7))


@pytest.mark.parametrize("compiled", [False, True])
def test_the_gpt_with_fused_mlps_trains_as_the_plain_one(compiled):
    if compiled and compile_blocker(torch.device("cpu")):
        pytest.skip(compile_blocker(torch.device("cpu")))
    torch.manual_seed(0)
    plain = GPT(GPTConfig.from_name("tiny"))
    fused = copy.deepcopy(plain)
    assert fuse_bias_gelu(fused) == plain.config.n_layer
    if compiled:
        for block in fused.blocks:
            block.compile()
    x, y = torch.randint(256, (4, 32)), torch.randint(256, (4, 32))
    _, want = plain(x, y)
    _, got = fused(x, y)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert list(fused.state_dict()) == list(plain.state_dict())
    assert fuse_bias_gelu(fused, on=False) == 0
    assert all("forward" not in m.__dict__ for m in fused.modules())


def test_bf16_residual_casts_the_stream_under_autocast_only():
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("tiny"))
    bf16_residual(model)
    bf16_residual(model)  # idempotent: one hook
    assert len(model.blocks[0]._forward_pre_hooks) == 1
    seen = []
    model.blocks[1].register_forward_pre_hook(lambda m, a: seen.append(a[0].dtype))
    x, y = torch.randint(256, (2, 16)), torch.randint(256, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss16 = model(x, y)
    model(x, y)  # no autocast: untouched
    assert seen == [torch.bfloat16, torch.float32]
    bf16_residual(model, on=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss32 = model(x, y)
    assert seen[-1] == torch.float32
    torch.testing.assert_close(loss16, loss32, rtol=2e-2, atol=2e-2)  # the same model, a rounded stream


def test_bf16_residual_on_a_cpu_run_says_it_changes_nothing():
    from gobrrr.train.cli import TrainConfig
    from gobrrr.train.step import setup_model

    raw = GPT(GPTConfig.from_name("tiny"))
    _, _, lines = setup_model(raw, TrainConfig(model="tiny", bf16_residual=True, compile=False), torch.device("cpu"), 32)
    assert any("--bf16-residual changes nothing here" in line for line in lines)
    assert not raw.blocks[0]._forward_pre_hooks and "bf16 residual" not in lines[-1]


CHECK = r"""
import torch
from gobrrr.ops import bias_gelu as bg

bg.available = lambda t: True  # the interpreter runs the kernels on CPU tensors
torch.manual_seed(0)
for M, N, bm, bn in ((70, 300, 32, 256), (5, 3, 32, 256), (64, 512, 16, 128)):
    bg.BWD_BM, bg.BWD_BN = bm, bn
    for dt in (torch.float32, torch.bfloat16):
        tol = dict(rtol=1e-5, atol=1e-5) if dt == torch.float32 else dict(rtol=1.6e-2, atol=1e-5)
        x = (torch.randn(M, N) * 3).to(dt)
        b = torch.randn(N)
        g = torch.randn(M, N).to(dt)
        torch.testing.assert_close(bg._bias_gelu(x, b), bg._reference(x, b), **tol)
        dx, db = bg._bias_gelu_backward(g, x, b)
        rdx, rdb = bg._reference_backward(g, x, b)
        torch.testing.assert_close(dx, rdx, **tol)
        torch.testing.assert_close(db, rdb, rtol=1e-4, atol=1e-4)
z = torch.tensor([[-30.0, -10.0, -5.0, -2.0, -1e-3, 0.0, 1e-3, 2.0, 5.0, 10.0, 30.0]])  # both sides, the tails
zero = torch.zeros(z.shape[1])
torch.testing.assert_close(bg._bias_gelu(z, zero), bg._reference(z, zero), rtol=1e-5, atol=1e-6)
torch.testing.assert_close(bg._bias_gelu_backward(torch.ones_like(z), z, zero)[0],
                           bg._reference_backward(torch.ones_like(z), z, zero)[0], rtol=1e-5, atol=1e-6)
print("interpreted bias_gelu matches")
"""


@pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
def test_kernel_arithmetic_under_the_triton_interpreter():
    run_interpreted(CHECK, "interpreted bias_gelu matches")
