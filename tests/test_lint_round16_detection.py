"""gobrrr lint, issue 29's seventeenth round (round 16 of the rules), continued: heldout15's detection and LLM
shapes (YOLOP's validation and loaders, the confusion matrices, lingua's document ids), each from a minimal example
in the default run, with the look-alike shapes that must stay quiet. The RL shapes are in test_lint_round16.py."""
from __future__ import annotations

from tests.test_lint_round4 import default
from tests.test_lint_round16 import _tree

# -- `if not cfg.DEBUG:` is the normal way: what its body binds holds after it
VALIDATE = """
def validate(model, loader, cfg, device):
    model.eval()
    for i, (img, target) in enumerate(loader):
        if not cfg.DEBUG:
            img = img.to(device, non_blocking=True)
            assign_target = []
            for tgt in target:
                assign_target.append(tgt.to(device))
            target = assign_target
        with torch.no_grad():
            output = model(img)
        for si, pred in enumerate(output):
            labels = target[0][target[0][:, 0] == si, 1:]
            nl = len(labels)
            tcls = labels[:, 0].tolist() if nl else []
"""


def test_the_targets_a_not_debug_branch_moves_are_device_tensors_after_it():
    """YOLOP's validate: `if not config.DEBUG:` moves the targets to the device (DEBUG is off by default);
    the per-image label selection with a boolean mask and the `.tolist()` after it read the GPU."""
    assert {("GB008", 14), ("GB002", 16)} <= set(default(VALIDATE)), default(VALIDATE)


def test_a_branch_on_another_flag_keeps_both_ways():
    body = VALIDATE.replace("if not cfg.DEBUG:", "if not cfg.CPU_ONLY:")   # either way may run: nothing known
    assert not [f for f in default(body) if f[1] in (14, 16)], default(body)


def test_a_conditional_expression_on_a_parameter_left_at_its_default_runs_one_way():
    body = """
    def step(model, x, y, hybrid=False):
        out = model(x)
        lb = [y[y[:, 0] == i] for i in range(4)] if hybrid else []
        return out, lb


    def train(model, opt, loader):
        for x, y in loader:
            out, lb = step(model, x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True))
            loss = out.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    assert not [f for f in default(body) if f[1] == 4], default(body)
    called = body.replace("x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True))",
                          "x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True), True)")
    assert ("GB008", 4) in default(called), default(called)


# -- `[t] * n`: a list of n such tensors
def test_a_list_of_device_tensors_repeated_is_a_list_of_device_tensors():
    """YOLOP's non_max_suppression: `output = [torch.zeros((0, 6), device=prediction.device)] * n`, filled
    per image and returned; each `pred` of it is a device tensor, masked and read per image."""
    body = """
    def nms(prediction, conf=0.25):
        output = [torch.zeros((0, 6), device=prediction.device)] * prediction.shape[0]
        for xi, x in enumerate(prediction):
            output[xi] = x[x[:, 4] > conf]
        return output


    def evaluate(model, loader):
        for img, target in loader:
            out = model(img.to(DEVICE, non_blocking=True))
            for si, pred in enumerate(nms(out)):
                for *xyxy, conf, cls in reversed(pred):
                    label = int(cls)
    """
    assert ("GB002", 14) in default(body), default(body)


def test_a_host_list_whose_items_a_forward_replaces_on_the_device_stays_quiet():
    """YOLO's Detect: `self.grid = [torch.zeros(1)] * nl` on the host, replaced item by item with a device
    grid the first time a shape is seen: its later `.to(x[i].device)` copies nothing."""
    body = """
    class Detect(nn.Module):
        def __init__(self, nl):
            super().__init__()
            self.nl = nl
            self.grid = [torch.zeros(1)] * nl
            self.m = nn.ModuleList(nn.Conv2d(8, 8, 1) for _ in range(nl))

        def forward(self, x):
            z = []
            for i in range(self.nl):
                x[i] = self.m[i](x[i])
                if self.grid[i].shape[2:4] != x[i].shape[2:4]:
                    self.grid[i] = make_grid(x[i].shape).to(x[i].device)
                z.append(x[i].sigmoid() + self.grid[i].to(x[i].device))
            return z
    """
    assert not default(body), default(body)
    kept = body.replace("self.grid[i] = make_grid(x[i].shape).to(x[i].device)", "pass")
    assert ("GB010", 15) in default(kept), default(kept)   # never replaced: a host grid copied per forward


# -- torch.repeat_interleave(repeats): the output's length is repeats.sum(), read on the host
DOC_IDS = """
def local_ids(lengths):
    doc_id = torch.repeat_interleave(lengths)
    return doc_id


