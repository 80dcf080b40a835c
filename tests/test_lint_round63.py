"""gobrrr lint, issue 29's round 63 on heldout78-79's first sights (gptq, PointRCNN): each firing test beside the
neighbour that must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, rules


def test_a_loop_that_moves_one_layer_to_the_device_per_iteration_is_a_step_loop():
    """GPTQ quantizes layer by layer: `layer = layers[i].to(dev)`, the calibration samples run through it, then
    `layers[i] = layer.cpu()` and `torch.cuda.empty_cache()`. The samples' inner loop made the layer loop an
    outer loop, so its per-layer copies and cache flush went unreported (gptq 16% at first sight). A loop that
    moves a block of the model to the device at its own level is a step loop, whatever loops it holds. An epoch
    loop that holds the batch loop stays an outer loop."""
    src = textwrap.dedent("""
        import torch

        @torch.no_grad()
        def quantize(model, inps, dev, nsamples):
            layers = model.decoder.layers
            outs = torch.zeros_like(inps)
            for i in range(len(layers)):
                layer = layers[i].to(dev)
                for j in range(nsamples):
                    outs[j] = layer(inps[j].unsqueeze(0))[0]
                layers[i] = layer.cpu()
                del layer
                torch.cuda.empty_cache()
                inps, outs = outs, inps

        def train(model, loader, opt, dev):
            model.to(dev)
            for epoch in range(10):
                for x, y in loader:
                    loss = model(x.to(dev, non_blocking=True)).mean()
                    loss.backward()
                    opt.step()
                torch.cuda.empty_cache()
        """)
    found = rules(src, "opt.py")
    start = line_of(src, "def train(")
    assert (line_of(src, "layers[i] = layer.cpu()"), "GB002") in found, found
    assert any(r == "GB004" and line < start for line, r in found), found   # the per-layer cache flush
    assert not any(r == "GB004" and line > start for line, r in found), found   # not the per-epoch one


def test_the_def_a_factory_returns_handed_to_a_constructor_runs_where_the_class_calls_it():
    """PointRCNN's Trainer is built with `train_functions.model_joint_fn_decorator()`, a factory whose nested
    `model_fn(model, data)` uploads each batch from numpy and reads its losses with `.item()`; the Trainer calls
    `self.model_fn(self.model, batch)` per step. A def handed to a constructor was followed only by its name, so
    none of model_fn's per-step syncs were reported. The one def a factory returns is what the attribute runs."""
    src = textwrap.dedent("""
        import torch

        def model_fn_decorator():
            def model_fn(model, data):
                inputs = torch.from_numpy(data["pts_input"]).cuda(non_blocking=True).float()
                loss = model(inputs).mean()
                return loss, {"loss": loss.item()}
            return model_fn

        class Trainer:
            def __init__(self, model, model_fn, optimizer):
                self.model, self.model_fn, self.optimizer = model, model_fn, optimizer

            def train(self, loader, epochs):
                for epoch in range(epochs):
                    for batch in loader:
                        loss, tb = self.model_fn(self.model, batch)
                        loss.backward()
                        self.optimizer.step()

        def main(model, loader, optimizer):
            model.cuda()
            trainer = Trainer(model, model_fn_decorator(), optimizer)
            trainer.train(loader, 10)
        """)
    found = rules(src, "train_utils.py")
    assert (line_of(src, 'return loss, {"loss": loss.item()}'), "GB002") in found, found
