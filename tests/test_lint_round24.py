"""gobrrr lint, issue 29's twenty-fifth round (round 24 of the rules): a repository of script folders (one
algorithm per folder, each with its own main.py, utils.py and agent module, run as `python main.py` from its
folder), linted as one project. Each shape from a minimal example, beside the neighbouring shape that must stay
quiet."""
from __future__ import annotations

import textwrap

from gobrrr.lint.check import lint_paths
from tests.test_lint_round4 import default

MAIN = """
import gym
import torch
from agent import Agent
from utils import evaluate

env = gym.make("CartPole-v1")
agent = Agent(4, 2)
s = env.reset()
for t in range(1000):
    a = agent.select_action(s)
    s2, r, done, info = env.step(a)
    agent.buffer.add(s, a, r, s2)
    s = s2
    if t % 100 == 0:
        evaluate(env, agent)
"""

AGENT = """
import torch


class Buffer:
    def __init__(self, dvc):
        self.dvc = dvc
        self.s = torch.zeros((1000, 4), device=dvc)
        self.ptr = 0

    def add(self, s, a, r, s2):
        self.s[self.ptr] = torch.from_numpy(s).to(self.dvc)
        self.ptr += 1


class Agent:
    def __init__(self, n, m):
        self.dvc = torch.device("cuda")
        self.net = torch.nn.Linear(n, m).to(self.dvc)
        self.buffer = Buffer(self.dvc)
        self.opt = torch.optim.Adam(self.net.parameters())

    def select_action(self, s):
        return self.net(torch.from_numpy(s).float().to(self.dvc)).argmax().item()

    def greedy(self, s):
        return self.net(torch.from_numpy(s).float().to(self.dvc)).argmax().item()

    def train(self):
        loss = self.net(self.buffer.s[:32]).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
"""

UTILS = """
def evaluate(env, agent):
    s = env.reset()
    done = False
    while not done:
        a = agent.greedy(s)
        s, r, done, info = env.step(a)
"""

# the other folders: the same module and class names, a numpy agent (no torch, no device)
NUMPY_AGENT = """
import numpy as np


class Buffer:
    def __init__(self, dvc):
        self.s = np.zeros((1000, 4))
        self.ptr = 0

    def add(self, s, a, r, s2):
        self.s[self.ptr] = s
        self.ptr += 1


class Agent:
    def __init__(self, n, m):
        self.w = np.zeros((m, n))
        self.buffer = Buffer(None)

    def select_action(self, s):
        return int(np.argmax(self.w @ s))

    def greedy(self, s):
        return int(np.argmax(self.w @ s))
"""


def _folders(tmp_path, folders: dict) -> list[tuple[str, str, int, str]]:
    for folder, files in folders.items():
        (tmp_path / folder).mkdir()
        for name, text in files.items():
            (tmp_path / folder / name).write_text(textwrap.dedent(text))
    return sorted((str(f.path).split(str(tmp_path) + "/")[1], f.rule, f.line, " -> ".join(f.chain))
                  for f in lint_paths([str(tmp_path)]))


def _two(tmp_path):
    """1_dqn beside three numpy folders: four Agent and four Buffer classes, too many for their names to pin one."""
    numpy = {"main.py": MAIN.replace("import torch\n", ""), "agent.py": NUMPY_AGENT, "utils.py": UTILS}
    return _folders(tmp_path, {"1_dqn": {"main.py": MAIN, "agent.py": AGENT, "utils.py": UTILS},
                               "2_numpy": numpy, "3_numpy": numpy, "4_numpy": numpy})


def test_each_script_follows_the_modules_of_its_own_folder(tmp_path):
    """`from agent import Agent` in 1_dqn/main.py is 1_dqn/agent.py (the script's folder is sys.path[0]), though
    the numpy folders have an agent.py too: the policy's upload and `.item()`, one line, are reached from the env
    loop, and being its round trip they are named by its GB014 (next test)."""
    _two(tmp_path)
    (gb014,) = [f for f in lint_paths([str(tmp_path)]) if f.rule == "GB014"]
    assert gb014.covers_at == [f"{tmp_path}/1_dqn/agent.py:24"], gb014


