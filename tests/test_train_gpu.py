"""`gobrrr train` on a GPU: bf16 autocast, fused AdamW, the Prefetcher and ddp at world size 1, with
torch.compile on (the default there; every run here compiles unless it says compile=False).

The second half: the compile time is reported apart from tokens/s, compiled matches eager, the
compiled step syncs nothing as the sync detective sees it, the batch-size probe fits, and the
chunked loss equals the plain head under autocast."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gobrrr.plan.machine import peak_flops
from gobrrr.train.checkpoints import read
from gobrrr.train.cli import TrainConfig, main, read_metrics, train

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


def test_tiny_trains_on_cuda_with_bf16_autocast(tmp_path):
    out = tmp_path / "run"
    result = train(TrainConfig(model="tiny", device="cuda", steps=40, batch_size=16, seq_len=64, lr=3e-3,
                               log_every=10, ckpt_every=20, progress=False, out=str(out)))
    recs = read_metrics(out / "metrics.jsonl")
    assert sorted(recs) == list(range(1, 41))
    losses = [recs[s]["loss"] for s in range(1, 41)]
    assert all(math.isfinite(v) for v in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    assert all(recs[s]["tokens_per_s"] > 0 for s in recs)
    peak, _ = peak_flops(torch.device("cuda"))
    if peak is not None:  # a GPU in the table (H100/H200/A100/L40S): MFU is reported, and is a fraction
        assert result["mfu"] is not None and 0 < result["mfu"] < 1
        assert all(0 < recs[s]["mfu"] < 1 for s in recs)
    ckpt = read(out)
    assert ckpt["trainer"]["step"] == 40 and ckpt["trainer"]["rng"]["cuda"] is not None
    assert all(t.device.type == "cpu" and torch.isfinite(t).all() for t in ckpt["model"].values())  # read on the CPU
    assert set(ckpt["optim"]["wte.weight"]) == {"step", "exp_avg", "exp_avg_sq"}  # fused AdamW's step counts too


def test_killed_cuda_run_resumes_to_the_same_losses(tmp_path):
    argv = ["--model", "tiny", "--device", "cuda", "--steps", "12", "--batch-size", "8", "--seq-len", "64",
            "--lr", "3e-3", "--log-every", "2", "--ckpt-every", "6", "--no-progress"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert main(argv + ["--out", str(ref)]) == 0
    proc = subprocess.run([sys.executable, "-m", "gobrrr", "train", *argv, "--out", str(cut), "--crash-after-step", "8"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert read(cut)["trainer"]["step"] == 6
    assert main(argv + ["--out", str(cut), "--resume"]) == 0
    a, b = read_metrics(ref / "metrics.jsonl"), read_metrics(cut / "metrics.jsonl")
    assert sorted(b) == list(range(1, 13))
    # the same arithmetic on the same GPU: equal up to kernel-level nondeterminism (atomics in backward)
    torch.testing.assert_close(torch.tensor([b[s]["loss"] for s in range(1, 13)]),
                               torch.tensor([a[s]["loss"] for s in range(1, 13)]), rtol=1e-3, atol=1e-3)


def test_the_training_loop_does_not_sync_every_step(tmp_path):
    import gobrrr

    counts = {}
    for steps in (20, 60):
        with gobrrr.watch_syncs() as report:
            train(TrainConfig(model="tiny", device="cuda", steps=steps, batch_size=8, seq_len=64, log_every=20,
                              ckpt_every=1000, progress=False, out=str(tmp_path / f"s{steps}")))
        counts[steps] = report.count
    # 40 more steps add two loss reads (one per 20 steps), not 40 or more syncs
    assert counts[60] - counts[20] <= 10, (counts, report.to_json())


# ---------------------------------------------------------------- compile, probe, chunked loss

TINY = dict(model="tiny", device="cuda", seq_len=64, batch_size=8, steps=12, log_every=4, ckpt_every=12, lr=3e-3)


def losses(out) -> dict[int, float]:
    return {s: r["loss"] for s, r in read_metrics(out / "metrics.jsonl").items()}


@pytest.mark.timeout(300)
def test_compiled_by_default_reports_compile_apart_and_matches_eager(tmp_path, capsys):
    on, off = tmp_path / "on", tmp_path / "off"
    result = train(TrainConfig(**TINY, out=str(on)))  # compile: default (on for a GPU)
    err = capsys.readouterr().err
    assert "model: torch.compile as one whole-model graph, backend inductor, chunked cross-entropy" in err  # 1 rank
    assert "torch.compile + first step:" in err and "(not counted in tokens/s)" in err
    assert result["tokens_per_s"] > 0
    train(TrainConfig(**TINY, out=str(off), compile=False))
    assert "eager (not compiled)" in capsys.readouterr().err
    l_on, l_off = losses(on), losses(off)
    assert sorted(l_on) == list(range(1, 13)) and l_on[12] < l_on[1] - 0.3
    # bf16 autocast: compiled and eager kernels round differently; the trajectories stay together
    torch.testing.assert_close(torch.tensor(list(l_on.values())), torch.tensor(list(l_off.values())),
                               rtol=0, atol=3e-2)


@pytest.mark.timeout(300)
def test_bf16_residual_and_the_fused_mlp_train_as_the_default_path(tmp_path, capsys):
    fused, res16, unfused = tmp_path / "fused", tmp_path / "res16", tmp_path / "unfused"
    train(TrainConfig(**TINY, out=str(fused)))
    assert "bias-GELU kernels" in capsys.readouterr().err  # on by default when compiled on a GPU
    train(TrainConfig(**TINY, out=str(res16), bf16_residual=True))
    assert "bias-GELU kernels, bf16 residual stream" in capsys.readouterr().err
    train(TrainConfig(**TINY, out=str(unfused), compile=False))
    l_fused, l_res16, l_unfused = (torch.tensor(list(losses(d).values())) for d in (fused, res16, unfused))
    assert l_res16[-1] < l_res16[0] - 0.3
    # the same model and data: a bf16 residual stream and the fused MLP round differently, no more
    torch.testing.assert_close(l_res16, l_fused, rtol=0, atol=5e-2)
    torch.testing.assert_close(l_fused, l_unfused, rtol=0, atol=3e-2)


def test_the_compiled_step_syncs_nothing_and_the_detective_still_sees_user_syncs():
    import gobrrr
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.parallel import ddp
    from gobrrr.train.cli import make_optimizer
    from gobrrr.train.step import autocast_for, prepare_model, train_step

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
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.train.auto_batch import TARGET_TOKENS, auto_batch_size
    from gobrrr.train.step import prepare_model

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


@pytest.mark.parametrize("kernel, compiled", [("torch", False), ("torch", True), ("triton", False)])
def test_chunked_loss_matches_the_plain_head_under_autocast(kernel, compiled):
    from gobrrr.ops import ChunkedCrossEntropy

    torch.manual_seed(0)
    N, C, V = 3000, 64, 50304
    x = torch.randn(N, C, device="cuda", requires_grad=True)
    w = (torch.randn(V, C, device="cuda") * 0.02).requires_grad_()
    t = torch.randint(V, (N,), device="cuda")
    t[5] = -100  # an ignored row
    loss_fn = ChunkedCrossEntropy(compile=compiled, chunk_rows=1024, kernel=kernel)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(x, w), t)
        got = loss_fn(x, w, t)
    gx, gw = torch.autograd.grad(ref, (x, w))
    hx, hw = torch.autograd.grad(got, (x, w))
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(hx, gx, rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(hw, gw, rtol=2e-2, atol=2e-4)


def test_the_doctor_sees_the_compiled_step(tmp_path):
    from gobrrr import doctor
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.parallel import ddp
    from gobrrr.train.cli import make_optimizer
    from gobrrr.train.step import autocast_for, prepare_model, train_step

    device = torch.device("cuda")
    torch.manual_seed(0)
    raw = GPT(GPTConfig.from_name("tiny")).to(device)
    prepare_model(raw, compile=True)
    model, opt = ddp(raw), make_optimizer(raw, TrainConfig(), device)
    batch = tuple(torch.randint(256, (8, 64), device=device) for _ in range(2))
    params, ctx = list(raw.parameters()), autocast_for(device)

    def step():
        train_step(model, opt, [batch], accum=1, params=params, grad_clip=1.0, autocast=ctx)

    step()  # compile outside the profiled window
    report = doctor.profile(step, steps=3, warmup=1, out_dir=str(tmp_path), print_summary=False)
    gpu = report["gpu"]
    assert gpu is not None and gpu["span_ms"] > 0
    names = " ".join(k["name"] for k in gpu["top_kernels"])
    assert "triton" in names, names  # the compiled blocks' generated kernels are in the trace


def test_cudnn_attention_first_matches_sdpa_default_in_a_compiled_step():
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.train.step import ComputeContext, prepare_model

    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the cuDNN-first preference is for Hopper GPUs")
    idx = torch.randint(50304, (4, 256), device=device)
    out = {}
    for cudnn in (False, True):
        torch._dynamo.reset()  # a compiled graph bakes in the attention kernel and dynamo does not guard on it
        torch.manual_seed(0)
        raw = GPT(GPTConfig.from_name("124m", n_layer=2)).to(device)
        prepare_model(raw, compile=True)
        with ComputeContext(device, cudnn_attention=cudnn):
            _, loss = raw(idx, idx)
            loss.backward()
        out[cudnn] = (loss.detach(), raw.blocks[0].attn.qkv.weight.grad.clone())
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out[True][1], out[False][1], rtol=5e-2, atol=1e-3)
