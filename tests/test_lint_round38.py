"""gobrrr lint, issue 29's round on heldout37's misses (and one of heldout26): an eval loop over a logger's
wrapper of the loader (D-FINE: `metric_logger.log_every(data_loader, 10, header)`), a logging branch guarded by
its interval being on (skrl: `if self.write_interval > 0:`), and a detect loop over a dataset that copies each
image to the device itself before the model (yolov9: `torch.from_numpy(im).to(model.device)`). Each shape from a
minimal project beside a training script (a step loop elsewhere makes only step loops hot), with the neighbour
that must stay quiet."""
from __future__ import annotations

from lintcase import line_of, project_rules

TRAIN = """
import torch
import torch.nn as nn


def profile(model, x):
    for _ in range(3):
        y = model(x)
        y.sum().backward()


class Model(nn.Module):
    def info(self):
        profile(self, torch.zeros(1, 3, device="cuda"))


def train(model, opt, loader):
    for x, y in loader:
        loss = model(x.cuda(non_blocking=True)).sum()
        loss.backward()
        opt.step()
"""
# `LOGGER.info(...)` in the loops below matches the project's `def info`, which holds a step loop (the benchmark
# in `profile`), so by names alone each loop would be an outer loop around a step loop, as in yolov9's detect.py.

EVAL = """
import torch


@torch.no_grad()
def evaluate(model, data_loader, metric_logger, device):
    for samples, targets in metric_logger.log_every(data_loader, 10, "Test:"):
        targets = [{k: v.to(device, non_blocking=True) for k, v in t.items()} for t in targets]
        outputs = model(samples)
        LOGGER.info("batch done")
        for target, output in zip(targets, outputs):
            res = {target["image_id"].item(): output}
"""


def test_a_loop_over_a_loggers_wrapper_of_the_loader_is_a_step_loop(tmp_path):
    found = project_rules(tmp_path, {"train.py": TRAIN, "engine.py": EVAL})
    assert ("engine.py", line_of(EVAL, ".item()"), "GB002") in found


def test_a_call_that_does_not_take_the_loader_first_is_no_wrapper_of_it(tmp_path):
    src = EVAL.replace('metric_logger.log_every(data_loader, 10, "Test:")', "registry.pairs(10, data_loader)")
    assert [f for f in project_rules(tmp_path, {"train.py": TRAIN, "engine.py": src}) if f[0] == "engine.py"] == []


AGENT = """
import torch


class Agent:
    def __init__(self, device):
        self.device = torch.device(device)

    def update(self, memory, policy, opt):
        for gradient_step in range(self.gradient_steps):
            obs, act = memory.sample(256)
            loss = (policy(obs) - act).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if self.write_interval > 0:
                self.track_data("Loss / Policy loss", loss.item())
            if self.write_interval > 0 and gradient_step % self.write_interval == 0:
                print("loss", loss.item())
"""


def test_an_interval_compared_with_zero_is_an_option_on_every_step_not_a_rate(tmp_path):
    assert project_rules(tmp_path, {"agent.py": AGENT}) == [("agent.py", line_of(AGENT, "self.track_data("), "GB002")]


def test_an_interval_switched_on_over_a_save_is_still_rare(tmp_path):
    src = AGENT.replace('self.track_data("Loss / Policy loss", loss.item())', 'torch.save(policy.state_dict(), "p.pt")')
    assert project_rules(tmp_path, {"agent.py": src}) == []


DETECT = """
import torch


@torch.no_grad()
def run(model, dataset, names, table):
    for path, im, im0s in dataset:
        im = torch.from_numpy(im).to(model.device)
        pred = model(im)
        LOGGER.info("image done")
        for det in pred:
            for *xyxy, conf, cls in reversed(det):
                c = int(cls)
                print(names[c])
"""


def test_a_loop_that_copies_its_own_image_to_the_device_and_runs_the_model_is_a_step_loop(tmp_path):
    found = project_rules(tmp_path, {"train.py": TRAIN, "detect.py": DETECT})
    assert ("detect.py", line_of(DETECT, "c = int(cls)"), "GB002") in found


def test_a_loop_that_copies_something_else_is_judged_as_before(tmp_path):
    src = DETECT.replace("im = torch.from_numpy(im).to(model.device)", "w = torch.from_numpy(table).to(model.device)")
    found = project_rules(tmp_path, {"train.py": TRAIN, "detect.py": src})
    assert ("detect.py", line_of(src, "c = int(cls)"), "GB002") not in found


