"""gobrrr lint, issue 29's round on heldout29: a collate function that moves the batch to the GPU
(LLMs-from-scratch: `collate_fn=partial(custom_collate_fn, device=device)`), a device returned by a helper
(`.to(dist_util.dev())`, `torch.cuda.current_device()`), and batches drawn from a loader kept as `self.data`
(improved-diffusion's `next(self.data)`). Each shape from a minimal example, beside the neighbour that must
stay quiet."""
from __future__ import annotations

from gobrrr.lint.check import lint_source

COLLATE = """
from functools import partial

import torch
from torch.utils.data import DataLoader


def custom_collate_fn(batch, pad_token_id=50256, device="cpu"):
    longest = max(len(item) for item in batch)
    rows = []
    for item in batch:
        row = torch.tensor(item + [pad_token_id] * (longest - len(item)))
        pads = torch.nonzero(row == pad_token_id).squeeze()   # a CPU tensor: no sync
        if pads.numel() > 1:
            row[pads[1:]] = -100
        rows.append(row)
    return torch.stack(rows).to(device)


def make_loader(data, device):
    collate = partial(custom_collate_fn, device=device)
    return DataLoader(data, batch_size=8, collate_fn=collate)
"""


def _found(src: str) -> list[tuple[int, str]]:
    return [(f.line, f.rule) for f in lint_source(src, "train.py")]


def test_a_collate_fn_that_moves_the_batch_to_the_gpu_is_per_step_code():
    lines = COLLATE.splitlines()
    move = next(i for i, t in enumerate(lines, 1) if "torch.stack(rows).to(device)" in t)
    assert _found(COLLATE) == [(move, "GB010")]   # the nonzero on the CPU row stays quiet


def test_a_collate_fn_passed_by_name_is_per_step_code_too():
    src = COLLATE.replace("collate = partial(custom_collate_fn, device=device)\n", "").replace(
        "collate_fn=collate", "collate_fn=custom_collate_fn").replace('device="cpu"', 'device="cuda"')
    assert [r for _, r in _found(src)] == ["GB010"]


def test_a_collate_fn_that_stays_on_the_host_is_quiet():
    src = COLLATE.replace("return torch.stack(rows).to(device)", "return torch.stack(rows)")
    assert _found(src) == []


def test_a_def_no_loader_calls_is_not_made_per_step_by_its_name():
    src = COLLATE.replace("collate_fn=collate", "shuffle=True")
    assert _found(src) == []


STEP = """
import torch

from utils import dist_util


class TrainLoop:
    def run_loop(self):
        while True:
            batch, cond = next(self.data)
            self.run_step(batch, cond)

    def run_step(self, batch, cond):
        self.forward_backward(batch, cond)
        self.opt.step()

    def forward_backward(self, batch, cond):
        for i in range(0, batch.shape[0], self.microbatch):
            micro = batch[i:i + self.microbatch].to(dist_util.dev())
            loss = self.model(micro).mean()
            loss.backward()
"""


def test_a_batch_of_self_data_moved_to_a_device_a_helper_returns_is_a_blocking_copy():
    line = next(i for i, t in enumerate(STEP.splitlines(), 1) if "to(dist_util.dev())" in t)
    assert _found(STEP) == [(line, "GB009")]


def test_a_helper_that_returns_a_dtype_or_the_cpu_is_not_a_device():
    for target in ("dist_util.get_dtype()", "dist_util.cpu_device()"):
        assert _found(STEP.replace("dist_util.dev()", target)) == [], target


def test_batches_from_an_iterator_of_another_name_are_not_guessed():
    assert _found(STEP.replace("next(self.data)", "next(self.samples)")) == []


CURRENT = """
import torch


def train(model, opt, loader):
    for x, y in loader:
        loss = model(x).mean()
        loss.backward()
        opt.step()
        stat = torch.tensor([loss.detach().float()], device=torch.cuda.current_device())
        flag = torch.tensor([1.0], device="cuda")
"""


def test_a_host_list_built_on_the_current_device_is_a_blocking_copy():
    lines = CURRENT.splitlines()
    want = [i for i, t in enumerate(lines, 1) if "torch.tensor(" in t]
    assert [ln for ln, r in _found(CURRENT) if r in ("GB001", "GB010")] == want
