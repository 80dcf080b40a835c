"""gobrrr lint, issue 29's round 67 on heldout94-97's first sights: a function handed to multi_apply runs per image
(nanodet), a numpy argmin is one integer (DiffPIR), and a sampling loop whose inner loop only runs the model again
is itself a step loop (DiffPIR's RePaint-style resampling)."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_a_method_handed_to_multi_apply_runs_per_image(tmp_path):
    """mmdetection's `multi_apply(self.target_assign_single_img, cls_preds, gt_bboxes)` maps the method over the
    images of the batch: its body is per-step code. The helper may be the project's own (`map(partial(func,
    **kwargs), *args)`) or imported; a def that calls its first parameter counts as one too."""
    found = project_rules(tmp_path, {
        "misc.py": """
            from functools import partial

            def multi_apply(func, *args, **kwargs):
                pfunc = partial(func, **kwargs) if kwargs else func
                return tuple(map(list, zip(*map(pfunc, *args))))

            def apply_each(fn, items):
                return [fn(i) for i in items]
            """,
        "head.py": """
            import torch
            from misc import multi_apply, apply_each

            class Head(torch.nn.Module):
                def loss(self, preds, gt_boxes):
                    labels, = multi_apply(self.assign_one, preds, gt_boxes)
                    kept = apply_each(self.count_one, preds)
                    return preds.sum()

                def assign_one(self, pred, gt):
                    gt = torch.from_numpy(gt).to(pred.device)
                    return (gt.sum(),)

                def count_one(self, pred):
                    return (pred > 0).sum().item()
            """,
        "train.py": """
            import torch
            from head import Head

            def train(model, loader, opt):
                head = Head().cuda()
                for imgs, gts in loader:
                    preds = model(imgs.cuda(non_blocking=True))
                    loss = head.loss(preds, gts)
                    loss.backward()
                    opt.step()
            """})
    assert ("head.py", 12, "GB001") in found, found   # torch.from_numpy(gt).to(...) per image
    assert ("head.py", 16, "GB002") in found, found   # .item() per image


def test_a_numpy_argmin_indexes_a_device_table_as_an_int():
    """`t_i = find_nearest(table, sigma)` returns `(np.abs(array - value)).argmin()`: one numpy integer, which a
    device tensor takes as a plain index (nothing copied). An index array from numpy still reports."""
    src = textwrap.dedent("""
        import numpy as np
        import torch

        def find_nearest(array, value):
            array = np.asarray(array)
            return (np.abs(array - value)).argmin()

        def sample(model, sigmas_np, n):
            rhos = torch.ones(1000, device="cuda")
            x = torch.randn(1, 3, 8, 8, device="cuda")
            picks = np.arange(4)
            for i in range(n):
                t_i = find_nearest(sigmas_np, 0.5)
                j = np.argmax(sigmas_np)
                x = model(x) * rhos[t_i] + rhos[j]
                y = rhos[picks]
            return x
        """)
    found = rules(src, "sample.py")
    assert not {line for line, _ in found} & {line_of(src, "rhos[t_i]")}, found
    assert (line_of(src, "y = rhos[picks]"), "GB011") in found, found


def test_a_loop_around_a_resampling_loop_is_a_sampling_step():
    """DiffPIR's reverse diffusion: `for i in range(len(seq)):` reads the step's sigma back, then `for u in
    range(iter_num_U):` runs the model (RePaint's resampling, once by default). The inner loop only runs the
    model again on the same state, so the outer loop's own lines run once per sampling step too. An epoch loop
    around a loop that takes batches stays an outer loop."""
    src = textwrap.dedent("""
        import torch

        def restore(model, sigmas, seq, iter_num_U):
            x = torch.randn(1, 3, 8, 8, device="cuda")
            for i in range(len(seq)):
                curr_sigma = sigmas[seq[i]].cpu().numpy()
                for u in range(iter_num_U):
                    x = model(x, curr_sigma)
            return x

        def train(model, loader, opt, epochs):
            for epoch in range(epochs):
                total = torch.zeros((), device="cuda")
                for x, y in loader:
                    loss = model(x.cuda(non_blocking=True)).mean()
                    loss.backward()
                    opt.step()
                    total += loss.detach()
                print(total.item())
        """)
    found = {line for line, _ in rules(src, "restore.py")}
    assert line_of(src, "curr_sigma = sigmas") in found, found
    assert line_of(src, "print(total.item())") not in found, found


def test_each_block_copied_up_in_a_layer_by_layer_pass_is_reported():
    """GPTQ's and SparseGPT's quantization keeps the model on the host and moves one decoder block at a time:
    `layer = layers[i].to(dev)` copies that block's weights from pageable memory, blocking, once per layer (as
    `layers[i] = layer.cpu()` reads it back). AWQ binds the block first (`layer = layers[i]; layer =
    layer.cuda()`). A model moved once before the loop, and blocks run where they are, stay quiet."""
    src = textwrap.dedent("""
        import torch

        def quantize(model, inps, dev, nsamples):
            model.to(dev)
            layers = model.model.layers
            outs = torch.zeros_like(inps)
            for i in range(len(layers)):
                layer = layers[i].to(dev)
                for j in range(nsamples):
                    outs[j] = layer(inps[j].unsqueeze(0))[0]
                layers[i] = layer.cpu()
                inps, outs = outs, inps

        def awq(model, inps):
            layers = model.layers
            for i in range(len(layers)):
                layer = layers[i]
                layer = layer.cuda()
                inps = layer(inps)

        def forward(blocks, x):
            for blk in blocks:
                x = blk(x.cuda(non_blocking=True))
            return x
        """)
    found = rules(src, "quant.py")
    assert (line_of(src, "layer = layers[i].to(dev)"), "GB010") in found, found
    assert (line_of(src, "layer = layer.cuda()"), "GB010") in found, found
    assert line_of(src, "model.to(dev)") not in {line for line, _ in found}, found


def test_a_decode_loop_inside_a_batch_loop_starts_each_token_from_what_the_last_one_left():
    """LoRA's beam search: `history = None` before the token loop, `history = token_id` at its end, and a helper
    called each token reads `history.tolist()` under `if history is not None`. Once the batch loop around it became
    a step loop too (an inner loop that only runs the model), the token loop had to learn from one silent pass what
    an iteration leaves behind, as an outermost step loop does; the batch moved by the outer loop stays a batch."""
    src = textwrap.dedent("""
        import torch

        def penalize(scores, history):
            if history is not None:
                for tok in set(history[0].tolist()):
                    scores[0, tok] -= 1.0
            return scores

        def beam(model, data_iter, eval_len):
            for data in data_iter:
                query = data['query'].to('cuda')
                history = None
                token_id = query
                for i in range(eval_len):
                    logits = model(token_id)
                    logits = penalize(logits, history)
                    token_id = logits.argmax(-1)
                    history = token_id
        """)
    found = rules(src, "beam.py")
    assert (line_of(src, "history[0].tolist()"), "GB002") in found, found


def test_a_checkpoint_wrapper_calls_its_function_once_not_per_item(tmp_path):
    """Megatron-LM's `tensor_parallel.checkpoint(custom_forward, False, *inputs)` calls `custom_forward(*inputs)`
    once: not a map over items. Taking it for multi_apply handed custom_forward the first item of each argument, and
    `attn_mask_type.item()` of a CPU tensor read as a device one. Only a helper that calls its function inside a loop
    or comprehension, or maps it, runs it per item."""
    found = project_rules(tmp_path, {
        "tp.py": """
            def checkpoint(function, distribute, *args):
                return function(*args)
            """,
        "attention.py": """
            import torch
            from tp import checkpoint

            class Attention(torch.nn.Module):
                def checkpointed(self, query, key):
                    def custom_forward(*inputs):
                        q, k, mask_type = inputs
                        kind = int(mask_type.item())
                        return (q @ k.t()) * kind
                    mask_type = torch.tensor([1], dtype=torch.int)
                    return checkpoint(custom_forward, False, query, key, mask_type)
            """,
        "train.py": """
            import torch
            from attention import Attention

            def train(model, loader, opt):
                attn = Attention().cuda()
                for x in loader:
                    x = x.cuda(non_blocking=True)
                    loss = attn.checkpointed(model(x), x).mean()
                    loss.backward()
                    opt.step()
            """})
    assert not any(name == "attention.py" for name, _, _ in found), found
