"""`gobrrr bench doctor`: what each profiler setting of the doctor costs a nanoGPT-like loop, eager and compiled.

The loop is tests/data/traces/nanogpt_like.py (a GPT-2-style model, nanoGPT's train-loop shape: bf16
autocast, gradient accumulation, clipping, fused AdamW, one `.item()` per iteration). For each variant
(eager, compiled) in one process: plain iterations, then the same iterations under each setting of
`gobrrr.doctor.overhead.BENCH_SETTINGS` (profiler on, trace dropped), in rounds so that drift hits all
alike; the table gives ms per iteration and the ratio to plain, side by side. The doctor's default must
stay at or under 1.3x (issue 31); the heavier settings say what they add.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from gobrrr.bench.common import Parser, add_results_option, positive, print_table, record
from gobrrr.doctor.overhead import measure_settings

LOOP = Path(__file__).resolve().parents[2] / "tests" / "data" / "traces" / "nanogpt_like.py"


def load_loop():
    """The nanoGPT-like script as a module (its `parse` and `make_iteration`)."""
    if not LOOP.is_file():
        raise FileNotFoundError(f"{LOOP} is missing: run the bench from a gobrrr checkout")
    spec = importlib.util.spec_from_file_location("nanogpt_like", LOOP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _variant(loop, la, cuda: bool, steps: int, rounds: int) -> list[dict]:
    """One variant's rows: its iterations warmed up (compile, autotune, allocator), then every setting."""
    iteration = loop.make_iteration(la)
    count = [0]

    def step():
        iteration(count[0])
        count[0] += 1

    for _ in range(3):
        step()
    return measure_settings(step, cuda=cuda, steps=steps, rounds=rounds)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="gobrrr bench doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="eager,compiled", help="comma list of eager, compiled (default both)")
    p.add_argument("--steps", type=positive(int), default=8, help="timed iterations per setting and round (default 8)")
    p.add_argument("--rounds", type=positive(int), default=2, help="rounds over all settings (default 2)")
    p.add_argument("--loop-args", default="", help="extra arguments for the loop, e.g. '--layers 6 --batch 8'")
    p.add_argument("--quick", action="store_true", help="a tiny model on the CPU: a smoke run")
    add_results_option(p)
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in ("eager", "compiled")]
    if bad:
        p.error(f"--variants {','.join(bad)} is not eager or compiled")
    loop = load_loop()
    cuda = torch.cuda.is_available() and not args.quick
    extra = args.loop_args.split()
    if args.quick:
        extra = ["--device", "cpu", "--layers", "1", "--width", "32", "--heads", "2", "--seq", "16",
                 "--vocab", "128", "--batch", "2", "--accum", "1"] + extra
        args.steps, args.rounds = 2, 1
    rows, figures = [], {}
    for variant in variants:
        la = loop.parse(extra + (["--compile"] if variant == "compiled" else []))
        for r in _variant(loop, la, cuda, args.steps, args.rounds):
            rows.append({"variant": variant, **r})
        figures[variant] = {r["setting"]: r["ratio"] for r in rows if r["variant"] == variant}
        if cuda:
            torch.cuda.empty_cache()
    print_table(rows, ["variant", "setting", "ms", "ratio"],
                title=f"gobrrr bench doctor: ms per iteration under each profiler setting ({'cuda' if cuda else 'cpu'})")
    path = record("doctor_overhead", config={"variants": variants, "steps": args.steps, "rounds": args.rounds,
                                             "loop_args": extra, "cuda": cuda},
                  rows=rows, figures=figures, quick=args.quick, results=args.results)
    print(f"record appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
