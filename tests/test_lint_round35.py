"""gobrrr lint, issue 29's round on heldout34's false findings (nanotron): `param.is_tied` and
`sharded_info.is_tp_sharded(...)`, Python flags and predicates of a parameter class, taken for tensor tests. From a
minimal example, beside the device tests that must still be reported."""
from __future__ import annotations

from lintcase import rules

TIE = """
import torch


def train(model, opt, loader):
    for x in loader:
        loss = model(x.cuda(non_blocking=True)).mean()
        loss.backward()
        for name, param in model.named_parameters():
            if param.is_tied:
                continue
            info = param.get_sharded_info()
            if info.is_tp_sharded(group=None):
                continue
            if param.grad.isnan().any():
                raise ValueError(name)
        opt.step()
"""



def test_flags_and_predicates_of_a_parameter_class_are_python_bools():
    line = next(i for i, t in enumerate(TIE.splitlines(), 1) if "isnan().any()" in t)
    assert rules(TIE) == [(line, "GB007")]   # the real device test stays


def test_is_nonzero_still_reads_the_tensor():
    src = TIE.replace("if param.is_tied:", "if param.grad.is_nonzero():")
    line = next(i for i, t in enumerate(src.splitlines(), 1) if "is_nonzero()" in t)
    assert (line, "GB007") in rules(src)
