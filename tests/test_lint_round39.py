"""gobrrr lint, issue 29's round on heldout39's misses: a project def that exists to turn numpy into a tensor
(HARL and on-policy: `def check(x): return torch.from_numpy(x) if isinstance(x, np.ndarray) else x`, then
`check(batch).to(**self.tpdv)` on every minibatch; mbrl-lib's `to_tensor`) is handed numpy, so moving what it
returns copies host data, even where the analysis cannot type the data. From a minimal project, beside the
neighbours that must stay quiet."""
from __future__ import annotations

from lintcase import line_of, project_rules

UTILS = """
import numpy as np
import torch


def check(value):
    output = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    return output


def to_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    raise ValueError("a tensor or an ndarray")


def to_cuda(x):
    t = torch.from_numpy(x)
    return t.cuda()
"""

ACTOR = """
import torch

from utils import check, to_cuda, to_tensor


class Actor:
    def __init__(self, policy, optim, device):
        self.policy, self.optim = policy, optim
        self.tpdv = dict(dtype=torch.float32, device=device)
        self.device = device

    def update(self, sample):
        obs, adv, ret = sample
        obs = check(obs).to(**self.tpdv)
        adv = to_tensor(adv).to(self.device)
        ret = to_cuda(ret).to(self.device)
        loss = (self.policy(obs) * adv).mean() + ret.mean()
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()

    def train(self, buffer):
        for sample in buffer.feed_forward_generator(4):
            self.update(sample)
"""


def test_moving_what_a_numpy_converter_returns_copies_host_data(tmp_path):
    found = project_rules(tmp_path, {"utils.py": UTILS, "actor.py": ACTOR})
    assert ("actor.py", line_of(ACTOR, "check(obs).to("), "GB010") in found
    assert ("actor.py", line_of(ACTOR, "to_tensor(adv).to("), "GB010") in found


def test_a_def_that_already_moves_its_result_is_no_converter(tmp_path):
    """`to_cuda` returns a device tensor: moving it again is a no-op, not a host copy."""
    found = project_rules(tmp_path, {"utils.py": UTILS, "actor.py": ACTOR})
    assert ("actor.py", line_of(ACTOR, "to_cuda(ret).to("), "GB010") not in found


def test_a_converter_handed_a_device_tensor_returns_it(tmp_path):
    src = ACTOR.replace("obs, adv, ret = sample", "obs, adv, ret = sample\n        obs = obs.cuda(non_blocking=True)")
    found = project_rules(tmp_path, {"utils.py": UTILS, "actor.py": src})
    assert ("actor.py", line_of(src, "check(obs).to("), "GB010") not in found
