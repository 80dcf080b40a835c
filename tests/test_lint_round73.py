"""gobrrr lint, issue 29's round 73 on heldout138-141's first sights (pytorch/examples, awd-lstm-lm, waveglow, pygcn;
SimCLR, transformer-xl, deepspeech.pytorch, MS-G3D; simsiam, OpenNMT-py, SPADE, Image_Segmentation;
pytorch-cifar100, OpenNRE, pytorch-tutorial, byol-pytorch), and the neighbours each rule must keep quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_a_loop_over_one_items_chunks_leaves_the_item_loop_a_step_loop():
    """A renderer's per-image loop (`for pose in poses:`) holding `for j in range(0, rays.shape[0], chunk)` over that
    image's rays (and OpenNMT's truncated-BPTT loop over one batch's target): the chunks are pieces of one step,
    so the image loop is still a step loop and its per-image read-back is per step. A loop whose inner range ends
    at a size not made from its item (an epoch loop around `range(0, len(data), bs)` batches) stays an outer loop."""
    src = textwrap.dedent("""
        import torch


        def render_path(poses, model, chunk):
            model.cuda()
            imgs = []
            for i, pose in enumerate(poses):
                rays = torch.randn(1000, 6, device="cuda") @ pose
                outs = []
                for j in range(0, rays.shape[0], chunk):
                    outs.append(model(rays[j:j + chunk]))
                rgb = torch.cat(outs)
                imgs.append(rgb.cpu().numpy())
            return imgs


        def train(data, model, opt, bs, epochs):
            model.cuda()
            for epoch in range(epochs):
                for i in range(0, len(data), bs):
                    loss = model(data[i:i + bs].cuda(non_blocking=True)).sum()
                    loss.backward()
                    opt.step()
                val = model(data[:bs].cuda(non_blocking=True))
                print(val.sum().item())
    """)
    found = rules(src)
    assert (line_of(src, "imgs.append(rgb.cpu().numpy())"), "GB002") in found
    assert not [r for r in found if r[0] == line_of(src, "print(val.sum().item())")]


def test_a_def_that_only_walks_its_arguments_in_chunks_is_one_steps_work():
    """nerf's `batchify_rays(rays_flat, chunk)` (`for i in range(0, rays_flat.shape[0], chunk)`), called through
    `render(...)` once per pose of `render_path`: the pose loop is the step loop, and its `rgb.cpu()` per pose is
    per step, not the read of an outer loop around a sampler."""
    src = textwrap.dedent("""
        import torch


        def batchify_rays(rays_flat, model, chunk=1024):
            all_ret = []
            for i in range(0, rays_flat.shape[0], chunk):
                all_ret.append(model(rays_flat[i:i + chunk]))
            return torch.cat(all_ret, 0)


        def render(rays, model, chunk):
            return batchify_rays(rays, model, chunk)


        def render_path(render_poses, model, chunk):
            model.cuda()
            rgbs = []
            for i, c2w in enumerate(render_poses):
                rays = torch.randn(100, 6, device="cuda") @ c2w
                rgb = render(rays, model, chunk)
                rgbs.append(rgb.cpu().numpy())
            return rgbs
    """)
    assert (line_of(src, "rgbs.append(rgb.cpu().numpy())"), "GB002") in rules(src)


def test_a_loader_kept_in_a_dict_under_a_variable_key_yields_host_batches():
    """MS-G3D's evaluation: `for ln in loader_name: process = tqdm(self.data_loader[ln])`, then
    `data.float().cuda(self.output_device)` per batch: a blocking copy of a host batch, as for
    `self.data_loader['train']`."""
    src = textwrap.dedent("""
        import torch
        from tqdm import tqdm


        class Processor:
            def __init__(self, model, loaders):
                self.model = model.cuda()
                self.data_loader = loaders

            def eval(self, loader_name):
                with torch.no_grad():
                    for ln in loader_name:
                        process = tqdm(self.data_loader[ln])
                        for batch_idx, (data, label) in enumerate(process):
                            data = data.float().cuda()
                            output = self.model(data)
    """)
    assert (line_of(src, "data = data.float().cuda()"), "GB009") in rules(src)


def test_a_model_handed_to_a_framework_and_wrapped_in_data_parallel_runs_its_forward(tmp_path):
    """OpenNRE: `framework = opennre.framework.BagRE(model=model, ...)` with `model = opennre.model.BagAttention(...)`
    (a subpackage the package's `__init__` does not import), `self.model = nn.DataParallel(model)` in the framework,
    and the batch moved under `if torch.cuda.is_available():`. `self.model(label, scope, ...)` runs BagAttention's
    forward with the moved scope, whose `scope[0][0]` bounds a slice: a read-back every step."""
    files = {
        "opennre/__init__.py": "import logging\n",
        "opennre/model/__init__.py": "from .bag import Bag\n",
        "opennre/model/bag.py": """
            import torch


            class Bag(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = torch.nn.Linear(4, 4)

                def forward(self, label, scope, token, bag_size=0):
                    if bag_size > 0:
                        token = token.view(-1, token.size(-1))
                    else:
                        begin, end = scope[0][0], scope[-1][1]
                        token = token[:, begin:end, :].view(-1, token.size(-1))
                    return self.fc(token)
        """,
        "opennre/framework/__init__.py": "from .bag_re import BagRE\n",
        "opennre/framework/bag_re.py": """
            import torch
            from torch import nn


            class BagRE(nn.Module):
                def __init__(self, model, loader, bag_size=0):
                    super().__init__()
                    self.model = nn.DataParallel(model)
                    self.loader = loader
                    self.bag_size = bag_size
                    self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
                    self.cuda()

                def train_model(self):
                    for epoch in range(3):
                        for data in self.loader:
                            if torch.cuda.is_available():
                                for i in range(len(data)):
                                    try:
                                        data[i] = data[i].cuda()
                                    except:
                                        pass
                            label, scope, args = data[0], data[1], data[2:]
                            logits = self.model(label, scope, *args, bag_size=self.bag_size)
                            logits.sum().backward()
                            self.opt.step()
        """,
        "example/train_bag.py": """
            import opennre

            model = opennre.model.Bag()
            framework = opennre.framework.BagRE(model=model, loader=[])
            framework.train_model()
        """,
    }
    found = project_rules(tmp_path, files)
    bag = textwrap.dedent(files["opennre/model/bag.py"])
    assert ("bag.py", line_of(bag, "token = token[:, begin:end, :]"), "GB002") in found


def test_a_def_walked_first_with_device_tensors_is_walked_again_for_an_untyped_caller():
    """mbrl-lib: the model env's `sample(...)` reaches `_get_model_input(obs, action)` first with a device action;
    the trainer's `_process_batch(batch)` reaches it later with the arrays of a replay buffer (kinds unknown), whose
    `to_tensor(action).to(device)` is a blocking copy every update. A def walked with device tensors is walked again
    once when a later call says nothing of any of those parameters."""
    src = textwrap.dedent("""
        import numpy as np
        import torch


        def to_tensor(x):
            if isinstance(x, np.ndarray):
                return torch.from_numpy(x)
            return x


        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(4, 4)
                self.device = "cuda"

            def _get_model_input(self, obs, action):
                obs = to_tensor(obs).to(self.device)
                action = to_tensor(action).to(self.device)
                return torch.cat([obs, action], -1)

            def sample(self, obs, act):
                return self.net(self._get_model_input(obs, act))

            def update(self, obs_np, act_np):
                return self.net(self._get_model_input(obs_np, act_np)).sum()


        def run(opt, steps, buffer):
            model = Model().cuda()
            obs = torch.zeros(4, 2, device="cuda")
            for step in range(steps):
                act = torch.randn(4, 2, device="cuda")
                nxt = model.sample(obs, act)
                obs_np, act_np = buffer.sample_arrays()
                loss = model.update(obs_np, act_np)
                loss.backward()
                opt.step()
    """)
    assert (line_of(src, "action = to_tensor(action).to(self.device)"), "GB010") in rules(src)


def test_ctrl_c_ends_a_command_with_one_line(monkeypatch, capsys):
    """A lint of a large checkout stopped with Ctrl-C printed a KeyboardInterrupt traceback from inside the parser;
    any command that does not handle the interrupt itself now ends with one line on stderr and 130, as a shell
    reports SIGINT."""
    from gobrrr import cli

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", interrupted)
    assert cli.main(["lint", "."]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "gobrrr: interrupted" and "Traceback" not in err
