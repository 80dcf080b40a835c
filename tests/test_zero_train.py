"""`gobrrr train --zero S` on CPU under torchrun (gloo): a killed ZeRO-2 run resumes bit for bit (without
ShardedTensor's deprecation warnings, which are torch's business, not the user's), and a ZeRO-3 run at
4 ranks resumed at 2 ranks (ZeRO-1, same global batch) continues the same losses."""
from __future__ import annotations

import sys

import pytest
import torch

from gobrrr.train.cli import TrainConfig, train
from tests.test_train import cli, losses

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
ARGS = ["--model", "tiny", "--device", "cpu", "--seq-len", "16", "--lr", "3e-3", "--data", "synthetic",
        "--log-every", "1"]


def torchrun(n: int, argv: list[str], progress: bool = False):
    quiet = [] if progress else ["--no-progress"]
    return cli(ARGS + quiet + argv, launcher=TORCHRUN + ["--nproc-per-node", str(n)], timeout=200)


@pytest.mark.timeout(300)
def test_zero2_killed_and_resumed_is_bitwise_the_uninterrupted_run(tmp_path):
    ref, crashed = tmp_path / "ref", tmp_path / "crashed"
    common = ["--zero", "2", "--steps", "6", "--ckpt-every", "3", "--batch-size", "2"]
    proc = torchrun(2, common + ["--out", str(ref)], progress=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "zero stage 2, rank 0 of 2" in proc.stderr and "formula" in proc.stderr  # the memory report
    proc = torchrun(2, common + ["--out", str(crashed), "--crash-after-step", "4"])
    assert proc.returncode != 0
    assert sorted(losses(crashed)) == [1, 2, 3, 4]
    proc = torchrun(2, common + ["--out", str(crashed), "--resume"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr  # ShardedTensor's FutureWarnings (4 per resume before)
    assert losses(crashed) == losses(ref)  # == on floats: bit for bit, steps 1..6


@pytest.mark.timeout(300)
def test_zero3_at_4_ranks_resumed_at_2_ranks_zero1_continues(tmp_path):
    run = tmp_path / "run"
    proc = torchrun(4, ["--zero", "3", "--steps", "6", "--ckpt-every", "3", "--batch-size", "1", "--out", str(run),
                        "--crash-after-step", "4"])
    assert proc.returncode != 0 and sorted(losses(run)) == [1, 2, 3, 4]
    proc = torchrun(2, ["--zero", "1", "--steps", "6", "--ckpt-every", "3", "--batch-size", "2", "--out", str(run),
                        "--resume"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ref = train(TrainConfig(model="tiny", device="cpu", seq_len=16, progress=False, lr=3e-3, data="synthetic",
                            log_every=1, steps=6, ckpt_every=6, batch_size=4, out=str(tmp_path / "ref")))
    got = losses(run)
    assert sorted(got) == list(range(1, 7))
    torch.testing.assert_close(torch.tensor([got[s] for s in range(1, 7)]),
                               torch.tensor([ref["losses"][s] for s in range(1, 7)]), rtol=1e-5, atol=0)
