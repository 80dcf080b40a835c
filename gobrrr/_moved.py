"""Old import paths (gobrrr 0.1) that still resolve, for one release, with a DeprecationWarning.

0.2 laid the package out by the parts of the series (README "Where things are"). A user's
`from gobrrr.device.prefetch import Prefetcher` or `import gobrrr.dist` keeps working: this
finder answers the old name with the module now at the new one. Remove in 0.3.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {  # old name under gobrrr. -> new name under gobrrr. (None: an empty parent package)
    "device": None, "device.prefetch": "loader.prefetch", "device.worker_ring": "loader.worker_ring",
    "device.pinned": "loader.pinned", "device.slots": "loader.slots", "device.ntcopy": "loader.ntcopy",
    "device.streams": "loader.streams", "device.tree": "loader.tree", "device.syncs": "syncs.watch",
    "device.sync_rules": "syncs.rules", "device.syncs_resume": "syncs.resume", "device.lint": "lint.check",
    "device.lint_hot": "lint.hot", "device.lint_kinds": "lint.kinds", "device.lint_rules": "lint.rules",
    "device.lint_sync": "lint.sync", "device.timeline": "doctor.timeline", "device.timeline_host": "doctor.host",
    "device.timeline_plot": "doctor.plot", "device.timeline_report": "doctor.report",
    "device.timeline_sources": "doctor.sources", "device.timeline_trace": "doctor.trace",
    "device.advice": "doctor.advice", "dist": "comm", "dist.comm": "comm.collectives", "dist.debug": "comm.debug",
    "dist.lifeline": "comm.lifeline", "dist.monitor": "comm.monitor", "dist.ranks": "comm.ranks",
    "dist.ring": "comm.ring", "dist.testing": "comm.testing", "parallel.zero3": "parallel.zero.zero3",
    "parallel.zero_ckpt": "parallel.zero.checkpoint", "parallel.zero_optim": "parallel.zero.optim",
    "parallel.zero_pieces": "parallel.zero.pieces", "parallel.zero_shard": "parallel.zero.shard",
    "parallel.tp_checkpoint": "parallel.tp.checkpoint", "parallel.tp_ops": "parallel.tp.ops",
    "parallel.tp_report": "parallel.tp.report", "parallel.tp_tensors": "parallel.tp.tensors",
    "plan_cli": "plan.cli", "plan_links": "plan.machine", "pytest_plugin": "syncs.pytest_plugin",
    "auto_batch": "train.auto_batch", "checkpoint": "train.checkpoint_io", "data": "train.data",
    "rundir": "train.rundir", "step_graph": "train.graph", "train_checks": "train.checks", "train_step": "train.step",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        old = fullname[len("gobrrr."):] if fullname.startswith("gobrrr.") else None
        if old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=old in ("device", "dist"))

    def create_module(self, spec):
        new = MOVED[spec.name[len("gobrrr."):]]
        if new is None:
            return types.ModuleType(spec.name)
        warnings.warn(f"{spec.name} moved to gobrrr.{new}; the old name goes in gobrrr 0.3", DeprecationWarning,
                      stacklevel=3)
        return importlib.import_module(f"gobrrr.{new}")

    def exec_module(self, module):
        pass  # the module it answers with is already imported


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
