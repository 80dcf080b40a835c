"""`gobrrr train --tp 2` under torchrun (2 gloo ranks, CPU, dp 1 x tp 2).

  * the per-step losses equal one process's (tp = 1, in-process) over the same batches: rtol 1e-5
    (fp32; TP sums the hidden units and the vocabulary in another order);
  * killed after step 5 (the checkpoint is at step 4, written by both ranks through DCP), then
    resumed with --resume: every step's loss and the final weights are bitwise those of the
    uninterrupted tp = 2 run;
  * a --tp that does not divide the world is one line with exit 2 (heads: tests/test_tp.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from gobrrr.train import TrainConfig, read_metrics, train

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
ARGS = ["--model", "tiny", "--device", "cpu", "--batch-size", "4", "--seq-len", "32", "--no-progress", "--steps", "8",
        "--ckpt-every", "4", "--log-every", "1"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def run(args: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    launcher = TORCHRUN[:-1] + [str(nproc)]
    return subprocess.run(launcher + ["-m", "gobrrr", "train"] + ARGS + args, env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def losses(out: Path) -> dict[int, float]:
    return {s: r["loss"] for s, r in read_metrics(out / "metrics.jsonl").items()}


def test_tp2_matches_one_process_and_resumes_bitwise(tmp_path):
    ref, crashed = tmp_path / "ref", tmp_path / "crashed"
    proc = run(["--tp", "2", "--out", str(ref)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run(["--tp", "2", "--out", str(crashed), "--crash-after-step", "5"])
    assert proc.returncode != 0
    assert sorted(losses(crashed)) == [1, 2, 3, 4, 5]
    proc = run(["--tp", "2", "--out", str(crashed), "--resume"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert losses(crashed) == losses(ref)  # bitwise, every step 1..8

    torch.set_num_threads(1)
    one = train(TrainConfig(model="tiny", device="cpu", batch_size=4, seq_len=32, progress=False, steps=8,
                            ckpt_every=4, log_every=1, out=str(tmp_path / "one")))
    torch.testing.assert_close(torch.tensor([losses(ref)[s] for s in range(1, 9)]),
                               torch.tensor([one["losses"][s] for s in range(1, 9)]), rtol=1e-5, atol=0)


def test_bad_tp_is_one_line(tmp_path, capsys):
    from gobrrr.train import main

    torch.set_num_threads(1)
    assert main(ARGS + ["--tp", "3", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gobrrr train: error: tp=3 does not divide the world size 1; choose a tp that divides 1"]
