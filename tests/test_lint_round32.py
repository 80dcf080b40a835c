"""gobrrr lint, issue 29's round on heldout32 (on-policy, MAPPO): a device spread from a dict
(`check(obs).to(**self.tpdv)` with `self.tpdv = dict(dtype=torch.float32, device=device)`), an absolute import five
packages deep (`from onpolicy.algorithms.r_mappo.algorithm.r_actor_critic import R_Actor`: the index kept only a
module's last four names), and a module's forward handed host arrays where its parameter names guess device
tensors. Each shape from a minimal example, beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap
from pathlib import Path

from lintcase import line_of, rules

from gobrrr.lint.check import lint_paths

SPREAD = """
import numpy as np
import torch


class Policy:
    def __init__(self, net, device):
        self.tpdv = dict(dtype=torch.float32, device=device)
        self.net = net

    def act(self, obs):
        obs = torch.from_numpy(obs).to(**self.tpdv)
        return self.net(obs)


def train(policy, opt, batches):
    for obs in batches:
        loss = policy.act(np.asarray(obs)).mean()
        loss.backward()
        opt.step()
"""




def test_a_device_spread_from_a_dict_is_a_copy_to_the_gpu():
    assert rules(SPREAD) == [(line_of(SPREAD, "to(**self.tpdv)"), "GB001")]


def test_a_dict_that_spreads_only_a_dtype_moves_nothing():
    assert rules(SPREAD.replace("dict(dtype=torch.float32, device=device)", "dict(dtype=torch.float32)")) == []


ACTOR = """
import torch
import torch.nn as nn


class Actor(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.device = device
        self.fc = nn.Linear(4, 2)

    def forward(self, obs):
        obs = torch.as_tensor(obs).float().to(self.device)
        return self.fc(obs)
"""

POLICY = """
import numpy as np

from onpolicy.algorithms.r_mappo.algorithm.actor import Actor


class Policy:
    def __init__(self, device):
        self.actor = Actor(device)

    def get_actions(self, obs):
        return self.actor(obs)


def collect(envs, policy, steps):
    obs = envs.reset()
    for t in range(steps):
        actions = policy.get_actions(np.concatenate(obs))
        obs, rewards, dones, infos = envs.step(actions.detach().cpu().numpy())
"""


def _project(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, int, str, list]]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    found = lint_paths([tmp_path])
    return [(Path(f.path).name, f.line, f.rule, [Path(c).name for c in f.covers_at]) for f in found]


def test_a_class_imported_five_packages_deep_is_followed_into_its_forward(tmp_path):
    found = _project(tmp_path, {"onpolicy/algorithms/r_mappo/algorithm/actor.py": ACTOR,
                                "onpolicy/runner/policy.py": POLICY})
    up = line_of(ACTOR, "torch.as_tensor(obs)")
    assert found == [("policy.py", line_of(POLICY, "envs.step("), "GB014", [f"actor.py:{up}"])]


def test_the_same_four_last_names_in_another_package_are_not_taken_for_it(tmp_path):
    other = ACTOR.replace("torch.as_tensor(obs).float().to(self.device)", "obs")
    found = _project(tmp_path, {"onpolicy/algorithms/r_mappo/algorithm/actor.py": other,
                                "elsewhere/algorithms/r_mappo/algorithm/actor.py": ACTOR,
                                "onpolicy/runner/policy.py": POLICY})
    assert [f for f in found if f[0] == "actor.py"] == []   # elsewhere's forward is not the one imported


def test_a_forward_handed_device_tensors_copies_nothing(tmp_path):
    policy = POLICY.replace("policy.get_actions(np.concatenate(obs))", "policy.get_actions(obs)").replace(
        "obs = envs.reset()", "obs = envs.reset().cuda()")
    found = _project(tmp_path, {"onpolicy/algorithms/r_mappo/algorithm/actor.py": ACTOR,
                                "onpolicy/runner/policy.py": policy})
    assert [f for f in found if f[0] == "actor.py"] == []