def test_a_policy_in_another_file_is_the_env_loops_round_trip(tmp_path):
    """`a = agent.select_action(s)` then `env.step(a)`: the upload of s and the `.item()` of the action, in
    agent.py, are the CPU environment's round trip: one GB014 at the step names them (`covers_at` and its
    message), and they are not reported again; the replay buffer's copy, which the env does not cause, is."""
    found = _two(tmp_path)
    assert ("1_dqn/main.py", "GB014", 12, "") in found and not [f for f in found if f[1:3] == ("GB002", 24)], found
    assert ("1_dqn/agent.py", "GB001", 12, "main.py:13") in found, found
    (gb014,) = [f for f in lint_paths([str(tmp_path)]) if f.rule == "GB014"]
    assert gb014.message.endswith("(the round trip's copies in the calls it makes: agent.py:24)"), gb014.message


def test_the_next_steps_action_renamed_into_place_is_the_policys_too(tmp_path):
    """SARSA's loop computes the next action after the step (`a_next = agent.select_action(s2)`) and renames it
    (`s, a = s2, a_next`): that call is the policy of the next step."""
    sarsa = MAIN.replace("    a = agent.select_action(s)\n", "").replace(
        "s = env.reset()\n", "s = env.reset()\na = agent.select_action(s)\n").replace(
        "    s = s2\n", "    a_next = agent.select_action(s2)\n    s, a = s2, a_next\n")
    assert "a_next" in sarsa
    _folders(tmp_path, {"1_dqn": {"main.py": sarsa, "agent.py": AGENT, "utils.py": UTILS}})
    (gb014,) = [f for f in lint_paths([str(tmp_path)]) if f.rule == "GB014"]
    assert gb014.covers_at == [f"{tmp_path}/1_dqn/agent.py:24"], (gb014, sarsa)


def test_an_attribute_of_an_object_whose_class_is_known_is_followed(tmp_path):
    """`agent.buffer.add(...)`: agent is an Agent, whose __init__ made `self.buffer = Buffer(...)`; the buffer's
    copy from numpy runs every env step (two Buffer classes in the project, so the name alone pins none)."""
    found = _two(tmp_path)
    assert ("1_dqn/agent.py", "GB001", 12, "main.py:13") in found, found


def test_a_parameter_named_after_a_class_of_its_folder_is_that_class(tmp_path):
    """utils.evaluate(env, agent), called every 100 steps: its own env loop calls `agent.greedy(s)`, a method
    two folders define; the Agent of the caller's folder is the one that runs."""
    found = _two(tmp_path)
    assert ("1_dqn/agent.py", "GB002", 27, "utils.py:6") in found, found


def test_the_numpy_folder_beside_it_stays_quiet(tmp_path):
    """The same names over numpy in the other folders: nothing there reaches a device, so nothing there is
    reported (their env loops stay CPU-only, no GB014), and 1_dqn's findings are those it has alone."""
    found = _two(tmp_path)
    assert not [f for f in found if "_numpy/" in f[0]], found
    (tmp_path / "alone").mkdir()
    alone = _folders(tmp_path / "alone", {"1_dqn": {"main.py": MAIN, "agent.py": AGENT, "utils.py": UTILS}})
    assert [f for f in found if f[0].startswith("1_dqn/")] == alone


QTABLE = """
import numpy as np


class QTable:
    def __init__(self):
        self.q = np.zeros((16, 4))

    def select_action(self, s):
        return int(np.argmax(self.q[s]))

    def train(self, s, a, r, s2):
        self.q[s, a] += 0.1 * (r + 0.9 * self.q[s2].max() - self.q[s, a])
"""

