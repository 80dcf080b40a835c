"""gobrrr lint, issue 29's round on heldout42's misses: per-batch code that no loop of the project calls, because an
event loop or a framework calls it (sample-factory's learner and inference workers, trl's DPO/KTO trainers that
LLaMA-Factory subclasses), and a hook whose parameter is annotated as tensors but is handed a loader's batch. From
minimal examples, beside the neighbours that must stay quiet."""
from __future__ import annotations

from lintcase import line_of, rules

WORKER = """
import torch


class InferenceWorker:
    def __init__(self, loop, model):
        self.model = model.cuda()
        self.loop = loop
        self.loop.iteration.connect(self._run)
        self.loop.timeout.connect(self._report)

    def _run(self):
        obs, rnn_states = self.requests()
        rnn_states = torch.as_tensor(rnn_states).to("cuda")
        out = self.model(obs.cuda(), rnn_states)
        self.publish(out.cpu())

    def _report(self):
        print(self.stats.cpu())


class LearnerWorker:
    def on_new_training_batch(self, batch_idx):
        batch = self.batches[batch_idx]
        invalid = (batch["valids"] == 0).nonzero()
        return self.learner.train(batch, invalid)
"""


def test_a_slot_of_a_loops_iteration_signal_runs_per_step():
    """`loop.iteration.connect(self._run)`: `_run` runs every iteration of an event loop the project does not
    write; `loop.timeout.connect(self._report)` is a timer, so `_report` stays quiet."""
    found = rules(WORKER)
    assert (line_of(WORKER, "self.publish(out.cpu())"), "GB002") in found
    assert (line_of(WORKER, "print(self.stats.cpu())"), "GB002") not in found


def test_a_batch_event_handler_runs_per_batch():
    """`on_new_training_batch(self, batch_idx)`: a handler named for a batch event runs once per batch."""
    assert (line_of(WORKER, "invalid = (batch["), "GB008") in rules(WORKER)


DPO = """
import torch
from trl import DPOTrainer


class CustomDPOTrainer(DPOTrainer):
    def get_batch_loss_metrics(self, model, batch, train_eval="train"):
        losses, chosen_rewards, rejected_rewards = self.compute_preference_loss(model, batch)
        metrics = {}
        metrics["rewards/chosen"] = chosen_rewards.mean().item()
        metrics["rewards/margins"] = (chosen_rewards - rejected_rewards).mean().item()
        return losses.mean(), metrics


model = torch.nn.Linear(2, 2).cuda()
"""


def test_trls_per_step_hooks_run_per_step():
    """trl's DPO/KTO/ORPO trainers call `get_batch_loss_metrics` (and `concatenated_forward`) from `compute_loss`
    every step: a subclass's metrics read there sync per step."""
    found = rules(DPO)
    assert (line_of(DPO, 'metrics["rewards/chosen"]'), "GB002") in found
    assert (line_of(DPO, 'metrics["rewards/margins"]'), "GB002") in found


RECIPE = """
import torch


class Recipe:
    def concatenated_forward(self, model, batch: tuple[torch.Tensor, torch.Tensor]):
        input_ids, labels = batch
        input_ids = input_ids.to(self._device)
        labels = labels.to(self._device)
        return model(input_ids), labels

    def train(self, model, loader, opt):
        for batch in loader:
            logits, labels = self.concatenated_forward(model, batch)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            loss.backward()
            opt.step()
"""


def test_a_hook_typed_as_tensors_but_handed_a_loaders_batch_moves_it():
    """`concatenated_forward(self, model, batch: tuple[torch.Tensor, torch.Tensor])`, now a per-step hook, is called
    with the loader's host batch: its `.to(self._device)` copies every step (GB009), as before it was a hook."""
    found = rules(RECIPE)
    assert (line_of(RECIPE, "input_ids = input_ids.to(self._device)"), "GB009") in found
    assert (line_of(RECIPE, "labels = labels.to(self._device)"), "GB009") in found
