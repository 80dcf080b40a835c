"""gobrrr lint, issue 29's twelfth round: shapes met in the misses of the heldout11 set (RT-DETR,
dreamerv3-torch, imagen-pytorch; tuned on here, so no longer unseen), each from a minimal example in the
default run, with the look-alike shapes that must stay quiet."""
from __future__ import annotations

import textwrap

from gobrrr.lint.check import lint_paths, lint_source, main
from gobrrr.lint.files import python_files
from tests.test_lint_round4 import HEAD, default


def lint_chain(body: str) -> list[tuple[str, int, list[str]]]:
    """(rule, line, chain) of the default run; lines count from the snippet's first line, as default()'s do."""
    off = HEAD.count("\n")
    out = lint_source(HEAD + textwrap.dedent(body), "train.py")
    return sorted((f.rule, f.line - off, [_shift(c, off) for c in f.chain]) for f in out)


def _shift(loc: str, off: int) -> str:
    path, line = loc.rsplit(":", 1)
    return f"{path}:{int(line) - off}"


# -- math.* on a device scalar
def test_math_isfinite_of_a_summed_loss_dict_reads_it_on_the_host():
    """`loss_value = sum(loss_dict_reduced.values()); if not math.isfinite(loss_value)` (RT-DETR's engine):
    math converts its argument with float(), an .item() every step; a reduce helper that hands back the dict
    or a dict of reduced tensors still holds device tensors."""
    body = """
    import math
    import torch.distributed as tdist

    def reduce_dict(data):
        if tdist.get_world_size() < 2:
            return data
        values = torch.stack(list(data.values()))
        tdist.all_reduce(values)
        return {k: v for k, v in zip(data.keys(), values)}

    def train(model, criterion, loader, opt, device):
        for x, y in loader:
            loss_dict = criterion(model(x.to(device)), y)
            loss = sum(loss_dict.values())
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_value = sum(reduce_dict(loss_dict).values())
            if not math.isfinite(loss_value):
                break
            scale = math.sqrt(loss.detach())
    """
    found = default(body)
    assert ("GB002", 20) in found, found
    assert ("GB002", 22) in found, found


def test_math_of_host_numbers_is_quiet():
    """math.isfinite of a Python float (`loss.item()` already read, a learning rate): nothing more to read."""
    body = """
    import math

    def train(model, loader, opt, lr):
        for x, y in loader:
            loss = model(x.cuda(non_blocking=True), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            values = {"a": 1.0, "b": 2.0}
            total = sum(values.values())
            ok = math.isfinite(total) and math.isfinite(lr) and math.log(len(values)) > 0
    """
    assert not [f for f in default(body) if f[0] == "GB002"], default(body)


# -- calls dispatched through a dict of functions
def test_a_dict_of_bound_methods_set_in_init_makes_each_hot():
    """`self.loss_map = {'boxes': self.loss_boxes, ...}` in __init__, `self.loss_map[name](out)` in forward:
    the call reaches every value of the dict; a module-level table of functions likewise."""
    body = """
    def l1(x):
        return x.sum().item()

    LOSSES = {"l1": l1}

    class Criterion(nn.Module):
        def __init__(self, names):
            super().__init__()
            self.names = names
            self.loss_map = {"a": self.loss_a, "b": self.loss_b}

        def loss_a(self, x):
            return float(x.max())

        def loss_b(self, x):
            return x.min().cpu()

        def forward(self, x):
            out = [self.loss_map[n](x) for n in self.names]
            return out + [LOSSES[n](x) for n in self.names]
    """
    found = default(body)
    for line in (3, 14, 17):
        assert ("GB002", line) in found, found


