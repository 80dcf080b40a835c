"""gobrrr lint, issue 29's sixteenth round (round 15 of the rules): shapes still missed after round 14,
heldout14's among them, each from a minimal example in the default run, with the look-alike shapes that
must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- a replay buffer on the device sampled with numpy's random indices, by an algorithm object's `train`
BUFFER = """
class Buffer:
    def __init__(self, dim, size, device="cpu"):
        self.n = 0
        self.obs = torch.zeros((size, dim), device=device)
        self.rew = torch.zeros((size, 1), device=device)

    def sample(self, b):
        idx = np.random.randint(0, self.n, size=b)
        return self.obs[idx], self.rew[idx]


class Learner:
    def __init__(self, net, opt):
        self.net, self.opt = net, opt

    def train(self, batch):
        obs, rew = batch
        loss = (self.net(obs) - rew).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def main(steps):
    buf = Buffer(8, 1000, DEVICE)
    net = nn.Linear(8, 1).to(DEVICE)
    learner = Learner(net, torch.optim.Adam(net.parameters()))
    for t in range(steps):
        batch = buf.sample(256)
        learner.train(batch)
"""


def test_numpy_random_indices_into_a_device_buffer_are_a_host_index():
    """CORL's ReplayBuffer.sample: `self._states[np.random.randint(0, n, size=b)]` gathers from a CUDA
    tensor with a numpy array, which torch copies to the device, blocking, per tensor and step."""
    body = BUFFER.replace("learner.train(batch)", "net(batch[0]).sum().backward()")   # the step in the loop
    assert ("GB011", 10) in default(body), default(body)


def test_one_random_number_as_an_index_stays_quiet():
    body = BUFFER.replace("learner.train(batch)", "net(batch[0]).sum().backward()").replace(
        "np.random.randint(0, self.n, size=b)", "np.random.randint(0, self.n)")   # one row, a plain select
    assert not [f for f in default(body) if f[0] == "GB011"], default(body)


def test_an_algorithm_objects_train_method_that_steps_makes_the_loop_a_step_loop():
    """`trainer.train(batch)` and `trainer.update(batch)`: names every module has (housekeeping), but the
    object was made from a project class whose own method of that name steps an optimizer."""
    body = BUFFER.replace("np.random.randint(0, self.n, size=b)", "torch.randperm(self.n)[:b]")   # host indices
    assert ("GB011", 10) in default(body), default(body)


def test_an_objects_housekeeping_method_that_does_not_update_stays_quiet():
    body = BUFFER.replace("np.random.randint(0, self.n, size=b)", "torch.randperm(self.n)[:b]").replace(
        "loss.backward()", "pass").replace("self.opt.step()", "pass").replace(
        "loss = (self.net(obs) - rew).pow(2).mean()", "self.last = batch")   # train() only stores the batch
    assert not [f for f in default(body) if f[0] == "GB011"], default(body)
