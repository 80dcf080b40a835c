"""gobrrr lint, issue 29's round on heldout30: a metric logger whose `**kwargs` every call fills with numbers
(MiniGPT-4, BLIP, LLaMA-Adapter: `if isinstance(v, torch.Tensor): v = v.item()` never runs), a device helper
bound with `functools.partial` in a base class (Palette's `self.set_device`), the builtin `any()` of a tensor,
and a def handed with the batch to a helper that applies it (`apply_to_sample(_move_to_cuda, sample)`). Each
shape from a minimal example, beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap
from pathlib import Path

from lintcase import line_of, rules

from gobrrr.lint.check import lint_paths

LOGGER = """
import torch


class MetricLogger:
    def update(self, **kwargs):
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            self.meters[k].update(v)


def train(model, opt, loader, logger):
    for x in loader:
        loss = model(x.cuda(non_blocking=True)).mean()
        loss.backward()
        opt.step()
        logger.update(loss=LOSS)
"""




def test_a_logger_every_call_feeds_numbers_reads_nothing_back():
    src = LOGGER.replace("LOSS", "loss.item()")
    assert rules(src) == [(line_of(src, "loss.item()"), "GB002")]   # the caller's own read, not the logger's


def test_a_logger_fed_device_tensors_still_reads_each_one():
    src = LOGGER.replace("LOSS", "loss")
    assert rules(src) == [(line_of(src, "v = v.item()"), "GB002")]


BASE = """
from functools import partial

import util


class BaseModel:
    def __init__(self, opt):
        self.set_device = partial(util.set_device, rank=opt["rank"])
        self.resize = partial(self.resize, mode="bilinear")   # a partial of itself: no endless lookup
"""

MODEL = """
import torch

from base import BaseModel


class Palette(BaseModel):
    def set_input(self, data):
        self.image = self.set_device(data.get("image"))
        self.small = self.resize(self.image)

    def train_step(self, loader, opt):
        for data in loader:
            self.set_input(data)
            loss = self.net(self.image).mean()
            loss.backward()
            opt.step()
"""

UTIL = """
import torch


def set_gpu(args, rank=0):
    return args.cuda()


def set_device(args, rank=0):
    if isinstance(args, dict):
        return {k: set_gpu(v, rank) for k, v in args.items()}
    return set_gpu(args, rank)
"""


def _project(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, int, str]]:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    errors: list[str] = []
    found = lint_paths([tmp_path], errors=errors)
    assert errors == []
    return [(Path(f.path).name, f.line, f.rule) for f in found]


def test_a_device_helper_bound_with_partial_in_a_base_class_is_followed(tmp_path):
    found = _project(tmp_path, {"base.py": BASE, "model.py": MODEL, "util.py": UTIL})
    assert found == [("util.py", line_of(UTIL, "args.cuda()"), "GB009")]


def test_a_partial_bound_to_a_plain_function_of_numbers_is_quiet(tmp_path):
    model = MODEL.replace('self.set_device(data.get("image"))', 'data.get("image").cuda(non_blocking=True)')
    assert _project(tmp_path, {"base.py": BASE, "model.py": model, "util.py": UTIL}) == []


SAMPLER = """
import torch


def p_sample(model, y, t):
    noise = torch.randn_like(y) if any(t > 0) else torch.zeros_like(y)
    return model(y, t) + noise


def sample(model, y, n):
    for i in reversed(range(n)):
        t = torch.full((y.shape[0],), i, device=y.device, dtype=torch.long)
        y = p_sample(model, y, t)
    return y
"""


def test_the_builtin_any_of_a_device_tensor_reads_each_element():
    assert rules(SAMPLER) == [(line_of(SAMPLER, "any(t > 0)"), "GB002")]


def test_any_of_python_values_and_a_device_side_choice_are_quiet():
    assert rules(SAMPLER.replace("any(t > 0)", "any(s > 0 for s in [1, 2])")) == []
    on_device = SAMPLER.replace(
        "noise = torch.randn_like(y) if any(t > 0) else torch.zeros_like(y)",
        "noise = torch.randn_like(y) * (t > 0).any()")   # the tensor's own any(): stays on the device
    assert rules(on_device) == []


APPLY = """
import torch


def apply_to_sample(f, sample):
    def _apply(x):
        if torch.is_tensor(x):
            return f(x)
        if isinstance(x, dict):
            return {k: _apply(v) for k, v in x.items()}
        return x
    return _apply(sample)


def move_to_cuda(sample):
    def _move_to_cuda(tensor):
        return tensor.cuda()
    return apply_to_sample(_move_to_cuda, sample)


def train(model, opt, loader):
    for samples in loader:
        samples = move_to_cuda(samples)
        loss = model(samples).mean()
        loss.backward()
        opt.step()
"""


def test_a_def_handed_with_the_batch_to_a_helper_that_applies_it_is_walked_on_the_batch():
    assert rules(APPLY) == [(line_of(APPLY, "tensor.cuda()"), "GB009")]


def test_a_def_handed_with_no_data_is_not_walked_on_anything():
    src = APPLY.replace("samples = move_to_cuda(samples)", "samples = samples")
    assert rules(src) == []