def test_a_called_attribute_handed_in_by_a_config_runs_the_class_it_is_named_after():
    """`self.matcher = matcher` (a parameter a config injects), `indices = self.matcher(out, targets)`:
    HungarianMatcher's forward runs, and its host index tensors index device tensors in the loss."""
    body = """
    from scipy.optimize import linear_sum_assignment

    class HungarianMatcher(nn.Module):
        @torch.no_grad()
        def forward(self, outputs, targets):
            C = outputs["pred_logits"].cpu()
            indices = [linear_sum_assignment(c) for c in C]
            return [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j)) for i, j in indices]

    class SetCriterion(nn.Module):
        def __init__(self, matcher):
            super().__init__()
            self.matcher = matcher

        def forward(self, outputs, targets):
            indices = self.matcher(outputs, targets)
            idx = torch.cat([src for (src, _) in indices])
            return outputs["pred_boxes"][idx].sum()
    """
    assert ("GB011", 19) in default(body), default(body)


def test_a_called_attribute_only_partly_named_like_a_class_pins_nothing():
    """`self.a2c_network(obs)` ends with the name of several `Network` classes but names none of them: its
    outputs stay the tensors a module's call gives."""
    body = """
    class Network(nn.Module):
        def forward(self, x):
            return [1, 2], None

    class Model(nn.Module):
        def __init__(self, a2c_network):
            super().__init__()
            self.a2c_network = a2c_network

        def forward(self, obs):
            logits, value = self.a2c_network(obs)
            return value.item()
    """
    assert ("GB002", 13) in default(body), default(body)


def test_a_dict_of_numbers_indexed_in_a_step_is_not_a_call():
    """`self.weight_dict[k] * loss[k]`: a table of weights, nothing to follow; a dict of strings called
    through getattr stays quiet too."""
    body = """
    class Criterion(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight_dict = {"a": 1.0, "b": 2.0}
            self.acts = {"a": "relu"}

        def forward(self, x):
            return sum(self.weight_dict[k] * getattr(F, self.acts[k])(x).mean() for k in self.weight_dict)
    """
    assert default(body) == [], default(body)


# -- module-level lambdas bound to a name
def test_a_module_level_lambda_called_in_a_step_is_walked_like_a_def():
    """`to_np = lambda x: x.detach().cpu().numpy()` (dreamerv3's models.py and tools.py), called on a loss
    in the step: its .cpu() is reported at the lambda, with the chain, as a helper def's would be."""
    body = """
    to_np = lambda x: x.detach().cpu().numpy()

    def train(model, loader, opt):
        for x in loader:
            loss = model(x.cuda(non_blocking=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            metrics = {"loss": to_np(loss)}
    """
    found = lint_chain(body)
    assert found == [("GB002", 2, ["train.py:10"])], found


def test_a_module_level_lambda_outside_the_step_or_without_a_sync_is_quiet():
    """The same lambda used only after training, and `scale = lambda x, k: x * k` in the step: nothing to say."""
    body = """
    to_np = lambda x: x.detach().cpu().numpy()
    scale = lambda x, k: x * k

    def train(model, loader, opt):
        for x in loader:
            loss = model(scale(x.cuda(non_blocking=True), 2))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return to_np(loss)
    """
    assert default(body) == [], default(body)


# -- a host tensor kept as a plain attribute, copied in forward
def test_a_host_table_a_helper_builds_in_init_and_forward_copies_is_a_per_step_copy():
    """`self.anchors, self.valid_mask = self._generate_anchors()` in __init__ (the helper's `device='cpu'`
    default), `self.anchors.to(memory.device)` in forward (RT-DETR's decoder): a plain attribute does not move
    with the module, so each forward copies it from pageable memory."""
    body = """
    class Decoder(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.anchors, self.valid_mask = self._generate_anchors(n)

        def _generate_anchors(self, n, device="cpu"):
            anchors = torch.arange(n, dtype=torch.float32).to(device)
            return anchors, anchors > 0

        def forward(self, memory):
            anchors, valid = self.anchors.to(memory.device), self.valid_mask.to(memory.device)
            return memory * valid + anchors
    """
    assert ("GB010", 12) in default(body), default(body)


