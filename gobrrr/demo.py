"""`make demo` / `gobrrr demo`: a short tour of gobrrr on whatever machine this is.

On a GPU it prints the seed loop's naive-vs-gobrrr comparison, the syncs found at run time,
and the doctor's before/after figures. On a CPU it runs the same API (batches pass through,
collectives go over gloo) and says plainly which GPU-only parts it skipped.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
SEED_LOOP = ROOT / "examples" / "seed_loop.py"


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


def _skipped(what: str) -> None:
    print(f"[skipped on this machine: {what} needs a CUDA GPU]")


def demo_prefetch(cuda: bool) -> None:
    _section("1. Prefetcher: the next batch crosses while this step computes")
    args = [sys.executable, str(SEED_LOOP), "--mode", "both"]
    if not cuda:
        args += ["--device", "cpu", "--steps", "5"]
        _skipped("the naive-vs-gobrrr speed comparison (on CPU batches pass through unchanged)")
    subprocess.run(args, check=True)


def demo_syncs(cuda: bool) -> None:
    _section("2. Sync detective: every host-device sync, by source line")
    from gobrrr.lint.check import lint_paths

    findings = lint_paths([str(SEED_LOOP)])
    print(f"gobrrr lint {SEED_LOOP.relative_to(ROOT)}: {len(findings)} finding(s)")
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

    if not cuda:
        _skipped("the GPU figures of the doctor (idle %, overlap %, copies); the host timeline still runs")
    run_demo_doctor(out)


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


def demo_train(cuda: bool, out: Path) -> None:
    _section("5. Train: the reference GPT, data through the Prefetcher, wrapped in gobrrr ddp")
    device = "cuda" if cuda else "cpu"
    run_dir = out / "train"
    cmd = [sys.executable, "-m", "gobrrr", "train", "--model", "tiny", "--steps", "30", "--out", str(run_dir),
           "--device", device, "--ckpt-every", "15"]
    print("$ " + " ".join(cmd[1:]))
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gobrrr demo", description=__doc__)
    p.add_argument("--out", default=None, help="where to write the doctor reports (default: a temp dir)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    where = torch.cuda.get_device_name() if cuda else "CPU only (no CUDA device found)"
    print(f"gobrrr demo on {where}, torch {torch.__version__}")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gobrrr-demo-"))
    start = time.perf_counter()
    demo_prefetch(cuda)
    demo_syncs(cuda)
    demo_doctor(cuda, out / "doctor")
    demo_ranks()
    demo_train(cuda, out)
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s; reports under {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
