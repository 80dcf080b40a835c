"""gobrrr lint, issue 29's round 74: a callable handed to a step-loop def (DiffDock's `loss_fn`, left over from round
73), then heldout142-145's first sights, and the neighbours each rule must keep quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_a_loss_function_handed_to_the_step_loop_def_is_followed(tmp_path):
    """DiffDock's `train_epoch(model, loader, optimizer, device, t_to_sigma, loss_fn, ema)`, given
    `loss_fn = partial(loss_function, tr_weight=...)` by its script: `loss_fn(pred, data=data)` in the batch loop runs
    loss_function, whose `.cpu()` read-backs are per step. A def handed to a step-loop def that never calls that
    parameter (it only stores it) stays unread; a closure of the caller's that the callee runs on `*args` (a
    checkpoint wrapper) stays round 67's."""
    found = project_rules(tmp_path, {
        "utils/training.py": """
            import torch


            def loss_function(pred, data, device, weight=1.0):
                loss = ((pred.cpu() - data.cpu()) ** 2).mean() * weight
                return loss


            def report(values):
                print(values.cpu())


            def train_epoch(model, loader, optimizer, device, loss_fn, hook=None):
                model.train()
                model.hook = hook
                for data in loader:
                    data = data.to(device, non_blocking=True)
                    pred = model(data)
                    loss = loss_fn(pred, data=data, device=device)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
            """,
        "train.py": """
            from functools import partial

            import torch
            from utils.training import train_epoch, loss_function, report


            def main(args, model, loader):
                device = torch.device("cuda")
                model = model.to(device)
                optimizer = torch.optim.Adam(model.parameters())
                loss_fn = partial(loss_function, weight=args.weight)
                for epoch in range(args.epochs):
                    train_epoch(model, loader, optimizer, device, loss_fn, hook=report)
            """})
    assert ("training.py", 6, "GB002") in found, found
    assert not [f for f in found if f[:2] == ("training.py", 11)], found


def test_a_parameter_made_on_the_device_is_a_device_tensor(tmp_path):
    """tgn's memory: `self.memory = nn.Parameter(torch.zeros((n, d)).to(self.device), requires_grad=False)`,
    read per batch through the numpy node ids of the batch (`memory[source_nodes, :]`): each index is copied up.
    A Parameter made on the host (`nn.Parameter(torch.zeros(n, d))`, moved later by the module's `.cuda()`) stays
    unknown, as before: indexing it through a host list is not reported."""
    found = project_rules(tmp_path, {
        "memory.py": """
            import torch
            from torch import nn


            class Memory(nn.Module):
                def __init__(self, n_nodes, dim, device="cpu"):
                    super().__init__()
                    self.memory = nn.Parameter(torch.zeros((n_nodes, dim)).to(device), requires_grad=False)
                    self.table = nn.Parameter(torch.zeros((n_nodes, dim)))

                def get_memory(self, node_idxs):
                    return self.memory[node_idxs, :]

                def get_rows(self, node_idxs):
                    return self.table[node_idxs, :]
            """,
        "train.py": """
            import numpy as np
            import torch
            from memory import Memory

            device = torch.device("cuda:0")
            mem = Memory(1000, 100, device=device)
            head = torch.nn.Linear(100, 1).to(device)
            opt = torch.optim.Adam(head.parameters())
            sources = np.random.randint(0, 1000, 10000)
            for epoch in range(10):
                for k in range(100):
                    nodes = sources[k * 100:(k + 1) * 100]
                    loss = head(mem.get_memory(nodes) + mem.get_rows(nodes)).sum()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            """})
    assert ("memory.py", 13, "GB011") in found, found
    assert not [f for f in found if f[:2] == ("memory.py", 16)], found


