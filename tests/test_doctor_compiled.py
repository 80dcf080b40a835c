"""The doctor on torch.compile'd code (CPU, inductor): time in generated code is charged to the user's line
that called the compiled function, marked compiled; graph breaks are named by their line; no fix points
into generated files and none suggests torch.compile for what already runs compiled."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gobrrr.doctor import DoctorConfig, run_script
from gobrrr.doctor.advice import host_change
from gobrrr.doctor.host import HostAttribution
from gobrrr.doctor.sources import SourceResolver, is_generated_file, is_graph_frame, is_library_file

SCRIPT = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 8)

    def forward(self, x, y):
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()  # BREAK
        return nn.functional.cross_entropy(self.b(h), y)


model = Net()
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(13):  # 3 warmup, the lead-in, 2 recorded; 1, lead-in, 3 line steps; one to settle, 1 plain
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
    loss = compiled(x, y)  # CALL
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(SCRIPT).splitlines(), 1) if marker in line)


def test_generated_files_are_never_the_users():
    for f in ("/tmp/torchinductor_root/c5/c5fhxyz.py", "/home/u/.cache/torchinductor_u/ab/cab.py", "<eval_with_key>.3"):
        assert is_generated_file(f) and is_library_file(f)
    assert not is_generated_file("/home/u/train.py") and not is_library_file("/home/u/train.py")


def test_advice_for_compiled_lines_never_says_try_torch_compile():
    row = {"site": "train.py:40", "code": "logits, loss = model(X, Y)", "callee": "module call", "detail": "compiled"}
    text = host_change(row, compiled=True)
    assert "reduce-overhead" in text and "already runs compiled" in text and "try torch.compile" not in text
    for callee in ("backward", "module call", "step", "zero_grad", "host launch overhead", "foo"):
        assert "try torch.compile" not in host_change({"site": "t.py:3", "callee": callee}, compiled=True), callee
    assert "try torch.compile" in host_change({"site": "t.py:3", "callee": "module call"}, compiled=False)


@pytest.mark.timeout(600)
def test_compiled_loop_is_charged_to_the_calling_line(tmp_path):
    script = tmp_path / "comp.py"
    script.write_text(textwrap.dedent(SCRIPT))
    cfg = DoctorConfig(steps=2, warmup=3, plain_steps=1, out_dir=str(tmp_path / "d"), print_summary=False)
    code, r = run_script(str(script), [], cfg)
    assert code == 0, r.get("error")
    call, brk = f"comp.py:{_line('# CALL')}", f"comp.py:{_line('# BREAK')}"
    c = r["compiled"]
    # a site names the script as the trace does: torch's profiler writes it relative to a sys.path entry while the
    # script's folder is on sys.path, else whole (when the recording ends after the script): both are the user's line
    assert c["compiled"] and any(row["site"].endswith(call) for row in c["calls"]), c
    assert [b["site"].rsplit("/", 1)[-1] for b in c["graph_breaks"]] == [brk], c
    assert "graph_break" in c["graph_breaks"][0]["code"], c
    for a in r["advice"]:
        assert "torchinductor" not in a["site"] and "try torch.compile" not in a["change"], a
    assert any(a["site"].rsplit("/", 1)[-1] == brk and "graph break" in a["change"] for a in r["advice"]), r["advice"]

    # the host time inside the compiled graphs (generated code) is the calling line's, marked compiled
    from gobrrr.doctor.trace import parse

    tr = parse(tmp_path / "d" / "trace-lines.json")  # the steps recorded with Python stacks
    host = HostAttribution(tr, SourceResolver([tmp_path]))
    th = host.main
    graph = [f for f in tr.frames[th] if is_graph_frame(f) and f.end - f.ts > 1.0]
    assert graph, "no compiled graph ran in the recorded steps"
    sites = host.locate([(th, (f.ts + f.end) / 2, (f.ts + f.end) / 2 + 0.5) for f in graph])
    lines = {(s.key.rsplit("/", 1)[-1], s.detail) for s in sites if s is not None}  # relative or whole, as above
    assert lines <= {(call, "compiled"), (f"comp.py:{_line('loss.backward()')}", "compiled")}, lines
    assert (call, "compiled") in lines


# -- a compiled nanoGPT-like loop recorded by the doctor on an H200 -------------------------------------------

DATA = Path(__file__).parent / "data" / "traces"
LOOP = DATA / "nanogpt_like.py"
LOOP_SHA256 = "a29a42b0486b45c922ace27e750e7e2e50882a24fd98b5133b2c52bab2002e32"  # when nanogpt_compiled was recorded


def _loop_line(text: str) -> str:
    n = next(i for i, t in enumerate(LOOP.read_text().splitlines(), 1) if text in t)
    return f"nanogpt_like.py:{n}"


def test_the_loop_is_the_recorded_one():
    import hashlib

    assert hashlib.sha256(LOOP.read_bytes()).hexdigest() == LOOP_SHA256, (
        "tests/data/traces/nanogpt_like.py changed since nanogpt_compiled.json.gz was recorded from it: record it "
        "again (traces.json says how) and update LOOP_SHA256")


def test_recorded_compiled_loop_names_the_calling_lines_never_generated_code():
    from gobrrr.doctor import timeline
    from gobrrr.doctor.advice import recommend

    fig = timeline.analyze(DATA / "nanogpt_compiled.json.gz", source_roots=[DATA])
    assert fig.has_gpu and fig.compiled["compiled"]
    call, back = _loop_line("logits, loss = model(X, Y)"), _loop_line("loss.backward()")
    assert {call, back} <= {c["site"] for c in fig.compiled["calls"]}, fig.compiled
    sites = {row["site"]: row for row in fig.host_bound_sites}
    assert call in sites and back in sites, list(sites)
    assert sites[call]["detail"] == "compiled" and sites[back]["detail"] == "compiled"
    for row in fig.host_bound_sites:  # a line of the loop, or a named cause: never torch's generated files
        assert row["site"].startswith("nanogpt_like.py:") or row["cause"] == "host launch overhead", row
    recs = recommend(fig)
    assert recs and recs[0].site in (call, back)
    for r in recs:
        assert "torchinductor" not in r.site and "try torch.compile" not in r.change, r
