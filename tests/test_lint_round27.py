"""gobrrr lint, issue 29's twenty-eighth round (round 27 of the rules): scripts that define a def of the same name
differently (PyTorch-RL: `update_params` is one A2C update in a2c_gym.py and a loop of PPO epochs in ppo_gym.py).
Each shape from a minimal example, beside the neighbouring shape that must stay quiet."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gobrrr.lint.check import lint_paths

STEP = """
import torch


def a2c_step(net, opt, states):
    loss = net(states).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

A2C = """
import numpy as np
import torch
from core import a2c_step

device = torch.device("cuda")


def update_params(batch, net, opt):
    states = torch.from_numpy(np.stack(batch)).to(device)
    a2c_step(net, opt, states)


def main_loop(agent, net, opt):
    for i_iter in range(1000):
        batch = agent.collect_samples(2048)
        update_params(batch, net, opt)
"""

PPO = """
import numpy as np
import torch
from core import a2c_step

device = torch.device("cuda")


def update_params(batch, net, opt):
    states = torch.from_numpy(np.stack(batch)).to(device)
    for epoch in range(10):
        for mb in states.split(64):
            a2c_step(net, opt, mb)


def main_loop(agent, net, opt):
    for i_iter in range(1000):
        batch = agent.collect_samples(2048)
        update_params(batch, net, opt)
"""

AGENT = """
import torch


class Agent:
    def __init__(self, env, policy):
        self.env, self.policy = env, policy

    def collect_samples(self, n):
        out, state = [], self.env.reset()
        for t in range(n):
            action = self.policy(torch.from_numpy(state)).numpy()
            state, reward, done, _ = self.env.step(action)
            out.append(state)
        return out
"""


def _lint(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return {(Path(f.path).name, f.rule, f.line) for f in lint_paths([str(tmp_path)])}


def test_a_script_whose_own_def_updates_once_steps_in_its_iteration_loop(tmp_path):
    """a2c_gym's `update_params` (one update, no loop of its own) makes each iteration one step: its batch upload
    runs every step, though ppo_gym defines an `update_params` that loops over epochs, and though each iteration
    also collects samples through a def that holds an env loop."""
    found = _lint(tmp_path, {"core.py": STEP, "a2c_gym.py": A2C, "ppo_gym.py": PPO, "agent.py": AGENT})
    assert ("a2c_gym.py", "GB001", 10) in found, found


def test_a_script_whose_own_def_loops_over_epochs_keeps_its_iteration_loop_outer(tmp_path):
    """ppo_gym's `update_params` runs epochs of minibatch steps: its iteration loop is an outer loop, so the upload
    before the epochs is once per iteration (not reported by default)."""
    found = _lint(tmp_path, {"core.py": STEP, "a2c_gym.py": A2C, "ppo_gym.py": PPO, "agent.py": AGENT})
    assert ("ppo_gym.py", "GB001", 10) not in found, found
