"""gobrrr lint, issue 29's round 62 on heldout76-77's first sights (3detr, RectifiedFlow) and a verdict on
pytorch-maml-rl: each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, rules


def test_a_dict_key_set_to_a_python_number_is_a_number_in_the_callees():
    """3detr's criterion: `targets["num_boxes_replica"] = nactual_gt.sum().item()` in forward, then each loss it
    calls tests `if targets["num_boxes_replica"] > 0:`. The key of a batch dict was taken for a device tensor, and
    five such tests were reported as syncs (false findings at first sight). A key set to a Python number holds one,
    here and in the defs the dict is handed to; the `.item()` itself is reported, and a key left a tensor still
    syncs where it is tested."""
    src = textwrap.dedent("""
        import torch
        from torch import nn

        class Criterion(nn.Module):
            def loss_angle(self, outputs, targets):
                if targets["num_boxes_replica"] > 0:
                    return outputs["angle"].sum() / targets["num_boxes"]
                return outputs["angle"].sum() * 0

            def loss_center(self, outputs, targets):
                if targets["nactual_gt"].sum() > 0:
                    return outputs["center"].sum()
                return outputs["center"].sum() * 0

            def forward(self, outputs, targets):
                nactual_gt = targets["gt_box_present"].sum(axis=1).long()
                targets["nactual_gt"] = nactual_gt
                targets["num_boxes"] = torch.clamp(nactual_gt.sum(), min=1).item()
                targets["num_boxes_replica"] = nactual_gt.sum().item()
                return self.loss_angle(outputs, targets) + self.loss_center(outputs, targets)

        def train(model, criterion, loader, opt, device):
            model.to(device)
            for batch in loader:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                loss = criterion(model(batch), batch)
                loss.backward()
                opt.step()
        """)
    found = rules(src, "criterion.py")
    assert (line_of(src, 'targets["num_boxes_replica"] = nactual_gt'), "GB002") in found, found
    assert (line_of(src, 'if targets["nactual_gt"].sum() > 0'), "GB007") in found, found
    assert not any(line == line_of(src, 'if targets["num_boxes_replica"] > 0') for line, _ in found), found



def test_a_method_of_an_object_of_unknown_class_returns_what_the_one_def_of_that_name_returns():
    """RectifiedFlow's loss: `z0 = sde.get_z0(batch).to(batch.device)`, `sde` a parameter, and the project's one
    `get_z0` returns `torch.randn(shape)`, drawn on the host: a batch-sized upload every step. With the receiver's
    class unknown the call's result had no kind. A method name only one project class defines (and not a common one)
    says what the call returns. A common name (`sample`) pins nothing."""
    src = textwrap.dedent("""
        import torch

        class RectifiedFlow:
            def __init__(self, noise_scale=1.0):
                self.noise_scale = noise_scale

            def get_z0(self, batch, train=True):
                n, c, h, w = batch.shape
                return torch.randn((n, c, h, w)) * self.noise_scale

            def sample(self, batch):
                return torch.randn(batch.shape)

        class Other:
            def sample(self, batch):
                return torch.randn_like(batch)

        def loss_fn(model, sde, batch):
            z0 = sde.get_z0(batch).to(batch.device)
            noise = sde.sample(batch).to(batch.device)
            t = torch.rand(batch.shape[0], device=batch.device)[:, None, None, None]
            return (model(t * batch + (1 - t) * z0 + noise) - (batch - z0)).pow(2).mean()

        def train(model, loader, opt, sde):
            model.cuda()
            for batch in loader:
                batch = batch.cuda(non_blocking=True)
                loss = loss_fn(model, sde, batch)
                loss.backward()
                opt.step()
        """)
    found = rules(src, "losses.py")
    assert (line_of(src, "z0 = sde.get_z0(batch)"), "GB010") in found, found
    assert not any(line == line_of(src, "noise = sde.sample(batch)") for line, _ in found), found


def test_an_independent_wrapper_checks_no_arguments_of_its_own():
    """pytorch-maml-rl's detach_distribution: `Independent(detach_distribution(pi.base_dist), n)` was reported as a
    distribution built with validation on. Independent has no parameters to check; the Normal built inside the
    helper does, and is reported where it is built."""
    src = textwrap.dedent("""
        import torch
        from torch.distributions import Independent, Normal

        def detach_distribution(pi):
            if isinstance(pi, Independent):
                return Independent(detach_distribution(pi.base_dist), pi.reinterpreted_batch_ndims)
            return Normal(loc=pi.loc.detach(), scale=pi.scale.detach())

        def train(policy, loader, opt, device):
            policy.to(device)
            for obs in loader:
                pi = policy(obs.to(device, non_blocking=True))
                old = detach_distribution(pi)
                loss = torch.distributions.kl_divergence(pi, old).mean()
                loss.backward()
                opt.step()
        """)
    found = rules(src, "torch_utils.py")
    assert (line_of(src, "return Normal(loc=pi.loc.detach()"), "GB013") in found, found
    assert not any(line == line_of(src, "return Independent(detach_distribution(") for line, _ in found), found


def test_a_step_hook_written_outside_a_class_and_bound_onto_the_trainer_is_per_step():
    """gritlm's run.py defines `def training_step(self, model, inputs)` inside main() and binds it onto the trainer
    (`trainer.training_step = types.MethodType(training_step, trainer)`). Only methods of a class were taken for
    per-step hooks, so its `getattr(self.state, "loss_emb", torch.tensor(0.0).to(loss.device))` (a host scalar
    built and copied every micro-batch) went unreported. A def named for a step hook whose first parameter is
    `self` is that hook wherever it is written; a plain function of that name without `self` is not."""
    src = textwrap.dedent("""
        import types
        import torch

        def main(trainer):
            def training_step(self, model, inputs):
                out = self.compute_loss(model, inputs, return_outputs=True)
                loss = out[0]
                self.accelerator.backward(loss)
                self.state.loss_emb = getattr(self.state, "loss_emb", torch.tensor(0.0).to(loss.device))
                return loss.detach()

            def compute_metrics(preds):
                return {"n": torch.tensor(0.0).to("cuda")}

            trainer.training_step = types.MethodType(training_step, trainer)
            trainer.train()
        """)
    found = rules(src, "run.py")
    assert (line_of(src, "self.state.loss_emb = getattr("), "GB001") in found, found
    assert not any(line == line_of(src, 'return {"n": torch.tensor(0.0)') for line, _ in found), found
