"""gobrrr lint, issue 29's round on heldout43's misses (LightningDiT, FairMOT, LLaVA, SLM-Lab), and where a project
sits: each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gobrrr.lint import lint_paths


def _lint(tmp_path: Path, files: dict[str, str], root: str = "proj") -> set[tuple[str, int, str]]:
    base = tmp_path / root
    for name, text in files.items():
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text(textwrap.dedent(text))
    return {(Path(f.path).name, f.line, f.rule) for f in lint_paths([base])}


_TIMED_STEP = """
    import torch

    def train(model, loader, opt):
        model.cuda()
        for x, y in loader:
            loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
    """


def test_a_project_folder_named_like_a_benchmark_is_not_one(tmp_path):
    """Whether a file is a benchmark (where synchronize() times the step) is read from its own name and the
    folders inside the project, not from the folders the project sits in: a user's `~/speedrun/train.py`."""
    assert ("train.py", 10, "GB004") in _lint(tmp_path, {"train.py": _TIMED_STEP}, root="speedrun")
    assert ("bench_step.py", 10, "GB004") not in _lint(tmp_path, {"bench_step.py": _TIMED_STEP}, root="other")


def test_the_project_root_is_the_folder_with_its_marker(tmp_path):
    """A checkout with `.git` (or pyproject.toml / setup.py) is the project: its benchmarks folder still makes a
    benchmark, and linting only that folder does not lose it; the folders above the checkout say nothing."""
    (tmp_path / "speedrun" / ".git").mkdir(parents=True)
    files = {"train.py": _TIMED_STEP, "benchmarks/step.py": _TIMED_STEP}
    found = _lint(tmp_path, files, root="speedrun")
    assert ("train.py", 10, "GB004") in found
    assert ("step.py", 10, "GB004") not in found
    assert not {f.line for f in lint_paths([tmp_path / "speedrun" / "benchmarks"]) if f.rule == "GB004"}
