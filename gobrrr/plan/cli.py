"""`gobrrr plan`: what fits, how to split it and how fast it runs, before renting the GPUs.

    gobrrr plan --model 7b --gpus 8 --gpu-mem 80
    gobrrr plan --model 70b --gpus 64 --gpu-mem 80 --micro-batch 1 --global-batch 512
    gobrrr plan --layers 24 --width 2048 --heads 16 --vocab 50304 --seq-len 2048 --gpus 16 --format json

One row per layout (dp x tp, ZeRO 0-3, recompute, sequence parallelism) with the bytes each GPU holds,
the bytes it moves per optimizer step and the step time, the best three marked `*`, and for every
other row the one reason it loses. The formulas are gobrrr/plan/formulas.py's (sources in docs/plan.md); the
bandwidths, HBM speed and MFU come from bench/results records of the same GPU when they exist
(gobrrr/plan/machine.py), and the header names where each figure came from.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from gobrrr.plan.formulas import Plan, plan
from gobrrr.plan.inputs import GB, LOSSES, PRECISIONS, PRESETS, Batch, ModelShape, Options
from gobrrr.plan.machine import GPUS, machine

LOSS_WORDS = {"train": "gobrrr train's loss (chunked at tp 1, vocab-parallel at tp > 1)",
              "full": "full (B, T, V/tp) logits loss", "chunked": "chunked loss"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse would print the usage too)
        print(f"gobrrr plan: error: {message} ; see gobrrr plan --help", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="gobrrr plan", description=__doc__.split("\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("model: a preset, or the shape")
    m.add_argument("--model", choices=list(PRESETS), help="GPT-shaped preset (see docs/plan.md for 7b-70b)")
    m.add_argument("--layers", type=int)
    m.add_argument("--width", type=int)
    m.add_argument("--heads", type=int)
    m.add_argument("--vocab", type=int, help="vocabulary size (default 50304)")
    m.add_argument("--seq-len", type=int, help="tokens per sequence (default: the preset's context)")
    g = p.add_argument_group("machine")
    g.add_argument("--gpus", type=int, required=True, help="GPUs in total")
    g.add_argument("--gpu-mem", type=float, help="GB of memory per GPU (default: the GPU's datasheet)")
    g.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node; tp stays inside one (default 8)")
    g.add_argument("--gpu", default="H200", help=f"GPU model for peak FLOP/s and defaults: {', '.join(GPUS)} "
                   "(gobrrr/plan/machine.py's table; GOBRRR_PEAK_FLOPS overrides the peak)")
    g.add_argument("--mfu", type=float, help="model FLOPs utilisation to assume (default: measured record or 0.40)")
    g.add_argument("--records", help="folder of bench results (default bench/results or $GOBRRR_BENCH_RESULTS)")
    b = p.add_argument_group("training")
    b.add_argument("--micro-batch", type=int, default=4, help="sequences per GPU per micro-step (default 4)")
    b.add_argument("--global-batch", type=int, help="sequences per optimizer step (default micro-batch x gpus)")
    b.add_argument("--precision", choices=list(PRECISIONS), default="bf16",
                   help="bf16: bf16 weights + fp32 master (default); amp: fp32 weights under autocast")
    b.add_argument("--attention", choices=["flash", "eager"], default="flash")
    b.add_argument("--loss", choices=list(LOSSES), default="train",
                   help="train (default): what gobrrr train runs, the chunked loss at tp 1 and F.cross_entropy on "
                        "vocab-parallel (B, T, V/tp) logits at tp > 1; full: F.cross_entropy on (B, T, V/tp) logits; "
                        "chunked: gobrrr.ops.linear_cross_entropy")
    b.add_argument("--headroom", type=float, default=0.10, help="fraction of GPU memory kept free (default 0.10)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--top", type=int, help="print only the first N rows, N >= 1 (default: all)")
    return p.parse_args(argv)


def model_from_args(a: argparse.Namespace) -> ModelShape:
    for name in ("layers", "width", "heads", "vocab", "seq_len"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    shape = (a.layers, a.width, a.heads)
    if a.model:
        if any(x is not None for x in shape):
            raise ValueError("give --model or --layers/--width/--heads, not both")
        base = PRESETS[a.model]
        if a.vocab is not None:
            base = ModelShape(base.name, base.n_layer, base.n_embd, base.n_head, a.vocab, base.seq_len)
        if a.seq_len is not None and a.seq_len > base.seq_len:  # a longer context: a wider position table
            base = ModelShape(base.name, base.n_layer, base.n_embd, base.n_head, base.vocab_size, a.seq_len)
        return base
    if any(x is None for x in shape):
        raise ValueError("give --model NAME, or all of --layers, --width and --heads for a custom model")
    return ModelShape("custom", a.layers, a.width, a.heads, a.vocab or 50304, a.seq_len or 1024)  # both >= 1 here


def build(a: argparse.Namespace) -> Plan:
    model = model_from_args(a)
    for name in ("gpus", "gpus_per_node", "micro_batch"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.gpu_mem is not None and a.gpu_mem <= 0:
        raise ValueError(f"--gpu-mem must be > 0 GB, got {a.gpu_mem}")
    if a.global_batch is not None and a.global_batch < 1:
        raise ValueError(f"--global-batch must be >= 1, got {a.global_batch}")
    if a.top is not None and a.top < 1:
        raise ValueError(f"--top must be >= 1, got {a.top}; leave it out to print every row")
    if a.records is not None and not Path(a.records).is_dir():
        raise ValueError(f"--records {a.records}: no such folder; give a folder of bench results (e.g. bench/results) "
                         "or leave --records out for the defaults")
    mach = machine(a.gpu, a.gpu_mem, a.gpus_per_node, a.mfu, model.name, a.records, a.micro_batch)
    opt = Options(precision=a.precision, attention=a.attention, loss=a.loss, headroom=a.headroom)
    return plan(model, mach, Batch(a.micro_batch, a.seq_len or model.seq_len, a.global_batch), a.gpus, opt)


def header(p: Plan) -> list[str]:
    m, mach, o = p.model, p.machine, p.options
    return [
        f"gobrrr plan: {m.name} ({m.params() / 1e9:.3g}e9 parameters: {m.n_layer} layers, width {m.n_embd}, "
        f"{m.n_head} heads, vocab {m.vocab_size}, GPT-shaped) on {p.gpus} x {mach.gpu} "
        f"{mach.mem_bytes / GB:.0f} GB ({mach.gpus_per_node} per node)",
        f"  batch: micro {p.batch.micro} x seq {p.batch.seq_len}; precision {o.precision} "
        f"(p/g/o bytes {'/'.join(map(str, PRECISIONS[o.precision][:3]))}); {o.attention} attention; {LOSS_WORDS[o.loss]}; "
        f"fits = total <= {1 - o.headroom:.0%} of memory ({o.headroom:.0%} headroom)",
        f"  compute: {mach.sources['peak']} x MFU {mach.mfu:.1%} ({mach.sources['mfu']}); "
        f"HBM {mach.hbm_Bps / 1e12:.2f} TB/s ({mach.sources['hbm']})",
        f"  links: in a node {mach.intra.busbw_Bps / 1e9:.0f} GB/s ({mach.intra.source}); "
        f"between nodes {mach.inter.busbw_Bps / 1e9:.0f} GB/s ({mach.inter.source})",
        "  memory in GB per GPU (GB = 1e9 bytes); comm = GB each GPU's link carries per optimizer step "
        "(nccl-tests bus bytes)",
    ]


def table(p: Plan, top: int | None = None) -> str:
    rows = p.rows[:top] if top else p.rows
    cols = ["", "dp", "tp", "zero", "rc", "sp", "accum", "params", "grads", "optim", "activ", "temp", "total",
            "fits", "comm", "step_ms", "tokens/s", "MFU", "why"]
    body = []
    for r in rows:
        body.append(["*" if r.best else "", r.dp, r.tp, r.zero, "y" if r.recompute else "-",
                     "y" if r.sequence_parallel else "-", r.grad_accum,
                     *(f"{x / GB:.2f}" for x in (r.param_bytes, r.grad_bytes, r.optimizer_bytes, r.activation_bytes,
                                                 r.temp_bytes, r.total_bytes)),
                     "yes" if r.fits else "NO", f"{r.comm_bytes_per_step / GB:.2f}", f"{r.step_s * 1e3:.1f}",
                     f"{r.tokens_per_s:,.0f}", f"{r.mfu:.1%}", r.reason])
    cells = [[str(c) for c in row] for row in body]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.ljust(w) if i in (0, len(cols) - 1) else x.rjust(w)  # noqa: E731
                                for i, (x, w) in enumerate(zip(xs, widths))).rstrip()
    out = [*header(p), "", line(cols), line(["-" * w for w in widths]), *(line(c) for c in cells)]
    if p.skipped:
        out += ["", "not considered: " + "; ".join(dict.fromkeys(p.skipped))]
    if not any(r.fits for r in p.rows):
        out += ["", nothing_fits(p)]
    return "\n".join(out)


def nothing_fits(p: Plan) -> str:
    """What to change when no row fits, naming only what this plan did not already try: the table has
    every ZeRO stage and recompute for these GPUs, so the way out is more GPUs, a smaller micro-batch,
    or a precision without autocast's weight copies."""
    small = min(p.rows, key=lambda r: r.total_bytes)
    per_param = sum(PRECISIONS[p.options.precision][:3])
    need = math.ceil(per_param * p.model.params() / small.usable_bytes)  # model states alone, sharded N ways
    gpus = 2 ** math.ceil(math.log2(max(need, p.gpus + 1)))  # a power of two: tp and dp have room to divide it
    fixes = [f"--gpus {gpus} (the model states alone, {per_param} bytes x {p.model.params() / 1e9:.3g}e9 "
             f"parameters, need {need} GPUs' memory under ZeRO-3)"]
    if p.batch.micro > 1:
        fixes.append("a smaller --micro-batch")
    if p.options.precision != "bf16":
        fixes.append("--precision bf16 (no autocast copies of the weights)")
    return (f"nothing fits: the smallest row ({small.name()}) needs {small.total_bytes / GB:,.1f} GB of "
            f"{small.usable_bytes / GB:,.1f} GB usable; try " + ", or ".join(fixes))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        a = parse_args(argv)
        p = build(a)
    except SystemExit as e:  # argparse: --help (0) or a bad flag (2, already printed)
        return int(e.code or 0)
    except ValueError as e:
        print(f"gobrrr plan: error: {e}", file=sys.stderr)
        return 2
    if a.format == "json":
        rows = p.rows[:a.top] if a.top else p.rows
        print(json.dumps([r.as_dict() for r in rows], indent=1))
    else:
        print(table(p, a.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
