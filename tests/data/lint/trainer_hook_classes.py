"""A hook-driven trainer: the base class loops, subclasses implement one step, and a per-step
metrics writer (reached through a thin wrapper) reads every loss back to the host."""
import time

import torch


class LoopBase:
    def __init__(self):
        self.hooks = []
        self.iter = 0

    def fit(self, first, last):
        for self.iter in range(first, last):
            for h in self.hooks:
                h.before_step()
            self.one_step()
            for h in self.hooks:
                h.after_step()

    def one_step(self):
        raise NotImplementedError


class PlainLoop(LoopBase):
    def __init__(self, model, loader, optimizer):
        super().__init__()
        self.model = model
        self.loader = loader
        self.optimizer = optimizer
        self._it = iter(loader)

    def one_step(self):
        t = time.perf_counter()
        batch = next(self._it)
        wait = time.perf_counter() - t
        losses = self.model(batch)
        total = sum(losses.values())
        self.optimizer.zero_grad()
        total.backward()
        self._record(losses, wait)
        self.optimizer.step()

    def _record(self, losses, wait):
        PlainLoop.push_scalars(losses, wait)

    @staticmethod
    def push_scalars(losses, wait):
        scalars = {name: val.detach().cpu().item() for name, val in losses.items()}  # expect: GB002
        scalars["wait"] = wait
        if not all(v == v for v in scalars.values()):
            raise FloatingPointError(f"a loss is NaN: {scalars}")
        return scalars


class MixedLoop(PlainLoop):
    def __init__(self, model, loader, optimizer):
        super().__init__(model, loader, optimizer)
        self.scaler = torch.cuda.amp.GradScaler()

    def one_step(self):
        batch = next(self._it)
        with torch.autocast("cuda"):
            losses = self.model(batch)
            total = sum(losses.values())
        self.optimizer.zero_grad()
        self.scaler.scale(total).backward()
        self._record(losses, 0.0)
        if not torch.isfinite(total):  # expect: GB007
            print("non-finite loss")
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def describe(self):
        probe = self.model(next(self._it))
        probe["loss"].backward()
        return {k: v.item() for k, v in probe.items()}
