import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


def train(model, loader, optimizer, device, max_steps):
    model.train()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        try:
            logits = model(x)
        except torch.cuda.OutOfMemoryError:
            logger.error("OOM at step %d with batch %s (last loss %.3f)", step, tuple(x.shape), loss.item())
            torch.cuda.empty_cache()
            continue
        loss = F.cross_entropy(logits, y)
        assert loss.dim() == 0, f"loss must be a scalar, got {loss}"
        if not torch.isfinite(loss):  # expect: GB007
            raise RuntimeError(f"loss is {loss.item()} at step {step}; lower the learning rate")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= max_steps:
            print(f"done at step {step}, loss {loss.item():.4f}")
            break
