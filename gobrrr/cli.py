"""The `gobrrr` command: a thin table from subcommand to the function that does the work.

Each subcommand lives in its own module, imported only when used, and exposes
`main(argv: list[str]) -> int`. The CLI owns no logic of its own.
"""
from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS = {
    "demo": ("gobrrr.demo", "run the demo: prefetch, sync detective, lint and doctor on the seed loop"),
    "lint": ("gobrrr.device.lint", "static check for host-device anti-patterns (GB001-GB008)"),
    "doctor": ("gobrrr.doctor", "run a script under the profiler and show where the GPU waits"),
    "train": ("gobrrr.train", "train the reference GPT (works under torchrun)"),
    "plan": ("gobrrr.plan_cli", "memory, communication and step time of every parallel layout, before renting GPUs"),
    "bench": (None, "benchmarks: " + ", ".join(["copy", "prefetch", "syncwatch", "comm", "p2p", "ddp", "plan"])),
}

# `gobrrr bench NAME` -> module under bench/ (each also runs as `python -m bench.MODULE`)
BENCHES = {
    "copy": "bench.copy_bw",
    "prefetch": "bench.prefetch",
    "syncwatch": "bench.syncwatch",
    "comm": "bench.comm",
    "p2p": "bench.p2p",
    "ddp": "bench.ddp",
    "plan": "bench.plan_check",
}


def _usage() -> str:
    lines = ["usage: gobrrr COMMAND [args...]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`gobrrr COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
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
        if not rest or rest[0] not in BENCHES:
            which = rest[0] if rest else "(none)"
            print(f"gobrrr bench: unknown benchmark {which!r}; choose one of: {', '.join(BENCHES)}",
                  file=sys.stderr)
            return 2
        module_name, rest = BENCHES[rest[0]], rest[1:]
    else:
        module_name = COMMANDS[name][0]
    module = importlib.import_module(module_name)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
