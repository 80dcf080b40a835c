"""gobrrr lint on the shapes of issue 29: each numbered shape from a minimal example, in the default
run (only what runs every step), and the false-positive shapes of its item 9 staying quiet."""
from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

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


# -- 9. heuristics that misfired stay quiet
@pytest.mark.parametrize("body", [
    # a name containing `last` does not make a branch rare, but it is no tensor either
    "def f(model, loader, opt, last_ckpt):\n    for x in loader:\n        model(x).mean().backward()\n"
    "        opt.step()\n        if last_ckpt:\n            print('x')\n",
    # .cpu() on a model that never left the CPU
    "def f(model, xs):\n    for x in xs:\n        model.cpu()\n        model(x)\n",
    # .to(t.device) where t is a host tensor
    "def f(model, xs):\n    h = torch.zeros(3)\n    for x in xs:\n        y = torch.ones(3).to(h.device)\n        model(x + y)\n",
    # images saved with .cpu() are deliberate output
    "from torchvision.utils import save_image\ndef f(model, xs):\n    for x in xs:\n"
    "        out = model(x)\n        save_image(out.cpu(), 'a.png')\n",
])
def test_misfiring_heuristics_stay_quiet(body):
    assert default(body) == []


def test_last_in_a_name_no_longer_makes_a_branch_rare():
    body = """
    def train(model, loader, opt):
        for x in loader:
            loss = model(x).mean()
            loss.backward()
            opt.step()
            if last_loss_was_bad(loss):
                print(loss.item())
    """
    assert ("GB002", 8) in default(body)


def test_a_file_is_not_on_the_gpu_because_it_calls_cpu_or_plots():
    body = "import matplotlib.pyplot as plt\ndef f(model, xs):\n    for x in xs:\n" \
           "        y = model(x).cpu()\n        plt.xlabel('step')\n        print(y.sum().item())\n"
    assert lint_source(body, "plot.py") == []                           # never names a device
    assert [f.rule for f in lint_source(body, "plot.py", assume_gpu=True)] == ["GB002"]


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


def test_forward_main_path_flags_and_helpers_returning_host_indices():
    body = """
    class Criterion(nn.Module):
        def forward(self, outputs, targets, log=True):
            indices = self.match(outputs, targets)
            if self.training:
                n = outputs.sum().item()
                return n
            if log:
                err = outputs[indices].mean()
            return 0

        def match(self, outputs, targets):
            c = outputs.cpu()
            return [(torch.as_tensor(i), torch.as_tensor(j)) for i, j in zip(c, c)]
    """
    assert {("GB002", 6), ("GB011", 9), ("GB002", 13)} <= set(default(body))


def test_copies_of_dicts_and_mixed_tuples_are_no_tensors():
    body = """
    import copy
    def mapper(dataset_dict, items):
        for d in items:
            d = copy.deepcopy(d)
            d.pop("annotations")

    def partition(x: torch.Tensor):
        return x * 2, (x.shape[0], x.shape[1])

    class Block(nn.Module):
        def forward(self, x):
            y, pad = partition(x)
            hp, wp = pad
            if hp > 3:
                y = y[:3]
            return y
    """
    assert default(body) == []


def test_calling_an_object_without_arguments_and_unpacking_a_guess():
    body = """
    from unittest.mock import MagicMock
    in_phase = MagicMock()

    class Layer(nn.Module):
        def forward(self, x):
            busy = in_phase()
            q, was_packed = repack(x)
            if not busy and was_packed:
                x = x + 1
            scores, labels = x.softmax(-1).max(-1)
            if labels.sum() > 0:
                x = x * 2
            return x
    """
    assert default(body) == [("GB007", 12)]


def test_unknown_results_as_conditions_and_early_exits():
    body = """
    def save_and_exit(model, signals):
        if any(signals):
            torch.distributed.barrier()
            return True, False
        return False, False

    def train(model, loader, opt, run_schedule, tok):
        for x in loader:
            losses = run_schedule(model, x)
            if losses:
                opt.step()
            text = tok.batch_decode(model(x).argmax(-1))
            print("{}".format(text))
            done, _ = save_and_exit(model, [])
    """
    assert default(body) == []
