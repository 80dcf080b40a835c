"""What the lint's round tests share: the findings of one snippet or of a small project, and the line a piece of
text stands on."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gobrrr.lint.check import lint_paths, lint_source


def rules(src: str, path: str = "train.py") -> list[tuple[int, str]]:
    """(line, rule) of each default finding of `src`, linted alone as `path`."""
    return [(f.line, f.rule) for f in lint_source(src, path)]


def line_of(src: str, text: str) -> int:
    """The 1-based number of the first line of `src` that holds `text`."""
    return next(i for i, t in enumerate(src.splitlines(), 1) if text in t)


def project_rules(tmp_path: Path, files: dict[str, str], root: str = "project") -> list[tuple[str, int, str]]:
    """(file name, line, rule) of each default finding of a project made of `files` (name -> source), linted
    together as the default run lints a checkout: a step loop in one file changes what counts as hot in another.
    `root` names the project's folder (not one named like a test's, which the default's search passes over)."""
    root = tmp_path / root
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)   # "DQN/DQN.py": a project of folders
        (root / name).write_text(textwrap.dedent(text))
    return [(Path(f.path).name, f.line, f.rule) for f in lint_paths([root])]
