"""gobrrr lint, issue 29's round 54 on heldout58's first sight (legged_gym): the firing test beside the neighbour
that must stay quiet."""
from __future__ import annotations

from tests.lintcase import project_rules as _lint


def test_an_environment_step_that_a_library_runner_calls_is_per_step_code(tmp_path):
    """legged_gym's `LeggedRobot(BaseTask).step(actions)` is called by rsl_rl's runner, a library, once per step of
    thousands of GPU environments; no loop of the project calls it, so its `reset_buf.nonzero()` went unreported
    (0 of 17 per-step lines at first sight). A class that is no environment keeps its `step` out of the hot code, and
    so does a `gym.Env` (a host simulator in numpy: mbrl-lib's CartPole)."""
    found = {(f, line) for f, line, rule in _lint(tmp_path, {"base_task.py": """
        import torch

        class BaseTask:
            def __init__(self, num_envs, device):
                self.device = device
                self.reset_buf = torch.zeros(num_envs, dtype=torch.bool, device=device)
        """, "robot.py": """
        import torch
        from base_task import BaseTask

        class LeggedRobot(BaseTask):
            def step(self, actions):
                self.reset_buf = actions.abs().sum(-1) > 1.0
                self.post_physics_step()
                return self.reset_buf

            def post_physics_step(self):
                env_ids = self.reset_buf.nonzero(as_tuple=False).flatten()
                self.reset_buf[env_ids] = False

        class Schedule:
            def __init__(self, device):
                self.t = torch.zeros(8, device=device)

            def step(self, actions):
                return (self.t > 0).nonzero()
        """, "cartpole.py": """
        import gym

        class CartPoleEnv(gym.Env):
            def step(self, action):
                action = action.squeeze()
                x, x_dot = self.state
                x = x + action * 10.0
                return (x, x_dot), 1.0, bool(x < -2.4), {}
        """})}
    assert ("robot.py", 12) in found and ("robot.py", 20) not in found, found
    assert not any(f == "cartpole.py" for f, _ in found), found
