"""`gobrrr train` on a GPU: bf16 autocast, fused AdamW, the Prefetcher and ddp at world size 1."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gobrrr.checkpoint import load_checkpoint
from gobrrr.train import TrainConfig, main, peak_flops, read_metrics, train

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
    ckpt = load_checkpoint(out / "checkpoint.pt")
    assert ckpt["step"] == 40 and ckpt["rng"]["cuda"] is not None
    assert all(t.device.type == "cpu" for t in ckpt["model"].values())  # loaded with map_location="cpu"


def test_killed_cuda_run_resumes_to_the_same_losses(tmp_path):
    argv = ["--model", "tiny", "--device", "cuda", "--steps", "12", "--batch-size", "8", "--seq-len", "64",
            "--lr", "3e-3", "--log-every", "2", "--ckpt-every", "6", "--no-progress"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert main(argv + ["--out", str(ref)]) == 0
    proc = subprocess.run([sys.executable, "-m", "gobrrr", "train", *argv, "--out", str(cut), "--crash-after-step", "8"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert load_checkpoint(cut / "checkpoint.pt")["step"] == 6
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
