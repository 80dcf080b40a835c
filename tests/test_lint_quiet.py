"""gobrrr lint on issue 29's item 9 and the false positives met on real code: shapes that must stay
quiet in the default run (a finding a user must dismiss costs more than a missed one)."""
from __future__ import annotations

import textwrap

import pytest

from gobrrr.lint.check import lint_source

HEAD = "import torch\nimport numpy as np\nimport torch.nn as nn\nimport torch.nn.functional as F\nDEVICE = 'cuda'\n"


def default(body: str, **kw) -> list[tuple[str, int]]:
    """(rule, line) of the default run on a snippet; line 1 is the snippet's first line."""
    out = lint_source(HEAD + textwrap.dedent(body), "train.py", **kw)
    return sorted((f.rule, f.line - HEAD.count("\n")) for f in out)


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


# -- second round: false positives met on real code (Megatron-LM, detectron2, the dev2 repositories)
@pytest.mark.parametrize("body", [
    # a value computed once per key and cached (`if k not in cache: cache[k] = ...`)
    "def has_group(self, opt, loader, key):\n    for x in loader:\n        opt.zero_grad()\n"
    "        self.model(x).mean().backward()\n        opt.step()\n        if key not in self.cache:\n"
    "            flag = torch.tensor([1], device='cuda')\n            self.cache[key] = bool(flag.item())\n",
    # a predicate answers with a Python bool, whatever it is handed
    "def step(self, params, loader, opt):\n    for x in loader:\n        self.model(x).mean().backward()\n"
    "        for p in params:\n            if self._is_fp8_param(p.grad):\n                p.grad.mul_(2)\n        opt.step()\n",
    # `assert not x` / `if not x` on an optional parameter tests for None
    "class Attn(nn.Module):\n    def forward(self, x, rope_cos_sin: torch.Tensor | None = None):\n"
    "        assert not rope_cos_sin, 'not supported'\n        return x\n",
    # as_tensor of a tensor already on the device copies nothing
    "def make(model, loader):\n    for kp in loader:\n        model(kp)\n"
    "        t = torch.as_tensor(kp, dtype=torch.float32, device=kp.device)\n",
    # the CPU branch of a CUDA test never runs on the GPU
    "def get_batch(model, loader, device, device_type):\n    for x in loader:\n        if device_type == 'cuda':\n"
    "            x = x.pin_memory().to(device, non_blocking=True)\n        else:\n            x = x.to(device)\n"
    "        model(x)\n",
    # an environment's info is a dict, even when the env runs on the GPU
    "def rollout(policy, envs, obs):\n    for step in range(100):\n        obs, rew, done, info = envs.step(policy(obs))\n"
    "        if not info:\n            continue\n",
])
def test_real_code_false_positives_stay_quiet(body):
    assert default(body) == []


def test_a_loop_around_whole_training_runs_is_not_a_step_loop():
    """A benchmark sweeping batch sizes calls a def that trains (a loop of its own): the sweep is an
    outer loop, even over a list named `batches`."""
    body = """
    def train(model, loader, opt):
        for x in loader:
            loss = model(x).mean()
            loss.backward()
            opt.step()
        return torch.tensor([loss.item()], device="cuda")

    def sweep(model, loader, opt, batches):
        for b in batches:
            res = train(model, loader, opt)
            print(res.item())
    """
    assert ("GB002", 12) not in default(body)
