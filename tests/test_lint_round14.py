"""gobrrr lint, issue 29's fifteenth round (round 14 of the rules): shapes still missed on the judged
repositories after round 13, each from a minimal example in the default run, with the look-alike
shapes that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- a numpy array indexed by an element of a device tensor
TALLY = """
class Tally:
    def __init__(self, n):
        self.counts = np.zeros((n + 1, n + 1))
        self.n = n

    def add(self, found, labels):
        if found is None:
            for c in labels.int():
                self.counts[self.n, c] += 1
            return
        for c in labels[:, 0].int():
            self.counts[c, self.n] += 1


def evaluate(model, loader):
    tally = Tally(80)
    for x, y in loader:
        y = y.to(DEVICE)
        out = model(x.to(DEVICE))
        if len(out) == 0:
            tally.add(found=None, labels=y[:, 0])
            continue
        tally.add(out, y)
"""


def test_a_device_element_as_a_numpy_index_is_read_with_index():
    """yolov5's ConfusionMatrix.process_batch: `self.matrix[self.nc, gc] += 1` with gc from iterating
    a CUDA class tensor; numpy takes the 0-d tensor through __index__, an .item() per label."""
    assert ("GB002", 13) in default(TALLY), default(TALLY)


def test_a_host_element_as_a_numpy_index_stays_quiet():
    body = TALLY.replace("y = y.to(DEVICE)", "y = y.numpy()")   # the labels stay a host array
    assert not [f for f in default(body) if f[0] == "GB002"], default(body)


# -- a literal passed where the parameter has no default decides the branches on it
def test_none_passed_to_a_parameter_without_default_walks_its_none_branch():
    """The same tally called with `found=None` (the images without detections): the `if found is None:`
    branch runs on that call, every such image."""
    assert ("GB002", 10) in default(TALLY), default(TALLY)


def test_the_none_branch_stays_off_when_no_call_passes_none():
    body = TALLY.replace("tally.add(found=None, labels=y[:, 0])", "pass")
    assert ("GB002", 10) not in default(body) and ("GB002", 13) in default(body), default(body)


# -- an object a factory method returns (overridden in the subclasses), called in the step
FACTORY = """
class Criterion(nn.Module):
    def forward(self, out, batch):
        n = batch["target"].sum()
        if n == 0:
            return out.sum()
        return (out - batch["target"]).abs().sum()


class Runner:
    def __init__(self, model):
        self.names, self.objective = self.make_criterion()
        self.model = model

    def make_criterion(self):
        raise NotImplementedError

    def run(self, loader, opt):
        for batch in loader:
            batch = {k: v.to(DEVICE, non_blocking=True) for k, v in batch.items()}
            loss = self.objective(self.model(batch["input"]), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()


class DetRunner(Runner):
    def make_criterion(self):
        crit = Criterion()
        return ["loss"], crit
"""


def test_an_object_a_factory_method_builds_runs_its_forward_in_the_step():
    """CenterNet's `self.loss_stats, self.loss = self._get_losses(opt)` (each trainer subclass returns its
    loss module), ultralytics' `self.criterion = self.init_criterion()`: the class the overrides return."""
    assert ("GB007", 5) in default(FACTORY), default(FACTORY)


def test_a_factory_method_returning_a_library_object_resolves_to_nothing():
    body = FACTORY.replace("crit = Criterion()", "crit = nn.MSELoss()")
    assert ("GB007", 5) not in default(body), default(body)


# -- a batch moved to the device key by key in a loop over its keys
KEYED = """
class Criterion(nn.Module):
    def forward(self, out, batch):
        n = batch["target"].sum()
        if n == 0:
            return out.sum()
        ids = batch["meta"]["ids"].cpu()
        return (out - batch["target"]).abs().sum()


def run(model, loader, opt):
    crit = Criterion().to(DEVICE)
    for batch in loader:
        for k in batch:
            if k != "meta":
                batch[k] = batch[k].to(DEVICE, non_blocking=True)
        loss = crit(model(batch["input"]), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_batch_moved_key_by_key_holds_device_tensors():
    """CenterNet's run_epoch: `for k in batch: if k != 'meta': batch[k] = batch[k].to(device)`; the loss
    module's forward (its `batch` parameter named like a host batch) is handed the moved dict."""
    assert ("GB007", 5) in default(KEYED), default(KEYED)


def test_the_key_the_loop_leaves_on_the_host_stays_quiet():
    """`batch["meta"]` was left on the host by the same loop: its `.cpu()` copies nothing."""
    assert ("GB002", 7) not in default(KEYED), default(KEYED)


