"""The scripts a user copies, run as the README says, on CPU.

  * examples/zero.py and examples/tp.py under `torchrun --nproc-per-node 2` (gloo) print, step by
    step, the losses of a one-process run of the same script (same global batch at every layout);
  * each README section names its example and the command that runs it;
  * the README Quickstart's code block, exactly as written, runs on a machine without CUDA: batches
    pass through the Prefetcher with one warning, and the report prints.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
STEPS = 4


def _start(args: list[str]) -> tuple[list[str], subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # CPU ranks, gloo: what CI has
    return args, subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(started: tuple[list[str], subprocess.Popen], timeout: float = 240) -> str:
    args, proc = started
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(args)} ran past {timeout} s:\n{out[-3000:]}\n{err[-3000:]}") from None
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    return out


def _losses(out: str) -> list[float]:
    found = [(int(m.group(1)), float(m.group(2))) for m in re.finditer(r"^step (\d+) loss ([0-9.]+)$", out, re.M)]
    assert [s for s, _ in found] == list(range(1, STEPS + 1)), out
    return [v for _, v in found]


def _two_ranks_and_one(script: str, two: list[str], one: list[str]) -> tuple[str, str]:
    """`torchrun --nproc-per-node 2 examples/SCRIPT ...` and `python examples/SCRIPT ...`, side by side."""
    a = _start([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                f"examples/{script}", *two])
    b = _start([sys.executable, f"examples/{script}", *one])
    return _wait(a), _wait(b)


def test_zero_example_two_ranks_print_the_one_process_losses():
    args = ["--stage", "3", "--steps", str(STEPS)]
    two, one = _two_ranks_and_one("zero.py", args, args)
    torch.testing.assert_close(torch.tensor(_losses(two)), torch.tensor(_losses(one)), rtol=0, atol=2e-5)
    assert _losses(one)[-1] < _losses(one)[0]  # it trains
    for r in (0, 1):  # each rank reports what it held, beside the formula
        assert f"[rank {r}] zero stage 3, rank {r} of 2" in two, two
    assert "[rank 0] zero stage 3, rank 0 of 1" in one


def test_tp_example_two_ranks_print_the_one_process_losses():
    two, one = _two_ranks_and_one("tp.py", ["--tp", "2", "--sp", "--steps", str(STEPS)], ["--tp", "1", "--steps", str(STEPS)])
    torch.testing.assert_close(torch.tensor(_losses(two)), torch.tensor(_losses(one)), rtol=0, atol=2e-5)
    assert _losses(one)[-1] < _losses(one)[0]
    assert re.search(r"^\d+ collectives per step, .* \(tp=2\)$", two, re.M), two  # the comm plan closes the run


@pytest.mark.parametrize("section, script, command", [
    ("### ZeRO", "examples/zero.py", "torchrun --nproc-per-node 2 examples/zero.py"),
    ("### Tensor parallelism", "examples/tp.py", "torchrun --nproc-per-node 4 examples/tp.py"),
])
def test_readme_sections_name_their_example_and_its_command(section, script, command):
    body = README.split(section, 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    assert script in body and command in body, f"README {section!r} should name {script} and `{command} ...`"
    assert (ROOT / script).is_file()


def _quickstart() -> str:
    section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


class _Model(torch.nn.Module):
    """What the Quickstart's `model(x, y)` stands for: a model that returns the loss."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 3)
        self.seen: list[torch.Tensor] = []

    def forward(self, x, y):
        self.seen.append(x)
        return torch.nn.functional.cross_entropy(self.lin(x), y)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the promise is about a machine without CUDA")
def test_readme_quickstart_runs_as_written_on_a_cpu(capsys):
    code = _quickstart()
    assert 'gb.Prefetcher(loader, device="cuda")' in code  # the line the promise is about, as the README shows it
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(3)]
    model = _Model()
    ns = {"loader": batches, "model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1)}
    with pytest.warns(UserWarning, match="CUDA is not available") as caught:
        exec(compile(code, "README.md (Quickstart)", "exec"), ns)
    (notice,) = [w for w in caught if "CUDA is not available" in str(w.message)]  # one notice
    assert notice.filename == "README.md (Quickstart)" and notice.lineno == 2  # at the user's Prefetcher line
    assert len(model.seen) == 3
    for got, (x, _) in zip(model.seen, batches):  # passed through: the same tensors, still on the CPU
        assert got.device.type == "cpu"
        torch.testing.assert_close(got, x)
    assert capsys.readouterr().out.strip(), "report.print() printed nothing"
