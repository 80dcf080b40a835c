"""`gobrrr bench plan`: the plan's activation bytes and step time against one GPU, for the 124m GPT.

    python -m gobrrr.bench.plan_check                 # B = 4, 8, 16, recompute off/on, + gobrrr train's step time
    python -m gobrrr.bench.plan_check --quick         # B = 4 only, fewer steps, no record

The step is `gobrrr train`'s at world size 1: fp32 weights under bf16 autocast (the plan's "amp"
precision), fused AdamW, gradient clipping, gradients set to None after the step. Recompute is
applied from outside the model: each block's forward runs under `torch.utils.checkpoint`
(non-reentrant), which is what the plan's "recompute" means (one checkpoint per block).

Per (B, recompute):
  act_meas  torch.cuda.max_memory_allocated over one step minus memory_allocated just before it
            (parameters + AdamW state, no gradients): what forward and backward add on top of the
            model states, i.e. activations + autocast's bf16 weight copies + gradients allocated
            before the peak. Compared with the plan's activation_bytes + temp_bytes (target: 15%).
  step_meas median step time of this eager loop, CUDA events, after warm-up, against the plan with
            the MFU of the `bench ddp` record's eager plain loop (B = 16) (target: 20%).
  train_ms  `gobrrr train --data synthetic` at the same B (no recompute: train has none), against
            the plan with the MFU `gobrrr plan` itself would use for a train run (the `bench train`
            record of gobrrr train's step, else `bench ddp`'s) and the chunked loss (target: 20%).
            Neither MFU is fitted here: both come from records written by other benchmarks.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch
from torch.utils.checkpoint import checkpoint

from gobrrr.bench.common import print_table, record
from gobrrr.models.gpt import GPT
from gobrrr.plan.formulas import evaluate
from gobrrr.plan.inputs import PRESETS, Batch, Layout, Options
from gobrrr.plan.machine import machine
from gobrrr.plan.memory import temp_bytes


def add_recompute(model: GPT) -> None:
    """Checkpoint every block from outside the model: its forward is recomputed during backward."""
    for block in model.blocks:
        inner = block.forward
        block.forward = lambda x, inner=inner: checkpoint(inner, x, use_reentrant=False)


def measure(b: int, recompute: bool, steps: int, warmup: int) -> tuple[float, float]:
    """(bytes a step adds at its peak over the model states, median seconds per step)."""
    shape = PRESETS["124m"]
    torch.manual_seed(0)
    model = GPT(shape.gpt_config()).cuda()
    if recompute:
        add_recompute(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, shape.vocab_size, (b, shape.seq_len), device="cuda")
    y = torch.randint(0, shape.vocab_size, (b, shape.seq_len), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)   # the logits stay referenced through backward, as in gobrrr train
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()  # sync: measurement boundary
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()  # sync: measurement boundary
    added = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()  # sync: read the timer
        times.append(start.elapsed_time(end) / 1e3)
    model = opt = None  # free them before the next size (the closures above are done with them)
    torch.cuda.empty_cache()
    return added, sorted(times)[len(times) // 2]


def train_step_s(b: int, steps: int) -> float | None:
    """Seconds per step of `gobrrr train --model 124m --data synthetic` at batch b, or None if it fails."""
    try:
        from gobrrr.train.config import TrainConfig
        from gobrrr.train.loop import train

        with tempfile.TemporaryDirectory() as out:  # its defaults otherwise (compile, loss path) are what users get
            res = train(TrainConfig(model="124m", steps=steps, out=out, batch_size=b, data="synthetic",
                                    log_every=5, ckpt_every=10 * steps, progress=False))
    except Exception as e:  # a report line, not a crash: the other figures still stand
        print(f"gobrrr train at B={b} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    return b * PRESETS["124m"].seq_len / res["tokens_per_s"] if res.get("tokens_per_s") else None


def check(batches: list[int], steps: int, warmup: int, train_steps: int) -> list[dict]:
    """One row per (B, recompute): the plan's figures beside the measured ones (module docstring)."""
    shape = PRESETS["124m"]
    gpu = torch.cuda.get_device_name()
    opt = Options(precision="amp", loss="full")  # this loop: the model's own lm_head + F.cross_entropy
    loop_mach = machine(gpu, model="124m", prefer=("ddp",))       # an eager loop, as this one
    print(f"plan for this loop: MFU {loop_mach.mfu:.1%} ({loop_mach.sources['mfu']}); HBM "
          f"{loop_mach.hbm_Bps / 1e12:.2f} TB/s; peak {loop_mach.peak_flops / 1e12:.0f} TFLOP/s")
    rows = []
    for b in batches:
        train_s = train_step_s(b, train_steps) if train_steps else None
        train_mach = machine(gpu, model="124m", micro_batch=b, prefer=("train", "ddp"))
        train_plan = evaluate(shape, Layout(1, 1), Batch(b, shape.seq_len), train_mach, Options("amp", loss="chunked"))
        print(f"plan for gobrrr train at B={b}: MFU {train_mach.mfu:.1%} ({train_mach.sources['mfu']})")
        for rc in (False, True):
            lay = Layout(1, 1, 0, rc, False)
            row = evaluate(shape, lay, Batch(b, shape.seq_len), loop_mach, opt)
            plan_act = row.activation_bytes + sum(temp_bytes(shape, lay, opt).values())
            t0 = time.perf_counter()
            added, step_s = measure(b, rc, steps, warmup)
            rows.append({"B": b, "recompute": rc, "plan_act_GB": plan_act / 1e9, "meas_act_GB": added / 1e9,
                         "act_ratio": added / plan_act, "plan_step_ms": row.step_s * 1e3,
                         "meas_step_ms": step_s * 1e3, "step_ratio": step_s / row.step_s,
                         "train_plan_ms": None if rc else train_plan.step_s * 1e3,
                         "train_step_ms": (train_s * 1e3 if (train_s and not rc) else None),
                         "train_ratio": (train_s / train_plan.step_s if (train_s and not rc) else None),
                         "mfu_source": loop_mach.sources["mfu"], "train_mfu_source": train_mach.sources["mfu"],
                         "wall_s": time.perf_counter() - t0})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gobrrr bench plan", description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="4,8,16", help="micro-batch sizes (default 4,8,16)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per row (default 10)")
    p.add_argument("--train-steps", type=int, default=30, help="gobrrr train steps per B (0 = skip)")
    p.add_argument("--quick", action="store_true", help="B = 4, 3 steps, no train run, no record")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gobrrr bench plan: error: needs a CUDA GPU (it measures torch.cuda.max_memory_allocated) ; "
              "run it on the GPU machine", file=sys.stderr)
        return 2
    batches = [4] if args.quick else [int(x) for x in args.batches.split(",")]
    steps, warmup = (3, 1) if args.quick else (args.steps, 3)
    rows = check(batches, steps, warmup, 0 if args.quick else args.train_steps)
    print_table(rows, ["B", "recompute", "plan_act_GB", "meas_act_GB", "act_ratio", "plan_step_ms", "meas_step_ms",
                       "step_ratio", "train_plan_ms", "train_step_ms", "train_ratio"],
                title="gobrrr bench plan: 124m, amp, world size 1 (ratio = measured / plan; targets: act within "
                      "15%, step within 20%)")
    act_ok = all(abs(r["act_ratio"] - 1) <= 0.15 for r in rows)
    step_ok = all(abs(r["step_ratio"] - 1) <= 0.20 for r in rows)
    train_ok = all(abs(r["train_ratio"] - 1) <= 0.20 for r in rows if r["train_ratio"] is not None)
    print(f"activations within 15%: {'yes' if act_ok else 'NO'}; step time within 20%: this loop "
          f"{'yes' if step_ok else 'NO'}, gobrrr train {'yes' if train_ok else 'NO'}")
    if not args.quick:
        path = record("plan", config={"model": "124m", "batches": batches, "steps": steps, "precision": "amp",
                                      "train_steps": args.train_steps}, rows=rows,
                      figures={"act_within_15pct": act_ok, "step_within_20pct": step_ok,
                               "train_within_20pct": train_ok,
                               "max_act_error": max(abs(r["act_ratio"] - 1) for r in rows),
                               "max_step_error": max(abs(r["step_ratio"] - 1) for r in rows)})
        print(f"recorded to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