def evaluate(model, loader):
    for tokens, lengths in loader:
        ids = local_ids(lengths.to(DEVICE, non_blocking=True))
        out = model(tokens.to(DEVICE, non_blocking=True), ids)
"""


def test_repeat_interleave_of_device_repeats_alone_has_a_data_dependent_size():
    """lingua's lengths_to_local_ids: `torch.repeat_interleave(lengths)` of the CUDA document lengths,
    four times per evaluation batch: torch sums the repeats on the host to size the output."""
    assert ("GB008", 3) in default(DOC_IDS), default(DOC_IDS)


def test_repeat_interleave_by_a_number_stays_quiet():
    body = DOC_IDS.replace("torch.repeat_interleave(lengths)", "torch.repeat_interleave(lengths, 2)")
    assert not [f for f in default(body) if f[1] == 3], default(body)


# -- `m1 == i` inside any(...): an array compared with the loop index, not a first-iteration test
CONFUSION = """
class Confusion:
    def __init__(self, nc):
        self.nc = nc
        self.matrix = np.zeros((nc + 1, nc + 1))

    def process_batch(self, detections, labels):
        detection_classes = detections[:, 5].int()
        m1 = np.zeros(0, dtype=np.int16)
        for i, dc in enumerate(detection_classes):
            if not any(m1 == i):
                self.matrix[self.nc, dc] += 1


def evaluate(model, loader, cm):
    for img, target in loader:
        out = model(img.to(DEVICE, non_blocking=True))
        cm.process_batch(out, target.to(DEVICE, non_blocking=True))
"""


def test_an_array_compared_with_the_loop_index_inside_any_is_not_a_first_step_test():
    """The confusion matrices of yolov5, yolov7, yolov10 and YOLOP: `if not any(m1 == i):` marks an unmatched
    detection, most of them every batch; its 0-d CUDA class as a numpy index is read per detection."""
    assert ("GB002", 12) in default(CONFUSION), default(CONFUSION)


def test_the_loop_index_compared_with_a_constant_is_still_a_first_step_test():
    body = CONFUSION.replace("if not any(m1 == i):", "if i == 0:")
    assert not [f for f in default(body) if f[1] == 12], default(body)


# -- a project DataLoader subclass, pinned by a config attribute the project only ever sets to False
LOOP = """
def train(cfg, loader, model, opt, device):
    for i, (x, y) in enumerate(loader):
        x = x.to(device, non_blocking=True)
        loss = model(x).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
LOADERX = """
from torch.utils.data import DataLoader


class DataLoaderX(DataLoader):
    def __iter__(self):
        return iter(super().__iter__())
"""
CONFIG = """
class Node(dict):
    pass


_C = Node()
_C.PIN_MEMORY = False
"""
MAIN = """
from pkg.function import train
from pkg.util import DataLoaderX
from pkg.config import _C as cfg


def main(ds, model, opt, lr_scheduler, epochs):
    device = torch.device("cuda")
    loader = DataLoaderX(ds, batch_size=8, pin_memory=cfg.PIN_MEMORY)
    for epoch in range(epochs):
        train(cfg, loader, model, opt, device)
        lr_scheduler.step()
"""


def test_a_loader_subclass_pinned_by_a_config_left_false_is_pageable(tmp_path):
    """YOLOP: `DataLoaderX(train_dataset, ..., pin_memory=cfg.PIN_MEMORY)` with `_C.PIN_MEMORY = False` in
    the default config: `input.to(device, non_blocking=True)` copies from pageable memory, synchronously."""
    found = _tree(tmp_path, {"pkg/function.py": LOOP, "pkg/util.py": LOADERX, "pkg/config.py": CONFIG, "pkg/main.py": MAIN})
    assert ("function.py", "GB005", 4) in found, found


def test_a_config_attribute_also_set_true_somewhere_stays_pinned(tmp_path):
    config = CONFIG + "_C.FAST = Node()\n_C.FAST.PIN_MEMORY = True\n"
    found = _tree(tmp_path, {"pkg/function.py": LOOP, "pkg/util.py": LOADERX, "pkg/config.py": config, "pkg/main.py": MAIN})
    assert ("function.py", "GB005", 4) not in found, found
