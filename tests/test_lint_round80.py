"""gobrrr lint, issue 29's round 80 on heldout176-192's first sights (Speech-Transformer, MTGNN, GraphRNN, DiffPool,
BARF, tabzilla's Hopular) and the corpus's 0-d index shape (Autoformer's family, ssd.pytorch's matcher), with the
neighbours each rule must keep quiet (the corpus's: DETA, qmoe, ogb, motion-diffusion-model, PyTorch-YOLOv3) and the
crash a first version of the eval-mode rule had (votenet, ASFF, pytorch-ddpm)."""
from __future__ import annotations

import ast
from textwrap import dedent

from gobrrr.lint.loops import Facts
from gobrrr.lint.steploops import step_loops
from tests.lintcase import line_of, project_rules, rules

SOLVER = """
    import torch


    class Solver:
        def __init__(self, loader, model, optimizer):
            self.loader = loader
            self.model = model
            self.optimizer = optimizer

        def train(self):
            for i, data in enumerate(self.loader):
                padded_input, padded_target = data
                padded_input = padded_input.cuda()
                padded_target = padded_target.cuda()
                loss = self.model(padded_input, padded_target)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
"""

TRANSFORMER = """
    import torch

    IGNORE_ID = -1


    class Transformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, padded_input, padded_target):
            ys = [y[y != IGNORE_ID] for y in padded_target]
            eos = ys[0].new([2])
            return self.proj(padded_input).sum() + eos.sum()
"""


def test_a_class_from_a_folder_on_the_path_runs_its_forward(tmp_path):
    """Speech-Transformer: src/bin/train.py imports `from transformer import Transformer` with every src/ folder on
    PYTHONPATH (its path.sh); src/transformer/ is also a package (an empty __init__.py), which does not define the
    class, and src/transformer/transformer.py does. Its forward masks each target row and copies a list up, per step."""
    train = """
        import torch

        from solver import Solver
        from transformer import Transformer


        def main(loader):
            model = Transformer()
            model.cuda()
            optimizer = torch.optim.Adam(model.parameters())
            solver = Solver(loader, model, optimizer)
            solver.train()
    """
    files = {"src/__init__.py": "", "src/transformer/__init__.py": "", "src/solver/__init__.py": "",
             "src/transformer/transformer.py": TRANSFORMER, "src/solver/solver.py": SOLVER, "src/bin/train.py": train}
    found = project_rules(tmp_path, files)
    assert ("transformer.py", line_of(TRANSFORMER, "y != IGNORE_ID"), "GB008") in found, found
    assert ("transformer.py", line_of(TRANSFORMER, ".new([2])"), "GB010") in found, found


def test_a_package_that_defines_the_class_is_still_the_one_taken(tmp_path):
    """The neighbour: when the package's __init__ does define `Transformer` (a CPU stand-in here), that is the class
    Python imports, and the file of the same name beside it is not followed."""
    train = """
        import torch

        from solver import Solver
        from transformer import Transformer


        def main(loader):
            model = Transformer()
            model.cuda()
            optimizer = torch.optim.Adam(model.parameters())
            Solver(loader, model, optimizer).train()
    """
    init = """
        import torch


        class Transformer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(8, 8)

            def forward(self, padded_input, padded_target):
                return self.proj(padded_input).sum()
    """
    files = {"src/__init__.py": "", "src/transformer/__init__.py": init, "src/solver/__init__.py": "",
             "src/transformer/transformer.py": TRANSFORMER, "src/solver/solver.py": SOLVER, "src/bin/train.py": train}
    found = project_rules(tmp_path, files)
    assert not [f for f in found if f[0] == "transformer.py"], found


MTGNN = dedent("""
    import numpy as np
    import torch


    def train(dataloader, engine, device, num_nodes, num_split):
        for epoch in range(10):
            dataloader['train_loader'].shuffle()
            for it, (x, y) in enumerate(dataloader['train_loader'].get_iterator()):
                trainx = torch.Tensor(x).to(device)
                trainy = torch.Tensor(y).to(device)
                perm = np.random.permutation(range(num_nodes))
                for j in range(num_split):
                    idx = torch.tensor(perm[j::num_split]).to(device)
                    engine.train(trainx[:, :, idx], trainy[:, :, idx])
""")