TABULAR = """
import gymnasium as gym
from torch.utils.tensorboard import SummaryWriter
from q_table import QTable


def main():
    writer = SummaryWriter()
    env = gym.make("FrozenLake-v1")
    agent = QTable()
    s, info = env.reset()
    for t in range(10000):
        a = agent.select_action(s)
        s2, r, dw, tr, info = env.step(a)
        agent.train(s, a, r, s2)
        s = s2
"""


def test_a_numpy_script_that_only_logs_with_torch_stays_off_the_gpu(tmp_path):
    """Tabular Q-learning beside the project's DQNs: its `agent.train(...)` is named like the DQN's update
    (which steps an optimizer), but it imports torch only for its SummaryWriter, so its loop is not GPU training
    and its env loop no GPU round trip (no GB014); the DQN's is one."""
    found = _folders(tmp_path, {"0_tabular": {"main.py": TABULAR, "q_table.py": QTABLE},
                                "1_dqn": {"main.py": MAIN, "agent.py": AGENT, "utils.py": UTILS}})
    assert ("1_dqn/main.py", "GB014", 12, "") in found and not [f for f in found if f[0].startswith("0_")], found


# -- the data loader of a speedrun (modded-nanogpt): its tensors live on the host until a non_blocking copy
SHARDS = """
BOS = 50256


def load_shard(path):
    header = torch.from_file(path, False, 256, dtype=torch.int32)
    assert header[0] == 20240520, "magic number mismatch"
    n = int(header[2])
    tokens = torch.empty(n, dtype=torch.uint16, pin_memory=True)
    return tokens


def bigram_hash(x):
    out = torch.empty_like(x.to(torch.int32), pin_memory=True)
    out[1:] = (x[1:] * 36313) % 1000
    return out


def generator(files, n):
    file_iter = iter(files)
    tokens, pos = load_shard(next(file_iter)), 0
    while True:
        if pos + n + 1 >= len(tokens):
            tokens, pos = load_shard(next(file_iter)), 0
        buf = tokens[pos: pos + n + 1]
        inputs = buf[:-1].view(n)
        starts = torch.nonzero(inputs == BOS)[:, 0]
        pos += n
        yield inputs.to(DEVICE, non_blocking=True), bigram_hash(inputs).to(DEVICE, non_blocking=True), starts


def train(model, opt, files):
    loader = generator(files, 1024)
    for step in range(100):
        x, h, starts = next(loader)
        model(x, h, starts).backward()
        opt.step()
"""


def test_a_shard_read_from_disk_is_a_host_tensor():
    """`torch.from_file(...)` reads into a CPU tensor: the header's assert and `int(header[2])` sync nothing;
    the same lines over a tensor made on the device do."""
    assert not {("GB007", 7), ("GB002", 8)} & set(default(SHARDS))
    on_device = SHARDS.replace("torch.from_file(path, False, 256, dtype=torch.int32)",
                               "torch.zeros(256, dtype=torch.int32, device=DEVICE)")
    assert {("GB007", 7), ("GB002", 8)} <= set(default(on_device))


def test_a_pinned_tensor_compared_makes_a_host_mask():
    """`torch.nonzero(inputs == BOS)` over pinned tokens runs on the host: no GB008; over device tokens it syncs."""
    assert ("GB008", 27) not in default(SHARDS)
    assert ("GB008", 27) in default(SHARDS.replace("tokens = torch.empty(n, dtype=torch.uint16, pin_memory=True)",
                                                   "tokens = torch.empty(n, device=DEVICE)"))


def test_a_pinned_staging_buffer_made_like_another_is_pinned():
    """`torch.empty_like(x, pin_memory=True)` is page-locked: its non_blocking copy is asynchronous (no GB005);
    without pin_memory it is pageable and the copy is not."""
    assert ("GB005", 29) not in default(SHARDS)
    assert ("GB005", 29) in default(SHARDS.replace("x.to(torch.int32), pin_memory=True)", "x.to(torch.int32))"))
