"""Parity with torch's own tensor parallelism: the same GPT through `parallelize_module` (ColwiseParallel,
RowwiseParallel, SequenceParallel, PrepareModuleInput/Output, loss_parallel) on DTensor gives the same
loss, logits and gradients as `gobrrr.parallel.tp` (2 ranks, gloo, CPU; with and without SP).

Two differences in how the model must be fed to torch's TP, both forced by DTensor, not by us (gobrrr/bench/tp.py's
torch_tp does both, and the benchmark times that same model):
  * torch shards the fused QKV weight as one contiguous block of rows (rank 0 would get all of q and
    half of k), so its rows are permuted first into [q_0 k_0 v_0 | q_1 k_1 v_1]: then each rank holds
    the same [q_r; k_r; v_r] as with our Colwise(chunks=3), and the gradient is permuted back;
  * parallelize_module turns wte.weight and lm_head.weight into two separate DTensor parameters,
    which unties them: the forward is the same, and their gradient is the sum of the two.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

from gobrrr.bench.tp import qkv_rows, torch_tp
from gobrrr.comm.testing import SpawnError, spawn
from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.models.gpt_plan import GPT_PLAN

B, T = 2, 16


def _compare(rank, sp: bool) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    from gobrrr.parallel.tp.parallelize import tp
    from gobrrr.parallel.tp.tensors import full_state

    n = dist.get_world_size()
    cfg = GPTConfig.from_name("tiny", n_head=4, n_embd=32)
    torch.manual_seed(0)
    ref = GPT(cfg)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 256, (B, T), generator=g), torch.randint(0, 256, (B, T), generator=g)

    ours = tp(copy.deepcopy(ref), None, GPT_PLAN, sequence_parallel=sp)
    logits, loss = ours(x, y)
    loss.backward()
    parts = [torch.empty_like(logits) for _ in range(n)]
    dist.all_gather(parts, logits.detach().contiguous())
    our_logits, our_grads = torch.cat(parts, -1), full_state(ours, grads=True)

    theirs = torch_tp(copy.deepcopy(ref), n, torch.device("cpu"), sp)
    with loss_parallel():
        t_logits, t_loss = theirs(x, y)
        t_loss.backward()
    assert isinstance(t_logits, DTensor)
    assert_close(loss, t_loss.full_tensor() if isinstance(t_loss, DTensor) else t_loss)
    assert_close(our_logits, t_logits.full_tensor())
    back = qkv_rows(n, cfg.n_embd, inverse=True)
    for name, p in theirs.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
            grad = grad[back]
        if name == "lm_head.weight":
            continue
        if name == "wte.weight":
            lm = theirs.lm_head.weight.grad
            grad = grad + (lm.full_tensor() if isinstance(lm, DTensor) else lm)
        assert_close(our_grads[name], grad, msg=lambda m, name=name: f"sp={sp} {name}: {m}")


def _two_ranks(rank):
    torch.set_num_threads(1)
    for sp in (False, True):
        _compare(rank, sp)
    return True


def test_same_outputs_and_gradients_as_torch_parallelize_module():
    try:
        assert spawn(_two_ranks, 2, timeout_s=200) == [True, True]
    except SpawnError as e:
        pytest.fail(str(e), pytrace=False)
