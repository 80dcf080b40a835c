"""gobrrr.train.graph without a GPU: who may capture, and what `gobrrr train --cuda-graph` says on a CPU."""
from __future__ import annotations

import pytest
import torch

from gobrrr.train.cli import TrainConfig, parse_args, train
from gobrrr.train.graph import GraphedStep, graph_blocker


def test_cpu_cannot_capture():
    assert "need a GPU" in graph_blocker(torch.device("cpu"))


@pytest.mark.parametrize("kw, says", [
    ({"world_size": 2}, "several ranks"), ({"zero": 2}, "--zero"), ({"tp": 2}, "--tp"),
])
def test_what_blocks_a_graph_on_a_gpu(kw, says):
    assert says in graph_blocker(torch.device("cuda"), **kw)


def test_under_a_profiler_no_graph():
    """gobrrr doctor records with torch's profiler from the script's start: a graph would hide its steps."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert "gobrrr doctor" in graph_blocker(torch.device("cuda"))
    assert graph_blocker(torch.device("cuda")) is None


def test_under_the_doctor_no_graph(tmp_path, capfd):
    """The real thing: a script run by the doctor asks graph_blocker at its start, as `gobrrr train` does."""
    from gobrrr.doctor import DoctorConfig, run_script

    script = tmp_path / "ask.py"
    script.write_text("import torch\nfrom gobrrr.train.graph import graph_blocker\n"
                      "print('BLOCKER:', graph_blocker(torch.device('cuda')))\n")
    code, _ = run_script(str(script), [], DoctorConfig(out_dir=str(tmp_path / "d"), print_summary=False, window_s=5))
    assert code == 0
    assert "BLOCKER: not under a profiler such as gobrrr doctor" in capfd.readouterr().out


def test_graphed_step_needs_cuda():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(ValueError, match="CUDA device"):
        GraphedStep(lambda micro: torch.zeros(2), opt, torch.device("cpu"))


def test_flags_parse():
    assert parse_args(["--out", "x"]).cuda_graph is None
    assert parse_args(["--out", "x", "--cuda-graph"]).cuda_graph is True
    assert parse_args(["--out", "x", "--no-cuda-graph"]).cuda_graph is False


def test_cuda_graph_on_a_cpu_says_why_and_trains(tmp_path, capsys):
    train(TrainConfig(model="tiny", device="cpu", steps=2, batch_size=2, seq_len=16, log_every=1,
                      out=str(tmp_path / "r"), cuda_graph=True, compile=False))
    assert "notice: running without a CUDA graph: CUDA graphs need a GPU" in capsys.readouterr().err
