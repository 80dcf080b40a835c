"""gobrrr lint, issue 29's round 78 on heldout160-167's first sights (DiffWave, CTGAN, DHCN, Conv-TasNet, CMGAN,
SIREN among them) and news-recommendation's models, left from heldout159; the recursion Megatron-LM's lazy stream
set off (9d151a2); and round 79's PyG case from heldout170 (pyHGT). With the neighbours each rule must keep quiet."""
from __future__ import annotations

import ast

from tests.lintcase import project_rules

NEWS_MODEL = """
    import torch

    device = torch.device("cuda")


    class {name}(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embedding = torch.nn.Embedding(100, 8)

        def forward(self, news):
            return self.word_embedding(news["title"].to(device)).sum()
"""


def test_a_model_class_picked_by_name_at_run_time_runs_its_forward(tmp_path):
    """news-recommendation: `Model = getattr(importlib.import_module(f"model.{model_name}"), model_name)` picks the
    class named as its package (model/NRMS, model/LSTUR, ...); each model's forward copies the pinned batch's
    fields up with a blocking `.to(device)`, per step. Each class so named may be the one, so each is followed."""
    found = project_rules(tmp_path, {
        "src/config.py": 'model_name = "NRMS"\n',
        "src/model/__init__.py": "",
        "src/model/NRMS/__init__.py": NEWS_MODEL.format(name="NRMS"),
        "src/model/LSTUR/__init__.py": NEWS_MODEL.format(name="LSTUR"),
        "src/train.py": """
            import importlib

            import torch
            from torch.utils.data import DataLoader

            from config import model_name

            Model = getattr(importlib.import_module(f"model.{model_name}"), model_name)
            device = torch.device("cuda")


            def train(dataset):
                model = Model().to(device)
                opt = torch.optim.Adam(model.parameters())
                loader = DataLoader(dataset, batch_size=64, shuffle=True, pin_memory=True)
                for minibatch in loader:
                    loss = model(minibatch)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
        """})
    assert ("__init__.py", 13, "GB009") in found, found
    assert len([f for f in found if f[1] == 13]) == 2, found   # NRMS's and LSTUR's forward


def test_a_picked_class_needs_the_module_named_by_one_run_time_part():
    """What a module picked at run time may hold: the class named as the module, or a constant class name; a path
    with text after its run-time part, or a class named by another value, picks nothing."""
    from gobrrr.lint.picked import picked_class  # round 78's module: the other tests of this file run on older trees

    def pick(text):
        return picked_class(ast.parse(text, mode="eval").body)
    assert pick('getattr(importlib.import_module(f"model.{name}"), name)') == (("model",), None)
    assert pick('importlib.import_module("models." + model).__getattribute__("MainModel")') == (("models",), "MainModel")
    assert pick('import_module("exps." + name).Exp') == (("exps",), "Exp")
    assert pick('getattr(importlib.import_module(f"{pkg}.models"), name)') is None
    assert pick('getattr(importlib.import_module(f"model.{name}"), other)') is None
    assert pick('getattr(importlib.import_module(name), "Net")') is None
    assert pick('getattr(config, name)') is None


def test_a_helper_first_reached_with_an_unknown_is_walked_again_with_host_data(tmp_path):
    """DHCN: `trans_to_cuda(variable)` returns `variable.cuda()`; the first hot call to reach it hands
    `self.adjacency` (unknown), a later one `torch.Tensor(session_item).long()` built on the host per step: the
    copy up is real, and found in the helper's body. A helper only ever handed unknown values stays quiet."""
    src = """
        import external
        import torch

        def trans_to_cuda(variable):
            if torch.cuda.is_available():
                return variable.cuda()
            return variable


        class Net(torch.nn.Module):
            def __init__(self, adjacency):
                super().__init__()
                self.adjacency = adjacency
                self.lin = torch.nn.Linear(4, 4)

            def forward(self, x):
                return self.lin(torch.sparse.mm(trans_to_cuda(self.adjacency), x))


        def forward(model, batch):
            session_item = trans_to_cuda(ARG)
            return model(session_item)


        def train(model, opt, batches):
            for batch in batches:
                loss = forward(model, batch).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()


        model = trans_to_cuda(Net(None))
        train(model, torch.optim.Adam(model.parameters()), [[1.0, 2.0]] * 8)
    """
    host = project_rules(tmp_path / "a", {"model.py": src.replace("ARG", "torch.Tensor(batch).long()")})
    assert ("model.py", 7, "GB010") in host, host
    unknown = project_rules(tmp_path / "b", {"model.py": src.replace("ARG", "external.prepare(batch)")})
    assert not [f for f in unknown if f[1] == 7], unknown


