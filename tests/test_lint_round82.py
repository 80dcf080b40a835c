"""gobrrr lint, issue 29's round 82 on heldout201-206's first sights: a model picked from a dict of factory defs
inside the factory itself (benchmarking-gnns: every net's own `loss` runs per step); a one-line helper that copies
`Variable(tensor)` up, first reached with an unknown argument (JT-VAE's create_var in DIG); a loader that one branch
leaves None (mozilla-TTS's setup_loader: pinned or not decides its non_blocking copies); a batch size annotated
`Optional[int]` (GNNAutoScale in DIG: host slice bounds); with the neighbours each rule must keep quiet or keep
reporting."""
from __future__ import annotations

from textwrap import dedent

from tests.lintcase import line_of, project_rules, rules

NETS = """
    import torch
    import torch.nn as nn


    class GCNNet(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)

        def loss(self, pred, label):
            count = torch.bincount(label)
            return nn.functional.cross_entropy(pred, label) + count.sum()


    class GATNet(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)

        def loss(self, pred, label):
            present = torch.unique(label)
            return nn.functional.cross_entropy(pred, label) + present.sum()


    class MLPNet(GCNNet):
        def loss(self, pred, label):
            kept = label[label.nonzero()]
            return nn.functional.cross_entropy(pred, label) + kept.sum()
"""

LOAD_NET = """
    from nets import GCNNet, GATNet, MLPNet


    def GCN(net_params):
        return GCNNet(net_params)


    def GAT(net_params):
        return GATNet(net_params)


    def MLP(net_params):
        return MLPNet(net_params)


    def gnn_model(MODEL_NAME, net_params):
        models = {"GCN": GCN, "GAT": GAT, "MLP": MLP}
        return models[MODEL_NAME](net_params)
"""

TRAIN = """
    import torch


    def train_epoch(model, optimizer, device, data_loader):
        for x, y in data_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = model.loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""

MAIN = """
    import torch
    from torch.utils.data import DataLoader
    from load_net import gnn_model
    from train import train_epoch


    def pipeline(MODEL_NAME, dataset, net_params):
        device = torch.device("cuda")
        model = gnn_model(MODEL_NAME, net_params)
        model = model.to(device)
        optimizer = torch.optim.Adam(model.parameters())
        loader = DataLoader(dataset, batch_size=64, pin_memory=True)
        for epoch in range(100):
            train_epoch(model, optimizer, device, loader)


    pipeline("GCN", list(range(10)), {})
"""


def test_a_model_built_from_a_dict_of_factory_defs_runs_each_nets_own_loss(tmp_path):
    """benchmarking-gnns: `models = {"GCN": GCN, ...}; return models[MODEL_NAME](net_params)`, each value a def
    returning its net: the model is any of them, so `model.loss(...)` in the step runs each net's own loss (the
    reader counts every net's bincount / unique / nonzero as per step: each is the step of its own config). GCNNet
    and GATNet are two hierarchies on purpose, alike but apart: a `loss` in one hierarchy is found without the dict."""
    found = project_rules(tmp_path, {"nets.py": NETS, "load_net.py": LOAD_NET, "train.py": TRAIN, "main.py": MAIN})
    src = dedent(NETS)
    for text in ("torch.bincount(label)", "torch.unique(label)", "label[label.nonzero()]"):
        assert ("nets.py", line_of(src, text), "GB008") in found, (text, found)


def test_a_dict_whose_value_is_no_class_pins_nothing(tmp_path):
    """The same factory with one value that is neither a class nor a def that builds one (a lambda): what the
    program picks is not known, so no net's loss is followed."""
    load = LOAD_NET.replace('"MLP": MLP}', '"MLP": lambda p: None}')
    found = project_rules(tmp_path, {"nets.py": NETS, "load_net.py": load, "train.py": TRAIN, "main.py": MAIN})
    assert not [f for f in found if f[0] == "nets.py"], found


def test_a_dict_of_more_than_twelve_factories_pins_nothing(tmp_path):
    """Thirteen values: too many to take each as the one made (a registry of everything)."""
    many = ", ".join(f'"N{i}": GCN' for i in range(13))
    load = LOAD_NET.replace('models = {"GCN": GCN, "GAT": GAT, "MLP": MLP}', "models = {" + many + "}")
    found = project_rules(tmp_path, {"nets.py": NETS, "load_net.py": load, "train.py": TRAIN, "main.py": MAIN})
    assert not [f for f in found if f[0] == "nets.py"], found


NNUTILS = """
    import torch
    from torch.autograd import Variable


    def create_var(tensor, requires_grad=None):
        if requires_grad is None:
            return Variable(tensor).cuda()
        else:
            return Variable(tensor, requires_grad=requires_grad).cuda()
"""

