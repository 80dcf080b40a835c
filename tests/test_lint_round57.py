"""gobrrr lint, issue 29's round 57 on heldout67's first sight (SAC-Extensions, SparseInst): the firing test
beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_a_buffer_method_bound_in_init_runs_when_called_by_that_name(tmp_path):
    """SAC-Extensions' prioritized buffer has no `def sample`: `__init__` binds `self.sample = self.sample_` (or
    `self.sample_ere`), and the agent calls `self.memory.sample()` every update. The call named no def of that
    class, so the blocking uploads in `sample_` went unreported (10 lines). A method bound but never called
    stays out of the step."""
    buffers = """
        import numpy as np
        import torch

        class PrioritizedReplay:
            def __init__(self, capacity, device, ere=False):
                self.buffer, self.device = [], device
                self.sample = self.sample_ere if ere else self.sample_
                self.dump = self.dump_

            def sample_(self):
                states = [self.buffer[i] for i in np.random.choice(len(self.buffer), 64)]
                return torch.FloatTensor(np.float32(np.concatenate(states))).to(self.device)

            def sample_ere(self, c_k=64):
                states = [self.buffer[i] for i in range(c_k)]
                return torch.FloatTensor(np.float32(np.concatenate(states))).to(self.device)

            def dump_(self):
                return torch.FloatTensor(np.float32(self.buffer)).to(self.device)
        """
    agent = """
        import torch
        from buffers import PrioritizedReplay

        class Agent:
            def __init__(self, actor, critic_opt, device):
                self.actor, self.critic_opt = actor, critic_opt
                self.memory = PrioritizedReplay(100000, device)

            def learn(self, steps):
                for step in range(steps):
                    states = self.memory.sample()
                    loss = self.actor(states).mean()
                    self.critic_opt.zero_grad()
                    loss.backward()
                    self.critic_opt.step()
        """
    found = {(f, line) for f, line, _ in project_rules(tmp_path, {"buffers.py": buffers, "agent.py": agent})}
    src = textwrap.dedent(buffers)
    assert ("buffers.py", line_of(src, "return torch.FloatTensor(np.float32(np.concatenate(states)))")) in found, found
    assert ("buffers.py", line_of(src, "np.float32(self.buffer)")) not in found, found


def test_what_a_matcher_returns_on_its_main_path_is_what_its_callers_get():
    """SparseInst's matcher returns `[(torch.as_tensor([]).to(pred_logits), ...)] * B` from an early guard when no
    image has a target, and the CPU index tensors of scipy's assignment on its main path: the two returns
    disagreed, so `indices` was unknown and the five device tensors the loss indexes with those CPU indices went
    unreported. A helper whose returns disagree without such a guard stays unknown."""
    src = textwrap.dedent("""
        import torch
        from scipy.optimize import linear_sum_assignment

        class HungarianMatcher(torch.nn.Module):
            def forward(self, logits, targets):
                with torch.no_grad():
                    if sum(len(t) for t in targets) == 0:
                        return [(torch.as_tensor([]).to(logits), torch.as_tensor([]).to(logits))] * len(targets)
                    cost = logits.softmax(-1).cpu()
                    pairs = [linear_sum_assignment(c) for c in cost]
                    return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64))
                            for i, j in pairs]

        class RandomPicker(torch.nn.Module):
            def forward(self, logits, targets):
                if len(targets) > 1:
                    out = [(torch.arange(3), torch.arange(3))]
                else:
                    return [(logits.argmax(-1), logits.argmin(-1))]
                return out

        class Criterion(torch.nn.Module):
            def __init__(self, matcher, picker):
                super().__init__()
                self.matcher, self.picker = matcher, picker

            def forward(self, logits, targets):
                indices = self.matcher(logits, targets)
                src = torch.cat([i for (i, _) in indices])
                picked = logits[0][src]
                others = self.picker(logits, targets)
                other = logits[0][torch.cat([i for (i, _) in others])]
                return picked.sum() + other.sum()

        def train(model, criterion, loader, opt):
            for images, targets in loader:
                loss = criterion(model(images.cuda(non_blocking=True)), targets)
                opt.zero_grad()
                loss.backward()
                opt.step()
        """)
    found = rules(src)
    assert (line_of(src, "picked = logits[0][src]"), "GB011") in found, found
    assert not any(line == line_of(src, "other = logits[0]") for line, _ in found), found


def test_a_normal_draw_from_device_tensors_is_on_the_device():
    """rectified-flow's SoFlow draws its times with `torch.normal(mean_t, std_t)` of device tensors: `torch.normal`
    was read as a factory without `device=`, so a host tensor, and `t_all[mask]` went unreported once a guard's
    `return torch.rand(shape, device=device)` no longer hid the disagreement. Drawn with Python floats (a shape
    given), it is a host tensor, and indexing it with a host mask is no sync."""
    src = textwrap.dedent("""
        import torch

        def sample_times(batch, device):
            mean_t = torch.full((batch,), 0.0, device=device)
            std_t = torch.full((batch,), 1.0, device=device)
            return torch.normal(mean_t, std_t).sigmoid()

        def train(model, loader, opt, device):
            for x in loader:
                x = x.to(device, non_blocking=True)
                t_all = sample_times(x.shape[0], device)
                mask = torch.rand(x.shape[0], device=device) < 0.5
                t = t_all[mask]
                host_t = torch.normal(0.0, 1.0, size=(4,))
                kept = host_t[host_t > 0]
                loss = model(x[:1], t.sum() + kept.sum()).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        """)
    found = rules(src)
    assert (line_of(src, "t = t_all[mask]"), "GB008") in found, found
    assert not any(line == line_of(src, "kept = host_t[") for line, _ in found), found
