"""Our own library passes our own lint: a deliberate sync carries `# sync: why` or `# gobrrr: ignore[GBxxx]`."""
from __future__ import annotations

from pathlib import Path

import gobrrr
from gobrrr.lint.check import lint_paths


def test_gobrrr_package_is_lint_clean():
    package = Path(gobrrr.__file__).resolve().parent
    errors: list[str] = []
    found = lint_paths([package], errors=errors)
    assert errors == []
    assert found == [], "gobrrr lint findings in the library (fix them, or mark a deliberate sync with " \
        "`# sync: why` / `# gobrrr: ignore[GBxxx]`):\n" + "\n".join(map(str, found))
