"""gobrrr lint, issue 29's round 69 on heldout122-125's first sights (stylegan3, Pointcept, hqq, MARL-code-pytorch;
F5-TTS, dinov2, mamba, omnisafe; StyleTTS2, efficientvit, LLMLingua, Reinforcement-Implementation; Open-Sora,
Swin-Transformer, chronos-forecasting, BenchMARL), and the neighbours the judged corpus showed each rule must keep."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules

_MODULES = """
    import torch
    from torch import nn


    class Attention(nn.Module):
        def __init__(self, processor, dim, heads=8):
            super().__init__()
            self.heads = heads
            self.to_k = nn.Linear(dim, dim)
            self.processor = processor

        def forward(self, x, mask=None, rope=None):
            return self.processor(self, x, mask=mask, rope=rope)


    class AttnProcessor:
        def __call__(self, attn, x, mask=None, rope=None):
            key = attn.to_k(x)
            head_dim = key.shape[-1] // attn.heads
            return key.view(x.shape[0], -1, attn.heads, head_dim)


    class DiTBlock(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.attn = Attention(processor=AttnProcessor(), dim=dim)

        def forward(self, x, t, mask=None, rope=None):
            return self.attn(x + t, mask=mask, rope=rope)
    """

_DIT = """
    import torch
    from torch import nn

    from modules import DiTBlock


    class DiT(nn.Module):
        def __init__(self, dim, depth):
            super().__init__()
            self.blocks = nn.ModuleList([DiTBlock(dim) for _ in range(depth)])

        def forward(self, x, t, mask=None, rope=None):
            for block in self.blocks:
                x = block(x, t, mask=mask, rope=rope)
            return x


    def train(loader):
        model = DiT(16, 4).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for x, t in loader:
            x, t = x.cuda(non_blocking=True), t.cuda(non_blocking=True)
            loss = model(x, t).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            print(loss.item())
    """


def test_a_block_called_with_keywords_runs_a_modules_forward_not_a_processors_call(tmp_path):
    """F5-TTS: `x = block(x, t, mask=mask, rope=rope)` over a ModuleList of DiTBlocks built in another file. The
    lint, not knowing the block's class, takes the defs whose parameters accept both keywords. The attention
    processor's `__call__(self, attn, x, mask, rope)` accepts them too, and bound so, `attn` would be the hidden
    states and `attn.heads` a device tensor: fourteen false `a tensor as a count or size` findings on
    `head_dim = inner_dim // attn.heads`. A module's forward that takes the keywords is what a called block runs;
    a `__call__` is taken only when no forward does (EDM's `loss_fn(net=ddp, images=x, labels=y)`)."""
    found = project_rules(tmp_path, {"modules.py": _MODULES, "dit.py": _DIT})
    assert not [f for f in found if f[0] == "modules.py"], found
    read = line_of(textwrap.dedent(_DIT), "print(loss.item())")
    assert ("dit.py", read, "GB002") in found, found   # the loop's own read is still reported


def test_a_size_made_from_a_parameter_the_def_binds_again_is_its_own():
    """F5-TTS's `lens_to_mask(t, length=None)`: `if length is None: length = t.amax()`, then
    `torch.arange(length, device=t.device)`. A size read from a parameter is left out (its kind is the caller's
    guess), but one the def binds again from a call of its own is no guess: the arange reads a device scalar per
    call. A parameter only read stays left out."""
    src = textwrap.dedent("""
        import torch

        def lens_to_mask(t, length=None):
            if length is None:
                length = t.amax()
            seq = torch.arange(length, device=t.device)
            return seq[None, :] < t[:, None]

        def trusted(t, length=None):
            seq = torch.arange(length, device=t.device)
            return seq[None, :] < t[:, None]

        def train(model, loader, opt):
            for x, lens in loader:
                x, lens = x.cuda(non_blocking=True), lens.cuda(non_blocking=True)
                loss = model(x, lens_to_mask(lens), trusted(lens, lens.amax())).mean()
                loss.backward()
                opt.step()
        """)
    found = rules(src)
    assert (line_of(src, "seq = torch.arange(length"), "GB002") in found, found
    assert len([f for f in found if f[1] == "GB002"]) == 1, found


def test_a_helper_that_pads_host_rows_returns_host_data():
    """F5-TTS's `list_str_to_idx`: `pad_sequence([torch.tensor(ids) for ids in texts], ...)` is built on the host,
    so the step's `list_str_to_idx(text).to(device)` is a blocking copy of pageable memory (GB010), like a helper
    that returns `torch.tensor(...)`."""
    src = textwrap.dedent("""
        import torch
        from torch.nn.utils.rnn import pad_sequence

        def to_idx(texts, vocab):
            rows = [torch.tensor([vocab.get(c, 0) for c in t]) for t in texts]
            return pad_sequence(rows, padding_value=-1, batch_first=True)

        def train(model, loader, opt, vocab):
            device = torch.device("cuda")
            for x, texts in loader:
                x = x.to(device, non_blocking=True)
                ids = to_idx(texts, vocab).to(device)
                loss = model(x, ids).mean()
                loss.backward()
                opt.step()
        """)
    assert (line_of(src, "ids = to_idx(texts, vocab).to(device)"), "GB010") in rules(src)


def test_a_name_bound_to_one_of_two_functions_runs_both(tmp_path):
    """Open-Sora's trainer: `prepare = prepare_causal if ... else prepare_uncausal` (an if statement) in main, and
    a def nested in main calls `prepare(x)` every step. Each branch's function runs per step, and both build
    `torch.zeros(...).to(x.device)` on the host (GB001)."""
    utils = """
        import torch

        def prepare_causal(x):
            masks = torch.zeros(x.shape[0], 4).to(x.device, x.dtype)
            return x * masks.sum()

        def prepare_uncausal(x):
            masks = torch.zeros(x.shape[0], 4).to(x.device, x.dtype)
            return x + masks.sum()
        """
    train = """
        import torch

        from utils import prepare_causal, prepare_uncausal

        def main(cfg, loader, model, opt):
            device = torch.device("cuda")
            if cfg.causal:
                prepare = prepare_causal
            else:
                prepare = prepare_uncausal

            def prepare_inputs(batch):
                return prepare(batch.to(device, non_blocking=True))

            for batch in loader:
                loss = model(prepare_inputs(batch)).mean()
                loss.backward()
                opt.step()
        """
    found = project_rules(tmp_path, {"utils.py": utils, "train.py": train})
    assert [f for f in found if f[0] == "utils.py"] == [("utils.py", 5, "GB001"), ("utils.py", 9, "GB001")], found


def test_a_projects_own_math_module_is_not_pythons(tmp_path):
    """Open-Sora's layers: `import math` for `math.log(period)` beside `from .math import attention, rope`. The
    project's `attention(q, k, v)` is not Python's math reading a tensor with float(); `math.sqrt(t)` still is."""
    layers = """
        import math

        import torch

        from .math import attention

        def block(q, k, v, t):
            out = attention(q, k, v)
            scale = math.sqrt(t.sum())
            return out * scale

        def train(loader, opt, model):
            for q in loader:
                q = q.cuda(non_blocking=True)
                loss = block(q, q, q, model(q)).mean()
                loss.backward()
                opt.step()
        """
    own = """
        import torch

        def attention(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        """
    found = project_rules(tmp_path, {"pkg/layers.py": layers, "pkg/math.py": own, "pkg/__init__.py": ""})
    assert found == [("layers.py", 10, "GB002")], found


def test_a_host_parameter_another_object_keeps_is_read_on_the_host(tmp_path):
    """omnisafe's Lagrange keeps its multiplier as `self.lagrangian_multiplier: torch.nn.Parameter =
    torch.nn.Parameter(torch.as_tensor(init))`, never moved: a CPU tensor. The PPO-Lag step reads it through the
    object it built, `self._lagrange.lagrangian_multiplier.item()`, which waits for nothing (ten false findings at
    first sight). The attribute's only assignment is annotated, and a Parameter lives where its data does."""
    lagrange = """
        import torch

        class Lagrange:
            def __init__(self, cost_limit, init):
                self.cost_limit = cost_limit
                self.lagrangian_multiplier: torch.nn.Parameter = torch.nn.Parameter(
                    torch.as_tensor(max(init, 0.0)), requires_grad=True)
        """
    ppo = """
        import torch

        from lagrange import Lagrange

        class PPOLag:
            def __init__(self, model, cfg):
                self.device = torch.device("cuda")
                self.model = model.to(self.device)
                self.opt = torch.optim.Adam(self.model.parameters())
                self._lagrange = Lagrange(cfg.limit, 0.001)
                self.scale = torch.nn.Parameter(torch.ones(1, device=self.device))

            def learn(self, loader):
                for obs, adv_r, adv_c in loader:
                    obs = obs.to(self.device, non_blocking=True)
                    penalty = self._lagrange.lagrangian_multiplier.item()
                    loss = (self.model(obs) * (adv_r - penalty * adv_c)).mean()
                    self.opt.zero_grad()
                    loss.backward()
                    self.opt.step()
                    print(self.scale.item())
        """
    found = project_rules(tmp_path, {"lagrange.py": lagrange, "ppo.py": ppo})
    assert found == [("ppo.py", 22, "GB002")], found   # the device Parameter's read stays


def test_a_dict_made_of_the_batch_is_the_batch():
    """efficientvit's trainer: `feed_dict = {"data": images, "label": labels}` from the loader's batch, then
    `before_step(feed_dict)` copies `feed_dict["data"].cuda()` without non_blocking: a blocking copy of per-step
    data (GB009), as `images.cuda()` would be. A dict of device tensors stays a container of device tensors."""
    src = textwrap.dedent("""
        import torch

        class Trainer:
            def __init__(self, model, loader):
                self.model = model.cuda()
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
                self.loader = loader

            def before_step(self, feed_dict):
                images = feed_dict["data"].cuda()
                labels = feed_dict["label"].cuda()
                return {"data": images, "label": labels}

            def train_one_epoch(self):
                for images, labels in self.loader:
                    feed_dict = self.before_step({"data": images, "label": labels})
                    loss = self.model(feed_dict["data"]).mean()
                    self.opt.zero_grad()
                    loss.backward()
                    self.opt.step()
        """)
    found = rules(src)
    assert found == [(line_of(src, 'images = feed_dict["data"]'), "GB009"),
                     (line_of(src, 'labels = feed_dict["label"]'), "GB009")], found


def test_a_device_length_minus_one_is_a_slice_bound():
    """StyleTTS2's duration loss: `for pred, n in zip(d, input_lengths):` over device lengths, then
    `pred[1:n - 1]`: the bound is a device scalar read with __index__ per utterance, as `pred[:n]` is. So is
    the deprecated `torch.range(0, k).long().cuda()` of DN-DETR and DINO a tensor built on the host (GB001)."""
    src = textwrap.dedent("""
        import torch
        import torch.nn.functional as F

        def train(model, loader, opt, device):
            for texts, lengths in loader:
                texts = texts.to(device, non_blocking=True)
                lengths = lengths.to(device, non_blocking=True)
                d = model(texts)
                loss = 0
                for pred, n in zip(d, lengths):
                    loss += F.l1_loss(pred[1:n - 1], pred[1:3])
                idx = torch.range(0, 4).long().cuda()
                opt.zero_grad()
                (loss + d[idx].sum()).backward()
                opt.step()
        """)
    found = rules(src)
    assert (line_of(src, "pred[1:n - 1]"), "GB002") in found, found
    assert (line_of(src, "torch.range(0, 4)"), "GB001") in found, found


def test_a_pipelines_own_attribute_is_not_its_models_buffer():
    """chronos: the model registers a buffer `quantiles` (declared `self.quantiles: torch.Tensor` first), while the
    pipeline class of the same file has a property `quantiles` that returns the config's list. In the pipeline,
    `set(levels).issubset(self.quantiles)` and `min(levels) < min(self.quantiles)` are Python comparisons (seven
    false findings at first sight). Inside the module, `self.quantiles` is still the buffer."""
    src = textwrap.dedent("""
        import torch
        from torch import nn

        class Model(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.cfg = cfg
                self.quantiles: torch.Tensor
                self.register_buffer("quantiles", torch.tensor(cfg.quantiles))
                self.lin = nn.Linear(4, 4)

            def forward(self, x):
                if self.quantiles.sum() > 1:
                    x = x * 2
                return self.lin(x)

        class Pipeline:
            def __init__(self, model):
                self.model = model

            @property
            def quantiles(self):
                return self.model.cfg.quantiles

            def predict_quantiles(self, inputs, quantile_levels=[0.1, 0.5, 0.9]):
                training = self.quantiles
                preds = [self.model(x.to("cuda", non_blocking=True)) for x in inputs]
                if set(quantile_levels).issubset(set(training)):
                    return preds
                if min(quantile_levels) < min(training):
                    print("out of range")
                return preds

        def evaluate(pipeline, batches):
            for batch in batches:
                print(len(pipeline.predict_quantiles(batch)))
        """)
    assert rules(src) == [(line_of(src, "if self.quantiles.sum() > 1"), "GB007")], rules(src)


def test_a_plain_class_that_registers_its_own_buffers_keeps_them_on_the_device(tmp_path):
    """The neighbour of the chronos rule, which the judged corpus showed it must keep: LDM's DDIMSampler is a plain
    class whose own `register_buffer` moves its tables to the GPU, so `torch.full(..., self.ddim_alphas[index])` in
    its sampling loop reads a device fill value (39 true lines in seven LDM-derived repositories, lost when `self.x`
    buffers were taken only inside torch modules)."""
    sampler = """
        import torch

        class DDIMSampler:
            def __init__(self, model):
                self.model = model

            def register_buffer(self, name, attr):
                setattr(self, name, attr.to(torch.device("cuda")))

            def make_schedule(self, alphas):
                self.register_buffer("ddim_alphas", alphas)

            def sample(self, x, steps):
                for index in range(steps):
                    a_t = torch.full((x.shape[0], 1), self.ddim_alphas[index], device=x.device)
                    x = self.model(x) * a_t
                return x

        def run(model, loader, sampler):
            for x in loader:
                x = x.cuda(non_blocking=True)
                sampler.sample(model(x), 10).sum().backward()
        """
    assert project_rules(tmp_path, {"ddim.py": sampler}) == [("ddim.py", 16, "GB002")]
