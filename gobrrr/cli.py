"""The `gobrrr` command: a thin table from subcommand to the function that does the work.

Each subcommand lives in its own module, imported only when used, and exposes
`main(argv: list[str]) -> int`. The CLI owns no logic of its own.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys

# subcommand -> (module, one-line help)
COMMANDS = {
    "demo": ("gobrrr.demo", "run the demo: one step per part (Prefetcher, syncs, doctor, ranks, ZeRO, TP, train)"),
    "lint": ("gobrrr.lint.check", "static check for host-device anti-patterns (GB001-GB009)"),
    "doctor": ("gobrrr.doctor.cli", "run a script under the profiler and show where the GPU waits"),
    "train": ("gobrrr.train.cli", "train the reference GPT (works under torchrun)"),
    "plan": ("gobrrr.plan.cli", "memory, communication and step time of every parallel layout, before renting GPUs"),
    "bench": (None, "benchmarks: " + ", ".join(["copy", "prefetch", "syncwatch", "comm", "p2p", "ddp", "train",
                                                 "zero", "tp", "plan", "doctor"])),
}

# `gobrrr bench NAME` -> module under gobrrr/bench/ (each also runs as `python -m gobrrr.bench.MODULE`)
BENCHES = {
    "copy": "gobrrr.bench.copy_bw",
    "prefetch": "gobrrr.bench.prefetch",
    "prefetch_busy": "gobrrr.bench.prefetch_busy",
    "syncwatch": "gobrrr.bench.syncwatch",
    "comm": "gobrrr.bench.comm",
    "p2p": "gobrrr.bench.p2p",
    "ddp": "gobrrr.bench.ddp",
    "train": "gobrrr.bench.train",
    "zero": "gobrrr.bench.zero",
    "tp": "gobrrr.bench.tp",
    "plan": "gobrrr.bench.plan_check",
    "doctor": "gobrrr.bench.doctor",
}


def _usage() -> str:
    lines = ["usage: gobrrr COMMAND [args...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`gobrrr COMMAND --help` for a command's options."]
    return "\n".join(lines)


def _bench_usage() -> str:
    """One line per benchmark: the first line of its module docstring (read without importing torch)."""
    import ast
    from pathlib import Path

    lines = ["usage: gobrrr bench NAME [--quick] [--results DIR] [args...]", "", "benchmarks:"]
    root = Path(__file__).resolve().parent.parent
    for name, module in BENCHES.items():
        try:
            doc = ast.get_docstring(ast.parse((root / (module.replace(".", "/") + ".py")).read_text())) or ""
        except (OSError, SyntaxError):
            doc = ""
        first = doc.strip().splitlines()[0] if doc.strip() else ""
        width = max(map(len, BENCHES)) + 1
        lines.append(f"  {name:<{width}} {first.split(': ', 1)[-1] if first.startswith('`') else first}")
    lines += ["", "`gobrrr bench NAME --help` for a benchmark's options. --quick runs are smoke tests; their",
              "records go to a cache folder, not bench/results/, unless --results DIR says where."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run one command. Output piped into a reader that stops early (`gobrrr lint . | head`) ends the run quietly
    with 1, as a closed pipe does for other tools, and not with a traceback; Ctrl-C that no command handles itself
    ends it with one line and 130, as a shell reports SIGINT."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)   # Python flushes stdout again at exit: let that go nowhere
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print("gobrrr: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from gobrrr import __version__

        print(f"gobrrr {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"gobrrr: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if name == "bench":
        if rest and rest[0] in ("-h", "--help", "help"):
            print(_bench_usage())
            return 0
        if not rest or rest[0] not in BENCHES:
            which = f"unknown benchmark {rest[0]!r}" if rest else "no benchmark named"
            print(f"gobrrr bench: error: {which}; choose one of: {', '.join(BENCHES)} "
                  "(`gobrrr bench --help` describes them)", file=sys.stderr)
            return 2
        module_name, rest = BENCHES[rest[0]], rest[1:]
        with _quick_records_elsewhere(rest):
            return int(importlib.import_module(module_name).main(rest) or 0)
    else:
        module_name = COMMANDS[name][0]
    module = importlib.import_module(module_name)
    return int(module.main(rest) or 0)


@contextlib.contextmanager
def _quick_records_elsewhere(args: list[str]):
    """A `--quick` smoke run of any benchmark records into a cache folder, never into the committed
    bench/results/, unless --results or GOBRRR_BENCH_RESULTS says where (gobrrr/bench/common.py's rule,
    applied here too so that a benchmark which does not pass `quick=` to `record` is covered)."""
    if "--quick" not in args or "--results" in args or os.environ.get("GOBRRR_BENCH_RESULTS"):
        yield
        return
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    os.environ["GOBRRR_BENCH_RESULTS"] = os.path.join(cache, "gobrrr", "bench-results")
    try:
        yield
    finally:
        os.environ.pop("GOBRRR_BENCH_RESULTS", None)


if __name__ == "__main__":
    raise SystemExit(main())
