"""`gobrrr doctor SCRIPT` / `gobrrr doctor -m MODULE`: run unmodified code as __main__ under a doctor
session (each rank under torchrun), and the demo's doctor step."""
from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
import traceback
from pathlib import Path

from gobrrr.doctor.config import DoctorConfig
from gobrrr.doctor.overhead import ProfilerSettings
from gobrrr.doctor.ranks import rank_from_env
from gobrrr.doctor.report import side_by_side
from gobrrr.doctor.session import NO_GPU_NOTE, Session


def check_script(script: str) -> Path:
    """The script's path, or a one-line error saying what is wrong with it."""
    path = Path(script)
    if path.is_dir():
        raise FileNotFoundError(f"{script!r} is a directory, not a script; pass the path of a Python file "
                                "(e.g. train.py), or -m MODULE to run a module")
    if not path.is_file():
        raise FileNotFoundError(f"no such script {script!r}; pass the path of a Python file")
    return path


def module_file(module: str) -> Path:
    """The file `python -m MODULE` would run (a package's __main__.py), or a one-line error."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(module + ".__main__")
    except (ImportError, ValueError) as e:
        raise FileNotFoundError(f"cannot find module {module!r} ({e}); pass a module python -m can run") from None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise FileNotFoundError(f"no module named {module!r}; pass a module python -m can run, or a script path")
    return Path(spec.origin)


def run_script(script: str, args: list[str], cfg: DoctorConfig, *, module: str | None = None) -> tuple[int, dict]:
    """Run `script` (or, with `module`, that module as `python -m` would) as __main__ under a doctor
    session; returns (exit code, report)."""
    path = module_file(module) if module else check_script(script)
    session = Session(cfg, script=str(path), argv=list(args))
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(path)] + list(args)
    sys.path.insert(0, str(path.resolve().parent) if not module else os.getcwd())
    code, error = 0, None
    session.start()
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt as e:
        code, error = 130, e
    except BaseException as e:  # the script's own failure: report it the way Python would
        code, error = 1, e
        _print_script_traceback(e, path)
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    report = session.finish(exit_code=code, error=error)
    return code, report


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _print_script_traceback(e: BaseException, path: Path) -> None:
    """The traceback from the script's first frame on (without runpy's and the doctor's frames)."""
    tb = e.__traceback__
    target = str(path.resolve())
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb or e.__traceback__, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gobrrr doctor", description="Run a script under the profiler and show where the GPU waits "
        "(under torchrun: every rank, merged by rank 0).")
    p.add_argument("--steps", type=int, default=5, help="steps to record (default 5)")
    p.add_argument("--warmup", type=int, default=3,
                   help="steps to run before recording (default 3: the last warms the profiler up; 1 runs as 2; 0 records "
                        "from the start)")
    p.add_argument("--plain-steps", type=int, default=5,
                   help="steps timed without the profiler after the recording, for its overhead (default 5; 0: none)")
    p.add_argument("--out", default="gobrrr-doctor", help="output directory (default ./gobrrr-doctor)")
    p.add_argument("--window-s", type=float, default=10.0,
                   help="seconds recorded when the script never steps (default 10)")
    p.add_argument("--no-stack", action="store_true", help="no Python stacks: lighter, but no line of yours is named")
    p.add_argument("--line-steps", type=int, default=3,
                   help="steps recorded with Python stacks after the figure steps, to name your lines (default 3; "
                        "0: stacks in the figure steps, dearer figures)")
    p.add_argument("--detective", action="store_true", help="run the sync detective over the recorded steps too")
    p.add_argument("--shapes", action="store_true", help="record input shapes of every op (heavier)")
    p.add_argument("--memory", action="store_true", help="record allocations (heavier)")
    p.add_argument("--user-path", action="append", default=[], metavar="PATH",
                   help="count files under PATH as yours even inside an installed package (repeatable)")
    p.add_argument("--rank-wait-s", type=float, default=120.0,
                   help="under torchrun, how long rank 0 waits for the other ranks' reports (default 120)")
    p.add_argument("--quiet", action="store_true", help="write the files, print no summary")
    p.add_argument("-m", dest="module", default=None, metavar="MODULE",
                   help="run a module as python -m does (e.g. -m gobrrr train ...) instead of a script")
    p.add_argument("script", nargs="?", help="the Python script to run, unmodified")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    a = p.parse_args(argv)
    rank = rank_from_env()
    try:
        if a.module:
            args = ([a.script] if a.script else []) + a.args
            module_file(a.module)
        elif a.script is None:
            raise ValueError("no script given; pass the path of a Python file (or -m MODULE)")
        else:
            args = a.args
            check_script(a.script)
        user = list(a.user_path) or (["gobrrr/train"] if (a.module or "").split(".")[0] == "gobrrr" else [])
        cfg = DoctorConfig(steps=a.steps, warmup=a.warmup, out_dir=a.out, window_s=a.window_s,
                           print_summary=not a.quiet, plain_steps=a.plain_steps, user_paths=user,
                           line_steps=a.line_steps,
                           rank_wait_s=a.rank_wait_s,
                           settings=ProfilerSettings(stack=not a.no_stack, detective=a.detective, shapes=a.shapes,
                                                     memory=a.memory))
        _check_out_dir(a.out)
    except (FileNotFoundError, ValueError) as e:
        if rank is None or rank.is_main:  # under torchrun: one line, from rank 0
            print(f"gobrrr doctor: error: {e}", file=sys.stderr)
        return 2
    code, _ = run_script(a.script, args, cfg, module=a.module)
    return code


