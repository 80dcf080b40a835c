"""gobrrr lint, issue 29's round 75 on heldout146-149's first sights (Speech-Backbones, GraphMAE, BERT4Rec-VAE,
FEDformer; Anomaly-Transformer, Graph-WaveNet, pixel-nerf, ParallelWaveGAN; KnowledgeGraphEmbedding, SELFRec, DeepSDF,
demucs; mvts_transformer, tabm, GCNII, point-transformer), and the neighbours each rule must keep quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules

# SELFRec's graph encoders, reduced: a module whose forward takes no input and returns its own tables
ENCODER = textwrap.dedent("""


    class Encoder(torch.nn.Module):
        def __init__(self, n_users, n_items):
            super().__init__()
            self.users = torch.nn.Parameter(torch.randn(n_users, 8))
            self.items = torch.nn.Parameter(torch.randn(n_items, 8))

        def forward(self):
            return self.users * 2, self.items * 2
""")


def test_a_collate_of_host_samples_is_host_code():
    """NeMo's `_collate_fn(batch)` and GraphMAE's masking collate stack host samples (`.item()` of CPU lengths):
    the loader runs them on the host, and nothing there waits for the GPU. A collate that moves the batch to the
    device itself (`collate_fn=partial(collate, device=device)`), or builds it there (Chinese-Vicuna's
    `torch.tensor(ids, device=device)` per sample), is still walked per batch."""
    src = textwrap.dedent("""
        from functools import partial

        import torch


        def host_collate(batch):
            signals, lengths = zip(*batch)
            longest = max(lengths).item()
            return torch.stack([torch.nn.functional.pad(s, (0, longest - len(s))) for s in signals])


        def device_collate(batch, device):
            x = torch.stack(batch).to(device)
            print(x.sum().item())
            return x


        def built_collate(batch):
            device = "cuda:0"
            labels = []
            for sample in batch:
                labels.append(torch.tensor(sample["ids"], device=device))
            return labels


        def train(dataset, model, opt, device):
            model.cuda()
            a = torch.utils.data.DataLoader(dataset, collate_fn=host_collate, pin_memory=True)
            b = torch.utils.data.DataLoader(dataset, collate_fn=partial(device_collate, device=device))
            c = torch.utils.data.DataLoader(dataset, collate_fn=built_collate)
            for x, y, z in zip(a, b, c):
                loss = model(x.cuda(non_blocking=True) + y + z[0]).sum()
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    assert not [r for r in found if r[0] == line_of(src, "longest = max(lengths).item()")], found
    assert (line_of(src, "print(x.sum().item())"), "GB002") in found, found
    assert (line_of(src, 'labels.append(torch.tensor(sample["ids"], device=device))'), "GB010") in found, found


