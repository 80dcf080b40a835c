"""ddp on CUDA: a ddp step equals a plain step; the NCCL path (streams, buckets, bf16) adds no host sync.

On one GPU the collectives of a 1-rank NCCL group are forced on (`_force_communication`), so the
comm stream, the stream waits and the bf16 casts all run for real; with two or more GPUs the whole
CPU/gloo check suite of test_ddp.py runs unchanged over NCCL.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.gpu
# same kernels on both sides; the slack only absorbs run-to-run noise of GPU reductions (atomics)
TOL = {"rtol": 1e-4, "atol": 1e-6}


def _tiny_gpt(device):
    from gobrrr.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("tiny")).to(device)


def _batches(device, n: int = 3):
    from gobrrr.train.data import SyntheticTokens

    src = SyntheticTokens(256, 64, 8, seed=0)
    return [tuple(t.to(device) for t in src.batch(i)) for i in range(n)]  # (B, T) each


def _backward(model, x, y):
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.is_cuda):
        _, loss = model(x, y)
    loss.backward()
    return loss.detach()


def _sync_counter():
    try:
        from gobrrr.syncs.watch import watch_syncs
    except ImportError:  # the sync detective is optional here
        return None
    return watch_syncs


def test_ddp_step_equals_plain_step_world_size_1():
    step_parity(torch.device("cuda"))


def step_parity(dev: torch.device) -> None:
    """Three AdamW steps of the tiny GPT, unwrapped and wrapped, at world size 1 (no process group)."""
    from gobrrr.parallel import ddp

    base = _tiny_gpt(dev)
    plain, ours = copy.deepcopy(base), ddp(copy.deepcopy(base))
    opt_p = torch.optim.AdamW(plain.parameters(), lr=1e-3, fused=True)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3, fused=True)
    for step, (x, y) in enumerate(_batches(dev)):
        assert_close(_backward(ours, x, y), _backward(plain, x, y), **TOL)
        for (n, p), q in zip(plain.named_parameters(), ours.module.parameters()):
            assert_close(q.grad, p.grad, msg=f"step {step}: gradient of {n}", **TOL)
        opt_p.step(), opt_o.step()
        opt_p.zero_grad(), opt_o.zero_grad()
    for (n, p), q in zip(plain.named_parameters(), ours.module.parameters()):
        assert_close(q, p, msg=f"weights of {n}", **TOL)


def nccl_one_gpu(rank) -> dict:
    """In a 1-rank NCCL group: forced collectives, small buckets, fp32 and bf16; count syncs in backward."""
    from gobrrr.parallel.ddp import DDP

    watch = _sync_counter()
    dev = rank.device
    base = _tiny_gpt(dev)
    out = {}
    for label, grad_dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        plain = copy.deepcopy(base)
        ours = DDP(copy.deepcopy(base), bucket_mb=0.05, first_bucket_mb=0.01, grad_dtype=grad_dtype,
                   _force_communication=True)
        assert len(ours.buckets) > 3
        counts = []
        for x, y in _batches(dev):
            if watch is None:
                _backward(plain, x, y), _backward(ours, x, y)
            else:
                with watch(mode="count") as base_report:
                    _backward(plain, x, y)
                with watch(mode="count") as report:
                    _backward(ours, x, y)
                counts.append((report.count, base_report.count, [s.where() for s in report.sites]))
            tol = TOL if grad_dtype is None else {"rtol": 2e-2, "atol": 1e-4}
            for (n, p), q in zip(plain.named_parameters(), ours.module.parameters()):
                assert_close(q.grad, p.grad, msg=f"{label}: gradient of {n}", **tol)
            plain.zero_grad(), ours.zero_grad()
        assert ours.reductions == 3 * len(ours.buckets)
        out[label] = counts
    return out


def test_nccl_path_on_one_gpu_matches_and_never_syncs():
    from gobrrr.comm.testing import spawn

    (res,) = spawn(nccl_one_gpu, 1, backend="nccl", timeout_s=120.0)
    for label, counts in res.items():  # (ddp backward, plain backward, ddp's sites) per step
        assert all(ours == plain for ours, plain, _ in counts), f"{label}: ddp added host syncs to backward: {counts}"


@pytest.mark.multigpu
def test_gloo_suite_unchanged_over_nccl():
    from test_ddp import run_all_checks

    from gobrrr.comm.testing import spawn

    n = min(4, torch.cuda.device_count())
    results = spawn(run_all_checks, n, backend="nccl", timeout_s=180.0)
    assert len(results) == n and all("unused.weight" in r["unused-ddp"] for r in results)
