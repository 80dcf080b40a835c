"""gobrrr lint, issue 29's round on heldout36 (trajectory-transformer): `torch.set_default_tensor_type(
torch.cuda.FloatTensor)` inside a `def set_device(device)` that nothing calls made the whole project's factories
count as GPU ones, so `torch.arange(n).to(idx.device)` in every forward went unreported. The default now counts
only at module level or in a def the project calls (not `torch.cuda.set_device`)."""
from __future__ import annotations

from lintcase import project_rules

ARRAYS = """
import torch


def set_device(device):
    if 'cuda' in device:
        torch.set_default_tensor_type(torch.cuda.FloatTensor)
"""

MODEL = """
import torch
import torch.nn as nn


class GPT(nn.Module):
    def forward(self, idx):
        offsets = torch.arange(self.transition_dim) * self.vocab_size
        offsets = offsets.to(idx.device)
        return self.head(idx + offsets)


def train(model, opt, loader):
    torch.cuda.set_device(0)
    for idx in loader:
        loss = model(idx.cuda(non_blocking=True)).mean()
        loss.backward()
        opt.step()
"""


def test_a_default_device_set_in_a_def_nothing_calls_leaves_factories_on_the_cpu(tmp_path):
    line = next(i for i, t in enumerate(MODEL.splitlines(), 1) if "offsets.to(idx.device)" in t)
    assert project_rules(tmp_path, {"arrays.py": ARRAYS, "model.py": MODEL}) == [("model.py", line, "GB010")]


def test_a_default_device_the_project_sets_makes_factories_gpu_ones(tmp_path):
    script = "from arrays import set_device\n\nset_device('cuda:0')\n"
    assert project_rules(tmp_path, {"arrays.py": ARRAYS, "model.py": MODEL, "main.py": script}) == []
