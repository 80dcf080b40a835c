"""`make demo` / `gobrrr demo`: a short tour of gobrrr on whatever machine this is, one step per part.

    1 prefetch  the seed loop, naive and with the Prefetcher          (Part 1)
    2 syncs     lint and the runtime sync detective on it             (Part 1)
    3 doctor    the seed loop under the doctor, before and after      (Part 1)
    4 ranks     two processes: all-reduce and the ring built from send/recv   (Parts 2-3)
    5 zero      ZeRO stages 0-3 side by side: bytes per rank against the formula, a bar chart (Part 5)
    6 tp        one block's collectives with and without sequence parallelism (Part 6)
    7 train     `gobrrr train` on the reference GPT, wrapped in ddp   (Parts 4-6 applied)

On a GPU it prints the seed loop's naive-vs-gobrrr comparison, the syncs found at run time,
and the doctor's before/after figures. On a CPU it runs the same API (batches pass through,
collectives go over gloo) and says plainly which GPU-only parts it skipped. Steps 5 and 6 run
their ranks with NCCL when there is a GPU for each rank, over gloo on the CPU otherwise.
`--only zero,tp` runs some steps; tables and pictures go under `--out` (`make demo`: demo-out/).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SEED_LOOP = ROOT / "examples" / "seed_loop.py"


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(3, 70 - len(title)))


def _skipped(what: str, instead: str = "") -> None:
    print(f"[needs a CUDA GPU, skipped here: {what}" + (f"; {instead}" if instead else "") + "]")


def demo_prefetch(cuda: bool) -> None:
    _section("1. Prefetcher: the next batch crosses while this step computes")
    args = [sys.executable, str(SEED_LOOP), "--mode", "both"]
    if not cuda:
        args += ["--device", "cpu", "--steps", "5"]
        _skipped("the speed comparison", "both loops run, batches pass through the Prefetcher unchanged")
    subprocess.run(args, check=True)


def demo_syncs(cuda: bool) -> None:
    _section("2. Sync detective: every host-device sync, by source line")
    from gobrrr.lint.check import lint_paths

    findings = lint_paths([str(SEED_LOOP)])
    print(f"gobrrr lint {SEED_LOOP.relative_to(ROOT)}: {len(findings)} finding{'' if len(findings) == 1 else 's'}")
    for f in findings:
        print(f"  {Path(f.path).name}:{f.line}:{f.col} {f.rule} {f.message}")
    if not cuda:
        _skipped("the runtime sync detective (syncs are a host-device matter)")
        return
    import gobrrr as gb

    x = torch.randn(1024, 1024, device="cuda")
    with gb.watch_syncs() as report:
        for _ in range(3):
            y = x @ x
            if y.sum() > 0:  # sync: deliberate, the demo shows the detective a tensor used as a condition
                pass
            _ = y.max().item()  # sync: deliberate, one more for the detective to find
        torch.cuda.synchronize()
    report.print()


def demo_doctor(cuda: bool, out: Path) -> None:
    _section("3. Doctor: where the GPU waits, naive vs gobrrr")
    from gobrrr.doctor import demo_doctor as run_demo_doctor

    run_demo_doctor(out)  # on a CPU it says itself which figures need a GPU


def demo_ranks() -> None:
    _section("4. Ranks: two processes, gloo on CPU (NCCL on GPUs)")
    from gobrrr.comm.testing import spawn

    results = spawn(_ranks_body, 2, timeout_s=120.0)
    for line in results:
        print(line)


def _ranks_body(rank):
    from gobrrr.comm import collectives as comm
    from gobrrr.comm.ring import ring_all_reduce

    x = torch.arange(4, dtype=torch.float32) + 10 * rank.rank
    ours = x.clone()
    ring_all_reduce(ours)
    ref = x.clone()
    comm.all_reduce(ref)
    torch.testing.assert_close(ours, ref)
    return f"rank {rank.rank}/{rank.world_size}: all_reduce {ref.tolist()} == ring all-reduce built from send/recv"


def demo_zero(out: Path, ranks: int) -> None:
    _section("5. ZeRO: stages 0-3 side by side, bytes held per rank against the formula")
    from gobrrr.demo import zero

    rows = zero.run_zero(world_size=ranks)
    table = zero.format_table(rows)
    print(table)
    png = zero.draw(rows, out / "zero_memory.png")
    (out / "zero_memory.txt").write_text(table + "\n")
    print(f"picture: {png} (table beside it: zero_memory.txt); the same by hand: "
          f"torchrun --nproc-per-node {ranks} examples/zero.py")


def demo_tp(out: Path, ranks: int) -> None:
    _section("6. Tensor parallelism: one block's collectives, with and without sequence parallelism")
    from gobrrr.demo import tp

    results = tp.run_tp(world_size=ranks)
    report = tp.format_report(results)
    print(report)
    png = tp.draw(results, out / "tp_block.png")
    (out / "tp_block.txt").write_text(report + "\n")
    print(f"picture: {png} (tables beside it: tp_block.txt); the same by hand: "
          f"torchrun --nproc-per-node {ranks} examples/tp.py --sp")


def demo_train(cuda: bool, out: Path) -> None:
    _section("7. Train: the reference GPT, data through the Prefetcher, wrapped in gobrrr ddp")
    device = "cuda" if cuda else "cpu"
    run_dir = _fresh(out / "train")   # a second `make demo` trains beside the first run, never over it
    cmd = [sys.executable, "-m", "gobrrr", "train", "--model", "tiny", "--steps", "30", "--out", str(run_dir),
           "--device", device, "--ckpt-every", "15"]
    print("$ python " + " ".join(cmd[1:]))  # the command to type: this interpreter is the venv's python
    subprocess.run(cmd, check=True)


def _fresh(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`... : the first that does not exist yet."""
    n, candidate = 1, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


