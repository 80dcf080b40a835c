"""gobrrr lint, issue 29's seventeenth round (round 16 of the rules): shapes heldout15 (taming-transformers,
YOLOP, tianshou, lingua) still missed at first sight, each from a minimal example in the default run, with
the look-alike shapes that must stay quiet."""
from __future__ import annotations

from pathlib import Path

from gobrrr.lint.check import lint_paths
from tests.test_lint_round4 import HEAD, default
from tests.test_lint_shapes import project

# -- a parameter annotated as numpy (or numpy-or-tensor) that a forward copies to its own device
MLP = """
def module_device(module):
    return next(module.parameters()).device


class MLP(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.model = nn.Linear(n, 2)

    def forward(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        device = module_device(self)
        obs = torch.as_tensor(obs, device=device, dtype=torch.float32)
        return self.model(obs)


def train(buffer, steps):
    net = MLP(4).to(DEVICE)
    opt = torch.optim.Adam(net.parameters())
    for t in range(steps):
        batch = buffer.sample(64)
        loss = net(batch.obs).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_parameter_annotated_numpy_or_tensor_is_host_data_a_forward_copies():
    """tianshou's MLP.forward(obs: np.ndarray | torch.Tensor): `torch.as_tensor(obs, device=...)` of the
    host vector env's observations and of the numpy buffer batches, a blocking pageable copy per call."""
    assert ("GB010", 13) in default(MLP), default(MLP)


def test_a_numpy_or_tensor_parameter_given_a_device_tensor_stays_quiet():
    body = MLP.replace("    def forward(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:\n"
                       "        device = module_device(self)\n"
                       "        obs = torch.as_tensor(obs, device=device, dtype=torch.float32)\n"
                       "        return self.model(obs)\n",
                       "    def forward(self, obs):\n        return self.model(prep(obs))\n") + """

def prep(obs: np.ndarray | torch.Tensor):
    return torch.as_tensor(obs, device=DEVICE, dtype=torch.float32)
""".replace("xx", "")
    body = body.replace("loss = net(batch.obs).mean()", "loss = net(batch.obs.to(DEVICE, non_blocking=True)).mean()")
    assert not [f for f in default(body) if f[0] == "GB010"], default(body)


def test_a_numpy_annotated_object_array_has_no_device_nonzero():
    """tianshou's `info_array.nonzero()` with `info_array: np.ndarray`: numpy's nonzero, no sync."""
    body = """
    def infos(info_array: np.ndarray):
        return info_array.nonzero()[0]


    def train(net, opt, data, steps):
        for t in range(steps):
            x, info = data.next()
            idx = infos(info)
            loss = net(x.to(DEVICE, non_blocking=True)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    assert not [f for f in default(body) if f[0] == "GB008"], default(body)


# -- a helper imported from a package whose __init__ (which re-exports it) was not checked
CONVERTER = """
def to_numpy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asanyarray(x)
"""
COLLECTOR = """
from pkg.data import to_numpy


def collect(env, policy, steps):
    obs = env.reset()
    for t in range(steps):
        act = to_numpy(policy(torch.as_tensor(obs, device=DEVICE)))
        obs, rew, done, info = env.step(act)
"""


def _tree(tmp_path: Path, files: dict[str, str]) -> set:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    project(tmp_path, files)
    found = lint_paths([tmp_path])   # a line of an env loop's round trip counts as found where its GB014 names it
    return {(Path(f.path).name, f.rule, f.line - HEAD.count("\n")) for f in found} | {
        (Path(a.rsplit(":", 1)[0]).name, f.rule, int(a.rsplit(":", 1)[1]) - HEAD.count("\n"))
        for f in found for a in f.covers_at}


def test_a_def_below_a_package_whose_init_was_not_checked_runs(tmp_path):
    """tianshou: `from tianshou.data import to_numpy` when tianshou/data/__init__.py is outside the linted
    paths: the one checked file below tianshou/data defining to_numpy (data/utils/converter.py) runs, and
    its `.cpu()` reads the policy's actions back every environment step."""
    found = _tree(tmp_path, {"pkg/data/utils/converter.py": CONVERTER, "pkg/collector.py": COLLECTOR})
    assert ("converter.py", "GB014", 4) in found, found   # GB014: the collector's round trip names it


def test_two_defs_of_that_name_below_the_package_pin_neither(tmp_path):
    found = _tree(tmp_path, {"pkg/data/utils/converter.py": CONVERTER, "pkg/data/other.py": CONVERTER,
                             "pkg/collector.py": COLLECTOR})
    assert not {f for f in found if f[0] in ("converter.py", "other.py")}, found


# -- a host tensor given a dtype by `.type(dtype)` is still on the host
TO_TORCH = """
def to_torch(x, dtype=None, device="cpu"):
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
        if dtype is not None:
            x = x.type(dtype)
        return x.to(device)
    if isinstance(x, torch.Tensor):
        return x.to(device)
    raise TypeError(x)


def to_torch_as(x, y):
    return to_torch(x, dtype=y.dtype, device=y.device)


def update(critic, opt, buf, steps):
    for t in range(steps):
        obs, rew = buf.sample(64)
        v = critic(obs)
        ret = to_torch_as(rew * 0.99, v)
        loss = (v - ret).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_host_tensor_cast_with_type_dtype_then_moved_is_a_copy():
    """tianshou's to_torch: `torch.from_numpy(x)`, `x.type(dtype)`, `x.to(device)` with the device of the
    critic's values: the n-step returns computed on the host copied back, blocking, every gradient step."""
    assert ("GB010", 7) in default(TO_TORCH), default(TO_TORCH)


