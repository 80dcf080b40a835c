"""The sync detective, statically: AST rules for the anti-patterns of the host-device model.

    gobrrr lint train.py src/ [--format text|json] [--select GB002,GB004] [--all] [--tests] [--exclude GLOB]

GB001  tensor built on the host then moved (`torch.randn(...).to(dev)`)       -> pass device=
GB002  `.item()/.cpu()/.tolist()/.numpy()`, `float/int/bool(t)` in a loop     -> keep on device, read once
GB003  printing or formatting a tensor in a loop                             -> log every N steps
GB004  `torch.cuda.synchronize()` / stream or event synchronize in a loop    -> order with events
GB005  `non_blocking=True` copy from pageable (unpinned) host memory         -> pin the source
GB006  `DataLoader` without `pin_memory=True` whose batches go to CUDA        -> pin_memory=True
GB007  a tensor as a Python condition in a loop (`if t > 0:`, `while t:`)    -> torch.where on device
GB008  data-dependent shapes in a loop (nonzero, x[mask], unique, masked_select) -> fixed-shape ops
GB009  blocking `.to(device)` / `.cuda()` of every batch in the step loop       -> pin + non_blocking, Prefetcher

Few false positives by design (a finding a user must dismiss costs more than a missed one):
a rule needs evidence that the value is a tensor (lint_kinds: a torch op, a loader's batch, a
model's output; never a module, a name or a Python predicate), and by default only code that
runs every step is reported (lint_hot: the step loop, per-step hooks and step methods such as a
trainer's `run_step`, the helpers they call in the same file, inherited or through a one-line
wrapper, and the functions of other checked files they import and call), not set-up, epoch-level,
rate-limited (`if step % 100 == 0:`, code after `if not should_log(step): return`), error or
timing code;
`--all` adds the findings in other loops. Files under tests/ and test_*.py are skipped when a
directory is walked (`--tests` keeps them); `--exclude GLOB` skips more. Suppress one line with
`# gobrrr: ignore[GB002]` (or `# gobrrr: ignore` for every rule); a line carrying the project's
`# sync: why` comment is a documented, deliberate sync and is exempt from the sync rules.
"""
from __future__ import annotations

import argparse
import ast
import errno
import io
import json
import os
import re
import sys
import tokenize
from fnmatch import fnmatch
from pathlib import Path

from gobrrr.lint.hot import HotMap, may_use_gpu
from gobrrr.lint.rules import RULES, SYNC_RULES, TITLES, Checker, Finding

__all__ = ["RULES", "Finding", "lint_source", "lint_paths", "main"]

SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules", "venv", ".venv", ".git"}
TEST_DIRS = {"tests", "test", "testing"}


# --------------------------------------------------------------------------------------- suppression

_IGNORE = re.compile(r"#\s*gobrrr:\s*ignore(?:\[([A-Za-z0-9_,\s]+)\])?")
_SYNC_NOTE = re.compile(r"#\s*sync:")


def _suppressions(text: str) -> dict[int, set[str]]:
    """line -> rule ids suppressed there ('*' for all), read from real comments only."""
    out: dict[int, set[str]] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type != tokenize.COMMENT:
                continue
            m = _IGNORE.search(tok.string)
            if m:
                ids = {s.strip().upper() for s in m.group(1).split(",")} if m.group(1) else {"*"}
                out.setdefault(tok.start[0], set()).update(ids)
            if _SYNC_NOTE.search(tok.string):
                out.setdefault(tok.start[0], set()).update(SYNC_RULES)
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


# ------------------------------------------------------------------------------------------- API

def lint_source(text: str, path: str = "<string>", select=None, everything: bool = False,
                called_from: dict[str, str] | None = None) -> list[Finding]:
    """Findings for one file's source text, sorted by line: those that run every step, or all of
    them with `everything`. `called_from` names this file's functions that another file's step loop
    calls (name -> 'train.py:LINE'): they are checked as hot too. Raises SyntaxError if it does not
    parse, RecursionError if too deep."""
    wanted = _select(select)
    tree = ast.parse(text, filename=path)
    if not may_use_gpu(text) and not called_from:
        return []  # a file that never names a device runs on the CPU: nothing to sync with
    checker = Checker(path, HotMap(tree, path))
    checker.check(tree, called_from)
    quiet = _suppressions(text)
    out = []
    for f in checker.findings.values():
        if f.rule not in wanted or not (everything or f.hot):
            continue
        node_lines = checker.spans[(f.rule, f.line)]
        if any(f.rule in quiet.get(i, ()) or "*" in quiet.get(i, ()) for i in node_lines):
            continue
        out.append(f)
    return sorted(out, key=lambda f: (f.line, f.col, f.rule))