STEPS = ("prefetch", "syncs", "doctor", "ranks", "zero", "tp", "train")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, as every gobrrr command (argparse adds the usage)
        self.exit(2, f"gobrrr demo: error: {message}; see gobrrr demo --help\n")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="gobrrr demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="where to write reports, tables and pictures (default: a temp dir)")
    p.add_argument("--only", default=None, help=f"comma-separated steps to run (default: all of {','.join(STEPS)})")
    p.add_argument("--ranks", type=int, default=4, help="ranks for the zero and tp steps (default 4; even, >= 2)")
    args = p.parse_args(argv)
    only = STEPS if args.only is None else tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = [s for s in only if s not in STEPS]
    if unknown or not only:
        p.error(f"--only {args.only!r}: unknown step(s) {unknown}; choose from {','.join(STEPS)}")
    if args.ranks < 2 or args.ranks % 2:
        p.error(f"--ranks {args.ranks}: the zero and tp steps need an even number of ranks, at least 2")
    cuda = torch.cuda.is_available()
    where = torch.cuda.get_device_name() if cuda else "CPU only (no CUDA device found)"
    print(f"gobrrr demo on {where}, torch {torch.__version__}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gobrrr-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    run = {"prefetch": lambda: demo_prefetch(cuda), "syncs": lambda: demo_syncs(cuda),
           "doctor": lambda: demo_doctor(cuda, out / "doctor"), "ranks": demo_ranks,
           "zero": lambda: demo_zero(out, args.ranks), "tp": lambda: demo_tp(out, args.ranks),
           "train": lambda: demo_train(cuda, out)}
    took = {}
    start = time.perf_counter()
    for step in STEPS:
        if step in only:
            t0 = time.perf_counter()
            try:
                run[step]()
            except subprocess.CalledProcessError as e:   # the step printed its own reason above
                print(f"gobrrr demo: step {step!r} failed (exit code {e.returncode}); its output is above",
                      file=sys.stderr)
                return 2
            took[step] = time.perf_counter() - t0
    times = ", ".join(f"{name} {s:.1f}" for name, s in took.items())
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s (seconds per step: {times}); everything it "
          f"wrote is under {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
