"""gobrrr lint, issue 29's thirteenth round: shapes met in the misses and false findings of the heldout12
set (yolov10, torchbeast, llm.c, minRF; tuned on here, so no longer unseen), each from a minimal example in
the default run, with the look-alike shapes that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- a def walked first with unknown parameters, walked again when a call types them
ASSIGNER = """
class Assigner(nn.Module):
    def forward(self, scores, boxes, gt):
        return self.metrics(scores, boxes, gt)

    def metrics(self, scores, boxes, gt):
        m = gt.bool()
        return scores[m] * boxes[m]

class Loss:
    def __init__(self):
        self.assigner = Assigner()

    def __call__(self, preds, gt):
        return self.assigner(preds, preds * 2, gt).sum()

def train(model, loader, opt):
    crit = Loss()
    for x, y in loader:
        loss = crit(model(x.to(DEVICE)), {GT})
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_helper_a_hook_reached_untyped_is_walked_again_with_the_device_tensors_a_call_hands_it():
    """yolov10's TaskAlignedAssigner: its forward (a module hook) is walked once with unknown parameters,
    reaching get_pos_mask -> get_box_metrics untyped; the loss then calls the assigner with device tensors,
    and the helpers it reaches must be walked again knowing them (`bbox_scores[mask_gt]`)."""
    found = default(ASSIGNER.replace("{GT}", "y.to(DEVICE)"))
    assert ("GB008", 8) in found, found


def test_a_helper_handed_host_tensors_again_is_not_walked_again():
    """The same helpers called with host tensors: nothing new is known, nothing is reported."""
    found = default(ASSIGNER.replace("{GT}", "y").replace("preds, preds * 2, gt", "gt, gt, gt"))
    assert ("GB008", 8) not in found, found


def test_instances_has_and_get_fields_are_not_tensor_ops():
    """detectron2's `assert proposals[0].has("gt_classes")` and `x.has(name)` on an Instances handed in where
    a tensor was guessed: no tensor has `.has()`, so the condition is a Python bool."""
    body = """
    def sample(proposals, targets):
        assert proposals[0].has("gt_classes")
        for p, t in zip(proposals, targets):
            for name, value in t.get_fields().items():
                if not p.has(name):
                    p.set(name, value)
        return proposals

    def train(model, loader, opt):
        for x, y in loader:
            out = model(x.to(DEVICE))
            sample(out, out)
            loss = out.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    found = default(body)
    assert not [f for f in found if f[0] == "GB007"], found


# -- a tuple item that is a mask on the main return and a placeholder tensor on an early one
MATCHER = """
def assign(scores, gt):
    if gt.shape[0] == 0:
        return torch.zeros_like(scores), torch.zeros_like(scores[..., 0])
    fg = (scores * gt).amax(-1) > 0.5
    return scores * 2, {FG}

def train(model, loader, opt):
    for x, y in loader:
        out = model(x.to(DEVICE))
        target, fg_mask = assign(out, y.to(DEVICE))
        loss = (out[fg_mask] - target[fg_mask]).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_returned_mask_with_an_early_placeholder_return_is_still_a_mask():
    """yolov10's TaskAlignedAssigner returns `fg_mask.bool()`, or `torch.zeros_like(...)` when there are no
    boxes: the caller's `pred_bboxes[fg_mask]` is boolean-mask indexing on the path that matters."""
    found = default(MATCHER.replace("{FG}", "fg.bool()"))
    assert ("GB008", 12) in found, found


def test_a_returned_tensor_on_both_paths_is_not_taken_for_a_mask():
    """The same helper returning an index tensor (argmax) on the main path: indexing by it is no mask."""
    found = default(MATCHER.replace("{FG}", "fg.long().argmax(-1)"))
    assert ("GB008", 12) not in found, found


# -- a row of a mask is a mask
NMS = """
def nms(prediction, conf):
    xc = prediction[..., 4] > conf
    out = []
    for xi, x in enumerate(prediction):
        x = x[{ROW}]
        out.append(x)
    return out

def val(model, loader):
    for x, y in loader:
        preds = nms(model(x.to(DEVICE)), 0.25)
"""


def test_a_row_of_a_mask_indexing_a_tensor_is_boolean_mask_indexing():
    """yolov10's (and yolov5's) non_max_suppression: `xc = prediction[..., 4] > conf`, then `x = x[xc[xi]]`
    per image: the row is still a boolean mask, so the output's size is read on the host."""
    found = default(NMS.replace("{ROW}", "xc[xi]"))
    assert ("GB008", 6) in found, found


def test_a_mask_indexed_by_another_tensor_is_not_taken_for_a_mask():
    """`xc[idx]` with a device index tensor: what it holds is not followed, so nothing is claimed."""
    found = default(NMS.replace("{ROW}", "xc[x.argmax(-1)]"))
    assert ("GB008", 6) not in found, found


