"""`gobrrr train` on a GPU with torch.compile on (the default there): it compiles, trains, reports the
compile time apart from tokens/s, matches the eager run, keeps the step free of host syncs as the
sync detective sees it, and probes a batch size that fits. The chunked loss equals the plain head."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gobrrr.train import TrainConfig, read_metrics, train

pytestmark = pytest.mark.gpu
TINY = dict(model="tiny", device="cuda", seq_len=64, batch_size=8, steps=12, log_every=4, ckpt_every=12, lr=3e-3)


def losses(out) -> dict[int, float]:
    return {s: r["loss"] for s, r in read_metrics(out / "metrics.jsonl").items()}


@pytest.mark.timeout(300)
def test_compiled_by_default_reports_compile_apart_and_matches_eager(tmp_path, capsys):
    on, off = tmp_path / "on", tmp_path / "off"
    result = train(TrainConfig(**TINY, out=str(on)))  # compile: default (on for a GPU)
    err = capsys.readouterr().err
    assert "model: torch.compile per block, backend inductor, chunked cross-entropy" in err
    assert "torch.compile + first step:" in err and "(not counted in tokens/s)" in err
    assert result["tokens_per_s"] > 0
    train(TrainConfig(**TINY, out=str(off), compile=False))
    assert "eager (not compiled)" in capsys.readouterr().err
    l_on, l_off = losses(on), losses(off)
    assert sorted(l_on) == list(range(1, 13)) and l_on[12] < l_on[1] - 0.3
    # bf16 autocast: compiled and eager kernels round differently; the trajectories stay together
    torch.testing.assert_close(torch.tensor(list(l_on.values())), torch.tensor(list(l_off.values())),
                               rtol=0, atol=3e-2)


def test_the_compiled_step_syncs_nothing_and_the_detective_still_sees_user_syncs():
    import gobrrr
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.parallel import ddp
    from gobrrr.train import make_optimizer
    from gobrrr.train_step import autocast_for, prepare_model, train_step

    device = torch.device("cuda")
    torch.manual_seed(0)
    raw = GPT(GPTConfig.from_name("tiny")).to(device)
    prepare_model(raw, compile=True)
    model, opt = ddp(raw), make_optimizer(raw, TrainConfig(), device)
    batch = tuple(torch.randint(256, (8, 64), device=device) for _ in range(2))
    params = list(raw.parameters())

    def step():
        return train_step(model, opt, [batch, batch], accum=2, params=params, grad_clip=1.0,
                          autocast=autocast_for(device))

    step()  # compiles
    with gobrrr.sync_budget(0):
        out = step()
    with gobrrr.watch_syncs() as report:
        out = step()
        out[0].item()  # the one sync, on this line
    assert report.count == 1 and report.sites[0].kind == "item"


def test_the_probe_picks_a_power_of_two_that_fits():
    from gobrrr.auto_batch import TARGET_TOKENS, auto_batch_size
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.train_step import prepare_model

    device = torch.device("cuda")
    raw = GPT(GPTConfig.from_name("small")).to(device)
    prepare_model(raw, compile=False)
    rows, line = auto_batch_size(raw, device, 256)
    assert rows & (rows - 1) == 0 and 1 <= rows <= TARGET_TOKENS // 256
    assert "auto" in line and all(p.grad is None for p in raw.parameters())


def test_auto_batch_size_in_a_run(tmp_path, capsys):
    cfg = dict(TINY, batch_size=None, steps=2, log_every=1, ckpt_every=2, compile=False)
    train(TrainConfig(**cfg, out=str(tmp_path / "run")))
    assert "per rank (auto:" in capsys.readouterr().err
    rec = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert rec[1]["tokens_per_s"] is None and rec[2]["tokens_per_s"] > 0  # step 1 is timed apart


@pytest.mark.parametrize("compiled", [False, True])
def test_chunked_loss_matches_the_plain_head_under_autocast(compiled):
    from gobrrr.ops import ChunkedCrossEntropy

    torch.manual_seed(0)
    N, C, V = 3000, 64, 50304
    x = torch.randn(N, C, device="cuda", requires_grad=True)
    w = (torch.randn(V, C, device="cuda") * 0.02).requires_grad_()
    t = torch.randint(V, (N,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(x, w), t)
        got = ChunkedCrossEntropy(compile=compiled, chunk_rows=1024)(x, w, t)
    gx, gw = torch.autograd.grad(ref, (x, w))
    hx, hw = torch.autograd.grad(got, (x, w))
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(hx, gx, rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(hw, gw, rtol=2e-2, atol=2e-4)
