"""gobrrr lint, issue 29's twenty-fourth round (round 23 of the rules): the per-parameter update of a fused
optimizer (LOMO), reached through a function a factory returned and stored on self, each from a minimal example
written for the shape, beside the neighbouring shape that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

FUSED = """
class Scaler:
    def has_inf_or_nan(self, x):
        return float(x.float().sum()) != 0.0


class FusedOptimizer:
    def __init__(self, model):
        self.model = model
        self.scaler = Scaler()
        self.grad_func = self.fuse_update()

    def fuse_update(self):
        def func(x):
            for n, p in self.model.named_parameters():
                if p.requires_grad and p.grad is not None:
                    if self.scaler.has_inf_or_nan(p.grad):
                        break
                    p.data.add_(p.grad, alpha=-0.1)
                    p.grad = None
            return x
        return func

    def fused_backward(self, loss):
        loss.backward()
        self.grad_func(0)


def fit(model, loader, opt):
    for x in loader:
        opt.fused_backward(model(x.to(DEVICE, non_blocking=True)).mean())
"""


def test_the_update_a_factory_stored_on_self_runs_every_step():
    """LOMO: `self.grad_func = self.fuse_update()`, called by `fused_backward` (and by each gradient hook): its
    loss scaler reads every gradient's sum with float(), per parameter, every step."""
    assert ("GB002", 4) in default(FUSED)


def test_a_value_used_then_cleared_is_no_lazy_initialisation():
    """`if p.grad is not None: ...; p.grad = None` runs for every parameter; `if cache is None: cache = ...` is
    the lazy initialisation that stays rare."""
    lazy = FUSED.replace("if p.requires_grad and p.grad is not None:", "if self.cache is None:").replace(
        "p.grad = None", "self.cache = p.grad")
    assert ("GB002", 4) in default(FUSED) and ("GB002", 4) not in default(lazy)