def test_a_loaders_own_batch_method_makes_the_outer_loop_a_step_loop():
    """MTGNN: `for iter, (x, y) in enumerate(dataloader['train_loader'].get_iterator())`, a method of the project's
    own loader class, takes a batch each iteration; the node-split loop inside it trains on pieces of that batch.
    The batch's copies up, outside the inner loop, run per batch: the outer loop is a step loop too."""
    found = rules(MTGNN)
    assert (line_of(MTGNN, "trainx = torch.Tensor(x)"), "GB001") in found, found
    assert (line_of(MTGNN, "trainy = torch.Tensor(y)"), "GB001") in found, found


def test_a_method_of_a_plain_object_is_not_a_loader():
    """The neighbour: the same loop over `self.schedule.get_iterator()` (no loader in the name) is an epoch loop
    around the training loop, so its once-per-pass copy stays quiet."""
    src = MTGNN.replace("dataloader['train_loader'].get_iterator()", "schedule.get_iterator()")
    found = rules(src)
    assert (line_of(src, "trainx = torch.Tensor(x)"), "GB001") not in found, found


AUTOCORRELATION = dedent("""
    import math

    import torch


    class AutoCorrelation(torch.nn.Module):
        def forward(self, values, corr):
            length = values.shape[3]
            top_k = int(math.log(length))
            mean_value = torch.mean(torch.mean(corr, dim=1), dim=1)
            index = torch.topk(torch.mean(mean_value, dim=0), top_k, dim=-1)[1]
            weights = torch.stack([mean_value[:, index[i]] for i in range(top_k)], dim=-1)
            return weights


    def train(model, loader, opt):
        model = model.cuda()
        for x, c in loader:
            x = x.cuda(non_blocking=True)
            c = c.cuda(non_blocking=True)
            loss = model(x, c).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
""")


def test_an_element_of_a_device_index_tensor_as_an_index():
    """Autoformer and its copies: `mean_value[:, index[i]]` with `index` topk's 1-d indices: `index[i]` is a 0-d
    CUDA integer tensor, which indexing reads with .item() to select (measured: one sync per read), per step."""
    found = rules(AUTOCORRELATION)
    assert (line_of(AUTOCORRELATION, "mean_value[:, index[i]]"), "GB002") in found, found


def test_an_element_of_a_parameter_or_a_host_tensor_is_not_flagged():
    """The neighbours: an element of a parameter (its device and rank are the caller's guess), and of a host index
    tensor (`torch.arange(8)`: a CPU integer, no device read)."""
    src = AUTOCORRELATION.replace("def forward(self, values, corr):", "def forward(self, values, corr, index=None):") \
        .replace("index = torch.topk(torch.mean(mean_value, dim=0), top_k, dim=-1)[1]", "pass")
    assert (line_of(src, "mean_value[:, index[i]]"), "GB002") not in rules(src)
    host = AUTOCORRELATION.replace("torch.topk(torch.mean(mean_value, dim=0), top_k, dim=-1)[1]", "torch.arange(8)")
    assert (line_of(host, "mean_value[:, index[i]]"), "GB002") not in rules(host)


def test_an_element_of_an_index_made_along_dim_1_is_a_row():
    """The neighbour found on the corpus: DETA's `topk_proposals = torch.topk(logit, k, dim=1)[1]` is (batch, k), so
    `output_memory[b][topk_proposals[b]]` gathers a row of indices; qmoe's `argsort(h, dim=1)` likewise."""
    src = AUTOCORRELATION.replace("torch.topk(torch.mean(mean_value, dim=0), top_k, dim=-1)[1]",
                                  "torch.topk(mean_value, top_k, dim=1)[1]")
    assert (line_of(src, "mean_value[:, index[i]]"), "GB002") not in rules(src)


def test_a_row_of_a_2d_index_picked_by_a_constant_is_not_flagged():
    """The neighbour found on the corpus: `h[edge[0]]` with `edge` a (2, E) device index (ogb's link predictors,
    DiffDock's `edge_index[0]`) gathers a row of indices, no sync; a constant picks a row as often as an element."""
    src = AUTOCORRELATION.replace("weights = torch.stack([mean_value[:, index[i]] for i in range(top_k)], dim=-1)",
                                  "edge = torch.stack([index, index])\n        weights = mean_value[:, edge[0]]")
    assert (line_of(src, "weights = mean_value[:, edge[0]]"), "GB002") not in rules(src)