LEARNER = """
    import torch


    def _nested_map(struct, map_fn):
        if isinstance(struct, dict):
            return {k: _nested_map(v, map_fn) for k, v in struct.items()}
        return map_fn(struct)


    class Learner:
        def __init__(self, model, dataset, optimizer):
            self.model = model
            self.dataset = dataset
            self.optimizer = optimizer

        def train(self):
            device = next(self.model.parameters()).device
            for features in self.dataset:
                features = _nested_map(features, lambda x: x.to(device) if isinstance(x, torch.Tensor) else x)
                loss = self.model(features["audio"]).sum()
                UPDATE


    def main(dataset):
        model = torch.nn.Linear(4, 4).cuda()
        loader = torch.utils.data.DataLoader(dataset, batch_size=2, pin_memory=True)
        Learner(model, loader, torch.optim.Adam(model.parameters())).train()
"""


def test_an_update_loop_over_a_dataset_attribute_steps_through_batches(tmp_path):
    """DiffWave's learner is handed the DataLoader as `dataset` and steps `for features in self.dataset:`,
    copying each batch up with `_nested_map(features, lambda x: x.to(device))`: a blocking copy per step. The
    same loop without an update (an evaluation over a dataset whose items may already be on the device) says
    nothing of the items."""
    update = "self.optimizer.zero_grad()\n                loss.backward()\n                self.optimizer.step()"
    stepping = project_rules(tmp_path / "a", {"learner.py": LEARNER.replace("UPDATE", update)})
    assert ("learner.py", 20, "GB009") in stepping, stepping
    looking = project_rules(tmp_path / "b", {"learner.py": LEARNER.replace("UPDATE", "print(loss.item())")})
    assert not [f for f in looking if f[1] == 20], looking


def test_an_update_loop_over_a_parameter_says_nothing_of_its_items(tmp_path):
    """attention-is-all-you-need's `train_epoch(model, training_data, ...)` is handed torchtext's
    `BucketIterator(device=cuda)`, whose batches are made on the device: `patch_src(batch.src).to(device)` copies
    nothing. A parameter may hold such an iterator; only a Learner's own `self.dataset` is taken for a loader."""
    found = project_rules(tmp_path, {"train.py": """
        import torch


        def train_epoch(model, training_data, optimizer, device):
            for batch in training_data:
                src_seq = batch.src.to(device)
                loss = model(src_seq).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


        model = torch.nn.Linear(4, 4).cuda()
        train_epoch(model, make_iterator(device="cuda"), torch.optim.Adam(model.parameters()), "cuda")
    """})
    assert not [f for f in found if f[1] == 7], found


