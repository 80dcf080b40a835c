"""A trainer whose batches come from a generator method: the generator moves each batch to the
device, and the step method pulls micro-batches from it. The copies in the generator run once per
batch, but nothing in the syntax ties the generator's loop to the step loop (a known miss)."""
import torch


class Trainer:
    def batches(self, source):
        it = iter(source)
        while True:
            try:
                inputs, labels = next(it)
            except StopIteration:
                return
            inputs = inputs.to(self.device)  # known-miss: GB009
            labels = labels.to(self.device)  # known-miss: GB009
            yield inputs, labels

    def train_step(self, batches):
        self.optimizer.zero_grad()
        for _ in range(self.accum):
            inputs, labels = next(batches)
            loss = self.loss_fn(self.model(inputs), labels) / self.accum
            loss.backward()
        self.optimizer.step()
        if not self.should_log(self.step):
            return
        self.log(self.step, loss.detach().item())

    def fit(self, loader, steps):
        batches = self.batches(loader)
        while self.step < steps:
            self.step += 1
            self.train_step(batches)
