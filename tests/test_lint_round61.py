"""gobrrr lint, issue 29's round 61 on heldout74-75's first sights (pytorch-maml-rl, LongLoRA, Detic): each firing
test beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, rules


def test_a_method_that_updates_through_autograd_grad_makes_its_callers_loop_a_step_loop():
    """pytorch-maml-rl: `metalearner.step(*futures, ...)` per meta-batch, where MAMLTRPO.step takes
    `torch.autograd.grad(old_loss, params)` and writes the parameters back (TRPO's natural gradient): no backward,
    no optimizer. The loop was taken for no step loop, so the conjugate gradient's `rdotr.item()` per iteration
    went unreported. A gradient taken with autograd.grad is an update, as a backward is."""
    src = textwrap.dedent("""
        import torch
        from torch.nn.utils import parameters_to_vector, vector_to_parameters

        def conjugate_gradient(f_Ax, b, cg_iters=10, residual_tol=1e-10):
            p = b.clone().detach()
            r = b.clone().detach()
            x = torch.zeros_like(b).float()
            rdotr = torch.dot(r, r)
            for i in range(cg_iters):
                z = f_Ax(p).detach()
                v = rdotr / torch.dot(p, z)
                x += v * p
                r -= v * z
                newrdotr = torch.dot(r, r)
                p = r + newrdotr / rdotr * p
                rdotr = newrdotr
                if rdotr.item() < residual_tol:
                    break
            return x.detach()

        class MAMLTRPO:
            def __init__(self, policy, device):
                self.policy = policy.to(device)

            def step(self, episodes, valid, max_kl=1e-3):
                loss = self.policy(episodes).mean()
                grads = parameters_to_vector(torch.autograd.grad(loss, self.policy.parameters()))
                stepdir = conjugate_gradient(lambda v: v, grads)
                vector_to_parameters(parameters_to_vector(self.policy.parameters()) - max_kl * stepdir,
                                     self.policy.parameters())

        def main(policy, sampler, device):
            metalearner = MAMLTRPO(policy, device)
            for batch in range(100):
                tasks = sampler.sample_tasks(num_tasks=20)
                futures = sampler.sample_async(tasks, device=device)
                metalearner.step(*futures)
        """)
    found = rules(src, "maml_trpo.py")
    assert (line_of(src, "if rdotr.item() < residual_tol"), "GB002") in found, found


def test_a_generator_named_for_batches_is_a_batch_source():
    """LongLoRA's eval.py: `for idx, (x, y) in tqdm(enumerate(get_as_batch(data, seq_length, batch_size,
    device=device)))`, each batch cut into chunks that an inner loop runs through the model. The inner loop made
    the batch loop an outer loop, and the per-batch `val_loss.item()` went unreported. A call named for batches
    yields batches: its loop is a step loop whatever loops it holds. A loop over `range(n_chunks)` is no source:
    what it reads once per chunk group stays an outer loop's."""
    src = textwrap.dedent("""
        import torch

        def evaluate(model, data, seq_length, batch_size, device):
            model.to(device)
            losses = []
            with torch.no_grad():
                for idx, (x, y) in enumerate(get_as_batch(data, seq_length, batch_size, device=device)):
                    val_loss = 0.
                    for i in range(0, x.shape[1], seq_length):
                        out = model(input_ids=x[:, i:i + seq_length], labels=x[:, i:i + seq_length])
                        val_loss = out.loss + val_loss
                    losses.append(val_loss.item())
            return losses

        def chunks(model, x, n, device):
            model.to(device)
            total = []
            for c in range(n):
                part = 0.
                for i in range(4):
                    part = model(x[c, i]).sum() + part
                total.append(part.item())
            return total
        """)
    found = rules(src, "eval.py")
    assert (line_of(src, "losses.append(val_loss.item())"), "GB002") in found, found
    assert not any(line == line_of(src, "total.append(part.item())") for line, _ in found), found


def test_a_forward_over_a_library_base_is_a_module_forward():
    """Detic's ROI heads subclass detectron2's `CascadeROIHeads` (not in the checkout): `forward(self, images,
    features, proposals, targets=None)` was no module's forward, so nothing it calls per step was checked (Detic
    24% at first sight). A class that defines forward(self, x, ...) over a base the project does not hold is a
    torch module. A plain helper class of the project, and an autograd Function (its forward runs only where
    `.apply` is called), are not."""
    src = textwrap.dedent("""
        import torch
        from detectron2.modeling.roi_heads import CascadeROIHeads

        class DeticCascadeROIHeads(CascadeROIHeads):
            def forward(self, images, features, proposals, targets=None):
                losses = self._forward_box(features, proposals, targets)
                return {k: v.item() for k, v in losses.items()}

        class Offload(torch.autograd.Function):
            @staticmethod
            def forward(ctx, fn, hidden):
                saved = hidden.to("cpu", non_blocking=True)
                return fn(hidden)
        """)
    found = rules(src, "detic_roi_heads.py")
    assert (line_of(src, "return {k: v.item()"), "GB002") in found, found
    assert not any(line == line_of(src, 'saved = hidden.to("cpu"') for line, _ in found), found
