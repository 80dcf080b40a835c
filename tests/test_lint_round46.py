"""gobrrr lint, issue 29's round on heldout44's misses (VQ-Diffusion, CornerNet-Lite, nanoVLM, phasic-policy-gradient):
each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gobrrr.lint import lint_paths


def _lint(tmp_path: Path, files: dict[str, str]) -> set[tuple[str, int, str]]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return {(Path(f.path).name, f.line, f.rule) for f in lint_paths([tmp_path])}


_SOLVER = """
    import torch

    class Solver:
        def __init__(self, model, dataloader, optimizers, debug=False):
            self.model, self.dataloader, self.debug = model.cuda(), dataloader, debug
            self.optimizer_and_scheduler = optimizers

        def step(self, batch):
            if self.debug == False:
                for k, v in batch.items():
                    if torch.is_tensor(v):
                        batch[k] = v.cuda()
            else:
                batch = batch[0].cuda()
            for name, op_sc in self.optimizer_and_scheduler.items():
                loss = self.model(**batch)["loss"]
                op_sc["optimizer"].zero_grad()
                loss.backward()
                op_sc["optimizer"].step()
            return loss

        def train_epoch(self):
            for itr, batch in enumerate(self.dataloader["train_loader"]):
                loss = self.step(batch)
    """


def test_a_loop_over_the_optimizers_is_inside_the_step(tmp_path):
    """VQ-Diffusion's solver: `step(batch)` updates once per optimizer (`for name, op_sc in
    self.optimizer_and_scheduler.items()`), and the loop over the loader kept in a dict
    (`self.dataloader["train_loader"]`) that calls it is the step loop: the batch copy at the top of `step` is
    per step."""
    assert ("s.py", 12, "GB009") in _lint(tmp_path, {"s.py": _SOLVER})


def test_a_debug_flag_compared_with_false_is_the_normal_way(tmp_path):
    """`if self.debug == False:` reads as `if not self.debug:`: its body is the normal path (hot), its else the
    debug one (not per step)."""
    found = _lint(tmp_path, {"s.py": _SOLVER})
    assert ("s.py", 12, "GB009") in found
    assert ("s.py", 14, "GB009") not in found


def test_a_callable_parameter_runs_its_default(tmp_path):
    """`def cornernet(db, nnet, decode_func=decode)`: `decode_func(...)` runs `decode`, whose `.cpu().numpy()` is
    the per-image read-back, and what it returns is numpy: its detections indexed with `[2, 0]` copy nothing."""
    found = _lint(tmp_path, {"t.py": """
        import numpy as np
        import torch

        def decode(nnet, images):
            detections = nnet.test([images])[0]
            return detections.data.cpu().numpy()

        def run(db, nnet, decode_func=decode):
            for image in db.images:
                images = torch.from_numpy(image).cuda()
                dets = decode_func(nnet, images)
                dets[1, :, [0, 2]] = 1 - dets[1, :, [2, 0]]
                db.save(dets)
        """})
    assert ("t.py", 6, "GB002") in found
    assert not {f for f in found if f[1] == 12}


def test_language_model_and_denoiser_arguments_are_tensors_in_a_forward(tmp_path):
    """A module's `forward(self, input_ids, ...)` or `forward(self, x, timestep)` is handed device tensors by those
    names (nanoVLM, VQ-Diffusion's AdaLayerNorm: `if timestep[0] >= self.diff_step:` every layer); a parameter
    tested as a list (`if isinstance(images, list): ... if not images:`) holds a list there."""
    found = _lint(tmp_path, {"m.py": """
        import torch
        from torch import nn

        class AdaNorm(nn.Module):
            def forward(self, x, timestep):
                if timestep[0] >= self.diff_step:
                    return self.a(x)
                return self.b(x)

        class VLM(nn.Module):
            def images_in(self, images, device):
                if isinstance(images, list):
                    if not images:
                        return None
                    return torch.stack(images).to(device)
                return images

            def forward(self, input_ids, images, attention_mask=None):
                images = self.images_in(images, input_ids.device)
                if (input_ids == 7).any():
                    input_ids = input_ids.clone()
                return self.lm(input_ids, images)

        def train(model, loader, opt):
            model.cuda()
            for batch in loader:
                loss = model(**{k: v.cuda(non_blocking=True) for k, v in batch.items()})
                loss.backward()
                opt.step()
        """})
    assert {("m.py", 6, "GB007"), ("m.py", 20, "GB007")} <= found
    assert not {f for f in found if f[1] == 13}
