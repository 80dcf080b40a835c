"""gobrrr lint on the shapes of issue 29: each numbered shape from a minimal example, in the default
run (only what runs every step); the second round's shapes (met in the dev2 repositories) at the
end. The false-positive shapes that must stay quiet are in test_lint_quiet.py."""
from __future__ import annotations

import textwrap
import time
from pathlib import Path

from gobrrr.lint.check import lint_paths, lint_source, main
from gobrrr.lint.graph import Project

# DEVICE names a device: a file that never does is taken as CPU-only and skipped (see the last tests)
HEAD = "import torch\nimport numpy as np\nimport torch.nn as nn\nimport torch.nn.functional as F\nDEVICE = 'cuda'\n"


def default(body: str, **kw) -> list[tuple[str, int]]:
    """(rule, line) of the default run on a snippet; line 1 is the snippet's first line."""
    out = lint_source(HEAD + textwrap.dedent(body), "train.py", **kw)
    return sorted((f.rule, f.line - HEAD.count("\n")) for f in out)


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(HEAD + textwrap.dedent(text))
    return tmp_path


# -- 1. loops the lint did not treat as hot
def test_step_loop_known_by_what_it_does_not_by_names():
    body = """
    def fit(q_network, q_opt, batches, device):
        for obs, target in batches:
            q = q_network(obs.to(device, non_blocking=True))
            loss = F.mse_loss(q, target)
            q_opt.zero_grad()
            loss.backward()
            q_opt.step()
            print(loss.item())
    """
    assert ("GB002", 9) in default(body)   # no model-like name anywhere: backward + step make it a step loop


def test_while_true_with_next_and_gradient_accumulation():
    body = """
    def train(net, it, opt, accum, device):
        while True:
            x = next(it)
            for micro in range(accum):
                loss = net(x[micro].to(device, non_blocking=True)).mean()
                loss.backward()
                print(f"micro {micro} loss {loss}")
            opt.step()
    """
    assert ("GB003", 8) in default(body)   # a print in the micro-batch loop runs every step


def test_per_element_loops_inside_a_step():
    body = """
    def train(model, loader, opt):
        for x, y in loader:
            scores = model(x)
            keep = [float(s) for s in scores]
            for i in range(scores.shape[0]):
                if scores[i] > 0.5:
                    pass
            loss = scores.mean()
            loss.backward()
            opt.step()
    """
    assert {("GB002", 5), ("GB007", 7)} <= set(default(body))


def test_while_on_a_device_scalar_and_sampling_loop():
    body = """
    def solve(x: torch.Tensor, tol: float):
        delta = x.norm()
        while delta > tol:
            x = x * 0.5
            delta = x.norm()
        return x

    def sample(model, idx, steps):
        for _ in range(steps):
            logits = model(idx)
            probs = F.softmax(logits[:, -1], dim=-1)
            keep = torch.nonzero(probs > 0.1)
            idx = torch.cat([idx, torch.multinomial(probs, 1)], dim=1)
        return idx
    """
    assert {("GB007", 4), ("GB008", 13)} <= set(default(body))


def test_forward_optimizer_step_and_eval_loop_are_per_step():
    body = """
    class Head(nn.Module):
        def forward(self, x):
            n = int(x.sum())
            return x[:n]

    class MyOpt(torch.optim.Optimizer):
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad.norm() > 1.0:
                        p.grad.mul_(0.5)

    def evaluate(clf, loader):
        correct = 0
        for x, y in loader:
            pred = clf(x).argmax(1)
            for i in range(len(y)):
                correct += int(pred[i] == y[i])
        return correct
    """
    found = set(default(body))
    assert {("GB002", 4), ("GB007", 11), ("GB002", 19)} <= found


def test_event_and_stream_synchronize_in_a_loop():
    body = """
    def run(model, xs):
        s = torch.cuda.Stream()
        for x in xs:
            done = torch.cuda.Event()
            y = model(x)
            done.record()
            done.synchronize()
            s.synchronize()
    """
    assert {("GB004", 8), ("GB004", 9)} <= set(default(body))