def test_a_loop_that_moves_nothing_leaves_the_batch_on_the_host():
    body = KEYED.replace("batch[k] = batch[k].to(DEVICE, non_blocking=True)", "batch[k] = batch[k].float()")
    assert ("GB007", 5) not in default(body), default(body)


# -- a model's call whose forward returns a loss on one path and predictions on the other
MODEL = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        if isinstance(x, dict):
            return self.head(x["img"]).sum(), self.head(x["img"]).detach()
        return self.head(x)


class Trainer:
    def __init__(self):
        self.model = self.get_model()

    def get_model(self):
        return Net()

    def train(self, loader, opt):
        for batch in loader:
            batch = {k: v.to(DEVICE, non_blocking=True) for k, v in batch.items()}
            self.loss, self.items = self.model(batch)
            opt.zero_grad()
            self.loss.backward()
            opt.step()
            print("%.4g %.4g" % (*self.items,))
"""


def test_a_models_call_still_gives_tensors_when_its_forward_returns_mixed_kinds():
    """ultralytics: `self.loss, self.loss_items = self.model(batch)`, with the model now resolved through
    `get_model()`; its forward returns a loss tuple or predictions, but what a model returns is tensors."""
    assert ("GB003", 27) in default(MODEL), default(MODEL)


def test_an_objects_call_that_returns_mixed_kinds_gives_no_guess():
    body = MODEL.replace("self.loss, self.items = self.model(batch)", "self.loss, self.items = self.model(batch)\n"
                         "            done = self.until(3)").replace("opt.step()", "opt.step()\n            if done: break")
    body = body.replace("class Trainer:", "class Until:\n    def __call__(self, n):\n        if n is None:\n"
                        "            return True\n        return n < 3\n\n\nclass Trainer:").replace(
        "self.model = self.get_model()", "self.model = self.get_model()\n        self.until = Until()")
    assert not [f for f in default(body) if f[0] == "GB007"], default(body)


# -- a device element as torch.full's fill value (a Scalar: read with .item())
FILL = """
def sample(model, x, steps):
    alphas = torch.linspace(0.1, 0.9, steps, device=DEVICE)
    for i in range(steps):
        a_t = torch.full((x.shape[0], 1), alphas[i], device=DEVICE)
        x = model(x) * a_t
    return x
"""


def test_a_device_element_as_a_fill_value_is_read_with_item():
    """latent-diffusion's DDIM step: `torch.full((b, 1, 1, 1), alphas[index], device=device)` with the
    schedule on the GPU; torch.full takes a Scalar, so the 0-d tensor is read back every step."""
    assert ("GB002", 5) in default(FILL), default(FILL)


def test_a_host_element_as_a_fill_value_stays_quiet():
    body = FILL.replace("steps, device=DEVICE)", "steps).numpy()")
    assert ("GB002", 5) not in default(body), default(body)


def test_a_number_checked_with_isinstance_is_no_tensor_there():
    """imagen's `if isinstance(sigma, float): sigma = torch.full((batch,), sigma, device=device)`."""
    body = FILL.replace("a_t = torch.full((x.shape[0], 1), alphas[i], device=DEVICE)",
                        "a_t = alphas[i]\n        if isinstance(a_t, float):\n"
                        "            a_t = torch.full((x.shape[0], 1), a_t, device=DEVICE)")
    assert not [f for f in default(body) if f[0] == "GB002"], default(body)


# -- host data cast with type_as(t): on t's device
TYPE_AS = """
def sample(inds, boxes, n):
    pick = torch.from_numpy(np.random.permutation(n)).type_as({LIKE}).long()
    return inds[pick]


def train(model, loader, opt):
    for x, y in loader:
        out = model(x.to(DEVICE, non_blocking=True))
        keep = sample(out.argmax(1), targets_of(y), 8)
        loss = out[keep].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_host_indices_cast_like_a_tensor_of_unknown_place_are_not_taken_for_host_ones():
    """faster-rcnn's `torch.from_numpy(np.random.permutation(n)).type_as(gt_boxes).long()` with gt_boxes
    on the GPU: the index is then on the device (the copy is type_as's), no host index."""
    body = TYPE_AS.replace("{LIKE}", "boxes")
    assert ("GB011", 4) not in default(body), default(body)


def test_host_indices_cast_like_a_host_tensor_stay_host_indices():
    body = TYPE_AS.replace("{LIKE}", "torch.zeros(1)")
    assert ("GB011", 4) in default(body), default(body)
