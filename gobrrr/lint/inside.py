"""Syncs that happen inside torch (or between ranks) because of one line of the user's code.

    GB012  a barrier every step: `dist.barrier()`, `accelerator.wait_for_everyone()`: every rank
           waits for the slowest, and NCCL's barrier waits for the device too
    GB013  a sync inside torch the line causes:
             a torch.distributions object built with argument validation on (the default): its
             constructor checks each parameter's constraint with `.all()` read on the host, and
             `log_prob` checks the sample the same way. `validate_args=False` (or once,
             `torch.distributions.Distribution.set_default_validate_args(False)`) removes them.
             `torch.normal(mean, std)` with a tensor std: torch checks `std >= 0` on the host.

A mixin of rules.Checker: it relies on `kind()`, `looping()`, `flag()`, `project_flags`.
"""
from __future__ import annotations

import ast

from gobrrr.lint.kinds import TENSORISH

_BARRIERS = ("torch.distributed.barrier", "dist.barrier", "wait_for_everyone", "xm.rendezvous",
             "torch_xla.core.xla_model.rendezvous")


class InsideRules:
    """GB012 and GB013 on calls."""

    def inside_rules(self, node: ast.Call, func, name: str, method, kw) -> None:
        if any(name == b or name.endswith("." + b) for b in _BARRIERS) or method == "wait_for_everyone":
            self.flag(node, "GB012", what=f"`{ast.unparse(func)}()`")
            return
        if name.startswith("torch.distributions.") and name.rsplit(".", 1)[-1][:1].isupper() \
                and not name.endswith(("Distribution", "constraints")) and not self.validation_off(kw) \
                and any(self.kind(a) in TENSORISH for a in [*node.args, *kw.values()]):
            self.flag(node, "GB013", what=f"`{name.rsplit('.', 1)[-1]}(...)` built with argument validation on",
                      fix="pass validate_args=False, or call torch.distributions.Distribution."
                          "set_default_validate_args(False) once at start-up: validation reads each parameter "
                          "check (and each log_prob sample check) on the host")
            return
        if name == "torch.normal":
            std = kw.get("std", node.args[1] if len(node.args) > 1 else None)
            if std is not None and self.kind(std) in TENSORISH:
                self.flag(node, "GB013", what="`torch.normal(mean, std)` with a tensor std",
                          fix="sample as mean + std * torch.randn_like(std): torch.normal checks std >= 0 "
                              "on the host before it samples")

    def validation_off(self, kw) -> bool:
        v = kw.get("validate_args")
        if isinstance(v, ast.Constant):
            return v.value is False or v.value is None and self.project_flags.get("no_validation", False)
        return v is not None or self.project_flags.get("no_validation", False)


def validation_off_globally(text: str) -> bool:
    """The project turns argument validation off once: set_default_validate_args(False)."""
    return "set_default_validate_args(False)" in text.replace(" ", "")


__all__ = ["InsideRules", "validation_off_globally"]
