"""gobrrr.plan: `gobrrr plan`, memory, communication and step time of every parallel layout before renting GPUs.

Open formulas.py first (the formulas in one docstring, the rows, the ranking), then inputs.py (the
model's shape, presets, precisions, layout, batch, options), memory.py (bytes per GPU by part),
timing.py (bytes moved and what compute hides), machine.py (THE table of GPUs: peak FLOP/s, HBM,
memory, links; figures from bench records where they exist) and cli.py (the table or JSON rows).
docs/plan.md gives every formula's source.

`gobrrr.plan.machine.machine(gpu)` builds a Machine (the function is not re-exported here: it would
hide the module of the same name).
"""
from gobrrr.plan.formulas import Plan, Row, evaluate, plan, summary, train_row
from gobrrr.plan.inputs import GB, LOSSES, PRECISIONS, PRESETS, Batch, Layout, ModelShape, Options
from gobrrr.plan.machine import GPUS, Machine, peak_flops

__all__ = ["plan", "evaluate", "summary", "train_row", "PRESETS", "PRECISIONS", "LOSSES", "GB", "Batch", "Layout",
           "ModelShape", "Options", "Plan", "Row", "GPUS", "Machine", "peak_flops"]