MODEL = """
import torch
import torch.nn as nn


def precompute_freqs_cis(dim, end):
    freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    return torch.polar(torch.ones(end, dim // 2), torch.outer(torch.arange(end), freqs))


class Transformer(nn.Module):
    def __init__(self, dim, n):
        super().__init__()
        self.layer = nn.Linear(dim, dim)
        self.freqs_cis = precompute_freqs_cis(dim, n)

    def forward(self, h):
        self.freqs_cis = self.freqs_cis.to(h.device)
        return self.layer(h) * self.freqs_cis[: h.shape[1]].real


def train(model, opt, loader):
    for x in loader:
        loss = model(x.cuda(non_blocking=True)).sum()
        loss.backward()
        opt.step()
"""


def test_a_move_stored_back_into_its_attribute_copies_once_and_is_quiet(tmp_path):
    """LLaMA2-Accessory's eighteen model files: `self.freqs_cis = self.freqs_cis.to(h.device)` in forward()."""
    assert project_rules(tmp_path, {"model.py": MODEL}) == []


def test_a_move_into_a_local_name_copies_every_call(tmp_path):
    src = MODEL.replace("self.freqs_cis = self.freqs_cis.to(h.device)", "freqs_cis = self.freqs_cis.to(h.device)") \
        .replace("* self.freqs_cis[", "* freqs_cis[")
    assert project_rules(tmp_path, {"model.py": src}) == [("model.py", line_of(src, "freqs_cis = self"), "GB010")]


SAMPLE = """
import torch


@torch.no_grad()
def sample(unet, scheduler, shape, device):
    latents = torch.randn(shape, device=device)
    for t in scheduler.timesteps:
        if device.type == "mps":
            noise = torch.randn(shape, device="cpu").to(device)
        else:
            noise = torch.randn(shape, device=device)
        latents = scheduler.step(unet(latents, t), t, latents) + noise
        if torch.backends.mps.is_available() and t > 0:
            print(latents.mean().item())
        if device.type != "mps":
            print(latents.std().item())
    return latents
"""


def test_a_branch_for_another_backend_is_not_the_cuda_path():
    """sd-scripts' samplers: `if device.type == "mps": torch.randn(..., device="cpu").to(device)`."""
    from lintcase import rules
    assert rules(SAMPLE) == [(line_of(SAMPLE, "latents.std().item()"), "GB002")]


EMPTY = """
import torch


def match(outputs, targets, loader, model):
    for x in loader:
        prob = model(x.cuda(non_blocking=True))
        for t in targets:
            if len(t) == 0:
                keep = torch.arange(0, 0).to(prob)
                none = torch.zeros(0, 4).to(prob)
                one = torch.tensor(0).to(prob)
"""


def test_a_factory_of_no_elements_copies_nothing():
    """DiffusionDet's matcher for an image without boxes: `torch.arange(0, 0).to(bz_out_prob)`."""
    from lintcase import rules
    assert rules(EMPTY) == [(line_of(EMPTY, "torch.tensor(0)"), "GB001")]


MASKED = """
import torch
import torch.nn.functional as F


def train(model, opt, loader, save_ckpt):
    for x, y, valid in loader:
        logits = model(x.cuda(non_blocking=True))
        y = y.cuda(non_blocking=True)
        valid = valid.cuda(non_blocking=True) if valid is not None else None
        loss_all = F.cross_entropy(logits, y, reduction="none")
        if valid is not None:
            loss = (loss_all * valid).sum() / max(valid.sum(), 1)
        else:
            loss = loss_all.mean()
        loss.backward()
        opt.step()
        if save_ckpt:
            torch.save(model.state_dict(), "model.pt")
            print("saved at loss", loss.item())
"""


def test_a_bare_name_named_like_an_option_is_judged_by_what_its_branch_does():
    """LlamaGen's `if valid is not None:` (a validity mask, not validation): the branch does the step's loss; a
    branch on `save_ckpt` that saves stays rare."""
    from lintcase import rules
    assert rules(MASKED) == [(line_of(MASKED, "max(valid.sum(), 1)"), "GB002")]


def test_a_name_that_holds_a_rate_decided_per_step_stays_rare():
    """Megatron-LM's `will_log_this_step = interval > 0 and (step + 1) % interval == 0; if will_log_this_step:`."""
    from lintcase import rules
    src = MASKED.replace("        if save_ckpt:\n", "        will_log_this_step = (step + 1) % 10 == 0\n"
                         "        if will_log_this_step:\n").replace("for x, y, valid in loader:",
                                                             "for step, (x, y, valid) in enumerate(loader):")
    src = src.replace('torch.save(model.state_dict(), "model.pt")', 'print("step", step)')
    assert rules(src) == [(line_of(src, "max(valid.sum(), 1)"), "GB002")]
