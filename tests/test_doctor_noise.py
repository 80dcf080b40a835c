"""A newcomer's first doctor runs without surprises (issue 30, items 10-12): a folder instead of a script is
named as such, a summary printed while the script runs does not say "exit code None", the demo's doctor
step does not contradict itself, and torch's profiler prints none of its USDT marker lines. Also: the
overhead line (recorded vs plain steps) in every summary."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gobrrr import doctor
from gobrrr.doctor.report import summary

ROOT = Path(__file__).resolve().parent.parent

TRAIN = """
import torch
model = torch.nn.Linear(32, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(15):  # 3 warmup, lead-in, 2 recorded; 1, lead-in, 3 line steps; settle, 3 plain
    model(torch.randn(16, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_directory_is_named_as_one(tmp_path, capsys):
    assert doctor.main(["--out", str(tmp_path / "d"), str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("gobrrr doctor: error: ") and "is a directory, not a script" in line
    assert "pass the path of a Python file" in line and "no such script" not in line
    assert doctor.main(["--out", str(tmp_path / "d")]) == 2  # no script at all: one line too
    assert "no script given" in capsys.readouterr().err


def test_summary_while_running_has_no_exit_code_none():
    r = {"script": "train.py", "argv": [], "exit_code": None, "notes": [], "files": {},
         "steps": {"source": "optimizer", "recorded": 3, "warmup": 2, "median_ms": 1.0}}
    head = summary(r).splitlines()[0]
    assert "exit code None" not in head and "still running" in head
    r["exit_code"] = 0
    assert summary(r).splitlines()[0].endswith("(exit code 0)")


def _step_rows(table: str) -> dict[str, list[float]]:
    rows = {}
    for label in ("recorded step (ms)", "plain step, no profiler (ms)", "profiler overhead (x)"):
        line = next(ln for ln in table.splitlines() if ln.startswith(label))
        rows[label] = [float(x) if x != "-" else None for x in line[len(label):].split()]
    return rows


def test_side_by_side_recorded_over_plain_is_the_overhead_it_prints():
    """The demo's table printed recorded 1.80 ms, plain 0.80 ms and overhead 87.04x: the row was the recorded
    steps' median, the ratio their mean (one recorded step of 207 ms on a CPU) over the plain mean."""
    from gobrrr.doctor.report import side_by_side

    def report(ms, plain):
        over = {"recorded_ms": round(sum(ms) / len(ms), 4), "plain_ms": plain,
                "ratio": round(sum(ms) / len(ms) / plain, 4)}
        return {"script": "seed_loop.py", "argv": [], "exit_code": 0, "notes": [], "gpu": None, "advice": [],
                "host": {}, "files": {"report": "/tmp/d/report.json"}, "overhead": over,
                "steps": {"source": "optimizer", "recorded": len(ms), "warmup": 3, "median_ms": sorted(ms)[1]}}
    rows = _step_rows(side_by_side({"naive": report([207.18, 1.80, 1.17], 0.80),
                                    "gobrrr": report([1.84, 43.11, 9.76], 1.08)}))
    for rec, plain, ratio in zip(*rows.values()):
        assert rec / plain == pytest.approx(ratio, rel=0.01), rows
    assert rows["recorded step (ms)"] == [70.05, 18.24]
    no_plain = report([3.0, 2.0, 1.0], 1.0)
    no_plain["overhead"] = None  # no plain steps timed: the median, as before
    assert _step_rows(side_by_side({"naive": no_plain}))["recorded step (ms)"] == [2.0]


@pytest.mark.timeout(180)
def test_no_usdt_lines_and_the_overhead_line(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    out = tmp_path / "d"
    r = subprocess.run([sys.executable, "-m", "gobrrr", "doctor", "--steps", "2", "--plain-steps", "3", "--out", str(out),
                        "train.py"], capture_output=True, text=True, timeout=170, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "USDT" not in r.stderr and "USDT" not in r.stdout and "profiler_start" not in r.stderr, r.stderr
    assert "overhead: recorded steps" in r.stdout and "plain steps" in r.stdout
    over = json.loads((out / "report.json").read_text())["overhead"]
    # the figure steps record no Python stacks; three line steps after them do (lines.py)
    assert over["plain_steps"] == 3 and over["ratio"] > 0 and over["settings"]["stack"] is False
    report = json.loads((out / "report.json").read_text())
    assert report["lines"]["steps"] == 3 and "lines: named from 3 more steps" in r.stdout


def test_the_quiet_filter_passes_everything_else(tmp_path):
    code = textwrap.dedent("""
        import os, torch
        from gobrrr.doctor.quiet import kineto_quiet
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        with kineto_quiet():
            os.write(2, b"keep me\\n")
            prof.start()
        torch.randn(4).sum()
        with kineto_quiet():
            prof.stop()
        print("done")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    assert "keep me" in r.stderr and "USDT" not in r.stderr, r.stderr


def _function_lines(path: Path, name: str) -> range:
    node = next(n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef) and n.name == name)
    return range(node.lineno, node.end_lineno + 1)


@pytest.mark.timeout(300)
def test_demo_doctor_step_agrees_with_itself_on_cpu(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reports = doctor.demo_doctor(tmp_path)
    out = capsys.readouterr().out
    seed = ROOT / "examples" / "seed_loop.py"
    # the seed loop's own timing lines (which, under the profiler, time the doctor too) are not shown...
    assert "ms/step   mean loss" not in out and "speedup" not in out
    # ...the doctor's recorded and plain step times are, side by side
    assert "recorded step (ms)" in out and "plain step, no profiler (ms)" in out
    rows = _step_rows(out)  # and the overhead is the one row over the other
    for rec, plain, ratio in zip(*rows.values()):
        assert rec / plain == pytest.approx(ratio, rel=0.02, abs=0.01), rows
    for mode in ("naive", "gobrrr"):
        assert reports[mode]["overhead"]["plain_steps"] == 2, reports[mode]["overhead"]
    # the gobrrr loop's fixes are about the gobrrr loop: no line of the naive loop, which did not run
    naive = _function_lines(seed, "naive_loop")
    for a in reports["gobrrr"]["advice"]:
        line = int(a["site"].rpartition(":")[2]) if a["site"].startswith("seed_loop.py:") else 0
        assert line not in naive, a
    first = next(ln for ln in out.splitlines() if ln.startswith("doctor's first fix for the gobrrr loop"))
    assert not any(f"seed_loop.py:{n} " in first for n in naive), first


def test_the_overhead_ratio_carries_its_standard_error():
    """Single steps of a host-bound loop varied 36-116 ms on an H100: the ratio of two 8-step means is printed with
    about one standard error, from both sets' spread, and without one when the steps do not vary."""
    from gobrrr.doctor.overhead import ProfilerSettings, overhead_figures
    from gobrrr.doctor.report import _overhead_lines

    steady = overhead_figures([50.0] * 5, [40.0] * 8, ProfilerSettings())
    assert steady["ratio"] == 1.25 and steady["ratio_se"] == 0.0
    assert "1.25x (" in _overhead_lines(steady)[0]
    plain = [40.0, 44.0, 36.0, 116.0, 42.0, 38.0, 40.0, 44.0]
    noisy = overhead_figures([50.0, 52.0, 48.0, 50.0, 50.0], plain, ProfilerSettings())
    mean = sum(plain) / 8
    sd = (sum((x - mean) ** 2 for x in plain) / 7) ** 0.5
    rec_sd = (8 / 4) ** 0.5  # the recorded steps' own spread: deviations 0, 2, -2, 0, 0
    want = noisy["ratio"] * ((sd / 8 ** 0.5 / mean) ** 2 + (rec_sd / 5 ** 0.5 / 50.0) ** 2) ** 0.5
    assert noisy["ratio_se"] == pytest.approx(want, abs=1e-4) and noisy["ratio_se"] > 0.1
    assert f"{noisy['ratio']:.2f}x +-{noisy['ratio_se']:.2f} (" in _overhead_lines(noisy)[0]