def test_a_flag_bound_to_another_backends_test_keeps_its_branch_off_the_gpu_path():
    """demucs' `is_mps = x.device.type == 'mps'; if is_mps: x = x.cpu()` (and `if x.is_mps:`): on a CUDA GPU the
    branch never runs. A flag bound to a CUDA test (`on_gpu = x.is_cuda`) keeps its branch on the path."""
    src = textwrap.dedent("""
        import torch


        def spectro(x, n_fft=512):
            is_mps = x.device.type == 'mps'
            if is_mps:
                x = x.cpu()
            z = torch.stft(x, n_fft, window=torch.hann_window(n_fft, device=x.device), return_complex=True)
            if x.is_mps:
                z = z.cpu()
            on_gpu = x.is_cuda
            if on_gpu:
                print(z.abs().max().item())
            return z


        def train(model, loader, opt):
            model.cuda()
            for x in loader:
                x = x.cuda(non_blocking=True)
                loss = model(spectro(x)).abs().mean()
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    assert not [r for r in found if r[0] in (line_of(src, "x = x.cpu()"), line_of(src, "z = z.cpu()"))], found
    assert (line_of(src, "print(z.abs().max().item())"), "GB002") in found, found


def test_a_graphs_node_count_is_a_python_int():
    """GraphMAE's `num_nodes = g.num_nodes()` of a DGL graph moved to the GPU, then `torch.randperm(num_nodes, device=
    ...)` and `int(mask_rate * num_nodes)`: counts the graph keeps on the host. A tensor's own count read
    through a reduction (`mask.sum()`) is still a device scalar."""
    src = textwrap.dedent("""
        import torch


        def mask_nodes(g, x, mask, rate=0.3):
            num_nodes = g.num_nodes()
            perm = torch.randperm(num_nodes, device=x.device)
            num_mask = int(rate * num_nodes)
            kept = int(mask.sum())
            return perm[:num_mask], kept


        def train(model, loader, opt):
            model.cuda()
            for g in loader:
                g = g.to("cuda")
                x = g.ndata["feat"]
                nodes, kept = mask_nodes(g, x, x[:, 0] > 0)
                loss = model(g, x[nodes]).sum() * kept
                loss.backward()
                opt.step()
    """)
    found = rules(src)
    quiet = {line_of(src, "perm = torch.randperm(num_nodes"), line_of(src, "num_mask = int(rate * num_nodes)")}
    assert not [r for r in found if r[0] in quiet], found
    assert (line_of(src, "kept = int(mask.sum())"), "GB002") in found, found


def test_a_trainer_kept_in_dicts_and_its_eval_method_make_step_loops(tmp_path):
    """ParallelWaveGAN's `for batch in tqdm(self.data_loader["dev"])` (a loader kept in a dict under a constant key)
    around `self._eval_step(batch)`, and Graph WaveNet's `engine.eval(testx, testy)` (a trainer's own `def eval(self,
    input, real)`, not `Module.eval()`): each is an evaluation loop, its per-batch `.item()` per step. A module's
    `model.eval()` beside them stays housekeeping."""
    found = project_rules(tmp_path, {
        "engine.py": """
            import torch


            class Engine:
                def __init__(self, model):
                    self.model = model

                def eval(self, input, real):
                    self.model.eval()
                    out = self.model(input)
                    return (out - real).abs().mean().item()

                def train(self, input, real):
                    self.model.train()
                    loss = (self.model(input) - real).abs().mean()
                    loss.backward()
                    self.optimizer.step()
            """,
        "train.py": """
            import torch
            from tqdm import tqdm
            from engine import Engine


            class Trainer:
                def __init__(self, model, data_loader, optimizer, device):
                    self.model, self.data_loader, self.optimizer, self.device = model, data_loader, optimizer, device
                    self.total = 0.0

                def _eval_step(self, batch):
                    x, y = batch
                    loss = (self.model["generator"](x.to(self.device, non_blocking=True)) - y.to(self.device,
                                                                                               non_blocking=True)).abs().mean()
                    self.total += loss.item()

                def _eval_epoch(self):
                    self.model["generator"].eval()
                    for i, batch in enumerate(tqdm(self.data_loader["dev"], desc="[eval]"), 1):
                        self._eval_step(batch)


            def main(loader, dataloader, device, epochs):
                net = torch.nn.Linear(4, 4).to(device)
                Trainer({"generator": net}, {"dev": loader}, None, device)._eval_epoch()
                engine = Engine(net)
                for i in range(epochs):
                    for x, y in dataloader["train_loader"].get_iterator():
                        engine.train(torch.Tensor(x).to(device), torch.Tensor(y).to(device))
                    for x, y in dataloader["val_loader"].get_iterator():
                        testx = torch.Tensor(x).to(device)
                        metrics = engine.eval(testx, torch.Tensor(y).to(device))
            """})
    assert ("train.py", 16, "GB002") in found, found
    assert ("train.py", 33, "GB001") in found, found
    assert ("engine.py", 12, "GB002") in found, found


def test_a_forward_that_repeats_itself_makes_no_caller_of_forward_an_outer_loop(tmp_path):
    """StyleMelGAN's discriminator `forward` loops `for _ in range(self.repeats)`; a generator's `inference(c)` calls
    `self.forward(c)`. The decode loop over utterances that calls `model.inference(c)` is still the step loop: its
    per-utterance upload and read-back are per step, not an outer loop's."""
    found = project_rules(tmp_path, {
        "models.py": """
            import torch


            class Discriminator(torch.nn.Module):
                def __init__(self, repeats=2):
                    super().__init__()
                    self.repeats = repeats
                    self.layer = torch.nn.Linear(4, 1)

                def forward(self, x):
                    outs = []
                    for _ in range(self.repeats):
                        outs += self._forward(x)
                    return outs

                def _forward(self, x):
                    return [self.layer(x)]


            class Generator(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.layer = torch.nn.Linear(4, 4)

                def forward(self, c):
                    return self.layer(c)

                def inference(self, c, normalize_before=False):
                    return self.forward(c)
            """,
        "decode.py": """
            import numpy as np
            import torch
            from tqdm import tqdm
            from models import Generator



            def main(dataset):
                device = torch.device("cuda")
                model = Generator().to(device)
                with torch.no_grad(), tqdm(dataset, desc="[decode]") as pbar:
                    for idx, (utt_id, c) in enumerate(pbar, 1):
                        batch = dict(normalize_before=False)
                        c = torch.tensor(c, dtype=torch.float).to(device)
                        batch.update(c=c)
                        y = model.inference(**batch)
                        print(utt_id, y.cpu().numpy().shape)
            """})
    assert ("decode.py", 15, "GB001") in found or ("decode.py", 15, "GB010") in found, found
    assert ("decode.py", 18, "GB002") in found, found


def test_a_library_progress_wrapper_given_a_loader_is_that_loader():
    """demucs' `logprog = LogProgress(logger, data_loader, total=n)` (dora's progress logger) then
    `for idx, sources in enumerate(logprog)`: the batches of an unpinned DataLoader, copied per step. A project class
    handed a loader (a trainer) is not taken for one."""
    src = textwrap.dedent("""
        import torch
        from dora.log import LogProgress


        class Runner:
            def __init__(self, loader):
                self.loader = loader


        def run_epoch(model, dataset, opt, logger, device):
            model.to(device)
            data_loader = torch.utils.data.DataLoader(dataset, batch_size=8)
            logprog = LogProgress(logger, data_loader, total=len(data_loader))
            runner = Runner(data_loader)
            for idx, sources in enumerate(logprog):
                sources = sources.to(device)
                loss = model(sources).abs().mean()
                loss.backward()
                opt.step()
            return runner
    """)
    found = rules(src)
    assert (line_of(src, "sources = sources.to(device)"), "GB009") in found, found


def test_a_device_name_bound_to_a_cpu_string_is_the_cpu():
    """demucs' evaluation: `eval_device = 'cpu'`, then `references.to(eval_device)` of host audio and `estimate.cpu()`
    of estimates already moved there: host to host, no wait. A name bound to 'cuda' is still the GPU."""
    src = textwrap.dedent("""
        import numpy as np
        import torch


        def evaluate(model, tracks):
            eval_device = 'cpu'
            run_device = 'cuda'
            model.to(run_device)
            for track in tracks:
                mix = torch.from_numpy(track.audio)
                estimates = model(mix.to(run_device, non_blocking=True))
                estimates = estimates.to(eval_device)
                references = torch.from_numpy(track.targets).to(eval_device)
                print(estimates.cpu().mean(), references.mean())
    """)
    found = rules(src)
    quiet = {line_of(src, "references = torch.from_numpy(track.targets).to(eval_device)"),
             line_of(src, "print(estimates.cpu().mean(), references.mean())")}
    assert not [r for r in found if r[0] in quiet], found
    assert (line_of(src, "estimates = estimates.to(eval_device)"), "GB002") in found, found


def test_a_generator_of_id_lists_and_a_module_called_on_nothing():
    """SELFRec: `for n, batch in enumerate(next_batch_pairwise(data, bs))` of a project generator that yields the
    Python lists it builds (`u_idx.append(...)`, `yield u_idx, i_idx, j_idx`), and `rec_user_emb, rec_item_emb =
    model()` of an encoder whose forward takes no input: `rec_user_emb[user_idx]` indexes device embeddings with a
    host list every step. A generator that yields tensors it does not build as lists stays unknown."""
    src = textwrap.dedent("""
        import random

        import torch


        def next_batch_pairwise(data, batch_size):
            ptr = 0
            while ptr < len(data):
                u_idx, i_idx = [], []
                for user, item in data[ptr:ptr + batch_size]:
                    u_idx.append(user)
                    i_idx.append(item)
                ptr += batch_size
                yield u_idx, i_idx
    """) + ENCODER + textwrap.dedent("""

        def train(data, epochs):
            model = Encoder(100, 100).cuda()
            opt = torch.optim.Adam(model.parameters())
            for epoch in range(epochs):
                for n, batch in enumerate(next_batch_pairwise(data, 64)):
                    user_idx, pos_idx = batch
                    rec_user_emb, rec_item_emb = model()
                    loss = (rec_user_emb[user_idx] * rec_item_emb[pos_idx]).sum()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
    """)
    found = rules(src)
    assert (line_of(src, "loss = (rec_user_emb[user_idx] * rec_item_emb[pos_idx]).sum()"), "GB011") in found, found


def test_a_module_called_on_nothing_through_the_name_it_was_moved_into():
    """SELFRec's recommenders keep the encoder on the object (`self.model = LGCN_Encoder(...)`) and step a moved
    name: `model = self.model.cuda()`, then `rec_user_emb, rec_item_emb = model()` in the batch loop; the encoder's
    forward takes no input, and the embeddings it returns are on the device."""
    src = textwrap.dedent("""
        import numpy as np
        import torch
    """) + ENCODER + textwrap.dedent("""

        class Recommender:
            def __init__(self, n_users, n_items):
                self.model = Encoder(n_users, n_items)

            def train(self, batches):
                model = self.model.cuda()
                opt = torch.optim.Adam(model.parameters())
                for users, items in batches:
                    user_idx, pos_idx = np.asarray(users), np.asarray(items)
                    rec_user_emb, rec_item_emb = model()
                    loss = (rec_user_emb[user_idx] * rec_item_emb[pos_idx]).sum()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
    """)
    found = rules(src)
    assert (line_of(src, "loss = (rec_user_emb[user_idx] * rec_item_emb[pos_idx]).sum()"), "GB011") in found, found