def test_as_tensor_without_a_device_under_a_cuda_default_type_does_not_fail():
    """A crash found on tabzilla's vendored Hopular (heldout179): with a CUDA default tensor type, a hot
    `torch.as_tensor(host_list)` that names no device sent the own-device check looking for a `device=` keyword
    (KeyError), and the whole run stopped on that file. It is host data copied up per step: reported."""
    src = dedent("""
        import torch

        torch.set_default_tensor_type("torch.cuda.FloatTensor")


        def train(model, loader, opt, sizes):
            for x in loader:
                bounds = torch.cumsum(torch.as_tensor([0] + sizes), dim=0)
                loss = model(x, bounds).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
    """)
    assert (line_of(src, "torch.as_tensor([0] + sizes)"), "GB010") in rules(src)


GRAPHRNN_SAMPLE = dedent("""
    import torch
    from torch.autograd import Variable


    def sample_sigmoid(y, thresh=0.5):
        y = torch.sigmoid(y)
        y_thresh = Variable(torch.rand(y.size(0), y.size(1), y.size(2))).cuda()
        return torch.gt(y, y_thresh).float()


    def test_rnn_epoch(rnn, output, batch, max_num_node, max_prev_node):
        rnn.eval()
        output.eval()
        x_step = torch.ones(batch, 1, max_prev_node, device="cuda")
        for i in range(max_num_node):
            h = rnn(x_step)
            output_x_step = torch.ones(batch, 1, 1, device="cuda")
            for j in range(min(max_prev_node, i + 1)):
                output_y_pred_step = output(output_x_step)
                output_x_step = sample_sigmoid(output_y_pred_step)
                x_step[:, :, j:j + 1] = output_x_step
""")


def test_handed_modules_put_in_eval_mode_run_a_sampling_loop():
    """GraphRNN: `test_rnn_epoch(epoch, args, rnn, output)` is handed its two GRUs under names no model word marks;
    `rnn.eval()` and `output.eval()` say they are modules, so the edge loop that calls `output(x)` decodes step by
    step, and the host thresholds `sample_sigmoid` uploads at each edge are per step. `Variable(torch.rand(n)).cuda()`
    there is a tensor moved, not a module made: it must not make `y_thresh` a model (it made `torch.gt(y, y_thresh)`
    a forward, and `sample_sigmoid` a looping def)."""
    found = rules(GRAPHRNN_SAMPLE)
    assert (line_of(GRAPHRNN_SAMPLE, "y_thresh = Variable("), "GB010") in found, found


def test_names_that_are_never_put_in_eval_mode_stay_unknown():
    """The neighbour: the same loop without the `.eval()` calls gives no sign that `rnn` and `output` are modules."""
    src = GRAPHRNN_SAMPLE.replace("    rnn.eval()\n    output.eval()\n", "")
    assert (line_of(src, "y_thresh = Variable("), "GB010") not in rules(src)


def test_a_packed_host_batch_stays_on_the_host():
    """GraphRNN's training step packs the host batch (`pack_padded_sequence(y, y_len).data`), reshapes it and
    concatenates a start token to it, then copies the result up with `Variable(output_x).cuda()`: blocking, per step.
    The packed data keeps the device of what was packed (a `.view()` of it used to be taken for a device tensor)."""
    src = dedent("""
        import torch
        from torch.autograd import Variable
        from torch.nn.utils.rnn import pack_padded_sequence


        def train_rnn_epoch(model, data_loader, optimizer):
            model.cuda()
            for batch_idx, data in enumerate(data_loader):
                y = data['y'].float()
                y_len = data['len'].numpy().tolist()
                y_reshape = pack_padded_sequence(y, y_len, batch_first=True).data
                y_reshape = y_reshape.view(y_reshape.size(0), y_reshape.size(1), 1)
                output_x = torch.cat((torch.ones(y_reshape.size(0), 1, 1), y_reshape[:, 0:-1, 0:1]), dim=1)
                output_x = Variable(output_x).cuda()
                loss = model(output_x).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """)
    assert (line_of(src, "output_x = Variable(output_x).cuda()"), "GB010") in rules(src)


