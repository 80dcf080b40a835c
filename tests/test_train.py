"""`gobrrr train` on CPU: the loss goes down, a killed run resumes bit for bit with each step logged
once, a kill inside a checkpoint write loses nothing, and 2 gloo ranks under torchrun match 1 rank
over the same global batch."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gobrrr.train.checkpoint_io import CheckpointError, load_checkpoint, save_checkpoint, stale_temporaries
from gobrrr.train.checkpoints import read
from gobrrr.train.cli import TrainConfig, TrainError, lr_at, main, read_metrics, train

ROOT = Path(__file__).resolve().parent.parent
# one OpenMP thread per process: 2 shared cores, and two threads spinning against each other
# (or against another rank) are 10x slower than one
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
SMALL = dict(model="tiny", device="cpu", batch_size=4, seq_len=32, progress=False)
SMALL_ARGS = ["--model", "tiny", "--device", "cpu", "--batch-size", "4", "--seq-len", "32", "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one OpenMP thread


def cli(args: list[str], *, launcher: list[str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = (launcher or [sys.executable]) + ["-m", "gobrrr", "train"] + args
    return subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def losses(out: Path) -> dict[int, float]:
    return {s: r["loss"] for s, r in read_metrics(out / "metrics.jsonl").items()}


def test_lr_schedule_warms_up_then_decays_to_min():
    cfg = TrainConfig(steps=100, lr=1.0, min_lr=0.1, warmup=10)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(55, cfg) == pytest.approx(0.55)
    assert lr_at(99, cfg) == pytest.approx(0.1, abs=1e-3)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 99))


def test_tiny_run_loss_goes_down(tmp_path):
    out = tmp_path / "run"
    result = train(TrainConfig(**SMALL, steps=40, lr=3e-3, log_every=5, ckpt_every=40, out=str(out)))
    got = losses(out)
    assert sorted(got) == list(range(1, 41)) and got == result["losses"]
    first, last = sum(got[s] for s in range(1, 6)) / 5, sum(got[s] for s in range(36, 41)) / 5
    assert first > 5.0 and last < 0.75 * first, (first, last)
    rec = read_metrics(out / "metrics.jsonl")[40]
    assert rec["tokens_per_s"] > 0 and rec["lr"] == pytest.approx(lr_at(39, TrainConfig(steps=40, lr=3e-3)))
    assert rec["mfu"] is None  # no peak FLOP/s for a CPU
    assert read(out)["trainer"]["step"] == 40 and read(out)["manifest"]["layout"] == "ddp"


def test_killed_run_resumes_bitwise_and_logs_each_step_once(tmp_path):
    args = dict(SMALL, steps=12, ckpt_every=4, log_every=2, lr=3e-3)
    ref, crashed = tmp_path / "ref", tmp_path / "crashed"
    train(TrainConfig(**args, out=str(ref)))

    # the same run, SIGKILLed right after step 7: the checkpoint is from step 4, metrics reach step 6
    argv = SMALL_ARGS + ["--steps", "12", "--ckpt-every", "4", "--log-every", "2", "--lr", "3e-3",
                         "--out", str(crashed)]
    proc = cli(argv + ["--crash-after-step", "7"])
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert read(crashed)["trainer"]["step"] == 4
    before = (crashed / "metrics.jsonl").read_text().splitlines()
    assert sorted(losses(crashed)) == [1, 2, 3, 4, 5, 6]

    with pytest.raises(TrainError, match="pass --resume"):
        train(TrainConfig(**args, out=str(crashed)))
    result = train(TrainConfig(**args, out=str(crashed), resume=True))
    assert sorted(result["losses"]) == list(range(5, 13))  # it restarted after the step-4 checkpoint

    after = [json.loads(line) for line in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert [json.loads(line) for line in before[:4]] == after[:4]  # steps 1-4 untouched
    steps = [r["step"] for r in after if "event" not in r]
    assert steps == list(range(1, 13))  # each step once: 5 and 6 of the killed run were cut on resume
    events = [r for r in after if "event" in r]
    assert len(events) == 1 and events[0]["event"] == "resume" and events[0]["step"] == 4
    assert events[0]["cut_records"] == 2
    assert losses(crashed) == losses(ref)  # bitwise: == on floats, every step 1..12
    a, b = read(ref), read(crashed)
    assert a["model"].keys() == b["model"].keys() and a["optim"].keys() == b["optim"].keys()
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), name
    for name, st in a["optim"].items():
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(v, b["optim"][name][k]) for k, v in st.items()), name


def test_resume_refuses_changed_settings_and_finished_runs_stay_put(tmp_path, capsys):
    out = tmp_path / "run"
    train(TrainConfig(**SMALL, steps=3, ckpt_every=3, out=str(out)))
    with pytest.raises(TrainError, match=r"--lr 0.001 -> 0.01"):
        train(TrainConfig(**SMALL, steps=3, out=str(out), resume=True, lr=1e-2))
    with pytest.raises(TrainError, match="global batch"):
        train(TrainConfig(**{**SMALL, "batch_size": 2}, steps=3, out=str(out), resume=True))
    metrics = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert train(TrainConfig(**SMALL, steps=3, out=str(out), resume=True))["losses"] == {}
    assert capsys.readouterr().err == f"gobrrr train: {out} is already at step 3; pass --steps > 3 to train further\n"
    assert (out / "metrics.jsonl").read_text() == metrics  # a finished run stays as it was
    assert main(["--out", str(tmp_path / "x"), "--steps", "0"]) == 2


STATE_A = {"step": 1, "w": torch.arange(1000.0)}


def test_kill_during_checkpoint_write_leaves_the_previous_one(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(STATE_A, path)
    # a child process starts saving a new checkpoint and is SIGKILLed halfway through the bytes
    script = textwrap.dedent(f"""
        import io, os, signal, torch
        from gobrrr.train.checkpoint_io import save_checkpoint
        real_save = torch.save
        def dying_save(obj, f, *a, **k):
            buf = io.BytesIO(); real_save(obj, buf)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2]); f.flush(); os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = dying_save
        save_checkpoint({{"step": 2, "w": torch.zeros(1000)}}, {str(path)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    stale = stale_temporaries(path)
    assert len(stale) == 1 and stale[0].stat().st_size > 0  # the half-written file it left
    got = load_checkpoint(path)
    assert got["step"] == 1 and torch.equal(got["w"], STATE_A["w"])
    save_checkpoint({"step": 3, "w": torch.ones(3)}, path)  # the next save sweeps the leftover
    assert stale_temporaries(path) == [] and load_checkpoint(path)["step"] == 3


def test_write_error_raises_clearly_and_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(STATE_A, path)

    def full_disk(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="disk is full") as e:
        save_checkpoint({"step": 2}, path)
    assert "No space left on device" in str(e.value) and "untouched" in str(e.value)
    monkeypatch.undo()
    assert stale_temporaries(path) == []
    assert torch.equal(load_checkpoint(path)["w"], STATE_A["w"])
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="damaged"):
        load_checkpoint(path)


@pytest.mark.timeout(240)
def test_two_gloo_ranks_under_torchrun_match_one_rank(tmp_path):
    # global micro-batch of 4 rows, 2 micro-steps per step: 1 rank x 4 rows vs 2 ranks x 2 rows
    one, two = tmp_path / "one", tmp_path / "two"
    common = dict(model="tiny", device="cpu", seq_len=32, progress=False, steps=6, grad_accum=2,
                  log_every=3, ckpt_every=6, lr=3e-3)
    train(TrainConfig(**common, batch_size=4, out=str(one)))
    argv = ["--model", "tiny", "--device", "cpu", "--seq-len", "32", "--no-progress", "--steps", "6",
            "--grad-accum", "2", "--log-every", "3", "--ckpt-every", "6", "--lr", "3e-3",
            "--batch-size", "2", "--out", str(two)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = cli(argv, launcher=torchrun, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    l1, l2 = losses(one), losses(two)
    assert sorted(l2) == list(range(1, 7))
    torch.testing.assert_close(torch.tensor([l2[s] for s in l1]), torch.tensor(list(l1.values())),
                               rtol=1e-5, atol=1e-6)
    c1, c2 = read(one), read(two)
    assert c2["trainer"]["world_size"] == 2 and c2["manifest"]["world_size"] == 2
    for name, t in c1["model"].items():
        torch.testing.assert_close(c2["model"][name], t, rtol=1e-4, atol=1e-5)


def test_a_failed_checkpoint_write_stops_the_run_with_a_clear_error(tmp_path, monkeypatch, capsys):
    import gobrrr.train.checkpoints as checkpoints

    def no_space(state, path):
        raise CheckpointError(f"could not write checkpoint {path}: No space left on device; the previous "
                              "checkpoint (if any) is untouched; the disk is full")

    monkeypatch.setattr(checkpoints, "save_checkpoint", no_space)  # trainer.pt, after the records
    argv = SMALL_ARGS + ["--steps", "4", "--ckpt-every", "2", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "gobrrr train: error:" in err and "No space left on device" in err
    assert sorted(losses(tmp_path / "run")) == [1, 2]  # it stopped at the first checkpoint
    assert not (tmp_path / "run" / "checkpoints" / "latest").exists()  # and never pointed at a half-made one
