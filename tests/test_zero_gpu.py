"""ZeRO on CUDA (world size 1; the collectives become copies but the comm stream, events and stream
waits all run): parity with a plain fused-AdamW step, no host-device sync inside a step, and stage 3's
prefetched gather of block k+1 running while block k computes (CUDA events on both streams)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)


def _gpt(name: str = "tiny", **kw):
    from gobrrr.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig.from_name(name, **kw)).cuda()


def _batch(vocab: int, B: int, T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (B, T), generator=g).cuda()
    return x, torch.roll(x, -1, 1)


def _opt(m):
    return torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_step_equals_plain_step(stage):
    from gobrrr.parallel import zero
    from gobrrr.parallel.zero.checkpoint import full_state_dict

    base = _gpt()
    plain = copy.deepcopy(base)
    opt_p = _opt(plain)
    model, opt = zero(copy.deepcopy(base), _opt, stage=stage)
    for s in range(3):
        x, y = _batch(256, 4, 64, s)
        plain(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        opt_p.step()
        opt_p.zero_grad()
        model(x, y)[1].backward()
        opt.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
    got = full_state_dict(model)
    for k, v in plain.state_dict().items():
        assert_close(got[k], v, rtol=1e-4, atol=1e-5, msg=lambda m: f"stage {stage} {k}: {m}")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_no_host_device_sync_in_a_step(stage):
    import gobrrr
    from gobrrr.parallel import zero

    model, opt = zero(_gpt(), _opt, stage=stage, param_dtype=torch.bfloat16)
    x, y = _batch(256, 4, 64)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)[1]
        loss.backward()
        opt.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()

    step()  # first step: allocations, optimizer state
    torch.cuda.synchronize()
    with gobrrr.sync_budget(0):
        step()
        step()


def test_stage3_prefetch_overlaps_the_previous_blocks_compute():
    """Events around each block's forward (compute stream) and each unit's gather (comm stream):
    block k+1's gather must start before block k's forward ends."""
    from gobrrr.parallel import zero

    model, opt = zero(_gpt("124m", n_layer=4), _opt, stage=3, param_dtype=torch.bfloat16)
    compute: dict[int, list] = {}
    for k, block in enumerate(model.module.blocks):
        def pre(m, a, k=k):
            compute[k] = [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)]
            compute[k][0].record()

        def post(m, a, out, k=k):
            compute[k][1].record()
        block.register_forward_pre_hook(pre)
        block.register_forward_hook(post)  # registered after zero's hooks: runs after the free
    model.record_gathers = True
    x, y = _batch(50304, 8, 1024)
    for _ in range(2):
        model.gather_events.clear()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    fwd = [e for e in model.gather_events if e[0] == "forward"]
    overlapped = 0
    for _, unit, start, _end in fwd:
        if unit >= 1 and unit - 1 in compute:
            c_start, c_end = compute[unit - 1]
            # the gather of `unit` started before block unit-1's forward ended (it did not wait for that
            # compute, as it would on one stream) and was done by then (hidden under it)
            if start.elapsed_time(c_end) > 0 and _end.elapsed_time(c_end) >= 0:
                overlapped += 1
    assert overlapped >= 2, f"only {overlapped} of {len(fwd)} forward gathers overlapped the previous block"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_memory_report_on_the_gpu(stage):
    from gobrrr.parallel import memory_report, zero

    model, opt = zero(_gpt(), _opt, stage=stage, param_dtype=torch.bfloat16)
    x, y = _batch(256, 4, 64)
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)[1]
        loss.backward()
        if _ == 0:
            opt.step()
            opt.zero_grad()
    rep = memory_report(model)
    assert rep.mixed and rep.peak_cuda is not None and rep.peak_cuda >= rep.held["total"]
    for k in ("params", "grads", "optimizer"):
        assert rep.held[k] == rep.formula[k], str(rep)
