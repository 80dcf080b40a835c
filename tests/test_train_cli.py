"""`gobrrr train` as a newcomer meets it (issue 30): every refusal is one line before anything is written,
a damaged checkpoint is one line on every layout, an error under torchrun is printed once, and
--no-progress still says how the run goes.

CPU only, the tiny model; the two torchrun cases start 2 and 3 gloo ranks."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gobrrr.train.checkpoint_io import clip
from gobrrr.train.cli import TrainConfig, main, train
from tests.test_faults import one_error_line

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
BASE = ["--model", "tiny", "--device", "cpu", "--batch-size", "4", "--no-progress"]
TINY = BASE + ["--seq-len", "32"]
SMALL = dict(model="tiny", device="cpu", batch_size=4, seq_len=32, progress=False)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one OpenMP thread


def torchrun(n: int, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(TORCHRUN + ["--nproc-per-node", str(n), "-m", "gobrrr", "train", *args], env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=240)


def launched_error_line(text: str) -> str:
    """The one `gobrrr train: error:` line of a torchrun launch; torchrun prints its own ChildFailedError traceback
    (its frames only), no rank may print one."""
    launcher = ("torch/distributed/run.py", "torch/distributed/launcher/", "torch/distributed/elastic/", "<frozen runpy>")
    frames = [ln for ln in text.splitlines() if ln.strip().startswith('File "') and not any(w in ln for w in launcher)]
    assert not frames, text
    lines = [ln for ln in text.splitlines() if ln.startswith("gobrrr train: error: ")]
    assert len(lines) == 1, text
    return lines[0]


def exits(text: str, n: int) -> None:
    """Every rank ended with exit code 2, or was stopped by torchrun (SIGTERM) once another had left with 2: the
    launcher's summary lists each rank's code."""
    codes = [ln.split(":")[1].split()[0] for ln in text.splitlines() if ln.strip().startswith("exitcode  :")]
    assert len(codes) == n and "2" in codes and set(codes) <= {"2", "-15"}, text[-3000:]


# ---------------------------------------------------------------- refused before anything is touched

@pytest.mark.parametrize("args,words", [
    (["--seq-len", "100000"], "--seq-len 100000 exceeds model tiny's block_size 64"),
    (["--tp", "2"], "tp=2 does not divide the world size 1"),
    (["--sequence-parallel"], "--sequence-parallel shards activations over the tensor-parallel ranks"),
    (["--tp", "2", "--zero", "3"], "--tp with --zero 3 is not built yet"),
])
def test_refusals_leave_no_folder(tmp_path, capsys, args, words):
    out = tmp_path / "run"
    rc = main(BASE + ["--steps", "2", "--out", str(out)] + args)
    line = one_error_line(capsys.readouterr().err, "train")
    assert rc == 2 and words in line, line
    assert not out.exists()  # not even run.lock


def test_empty_out_and_resume_of_nothing_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(TINY + ["--steps", "2", "--out", ""]) == 2
    assert "--out is empty" in one_error_line(capsys.readouterr().err, "train")
    assert list(tmp_path.iterdir()) == []  # nothing trained into the current directory
    assert main(TINY + ["--steps", "2", "--out", str(tmp_path / "gone"), "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "gone does not exist, so there is no run to continue" in line and "without --resume" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_be_made_does_not_suggest_resume(capsys):
    assert main(TINY + ["--steps", "2", "--out", "/proc/nope"]) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "cannot create the run folder /proc/nope" in line and "--resume" not in line, line


def test_a_run_that_fails_before_writing_removes_the_folder_it_made(tmp_path, monkeypatch):
    import gobrrr.train.loop as loop
    from gobrrr.train.checks import TrainError

    def fails(*a, **k):
        raise TrainError("a failure after the folder was claimed")

    monkeypatch.setattr(loop, "setup_model", fails)
    with pytest.raises(TrainError, match="after the folder was claimed"):
        train(TrainConfig(**SMALL, steps=2, out=str(tmp_path / "new")))
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a folder the user made stays, with the lock the run took
    with pytest.raises(TrainError):
        train(TrainConfig(**SMALL, steps=2, out=str(tmp_path / "mine")))
    assert (tmp_path / "mine").is_dir()


# ---------------------------------------------------------------- what a run prints

def test_no_progress_prints_plain_step_lines_and_the_final_line(tmp_path, capsys):
    assert main(TINY + ["--steps", "4", "--log-every", "2", "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err.splitlines()
    steps = [ln for ln in err if ln.startswith("step ")]
    assert [ln.split()[1] for ln in steps] == ["2/4", "4/4"] and all("loss" in ln for ln in steps), err
    assert err[-1].startswith("done: step 4, loss "), err
    assert main(TINY + ["--steps", "4", "--out", str(tmp_path / "run"), "--resume"]) == 0
    assert capsys.readouterr().err == f"gobrrr train: {tmp_path / 'run'} is already at step 4; pass --steps > 4 " \
                                      "to train further\n"


def test_clip_cuts_between_words():
    text = "PytorchStreamReader failed reading zip archive: failed finding central directory " * 5
    cut = clip(text, 100)
    assert len(cut) <= 103 and cut.endswith("...") and text.startswith(cut[:-3])
    assert text[len(cut) - 3] == " "  # the next character of the original is a space: no word was cut
    assert clip("short text") == "short text"


# ---------------------------------------------------------------- damaged checkpoints: one line

def _truncate(run: Path, name: str) -> Path:
    step = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    victim = next(p for p in sorted(step.iterdir()) if p.name.endswith(name))
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    return victim


def test_a_truncated_checkpoint_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    train(TrainConfig(**SMALL, steps=2, ckpt_every=2, out=str(run)))
    args = TINY + ["--steps", "4", "--out", str(run), "--resume"]
    victim = _truncate(run, ".distcp")
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "could not be read" in line and "damaged or incomplete" in line, line
    victim.unlink()
    train(TrainConfig(**SMALL, steps=2, ckpt_every=2, out=str(tmp_path / "again")))
    _truncate(tmp_path / "again", "trainer.pt")
    assert main(TINY + ["--steps", "4", "--out", str(tmp_path / "again"), "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "trainer.pt could not be read" in line and "damaged" in line, line


@pytest.mark.timeout(300)
def test_a_truncated_shard_under_torchrun_is_one_line_and_every_rank_exits_2(tmp_path):
    run = tmp_path / "run"
    args = ["--model", "tiny", "--device", "cpu", "--batch-size", "4", "--seq-len", "16", "--data", "synthetic",
            "--no-progress", "--tp", "2", "--zero", "1", "--ckpt-every", "2", "--out", str(run)]
    proc = torchrun(2, args + ["--steps", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    _truncate(run, "__1_0.distcp")  # rank 1's pieces
    proc = torchrun(2, args + ["--steps", "4", "--resume"])
    line = launched_error_line(proc.stdout + proc.stderr)
    assert proc.returncode != 0 and "could not be read" in line and "damaged or incomplete" in line, line
    exits(proc.stderr, 2)


@pytest.mark.timeout(300)
def test_an_error_under_torchrun_is_printed_once(tmp_path):
    proc = torchrun(3, TINY + ["--steps", "2", "--tp", "2", "--out", str(tmp_path / "run")])
    line = launched_error_line(proc.stdout + proc.stderr)
    assert proc.returncode != 0 and line == ("gobrrr train: error: tp=2 does not divide the world size 3; choose a tp "
                                             "that divides 3"), line
    exits(proc.stderr, 3)
    assert not (tmp_path / "run").exists()