# -- 2. across calls and files, with the chain
def test_helpers_across_files_a_few_calls_deep_with_the_chain(tmp_path):
    root = project(tmp_path, {
        "train.py": """
            from utils import log_norms
            def train(model, loader, opt, device):
                for x, y in loader:
                    loss = F.cross_entropy(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))
                    loss.backward()
                    log_norms(model)
                    opt.step()
            """,
        "utils.py": """
            from sched import lookup
            def log_norms(model):
                total = 0.0
                for p in model.parameters():
                    total += p.grad.norm().item()
                return lookup(total)
            """,
        "sched.py": """
            TABLE = np.linspace(0, 1, 100)
            def lookup(step):
                return torch.from_numpy(TABLE).to("cuda")[0]
            """})
    found = {(Path(f.path).name, f.line - HEAD.count("\n"), f.rule): str(f) for f in lint_paths([root])}
    assert set(found) == {("utils.py", 6, "GB002"), ("sched.py", 4, "GB001")}
    n = HEAD.count("\n")
    assert f"(train.py:{7 + n} -> here)" in found[("utils.py", 6, "GB002")]
    assert f"(train.py:{7 + n} -> utils.py:{7 + n} -> here)" in found[("sched.py", 4, "GB001")]
    assert all(line.count("\n") == 0 for line in found.values())   # one line per finding


def test_the_project_is_indexed_once_per_run(tmp_path):
    root = project(tmp_path, {f"m{i}.py": "def f(x):\n    return x.to('cuda')\n" for i in range(5)})
    before = Project.builds
    lint_paths([root])
    assert Project.builds == before + 1
    assert main([str(root)]) == 0 and Project.builds == before + 2


# -- 3. host data moved per call
def test_host_data_moved_per_call():
    body = """
    def train(model, loader, opt, table, lr, device):
        cpu_log = torch.zeros(100)
        for step, (x, y) in enumerate(loader):
            w = torch.from_numpy(table).to(device)
            t = torch.tensor([lr, 0.5]).to(device)
            s = torch.tensor(table, device=device)
            a = torch.as_tensor(np.ones(3), device=device)
            loss = model(x, w, t, s, a).mean()
            cpu_log[step] = loss
            loss.backward()
            opt.step()
    """
    assert {("GB001", 5), ("GB001", 6), ("GB010", 7), ("GB010", 8), ("GB002", 10)} <= set(default(body))


# -- 4. barriers per step
def test_barrier_and_wait_for_everyone_per_step():
    body = """
    import torch.distributed as dist
    def train(model, loader, opt, accelerator):
        for x in loader:
            accelerator.backward(model(x).mean())
            opt.step()
            accelerator.wait_for_everyone()
            dist.barrier()
        dist.barrier()
    """
    assert default(body) == [("GB012", 7), ("GB012", 8)]   # the barrier after the loop is fine


# -- 5. a device tensor indexed by host indices
def test_host_indices_into_device_tensors():
    body = """
    def ppo(agent, b_obs, b_logp, opt, n, mb):
        b_inds = np.arange(n)
        for epoch in range(4):
            np.random.shuffle(b_inds)
            for start in range(0, n, mb):
                mb_inds = b_inds[start:start + mb]
                _, newlogp = agent(b_obs[mb_inds])
                cpu_idx = torch.arange(mb)
                ratio = (newlogp - b_logp[cpu_idx]).exp()
                loss = -ratio.mean()
                loss.backward()
                opt.step()
    """
    obs = "    b_obs = b_obs.to('cuda')\n    b_logp = b_logp.to('cuda')\n"
    body = body.replace("        b_inds = np.arange(n)\n", obs.replace("    ", "        ") + "        b_inds = np.arange(n)\n")
    assert {("GB011", 10), ("GB011", 12)} <= set(default(body))


# -- 6. tensors the analysis lost, and loops it did not recognise
def test_builtin_sum_assert_and_gpu_simulator():
    body = """
    def train(model, loader, opt):
        for x, y in loader:
            losses = [F.mse_loss(model(x), y), F.l1_loss(model(x), y)]
            total = sum(losses)
            print(total.item())
            assert torch.isfinite(total)
            total.backward()
            opt.step()

    def rollout(policy, envs, obs):
        for step in range(100):
            actions = policy(obs)
            obs, rew, done, info = envs.step(actions)
            if done.any():
                pass
    """
    assert {("GB002", 6), ("GB007", 7), ("GB007", 15)} <= set(default(body))


# -- 7. syncs inside torch
def test_distributions_with_validation_and_normal_with_a_tensor_std():
    body = """
    from torch.distributions import Categorical, Normal
    def act(policy, envs, obs, std):
        for step in range(100):
            logits = policy(obs)
            d = Categorical(logits=logits)
            quiet = Normal(logits, 1.0, validate_args=False)
            noise = torch.normal(0.0, std * logits.abs())
            obs = obs + noise
    """
    got = lint_source(HEAD + textwrap.dedent(body), "train.py")
    rules = {(f.rule, f.line - HEAD.count("\n")) for f in got}
    assert {("GB013", 6), ("GB013", 8)} <= rules and ("GB013", 7) not in rules
    assert "validate_args=False" in next(f.fix for f in got if f.line - HEAD.count("\n") == 6)


