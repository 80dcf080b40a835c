"""The loss path and torch.compile of `gobrrr train` on CPU: the chunked linear cross-entropy equals
lm_head + F.cross_entropy (loss and gradients), a compiled model under gobrrr ddp still fires its
gradient hooks and trains 2 gloo ranks to the 1-rank losses, and combinations that cannot compile
fall back with a notice.

Compilation here uses the "aot_eager" backend: dynamo and AOTAutograd, the parts that decide how a
compiled block's backward meets ddp's post-accumulate-grad hooks, without generating C++ (inductor
on a 2-core CI box costs ~30 s per process; tests/test_train_gpu.py runs inductor)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.ops import ChunkedCrossEntropy, linear_cross_entropy
from gobrrr.ops.linear_ce import chunk_bounds
from gobrrr.train.cli import TrainConfig, parse_args, read_metrics, train
from gobrrr.train.step import compile_blocker, prepare_model, setup_model, train_step

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one OpenMP thread


def test_chunk_bounds_cover_the_rows_in_near_equal_pieces():
    assert chunk_bounds(10, 4) == [(0, 4), (4, 7), (7, 10)]
    assert chunk_bounds(3, 100) == [(0, 3)]
    sizes = [e - s for s, e in chunk_bounds(16384, 5336)]
    assert sum(sizes) == 16384 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("chunk_rows", [1000, 7])
def test_linear_cross_entropy_equals_head_plus_cross_entropy(chunk_rows):
    torch.manual_seed(0)
    N, C, V = 37, 16, 50
    x = torch.randn(N, C, requires_grad=True)
    w = torch.randn(V, C, requires_grad=True)
    t = torch.randint(V, (N,))
    t[3] = t[20] = -100  # ignored rows count for nothing
    ref = F.cross_entropy(x @ w.T, t)
    gx, gw = torch.autograd.grad(ref * 0.25, (x, w))
    got = linear_cross_entropy(x, w, t, chunk_rows=chunk_rows)
    hx, hw = torch.autograd.grad(got * 0.25, (x, w))  # a scaled loss (accumulation) scales both gradients
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(hx, gx)
    torch.testing.assert_close(hw, gw)


def test_gpt_with_the_chunked_loss_matches_the_plain_head():
    torch.manual_seed(0)
    plain = GPT(GPTConfig.from_name("tiny"))
    fused = GPT(GPTConfig.from_name("tiny"))
    fused.load_state_dict(plain.state_dict())
    fused.fused_loss = ChunkedCrossEntropy(chunk_rows=50)
    idx, tgt = torch.randint(256, (3, 40)), torch.randint(256, (3, 40))
    _, ref = plain(idx, tgt)
    ref.backward()
    logits, got = fused(idx, tgt)
    got.backward()
    assert logits is None  # never materialized
    torch.testing.assert_close(got, ref)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert fused(idx)[0].shape == (3, 40, 256)  # without targets: logits as before


def test_the_loss_kernel_choice_falls_back_to_torch_on_a_cpu_and_says_what_is_missing():
    from gobrrr.ops.linear_ce import _chunk_loss_and_grad

    x = torch.zeros(4, 8)
    assert ChunkedCrossEntropy().kernel_for(x) is _chunk_loss_and_grad      # auto: no CUDA tensor here
    assert ChunkedCrossEntropy(kernel="torch").kernel_for(x) is _chunk_loss_and_grad
    with pytest.raises(RuntimeError, match="needs Triton and CUDA tensors"):
        ChunkedCrossEntropy(kernel="triton").kernel_for(x)
    with pytest.raises(ValueError, match="'auto', 'triton' or 'torch'"):
        ChunkedCrossEntropy(kernel="fast")


@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_compiled_model_keeps_names_and_fires_ddp_hooks_like_eager(scope):
    from gobrrr.parallel import ddp

    torch.manual_seed(0)
    eager, comp = GPT(GPTConfig.from_name("tiny")), GPT(GPTConfig.from_name("tiny"))
    comp.load_state_dict(eager.state_dict())
    prepare_model(eager, compile=False)
    line = prepare_model(comp, compile=True, backend="aot_eager", scope=scope)
    assert ("per block" if scope == "blocks" else "one whole-model graph") in line
    assert list(comp.state_dict()) == list(eager.state_dict())
    idx, tgt = torch.randint(256, (4, 32)), torch.randint(256, (4, 32))
    results = []
    for raw in (eager, comp):
        model = ddp(raw)
        opt = torch.optim.AdamW(raw.parameters(), lr=1e-3)
        out = [train_step(model, opt, [(idx, tgt), (tgt, idx)], accum=2, params=list(raw.parameters()),
                          grad_clip=1.0, autocast=torch.autocast("cpu", enabled=False)) for _ in range(2)]
        # one reduction per bucket per step: the hooks fired for every parameter, no_sync honoured
        assert model.reductions == 2 * len(model.buckets)
        results.append((torch.stack(out), [p.detach().clone() for p in raw.parameters()]))
    (l_e, p_e), (l_c, p_c) = results
    torch.testing.assert_close(l_c, l_e)
    for a, b in zip(p_c, p_e):
        torch.testing.assert_close(a, b)


def test_combinations_that_cannot_compile_fall_back_with_a_notice():
    class Cfg:
        tp, zero = 2, 0

    assert "--tp" in compile_blocker(torch.device("cpu"), Cfg())
    assert compile_blocker(torch.device("cpu"), TrainConfig()) in (None, compile_blocker(torch.device("cpu")))
    cfg = TrainConfig(model="tiny", device="cpu", compile=True, compile_backend="aot_eager")
    cfg.tp = 2  # as the TP flag will set it
    raw = GPT(GPTConfig.from_name("tiny"))
    batch, on, lines = setup_model(raw, cfg, torch.device("cpu"), 32)
    assert (batch, on) == (8, False)  # the CPU default batch size is unchanged
    assert any(line.startswith("notice: running without torch.compile: --tp") for line in lines)


def test_one_rank_compiles_one_whole_model_graph_and_more_ranks_compile_per_block():
    # one rank has no gradient communication to overlap, so inductor gets the whole model to fuse;
    # past one, per-block graphs hand ddp/ZeRO their gradients block by block
    cfg = TrainConfig(model="tiny", device="cpu", compile=True, compile_backend="aot_eager")
    for world, said in ((1, "torch.compile as one whole-model graph"), (2, "torch.compile per block")):
        _, on, lines = setup_model(GPT(GPTConfig.from_name("tiny")), cfg, torch.device("cpu"), 32, world)
        assert on and any(line.startswith("model: " + said) for line in lines), lines


def test_compile_flags_and_defaults():
    base = ["--out", "x"]
    assert parse_args(base).compile is None and parse_args(base).batch_size is None
    assert parse_args(base + ["--no-compile"]).compile is False
    assert parse_args(base + ["--compile"]).compile is True


def test_compile_tuning_passes_inductor_options_and_refuses_a_mode():
    from gobrrr.train.step import compile_options

    assert compile_options(False) is None
    assert compile_options(True) == {"coordinate_descent_tuning": True}
    raw = GPT(GPTConfig.from_name("tiny"))
    assert "tuned kernels" in prepare_model(raw, compile=True, tune=True)  # compiles lazily: nothing runs here
    assert "tuned kernels" not in prepare_model(GPT(GPTConfig.from_name("tiny")), compile=True, backend="aot_eager",
                                                tune=True)  # inductor's options mean nothing to another backend
    with pytest.raises(ValueError, match="cannot be combined"):
        prepare_model(raw, compile=True, tune=True, mode="max-autotune")


@pytest.mark.timeout(240)
def test_compiled_two_gloo_ranks_under_ddp_match_one_eager_rank(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    common = dict(model="tiny", device="cpu", seq_len=32, progress=False, steps=4, grad_accum=2, log_every=2,
                  ckpt_every=4, lr=3e-3)
    train(TrainConfig(**common, batch_size=4, out=str(one)))
    argv = ["--model", "tiny", "--device", "cpu", "--seq-len", "32", "--steps", "4", "--grad-accum", "2",
            "--log-every", "2", "--ckpt-every", "4", "--lr", "3e-3", "--batch-size", "2", "--out", str(two),
            "--compile", "--compile-backend", "aot_eager"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "gobrrr", "train"] + argv
    proc = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch.compile per block" in proc.stderr and "torch.compile + first step:" in proc.stderr
    l1 = {s: r["loss"] for s, r in read_metrics(one / "metrics.jsonl").items()}
    l2 = {s: r["loss"] for s, r in read_metrics(two / "metrics.jsonl").items()}
    assert sorted(l2) == [1, 2, 3, 4]
    torch.testing.assert_close(torch.tensor([l2[s] for s in l1]), torch.tensor(list(l1.values())),
                               rtol=1e-5, atol=1e-6)


def test_underuse_hint_only_when_a_much_larger_batch_fits():
    from gobrrr.train.auto_batch import GB, underuse_hint

    n = 124_000_000  # 124m: 2 GB of weights, gradients and moments
    hint = underuse_hint(8, 1024, int(2 * GB + 8 * 0.6 * GB), 141 * GB, n)
    assert hint.startswith("hint: batch size 8") and "--batch-size 64" in hint  # capped at 64k tokens
    assert "peaked at 6.8 of 141 GB;" in hint  # GB = 1e9 bytes, as the plan: line beside it (issue 30 item 13)
    assert underuse_hint(64, 1024, int(2 * GB + 64 * 0.6 * GB), 141 * GB, n) is None  # at the cap already
    assert underuse_hint(8, 1024, int(100 * GB), 141 * GB, n) is None  # nothing larger fits


@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_compiled_blocks_deliver_gradients_block_by_block_so_ddp_can_overlap(scope):
    # per block: the last block's gradients are ready (its hooks fire) before the first block's backward
    # runs, which lets ddp all-reduce bucket by bucket during backward; one whole-model graph delivers
    # every gradient at the end (the reason prepare_model compiles per block)
    torch.manual_seed(0)
    raw = GPT(GPTConfig.from_name("tiny", n_layer=3))
    prepare_model(raw, compile=True, backend="aot_eager", scope=scope)
    first = list(raw.blocks[0].parameters())
    seen = []
    for p in raw.blocks[-1].parameters():
        p.register_post_accumulate_grad_hook(lambda p: seen.append(any(q.grad is not None for q in first)))
    idx = torch.randint(256, (2, 16))
    _, loss = raw(idx, idx)
    loss.backward()
    assert len(seen) == len(list(raw.blocks[-1].parameters()))
    assert not any(seen) if scope == "blocks" else all(seen)
    assert all(q.grad is not None for q in first)