def _check_out_dir(out: str) -> None:
    """--out must be a folder we can write (created if missing): say so before the script runs."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ValueError(f"--out {out} is a file, or lies under one, not a folder; pass a folder path "
                         "(it is created if missing)") from None
    except OSError as e:
        raise ValueError(f"cannot create the --out folder {out} ({e.strerror}); pass a folder you can "
                         "write to") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"the --out folder {out} is not writable; pass a folder you can write to")


def demo_doctor(out_dir) -> dict[str, dict]:
    """`make demo`: the doctor on examples/seed_loop.py, naive then gobrrr, figures side by side.

    The seed loop's own ms/step lines are not shown here: under the doctor they time the profiler and the
    doctor's analysis too. The table gives the doctor's step times instead: recorded (under the profiler)
    and plain (the steps after the recording, no profiler), the one to compare with section 1's figures.
    """
    import contextlib
    import io

    import torch

    root = Path(__file__).resolve().parents[2]
    seed = root / "examples" / "seed_loop.py"
    if not seed.is_file():
        print(f"gobrrr doctor demo: {seed} is missing; nothing to profile.")
        return {}
    cuda = torch.cuda.is_available()
    # on a GPU the seed loop drains (syncs) at the start of its step 5: record from step 6 on. The seed loop runs
    # 5 + --steps boundaries on a GPU (1 + --steps on a CPU); the doctor takes Session.steps_needed() of them
    # (the warmup, the figure steps, the line steps, one settling step and the plain ones)
    steps, warmup, plain = (5, 6, 5) if cuda else (3, 3, 2)
    reports = {}
    for mode in ("naive", "gobrrr"):
        cfg = DoctorConfig(steps=steps, warmup=warmup, out_dir=str(Path(out_dir) / mode), print_summary=False,
                           plain_steps=plain, line_steps=2)
        needed = Session(cfg, auto_steps=False).steps_needed()
        extra = ["--steps", str(needed - 5)] if cuda else ["--device", "cpu", "--steps", str(needed - 1)]
        own = io.StringIO()
        with contextlib.redirect_stdout(own):  # the loop's own timing lines: see the docstring
            code, report = run_script(str(seed), ["--mode", mode] + extra, cfg)
        if code != 0:
            print(own.getvalue()[-2000:])
            print(f"gobrrr doctor demo: seed_loop.py --mode {mode} exited with {code}")
        reports[mode] = report
    if not cuda:
        print(NO_GPU_NOTE)
    print(side_by_side(reports))
    for mode in ("naive", "gobrrr"):
        first = reports[mode].get("advice") or []
        if first:
            a = first[0]
            where = f"{a['site']}  {a['code'][:60]}" if a["site"] else "(the whole step)"
            print(f"doctor's first fix for the {mode} loop: {where}\n  -> {a['change']}")
        else:
            print(f"doctor's first fix for the {mode} loop: none (nothing measured or linted in its recorded steps)")
    return reports