NERF_RENDER = dedent("""
    import torch


    def batchify_rays(rays_flat, chunk, network_fn):
        all_ret = {}
        for i in range(0, rays_flat.shape[0], chunk):
            ret = network_fn(rays_flat[i:i + chunk])
            for k in ret:
                all_ret.setdefault(k, []).append(ret[k])
        return {k: torch.cat(all_ret[k], 0) for k in all_ret}


    def render(rays, chunk, network_fn):
        all_ret = batchify_rays(rays, chunk, network_fn)
        for k in all_ret:
            all_ret[k] = torch.reshape(all_ret[k], [-1, 3])
        return all_ret["rgb"], all_ret["disp"]


    def train(model, rays, optimizer, n_iters, chunk):
        model.cuda()
        for i in range(n_iters):
            rgb, disp = render(rays, chunk, model)
            loss = rgb.mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
""")


def test_a_loop_over_the_keys_of_a_batchified_result_is_not_a_batch_loop():
    """nerf-pytorch's `render`: `all_ret = batchify_rays(rays, chunk)` is named like a batching call, but it returns a
    dict of results, and `for k in all_ret: all_ret[k] = ...` walks its keys. That loop is no step loop, so `render`
    holds none (and a loop over poses calling it is not taken for an outer loop around one)."""
    tree = ast.parse(NERF_RENDER)
    steps, _, _, looping = step_loops(tree, Facts(list(ast.walk(tree))), None)
    lines = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.For) and id(n) in steps}
    assert line_of(NERF_RENDER, "for k in all_ret:") not in lines, lines
    assert line_of(NERF_RENDER, "for i in range(n_iters)") in lines, lines   # the training loop still is one
    assert "render" not in looping, looping


def test_a_loop_over_a_loaders_batches_named_like_a_dict_is_still_a_batch_loop():
    """The neighbour: `batches = make_batches(data)` iterated as `for b in batches:` (its items not used to index it)
    takes batches."""
    src = dedent("""
        def train(model, data, optimizer):
            batches = make_batches(data)
            for b in batches:
                x = b.cuda()
                y = model(x).sum()
                print(y.item())
    """)
    tree = ast.parse(src)
    steps, _, _, _ = step_loops(tree, Facts(list(ast.walk(tree))), None)
    assert {n.lineno for n in ast.walk(tree) if isinstance(n, ast.For) and id(n) in steps} == {line_of(src, "for b in")}


def test_a_config_handed_to_forward_is_not_a_tensor():
    """BARF: `def forward(self, opt, var, mode=None)` takes the options first; `opt.device` made it look like a
    tensor (a forward's unnamed inputs are guessed from tensor-only fields), and every `if opt.nerf.rand_rays:` in
    the renderer became a sync (15 false findings at heldout189's first sight). A config's name keeps it out of that
    guess; the forward's real tensor input (`var`, used with `.view`) is still one."""
    src = dedent("""
        import torch


        class Graph(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.mlp = torch.nn.Linear(3, 3)

            def forward(self, opt, x, mode=None):
                x = x.to(opt.device)
                if opt.rand_rays and mode == "train":
                    x = x[:, :opt.rand_rays]
                if (x.view(-1) > 0).any():
                    x = x * 2
                return self.mlp(x)


        def train(opt, loader):
            graph = Graph().to(opt.device)
            optim = torch.optim.Adam(graph.parameters())
            for x in loader:
                loss = graph(opt, x, mode="train").sum()
                optim.zero_grad()
                loss.backward()
                optim.step()
    """)
    found = rules(src)
    assert (line_of(src, "if opt.rand_rays"), "GB007") not in found, found
    assert (line_of(src, "if (x.view(-1) > 0).any()"), "GB007") in found, found


ROI_LEVELS = dedent("""
    import torch


    def roi_feature_transform(blobs_in, rpn_ret, k_min, k_max, scales):
        outs = []
        for lvl in range(k_min, k_max + 1):
            rois = torch.from_numpy(rpn_ret["rois_fpn" + str(lvl)]).cuda()
            outs.append(RoIAlignFunction(7, 7, scales[lvl])(blobs_in[lvl], rois))
        return torch.cat(outs, 0)
""")


