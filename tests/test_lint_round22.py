"""gobrrr lint, issue 29's twenty-third round (round 22 of the rules): heldout20's misses, each from a minimal
example written for the shape, beside the neighbouring shape that must stay quiet."""
from __future__ import annotations

import textwrap

from gobrrr.lint.check import lint_paths
from tests.test_lint_round4 import default

# -- a loop over the bar of `with tqdm.tqdm(loader) as bar:`
BAR = """
import tqdm

class Trainer:
    def train(self):
        with tqdm.tqdm(self.train_dataloader) as bar:
            for step, batch in enumerate(bar, start=1):
                out = self.model(input_ids=batch["input_ids"].cuda())
                out.mean().backward()
                self.optimizer.step()
"""


def test_the_bar_of_a_with_statement_gives_the_loader_s_batches():
    """LOMO's trainers: `with tqdm.tqdm(self.train_dataloader) as tqb: for step, batch in enumerate(tqb)`, each
    batch copied with a blocking .cuda()."""
    assert ("GB009", 8) in default(BAR)


def test_a_with_statement_of_something_else_binds_no_batches():
    assert ("GB009", 8) not in default(BAR.replace("tqdm.tqdm(self.train_dataloader)", "open(self.log_path)"))


# -- a trainer in a file that names no device, in a project that uses the GPU
TRAINER = """
import torch


class Trainer:
    def __init__(self, model, optimizer, get_batch):
        self.model, self.optimizer, self.get_batch = model, optimizer, get_batch

    def train_step(self):
        x, mask = self.get_batch(64)
        pred = self.model(x)[mask > 0]
        loss = pred.square().mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach().cpu().item()

    def train_iteration(self, n):
        losses = []
        for _ in range(n):
            losses.append(self.train_step())
        return losses
"""
SCRIPT = """
import torch
from trainer import Trainer

device = "cuda"
model = torch.nn.Linear(4, 4).to(device)
"""


def _lint(tmp_path, files: dict) -> list[tuple[str, str, int]]:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return sorted((f.path.rsplit("/", 1)[-1], f.rule, f.line) for f in lint_paths([str(tmp_path)]))


def test_a_training_loop_in_a_file_without_a_device_runs_on_the_gpu_of_its_project(tmp_path):
    """decision-transformer's SequenceTrainer: the script moves the model and makes the batches on the device;
    the trainer's file never names one, and its step reads the loss with .item() every step."""
    found = _lint(tmp_path, {"trainer.py": TRAINER, "experiment.py": SCRIPT})
    assert ("trainer.py", "GB002", 16) in found, found


def test_the_same_trainer_in_a_project_that_never_names_a_device_stays_quiet(tmp_path):
    """minimalRL's shape: nothing anywhere names a device, so everything runs on the CPU."""
    found = _lint(tmp_path, {"trainer.py": TRAINER, "experiment.py": SCRIPT.replace(".to(device)", "")
                             .replace('device = "cuda"', "")})
    assert not [f for f in found if f[0] == "trainer.py"], found