# -- 8. pinned memory lost by an op
def test_pinned_tensor_converted_then_copied_non_blocking():
    body = """
    def feed(model, n):
        buf = torch.empty(1024, pin_memory=True)
        for i in range(n):
            x = buf.to(torch.float16).to("cuda", non_blocking=True)
            y = buf.to("cuda", non_blocking=True)
            model(x + y)
    """
    assert ("GB005", 5) in default(body) and ("GB005", 6) not in default(body)


# -- CPU environments: one finding per loop
def test_cpu_environment_round_trip_is_one_finding_per_loop():
    body = """
    import gymnasium as gym
    def collect(agent, device, steps):
        envs = gym.make("CartPole-v1")
        obs = torch.tensor(envs.reset()[0]).to(device)
        for step in range(steps):
            action = agent(obs)
            obs, rew, term, trunc, info = envs.step(action.cpu().numpy())
            obs = torch.tensor(obs).to(device)
            rew = torch.tensor(rew).to(device)
    """
    got = lint_source(HEAD + textwrap.dedent(body), "train.py")
    assert [(f.rule, f.line - HEAD.count("\n")) for f in got] == [("GB014", 8)]
    assert got[0].covers == [8 + HEAD.count("\n"), 9 + HEAD.count("\n"), 10 + HEAD.count("\n")]
    assert "GPU" in got[0].fix and "gym.vector" in got[0].fix


def test_500_files_in_well_under_30_seconds(tmp_path):
    """Speed: a 500-file tree of training-shaped files (the corpus, copied) checked in one run."""
    corpus = sorted((Path(__file__).parent / "data" / "lint").glob("*.py"))
    for i in range(500):
        src = corpus[i % len(corpus)]
        (tmp_path / f"{src.stem}_{i}.py").write_text(src.read_text())
    before = Project.builds
    t0 = time.process_time()
    found = lint_paths([tmp_path])
    spent = time.process_time() - t0
    assert found and Project.builds == before + 1
    assert spent < 30, f"{spent:.1f} s of CPU for 500 files"


# -- second round: shapes of the dev2 repositories (tests/data/lint_judged, set dev2)
def test_a_base_class_loop_steps_through_its_subclasses_hooks(tmp_path):
    """rl_games: the minibatch loop of a base class calls self.train_actor_critic(), which only a
    subclass in another file defines, and which reaches backward() two calls down."""
    root = project(tmp_path, {
        "base.py": """
            class Base:
                def train_actor_critic(self, batch):
                    pass

                def train_epoch(self, dataset):
                    for i in range(len(dataset)):
                        kl = self.train_actor_critic(dataset[i])
                        print(kl.item())
            """,
        "agent.py": """
            from base import Base
            class Agent(Base):
                def train_actor_critic(self, batch):
                    return self.calc_gradients(batch)

                def calc_gradients(self, batch):
                    loss = self.model(batch).mean()
                    loss.backward()
                    self.optimizer.step()
                    return loss.detach()
            """})
    found = {(Path(f.path).name, f.line - HEAD.count("\n"), f.rule) for f in lint_paths([root])}
    assert ("base.py", 9, "GB002") in found


def test_a_rollout_loop_known_by_the_defs_it_calls():
    """play_steps: no model named in the loop; the project def it calls runs one, and env_step's
    result unpacks like an environment's step."""
    body = """
    class Runner:
        def get_action_values(self, obs):
            return self.model({"obs": obs})

        def play_steps(self, n):
            for i in range(n):
                res = self.get_action_values(self.obs)
                self.obs, rewards, self.dones, infos = self.env_step(res["actions"])
                done_ids = self.dones.nonzero(as_tuple=False)
    """
    assert ("GB008", 10) in default(body)


def test_an_env_loop_stays_a_step_loop_around_its_update_loop():
    """SAC: one env step, then several gradient updates in an inner loop: both loops run per step."""
    body = """
    def run(actor, critic, envs, opt, obs, n, k):
        for step in range(n):
            action = actor(obs)
            obs, rew, done, info = envs.step(action)
            print(rew.mean().item())
            for _ in range(k):
                critic(obs).mean().backward()
                opt.step()
    """
    assert ("GB002", 6) in default(body)


