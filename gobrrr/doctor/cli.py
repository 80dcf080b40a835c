"""`gobrrr doctor SCRIPT`: run an unmodified script as __main__ under a doctor session, and the demo's doctor step."""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from pathlib import Path

from gobrrr.doctor.report import side_by_side
from gobrrr.doctor.session import NO_GPU_NOTE, DoctorConfig, Session


def run_script(script: str, args: list[str], cfg: DoctorConfig) -> tuple[int, dict]:
    """Run `script` as __main__ under a doctor session; returns (exit code, report)."""
    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(f"no such script {script!r}; pass the path of a Python file")
    session = Session(cfg, script=str(path), argv=list(args))
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(path)] + list(args)
    sys.path.insert(0, str(path.resolve().parent))
    code, error = 0, None
    session.start()
    try:
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
        prog="gobrrr doctor", description="Run a script under the profiler and show where the GPU waits.")
    p.add_argument("--steps", type=int, default=5, help="steps to record (default 5)")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps to run before recording (default 2; 1 runs as 2; 0 records from the start)")
    p.add_argument("--out", default="gobrrr-doctor", help="output directory (default ./gobrrr-doctor)")
    p.add_argument("--window-s", type=float, default=10.0,
                   help="seconds recorded when the script never steps (default 10)")
    p.add_argument("--quiet", action="store_true", help="write the files, print no summary")
    p.add_argument("script", help="the Python script to run, unmodified")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    a = p.parse_args(argv)
    try:
        cfg = DoctorConfig(steps=a.steps, warmup=a.warmup, out_dir=a.out, window_s=a.window_s,
                           print_summary=not a.quiet)
        if not Path(a.script).is_file():
            raise FileNotFoundError(f"no such script {a.script!r}; pass the path of a Python file")
        _check_out_dir(a.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"gobrrr doctor: error: {e}", file=sys.stderr)
        return 2
    code, _ = run_script(a.script, a.args, cfg)
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
    """`make demo`: the doctor on examples/seed_loop.py, naive then gobrrr, figures side by side."""
    import torch

    root = Path(__file__).resolve().parents[2]
    seed = root / "examples" / "seed_loop.py"
    if not seed.is_file():
        print(f"gobrrr doctor demo: {seed} is missing; nothing to profile.")
        return {}
    cuda = torch.cuda.is_available()
    # on a GPU the seed loop drains (syncs) at the start of its step 5: record from step 6 on
    extra = ["--steps", "12"] if cuda else ["--device", "cpu", "--steps", "6"]
    steps, warmup = (5, 6) if cuda else (3, 2)
    reports = {}
    for mode in ("naive", "gobrrr"):
        cfg = DoctorConfig(steps=steps, warmup=warmup, out_dir=str(Path(out_dir) / mode), print_summary=False)
        code, report = run_script(str(seed), ["--mode", mode] + extra, cfg)
        if code != 0:
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
    return reports
