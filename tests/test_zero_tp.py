"""ZeRO stages 1-2 over the dp ranks of a tensor-parallel model, on a (dp 2, tp 2) mesh.

One 4-rank spawn (gloo, CPU): zero(tp(GPT, mesh), AdamW, stage=s, group=dp) for s = 1, 2, with and
without sequence parallelism, 12 steps with clipping at 0.05 (active on every step), against one
process training the whole GPT on the whole batch: losses, gradient norms (the composed norm
counts tp-sharded squares over tp and replicated ones once) and the final whole weights; over dp,
one reduce-scatter per flat per step.
Tolerances as in test_tp_2d.py (fp32; ranks sum in another order).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from gobrrr.dist.testing import SpawnError, spawn
from gobrrr.models.gpt import GPT, GPTConfig

B, T, STEPS, CLIP = 2, 16, 12, 0.05
CFG = dict(n_head=4, n_embd=32)


def _batch(step: int):
    g = torch.Generator().manual_seed(200 + step)
    return torch.randint(0, 256, (2 * B, T), generator=g), torch.randint(0, 256, (2 * B, T), generator=g)


def _adamw(m):
    return torch.optim.AdamW(m.parameters(), lr=3e-3)


def _train(mesh, stage: int, sp: bool) -> None:
    from gobrrr.parallel import zero
    from gobrrr.parallel.tp import tp
    from gobrrr.parallel.tp_tensors import full_state

    dp_group, dp_rank = mesh["dp"].get_group(), mesh.get_local_rank("dp")
    torch.manual_seed(0)
    ref = GPT(GPTConfig.from_name("tiny", **CFG))
    inner = tp(copy.deepcopy(ref), mesh, sequence_parallel=sp)
    model, opt = zero(inner, _adamw, stage=stage, group=dp_group)
    ref_opt = _adamw(ref)
    got, want = [], []
    for step in range(STEPS):
        x, y = _batch(step)
        rows = slice(dp_rank * B, (dp_rank + 1) * B)
        _, loss = model(x[rows], y[rows])
        loss.backward()
        norm = opt.clip_grad_norm_(CLIP)
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=dp_group)
        got.append(torch.stack([mean / 2, norm]))

        _, ref_loss = ref(x, y)
        ref_loss.backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        want.append(torch.stack([ref_loss.detach(), ref_norm]))
    got, want = torch.stack(got), torch.stack(want)
    what = f"stage {stage}, sp={sp}"
    # over dp: one reduce-scatter per flat per step (no full-gradient all-reduce); over tp: the model's own
    assert model.reductions == STEPS * len(model.order), (what, model.reductions, len(model.order))
    assert (want[:, 1] > CLIP).all(), "the test must clip on every step"
    assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: losses/norms over {STEPS} steps: {m}")
    for name, w in full_state(inner).items():  # stages 1-2 keep whole compute parameters on every dp rank
        assert_close(w, dict(ref.named_parameters())[name].detach(), rtol=1e-4, atol=3e-5,
                     msg=lambda m, name=name: f"{what}: {name} after {STEPS} steps: {m}")


def _four_ranks(rank):
    from gobrrr.parallel.mesh import make_mesh

    torch.set_num_threads(1)  # 4 ranks on a 2-core CI box: one thread each
    mesh = make_mesh(2)
    for stage in (1, 2):
        for sp in (False, True):
            _train(mesh, stage, sp)
    return True


def test_zero_stages_1_2_over_dp_of_a_tp_model():
    try:
        assert spawn(_four_ranks, 4, timeout_s=300) == [True] * 4
    except SpawnError as e:
        pytest.fail(str(e), pytrace=False)