def test_a_host_tensor_cast_and_kept_on_the_host_stays_quiet():
    body = TO_TORCH.replace("ret = to_torch_as(rew * 0.99, v)", "ret = to_torch(rew * 0.99, dtype=torch.float32)")
    assert not [f for f in default(body) if f[0] in ("GB010", "GB001")], default(body)


# -- distributions wrapped in Independent, and made by a def handed to a constructor
POLICY = """
from torch.distributions import Independent, Normal


class Policy(nn.Module):
    def __init__(self, actor, dist_fn):
        super().__init__()
        self.actor = actor
        self.dist_fn = dist_fn

    def forward(self, obs):
        loc_scale, hidden = self.actor(obs)
        dist = self.dist_fn(loc_scale)
        return dist.sample()


def main(buf, steps):
    actor = Net().to(DEVICE)

    def dist(loc_scale):
        loc, scale = loc_scale
        return Independent(Normal(loc, scale), 1)

    policy = Policy(actor, dist_fn=dist)
    opt = torch.optim.Adam(policy.parameters())
    for t in range(steps):
        obs = buf.sample(64).to(DEVICE, non_blocking=True)
        loss = policy(obs).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_def_handed_to_a_constructor_runs_where_the_object_calls_its_attribute():
    """tianshou's mujoco scripts: `ProbabilisticActorPolicy(actor=actor, dist_fn=dist)` with the script's
    own `def dist(loc_scale): return Independent(Normal(loc, scale), 1)`; the policy's forward calls
    `self.dist_fn(...)` with the actor's (loc, scale) every step: the Normal validates its arguments on
    the host, and its `.sample()` checks the scale through torch.normal."""
    assert {("GB013", 22), ("GB013", 14)} <= set(default(POLICY)), default(POLICY)


def test_a_def_handed_to_a_constructor_with_validation_off_stays_quiet():
    body = POLICY.replace("Normal(loc, scale)", "Normal(loc, scale, validate_args=False)").replace(
        "return dist.sample()", "return dist.rsample()")
    assert not [f for f in default(body) if f[0] == "GB013"], default(body)


def test_log_prob_of_an_independent_normal_checks_the_sample():
    """tianshou's SAC: `dist = Independent(Normal(loc=loc_B, scale=scale_B), 1)`, then `dist.log_prob(act_B)`
    every environment and gradient step: Independent's log_prob runs the Normal's sample check."""
    body = """
    from torch.distributions import Independent, Normal


    class Actor(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.mu = nn.Linear(n, 2)

        def forward(self, obs):
            mu = self.mu(obs)
            dist = Independent(Normal(mu, mu.exp()), 1)
            act = dist.rsample()
            return act, dist.log_prob(act)


    def train(actor, opt, buf, steps):
        for t in range(steps):
            obs = buf.sample(64).to(DEVICE, non_blocking=True)
            act, logp = actor(obs)
            loss = -logp.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    assert ("GB013", 14) in default(body), default(body)
    quiet = body.replace("Normal(mu, mu.exp())", "Normal(mu, mu.exp(), validate_args=False)")
    assert ("GB013", 14) not in default(quiet), default(quiet)


# -- a learnable CPU scalar that CUDA losses carry: each backward() copies its gradient to the host
TRAINER = """
class Scalar(nn.Module):
    def __init__(self, init_value: float):
        super().__init__()
        self.constant = nn.Parameter(torch.tensor(init_value, dtype=torch.float32))

    def forward(self):
        return self.constant


class Trainer:
    def __init__(self, actor, actor_opt, device):
        self.actor, self.actor_opt = actor, actor_opt
        self.log_alpha = Scalar(0.0)
        self.alpha_opt = torch.optim.Adam(self.log_alpha.parameters())

    def _alpha(self, log_pi):
        alpha_loss = -(self.log_alpha() * log_pi.detach()).mean()
        alpha = self.log_alpha().exp()
        return alpha, alpha_loss

    def _policy_loss(self, obs, alpha, log_pi):
        return (alpha * log_pi - self.actor.q(obs)).mean()

    def train(self, batch):
        obs = batch
        act, log_pi = self.actor(obs)
        alpha, alpha_loss = self._alpha(log_pi)
        policy_loss = self._policy_loss(obs, alpha, log_pi)
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()
        self.actor_opt.zero_grad()
        policy_loss.backward()
        self.actor_opt.step()


def main(buf, steps):
    actor = Actor().to(DEVICE)
    trainer = Trainer(actor, torch.optim.Adam(actor.parameters()), DEVICE)
    for t in range(steps):
        batch = buf.sample(256)
        trainer.train(batch)
"""


def test_a_backward_through_a_cpu_scalar_parameter_copies_its_gradient_to_the_host():
    """CORL's CQL and Cal-QL: `self.log_alpha = Scalar(0.0)` in a trainer object that nothing moves; the
    temperature loss, and the policy loss through the undetached `alpha` a helper returns, carry it, so
    each backward() copies the CUDA gradient of the 0-dim CPU parameter to the host, every step."""
    assert {("GB013", 31), ("GB013", 34)} <= set(default(TRAINER)), default(TRAINER)


def test_a_scalar_moved_to_the_device_or_detached_stays_quiet():
    moved = TRAINER.replace("self.log_alpha = Scalar(0.0)", "self.log_alpha = Scalar(0.0).to(device)")
    assert not [f for f in default(moved) if f[0] == "GB013"], default(moved)
    detached = TRAINER.replace("alpha = self.log_alpha().exp()", "alpha = self.log_alpha().exp().detach()")
    assert ("GB013", 34) not in default(detached), default(detached)


def test_a_scalar_of_a_module_the_owner_moves_whole_stays_quiet():
    body = TRAINER.replace("class Trainer:", "class Trainer(nn.Module):")
    assert not [f for f in default(body) if f[0] == "GB013"], default(body)