def test_a_loader_over_a_tensor_dataset_of_device_tensors_yields_device_batches(tmp_path):
    """CTGAN's TVAE: `TensorDataset(torch.from_numpy(data).to(self._device))` then `DataLoader(dataset, ...)`:
    its batches are slices of a device tensor, so `data[0].to(self._device)` copies nothing and the loader needs no
    pinned memory. The same loader over host tensors still copies every batch up."""
    src = """
        import numpy as np
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        def fit(model, train_data, device):
            dataset = TensorDataset(DATA)
            loader = DataLoader(dataset, batch_size=500, shuffle=True, drop_last=False)
            opt = torch.optim.Adam(model.parameters())
            for data in loader:
                real = data[0].to(device)
                loss = model(real).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()


        fit(torch.nn.Linear(4, 4).cuda(), np.zeros((100, 4), "float32"), torch.device("cuda"))
    """
    on_device = project_rules(tmp_path / "a", {"tvae.py": src.replace("DATA", "torch.from_numpy(train_data).to(device)")})
    assert not [f for f in on_device if f[1] in (9, 12)], on_device
    on_host = project_rules(tmp_path / "b", {"tvae.py": src.replace("DATA", "torch.from_numpy(train_data)")})
    assert ("tvae.py", 12, "GB009") in on_host, on_host


def test_a_slice_bound_from_a_device_tensor_the_hot_caller_hands(tmp_path):
    """Conv-TasNet: `get_mask(source, source_lengths)` is called per step with `mixture_lengths.cuda()`, and
    `mask[i, :, source_lengths[i]:] = 0` reads each length back to the host to slice. The caller's own device
    tensor is no guess from a name. Handed the lengths on the host, the slice reads nothing."""
    src = """
        import torch


        def get_mask(source, source_lengths):
            B, _, T = source.size()
            mask = source.new_ones((B, 1, T))
            for i in range(B):
                mask[i, :, source_lengths[i]:] = 0
            return mask


        def train(model, loader, opt):
            for padded_mixture, mixture_lengths in loader:
                padded_mixture = padded_mixture.cuda()
                mixture_lengths = mixture_lengths.LENGTHS
                loss = (model(padded_mixture) * get_mask(padded_mixture, mixture_lengths)).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
    """
    on_device = project_rules(tmp_path / "a", {"train.py": src.replace("LENGTHS", "cuda()")})
    assert ("train.py", 9, "GB002") in on_device, on_device
    on_host = project_rules(tmp_path / "b", {"train.py": src.replace("LENGTHS", "cpu()")})
    assert not [f for f in on_host if f[1] == 9], on_host


def test_a_window_made_on_the_host_and_copied_up_per_step(tmp_path):
    """CMGAN: `torch.stft(x, n_fft, hop, window=torch.hamming_window(n_fft).to(gpu))` in every step builds the
    window on the host and copies it up; `torch.hamming_window(n_fft, device=gpu)` copies nothing."""
    src = """
        import torch


        def step(model, opt, noisy):
            spec = torch.stft(noisy, 400, 100, window=WINDOW, return_complex=True)
            loss = model(spec.abs()).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


        def train(model, opt, loader):
            for noisy in loader:
                step(model, opt, noisy.cuda(non_blocking=True))
    """
    host = project_rules(tmp_path / "a", {"train.py": src.replace("WINDOW", 'torch.hamming_window(400).to("cuda")')})
    assert [f for f in host if f[1] == 6 and f[2] in ("GB001", "GB010")], host
    device = project_rules(tmp_path / "b", {"train.py": src.replace("WINDOW", 'torch.hamming_window(400, device="cuda")')})
    assert not [f for f in device if f[1] == 6], device


def test_an_enumerated_dataset_attribute_of_an_update_loop_gives_batches(tmp_path):
    """CMGAN's Trainer is handed its loaders as `train_ds` and steps `for idx, batch in enumerate(self.train_ds):`
    into `train_step(batch)`, whose `batch[0].to(self.gpu_id)` is a blocking copy each step."""
    found = project_rules(tmp_path, {"train.py": """
        import torch


        class Trainer:
            def __init__(self, train_ds, model):
                self.train_ds = train_ds
                self.model = model.cuda()
                self.optimizer = torch.optim.Adam(self.model.parameters())

            def train_step(self, batch):
                clean = batch[0].to("cuda")
                loss = self.model(clean).mean()
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

            def train(self):
                for idx, batch in enumerate(self.train_ds):
                    self.train_step(batch)
    """})
    assert ("train.py", 12, "GB009") in found, found