def test_a_list_grown_with_loop_counters_is_a_list_of_positions():
    """pytorch-fm's InnerProductNetwork: `row, col = list(), list()` grown with `row.append(i), col.append(j)` over
    the field pairs, then `x[:, row]` of the device embeddings: a host index copied up every forward. A list that
    also takes other values (`names.append(name)`) is not one of positions; nor is a list of counters that only
    indexes a host array."""
    src = textwrap.dedent("""
        import numpy as np
        import torch


        class InnerProduct(torch.nn.Module):
            def forward(self, x, names, table):
                num_fields = x.shape[1]
                row, col = list(), list()
                for i in range(num_fields - 1):
                    for j in range(i + 1, num_fields):
                        row.append(i), col.append(j)
                keep = []
                for k, name in enumerate(names):
                    keep.append(k)
                    keep.append(name)
                picked = np.asarray(table)[row]
                return torch.sum(x[:, row] * x[:, col], dim=2) + x[:, keep].sum() + picked.sum()


        def train(loader, opt):
            model = InnerProduct().cuda()
            for x in loader:
                x = x.cuda(non_blocking=True)
                loss = model(x, ["a", "b"], [1.0, 2.0]).sum()
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    line = line_of(src, "return torch.sum(x[:, row]")
    assert (line, "GB011") in found, found
    assert [r for r in found if r[0] == line] == [(line, "GB011")], found
    assert not [r for r in found if r[0] == line_of(src, "picked = np.asarray(table)[row]")], found


def test_a_def_handed_the_scripts_module_runs_on_the_device(tmp_path):
    """SASRec's `evaluate(model, dataset, args)` lives in utils.py, which never names a device; main.py hands it the
    model it moved to the GPU. Its per-user `model.predict(...)` uploads and the `.item()` of each rank are per
    step of that evaluation loop. A def of such a file handed only host data (a numpy table) stays CPU code."""
    found = project_rules(tmp_path, {
        "model.py": """
            import torch


            class Rec(torch.nn.Module):
                def __init__(self, n, args):
                    super().__init__()
                    self.dev = args.device
                    self.emb = torch.nn.Embedding(n, 16)

                def forward(self, seqs):
                    return self.emb(torch.as_tensor(seqs, device=self.dev)).sum()

                def predict(self, seqs, items):
                    feats = self.emb(torch.LongTensor(seqs).to(self.dev))
                    return feats @ self.emb(torch.LongTensor(items).to(self.dev)).t()
            """,
        "utils.py": """
            import numpy as np
            import torch


            def evaluate(model, data, args):
                total = 0.0
                for u in range(100):
                    seq = np.zeros([args.maxlen], dtype=np.int32)
                    predictions = -model.predict(np.array([seq]), np.array([data[u]]))
                    rank = predictions.argsort().argsort()[0].item()
                    total += rank
                return total


            def summarize(table, args):
                out = 0.0
                for u in range(100):
                    out += torch.from_numpy(table[u]).sum().item()
                return out
            """,
        "main.py": """
            import torch
            from model import Rec
            from utils import evaluate, summarize


            def main(args, data, loader, table):
                model = Rec(100, args).to(args.device)
                opt = torch.optim.Adam(model.parameters())
                for epoch in range(args.epochs):
                    for seqs in loader:
                        loss = model(seqs)
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                    print(evaluate(model, data, args), summarize(table, args))
            """})
    assert ("utils.py", 11, "GB002") in found, found
    assert ("model.py", 15, "GB001") in found, found
    assert not [f for f in found if f[:2] == ("utils.py", 19)], found


def test_a_project_function_named_like_a_generator_is_no_model(tmp_path):
    """TCN's `X_train, X_valid, X_test = data_generator(args.data)`: a function of the project (it loads arrays with
    scipy), not a GAN's generator module whose output would be device tensors; `X_data[idx]` with a numpy index is
    a host lookup. A name bound to a module (`generator = Generator()`) still runs a forward."""
    found = project_rules(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/utils.py": """
            from scipy.io import loadmat


            def data_generator(path):
                data = loadmat(path)
                return data["traindata"][0], data["validdata"][0]
            """,
        "music.py": """
            import numpy as np
            import torch
            from pkg.utils import data_generator

            X_train, X_valid = data_generator("JSB.mat")
            model = torch.nn.Linear(88, 88)
            model.cuda()
            generator = torch.nn.Linear(8, 88).cuda()
            optimizer = torch.optim.Adam(model.parameters())


            def evaluate(X_data):
                for idx in np.arange(len(X_data), dtype="int32"):
                    x = X_data[idx].cuda()
                    fake = generator(torch.randn(4, 8, device="cuda"))
                    print(model(x).sum().item(), fake[np.array([0, 1])].sum())


            for epoch in range(10):
                for idx in range(len(X_train)):
                    loss = model(X_train[idx].cuda(non_blocking=True)).sum()
                    loss.backward()
                    optimizer.step()
                evaluate(X_valid)
            """})
    lines = {f[1] for f in found if f[0] == "music.py" and f[2] == "GB011"}
    assert lines == {17}, found


def test_a_scripts_own_set_up_learns_the_loaders_a_helper_returns(tmp_path):
    """TCN's pmnist script: `train_loader, test_loader = data_generator(root, batch_size)` at module level, two
    DataLoaders built without pinned memory; `data.cuda()` of each batch is a blocking copy per step. What such a
    helper returns that is not host data (a model, a device table) is not taken from module level."""
    found = project_rules(tmp_path, {
        "utils.py": """
            import torch
            from torchvision import datasets


            def data_generator(root, batch_size):
                train_set = datasets.MNIST(root=root, train=True, download=True)
                test_set = datasets.MNIST(root=root, train=False, download=True)
                train_loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size)
                test_loader = torch.utils.data.DataLoader(test_set, batch_size=batch_size)
                return train_loader, test_loader
            """,
        "pmnist.py": """
            import torch
            from utils import data_generator

            train_loader, test_loader = data_generator("./data", 64)
            model = torch.nn.Linear(784, 10).cuda()
            optimizer = torch.optim.Adam(model.parameters())


            def train(epoch):
                for batch_idx, (data, target) in enumerate(train_loader):
                    data, target = data.cuda(), target.cuda()
                    loss = torch.nn.functional.cross_entropy(model(data.view(-1, 784)), target)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()


            for epoch in range(10):
                train(epoch)
            """})
    assert ("pmnist.py", 12, "GB009") in found, found


def test_an_assert_that_a_parameter_is_a_numpy_array_types_it():
    """Analytic-DPM's samplers begin `assert isinstance(betas, np.ndarray) and betas[0] == 0`: the noise schedule and
    all made from it (`alphas = 1. - betas`, `alphas[s + 1: r + 1].prod()`) are numpy, and their `.item()` in the
    sampling loop reads nothing from the GPU. Without the assert, the same `.item()` of an untyped parameter's
    product beside the device sample is still reported."""
    src = textwrap.dedent("""
        import numpy as np
        import torch


        def sample(x_init, betas, model):
            assert isinstance(betas, np.ndarray) and betas[0] == 0
            alphas = 1. - betas
            x = x_init
            for s in range(len(betas) - 1, 0, -1):
                skip = alphas[s:].prod()
                print(skip.item())
                x = model(x) * skip
            return x


        def sample_untyped(x_init, betas, model):
            alphas = 1. - betas
            x = x_init
            for s in range(len(betas) - 1, 0, -1):
                skip = alphas[s:].prod()
                print(skip.item())
                x = model(x) * skip
            return x


        def main(model, betas):
            model.cuda()
            x = torch.randn(4, 3, device="cuda")
            return sample(x, betas, model), sample_untyped(x, betas, model)
    """)
    found = rules(src)
    lines = sorted(r[0] for r in found if r[1] == "GB002")
    second = next(i for i, t in enumerate(src.splitlines(), 1) if "print(skip.item())" in t
                  and i > line_of(src, "def sample_untyped"))
    assert lines == [second], found


def test_a_generator_that_yields_what_it_moves_to_the_gpu_is_a_device_loader():
    """modded-nanogpt's `distributed_data_generator(...)` yields `(x.to(device="cuda", non_blocking=True), ...)`:
    `next(train_loader)` gives device tensors, and an index made from them (`torch.zeros_like(inputs)`) is on the
    device too. A generator that yields host tensors (`yield x, y`) is still a host loader."""
    src = textwrap.dedent("""
        import torch


        def data_generator(tokens, n):
            pos = 0
            while True:
                buf = tokens[pos:pos + n + 1]
                pos += n
                yield (buf[:-1].to(device="cuda", non_blocking=True), buf[1:].to(device="cuda", non_blocking=True))


        def host_generator(tokens, n):
            pos = 0
            while True:
                buf = tokens[pos:pos + n + 1]
                pos += n
                yield buf[:-1], buf[1:]


        def train(model, table, opt, tokens, steps):
            model.cuda()
            train_loader = data_generator(tokens, 1024)
            for step in range(steps):
                inputs, targets = next(train_loader)
                sign_idx = torch.zeros_like(inputs)
                loss = model(inputs, table[sign_idx], targets)
                loss.backward()
                opt.step()


        def train_host(model, table, opt, tokens, steps):
            model.cuda()
            host_loader = host_generator(tokens, 1024)
            for step in range(steps):
                inputs, targets = next(host_loader)
                inputs = inputs.cuda()
                loss = model(inputs, targets.cuda())
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    assert not [r for r in found if r[0] == line_of(src, "loss = model(inputs, table[sign_idx], targets)")], found
    assert (line_of(src, "inputs = inputs.cuda()"), "GB009") in found or \
        (line_of(src, "inputs = inputs.cuda()"), "GB010") in found, found