def lint_paths(paths, select=None, errors: list | None = None, *, everything: bool = False,
               exclude=(), tests: bool = False) -> list[Finding]:
    """Findings for files and directories (every *.py below; hidden, build and test folders skipped).

    A path or file that cannot be found, read or parsed raises ValueError (FileNotFoundError for a
    missing path), unless `errors` is a list: then a line describing the problem is appended to it
    and the other files are still checked.
    """
    files, problems, _ = python_files(paths, exclude, tests)
    if problems and errors is None:
        raise FileNotFoundError(problems[0]) if "no such file" in problems[0] else ValueError(problems[0])
    if errors is not None:
        errors += problems
    findings: list[Finding] = []
    called = called_across(files)
    for file in files:
        try:
            findings += lint_file(file, select, everything, called.get(file))
        except ValueError as e:
            if errors is None:
                raise
            errors.append(str(e))
    return findings


def lint_file(file: Path, select=None, everything: bool = False, called_from=None) -> list[Finding]:
    """One file's findings; ValueError with a one-line reason if it cannot be read or parsed."""
    try:
        text = file.read_text(encoding="utf-8")
        return lint_source(text, str(file), select, everything, called_from)
    except (SyntaxError, UnicodeDecodeError, OSError) as e:
        line = getattr(e, "lineno", None)
        raise ValueError(f"{file}:{line or 0}: cannot check this file: {e.__class__.__name__}: "
                         f"{getattr(e, 'msg', e)}; fix it or skip it with --exclude") from e
    except (RecursionError, MemoryError) as e:
        raise ValueError(f"{file}:0: cannot check this file: an expression too deeply nested to parse "
                         f"({e.__class__.__name__}); split it or skip the file with --exclude") from e


# ------------------------------------------------------------------------- helpers in other files

def called_across(files: list[Path]) -> dict[Path, dict[str, str]]:
    """For each file, its module-level functions that another checked file calls from a step loop
    (`from utils import accuracy` ... `accuracy(out, y)` in the loop): name -> 'caller.py:LINE'.
    One level deep, like same-file helpers; a module is matched to a checked file by its dotted
    path's tail (`utils`, `pkg.utils` -> .../pkg/utils.py or .../utils/__init__.py)."""
    if len(files) < 2:
        return {}
    by_tail: dict[tuple[str, ...], list[Path]] = {}
    for f in files:
        parts = f.with_suffix("").parts if f.name != "__init__.py" else f.parent.parts
        for k in range(1, min(len(parts), 4) + 1):
            by_tail.setdefault(tuple(parts[-k:]), []).append(f)
    out: dict[Path, dict[str, str]] = {}
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
            if not may_use_gpu(text):
                continue
            tree = ast.parse(text, filename=str(f))
            hot = HotMap(tree, str(f))
        except (SyntaxError, UnicodeDecodeError, OSError, RecursionError, MemoryError, ValueError):
            continue   # reported when the file itself is checked
        funcs, mods = _imports(tree)
        for call in hot.hot_call_nodes:
            fn = call.func
            if isinstance(fn, ast.Name) and fn.id in funcs:
                module, name = funcs[fn.id]
            elif isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id in mods:
                module, name = mods[fn.value.id], fn.attr
            else:
                continue
            targets = [t for t in by_tail.get(tuple(module.split(".")), []) if t != f]
            if len(targets) == 1:   # ambiguous module names are left alone
                out.setdefault(targets[0], {}).setdefault(name, f"{f.name}:{call.lineno}")
    return out


def _imports(tree: ast.Module) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """(name -> (module, function) for `from m import f as name`, alias -> module for `import m as alias`)."""
    funcs: dict[str, tuple[str, str]] = {}
    mods: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith(("torch", "numpy")):
            for a in node.names:
                funcs[a.asname or a.name] = (node.module, a.name)
                mods[a.asname or a.name] = f"{node.module}.{a.name}"   # from pkg import utils; utils.f()
        elif isinstance(node, ast.Import):
            for a in node.names:
                mods[a.asname or a.name] = a.name
    return funcs, mods


