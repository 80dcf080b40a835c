"""gobrrr lint, issue 29's round on heldout31: a batch cast with `.type(torch.FloatTensor)` before `.cuda()`
(U-2-Net), a project's own `train(replay_buffer, iterations)` seeded with the sampler its caller hands it
(Diffusion-Policies: `train` is also every model's mode switch, so it was never seeded), and an environment loop
that hands its policy a host array (BCQ: `policy.select_action(np.array(state))`, the action read back with
`int()`). Each shape from a minimal example, beside the neighbour that must stay quiet."""
from __future__ import annotations

from lintcase import line_of, rules

CAST = """
import torch
from torch.autograd import Variable


def train(net, opt, loader):
    for i, data in enumerate(loader):
        inputs = data["image"]
        inputs = inputs.type(torch.FloatTensor)
        if torch.cuda.is_available():
            inputs_v = Variable(inputs.cuda(), requires_grad=False)
        else:
            inputs_v = Variable(inputs)
        loss = net(inputs_v).mean()
        loss.backward()
        opt.step()
"""




def test_a_batch_cast_to_a_cpu_tensor_type_is_still_a_batch_copied_each_step():
    assert rules(CAST) == [(line_of(CAST, "inputs.cuda()"), "GB009")]


def test_a_batch_cast_and_kept_on_the_cpu_is_quiet():
    src = CAST.replace("Variable(inputs.cuda(), requires_grad=False)", "Variable(inputs, requires_grad=False)")
    assert rules(src) == []


SAMPLER = """
import numpy as np
import torch


class DataSampler:
    def __init__(self, data, device):
        self.state = torch.from_numpy(data["observations"]).float()
        self.size = self.state.shape[0]
        self.device = device

    def sample(self, batch_size):
        ind = torch.randint(0, self.size, size=(batch_size,))
        return self.state[ind].to(self.device)


class Agent:
    def train(self, replay_buffer, iterations, batch_size=100):
        for _ in range(iterations):
            state = replay_buffer.sample(batch_size)
            loss = self.actor(state).mean()
            self.actor_optimizer.zero_grad()
            loss.backward()
            self.actor_optimizer.step()


def main(dataset, device):
    agent = Agent()
    data_sampler = DataSampler(dataset, device)
    agent.actor.train()
    for epoch in range(10):
        agent.train(data_sampler, iterations=1000)
"""


def test_a_train_def_is_seeded_with_the_sampler_its_caller_hands_it():
    assert rules(SAMPLER) == [(line_of(SAMPLER, "self.state[ind].to(self.device)"), "GB010")]


def test_a_sampler_that_keeps_its_data_on_the_device_is_quiet():
    src = SAMPLER.replace('torch.from_numpy(data["observations"]).float()',
                          'torch.from_numpy(data["observations"]).float().to(device)')
    assert rules(src) == [(line_of(src, "self.state[ind]"), "GB011")]   # its CPU index still crosses, each step
    src = src.replace("size=(batch_size,))", "size=(batch_size,), device=self.device)")
    assert rules(src) == []


ENV = """
import numpy as np
import torch


class DQN:
    def __init__(self, q, device):
        self.device = device
        self.Q = q

    def select_action(self, state):
        state = torch.FloatTensor(state).to(self.device)
        return int(self.Q(state).argmax(1))


def run(env, policy, steps):
    state = env.reset()
    for t in range(steps):
        action = policy.select_action(np.array(state))
        state, reward, done, _ = env.step(action)
"""


def test_an_env_loop_that_hands_its_policy_a_host_array_is_a_round_trip():
    assert rules(ENV) == [(line_of(ENV, "env.step(action)"), "GB014")]


def test_an_env_loop_of_random_actions_is_quiet():
    src = ENV.replace("policy.select_action(np.array(state))", "np.random.uniform(-1, 1, size=2)")
    assert rules(src) == []
