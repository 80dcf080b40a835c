"""Which files `gobrrr lint` checks: every regular *.py below the paths given, minus hidden, build
and test folders (unless asked), minus --exclude globs, each file once; and one-line problems for
paths that cannot be checked (missing, a link loop, a FIFO); and each file's text, decoded as Python reads it."""
from __future__ import annotations

import errno
import os
import re
import tokenize
from fnmatch import fnmatch
from pathlib import Path

SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules", "venv", ".venv", ".git"}
TEST_DIRS = {"tests", "test", "testing"}


def python_files(paths, exclude=(), tests: bool = False) -> tuple[list[Path], list[str], int]:
    """(files to check, problems with the given paths, test files skipped). A directory is walked
    for regular *.py files; a named file is checked even if it is a test."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    problems: list[str] = []
    skipped = 0
    maybe: list[Path] = []   # named like a test and defining test_ functions, but maybe a module the project imports
    for p in map(Path, paths):
        problem = _path_problem(p)
        if problem:
            problems.append(problem)
        elif p.is_dir():
            keep_tests = tests or any(part in TEST_DIRS for part in p.resolve().parts)
            found = sorted(p.rglob("*.py"))
            if not found:
                problems.append(f"{p}: no Python files (*.py) below this folder; pass a folder or file with "
                                f"Python code")
            for f in found:
                rel = f.relative_to(p)
                if any(part in SKIP_DIRS or part.startswith(".") or part.endswith(".egg-info")
                       for part in rel.parts[:-1]) or _excluded(f, rel, exclude):
                    continue
                if not f.is_file():
                    continue  # a FIFO, a socket, a broken link, a folder named *.py: never opened
                test = not keep_tests and _is_test(rel, f)
                if test == "defines":
                    maybe.append(f)
                elif test:
                    skipped += 1
                else:
                    files.append(f)
        elif p.is_file():
            if not _excluded(p, Path(p.name), exclude):
                files.append(p)
        else:
            problems.append(f"{p}: not a regular file (a FIFO, socket or device); pass a .py file or a directory")
    used = _imported(maybe, files)
    files += [f for f in maybe if f in used]
    return _once(files), problems, skipped + len(maybe) - len(used)


def _imported(maybe: list[Path], files: list[Path]) -> set[Path]:
    """The files of `maybe` that a checked file imports by module name: NGCF's `utility/batch_test.py` (its helper
    `test_one_user` named like a test) holds the data sampler main.py imports with `from utility.batch_test import *`;
    a pytest module is never imported by the code it tests."""
    if not maybe:
        return set()
    stems = {f.stem: f for f in maybe}
    pattern = re.compile(r"^\s*(?:from\s+[\w.]*?\b(%s)\b[\w.]*\s+import|import\s+[\w.]*?\b(%s)\b)"
                         % ("|".join(map(re.escape, stems)), "|".join(map(re.escape, stems))), re.M)
    used: set[Path] = set()
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        used |= {stems[a or b] for a, b in pattern.findall(text)}
        if len(used) == len(stems):
            break
    return used


def _once(files: list[Path]) -> list[Path]:
    """Each file once, by its resolved path (`gobrrr lint DIR DIR/loop.py` names loop.py twice), first seen kept."""
    seen: set[Path] = set()
    out = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _path_problem(p: Path) -> str | None:
    try:
        os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{p}: a symbolic link loop; fix or remove the link"
        if p.is_symlink():
            return f"{p}: a broken symbolic link (to {os.readlink(p)}); fix or remove the link"
        if e.errno == errno.ENOENT:
            return f"{p}: no such file or directory; check the path"
        return f"{p}: cannot be read ({e.strerror}); check its permissions"
    return None


def _is_test(rel: Path, f: Path) -> bool | str:
    """A file of a test folder, a conftest.py, or a file named like a test (`test_*.py`, `*_test.py`) that is one:
    it uses a test framework or defines a test. TCN's `add_test.py` (a training script that names its task) is not."""
    if any(part in TEST_DIRS for part in rel.parts[:-1]) or rel.name == "conftest.py":
        return True
    if not (fnmatch(rel.name, "test_*.py") or fnmatch(rel.name, "*_test.py")):
        return False
    try:
        text = f.read_text(errors="replace")
    except OSError:
        return True
    if _FRAMEWORK.search(text):
        return True
    return "defines" if _TESTS.search(text) else False   # test_ defs or Test classes: a test unless imported


# what a test file holds: a test framework, a test function or a test class
_FRAMEWORK = re.compile(r"^\s*(?:import|from)\s+(?:pytest|unittest|nose|hypothesis)\b", re.M)
_TESTS = re.compile(r"^\s*(?:async\s+)?def\s+test_|^\s*class\s+Test", re.M)


def _excluded(f: Path, rel: Path, globs) -> bool:
    names = [f.as_posix(), rel.as_posix(), f.name, *rel.parts[:-1]]
    return any(fnmatch(n, g.rstrip("/")) for g in globs for n in names)


_PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


def inside_project(paths: list[Path]) -> list[str]:
    """Each file's path below its project's root: what the file's own names say (`benchmarks/attn.py` is a
    benchmark), not where the project sits (`~/speedrun/train.py` is not). The root is the nearest folder
    above the file that holds `.git`, `pyproject.toml` or `setup.py`; without one, the folder holding every
    file given."""
    where = [p.resolve() for p in paths]
    try:
        common = Path(os.path.commonpath([str(p.parent) for p in where])) if where else None
    except ValueError:   # paths on different drives
        common = None
    roots: dict[Path, Path | None] = {}

    def root_of(folder: Path) -> Path | None:
        if folder not in roots:
            roots[folder] = folder if any((folder / m).exists() for m in _PROJECT_MARKERS) else \
                (root_of(folder.parent) if folder.parent != folder else None)
        return roots[folder]

    out = []
    for p in where:
        root = root_of(p.parent) or common
        out.append(str(p.relative_to(root)) if root is not None and p.is_relative_to(root) else p.name)
    return out


def read_text(file: Path) -> str:
    """The file's text in the encoding Python itself reads (a UTF-8 BOM, a `coding:` line). A cookie naming a
    codec this Python does not know, most often one a package registers at run time (`# -*- coding:
    future_fstrings -*-`, a backport of f-strings), is read as UTF-8: what those codecs decode."""
    try:
        with tokenize.open(file) as f:
            return f.read()
    except SyntaxError as e:
        if "unknown encoding" not in str(e.msg):
            raise
        return file.read_bytes().decode("utf-8")


__all__ = ["python_files", "inside_project", "read_text", "SKIP_DIRS", "TEST_DIRS"]