# -- a project's own progress bar class wrapping the loader
VALIDATOR = """
from tqdm import tqdm

class TQDM(tqdm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

class Validator:
    def __init__(self, device, dataloader=None):
        self.device = device
        self.dataloader = dataloader

    def preprocess(self, batch):
        for k in ["img", "cls"]:
            batch[k] = batch[k].to(self.device)
        return batch

    def __call__(self, model):
        bar = {BAR}(self.dataloader, total=len(self.dataloader))
        for i, batch in enumerate(bar):
            batch = self.preprocess(batch)
            preds = model(batch["img"])
"""


def test_a_project_progress_bar_named_tqdm_wraps_a_loader():
    """ultralytics' validator: `bar = TQDM(self.dataloader, ...)`, its own tqdm subclass; the batches it
    yields are the loader's, so `batch[k].to(self.device)` is the blocking copy of every batch."""
    found = default(VALIDATOR.replace("{BAR}", "TQDM"))
    assert ("GB009", 15) in found, found


def test_a_project_class_wrapping_something_else_is_not_a_loader():
    """A wrapper of another name (a Timer) says nothing about what it iterates."""
    found = default(VALIDATOR.replace("{BAR}", "Timer").replace("self.dataloader,", "self.items,"))
    assert ("GB009", 15) not in found, found


