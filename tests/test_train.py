"""`gobrrr train` on CPU: the loss goes down, a killed run resumes bit for bit, a kill inside a
checkpoint write loses nothing, metrics are appended, and 2 gloo ranks under torchrun match
1 rank over the same global batch."""
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
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 40


def test_killed_run_resumes_bitwise_and_metrics_are_appended(tmp_path):
    args = dict(SMALL, steps=12, ckpt_every=4, log_every=2, lr=3e-3)
    ref, crashed = tmp_path / "ref", tmp_path / "crashed"
    train(TrainConfig(**args, out=str(ref)))

    # the same run, SIGKILLed right after step 7: the checkpoint is from step 4, metrics reach step 6
    argv = SMALL_ARGS + ["--steps", "12", "--ckpt-every", "4", "--log-every", "2", "--lr", "3e-3",
                         "--out", str(crashed)]
    proc = cli(argv + ["--crash-after-step", "7"])
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert load_checkpoint(crashed / "checkpoint.pt")["step"] == 4
    before = (crashed / "metrics.jsonl").read_text()
    assert sorted(losses(crashed)) == [1, 2, 3, 4, 5, 6]

    with pytest.raises(TrainError, match="pass --resume"):
        train(TrainConfig(**args, out=str(crashed)))
    result = train(TrainConfig(**args, out=str(crashed), resume=True))
    assert sorted(result["losses"]) == list(range(5, 13))  # it restarted after the step-4 checkpoint

    after = (crashed / "metrics.jsonl").read_text()
    assert after.startswith(before)  # appended, never truncated
    events = [json.loads(line) for line in after.splitlines() if '"event"' in line]
    assert events and events[0]["event"] == "resume" and events[0]["step"] == 4
    assert losses(crashed) == losses(ref)  # bitwise: == on floats, every step 1..12
    a, b = load_checkpoint(ref / "checkpoint.pt"), load_checkpoint(crashed / "checkpoint.pt")
    for name, t in a["model"].items():
        assert torch.equal(t, b["model"][name]), name
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_resume_refuses_changed_settings_and_finished_runs_stay_put(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(**SMALL, steps=3, ckpt_every=3, out=str(out)))
    with pytest.raises(TrainError, match=r"--lr 0.001 -> 0.01"):
        train(TrainConfig(**SMALL, steps=3, out=str(out), resume=True, lr=1e-2))
    with pytest.raises(TrainError, match="global batch"):
        train(TrainConfig(**{**SMALL, "batch_size": 2}, steps=3, out=str(out), resume=True))
    n_lines = len((out / "metrics.jsonl").read_text().splitlines())
    assert train(TrainConfig(**SMALL, steps=3, out=str(out), resume=True))["losses"] == {}
    assert len((out / "metrics.jsonl").read_text().splitlines()) == n_lines + 1  # only the resume marker
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
    c1, c2 = load_checkpoint(one / "checkpoint.pt"), load_checkpoint(two / "checkpoint.pt")
    assert c2["world_size"] == 2
    for name, t in c1["model"].items():
        torch.testing.assert_close(c2["model"][name], t, rtol=1e-4, atol=1e-5)


def test_a_failed_checkpoint_write_stops_the_run_with_a_clear_error(tmp_path, monkeypatch, capsys):
    import gobrrr.train.cli as train_mod

    def no_space(state, path):
        raise CheckpointError(f"could not write checkpoint {path}: No space left on device; the previous "
                              "checkpoint (if any) is untouched; the disk is full")

    monkeypatch.setattr(train_mod, "save_checkpoint", no_space)
    argv = SMALL_ARGS + ["--steps", "4", "--ckpt-every", "2", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "gobrrr train: error:" in err and "No space left on device" in err
    assert sorted(losses(tmp_path / "run")) == [1, 2]  # it stopped at the first checkpoint
