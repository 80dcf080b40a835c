"""gobrrr lint, issue 29's round on heldout39's false findings (sam2): sizes a method hands back in a tuple, and a
batch class's number fields, were taken for tensors. From minimal examples, beside the neighbours that must stay
reported."""
from __future__ import annotations

from lintcase import line_of, project_rules, rules

# a video trainer's loop calls its own method for each frame's features, whose tuple ends with the feature sizes
VIDEO = """
class VideoTrainer(Tracker):
    def forward(self, input):
        outputs = self.run_frames(input)

    def run_frames(self, input):
        for frame in input.order:
            _, feats, pos, sizes = self._features_of_frame(input.frames, frame)
            out = self.step_frame(frame=frame, feats=feats, sizes=sizes)
            logits, aux = self.mask_head(out)
            if aux.sum() > 0:
                out = out * 2
"""

TRACKER = """
import torch


class Tracker(torch.nn.Module):
    def _memory_of(self, feats, sizes):
        H, W = sizes[-1]
        return feats[-1].permute(1, 2, 0).view(-1, 8, H, W)

    def step_frame(self, frame, feats, sizes):
        return self._memory_of(feats, sizes)

    def boxes(self, masks):
        return torch.arange(masks.shape[0], device=masks.device)
"""


def test_a_tuple_from_an_own_method_may_hold_sizes(tmp_path):
    """`_, feats, pos, sizes = self._features_of_frame(...)`: a method of the object, not a module it holds; the
    guess that its result is a tensor says nothing of each part, so `H, W = sizes[-1]` is no tensor size."""
    found = project_rules(tmp_path, {"video.py": VIDEO, "tracker.py": TRACKER})
    assert ("tracker.py", line_of(TRACKER, "view(-1, 8, H, W)"), "GB002") not in found


def test_a_tuple_from_a_held_module_is_still_tensors(tmp_path):
    """`logits, aux = self.mask_head(out)`: a module's outputs are tensors, and testing one syncs."""
    found = project_rules(tmp_path, {"video.py": VIDEO, "tracker.py": TRACKER})
    assert ("video.py", line_of(VIDEO, "if aux.sum() > 0:"), "GB007") in found


CLIP = """
import torch


class Clip:
    def __init__(self, frames):
        self.frames = frames

    @property
    def num_frames(self) -> int:
        return len(self.frames)

    @property
    def mean_frame(self) -> torch.Tensor:
        return self.frames.mean(0)


def train(model, loader, opt):
    for clip in loader:
        clip = clip.cuda(non_blocking=True)
        if clip.num_frames == 1:
            continue
        loss = model(clip.frames).mean()
        if clip.mean_frame.sum() > 0:
            loss = loss * 2
        loss.backward()
        opt.step()
"""


def test_a_batch_property_typed_int_is_a_number():
    """`clip.num_frames`, a property the project types `-> int`: a Python number, though the batch holds tensors."""
    found = rules(CLIP)
    assert (line_of(CLIP, "if clip.num_frames == 1:"), "GB007") not in found
    assert (line_of(CLIP, "if clip.mean_frame.sum() > 0:"), "GB007") in found


RNG = """
import numpy as np
import torch


class Sampler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(seed=0)
        self.net = torch.nn.Linear(4, 4)

    def forward(self, x, pool):
        extra = self.rng.choice(pool, 2, replace=False).tolist()
        gen = np.random.RandomState(0)
        more = gen.choice(pool, 2).tolist()
        picked = x[:, 0].tolist()
        return self.net(x), extra, more, picked


model = Sampler().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    x = x.cuda(non_blocking=True)
    y, extra, more, picked = model(x, x[:, 0])
    y.sum().backward()
    opt.step()
"""


def test_a_numpy_generator_draws_numpy():
    """`self.rng.choice(pool, k).tolist()` with `self.rng = np.random.default_rng(...)`: the draw is a numpy array
    even when the pool handed to it is a device tensor's guess; `.tolist()` of it reads nothing from the GPU."""
    found = rules(RNG)
    assert (line_of(RNG, "extra = self.rng.choice"), "GB002") not in found
    assert (line_of(RNG, "more = gen.choice"), "GB002") not in found
    assert (line_of(RNG, "picked = x[:, 0].tolist()"), "GB002") in found