# -- a full reduction of a device tensor as a size
PAD = """
def pad_targets(targets, batch_size):
    i = targets[:, 0]
    _, counts = i.unique(return_counts=True)
    out = torch.zeros(batch_size, {SIZE}, 5, device=targets.device)
    return out

def train(model, loader, opt):
    for x, y in loader:
        t = pad_targets(y.to(DEVICE), 16)
        loss = model(x.to(DEVICE), t).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_full_reduction_of_a_device_tensor_as_a_size_is_read_on_the_host():
    """yolov10's v8DetectionLoss.preprocess: `torch.zeros(batch_size, counts.max(), 5, device=...)` with
    counts from `unique(return_counts=True)`: torch reads the 0-d maximum with .item() every step."""
    found = default(PAD.replace("{SIZE}", "counts.max()"))
    assert ("GB002", 5) in found, found


def test_a_reduction_along_a_dim_or_of_a_parameter_as_a_size_is_quiet():
    """`targets.max()` of a parameter (the caller's guess) and `len(counts)` say nothing more."""
    found = default(PAD.replace("{SIZE}", "len(counts)"))
    assert ("GB002", 5) not in found, found
    found = default(PAD.replace("{SIZE}", "targets.max()"))
    assert ("GB002", 5) not in found, found


# -- an attribute reset to None, then set to a device tensor
TRAINER = """
class Trainer:
    def __init__(self, model, loader, opt):
        self.model, self.loader, self.opt = model, loader, opt
        self.tloss = None

    def train(self, pbar):
        self.tloss = None
        for i, batch in enumerate(self.loader):
            loss, items = self.model(batch.to(DEVICE))
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.tloss = {VALUE}
            pbar.set_description("%11.4g" * 3 % (*self.tloss,))
"""


def test_an_attribute_reset_to_none_keeps_the_kind_the_step_gives_it():
    """ultralytics' trainer: `self.tloss = None` at set-up and each epoch, then the running mean of the
    loss items, formatted into the progress bar's description every step."""
    found = default(TRAINER.replace("{VALUE}", "(self.tloss * i + items) / (i + 1) if self.tloss is not None else items"))
    assert ("GB003", 15) in found, found


def test_an_attribute_reset_to_none_and_set_to_host_numbers_is_quiet():
    """The same attribute holding read-back numbers (`items.tolist()`): formatting them syncs nothing more."""
    found = default(TRAINER.replace("{VALUE}", "[0.0, 1.0, 2.0]"))
    assert ("GB003", 15) not in found, found


# -- a with-statement runs the context manager's __enter__ and __exit__
PROFILE = """
import time

class Profile:
    def __init__(self, device=None):
        self.device = device

    def __enter__(self):
        self.start = self.time()
        return self

    def __exit__(self, *exc):
        self.dt = self.time() - self.start

    def time(self):
        {SYNC}
        return time.time()

def val(model, loader, device):
    dt = (Profile(device), Profile(device))
    for x in loader:
        with dt[0]:
            x = x.to(device, non_blocking=True)
        with dt[1]:
            y = model(x)
"""


def test_a_timing_context_manager_used_per_step_runs_its_enter_and_exit():
    """ultralytics' Profile, used as `with dt[k]:` around each stage of the validator's loop: __enter__ and
    __exit__ call time(), which synchronizes the device, four times per batch."""
    found = default(PROFILE.replace("{SYNC}", "torch.cuda.synchronize(self.device)"))
    assert ("GB004", 16) in found, found


def test_a_context_manager_that_only_reads_the_clock_is_quiet():
    """The same Profile without the synchronize: nothing syncs; and torch's own managers are not followed."""
    found = default(PROFILE.replace("{SYNC}", "pass"))
    assert not [f for f in found if f[0] == "GB004"], found


# -- the way an isinstance(x, torch.Tensor) test does not take holds no tensor
CLIP = """
def clip_boxes(boxes, shape):
    if {TEST}:
        boxes[..., 0] = boxes[..., 0].clamp(0, shape[1])
    else:
        boxes[..., [0, 2]] = boxes[..., [0, 2]].clip(0, shape[1])
    return boxes

def val(model, loader):
    for x, y in loader:
        out = clip_boxes(model(x.to(DEVICE)), (640, 640))
"""


def test_the_numpy_branch_of_an_isinstance_tensor_test_is_quiet():
    """ultralytics' clip_boxes: `if isinstance(boxes, torch.Tensor): ... else:  # np.array`: the else
    branch's `boxes[..., [0, 2]]` indexes a numpy array, no host index copied to the device."""
    found = default(CLIP.replace("{TEST}", "isinstance(boxes, torch.Tensor)"))
    assert ("GB011", 6) not in found, found
    found = default(CLIP.replace("{TEST}", "not torch.is_tensor(boxes)").replace("clip(0", "clamp(0"))
    assert ("GB011", 4) not in found, found


def test_a_branch_on_something_else_still_indexes_the_tensor():
    """A test that says nothing of the type (`shape[0] > 0`): both ways index the device tensor."""
    found = default(CLIP.replace("{TEST}", "shape[0] > 0"))
    assert ("GB011", 6) in found, found


# -- a dict comprehension of numpy arrays
STATS = """
def get_stats(stats_lists):
    stats = {k: {VALUE} for k, v in stats_lists.items()}
    if len(stats) and stats["tp"].any():
        return stats
    return None

def val(model, loader):
    for x, y in loader:
        out = model(x.to(DEVICE))
        s = get_stats({"tp": [out > 0]})
"""


def test_a_dict_of_arrays_read_back_to_numpy_is_tested_on_the_host():
    """ultralytics' get_stats: `stats = {k: torch.cat(v, 0).cpu().numpy() ...}` (the read-back is its own
    finding), then `stats["tp"].any()`: numpy's any, no second sync."""
    found = default(STATS.replace("{VALUE}", "torch.cat(v, 0).cpu().numpy()"))
    assert ("GB007", 4) not in found, found


def test_a_dict_of_device_tensors_tested_with_any_still_syncs():
    """The same dict of concatenated device tensors: `stats["tp"].any()` decides the branch on the GPU."""
    found = default(STATS.replace("{VALUE}", "torch.cat(v, 0)"))
    assert ("GB007", 4) in found, found


# -- an evaluation loop inside a rate-limited branch is a step loop of its own
EVAL = """
def train(model, opt, train_loader, val_loader, args):
    for step in range(args.num_iterations):
        if step % args.val_loss_every == 0:
            val_loss = 0.0
            for _ in range(args.val_max_steps):
                x, y = val_loader.next_batch()
                x, y = x.to(DEVICE), y.to(DEVICE)
                loss = model(x, y)
                val_loss += loss.item()
        if step % args.log_every == 0:
            {LOG}
        x, y = train_loader.next_batch()
        loss = model(x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_an_evaluation_loop_run_every_n_steps_is_a_step_loop_of_its_own():
    """llm.c's train_gpt2.py: `if step % val_loss_every == 0:` runs a validation loop of val_max_steps
    batches; each of its batches is a step (the README's rule for evaluation loops), so its `.item()` is a
    per-step finding, while the branch stays rare for the training loop."""
    found = default(EVAL.replace("{LOG}", "print(loss.item())"))
    assert ("GB002", 10) in found, found


def test_a_read_in_a_rate_limited_branch_without_a_loop_stays_rare():
    """The logging branch's `.item()` (no loop of its own) is still not a per-step finding."""
    found = default(EVAL.replace("{LOG}", "print(loss.item())"))
    assert ("GB002", 12) not in found, found


# -- a host table built from torch factories inside a @torch.compile'd forward
EMBED = """
import math

class TimestepEmbedder(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.mlp = nn.Linear(dim, dim)
        self.dim = dim

    @staticmethod
    def embedding(t, dim):
        freqs = torch.exp(-math.log(10000) * torch.arange(start=0, end=dim // 2) / (dim // 2)).to(t.device)
        args = t[:, None] * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    {DECORATOR}
    def forward(self, t):
        return self.mlp(self.embedding(t, self.dim))

def train(model, emb, loader, opt):
    for x, t in loader:
        loss = model(x.to(DEVICE), emb(t.to(DEVICE))).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_factory_table_moved_in_a_compiled_forward_is_quiet():
    """minRF's MMDiT TimestepEmbedder: `torch.exp(... torch.arange(...) ...).to(t.device)` in a helper of a
    @torch.compile()'d forward: Inductor builds the table on the device, there is no copy per step."""
    found = default(EMBED.replace("{DECORATOR}", "@torch.compile()"))
    assert ("GB010", 12) not in found, found


def test_the_same_table_moved_in_an_eager_forward_is_a_per_step_copy():
    """The eager twin (DiT's): the arange is built on the host and copied every step."""
    found = default(EMBED.replace("{DECORATOR}", ""))
    assert ("GB010", 12) in found, found
