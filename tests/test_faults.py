"""Fault injection, as a careless or unlucky user meets it: full disks, killed launchers, two runs in
one folder, a dead rank, a wrong port, wrong arguments. Each case asserts the exit code, a one-line
`gobrrr <cmd>: error: ...` naming the problem (no traceback), and that no file is lost or torn.

Real processes where it matters: `gobrrr train` subprocesses with RLIMIT_FSIZE (the portable stand-in
for a full disk: writes past the limit fail with EFBIG), a real torchrun launcher SIGKILLed, two real
runs into one folder, two ranks with different MASTER_PORTs. Every subprocess has a timeout and is
killed in a `finally`. CPU only, the tiny model, a few steps.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gobrrr.train import rundir
from gobrrr.train.checkpoints import read
from gobrrr.train.cli import TrainConfig, lr_at, main, read_metrics, train

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
ENV.pop("GOBRRR_LIFELINE", None)
TINY = ["--model", "tiny", "--device", "cpu", "--batch-size", "4", "--seq-len", "32", "--no-progress"]
SMALL = dict(model="tiny", device="cpu", batch_size=4, seq_len=32, progress=False)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one OpenMP thread


def one_error_line(text: str, cmd: str) -> str:
    """The single `gobrrr <cmd>: error: ...` line of `text` (torch's C++ log lines aside); no traceback."""
    assert "Traceback" not in text, text
    lines = [ln for ln in text.splitlines() if ln.startswith(f"gobrrr {cmd}: error: ")]
    assert len(lines) == 1, text
    return lines[0]


def start(args: list[str], *, env: dict | None = None, log: Path, launcher: list[str] | None = None,
          limit_bytes: int | None = None) -> subprocess.Popen:
    """`gobrrr train ARGS` in its own session, output to a file (never a pipe that could fill up)."""
    def limits():
        if limit_bytes is not None:  # a "full disk": writes past this size fail with EFBIG
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    out = open(log, "w")
    try:
        return subprocess.Popen((launcher or [sys.executable]) + ["-m", "gobrrr", "train", *args], cwd=ROOT,
                                env={**ENV, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=limits)
    finally:
        out.close()


def finish(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        stop(proc)


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def run_cli(args: list[str], tmp: Path, timeout: float = 90, **kw) -> tuple[int, str]:
    log = tmp / f"log{time.monotonic_ns()}.txt"
    rc = finish(start(args, log=log, **kw), timeout)
    return rc, log.read_text()


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def logged_steps(out: Path) -> int:
    try:
        return max(read_metrics(out / "metrics.jsonl"), default=0)
    except (OSError, ValueError):
        return 0


def whole_lines(path: Path) -> list[dict]:
    """Every line of a JSONL file parses, and the file ends with a newline: nothing torn."""
    text = path.read_text()
    assert text.endswith("\n"), text[-200:]
    return [json.loads(ln) for ln in text.splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- wrong arguments: one line, exit 2

@pytest.mark.parametrize("flag,value,name", [("--lr", "-1", "--lr"), ("--lr", "nan", "--lr"), ("--lr", "inf", "--lr"),
                                             ("--grad-clip", "-1", "--grad-clip"), ("--seq-len", "0", "--seq-len"),
                                             ("--min-lr", "1", "--min-lr")])
def test_train_refuses_bad_numbers_in_one_line(tmp_path, capsys, flag, value, name):
    rc = main(TINY + ["--steps", "2", "--out", str(tmp_path / "run"), flag, value])
    line = one_error_line(capsys.readouterr().err, "train")
    assert rc == 2 and name in line and value in line, line
    assert not (tmp_path / "run").exists()  # refused before anything was written


@contextlib.contextmanager
def read_only_folder(tmp: Path):
    """A folder nobody may write into: a read-only tmpfs as root (root ignores permission bits), else chmod."""
    path = tmp / "ro"
    path.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                          capture_output=True).returncode != 0:
            pytest.skip("root without mount rights: no read-only folder to test with")
        try:
            yield path
        finally:
            subprocess.run(["umount", str(path)], capture_output=True)
    else:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)


def test_train_out_that_is_a_file_under_a_file_or_read_only(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for out, words in ((afile, "is a file"), (afile / "sub", "which is a file")):
        assert main(TINY + ["--steps", "2", "--out", str(out)]) == 2
        assert words in one_error_line(capsys.readouterr().err, "train")
    assert afile.read_text() == "mine"
    with read_only_folder(tmp_path) as ro:
        for out in (ro, ro / "run"):
            assert main(TINY + ["--steps", "2", "--out", str(out)]) == 2
            line = one_error_line(capsys.readouterr().err, "train")
            assert str(ro) in line and "read-only" in line, line


def test_dist_environment_errors_name_the_variable(tmp_path, capsys, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GOBRRR_DIST_TIMEOUT_S", "abc")
    assert main(TINY + ["--steps", "2", "--out", str(tmp_path / "a")]) == 2
    assert "GOBRRR_DIST_TIMEOUT_S='abc'" in one_error_line(capsys.readouterr().err, "train")
    monkeypatch.delenv("GOBRRR_DIST_TIMEOUT_S")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "notaport")
    assert main(TINY + ["--steps", "2", "--out", str(tmp_path / "b")]) == 2
    assert "MASTER_PORT='notaport'" in one_error_line(capsys.readouterr().err, "train")


@pytest.mark.parametrize("args,words", [
    (["copy", "--device", "tpu"], "--device 'tpu'"), (["copy", "--sizes", "-1"], "--sizes"),
    (["comm", "--dtype", "int7"], "--dtype 'int7'"), (["ddp", "--model", "nope"], "--model 'nope'"),
    (["p2p", "--bytes", "lots"], "--bytes 'lots'"), (["syncwatch", "--steps", "0"], "--steps")])
def test_bench_arguments_fail_in_one_line(capsys, args, words):
    from gobrrr.cli import main as cli

    with pytest.raises(SystemExit) as info:
        cli(["bench", *args])
    line = one_error_line(capsys.readouterr().err, f"bench {args[0]}")
    assert info.value.code == 2 and words in line, line


def test_bench_help_lists_the_benchmarks(capsys):
    from gobrrr.cli import BENCHES
    from gobrrr.cli import main as cli

    assert cli(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    assert "unknown" not in text and all(f"  {name} " in text for name in BENCHES), text
    assert cli(["bench"]) == 2
    assert "no benchmark named" in one_error_line(capsys.readouterr().err, "bench")


def test_quick_bench_runs_never_write_the_committed_results(tmp_path, monkeypatch, capsys):
    import types

    from gobrrr import cli
    from gobrrr.bench import common, copy_bw

    monkeypatch.delenv("GOBRRR_BENCH_RESULTS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "gobrrr" / "bench-results"
    committed = {p: p.read_bytes() for p in common.RESULTS_DIR.glob("*.jsonl")}
    assert common.results_dir(quick=True) == cache
    assert common.results_dir(quick=True, results=tmp_path / "mine") == tmp_path / "mine"
    assert common.results_dir() == common.RESULTS_DIR  # a real run: the committed records
    assert copy_bw.main(["--quick", "--sizes", "0.01"]) == 0  # python -m gobrrr.bench.copy_bw --quick
    assert len(whole_lines(cache / "copy.jsonl")) == 1
    assert copy_bw.main(["--quick", "--sizes", "0.01", "--results", str(tmp_path / "asked")]) == 0
    assert len(whole_lines(tmp_path / "asked" / "copy.jsonl")) == 1
    # any benchmark run through `gobrrr bench NAME --quick`, even one that passes no quick= to record()
    naive = types.ModuleType("bench_naive_for_test")
    naive.main = lambda argv: bool(common.record("naive", config={"argv": argv})) and 0
    monkeypatch.setitem(sys.modules, "bench_naive_for_test", naive)
    monkeypatch.setitem(cli.BENCHES, "naive", "bench_naive_for_test")
    assert cli.main(["bench", "naive", "--quick"]) == 0
    assert len(whole_lines(cache / "naive.jsonl")) == 1 and "GOBRRR_BENCH_RESULTS" not in os.environ
    assert {p: p.read_bytes() for p in common.RESULTS_DIR.glob("*.jsonl")} == committed
    assert not (common.RESULTS_DIR / "naive.jsonl").exists()


# ---------------------------------------------------------------- checkpoints that do not fit

def test_resume_refuses_misfit_and_poisoned_checkpoints_in_one_line(tmp_path, capsys, monkeypatch):
    from gobrrr.models import gpt

    out = tmp_path / "run"
    train(TrainConfig(**SMALL, steps=2, ckpt_every=2, out=str(out)))
    args = TINY + ["--steps", "4", "--out", str(out), "--resume"]
    tiny = gpt._CONFIGS["tiny"]

    # the checkpoint's records against a model of another shape, or one with more parameters
    monkeypatch.setitem(gpt._CONFIGS, "tiny", gpt.GPTConfig(**{**tiny.__dict__, "n_embd": 32}))
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "does not fit this model" in line and "size mismatch" in line and "model/wte.weight" in line, line
    monkeypatch.setitem(gpt._CONFIGS, "tiny", gpt.GPTConfig(**{**tiny.__dict__, "n_layer": 3}))
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "does not fit this model" in line and "missing model/blocks.2." in line, line
    monkeypatch.setitem(gpt._CONFIGS, "tiny", tiny)

    trainer = out / "checkpoints" / "step-00000002" / "trainer.pt"
    good = trainer.read_bytes()

    class Poison:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"format": "gobrrr-train-v1", "x": Poison()}, trainer)
    assert main(args) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "do not load it" in line and "weights_only" not in line and "pwned" not in line, line
    trainer.write_bytes(good)
    assert main(args) == 0  # the good files still resume


def test_a_run_of_gobrrr_0_1_resumes_from_checkpoint_pt_or_is_refused_in_one_line(tmp_path, capsys):
    """checkpoint.pt (0.1's ddp run) is read, bit for bit, and replaced by checkpoints/ at the next save;
    zero_checkpoints/ and tp_latest.pt are refused, saying how to go on. The legacy file is made as 0.1
    wrote it: a whole state_dict pair and the trainer's state, from the same model at step 2."""
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.train.checkpoint_io import save_checkpoint
    from gobrrr.train.layout import make_optimizer

    ref, old = tmp_path / "ref", tmp_path / "old"
    common = dict(SMALL, steps=4, ckpt_every=2, log_every=1)
    train(TrainConfig(**common, out=str(ref)))
    rc, text = run_cli(TINY + ["--steps", "4", "--ckpt-every", "2", "--log-every", "1", "--out", str(old),
                               "--crash-after-step", "3"], tmp_path)  # the same run, killed after step 3
    assert rc == -signal.SIGKILL, text
    state = read(old)
    raw = GPT(GPTConfig.from_name("tiny"))
    opt = make_optimizer(raw, TrainConfig(**common), torch.device("cpu"))
    raw.load_state_dict(state["model"], strict=False)  # lm_head.weight: tied to wte.weight, saved once
    for name, p in raw.named_parameters():
        opt.state[p] = {k: v.clone() for k, v in state["optim"][name].items()}
    legacy = {**state["trainer"], "model": raw.state_dict(), "optimizer": opt.state_dict()}
    import shutil

    shutil.rmtree(old / "checkpoints")
    save_checkpoint(legacy, old / "checkpoint.pt")
    assert main(TINY + ["--steps", "4", "--ckpt-every", "2", "--log-every", "1", "--out", str(old), "--zero", "1",
                        "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err, "train")
    assert "gobrrr 0.1's layout (checkpoint.pt)" in line and "without --zero and --tp" in line, line
    assert main(TINY + ["--steps", "4", "--ckpt-every", "2", "--log-every", "1", "--out", str(old), "--resume"]) == 0
    assert {s: r["loss"] for s, r in read_metrics(old / "metrics.jsonl").items()} == \
        {s: r["loss"] for s, r in read_metrics(ref / "metrics.jsonl").items()}  # bitwise, steps 1-4
    assert not (old / "checkpoint.pt").exists() and read(old)["trainer"]["step"] == 4

    for name, flag in (("zero_checkpoints", "--zero"), ("tp_latest.pt", "--tp")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).mkdir() if name.endswith("s") else (folder / name).write_bytes(b"0.1")
        for resume in ([], ["--resume"]):
            assert main(TINY + ["--steps", "4", "--out", str(folder)] + resume) == 2
            line = one_error_line(capsys.readouterr().err, "train")
            assert f"holds a {flag} run written by gobrrr 0.1 ({name})" in line, line
            assert "finish it with gobrrr 0.1, or start this run in another --out" in line, line


def test_resume_with_a_longer_schedule_keeps_the_default_warmup(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(TINY + ["--steps", "20", "--ckpt-every", "10", "--log-every", "10", "--out", str(out)]) == 0
    assert read(out)["trainer"]["config"]["warmup"] == 2  # min(100, 20 // 10)
    assert main(TINY + ["--steps", "24", "--log-every", "4", "--out", str(out), "--resume"]) == 0
    rec = read_metrics(out / "metrics.jsonl")
    assert sorted(rec)[-4:] == [21, 22, 23, 24]
    assert rec[21]["lr"] == pytest.approx(lr_at(20, TrainConfig(steps=24, warmup=2)))
    assert read(out)["trainer"]["config"]["warmup"] == 2
    # a warmup the user does give must still match
    assert main(TINY + ["--steps", "30", "--warmup", "3", "--out", str(out), "--resume"]) == 2
    assert "--warmup 2 -> 3" in one_error_line(capsys.readouterr().err, "train")


def test_a_diverging_run_stops_and_keeps_the_last_finite_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(TINY + ["--steps", "6", "--ckpt-every", "1", "--log-every", "1", "--lr", "1e30", "--warmup", "0",
                      "--out", str(out)])
    line = one_error_line(capsys.readouterr().err, "train")
    assert rc == 1 and "diverged" in line and "at step 2" in line, line
    state = read(out)
    assert state["trainer"]["step"] == 1
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert max(read_metrics(out / "metrics.jsonl")) == 2  # the non-finite step is logged, never checkpointed


# ---------------------------------------------------------------- metrics: whole records only

def test_a_torn_metrics_tail_is_cut_on_resume(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(**SMALL, steps=4, ckpt_every=4, log_every=2, out=str(out)))
    metrics = out / "metrics.jsonl"
    torn = '{"step": 5, "loss": 4.1, "lr'  # what a kill or a full disk in the middle of a write leaves
    with open(metrics, "a") as f:
        f.write(torn)
    assert sorted(read_metrics(metrics)) == [1, 2, 3, 4]  # readers skip a torn last line
    train(TrainConfig(**SMALL, steps=6, ckpt_every=4, log_every=2, out=str(out), resume=True))
    records = whole_lines(metrics)
    resume = [r for r in records if r.get("event") == "resume"]
    assert resume == [{**resume[0], "step": 4, "repaired_bytes": len(torn)}]
    assert sorted(read_metrics(metrics)) == [1, 2, 3, 4, 5, 6]


def test_metrics_log_on_a_full_disk_keeps_whole_records(tmp_path):
    path = tmp_path / "m.jsonl"
    script = f"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
from gobrrr.train.metrics import MetricsLog, RunDirError
log = MetricsLog({str(path)!r})
try:
    for i in range(100):
        log.append([{{"step": 2 * i, "loss": 1.0}}, {{"step": 2 * i + 1, "loss": 0.5}}])
except RunDirError as e:
    print(e)
"""
    proc = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=30)
    assert "could not append" in proc.stdout and "ulimit -f" in proc.stdout, proc.stdout + proc.stderr
    records = whole_lines(path)
    assert len(records) % 2 == 0 and [r["step"] for r in records] == list(range(len(records)))


def test_disk_full_during_train_loses_nothing_and_says_so(tmp_path):
    """A real `gobrrr train` under a file-size limit: first the checkpoint write fails (exit 2, one line,
    the previous checkpoint loadable), then the metrics append fails (exit 2, no torn line), then with
    space again the run resumes and finishes, and its metrics read back."""
    out = tmp_path / "run"
    base = TINY + ["--out", str(out), "--ckpt-every", "2", "--log-every", "1"]
    train(TrainConfig(**SMALL, steps=2, ckpt_every=2, log_every=1, out=str(out)))
    ckpt_size = max(p.stat().st_size for p in (out / "checkpoints" / "step-00000002").iterdir())  # the records

    rc, text = run_cli(base + ["--steps", "4", "--resume"], tmp_path, limit_bytes=ckpt_size // 2)
    line = one_error_line(text, "train")
    assert rc == 2 and "could not write checkpoint" in line and "untouched" in line and "ulimit -f" in line, line
    assert read(out)["trainer"]["step"] == 2 and (out / "checkpoints" / "latest").read_text() == "step-00000002\n"
    whole_lines(out / "metrics.jsonl")

    limit = ckpt_size + 64 * 1024  # room for the checkpoint, not for many more metrics
    metrics = out / "metrics.jsonl"
    pad = json.dumps({"event": "padding", "text": "x" * 200}) + "\n"
    # the records of steps 3-4 (logged before the failed checkpoint) go first, as the resume would cut them
    metrics.write_text("".join(ln for ln in metrics.read_text().splitlines(True) if json.loads(ln).get("step", 0) <= 2))
    with open(metrics, "a") as f:
        while metrics.stat().st_size + 2 * len(pad) < limit - 200:
            f.write(pad)
            f.flush()
    rc, text = run_cli(base + ["--steps", "40", "--resume"], tmp_path, limit_bytes=limit)
    line = one_error_line(text, "train")
    assert rc == 2 and "could not append" in line and "metrics.jsonl" in line, line
    whole_lines(metrics)
    assert read(out)["trainer"]["step"] >= 2

    rc, text = run_cli(base + ["--steps", "6", "--resume"], tmp_path)
    assert rc == 0, text
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["latest", "step-00000006"] or \
        sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-00000006"]  # the failed one swept
    assert sorted(read_metrics(metrics))[-1] == 6 and whole_lines(metrics)[-1]["step"] == 6


# ---------------------------------------------------------------- one live run per folder

def test_a_second_run_into_a_live_folder_stops_naming_the_first(tmp_path):
    out = tmp_path / "run"
    base = TINY + ["--out", str(out), "--warmup", "0", "--ckpt-every", "2", "--log-every", "2"]
    first = start(base + ["--steps", "100000"], log=tmp_path / "first.txt")
    try:
        wait_for(lambda: logged_steps(out) >= 2 or first.poll() is not None, 60, "the first run to log")
        assert first.poll() is None, (tmp_path / "first.txt").read_text()
        t0 = time.monotonic()
        rc, text = run_cli(base + ["--steps", "100000", "--resume"], tmp_path)
        line = one_error_line(text, "train")
        assert rc == 2 and "in use by a live run" in line, line
        assert f"process {first.pid} on host {socket.gethostname()}" in line, line
        assert time.monotonic() - t0 < 30  # at once: the import, not a training run
        assert first.poll() is None  # the live run is untouched
        os.killpg(first.pid, signal.SIGKILL)  # dies holding the lock: the kernel drops it
        first.wait(timeout=10)
    finally:
        stop(first)
    step = read(out)["trainer"]["step"]
    rc, text = run_cli(base + ["--steps", str(step + 2), "--resume"], tmp_path)
    assert rc == 0, text  # the dead run's lock file is still there, and does not block
    assert max(read_metrics(out / "metrics.jsonl")) == step + 2


def test_lock_is_dropped_by_a_dead_holder_and_names_a_live_one(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from gobrrr.train.rundir import take_run_folder
lock = take_run_folder({str(folder)!r})
print("held", flush=True)
time.sleep(60)
"""], env=ENV, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(rundir.RunDirError, match=f"process {holder.pid} on host"):
            rundir.take_run_folder(folder)
    finally:
        stop(holder)
    with rundir.take_run_folder(folder):  # SIGKILLed holder: free at once
        pass


# ---------------------------------------------------------------- ranks: launcher death, dead peers, rendezvous

def children(pid: int) -> list[int]:
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d.name))
    return kids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_killing_the_torchrun_launcher_ends_its_ranks(tmp_path):
    out = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    launcher = start(TINY + ["--out", str(out), "--steps", "100000", "--warmup", "0", "--ckpt-every", "3",
                             "--log-every", "3"], launcher=torchrun, log=tmp_path / "torchrun.txt",
                     env={"GOBRRR_LIFELINE_POLL_S": "0.2", "TORCH_CPP_LOG_LEVEL": "FATAL",
                          # no store traffic: the launcher's store dies with it, and this test is about the lifeline
                          "GOBRRR_DIST_CHECK_FIRST": "0"})
    ranks: list[int] = []
    try:
        wait_for(lambda: (out / "checkpoints" / "latest").exists() or launcher.poll() is not None, 90,
                 "the ranks to checkpoint")
        assert launcher.poll() is None, (tmp_path / "torchrun.txt").read_text()
        ranks = children(launcher.pid)
        assert len(ranks) == 2, ranks
        launcher.send_signal(signal.SIGKILL)  # the launcher alone: the ranks are in sessions of their own
        launcher.wait(timeout=10)
        t0 = time.monotonic()
        wait_for(lambda: not any(alive(p) for p in ranks), 15, "the orphaned ranks to exit")
        gone_after = time.monotonic() - t0
    finally:
        stop(launcher)
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert gone_after < 5, gone_after
    log = (tmp_path / "torchrun.txt").read_text()
    assert "the launcher (process" in log and "is gone" in log, log
    state = read(out)["trainer"]  # intact, and from a whole number of intervals
    assert state["step"] % 3 == 0 and state["step"] >= 3
    whole_lines(out / "metrics.jsonl")
    steps_then = logged_steps(out)
    time.sleep(1.0)
    assert logged_steps(out) == steps_then  # nobody is writing any more
    with rundir.take_run_folder(out):  # and the folder is free for the next run
        pass


def test_a_wrong_master_port_fails_fast_naming_address_port_and_world_size(tmp_path):
    port = free_port()
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "GOBRRR_DIST_RENDEZVOUS_TIMEOUT_S": "1",
           "TORCH_CPP_LOG_LEVEL": "FATAL"}
    args = TINY + ["--steps", "2", "--out", str(tmp_path / "run")]
    t0 = time.monotonic()
    procs = [start(args, log=tmp_path / f"rank{r}.txt", env={**env, "RANK": str(r), "MASTER_PORT": str(port + r)})
             for r in (0, 1)]
    try:
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        stop(*procs)
    assert time.monotonic() - t0 < 40
    for r, rc in enumerate(codes):
        line = one_error_line((tmp_path / f"rank{r}.txt").read_text(), "train")
        assert rc == 2 and f"rank {r} of 2" in line and f"MASTER_PORT={port + r}" in line, line
        assert "MASTER_ADDR=127.0.0.1" in line and "WORLD_SIZE=2" in line and "RENDEZVOUS_TIMEOUT" in line, line


def test_a_rank_killed_mid_run_is_named_by_the_survivor(tmp_path):
    port = free_port()
    out = tmp_path / "run"
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCH_CPP_LOG_LEVEL": "FATAL"}
    args = TINY + ["--steps", "100000", "--warmup", "0", "--out", str(out), "--ckpt-every", "2", "--log-every", "2"]
    procs = [start(args, log=tmp_path / f"rank{r}.txt", env={**env, "RANK": str(r)}) for r in (0, 1)]
    try:
        wait_for(lambda: (out / "checkpoints" / "latest").exists() or any(p.poll() is not None for p in procs), 90,
                 "both ranks to checkpoint")
        procs[1].send_signal(signal.SIGKILL)
        rc = procs[0].wait(timeout=60)
    finally:
        stop(*procs)
    line = one_error_line((tmp_path / "rank0.txt").read_text(), "train")
    assert rc == 1 and "rank 1 died" in line.lower(), line
    assert read(out)["trainer"]["step"] % 2 == 0
    whole_lines(out / "metrics.jsonl")


def ddp_with_a_dying_peer(rank):
    from gobrrr.comm import CollectiveError
    from gobrrr.parallel import ddp

    torch.manual_seed(0)
    model = ddp(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)))
    model(torch.randn(4, 8)).sum().backward()  # one good step
    if rank.rank == 1:
        os._exit(7)  # killed between steps
    time.sleep(0.5)
    try:
        model(torch.randn(4, 8)).sum().backward()
    except CollectiveError as e:
        return str(e)
    return "no error"


