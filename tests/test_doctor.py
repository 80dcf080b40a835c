"""`gobrrr doctor` on CPU: the CLI end to end, exit codes and exceptions passed through,
scripts that never step, manual steps, the Python API and bounded traces."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gobrrr.doctor.build  # noqa: F401  (doctor.build._gpu_part below)
from gobrrr import doctor
from gobrrr.doctor import DoctorConfig, run_script
from gobrrr.doctor.overhead import ProfilerSettings

DETECTIVE = ProfilerSettings(detective=True)

ROOT = Path(__file__).resolve().parent.parent

TRAIN = """
import sys
import torch

model = torch.nn.Linear(32, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = int(sys.argv[1])
for i in range(steps):
    x = torch.randn(16, 32)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if i == int(sys.argv[2]):
        raise RuntimeError("boom at step %d" % i)
print("trained", steps)
sys.exit(int(sys.argv[3]))
"""


def _script(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _check_outputs(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    trace = json.loads((out / "trace.json").read_text())
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return report


@pytest.mark.timeout(120)
def test_cli_end_to_end_passes_the_exit_code(tmp_path):
    script = _script(tmp_path, TRAIN)
    out = tmp_path / "doc"
    cmd = [sys.executable, "-m", "gobrrr", "doctor", "--steps", "3", "--warmup", "1", "--out", str(out),
           str(script), "8", "-1", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=110, cwd=tmp_path)
    assert r.returncode == 3, r.stderr[-2000:]
    assert "trained 8" in r.stdout  # the script ran, with its own argv
    assert "gobrrr doctor:" in r.stdout and "GPU figures need a CUDA GPU" in r.stdout
    report = _check_outputs(out)
    assert report["exit_code"] == 3 and report["argv"] == ["8", "-1", "3"]
    st = report["steps"]
    assert st["source"] == "optimizer" and st["recorded"] == 3 and st["seen"] == 8
    assert len(st["ms"]) == 3 and all(ms > 0 for ms in st["ms"])
    assert report["gpu"] is None and report["cuda"] is False
    # --warmup 1 runs as 2 (see Session.__init__); the trace holds the lead-in step (the profiler starting up,
    # left out of the figures and said so) and the 3 steps after it
    assert report["steps"]["warmup"] == 2 and any("--warmup 1 ran as 2" in n for n in report["notes"])
    assert len(st["lead_in_ms"]) == 1 and st["lead_in_ms"][0] > 0
    assert "1 recorded step(s) left out, the profiler starting up" in r.stdout
    trace = json.loads((out / "trace.json").read_text())
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]


WATCHED = """
import json, sys
import torch
from gobrrr.syncs.watch import watching

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seen = []
for i in range(9):
    seen.append(watching())  # is the sync detective on during this step?
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
seen.append(watching())
json.dump(seen, open(sys.argv[1], "w"))
"""


@pytest.mark.timeout(60)
def test_sync_detective_watches_the_recorded_steps_only(tmp_path):
    """The runtime sync detective runs over exactly the window the trace records: not during warmup,
    not after, and its table is in the report (empty on CPU, where nothing syncs)."""
    script = _script(tmp_path, WATCHED)
    flags = tmp_path / "flags.json"
    cfg = DoctorConfig(steps=3, warmup=2, out_dir=str(tmp_path / "doc"), print_summary=False, settings=DETECTIVE)
    code, report = run_script(str(script), [str(flags)], cfg)
    assert code == 0
    # step 0 is the start-up window (watched, then dropped), step 1 warmup, step 2 the profiler's lead-in (recorded,
    # not in the figures: not watched), 3-5 recorded, then done
    assert json.loads(flags.read_text()) == [True, False, False, True, True, True, False, False, False, False]
    assert report["host"]["sync_detective"] == []
    from gobrrr.syncs.watch import watching
    assert not watching()


@pytest.mark.timeout(60)
def test_exception_in_script_still_reports(tmp_path, capsys):
    script = _script(tmp_path, TRAIN)
    cfg = DoctorConfig(steps=3, warmup=1, out_dir=str(tmp_path / "doc"), print_summary=False)
    code, report = run_script(str(script), ["8", "2", "0"], cfg)
    assert code == 1
    assert report["error"]["type"] == "RuntimeError" and "boom at step 2" in report["error"]["message"]
    err = capsys.readouterr().err
    assert "RuntimeError: boom at step 2" in err and str(script) in err  # the script's own traceback
    assert "runpy" not in err  # without the doctor's frames
    on_disk = _check_outputs(tmp_path / "doc")
    assert on_disk["exit_code"] == 1 and on_disk["error"]["type"] == "RuntimeError"
    # steps 1 and 2 were recorded before the exception (warmup 1)
    assert on_disk["steps"]["seen"] == 3 and len(on_disk["steps"]["ms"]) >= 1


@pytest.mark.timeout(60)
def test_script_that_never_steps_gets_a_time_window(tmp_path):
    script = _script(tmp_path, """
        import torch
        x = torch.randn(64, 64)
        for _ in range(20):
            x = torch.tanh(x @ x)
        print(float(x.sum()))
    """)
    cfg = DoctorConfig(out_dir=str(tmp_path / "doc"), print_summary=False)
    code, report = run_script(str(script), [], cfg)
    assert code == 0
    assert report["steps"]["source"] == "time-window" and report["steps"]["recorded"] == 0
    assert any("no step boundary" in n for n in report["notes"])
    trace = json.loads((tmp_path / "doc" / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::mm" in names and "aten::tanh" in names  # the window holds the script's work
    # a time window is one recording with the Python stacks: no line steps, and no note that they are missing
    assert any(e.get("cat") == "python_function" for e in trace["traceEvents"]) and report["lines"] is None
    assert not any("line steps" in n for n in report["notes"]) and report["overhead"]["settings"]["stack"] is True


@pytest.mark.timeout(60, method="thread")  # the doctor's time window uses SIGALRM itself
def test_time_window_bounds_a_long_run_without_steps(tmp_path):
    script = _script(tmp_path, """
        import time, torch
        t0 = time.perf_counter()
        x = torch.randn(32, 32)
        while time.perf_counter() - t0 < 1.5:
            x = torch.tanh(x @ x)
            time.sleep(0.01)
    """)
    cfg = DoctorConfig(out_dir=str(tmp_path / "doc"), print_summary=False, window_s=0.3)
    code, report = run_script(str(script), [], cfg)
    assert code == 0 and report["wall_s"] >= 1.5
    trace = json.loads((tmp_path / "doc" / "trace.json").read_text())
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    span_s = (max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)) / 1e6
    assert span_s < 1.0  # recording stopped after the 0.3 s window, not at the end of the 1.5 s run


@pytest.mark.timeout(60)
def test_manual_steps_and_sys_exit_none(tmp_path):
    script = _script(tmp_path, """
        import sys, torch
        import gobrrr
        x = torch.randn(16, 16)
        for i in range(6):
            x = torch.tanh(x @ x)
            gobrrr.doctor.step()
        sys.exit()
    """)
    cfg = DoctorConfig(steps=2, warmup=2, out_dir=str(tmp_path / "doc"), print_summary=False)
    code, report = run_script(str(script), [], cfg)
    assert code == 0
    assert report["steps"]["source"] == "manual" and report["steps"]["recorded"] == 2


@pytest.mark.timeout(60)
def test_script_ending_in_warmup_says_so(tmp_path):
    script = _script(tmp_path, TRAIN)
    cfg = DoctorConfig(steps=3, warmup=5, out_dir=str(tmp_path / "doc"), print_summary=False)
    code, report = run_script(str(script), ["2", "-1", "0"], cfg)
    assert code == 0 and report["steps"]["recorded"] == 0
    assert any("smaller --warmup" in n for n in report["notes"])


@pytest.mark.timeout(60)
def test_python_api_function_and_block(tmp_path):
    import torch

    calls = []
    w = torch.randn(32, 32)

    def step_fn():
        calls.append(1)
        return torch.tanh(w @ w)

    report = doctor.profile(step_fn, steps=2, warmup=1, out_dir=str(tmp_path / "fn"), print_summary=False)
    # warmup 1 runs as 2, the lead-in step, 2 recorded steps; one step between, a lead-in and 3 line steps with
    # Python stacks; one to settle, then 5 plain steps without the profiler
    assert len(calls) == 2 + 1 + 2 + (1 + 1 + 3) + 1 + 5
    assert report["steps"]["recorded"] == 2 and report["steps"]["source"] == "manual"
    over = report["overhead"]
    assert over["plain_steps"] == 5 and over["plain_ms"] > 0 and over["ratio"] > 0
    assert over["ratio"] == pytest.approx(over["recorded_ms"] / over["plain_ms"], rel=1e-3)
    _check_outputs(tmp_path / "fn")

    with doctor.profile(steps=2, warmup=1, out_dir=str(tmp_path / "blk"), print_summary=False) as doc:
        for _ in range(5):  # 2 warmup, the lead-in, 2 recorded
            step_fn()
            doctor.step()
    assert doc.report["steps"]["recorded"] == 2
    doctor.step()  # outside a session: a no-op


def test_cli_errors():
    assert doctor.main(["--steps", "0", "x.py"]) == 2
    assert doctor.main(["/nonexistent/script.py"]) == 2


def test_summary_and_side_by_side_text():
    from gobrrr.doctor.advice import recommend
    from gobrrr.doctor.report import side_by_side, summary
    from gobrrr.doctor.timeline import analyze

    data = ROOT / "tests" / "data" / "traces"
    reports = {}
    for name in ("naive", "prefetched"):
        f = analyze(data / f"{name}.json.gz", source_roots=[data.parent])
        d = f.to_dict()
        reports[name] = {
            "script": f"{name}.py", "argv": [], "exit_code": 0, "notes": [],
            "steps": {"source": "optimizer", "recorded": 3, "warmup": 2, "median_ms": 1.0},
            "gpu": doctor.build._gpu_part(d), "host": {"syncs": d["syncs"]},
            "advice": [r.to_dict() for r in recommend(f)], "files": {"report": f"/tmp/{name}/report.json"}}
    text = summary(reports["naive"])
    assert "waiting for data" in text and "record_traces.py:47" in text and "pageable" in text
    table = side_by_side(reports)
    assert "GPU idle, no kernel (%)" in table and "waiting_for_data" in table
    row = next(line for line in table.splitlines() if line.startswith("H2D hidden from compute"))
    assert row.split()[-2:] == [f"{reports[n]['gpu']['copy_hidden_pct']:.1f}" for n in ("naive", "prefetched")]


@pytest.mark.timeout(120, method="thread")
def test_steps_after_a_closed_time_window_are_still_recorded(tmp_path):
    # a slow start (no step within the window), then training: the window is saved, then
    # replaced by the steps when they come; a subprocess, so a crash at exit would show
    script = _script(tmp_path, """
        import time, torch
        time.sleep(0.8)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    """)
    out = tmp_path / "doc"
    cmd = [sys.executable, "-m", "gobrrr", "doctor", "--quiet", "--window-s", "0.3", "--steps", "2",
           "--warmup", "1", "--out", str(out), str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=110, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    report = _check_outputs(out)
    assert report["steps"]["source"] == "optimizer" and report["steps"]["recorded"] == 2
    assert any("time window" in n for n in report["notes"])


def test_report_from_a_recorded_gpu_trace(tmp_path, capsys):
    # the GPU half of the doctor's outputs, run here on a trace recorded on an H200
    from gobrrr.doctor import Session
    from gobrrr.doctor.report import summary

    data = ROOT / "tests" / "data"
    # (recorded before the doctor's lead-in step existed: its 3 steps are all steps of the figures)
    s = Session(DoctorConfig(warmup=2, lead_in=0, out_dir=str(tmp_path), print_summary=False),
                script=str(data / "record_traces.py"))
    s._trace_path = data / "traces" / "naive.json.gz"
    s.boundaries, s.step_source = 5, "optimizer"
    s._analyze()
    r = s.report
    assert r["gpu"]["top_cause"] == "waiting_for_data" and r["steps"]["recorded"] == 3
    assert r["advice"][0]["site"] == "record_traces.py:47" and "Prefetcher" in r["advice"][0]["change"]
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    text = summary(r)
    assert "waiting for data" in text and "record_traces.py:47" in text and "record_traces.py:52" in text
    json.dumps(r)  # the report is plain JSON


def test_unreadable_trace_still_gives_a_report(tmp_path):
    from gobrrr.doctor import Session

    bad = tmp_path / "trace.json"
    bad.write_text("{not json")
    s = Session(DoctorConfig(out_dir=str(tmp_path / "out"), print_summary=False))
    s._trace_path, s.boundaries = bad, 3
    s._analyze()
    assert any("could not be analysed" in n for n in s.report["notes"]) and s.report["gpu"] is None
    assert json.loads((tmp_path / "out" / "report.json").read_text())["steps"]["seen"] == 3


def test_cli_bad_out_and_missing_script_are_one_line_errors(tmp_path, capsys):
    script = _script(tmp_path, "print('never runs')\n")
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    for out in (a_file, a_file / "under"):  # on a file, and under one
        assert doctor.main(["--out", str(out), str(script)]) == 2
        err = capsys.readouterr()
        assert "never runs" not in err.out  # refused before the script ran
        (line,) = err.err.strip().splitlines()
        assert line.startswith("gobrrr doctor: error: --out ") and "folder" in line, line
    assert doctor.main(["--out", str(tmp_path / "ok"), str(tmp_path / "missing.py")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"gobrrr doctor: error: no such script {str(tmp_path / 'missing.py')!r}; pass the path of a Python file"
    assert doctor.main(["--steps", "0", str(script)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("gobrrr doctor: error: --steps must be at least 1") and "doctor: gobrrr" not in line
    assert doctor.main(["--line-steps", "-1", str(script)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("gobrrr doctor: error: --line-steps must be 0 or more") and "pass 0" in line


CARRIES_ON = """
import os, sys, warnings
import torch

model = torch.nn.Linear(32, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(int(sys.argv[2])):
    model(torch.randn(16, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    warnings.warn("called a synchronizing CUDA operation")  # a stand-in sync, after the step boundary
    if i == int(sys.argv[3]):
        raise RuntimeError("boom at step %d" % i)
print("SCRIPT-AFTER-THE-WINDOW report exists:", os.path.exists(os.path.join(sys.argv[1], "report.json")))
"""


@pytest.mark.timeout(60)
def test_summary_comes_when_the_window_closes_and_the_script_carries_on(tmp_path, capsys):
    out = tmp_path / "doc"
    script = _script(tmp_path, CARRIES_ON)
    cfg = DoctorConfig(steps=2, warmup=2, out_dir=str(out), print_summary=True, plain_steps=2)
    # 2 warmup, lead-in, 2 recorded; 1, lead-in, 3 line steps; settle, 2 plain: 13 boundaries
    code, report = run_script(str(script), [str(out), "13", "-1"], cfg)
    assert code == 0
    cap = capsys.readouterr()
    # the summary was printed, and the files written, before the script went on to its last line
    assert cap.out.index("gobrrr doctor: ") < cap.out.index("SCRIPT-AFTER-THE-WINDOW report exists: True")
    assert cap.out.count("  steps: 2 recorded") == 1  # printed once, not again at the end
    assert "recorded 2 steps" in cap.err and "the script carries on" in cap.err
    assert "the script ended with exit code 0" in cap.err
    assert json.loads((out / "report.json").read_text())["exit_code"] == 0 and report["steps"]["seen"] == 13


@pytest.mark.timeout(60)
def test_a_step_cut_short_by_the_end_of_the_script_is_not_counted(tmp_path):
    """Decided (issue 16): the step the script raised in is partial, so it is not a recorded step; the
    report counts 2, says it ended after 2, and leaves the partial step in trace.json only."""
    out = tmp_path / "doc"
    script = _script(tmp_path, CARRIES_ON)
    cfg = DoctorConfig(steps=3, warmup=2, out_dir=str(out), print_summary=False, settings=DETECTIVE)
    code, report = run_script(str(script), [str(out), "8", "4"], cfg)  # raises after the 5th optimizer step
    assert code == 1 and report["error"]["type"] == "RuntimeError"
    st = report["steps"]
    assert st["seen"] == 5 and st["recorded"] == 2 and len(st["ms"]) == 2 and len(st["lead_in_ms"]) == 1
    assert any("ended after 2 recorded step(s) of 3" in n for n in report["notes"])
    assert any("partial step is left out" in n for n in report["notes"])
    trace = json.loads((out / "trace.json").read_text())
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    # the lead-in step, the 2 complete ones, and the partial one are kept there
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    # the sync detective's table covers the same two complete steps (one stand-in sync each), not the third
    assert [d["count"] for d in report["host"]["sync_detective"]] == [2], report["host"]["sync_detective"]
