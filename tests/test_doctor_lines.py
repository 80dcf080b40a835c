"""Issue 31: the figure steps record no Python stacks and the line steps after them name the lines (lines.py).

Checked on GPU traces recorded on an H200 (tests/data/traces): the same trace read once with its stacks (the line
steps) and once with them stripped (the figure steps) must give back, after `carry`, the tables the stacked trace
gives alone; with the figure steps' causes scaled, the sites' times follow.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gobrrr.doctor import lines
from gobrrr.doctor import timeline as tl

DATA = Path(__file__).parent / "data" / "traces"


def _pair(name: str):
    """(figure trace without stacks, its figures), (line trace with stacks, its figures), from one recording."""
    with_stacks = tl.parse(DATA / name)
    bare = copy.deepcopy(with_stacks)
    bare.frames = {}
    roots = [DATA, DATA.parent]
    return (bare, tl.analyze(bare, source_roots=roots)), (with_stacks, tl.analyze(with_stacks, source_roots=roots))


@pytest.mark.parametrize("name", ["sync_heavy.json.gz", "naive.json.gz"])
def test_lines_carried_from_the_same_steps_are_the_stacked_figures(name):
    (tr, fig), (ltr, lfig) = _pair(name)
    assert all(not r["site"].startswith("record_traces.py") for r in fig.syncs)  # no stacks: no line of ours
    info = lines.carry(fig, lfig, tr, ltr)
    mean = sum(lfig.steps_ms) / len(lfig.steps_ms)
    assert info["steps"] == len(lfig.steps_ms) and info["mean_ms"] == pytest.approx(mean, abs=1e-3)
    for field in ("syncs", "host_bound_sites", "loader_sites", "h2d_sites", "pageable"):
        got, want = getattr(fig, field), getattr(lfig, field)
        assert [r.get("site") for r in got] == [r.get("site") for r in want], field
        for g, w in zip(got, want):
            for k, v in w.items():
                assert g[k] == pytest.approx(v, rel=1e-3, abs=1e-3), (field, k)
    # every sync and copy call of the figure steps gets the line of the same call in the line steps
    want_sites = {k: v.key for k, v in lfig.call_sites.items()}
    got_sites = {k: v.key for k, v in fig.call_sites.items()}
    assert got_sites and all(want_sites.get(k) == v for k, v in got_sites.items())
    if name == "sync_heavy.json.gz":
        assert {r["site"] for r in fig.syncs} >= {"record_traces.py:107", "record_traces.py:108"}


def test_sites_share_the_figure_steps_totals():
    """The line steps ran slower (the stacks' cost): each site keeps its share of its cause, the cause's size is
    the figure steps'."""
    (tr, fig), (ltr, lfig) = _pair("sync_heavy.json.gz")
    fig.idle_breakdown_ms = {k: v / 2 for k, v in lfig.idle_breakdown_ms.items()}  # the figure steps idled half as long
    fig.syncs = [{**r, "total_ms": r["total_ms"] / 2} for r in fig.syncs]
    lines.carry(fig, lfig, tr, ltr)
    for got, want in zip(fig.syncs, lfig.syncs):
        assert got["idle_ms"] == pytest.approx(want["idle_ms"] / 2, abs=1e-3)
        assert got["total_ms"] == pytest.approx(want["total_ms"] / 2, abs=1e-3)
        assert got["count"] == want["count"]  # as many steps on both sides
    assert sum(r["idle_ms"] for r in fig.syncs) <= fig.idle_breakdown_ms["sync_blocked"] + 1e-3


def test_counts_go_by_the_number_of_steps_and_a_reordered_step_stays_unlabelled():
    (tr, fig), (ltr, lfig) = _pair("sync_heavy.json.gz")
    lfig.steps_ms = lfig.steps_ms[:1]  # as if one line step had been recorded against three figure steps
    want = {r["site"]: r["count"] for r in lfig.syncs}
    lines.carry(fig, lfig, tr, ltr)
    assert {r["site"]: r["count"] for r in fig.syncs} == {k: v * len(tr.steps) for k, v in want.items()}
    # calls in another order in the line steps: the calls after the first that differs keep their runtime name
    (tr, fig), (ltr, lfig) = _pair("sync_heavy.json.gz")
    first_step = lines._calls_by_step(ltr)[0]
    assert len({c.name for c in first_step}) > 1, "the trace's step needs calls of two kinds for this check"
    for step in lines._calls_by_step(ltr):  # the first call of each step another kind: nothing in a step matches
        step[0].name = "cudaStreamSynchronize" if "emcpy" in step[0].name else "cudaMemcpyAsync"
    sites = lines.call_sites(tr, ltr, lfig.call_sites)
    assert sites == {}


# -- the two windows in a run (session.py) -------------------------------------------------------------------

LOOP = """
import sys
import torch

def helper(x):
    return torch.tanh(x @ x.T)        # HELPER

model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(int(sys.argv[1])):
    helper(model(torch.randn(16, 32))).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def _python_events(path: Path) -> int:
    import json

    return sum(1 for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "python_function")


def _run(tmp_path, steps: int, **cfg):
    from gobrrr.doctor import DoctorConfig, run_script

    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    out = tmp_path / "d"
    code, report = run_script(str(script), [str(steps)],
                              DoctorConfig(steps=2, warmup=3, plain_steps=2, out_dir=str(out), print_summary=False, **cfg))
    assert code == 0, report.get("error")
    return out, report


@pytest.mark.timeout(120)
def test_figure_steps_have_no_stacks_and_line_steps_do(tmp_path):
    # 3 warmup, lead-in, 2 figure steps; one step, a lead-in and 3 line steps; one to settle, 2 plain: 14
    out, r = _run(tmp_path, 14)
    assert r["steps"]["recorded"] == 2 and r["lines"]["steps"] == 3 and r["overhead"]["plain_steps"] == 2
    assert r["lines"]["first_step"] == 3 + 1 + 2 + 1 + 1  # after the figure steps, the step between and a lead-in
    assert _python_events(out / "trace.json") == 0 and _python_events(out / "trace-lines.json") > 0
    assert r["overhead"]["settings"]["stack"] is False and r["files"]["trace_lines"].endswith("trace-lines.json")


@pytest.mark.timeout(120)
def test_line_steps_zero_keeps_one_window_with_stacks(tmp_path):
    out, r = _run(tmp_path, 9, line_steps=0)  # 3 + 1 + 2 + 1 + 2
    assert r["lines"] is None and not (out / "trace-lines.json").exists()
    assert _python_events(out / "trace.json") > 0 and r["overhead"]["settings"]["stack"] is True
    assert r["overhead"]["plain_steps"] == 2


@pytest.mark.timeout(120)
def test_a_script_that_ends_before_the_line_steps_keeps_its_figures_and_says_so(tmp_path):
    out, r = _run(tmp_path, 7)  # the figure steps end at boundary 6; the line steps never start
    assert r["steps"]["recorded"] == 2 and r["lines"] is None
    assert any("no line steps were recorded" in n and "--line-steps 0" in n for n in r["notes"]), r["notes"]
    out, r = _run(tmp_path, 10)  # ends inside the line steps: the complete ones name the lines
    assert r["steps"]["recorded"] == 2 and r["lines"] is not None and 1 <= r["lines"]["steps"] < 3
