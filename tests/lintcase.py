"""What the lint's round tests share: the findings of one snippet, and the line a piece of text stands on."""
from __future__ import annotations

from gobrrr.lint.check import lint_source


def rules(src: str, path: str = "train.py") -> list[tuple[int, str]]:
    """(line, rule) of each default finding of `src`, linted alone as `path`."""
    return [(f.line, f.rule) for f in lint_source(src, path)]


def line_of(src: str, text: str) -> int:
    """The 1-based number of the first line of `src` that holds `text`."""
    return next(i for i, t in enumerate(src.splitlines(), 1) if text in t)