def test_an_observer_hierarchy_and_a_constructor_are_followed():
    """`self.observer.process_infos(...)`: the method of every class of one hierarchy; a class built
    in the step runs its __init__ every step."""
    body = """
    class Observer:
        def process_infos(self, infos, ids):
            pass

    class Default(Observer):
        def process_infos(self, infos, ids):
            ids = ids.cpu().numpy()

    class Masked:
        def __init__(self, logits, device):
            self.fill = torch.tensor(-1e8).to(device)

    def rollout(policy, envs, observer, obs):
        for step in range(100):
            obs, rew, done, info = envs.step(policy(obs))
            observer.process_infos(info, done.nonzero())
            m = Masked(obs, obs.device)
    """
    assert {("GB002", 8), ("GB001", 12)} <= set(default(body))


def test_nested_module_classes_and_validated_distribution_subclasses():
    """rl_games' models: `class ModelA2C: class Network(BaseNet)`: a forward nested in a class is a
    hook too; a project subclass of a torch distribution validates its arguments; so does log_prob
    of a name or attribute bound to one; `if is_train: ... return result` is a main path."""
    body = """
    class Masked(torch.distributions.Categorical):
        def __init__(self, logits=None, validate_args=None):
            super().__init__(logits=logits, validate_args=validate_args)

    class ModelA2C:
        class Network(nn.Module):
            def forward(self, input_dict):
                is_train = input_dict.get("is_train", True)
                logits = self.a2c_network(input_dict["obs"])
                if is_train:
                    d = Masked(logits=logits)
                    result = {"neglogp": -d.log_prob(input_dict["actions"])}
                    return result
                self.dist = torch.distributions.Normal(logits, logits.exp())
                return {"logp": self.dist.log_prob(logits)}
    """
    assert {("GB013", 12), ("GB013", 13), ("GB013", 16)} <= set(default(body))


def test_reads_with_to_cpu_and_a_trajectory_carried_on_the_host():
    """ddim: each step's sample goes to the host (`.to('cpu')`) and the next step copies it back."""
    body = """
    def sample(model, x, seq):
        xs = [x]
        cpu = torch.device("cpu")
        for i in seq:
            xt = xs[-1].to("cuda")
            et = model(xt, i)
            xs.append(et.to("cpu"))
            keep = et.to(cpu)
        return xs
    """
    assert {("GB010", 6), ("GB002", 8), ("GB002", 9)} <= set(default(body))


def test_items_of_a_returned_tuple_and_kinds_after_an_if():
    """A helper returning `(obs, rewards.cpu(), dones.cpu())` gives host items (no finding on them);
    after `if not gpu: a = a.cpu().numpy()` an unknown `a` stays unknown, so `.cpu()` of it counts."""
    body = """
    class Player:
        def env_step(self, env, actions):
            if not self.is_tensor_obses:
                actions = actions.cpu().numpy()
            obs, rewards, dones, infos = env.step(actions)
            return obs, rewards.cpu(), dones.cpu(), infos

        def run(self, n):
            for i in range(n):
                action = self.model(self.obs)
                self.obs, r, done, info = self.env_step(self.env, action)
                ids = done.nonzero()
    """
    found = set(default(body))
    assert ("GB002", 7) in found and ("GB008", 13) not in found


def test_legacy_type_copies_host_writes_and_eager_lambdas():
    """YOLO-style code: `.type(torch.cuda.FloatTensor)` of every batch, a host tensor written into a
    device one, and `.item()` inside a lambda that map() calls on the spot."""
    body = """
    Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor

    def evaluate(model, loader, sigmas):
        gain = torch.ones(7, device="cuda")
        t = 0
        for imgs, targets in loader:
            out = model(imgs.type(Tensor))
            gain[2:6] = torch.tensor(out.shape)[[3, 2, 3, 2]]
            a, b = map(lambda t: t.item(), (sigmas[0], sigmas[1]))
    """
    assert {("GB009", 8), ("GB010", 9), ("GB002", 10)} <= set(default(body))


def test_batches_rebuilt_as_dicts_and_lists_of_result_dicts():
    """LoRA-style `data = {k: v for k, v in data.items()}` keeps a host batch; a list of dicts of
    device tensors keeps device tensors (DETR's results read back for pycocotools)."""
    body = """
    def run(model, loader, device):
        for data in loader:
            data = {k: v for k, v in data.items()}
            x = data["input"].to(device)
            out = model(x)
            results = [{"scores": s, "labels": l} for s, l in zip(out, out)]
            for r in results:
                scores = r["scores"].tolist()
    """
    assert {("GB009", 5), ("GB002", 9)} <= set(default(body))
