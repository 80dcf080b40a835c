"""gobrrr lint, issue 29's round on heldout49's misses (1d-tokenizer, efficientdet-pytorch, qlora, muzero-general):
each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

from tests.lintcase import project_rules as _lint

_SAMPLER = """
    import torch

    class Sampler(torch.nn.Module):
        def forward(self, model, x):
            for t in range(10):
                x = model(x) + torch.randn_like(x)
            return x
    """

_MASKGIT = """
    import torch

    class MaskGIT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
            self.decoder = torch.nn.Linear(4, 4)

        def forward(self, ids):
            x = ids
            for blk in self.blocks:
                x = blk(x)
            return self.decoder(x)

        @torch.no_grad()
        def generate(self, ids, steps, device="cuda"):
            for step in range(steps):
                logits = self.forward(ids)
                floor = torch.Tensor([1]).to(device)
                ids = torch.where(logits > floor, ids, logits)
            return ids

        @torch.no_grad()
        def sample_all(self, ids, rounds):
            for r in range(rounds):
                ids = self.decode_all(ids)
                print(ids.sum().item())
            return ids

        def decode_all(self, ids):
            for t in range(10):
                ids = self.forward(ids)
            return ids
    """


def test_self_forward_is_the_class_own_forward(tmp_path):
    """MaskGIT's sampling loop calls `self.forward(ids)`, whose forward runs its layers and no step loop. Another
    module of the project has a `forward` that holds a sampling loop; by name alone every `self.forward` call was
    taken for a call of a looping def, so the sampling loop was an outer one and its per-step upload went unreported."""
    found = _lint(tmp_path, {"sampler.py": _SAMPLER, "maskgit.py": _MASKGIT})
    assert ("maskgit.py", 20, "GB001") in found, found
    # a loop around a method of the class that holds a step loop is still an outer one: its print is once per round
    assert not [f for f in found if f[0] == "maskgit.py" and f[1] == 28], found


_BASE_TRAINER = """
    import torch

    class BaseTrainer:
        @torch.no_grad()
        def evaluate(self):
            for batch in self.eval_dataloader:
                input_ids = batch["input_ids"].to(self.accelerator.device)
                out = self.model(input_ids)
                self.scores.append(out.mean())
    """


def test_a_loader_a_subclass_prepares_yields_device_batches(tmp_path):
    """trlx's base trainer loops over `self.eval_dataloader`, which each subclass sets with
    `self.accelerator.prepare(...)` (or `prepare_data_loader`): its batches arrive on the device, and the base's
    `.to(device)` copies nothing. A subclass that sets a plain DataLoader leaves the copy a blocking one."""
    prepared = _lint(tmp_path / "prepared", {"base.py": _BASE_TRAINER, "ppo.py": """
        from torch.utils.data import DataLoader
        from base import BaseTrainer

        class PPOTrainer(BaseTrainer):
            def __init__(self, accelerator, model, ds):
                self.accelerator = accelerator
                self.model, self.eval_dataloader = self.accelerator.prepare(model, DataLoader(ds, batch_size=8))
        """})
    assert not [f for f in prepared if f[0] == "base.py"], prepared
    plain = _lint(tmp_path / "plain", {"base.py": _BASE_TRAINER, "ppo.py": """
        from torch.utils.data import DataLoader
        from base import BaseTrainer

        class PPOTrainer(BaseTrainer):
            def __init__(self, accelerator, model, ds):
                self.accelerator = accelerator
                self.model = model.cuda()
                self.eval_dataloader = DataLoader(ds, batch_size=8)
        """})
    assert ("base.py", 8, "GB009") in plain, plain
