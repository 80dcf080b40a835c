"""gobrrr lint, issue 29's twenty-sixth round (round 25 of the rules): where a CPU environment is stepped (PlaNet:
an env wrapper with an action repeat, and a helper that acts and steps, called by three loops). Each shape from a
minimal example, beside the neighbouring shape that must stay quiet."""
from __future__ import annotations

import textwrap

from gobrrr.lint.check import lint_source
from tests.test_lint_round4 import HEAD, default

WRAPPER = """
import gym


class ActionRepeat:
    def __init__(self, name, repeat):
        self._env = gym.make(name)
        self.repeat = repeat

    def step(self, action):
        action = action.detach().numpy()
        reward = 0
        for k in range(self.repeat):
            obs, r, done, info = self._env.step(action)
            reward += r
        return torch.tensor(obs), reward, done


def rollout(env, policy, obs):
    for t in range(1000):
        action = policy(obs.to(DEVICE)).cpu()
        obs, reward, done = env.step(action)
"""


def test_an_env_wrappers_own_repeat_loop_is_no_rollout_loop():
    """`self._env.step(action)` in the wrapper's `step` (an action repeat) gets no GB014: the action is already on
    the host there. The rollout loop that steps the wrapper gets it, once."""
    found = default(WRAPPER)
    assert ("GB014", 14) not in found and ("GB014", 22) in found, found


HELPER = """
def act_and_step(env, policy, obs):
    action = policy(obs)
    best = action.max().item()
    next_obs, reward, done, info = env.step(action.cpu())
    return action, next_obs, reward, done, best


def collect(env, policy, obs):
    for t in range(1000):
        action, obs, reward, done, best = act_and_step(env, policy, obs.to(DEVICE))
"""


def test_a_helper_that_acts_and_steps_is_the_loops_env_step():
    """PlaNet's `update_belief_and_act(env, ..., obs.to(dev))`, called by the collect, test and evaluation loops: the
    call is the loop's env step (GB014 at it), and the action read back in the helper's `env.step(action.cpu())` is
    its round trip (named there, not reported again); the helper's other `.item()` is reported as before."""
    out = lint_source(HEAD + textwrap.dedent(HELPER), "train.py")
    at = {(f.rule, f.line - HEAD.count("\n")) for f in out}
    (gb014,) = [f for f in out if f.rule == "GB014"]
    assert gb014.line - HEAD.count("\n") == 11 and ("GB002", 5) not in at, at
    assert [int(a.rsplit(":", 1)[1]) - HEAD.count("\n") for a in gb014.covers_at] == [5]
    assert ("GB002", 4) in at, at


def test_a_helper_that_steps_in_a_loop_of_its_own_is_not_one_step():
    """A helper that runs whole episodes (its own loop over env.step) is an episode, not the caller's env step."""
    episodes = HELPER.replace("    next_obs, reward, done, info = env.step(action.cpu())\n",
                              "    for _ in range(5):\n        next_obs, reward, done, info = env.step(action.cpu())\n")
    assert ("GB014", 12) not in default(episodes) and ("GB014", 11) in default(HELPER)


# -- gail-airl-ppo: a trainer handed an algorithm picked from a dict of classes, which steps the env it is handed
ALGO = """
import numpy as np


class Buffer:
    def __init__(self, n, device):
        self.states = torch.empty((n, 4), device=device)
        self._p = 0

    def append(self, state):
        self.states[self._p].copy_(torch.from_numpy(state))
        self._p += 1

    def sample(self, batch_size):
        idxes = np.random.randint(low=0, high=self._p, size=batch_size)
        return self.states[idxes]


class PPO:
    def __init__(self, device):
        self.buffer = Buffer(1000, device)
        self.device = device

    def explore(self, state):
        state = torch.tensor(state, dtype=torch.float, device=self.device)
        return state.cpu().numpy()

    def step(self, env, state):
        action = self.explore(state)
        next_state, reward, done, _ = env.step(action)
        self.buffer.append(state)
        return next_state

    def update(self):
        states = self.buffer.sample(64)


ALGOS = {"ppo": PPO}


class Trainer:
    def __init__(self, env, algo):
        self.env = env
        self.algo = algo

    def train(self, steps):
        state = self.env.reset()
        for step in range(steps):
            state = self.algo.step(self.env, state)
            if step % 100 == 0:
                self.algo.update()


def main(args, env):
    algo = ALGOS[args.algo](DEVICE)
    trainer = Trainer(env=env, algo=algo)
    trainer.train(10 ** 6)
"""


def test_an_algorithm_stepping_the_env_it_is_handed_makes_an_env_loop():
    """`state = self.algo.step(self.env, state)`: the trainer's loop steps an environment through the algorithm,
    whose class comes from a dict of classes (`ALGOS[args.algo](...)`) handed to the trainer's constructor; the
    algorithm's upload and read-back and the buffer's copy from numpy (`.copy_(torch.from_numpy(...))`) run every
    env step."""
    found = default(ALGO)
    assert {("GB010", 25), ("GB002", 26), ("GB010", 11)} <= set(found), found


def test_a_buffer_filled_from_device_values_copies_nothing_from_the_host():
    """`.copy_(t)` of a device tensor into a device buffer is a device copy: no GB010."""
    device_copy = ALGO.replace("copy_(torch.from_numpy(state))", "copy_(torch.zeros(4, device=DEVICE))")
    assert ("GB010", 11) not in default(device_copy) and ("GB010", 11) in default(ALGO)