def test_a_device_default_passed_on_by_name_keeps_its_value():
    """`sample_affine(p, n)` leaves `device="cpu"` and hands it on (`scale_mat(s, device=device)`): the
    matrices are host tensors, and writing host values into them copies nothing (stylegan2's augment)."""
    body = """
    def scale_mat(s, device="cpu"):
        mat = torch.eye(3, device=device).unsqueeze(0).repeat(s.shape[0], 1, 1)
        mat[:, 0, 0] = s
        return mat

    def sample_affine(n, device="cpu"):
        s = torch.empty(n, device=device).log_normal_()
        return scale_mat(s, device=device)

    def train(model, loader, opt):
        for x in loader:
            g = sample_affine(x.shape[0])
            loss = model(x.cuda(non_blocking=True), g.cuda(non_blocking=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    assert not [f for f in default(body) if f[1] == 4], default(body)


def test_buffers_parameters_and_device_attributes_moved_in_forward_are_quiet():
    """A registered buffer, an nn.Parameter, an attribute made on the device, or one a forward caches after
    its first copy: `.to(x.device)` of each copies nothing per step."""
    body = """
    class Decoder(nn.Module):
        def __init__(self, n, device):
            super().__init__()
            self.register_buffer("anchors", torch.ones(n))
            self.scale = nn.Parameter(torch.ones(n))
            self.table = torch.arange(n, device=device)
            self.grid = None

        def forward(self, x):
            if self.grid is None:
                self.grid = torch.ones(4).to(x.device)
            a = self.anchors.to(x.device) + self.scale.to(x.device)
            return x + a + self.table.to(x.device) + self.grid.to(x.device)
    """
    assert default(body) == [], default(body)


# -- a project decorator on a hot function
def test_the_wrapper_of_a_project_decorator_on_a_hot_function_is_hot():
    """`@partial(cast_torch_tensor, cast_fp16=True) def forward` (imagen-pytorch's trainer): the decorator's
    `inner` runs on every call, so its copies of the arguments are per-step code, reported with the chain."""
    body = """
    from functools import partial, wraps

    def cast_torch_tensor(fn, cast_fp16=False):
        @wraps(fn)
        def inner(model, *args, **kwargs):
            args = [torch.from_numpy(a).to(model.device) for a in args]
            return fn(model, *args, **kwargs)
        return inner

    class Trainer:
        @partial(cast_torch_tensor, cast_fp16=True)
        def forward(self, x):
            return self.model(x)

    def train(opt, loader):
        trainer = Trainer()
        for x in loader:
            loss = trainer.forward(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    assert lint_chain(body) == [("GB001", 7, ["train.py:19", "train.py:13"])], lint_chain(body)


def test_a_project_decorator_on_a_cold_function_and_torch_decorators_are_quiet():
    """The same decorator on a function only called after training, and `@torch.no_grad()` on the hot one:
    nothing runs per step that syncs."""
    body = """
    def to_device(fn):
        def inner(*args):
            return fn(*[torch.from_numpy(a).cuda() for a in args])
        return inner

    @to_device
    def evaluate(model, x):
        return model(x)

    @torch.no_grad()
    def ema_update(ema, model):
        for p, q in zip(ema.parameters(), model.parameters()):
            p.mul_(0.99).add_(q, alpha=0.01)

    def train(model, ema, opt, loader, data):
        for x in loader:
            loss = model(x.cuda(non_blocking=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            ema_update(ema, model)
        return evaluate(model, data)
    """
    assert default(body) == [], default(body)


# -- the files a run checks
def test_a_file_named_inside_a_folder_also_named_is_checked_once(tmp_path, capsys):
    """`gobrrr lint DIR DIR/loop.py` (and `./DIR/loop.py`): one file, one finding, not two of each."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "loop.py").write_text("import torch\n\ndef train(model, opt, loader):\n    for x in loader:\n"
                               "        loss = model(x.cuda(non_blocking=True))\n        opt.zero_grad()\n"
                               "        loss.backward()\n        opt.step()\n        print(loss.item())\n")
    files, _, _ = python_files([d, d / "loop.py", tmp_path / "proj" / "." / "loop.py"])
    assert files == [d / "loop.py"]
    assert len(lint_paths([d, d / "loop.py"])) == 1
    main([str(d), str(d / "loop.py")])
    out = capsys.readouterr().out
    assert "1 finding in 1 file" in out, out
