"""gobrrr lint, issue 29's round 64 on heldout82-83's first sights (ResShift, votenet, llm-awq): each firing test
beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_next_of_a_loader_kept_in_a_dict_by_key_draws_a_batch():
    """ResShift keeps an endless wrapper of each DataLoader in `self.dataloaders = {'train': ...}` and takes each
    step's batch with `next(self.dataloaders['train'])`, handed to `prepare_data`, whose `.cuda()` calls copy it
    without non_blocking. `next()` of a subscripted dict was of no known kind, so the batch was not a batch. An
    item of a dict named for loaders is a loader; `next()` of it is a batch. `next()` of a dict of counters
    (`next(self.counters['train'])`) stays unknown."""
    src = textwrap.dedent("""
        import torch
        import torch.utils.data as udata

        def _wrap_loader(loader):
            while True:
                yield from loader

        class Trainer:
            def build(self, ds):
                self.dataloaders = {'train': _wrap_loader(udata.DataLoader(ds, batch_size=8, pin_memory=True))}
                self.counters = {'train': iter(range(10 ** 9))}

            def prepare_data(self, data):
                return {key: value.cuda() for key, value in data.items()}

            def train(self, model, opt):
                for ii in range(1000):
                    data = self.prepare_data(next(self.dataloaders['train']))
                    step = torch.tensor(next(self.counters['train'])).cuda()
                    loss = model(data['lq'], step).mean()
                    loss.backward()
                    opt.step()
        """)
    found = rules(src)
    assert (line_of(src, "value.cuda()"), "GB009") in found, found
    assert not any(r == "GB009" and line == line_of(src, "counters['train'])).cuda()") for line, r in found), found


def test_a_module_imported_by_a_run_time_name_runs_the_projects_functions_of_that_name(tmp_path):
    """votenet picks its network with `MODEL = importlib.import_module(FLAGS.model)` and steps with `criterion =
    MODEL.get_loss` at module level, so the loss's per-call `torch.zeros(...).cuda()` was never reached: the
    module had no known file. An attribute of such a module runs the project's functions of that name (defined
    or imported in its modules, at most four)."""
    found = project_rules(tmp_path, {
        "loss_helper.py": """
            import torch

            def get_loss(end_points):
                mask = torch.zeros(end_points['scores'].shape[:2]).cuda()
                return (end_points['scores'] * mask).mean()
            """,
        "votenet.py": """
            import torch
            from loss_helper import get_loss

            class VoteNet(torch.nn.Module):
                def forward(self, x):
                    return {'scores': x}
            """,
        "train.py": """
            import importlib
            import torch

            MODEL = importlib.import_module('votenet')
            net = MODEL.VoteNet().cuda()
            criterion = MODEL.get_loss

            def train_one_epoch(loader, opt):
                for batch in loader:
                    end_points = net(batch['x'].cuda(non_blocking=True))
                    loss = criterion(end_points)
                    loss.backward()
                    opt.step()
            """})
    assert ("loss_helper.py", 5, "GB001") in found, found


def test_a_layer_taken_from_the_list_then_moved_to_the_device_makes_a_step_loop():
    """AWQ's search takes `layer = layers[i]` and then `layer = layer.cuda()`, runs the calibration inputs
    through it, searches scales (one `.item()` per candidate) and moves it back: round 63 knew only
    `layers[i].to(dev)` in one expression, so the loop stayed an outer loop (llm-awq 36% at first sight). A layer
    taken from the model's list at the loop's own level and moved there is the same pass. A loop that only takes
    each layer (to read its largest weight, once) is not."""
    src = textwrap.dedent("""
        import torch

        def search(block, x):
            best = float("inf")
            for r in range(20):
                err = (block(x * r) - block(x)).pow(2).mean().item()
                best = min(best, err)
            return best

        @torch.no_grad()
        def run_awq(model, inps):
            layers = model.model.layers
            sizes = []
            for i in range(len(layers)):
                layer = layers[i]
                sizes.append(layer.weight.abs().max().item())
            for i in range(len(layers)):
                layer = layers[i]
                layer = layer.cuda()
                inps = inps.to(next(layer.parameters()).device)
                scale = search(layer, inps)
                inps = layer(inps)[0]
                layer = layer.cpu()
                torch.cuda.empty_cache()
            return sizes
        """)
    found = rules(src, "pre_quant.py")
    assert (line_of(src, "torch.cuda.empty_cache()"), "GB004") in found, found
    assert (line_of(src, ".pow(2).mean().item()"), "GB002") in found, found
    assert not any(line == line_of(src, "abs().max().item()") for line, _ in found), found


def test_a_loop_that_runs_its_samples_through_one_taken_layer_is_a_step_loop():
    """Wanda prunes layer by layer: `layer = layers[i]`, the calibration samples run through it in a loop of
    their own (`outs[j] = layer(inps[j])`), then each of its Linears is pruned (a threshold read back with
    `.cpu()`) and the cache flushed. The sample loop made the layer loop an outer loop, so its per-layer syncs went
    unreported (wanda 28% at first sight). A loop that takes a block of the model's list and runs samples
    through it in an inner loop is a step loop. A model's forward, which runs each block at the loop's own level,
    stays per layer inside the step: its caller is the step loop."""
    src = textwrap.dedent("""
        import torch

        @torch.no_grad()
        def prune_wanda(model, inps, nsamples, ratio):
            layers = model.model.layers
            outs = torch.zeros_like(inps)
            for i in range(len(layers)):
                layer = layers[i]
                for j in range(nsamples):
                    outs[j] = layer(inps[j].unsqueeze(0))[0]
                for name, lin in layer.named_children():
                    w = lin.weight.data
                    thresh = torch.sort(w.abs().flatten())[0][int(w.numel() * ratio)].cpu()
                    w.mul_(w.abs() > thresh.to(w.device))
                inps, outs = outs, inps
                torch.cuda.empty_cache()

        class Net(torch.nn.Module):
            def forward(self, x):
                for i in range(len(self.layers)):
                    layer = self.layers[i]
                    x = layer(x)
                    for k in range(2):
                        x = x + 1
                return x

        def train(net, loader, opt):
            net.cuda()
            for x in loader:
                loss = net(x.cuda(non_blocking=True)).mean()
                loss.backward()
                opt.step()
        """)
    found = rules(src, "prune.py")
    assert (line_of(src, "int(w.numel() * ratio)].cpu()"), "GB002") in found, found
    assert (line_of(src, "torch.cuda.empty_cache()"), "GB004") in found, found
    assert not any(line > line_of(src, "class Net") for line, _ in found), found


def test_a_component_named_in_the_plural_runs_the_classes_of_its_folder(tmp_path):
    """lanedet's Detector builds `self.heads = build_heads(cfg)` from a registry and calls `self.heads.loss(out,
    batch)` every step; its heads live in models/heads/. The folder's key is singular (`head`) and the object's
    was not, so no head's loss was followed (LaneSeg's class weights copied up per step, LaneATT's masks). The
    object's key made singular finds the folder too; LaneCls's loss, which syncs nothing, adds no finding."""
    found = project_rules(tmp_path, {
        "models/heads/lane_seg.py": """
            import torch

            class LaneSeg(torch.nn.Module):
                def loss(self, output, batch):
                    weights = torch.ones(5)
                    weights[0] = 0.4
                    weights = weights.cuda()
                    return torch.nn.functional.nll_loss(output['seg'], batch['mask'], weight=weights)
            """,
        "models/heads/lane_cls.py": """
            import torch

            class LaneCls(torch.nn.Module):
                def loss(self, output, batch):
                    return torch.nn.functional.cross_entropy(output['cls'], batch['cls_label'])
            """,
        "models/nets/detector.py": """
            import torch
            from models.registry import build_heads

            class Detector(torch.nn.Module):
                def __init__(self, cfg):
                    super().__init__()
                    self.heads = build_heads(cfg)

                def forward(self, batch):
                    out = self.heads(batch['img'])
                    return self.heads.loss(out, batch)
            """,
        "models/registry.py": """
            def build_heads(cfg):
                return cfg.build('heads')
            """,
        "runner.py": """
            import torch
            from models.nets.detector import Detector

            def train(cfg, loader, opt):
                net = Detector(cfg).cuda()
                for batch in loader:
                    batch = {k: v.cuda(non_blocking=True) for k, v in batch.items()}
                    loss = net(batch)
                    loss.backward()
                    opt.step()
            """})
    assert ("lane_seg.py", 8, "GB010") in found, found
    assert not any(name == "lane_cls.py" for name, _, _ in found), found


def test_an_agent_of_a_hierarchy_of_ten_runs_each_subclass_update(tmp_path):
    """url_benchmark builds its agent from a config (`self.agent = make_agent(cfg)`, hydra) and calls
    `self.agent.update(...)` each step; DDPGAgent has nine subclasses (APS, DIAYN, ICM, RND, ...), each with its
    own update and metrics read with `.item()`. An object named after a hierarchy of more than eight classes
    pinned none of them (url_benchmark 45% at first sight); one hierarchy of up to twelve is followed now."""
    names = ["DDPG", "APS", "DIAYN", "ICM", "ICMAPT", "Proto", "RND", "SMM", "Disagreement", "AGAC"]
    files = {"agent/ddpg.py": """
            import torch

            class DDPGAgent:
                def update(self, batch):
                    loss = batch.mean()
                    return {'loss': loss}
            """}
    for name in names[1:]:
        files[f"agent/{name.lower()}.py"] = f"""
            import torch
            from agent.ddpg import DDPGAgent

            class {name}Agent(DDPGAgent):
                def __init__(self, device):
                    self.device = device

                def update(self, batch):
                    metrics = super().update(batch)
                    metrics['intr_reward'] = batch.std().item()
                    return metrics
            """
    files["pretrain.py"] = """
            import torch
            import hydra

            def make_agent(cfg):
                return hydra.utils.instantiate(cfg)

            class Workspace:
                def __init__(self, cfg):
                    self.agent = make_agent(cfg.agent)

                def train(self, replay, device):
                    time_step = self.train_env.reset()
                    for step in range(10 ** 6):
                        action = self.agent.act(time_step.observation)
                        time_step = self.train_env.step(action)
                        batch = next(replay).to(device, non_blocking=True)
                        metrics = self.agent.update(batch)
            """
    found = project_rules(tmp_path, files)
    flagged = {name for name, line, rule in found if rule == "GB002" and line == 11}
    assert flagged == {f"{n.lower()}.py" for n in names[1:]}, found


def test_a_parameter_left_at_none_then_computed_is_no_longer_the_constant():
    """ResShift's `prepare_data(self, data, realesrgan=None)` starts with `if realesrgan is None: realesrgan =
    self.configs.data.type == 'realesrgan'` and then copies the batch up under `if realesrgan:`. The call passes
    no realesrgan, so the branch was taken for never running: the lazy init's binding was lost where the two ways
    of the first if met. A parameter's constant bound one way of an if is gone after it. Left at None and never
    bound, the branch stays off."""
    src = textwrap.dedent("""
        import torch

        class Trainer:
            def prepare_data(self, data, realesrgan=None, debug=None):
                if realesrgan is None:
                    realesrgan = self.configs.data.type == 'realesrgan'
                if realesrgan:
                    im_gt = data['gt'].cuda()
                if debug:
                    print(data['lq'].cuda().sum().item())
                return data['lq'].cuda(non_blocking=True)

            def train(self, model, loader, opt):
                for data in loader:
                    lq = self.prepare_data(data)
                    loss = model(lq).mean()
                    loss.backward()
                    opt.step()
        """)
    found = rules(src)
    assert (line_of(src, "im_gt = data['gt'].cuda()"), "GB009") in found, found
    assert not any(line == line_of(src, "print(data['lq']") for line, _ in found), found


def test_quiet_a_lazy_init_under_hasattr_and_a_modules_class_formatted():
    """Two false findings of round 64's widened reach, kept quiet. ResShift fills its training-pair pool once,
    `if not hasattr(self, 'queue_lr'): self.queue_lr = torch.zeros(...).cuda()`: a lazy initialisation, like `if
    x is None: x = ...`, not per-step work; the pool's per-step dequeue, indexed by a CPU `randperm`, still
    reports. AWQ picks its scaling groups with `if "mpt" in str(module.__class__).lower():` on the layer it
    searches: a module's class is a Python type, formatting it reads no tensor; the layer's move back, `.cpu()`,
    still reports."""
    src = textwrap.dedent("""
        import torch

        class Trainer:
            def feed_pool(self, lq):
                b, c, h, w = lq.size()
                if not hasattr(self, 'queue_lr'):
                    self.queue_lr = torch.zeros(b * 10, c, h, w).cuda()
                    self.queue_ptr = 0
                idx = torch.randperm(b * 10)
                self.queue_lr = self.queue_lr[idx]
                return self.queue_lr[:b]

            def train(self, model, loader, opt):
                for lq in loader:
                    lq = self.feed_pool(lq.cuda(non_blocking=True))
                    loss = model(lq).mean()
                    loss.backward()
                    opt.step()
        """)
    found = rules(src)
    assert not any(line == line_of(src, "torch.zeros(b * 10") for line, _ in found), found
    assert (line_of(src, "self.queue_lr = self.queue_lr[idx]"), "GB011") in found, found
    src = textwrap.dedent("""
        import torch

        def auto_scale_block(module, x):
            if "mpt" in str(module.__class__).lower():
                x = x * 2
            return module(x)

        @torch.no_grad()
        def run_awq(model, inps):
            layers = model.model.layers
            for i in range(len(layers)):
                layer = layers[i].cuda()
                inps = auto_scale_block(layer, inps)
                layers[i] = layer.cpu()
        """)
    found = rules(src, "auto_scale.py")
    assert not any(line == line_of(src, "str(module.__class__)") for line, _ in found), found
    assert (line_of(src, "layers[i] = layer.cpu()"), "GB002") in found, found