def python_files(paths, exclude=(), tests: bool = False) -> tuple[list[Path], list[str], int]:
    """(files to check, problems with the given paths, test files skipped). A directory is walked
    for regular *.py files; a named file is checked even if it is a test."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    problems: list[str] = []
    skipped = 0
    for p in map(Path, paths):
        problem = _path_problem(p)
        if problem:
            problems.append(problem)
        elif p.is_dir():
            keep_tests = tests or any(part in TEST_DIRS for part in p.resolve().parts)
            for f in sorted(p.rglob("*.py")):
                rel = f.relative_to(p)
                if any(part in SKIP_DIRS or part.startswith(".") or part.endswith(".egg-info")
                       for part in rel.parts[:-1]) or _excluded(f, rel, exclude):
                    continue
                if not f.is_file():
                    continue  # a FIFO, a socket, a broken link, a folder named *.py: never opened
                if not keep_tests and _is_test(rel):
                    skipped += 1
                    continue
                files.append(f)
        elif p.is_file():
            if not _excluded(p, Path(p.name), exclude):
                files.append(p)
        else:
            problems.append(f"{p}: not a regular file (a FIFO, socket or device); pass a .py file or a directory")
    return files, problems, skipped


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


def _is_test(rel: Path) -> bool:
    return any(part in TEST_DIRS for part in rel.parts[:-1]) or rel.name == "conftest.py" \
        or fnmatch(rel.name, "test_*.py") or fnmatch(rel.name, "*_test.py")


def _excluded(f: Path, rel: Path, globs) -> bool:
    names = [f.as_posix(), rel.as_posix(), f.name, *rel.parts[:-1]]
    return any(fnmatch(n, g.rstrip("/")) for g in globs for n in names)


def _select(select) -> set[str]:
    if select is None:
        return set(RULES)
    ids = {s.strip().upper() for s in (select.split(",") if isinstance(select, str) else select) if s.strip()}
    if not ids:
        raise ValueError("--select names no rule; give rule ids such as GB002,GB004, or leave it out to check all")
    unknown = ids - set(RULES)
    if unknown:
        raise ValueError(f"unknown rule id(s) {', '.join(sorted(unknown))}; choose from {', '.join(RULES)}")
    return ids


def main(argv: list[str] | None = None) -> int:
    """`gobrrr lint PATH... [--format text|json] [--select IDS] [--all] [--tests] [--exclude GLOB]`:
    0 clean, 1 findings, 2 usage error or a path that could not be checked."""
    parser = argparse.ArgumentParser(
        prog="gobrrr lint", description="Static check for host-device anti-patterns (GB001-GB009) in the code "
        "that runs every training step.",
        epilog="Rules (each in the code that runs every step):\n" + "\n".join(f"  {k}  {t}" for k, t in TITLES.items())
        + "\n\nSuppress a line with `# gobrrr: ignore[GB002]`.", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or directories to check")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--select", metavar="IDS", help="comma-separated rule ids to check, e.g. GB002,GB004")
    parser.add_argument("--all", action="store_true", dest="everything",
                        help="also report loops that do not step (set-up, epoch-level, other loops)")
    parser.add_argument("--tests", action="store_true", help="also check tests/ folders and test_*.py files")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="skip files or folders matching GLOB (repeatable), e.g. --exclude 'examples/*'")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code in (0, None) else 2
    try:
        _select(args.select)
    except ValueError as e:
        print(f"gobrrr lint: error: {e}", file=sys.stderr)
        return 2
    files, errors, skipped = python_files(args.paths, args.exclude, args.tests)
    found: list[Finding] = []
    called = called_across(files)
    for file in files:
        try:
            found += lint_file(file, args.select, everything=True, called_from=called.get(file))
        except ValueError as e:
            errors.append(str(e))
    shown = [f for f in found if args.everything or f.hot]
    hidden = len(found) - len(shown)
    if args.format == "json":
        print(json.dumps([f.to_dict() for f in shown], indent=2))
    else:
        for f in shown:
            print(f)
        if shown:
            print("how to fix:")
            for rule in sorted({f.rule for f in shown}):
                print(f"  {rule}: {RULES[rule][1]}")
    sys.stdout.flush()
    for e in errors:  # before the summary, so a file that was not checked is never hidden under "clean"
        print(f"gobrrr lint: error: {e}", file=sys.stderr)
    sys.stderr.flush()
    if args.format == "text":
        print(_summary(len(shown), len(files), errors, hidden, skipped))
    return 2 if errors else (1 if shown else 0)


def _summary(n: int, n_files: int, errors: list[str], hidden: int, skipped: int) -> str:
    s = "s" if n != 1 else ""
    head = f"{n} finding{s} in {n_files} files" if n or errors else f"clean ({n_files} files)"
    if errors:
        head += f"; {len(errors)} path{'s' if len(errors) != 1 else ''} not checked (see the errors above)"
    extra = []
    if hidden:
        extra.append(f"{hidden} more outside the step loops (--all shows them)")
    if skipped:
        extra.append(f"{skipped} test files skipped (--tests checks them)")
    return "gobrrr lint: " + head + (f"; {'; '.join(extra)}" if extra else "")


if __name__ == "__main__":
    raise SystemExit(main())