def test_a_module_made_and_run_in_one_expression_runs_per_iteration():
    """Detectron.pytorch's `roi_feature_transform`: each pyramid level makes its RoIAlign and runs it on that level's
    features (`RoIAlignFunction(7, 7, sc)(bl_in, rois)`), after uploading the level's host RoIs: a loop that runs a
    module each iteration, so the upload is per level. (It was found before only because `Variable(...).cuda()` was
    taken for a model made, which made `rois` a model.)"""
    assert (line_of(ROI_LEVELS, "rois = torch.from_numpy"), "GB001") in rules(ROI_LEVELS)


def test_a_lower_case_factory_called_twice_is_not_a_module():
    """The neighbour: `scale_for(lvl)(x)` (a function returning a function) says nothing about a module."""
    src = ROI_LEVELS.replace("RoIAlignFunction(7, 7, scales[lvl])", "scale_for(scales[lvl])")
    assert not [f for f in rules(src) if f[0] == line_of(src, "rois = torch.from_numpy")], rules(src)


def test_a_script_calling_its_own_eval_function_is_checked():
    """A crash the corpus run found (votenet, ASFF, pytorch-ddpm): `eval()`, a script's own function called bare,
    matched the `rnn.eval()` rule by name and the rule then read the receiver it does not have. The script is
    checked, and its loop's upload found."""
    src = dedent("""
        import torch


        def eval():
            net = torch.nn.Linear(4, 4).cuda()
            for x in loader:
                y = net(torch.from_numpy(x).cuda())
                print(y.sum().item())


        if __name__ == "__main__":
            eval()
    """)
    assert (line_of(src, "print(y.sum().item())"), "GB002") in rules(src)


DIFFPOOL = dedent("""
    import torch
    import torch.nn as nn


    class GraphConv(nn.Module):
        def __init__(self, input_dim, output_dim):
            super().__init__()
            self.weight = nn.Parameter(torch.FloatTensor(input_dim, output_dim).cuda())

        def forward(self, x, adj):
            return torch.matmul(adj, x) @ self.weight


    class Encoder(nn.Module):
        def __init__(self, dims, hidden_dims):
            super().__init__()
            self.act = nn.ReLU()
            self.convs = nn.ModuleList()
            for d in dims:
                self.convs.append(GraphConv(d, d))
            pred_layers = []
            for pred_dim in hidden_dims:
                pred_layers.append(nn.Linear(pred_dim, pred_dim))
                pred_layers.append(self.act)
            self.pred_model = nn.Sequential(*pred_layers)

        def forward(self, x, adj):
            for conv in self.convs:
                x = conv(x, adj)
            return self.pred_model(x)


    def train(loader, dims):
        model = Encoder(dims, [8, 8]).cuda()
        opt = torch.optim.Adam(model.parameters())
        for x, adj in loader:
            loss = model(x.cuda(), adj.cuda()).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
""")


def test_a_list_of_layers_being_built_is_no_forward():
    """DiffPool: `pred_layers.append(self.act)` in `__init__` was taken for running a module (`pred_layers` reads like
    a model's name), so the building loops were step loops and the parameters' one-time `.cuda()` in `GraphConv`'s
    constructor became a per-step finding. Appending to a list (or a ModuleList) runs nothing."""
    found = rules(DIFFPOOL)
    assert (line_of(DIFFPOOL, "nn.Parameter(torch.FloatTensor"), "GB001") not in found, found
    assert (line_of(DIFFPOOL, "loss = model(x.cuda(), adj.cuda())"), "GB009") in found, found   # the step still is one


def test_the_items_of_a_dict_of_loaders_are_not_batches():
    """The neighbour found on the corpus: `for name, loader in mm_motion_loaders.items():` (motion-diffusion-model)
    walks the loaders, one pass each; only a loader's own method (`get_iterator()`) yields batches."""
    src = MTGNN.replace("dataloader['train_loader'].get_iterator()", "dataloader.items()")
    assert (line_of(src, "trainx = torch.Tensor(x)"), "GB001") not in rules(src)
