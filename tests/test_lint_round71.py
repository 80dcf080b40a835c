"""gobrrr lint, issue 29's round 71 on heldout130-133's first sights (whisper, GraphGPS, torch-ngp, moco-v3;
BigVGAN, iTransformer, dlrm, segment-anything; GPT-SoVITS, LTSF-Linear, GraphGym, ConvNeXt-V2; audiocraft,
barlowtwins, TimeMixer, mip-splatting), and the neighbours each rule must keep quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules

_BASE = """
    import torch


    class TensorBase(torch.nn.Module):
        def __init__(self, device):
            super().__init__()
            self.matMode = [[0, 1], [0, 2], [1, 2]]
            self.vecMode = [2, 1, 0]
            self.planes = torch.nn.Parameter(torch.randn(3, 16, device=device))
    """

_VM = """
    import torch
    from base import TensorBase


    class TensorVM(TensorBase):
        def forward(self, xyz):
            plane = torch.stack((xyz[..., self.matMode[0]], xyz[..., self.matMode[1]]))
            line = xyz[..., self.vecMode]
            return plane.sum() + line.sum() + self.planes.sum()


    def train(loader, opt):
        model = TensorVM("cuda").cuda()
        for xyz in loader:
            loss = model(xyz.cuda(non_blocking=True))
            loss.backward()
            opt.step()
    """


def test_a_list_of_ints_a_class_or_its_base_keeps_is_a_host_index(tmp_path):
    """TensoRF: `self.matMode = [[0, 1], [0, 2], [1, 2]]` set in the base class, then `xyz[..., self.matMode[0]]`
    in every density query: each Python list is copied to the device to index, blocking. An attribute the
    class sets to a device tensor of positions indexes on the device: quiet."""
    found = project_rules(tmp_path, {"base.py": _BASE, "vm.py": _VM})
    vm = textwrap.dedent(_VM)
    assert ("vm.py", line_of(vm, "plane = torch.stack"), "GB011") in found
    assert ("vm.py", line_of(vm, "line = xyz[..., self.vecMode]"), "GB011") in found
    on_device = _BASE.replace("self.vecMode = [2, 1, 0]", "self.vecMode = torch.tensor([2, 1, 0], device=device)")
    found = project_rules(tmp_path / "dev", {"base.py": on_device, "vm.py": _VM})
    assert ("vm.py", line_of(vm, "line = xyz[..., self.vecMode]"), "GB011") not in found


def test_a_renderers_visibility_filter_is_a_boolean_mask():
    """3D Gaussian splatting (mip-splatting and its siblings): `visibility_filter = render_pkg["visibility_filter"]`
    (the rasterizer's `radii > 0`), then `max_radii2D[visibility_filter]` every densifying step: a read through a
    device boolean mask. `render_pkg["radii"]` is no mask: indexing with it gathers on the device, quiet."""
    src = textwrap.dedent("""
        import torch
        from gaussian_renderer import render


        def train(gaussians, cameras, opt, iterations):
            background = torch.zeros(3, device="cuda")
            for iteration in range(iterations):
                render_pkg = render(cameras[iteration % len(cameras)], gaussians, background)
                image, visibility_filter, radii = render_pkg["render"], render_pkg["visibility_filter"], render_pkg["radii"]
                loss = image.mean()
                loss.backward()
                seen = radii[visibility_filter]
                gaussians.max_radii2D[visibility_filter] = torch.max(gaussians.max_radii2D[visibility_filter], seen)
                picked = image[render_pkg["radii"]]
                opt.step()
    """)
    found = rules(src)
    assert (line_of(src, "gaussians.max_radii2D[visibility_filter] ="), "GB008") in found
    assert not [r for r in found if r[0] == line_of(src, "picked = image[")]


def test_a_param_groups_filter_flag_is_no_mask():
    """Barlow Twins' LARS: `if not g['weight_decay_filter'] or not self.exclude_bias_and_norm(p):` tests an
    option of a param group, a Python bool: a key named `*_filter` is a mask only in a dict a call returned."""
    src = textwrap.dedent("""
        import torch


        class LARS(torch.optim.Optimizer):
            @torch.no_grad()
            def step(self):
                for g in self.param_groups:
                    for p in g['params']:
                        dp = p.grad
                        if not g['weight_decay_filter'] or p.ndim != 1:
                            dp = dp.add(p, alpha=g['weight_decay'])
                        p.add_(dp, alpha=-g['lr'])


        def train(loader, model):
            opt = LARS(model.parameters(), dict(lr=0.1, weight_decay=1e-6, weight_decay_filter=True))
            for x in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()
    """)
    assert not [r for r in rules(src) if r[1] == "GB007"]


def test_the_mask_a_call_of_device_tensors_hands_back_is_a_mask():
    """GraphGPS's GPS layer: `h_dense, mask = to_dense_batch(h, batch.batch)` then `attn(h_dense)[mask]`, a read
    through a device boolean mask in every layer. The other names of the tuple stay unknown: `h_dense[lengths]`
    with `lengths` is not taken for a mask."""
    src = textwrap.dedent("""
        import torch
        from torch_geometric.utils import to_dense_batch


        def train(loader, model, attn, opt):
            for data in loader:
                data = data.to("cuda", non_blocking=True)
                h = model(data.x)
                h_dense, mask = to_dense_batch(h, data.batch)
                h = attn(h_dense)[mask]
                padded, lengths = to_dense_batch(h, data.batch)
                rows = padded[lengths]
                loss = h.mean() + rows.mean()
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    assert (line_of(src, "h = attn(h_dense)[mask]"), "GB008") in found
    assert not [r for r in found if r[0] == line_of(src, "rows = padded[lengths]")]


def test_a_def_with_parameters_handed_to_a_checkpoint_is_not_walked_blind():
    """Megatron's attention: `def custom_forward(*inputs): ... attn_mask_type.item()`, handed to the project's
    `checkpoint(custom_forward, False, *inputs)` with the mask type as a host tensor. Round 70 walks a def handed to
    a helper that calls it, but only a closure of no parameters, whose inputs the def around it knows; one that
    takes the helper's arguments is left to the helper's own call (quiet here, not a `.item()` of a device value)."""
    src = textwrap.dedent("""
        import torch


        def checkpoint(function, distribute, *args):
            return function(*args)


        def forward_block(layer, hidden, mask_type):
            def custom_forward(*inputs):
                x, kind = inputs
                code = kind.item()
                return layer(x) * code
            checkpoint_inputs = [hidden, torch.tensor([mask_type], dtype=torch.int)]
            return checkpoint(custom_forward, False, *checkpoint_inputs)


        def train(loader, layer, opt):
            for x in loader:
                loss = forward_block(layer, x.cuda(non_blocking=True), 1).mean()
                loss.backward()
                opt.step()
    """)
    assert not [r for r in rules(src) if r[0] == line_of(src, "code = kind.item()")]


def test_a_file_of_python_312_type_parameters_gets_one_line_that_says_so(tmp_path):
    """lerobot's `def deserialize_json_into_object[T: JsonLike](fpath, obj: T) -> T:` and `class
    DataProcessorPipeline[TInput, TOutput]:` are Python 3.12 syntax. Under 3.11 the lint cannot parse the file; the
    one line says which syntax and what to do (run under 3.12, or --exclude), not a bare `expected '('`; the rest
    of the project is still checked. Under 3.12 and newer the file parses and nothing is said."""
    import subprocess
    import sys

    (tmp_path / "io_utils.py").write_text("def load[T](path, obj: T) -> T:\n    return obj\n")
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch


        def train(loader, model, opt):
            for x in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()
                print(loss.item())
    """))
    run = subprocess.run([sys.executable, "-m", "gobrrr", "lint", str(tmp_path)], capture_output=True, text=True)
    assert "Traceback" not in run.stderr and "GB002" in run.stdout
    if sys.version_info < (3, 12):
        assert run.returncode == 2 and run.stderr.count("cannot check this file") == 1
        assert "io_utils.py:1: cannot check this file: it uses Python 3.12 syntax (type parameters)" in run.stderr
        assert "--exclude" in run.stderr
    else:
        assert "cannot check this file" not in run.stderr
