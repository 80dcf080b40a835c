"""gobrrr lint, issue 29's sixteenth round (round 15 of the rules): shapes still missed after round 14,
heldout14's among them, each from a minimal example in the default run, with the look-alike shapes that
must stay quiet."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gobrrr.lint.check import lint_paths, lint_source
from tests.test_lint_round4 import HEAD, default
from tests.test_lint_shapes import project

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


# -- one-file scripts that each define their own Actor: `actor.act(state)` runs this file's
SCRIPT = """
import gym


class Actor(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.net = nn.Linear(n, 2)

    def act(self, state, device):
        state = torch.tensor(state.reshape(1, -1), device=device)
        return self(state).cpu().numpy().flatten()


def evaluate(env, actor, device, episodes):
    for _ in range(episodes):
        state, done = env.reset(), False
        while not done:
            action = actor.act(state, device)
            state, reward, done, _ = env.step(action)


def main():
    env = gym.make("Hopper-v2")
    evaluate(env, Actor(11).to(DEVICE), DEVICE, 10)
"""


def test_an_objects_method_resolves_to_the_calling_files_class_among_many(tmp_path):
    """CORL: fourteen one-file algorithms, each with its own Actor (or TanhGaussianPolicy) and `act`;
    eval_actor's `actor.act(state, device)` is named after too many classes project-wide, but only one
    of its own file: that one runs, copying the observation and reading the action back per env step (the env
    loop's round trip, which its GB014 names: round 24)."""
    root = project(tmp_path, {f"algo{i}.py": SCRIPT for i in range(4)})
    covered = {(Path(f.path).name, Path(a.rsplit(":", 1)[0]).name, int(a.rsplit(":", 1)[1]) - HEAD.count("\n"))
               for f in lint_paths([root]) if f.rule == "GB014" for a in f.covers_at}
    assert {("algo0.py", "algo0.py", 11), ("algo0.py", "algo0.py", 12), ("algo3.py", "algo3.py", 12)} <= covered, covered


def test_a_file_without_such_a_class_pins_none_of_the_others(tmp_path):
    caller = SCRIPT[SCRIPT.index("def evaluate"):]   # the loop alone, in a file of its own: which Actor is unknown
    root = project(tmp_path, {**{f"algo{i}.py": SCRIPT for i in range(4)}, "run.py": "import gym\n" + caller})
    found = {(Path(f.path).name, f.rule) for f in lint_paths([root])}
    assert not {r for r in found if r[0] == "run.py" and r[1] != "GB014"}, found


def test_two_classes_of_the_calling_file_with_that_method_both_run(tmp_path):
    """CORL's IQL: `actor.act(state, device)` where the file defines GaussianPolicy.act and
    DeterministicPolicy.act (an option picks one): both are walked as the eval loop's."""
    two = SCRIPT.replace("class Actor(nn.Module):", "class Gaussian(nn.Module):") + SCRIPT[
        SCRIPT.index("class Actor"):SCRIPT.index("def evaluate")].replace("class Actor", "class Deterministic").replace(
        "self(state).cpu()", "self.net(state).cpu()")
    root = project(tmp_path, {f"algo{i}.py": two for i in range(4)})
    covered = {(Path(f.path).name, int(a.rsplit(":", 1)[1]) - HEAD.count("\n"))
               for f in lint_paths([root]) if f.rule == "GB014" for a in f.covers_at}
    assert {("algo0.py", 12), ("algo0.py", 33)} <= covered, sorted(covered)


# -- a gym environment's reset() gives a numpy observation
ONLINE = """
import gym


def finetune(actor, steps):
    env = gym.make("Hopper-v2")
    state = env.reset()
    for t in range(steps):
        action = actor(torch.tensor(state.reshape(1, -1), device=DEVICE))
        action = action.cpu().numpy()
        state, reward, done, _ = env.step(action)
        if done:
            state = env.reset()
"""


def test_the_observation_of_a_gym_reset_is_host_data_copied_per_step():
    """CORL's online fine-tuning loop: `torch.tensor(state.reshape(1, -1), device=...)` with `state` from
    `env.reset()` of a gym env (a numpy array, not a tensor guessed from `.reshape`): the copy is the
    round trip's, counted in the loop's GB014."""
    out = lint_source(HEAD + textwrap.dedent(ONLINE), "train.py")
    gb014 = [f for f in out if f.rule == "GB014"]
    assert gb014 and 9 + HEAD.count("\n") in gb014[0].covers, [(f.rule, f.line, f.covers) for f in out]


def test_the_reset_of_an_environment_made_elsewhere_stays_unknown():
    body = ONLINE.replace('gym.make("Hopper-v2")', "make_gpu_env()").replace(
        "action = action.cpu().numpy()", "pass")   # an on-device simulator, actions kept on the device
    assert not [f for f in default(body) if f[0] in ("GB010", "GB014")], default(body)


# -- random actions drawn with numpy: an environment loop with no read-back
WARMUP = """
def fill(env, memory, n, actions):
    state, done, t = env.reset(), True, 0
    while t < n:
        if done:
            state = env.reset()
        next_state, _, done = env.step(np.random.randint(0, actions))
        memory.append(state, done)
        state = next_state
        t += 1
"""


def test_a_loop_stepping_an_env_with_numpy_random_actions_reads_nothing_back():
    """Rainbow's validation-memory warm-up: `env.step(np.random.randint(0, n))` draws the action on the
    host (a number now, not an unknown); no policy output is read back, so no GB014 round trip."""
    assert not [f for f in default(WARMUP) if f[0] == "GB014"], default(WARMUP)


def test_a_policy_action_read_back_in_the_same_loop_is_a_round_trip():
    body = WARMUP.replace("np.random.randint(0, actions)", "policy(state).argmax().item()")
    assert [f for f in default(body) if f[0] == "GB014"], default(body)


# -- distributions handed back by the project's own defs
POLICY = """
from torch.distributions import Normal


class Policy(nn.Module):
    def __init__(self, n, m):
        super().__init__()
        self.mlp = nn.Linear(n, m)
        self.log_std = nn.Parameter(torch.zeros(m))

    def _dist(self, obs):
        mean = self.mlp(obs)
        return Normal(mean, self.log_std.exp())

    def log_prob(self, obs, action):
        policy = self._dist(obs)
        return policy.log_prob(action).sum(-1)


def train(policy, opt, loader):
    for obs, act in loader:
        obs, act = obs.to(DEVICE), act.to(DEVICE)
        loss = -policy.log_prob(obs, act).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_log_prob_of_a_distribution_a_helper_returns_is_validated():
    """CORL's AWAC: `policy = self._get_policy(state)` returns `Normal(mean, std)` built with validation
    on; `policy.log_prob(action)` checks the sample against the support on the host, every step."""
    assert ("GB013", 17) in default(POLICY), default(POLICY)


def test_a_helper_returning_an_unvalidated_distribution_stays_quiet():
    body = POLICY.replace("Normal(mean, self.log_std.exp())", "Normal(mean, self.log_std.exp(), validate_args=False)")
    assert not [f for f in default(body) if f[0] == "GB013"], default(body)


GUARDED = """
def fit(actor, opt, loader):
    for obs, actions in loader:
        out = actor(obs.to(DEVICE))
        if isinstance(out, torch.distributions.Distribution):
            loss = -out.log_prob(actions).sum(-1).mean()
        else:
            loss = ((out - actions) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_log_prob_under_an_isinstance_distribution_test_is_validated():
    """CORL's IQL: `policy_out = self.actor(observations)`, then `policy_out.log_prob(actions)` in the branch
    `if isinstance(policy_out, torch.distributions.Distribution):` (a Gaussian policy, validation on)."""
    assert ("GB013", 6) in default(GUARDED), default(GUARDED)


def test_the_isinstance_branch_stays_quiet_when_validation_is_off_globally():
    body = "torch.distributions.Distribution.set_default_validate_args(False)\n" + GUARDED
    assert not [f for f in default(body) if f[0] == "GB013"], default(body)


EITHER = """
from torch.distributions import Normal


class Gaussian(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Linear(4, 2)

    def forward(self, obs):
        return Normal(self.mlp(obs), torch.ones(2, device=obs.device))


class Deterministic(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Linear(4, 2)

    def forward(self, obs):
        return self.mlp(obs)


def online(env, deterministic, steps):
    actor = (Deterministic() if deterministic else Gaussian()).to(DEVICE)
    state = env.reset()
    for t in range(steps):
        action = actor(torch.tensor(state, device=DEVICE))
        if not deterministic:
            action = action.sample()
        state, reward, done, _ = env.step(action.cpu().numpy())
"""


def test_an_object_made_by_either_of_two_classes_runs_both_forwards():
    """CORL's IQL fine-tuning: `actor = (DeterministicPolicy(...) if cfg.iql_deterministic else
    GaussianPolicy(...)).to(device)`; `actor(obs).sample()` is the Gaussian's Normal.sample(), which calls
    torch.normal with a tensor std (a host check of std >= 0), every environment step."""
    assert ("GB013", 29) in default(EITHER), default(EITHER)


def test_either_class_returning_tensors_only_stays_quiet():
    body = EITHER.replace("return Normal(self.mlp(obs), torch.ones(2, device=obs.device))", "return self.mlp(obs)")
    assert not [f for f in default(body) if f[0] == "GB013"], default(body)


# -- a device tensor's new_tensor(host data)
ZERO = """
def fit(q, opt, loader, lagrange):
    for obs, target in loader:
        obs = obs.to(DEVICE)
        loss = ((q(obs) - target.to(DEVICE)) ** 2).mean()
        if lagrange:
            penalty = q(obs).mean()
        else:
            penalty = obs.new_tensor(0.0)
        opt.zero_grad()
        (loss + penalty).backward()
        opt.step()
"""


def test_new_tensor_of_a_number_on_a_device_tensor_is_a_host_copy():
    """CORL's CQL: `alpha_prime_loss = observations.new_tensor(0.0)` builds the scalar on the host and
    copies it to the GPU, blocking, every step (torch.zeros((), device=obs.device) would not)."""
    assert ("GB010", 9) in default(ZERO), default(ZERO)


def test_new_tensor_of_a_host_batch_stays_quiet():
    body = ZERO.replace("obs = obs.to(DEVICE)", "obs = obs.numpy()").replace("q(obs)", "q(obs.to(DEVICE))")
    assert ("GB010", 9) not in default(body), default(body)


# -- batch loops the step-loop test missed: a dict of loaders, a loader loop that runs a sampler per batch
LOADERS = """
def train(model, opt, dataloaders, counter):
    for i, (img, txt) in enumerate(dataloaders["train"]):
        total = counter.sum().item()
        loss = model(img.to(DEVICE), txt.to(DEVICE))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_loader_taken_from_a_dict_of_loaders_makes_a_step_loop():
    """DALLE2's train_decoder: `for i, (img, emb, txt) in enumerate(dataloaders["train"]):`, where the
    update runs in an inner loop over the cascade's unets; the batch loop's own `.item()` runs per batch."""
    body = LOADERS.replace("        loss = model(img.to(DEVICE), txt.to(DEVICE))\n        opt.zero_grad()\n"
                           "        loss.backward()\n        opt.step()\n",
                           "        for unet in range(3):\n            log(img, unet)\n")
    assert ("GB002", 4) in default(body), default(body)


def test_a_dict_lookup_of_another_name_takes_no_batches():
    body = LOADERS.replace('dataloaders["train"]', 'settings["train"]').replace(
        "        loss = model(img.to(DEVICE), txt.to(DEVICE))\n        opt.zero_grad()\n"
        "        loss.backward()\n        opt.step()\n", "        for unet in range(3):\n            log(img, unet)\n")
    assert ("GB002", 4) not in default(body), default(body)


SAMPLED = """
def sample_loop(model, cond, steps):
    x = torch.randn(cond.shape, device=cond.device)
    for t in range(steps):
        x = model(x, cond)
    return x


def cosine_eval(model, dataloader, steps):
    for emb, txt in dataloader:
        emb = emb.to(DEVICE)
        idx = torch.roll(torch.arange(emb.shape[0]), 1)
        shuffled = emb[idx]
        out = sample_loop(model, shuffled, steps)
        print(out.mean().item())
"""


def test_a_loader_loop_that_runs_a_sampler_per_batch_is_a_step_loop():
    """DALLE2's report_cosine_sims: each evaluation batch is copied, shuffled with a CPU index and run
    through two sampling loops; the batch loop is still the per-batch step (its copies and reads
    repeat per batch), not only an outer loop around the samplers."""
    assert ("GB011", 13) in default(SAMPLED) and ("GB002", 15) in default(SAMPLED), default(SAMPLED)


def test_a_plain_loop_that_hands_its_item_to_a_sampler_is_a_step_loop_and_one_that_does_not_stays_outer():
    """Round 15 kept `for emb in prompts:` (no batches taken) an outer loop around the sampler. Round 68 changed
    that on what the readers of heldout110-113 counted (TriForce's prompts, txt2img's batches of prompts): a loop
    over items that copies its item up and hands it to a sampler does per-item work each time. A loop that hands
    the sampler nothing of its item stays an outer loop."""
    body = SAMPLED.replace("for emb, txt in dataloader:", "for emb in prompts:")   # no batches taken
    assert ("GB011", 13) in default(body), default(body)
    fixed = body.replace("out = sample_loop(model, shuffled, steps)", "out = sample_loop(model, noise, steps)")
    assert ("GB011", 13) not in default(fixed), default(fixed)


# -- a number made a tensor under a type test; a def that returns a tensor or None
REDUCE = """
def reduce(x, device):
    if type(x) is not torch.Tensor:
        x = torch.tensor([x])
    x = x.to(device)
    return x.sum()


def train(model, opt, loader):
    for img in loader:
        loss = model(img.to(DEVICE)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        n = reduce(len(img), DEVICE)
"""


def test_a_number_wrapped_in_a_tensor_under_a_type_test_is_host_data():
    """DALLE2's pad_gather_reduce(trainer, len(txt)): `if type(x) is not torch.Tensor: x = torch.tensor([x])`
    then `x.to(trainer.device)`: a number always takes the branch, so the copy is of host data, per step."""
    assert ("GB010", 5) in default(REDUCE), default(REDUCE)


def test_a_device_tensor_through_the_same_type_test_stays_quiet():
    body = REDUCE.replace("n = reduce(len(img), DEVICE)", "n = reduce(loss, DEVICE)")
    assert ("GB010", 5) not in default(body), default(body)


OPTIONAL = """
def gather_min(x):
    if x.numel() == 0:
        return None
    return torch.min(x)


def train(model, opt, loader, every):
    for img in loader:
        loss = model(img.to(DEVICE)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        delta = gather_min(loss.detach())
        if delta != None and delta > every:
            pass
"""


def test_a_def_returning_a_tensor_or_none_gives_a_tensor():
    """DALLE2's `eval_delta = pad_gather_reduce(...)` (None when everything was masked out, else a
    reduction on the device): `if eval_delta != None and eval_delta > every:` reads it back, per step."""
    assert ("GB007", 15) in default(OPTIONAL), default(OPTIONAL)


def test_a_def_returning_a_number_or_none_stays_quiet():
    body = OPTIONAL.replace("return torch.min(x)", "return len(x)")
    assert ("GB007", 15) not in default(body), default(body)