ENCODER = """
    import torch
    import torch.nn as nn
    from nnutils import create_var


    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, fnode):
            fnode = create_var(fnode)
            messages = create_var(torch.zeros(3, 4))
            return self.lin(fnode) + messages


    def main():
        model = Encoder().cuda()
        opt = torch.optim.Adam(model.parameters())
        for step in range(1000):
            loss = model(torch.randn(3, 4)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()


    main()
"""


def test_a_helper_copying_a_wrapped_argument_up_is_walked_again_for_host_data(tmp_path):
    """DIG's JT-VAE: `create_var(fnode)` with an unknown argument first, then `create_var(torch.zeros(...))` of a
    host tensor: the helper's `Variable(tensor).cuda()` copies its argument up, so the host call walks it again."""
    found = project_rules(tmp_path, {"nnutils.py": NNUTILS, "encoder.py": ENCODER})
    assert ("nnutils.py", line_of(dedent(NNUTILS), "return Variable(tensor).cuda()"), "GB010") in found, found


def test_a_helper_that_wraps_without_copying_stays_quiet(tmp_path):
    """`Variable(tensor)` alone moves nothing: the same calls find nothing in the helper."""
    quiet = NNUTILS.replace("Variable(tensor).cuda()", "Variable(tensor)").replace(
        "Variable(tensor, requires_grad=requires_grad).cuda()", "Variable(tensor, requires_grad=requires_grad)")
    found = project_rules(tmp_path, {"nnutils.py": quiet, "encoder.py": ENCODER})
    assert not [f for f in found if f[0] == "nnutils.py"], found


TTS = dedent("""
    import torch
    from torch.utils.data import DataLoader


    def setup_loader(dataset, is_val=False):
        if is_val and not RUN_EVAL:
            loader = None
        else:
            loader = DataLoader(dataset, batch_size=32, shuffle=False, pin_memory=False)
        return loader


    def format_data(data):
        text_input = data[0]
        mel_input = data[1]
        text_input = text_input.cuda(non_blocking=True)
        mel_input = mel_input.cuda(non_blocking=True)
        return text_input, mel_input


    def train(data_loader, model, optimizer):
        for num_iter, data in enumerate(data_loader):
            text_input, mel_input = format_data(data)
            loss = model(text_input, mel_input)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    RUN_EVAL = True


    def main(dataset, model, optimizer):
        train_loader = setup_loader(dataset, is_val=False)
        for epoch in range(100):
            train(train_loader, model, optimizer)
""")


def test_a_loader_one_branch_leaves_none_is_the_loader_of_the_other():
    """mozilla-TTS's setup_loader: `loader = None` when there is no evaluation set, else a DataLoader with
    pin_memory=False; what it returns is that loader, so each `.cuda(non_blocking=True)` of its batches is a
    staged, blocking copy from pageable memory (GB005)."""
    found = rules(TTS)
    for text in ("text_input = text_input.cuda(", "mel_input = mel_input.cuda("):
        assert (line_of(TTS, text), "GB005") in found, (text, found)


def test_a_pinned_loader_one_branch_leaves_none_copies_asynchronously():
    """The same loader with pin_memory=True: its batches are pinned, the non_blocking copies are asynchronous."""
    src = TTS.replace("pin_memory=False", "pin_memory=True")
    assert not [f for f in rules(src) if f[1] == "GB005"], rules(src)


GNNAUTOSCALE = dedent("""
    from typing import Optional

    import torch
    import torch.nn as nn
    from torch import Tensor


    class ScalableGNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def __call__(self, x: Optional[Tensor] = None, batch_size: Optional[int] = None, n_id: Optional[Tensor] = None):
            return self.forward(x, batch_size, n_id)

        def forward(self, x: Tensor, *args) -> Tensor:
            h = self.lin(x)
            if len(args) > 0:
                batch_size = args[0]
                inside = h[:batch_size]
                outside = h[batch_size:]
                h = torch.cat([inside, outside])
            return h


    def train(model, loader, optimizer, device):
        for batch, batch_size, n_id in loader:
            out = model(batch.to(device), batch_size, n_id)
            loss = out.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
""")


def test_a_batch_size_annotated_optional_int_is_a_host_number():
    """GNNAutoScale (DIG's GraphFMOB): `batch_size: Optional[int] = None`, handed the loader's count: slicing by it
    reads nothing back, though the loader's other items are tensors."""
    found = rules(GNNAUTOSCALE)
    for text in ("inside = h[:batch_size]", "outside = h[batch_size:]"):
        assert not [f for f in found if f[0] == line_of(GNNAUTOSCALE, text)], (text, found)


def test_a_bound_annotated_optional_tensor_still_syncs():
    """The same bound annotated `Optional[Tensor]`: a device count used as a slice bound is read back per step."""
    src = GNNAUTOSCALE.replace("batch_size: Optional[int] = None", "batch_size: Optional[Tensor] = None")
    found = rules(src)
    assert (line_of(src, "inside = h[:batch_size]"), "GB002") in found, found
