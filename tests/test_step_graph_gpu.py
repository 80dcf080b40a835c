"""gobrrr.train.graph on a GPU: the replayed step trains exactly as the eager one, falls back when the
step cannot be captured, keeps checkpoints plain, and recaptures after an optimizer load."""
from __future__ import annotations

import copy

import pytest
import torch

from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.parallel import ddp
from gobrrr.train.cli import TrainConfig, make_optimizer, read_metrics, train
from gobrrr.train.graph import GraphedStep
from gobrrr.train.step import autocast_for, prepare_model, train_step

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def _setup(seed=0, compile=False):
    torch.manual_seed(seed)
    raw = GPT(GPTConfig.from_name("tiny")).to(DEV)
    prepare_model(raw, compile=compile)
    model = ddp(raw)
    opt = make_optimizer(raw, TrainConfig(model="tiny", steps=10, out="-"), DEV)
    return raw, model, opt


def _batches(n, K, B=4, T=64, V=256):
    g = torch.Generator().manual_seed(1)
    return [[tuple(torch.randint(0, V, (B, T), generator=g).to(DEV) for _ in range(2)) for _ in range(K)]
            for _ in range(n)]


def _eager_run(raw, model, opt, data, lrs):
    out = []
    for micro, lr in zip(data, lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        out.append(train_step(model, opt, micro, accum=len(micro), params=list(raw.parameters()), grad_clip=1.0,
                              autocast=autocast_for(DEV)))
    return torch.stack(out)


@pytest.mark.parametrize("compile", [False, True])
def test_graphed_step_trains_as_the_eager_step(compile):
    K, n = 2, 7
    data, lrs = _batches(n, K), [1e-3 * (i + 1) for i in range(n)]  # the LR changes every step
    raw_e, model_e, opt_e = _setup(compile=compile)
    ref = _eager_run(raw_e, model_e, opt_e, data, lrs)
    raw_g, model_g, opt_g = _setup(compile=compile)
    params = list(raw_g.parameters())
    step = GraphedStep(lambda micro: train_step(model_g, opt_g, micro, accum=K, params=params, grad_clip=1.0,
                                                autocast=autocast_for(DEV)), opt_g, DEV)
    got = torch.stack([step(micro, lr) for micro, lr in zip(data, lrs)])
    assert step.failed is None and step.captures == 1 and step.replays == n - 2
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)  # (n, 2): loss and grad norm per step
    for a, b in zip(raw_g.parameters(), raw_e.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_step_that_syncs_falls_back_to_eager_with_one_notice():
    raw, model, opt = _setup()
    params = list(raw.parameters())

    def syncing(micro):
        out = train_step(model, opt, micro, accum=1, params=params, grad_clip=1.0, autocast=autocast_for(DEV))
        if out[0].item() < 0:  # a host read: not allowed while a graph records
            raise AssertionError("negative loss")
        return out

    step = GraphedStep(syncing, opt, DEV)
    data = _batches(5, 1)
    outs = [step(micro, 1e-3) for micro in data]
    assert step.graph is None and step.captures == 0 and step.failed
    notice = step.pop_notice()
    assert notice.startswith("notice: the step runs without a CUDA graph: capture failed") and step.pop_notice() is None
    assert all(torch.isfinite(o).all() for o in outs)
    torch.randint(0, 10, (4,), device=DEV)  # the CUDA generator is usable outside a graph again
    assert all(not isinstance(g["lr"], torch.Tensor) and not g["capturable"] for g in opt.param_groups)


def test_state_dict_stays_plain_and_a_load_recaptures():
    raw, model, opt = _setup()
    params = list(raw.parameters())
    step = GraphedStep(lambda micro: train_step(model, opt, micro, accum=1, params=params, grad_clip=1.0,
                                                autocast=autocast_for(DEV)), opt, DEV)
    data = _batches(8, 1)
    for micro in data[:4]:
        step(micro, 2e-3)
    assert step.captures == 1
    saved = copy.deepcopy(opt.state_dict())
    assert all(g["lr"] == 2e-3 and g["capturable"] is False for g in saved["param_groups"])
    weights = {k: v.clone() for k, v in raw.state_dict().items()}
    # continue from the saved state twice: once graphed after a load (recaptured), once eagerly
    opt.load_state_dict(copy.deepcopy(saved))  # load_state_dict adopts the tensors it is given: one copy each
    assert step.graph is None
    got = torch.stack([step(micro, 2e-3) for micro in data[4:]])
    assert step.captures == 2
    raw_e, model_e, opt_e = _setup()
    raw_e.load_state_dict(weights)
    opt_e.load_state_dict(copy.deepcopy(saved))
    ref = _eager_run(raw_e, model_e, opt_e, data[4:], [2e-3] * 4)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_train_with_and_without_the_graph_gives_the_same_losses(tmp_path, capsys):
    common = dict(model="tiny", device="cuda", steps=12, batch_size=8, seq_len=64, lr=3e-3, log_every=4,
                  ckpt_every=12, grad_accum=2)
    train(TrainConfig(**common, out=str(tmp_path / "g")))
    err = capsys.readouterr().err
    assert "one CUDA graph" in err and "capture failed" not in err, err
    train(TrainConfig(**common, out=str(tmp_path / "e"), cuda_graph=False, progress=False))
    a, b = read_metrics(tmp_path / "g" / "metrics.jsonl"), read_metrics(tmp_path / "e" / "metrics.jsonl")
    assert sorted(a) == sorted(b) == list(range(1, 13))
    torch.testing.assert_close(torch.tensor([a[s]["loss"] for s in a]), torch.tensor([b[s]["loss"] for s in a]),
                               rtol=1e-4, atol=1e-5)


def test_two_runs_in_one_process_capture_with_the_prefetcher_running(tmp_path, capsys):
    """As bench plan_check does: train at one batch size, then another, then draw random numbers.
    The Prefetcher's threads use CUDA while the step is recorded (thread-local capture mode)."""
    for b in (4, 8):
        train(TrainConfig(model="tiny", device="cuda", steps=6, batch_size=b, seq_len=64, log_every=3,
                          ckpt_every=6, out=str(tmp_path / f"b{b}")))
        err = capsys.readouterr().err
        trace = tmp_path / f"b{b}" / "cuda_graph_failure.txt"
        assert "one CUDA graph" in err and "capture failed" not in err, err + (trace.read_text() if trace.exists() else "")
    torch.randint(0, 10, (4,), device=DEV)
