"""The sync detective, statically: AST rules for the anti-patterns of the host-device model.

    gobrrr lint train.py src/ [--format text|json] [--select GB002,GB004]

GB001  tensor built on the host then moved (`torch.randn(...).to(dev)`)       -> pass device=
GB002  `.item()/.cpu()/.tolist()/.numpy()`, `float/int/bool(t)` in a loop     -> keep on device, read once
GB003  printing or formatting a tensor in a loop                             -> log every N steps
GB004  `torch.cuda.synchronize()` / stream or event synchronize in a loop    -> order with events
GB005  `non_blocking=True` copy from pageable (unpinned) host memory         -> pin the source
GB006  `DataLoader` without `pin_memory=True` whose batches go to CUDA        -> pin_memory=True
GB007  a tensor as a Python condition in a loop (`if t > 0:`, `while t:`)    -> torch.where on device
GB008  data-dependent shapes in a loop (nonzero, x[mask], unique, masked_select) -> fixed-shape ops

Few false positives by design: the checker tracks, per scope, what each name holds (a Python
number, a host tensor, a pinned tensor, a device tensor, a numpy array, a loader) and only flags a
sync rule on something that can be a device tensor; it tells loop bodies from set-up code (the
iterable of a `for`, the `else`, code before the loop); and a read under a periodic guard
(`if step % 100 == 0:`) is the recommended fix, so it is not flagged. Suppress one line with
`# gobrrr: ignore[GB002]` (or `# gobrrr: ignore` for every rule); a line carrying the project's
`# sync: why` comment is a documented, deliberate sync and is exempt from the sync rules.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from pathlib import Path

from gobrrr.device.lint_rules import RULES, SYNC_RULES, Checker, Finding

__all__ = ["RULES", "Finding", "lint_source", "lint_paths", "main"]

SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules", "venv", ".venv", ".git"}


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

def lint_source(text: str, path: str = "<string>", select=None) -> list[Finding]:
    """Findings for one file's source text, sorted by line. Raises SyntaxError if it does not parse."""
    tree = ast.parse(text, filename=path)
    checker = Checker(path)
    checker.scope_node = tree
    checker.visit(tree)
    checker.check_loaders()
    wanted = _select(select)
    quiet = _suppressions(text)
    out = []
    for f in checker.findings.values():
        if f.rule not in wanted:
            continue
        node_lines = checker.spans[(f.rule, f.line)]
        if any(f.rule in quiet.get(i, ()) or "*" in quiet.get(i, ()) for i in node_lines):
            continue
        out.append(f)
    return sorted(out, key=lambda f: (f.line, f.col, f.rule))


def lint_paths(paths, select=None, errors: list | None = None) -> list[Finding]:
    """Findings for files and directories (every *.py below, hidden and build folders skipped).

    A file that cannot be read or parsed raises ValueError, unless `errors` is a list: then a line
    describing the problem is appended to it and the other files are still checked.
    """
    findings: list[Finding] = []
    for file in _python_files(paths):
        try:
            text = file.read_text(encoding="utf-8")
            findings += lint_source(text, str(file), select)
        except (SyntaxError, UnicodeDecodeError, OSError) as e:
            line = getattr(e, "lineno", None)
            msg = f"{file}:{line or 0}: cannot check this file: {e.__class__.__name__}: {getattr(e, 'msg', e)}"
            if errors is None:
                raise ValueError(msg) from e
            errors.append(msg)
    return findings


def _python_files(paths) -> list[Path]:
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"gobrrr lint: no such file or directory: {p}")
        if p.is_dir():
            files += sorted(f for f in p.rglob("*.py") if not any(
                part in SKIP_DIRS or part.startswith(".") or part.endswith(".egg-info")
                for part in f.relative_to(p).parts[:-1]))
        else:
            files.append(p)
    return files


def _select(select) -> set[str]:
    if select is None:
        return set(RULES)
    ids = {s.strip().upper() for s in (select.split(",") if isinstance(select, str) else select) if s.strip()}
    unknown = ids - set(RULES)
    if unknown:
        raise ValueError(f"unknown rule id(s) {', '.join(sorted(unknown))}; choose from {', '.join(RULES)}")
    return ids


def main(argv: list[str] | None = None) -> int:
    """`gobrrr lint PATH... [--format text|json] [--select IDS]`: 0 clean, 1 findings, 2 usage or parse error."""
    parser = argparse.ArgumentParser(
        prog="gobrrr lint", description="Static check for host-device anti-patterns (GB001-GB008).",
        epilog="Rules:\n" + "\n".join(f"  {k}  {v[0].format(what='a sync', where='')}" for k, v in RULES.items())
        + "\n\nSuppress a line with `# gobrrr: ignore[GB002]`.", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or directories to check")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--select", metavar="IDS", help="comma-separated rule ids to check, e.g. GB002,GB004")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code in (0, None) else 2
    errors: list[str] = []
    try:
        _select(args.select)
        findings = lint_paths(args.paths, args.select, errors=errors)
    except (ValueError, FileNotFoundError) as e:
        print(f"gobrrr lint: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        for f in findings:
            print(f)
        n_files = len(_python_files(args.paths))
        print(f"gobrrr lint: {len(findings)} finding{'s' if len(findings) != 1 else ''} in {n_files} files"
              if findings else f"gobrrr lint: clean ({n_files} files)")
    for e in errors:
        print(e, file=sys.stderr)
    return 2 if errors else (1 if findings else 0)


if __name__ == "__main__":
    raise SystemExit(main())
