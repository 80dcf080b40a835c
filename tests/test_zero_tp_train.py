"""`gobrrr train --tp 2 --zero S` (S = 1, 2) under torchrun: 4 gloo ranks on CPU, dp 2 x tp 2.

For each stage:
  * the per-step losses equal one process's (tp 1, ddp, in-process, the same global batch of 4):
    rtol 1e-5, atol 0 (fp32; tp sums hidden units and the vocabulary, ZeRO the dp ranks, in another
    order);
  * killed after step 5 (the checkpoint is at step 4, every dp x tp rank's pieces through DCP), then
    resumed with --resume at dp 2 x tp 2: every step's loss is bitwise the uninterrupted run's;
  * a copy of the killed run resumed at another layout continues the same losses (rtol 1e-5, atol 0):
    stage 1 in one process without --tp (--batch-size 4), stage 2 at dp 1 x tp 2 (2 ranks,
    --batch-size 4). The weights themselves, exactly, at other layouts: tests/test_zero_tp_ckpt.py.
--tp with --zero 3 (one line, exit 2): tests/test_tp_train.py.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch
from torch.testing import assert_close

from gobrrr.train.cli import TrainConfig, train
from tests.test_tp_train import ENV, ROOT, finish, losses

ARGS = ["--model", "tiny", "--device", "cpu", "--seq-len", "16", "--lr", "3e-3", "--data", "synthetic",
        "--log-every", "1", "--steps", "8", "--ckpt-every", "4", "--no-progress"]
STEPS = range(1, 9)


def start(n: int, args: list[str]) -> subprocess.Popen:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n)]
    return subprocess.Popen(launcher + ["-m", "gobrrr", "train"] + ARGS + args, env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def column(run: dict[int, float]) -> torch.Tensor:
    return torch.tensor([run[s] for s in STEPS], dtype=torch.float64)


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("one_thread")  # the in-process runs beside 4 rank processes on 2 cores
@pytest.mark.parametrize("stage", [1, 2])
def test_tp2_zero_matches_one_process_resumes_bitwise_and_at_another_layout(tmp_path, stage):
    ref, crashed, moved = tmp_path / "ref", tmp_path / "crashed", tmp_path / "moved"
    layout = ["--tp", "2", "--zero", str(stage), "--batch-size", "2"]
    a = start(4, layout + ["--out", str(ref)])  # the two launches overlap their start-up
    b = start(4, layout + ["--out", str(crashed), "--crash-after-step", "5"])
    (rc_a, err_a), (rc_b, err_b) = finish(a), finish(b)
    assert rc_a == 0, err_a[-3000:]
    assert rc_b != 0 and sorted(losses(crashed)) == [1, 2, 3, 4, 5], err_b[-3000:]
    assert (crashed / "checkpoints" / "latest").read_text() == "step-00000004\n"
    shutil.copytree(crashed, moved)

    same = start(4, layout + ["--out", str(crashed), "--resume"])
    if stage == 1:  # tp 2 -> one process, no --tp: the records are the plain model's tensors
        train(TrainConfig(model="tiny", device="cpu", seq_len=16, lr=3e-3, data="synthetic", log_every=1, steps=8,
                          ckpt_every=4, progress=False, zero=1, batch_size=4, out=str(moved), resume=True))
    else:  # dp 2 x tp 2 -> dp 1 x tp 2, the same global batch
        rc, err = finish(start(2, ["--tp", "2", "--zero", "2", "--batch-size", "4", "--out", str(moved), "--resume"]))
        assert rc == 0, err[-3000:]
    rc, err = finish(same)
    assert rc == 0, err[-3000:]
    assert losses(crashed) == losses(ref)  # == on floats: bit for bit, steps 1..8
    assert_close(column(losses(moved)), column(losses(ref)), rtol=1e-5, atol=0)

    one = train(TrainConfig(model="tiny", device="cpu", seq_len=16, lr=3e-3, data="synthetic", log_every=1, steps=8,
                            ckpt_every=8, progress=False, batch_size=4, out=str(tmp_path / "one")))
    assert_close(column(losses(ref)), column(one["losses"]), rtol=1e-5, atol=0)

