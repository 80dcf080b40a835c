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

PPO = A2C.replace("    a2c_step(net, opt, states)\n", """    for epoch in range(10):
        for mb in states.split(64):
            a2c_step(net, opt, mb)
""")   # the same script, but its update_params loops over epochs of minibatches

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


TRAINER = """
def train_one_epoch(model, opt, loader):
    for x, y in loader:
        model(x.cuda(non_blocking=True)).mean().backward()
        opt.step()
"""

EVAL = """
import torch
from trainer import train_one_epoch

DEVICE = "cuda"


def finetune(model, opt, loader, dataloaders):
    for epoch in range(3):
        train_one_epoch(model, opt, loader)
        metrics(model, dataloaders)


def metrics(model, dataloaders):
    for name, dataloader in dataloaders:
        correct = count_correct(model, dataloader)
        total = torch.tensor([correct], device=DEVICE)
        print(name, total.item())


def count_correct(model, dataloader):
    correct = 0
    for x, y in dataloader:
        out = model(x.to(DEVICE, non_blocking=True))
        correct += (out.argmax(-1) == y.to(DEVICE, non_blocking=True)).sum()
    return correct
"""


def test_a_loop_around_a_local_def_defined_below_that_holds_a_step_loop_is_outer(tmp_path):
    """Megatron's eval_utils: the loop over datasets calls `count_correct`, defined further down, which loops over
    batches: the dataset loop is an outer loop, and its read per dataset is not a per-step sync (also when the
    file calls another file's training loop, so that its loops are found again knowing the project's)."""
    found = _lint(tmp_path, {"eval_utils.py": EVAL, "trainer.py": TRAINER})
    assert ("eval_utils.py", "GB002", 18) not in found and not [f for f in found if f[1] == "GB010"], found
