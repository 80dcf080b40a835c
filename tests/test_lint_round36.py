"""gobrrr lint, issue 29's round on heldout34's misses: the legacy `t.new(data)` of a configuration table
(pytorch-faster-rcnn: `bbox_pred.data.new(cfg.TRAIN.BBOX_NORMALIZE_STDS)`), and an environment loop that steps
its environment through one of the project's defs (Deep-RL-Algorithms: `self.conduct_action(self.action)`, whose
body holds `env.step(action)`). Each shape from a minimal example, beside the neighbour that must stay quiet."""
from __future__ import annotations

from lintcase import line_of, rules

NEW = """
import torch


def train(model, opt, loader, cfg):
    for x in loader:
        out = model(x.cuda(non_blocking=True))
        stds = out.new(cfg.TRAIN.BBOX_NORMALIZE_STDS)
        buf = out.new(4)
        loss = (out * stds).sum() + buf.sum()
        loss.backward()
        opt.step()
"""




def test_new_of_a_configuration_table_copies_it_and_new_of_a_size_does_not():
    assert rules(NEW) == [(line_of(NEW, "out.new(cfg.TRAIN"), "GB010")]
    assert rules(NEW.replace("cfg.TRAIN.BBOX_NORMALIZE_STDS", "[0.1, 0.1, 0.2, 0.2]")) == \
        [(line_of(NEW, "out.new(cfg.TRAIN"), "GB010")]


AGENT = """
import numpy as np
import torch


class Agent:
    def conduct_action(self, action):
        self.next_state, self.reward, self.done, _ = self.environment.step(action)

    def pick_action(self):
        state = torch.from_numpy(self.state).float().unsqueeze(0).to(self.device)
        return torch.argmax(self.q_network(state)).item()

    def run_episode(self):
        while not self.done:
            self.action = self.pick_action()
            self.conduct_action(self.action)
            self.state = self.next_state
"""


def test_a_loop_that_steps_its_env_through_a_project_def_is_an_env_loop():
    found = rules(AGENT)
    assert (line_of(AGENT, "torch.from_numpy(self.state)"), "GB001") in found
    assert (line_of(AGENT, ".item()"), "GB002") in found


def test_a_def_named_like_every_class_step_does_not_make_loops_env_loops():
    src = AGENT.replace("def conduct_action", "def step").replace("self.conduct_action(", "self.step(")
    assert rules(src) == []
