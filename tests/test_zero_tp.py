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

from gobrrr.comm.testing import SpawnError, spawn
from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.models.gpt_plan import GPT_PLAN
from tests.test_tp_2d import CFG, CLIP, train_beside_one_process

STEPS = 12


def _train(mesh, stage: int, sp: bool) -> None:
    from gobrrr.parallel import zero
    from gobrrr.parallel.tp.parallelize import tp

    dp_group, dp_rank = mesh["dp"].get_group(), mesh.get_local_rank("dp")
    torch.manual_seed(0)
    ref = GPT(GPTConfig.from_name("tiny", **CFG))
    inner = tp(copy.deepcopy(ref), mesh, GPT_PLAN, sequence_parallel=sp)
    model, opt = zero(inner, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3), stage=stage, group=dp_group)
    what = f"stage {stage}, sp={sp}"
    # stages 1-2 keep whole compute parameters on every dp rank: full_state reads the trained weights
    train_beside_one_process(model, opt, lambda: opt.clip_grad_norm_(CLIP), ref, dp_group, dp_rank, what, STEPS)
    # over dp: one reduce-scatter per flat per step (no full-gradient all-reduce); over tp: the model's own
    assert model.reductions == STEPS * len(model.order), (what, model.reductions, len(model.order))


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