def ddp_survivor_message(rank):
    msg = ddp_with_a_dying_peer(rank)
    if rank.rank == 0:
        raise RuntimeError(f"SURVIVOR SAID: {msg}")


def test_ddp_backward_names_a_dead_rank():
    from gobrrr.comm.testing import SpawnError, spawn

    with pytest.raises(SpawnError) as info:
        spawn(ddp_survivor_message, 2, timeout_s=60, pg_timeout_s=20)
    text = info.value.failures[0]
    assert "SURVIVOR SAID: gobrrr.comm: ddp all_reduce of gradient bucket" in text, text
    assert "rank 1 died (process" in text.lower(), text


# ---------------------------------------------------------------- debatable, decided

def test_second_init_does_not_reseed_and_inner_session_keeps_the_outer_group(monkeypatch):
    import torch.distributed as dist

    from gobrrr.comm import init, session

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    if dist.is_initialized():
        pytest.skip("a process group from another test is still alive in this process")
    with session(device="cpu", seed=5) as outer:
        first = torch.rand(1)
        again = init(device="cpu")  # adopts, does not re-seed
        assert again.seed == 5 and not torch.equal(torch.rand(1), first)
        with session(device="cpu") as inner:
            assert inner.world_size == 1
        assert dist.is_initialized()  # the inner session left the outer group alive
        init(device="cpu", seed=5)  # an explicit seed is a request: honoured
        assert torch.equal(torch.rand(1), first)
        assert outer.seed == 5
    assert not dist.is_initialized()


def dtype_mismatch(rank):
    from gobrrr.comm import CollectiveMismatchError, comm

    t = torch.ones(4, dtype=torch.int32 if rank.rank == 1 else torch.float32)
    try:
        comm.all_reduce(t)
    except CollectiveMismatchError as e:
        return str(e)
    return f"no error: {t.tolist()}"


def test_gloo_dtype_mismatch_is_caught_without_debug_mode():
    from gobrrr.comm.testing import spawn

    for msg in spawn(dtype_mismatch, 2, timeout_s=60, pg_timeout_s=20):
        assert "Mismatching ranks" in msg and "int32[4]" in msg and "float32[4]" in msg, msg
