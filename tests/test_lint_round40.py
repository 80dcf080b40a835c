"""gobrrr lint, issue 29's round on what heldout37 still missed: a branch on several options joined by `or`
(yolov9's detect loop: `if save_img or save_crop or view_img:` around the per-box drawing, which the default run
does) runs whenever any of them is on, so it is rare only if each part is. From a minimal example, beside the
neighbour that must stay quiet."""
from __future__ import annotations

from lintcase import line_of, rules

DETECT = """
import torch


@torch.no_grad()
def run(model, loader, names, save_img, save_crop, view_img, every):
    for step, im in enumerate(loader):
        pred = model(im.cuda(non_blocking=True))
        for det in pred:
            for *xyxy, conf, cls in reversed(det):
                if save_img or save_crop or view_img:
                    c = int(cls)
                    print(names[c])
                if save_img or step % every == 0:
                    print(names[int(cls)])
"""


def test_options_joined_by_or_run_when_any_one_is_on():
    assert (line_of(DETECT, "c = int(cls)"), "GB002") in rules(DETECT)


def test_a_rate_joined_to_an_option_is_judged_as_before():
    """Only a plain `or` of options is split: `save_img or step % every == 0` keeps its rate, so stays rare."""
    assert (line_of(DETECT, "print(names[int(cls)])"), "GB002") not in rules(DETECT)