def test_a_loss_function_named_at_a_scripts_top_runs_in_the_shared_loop(tmp_path):
    """SIREN's scripts: `loss_fn = loss_functions.wave_pml` at module level, then `training.train(...,
    loss_fn=loss_fn)`, whose loop calls `loss_fn(model_output, gt)` every step: the module's function runs there,
    and its `if torch.all(dirichlet_mask):` reads the device mask each step."""
    found = project_rules(tmp_path, {
        "loss_functions.py": """
            import torch


            def wave_pml(model_output, gt):
                dirichlet_mask = model_output > 0
                if torch.all(dirichlet_mask):
                    return model_output.sum()
                return (model_output - gt).abs().sum()
        """,
        "training.py": """
            import torch


            def train(model, train_dataloader, loss_fn):
                optim = torch.optim.Adam(model.parameters())
                for model_input, gt in train_dataloader:
                    model_input, gt = model_input.cuda(non_blocking=True), gt.cuda(non_blocking=True)
                    loss = loss_fn(model(model_input), gt)
                    optim.zero_grad()
                    loss.backward()
                    optim.step()
        """,
        "train_wave.py": """
            import torch

            import loss_functions
            import training

            model = torch.nn.Linear(3, 1).cuda()
            loader = torch.utils.data.DataLoader(list(range(8)), pin_memory=True)
            loss_fn = loss_functions.wave_pml
            training.train(model=model, train_dataloader=loader, loss_fn=loss_fn)
        """})
    assert ("loss_functions.py", 7, "GB007") in found, found


def test_an_attribute_set_to_its_own_call_does_not_recur(tmp_path):
    """Megatron's ScheduleNode: `if isinstance(self.stream, Callable): self.stream = self.stream()` (a lazily
    made stream) in hot code. Resolving `self.stream()` looks at what `self.stream` was set to, a call of itself:
    the lint must not follow that forever (it failed on the whole file with a RecursionError)."""
    found = project_rules(tmp_path, {"node.py": """
        from typing import Callable

        import torch


        class Node:
            def __init__(self, stream, model):
                self.stream = stream
                self.model = model

            def forward(self, x):
                if isinstance(self.stream, Callable):
                    self.stream = self.stream()
                with torch.cuda.stream(self.stream):
                    return self.model(x)


        def train(model, opt, loader):
            node = Node(torch.cuda.current_stream, model)
            for x in loader:
                loss = node.forward(x.cuda(non_blocking=True)).sum()
                print(loss.item())
                opt.zero_grad()
                loss.backward()
                opt.step()
    """})
    assert ("node.py", 23, "GB002") in found, found


def test_a_pyg_layers_propagate_runs_its_message_and_update(tmp_path):
    """pyHGT's HGTConv(MessagePassing): `forward` returns `self.propagate(edge_index, node_inp=x, ...)`, and
    torch_geometric calls the layer's own `message` and `update` from there, every layer of every step:
    `res_att = torch.zeros(n, heads).to(node_inp_i.device)` in `message` builds on the host and copies up."""
    found = project_rules(tmp_path, {"conv.py": """
        import torch
        from torch_geometric.nn import MessagePassing


        class HGTConv(MessagePassing):
            def __init__(self, dim):
                super().__init__(aggr="add")
                self.lin = torch.nn.Linear(dim, dim)

            def forward(self, node_inp, edge_index):
                return self.propagate(edge_index, node_inp=node_inp)

            def message(self, node_inp_i, node_inp_j):
                res_att = torch.zeros(node_inp_i.size(0), 4).to(node_inp_i.device)
                return self.lin(node_inp_j) * res_att.sum()

            def update(self, aggr_out, node_inp):
                return aggr_out + node_inp


        def train(loader, opt):
            conv = HGTConv(16).cuda()
            for x, edge_index in loader:
                out = conv(x.cuda(non_blocking=True), edge_index.cuda(non_blocking=True))
                loss = out.sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
    """})
    assert ("conv.py", 15, "GB001") in found, found
