import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


def build_model(cfg):
    return nn.Sequential(nn.Linear(cfg.d_in, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.classes))


def setup(cfg, device):
    model = build_model(cfg)
    model = model.to(device)
    ema = copy.deepcopy(model).eval()
    for p in ema.parameters():
        p.requires_grad_(False)
    pos = torch.arange(cfg.seq_len).cuda()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if name.endswith("bias") or p.ndim == 1:
            no_decay.append(p)
        else:
            decay.append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}])
    return model, ema, optimizer, pos


def train(model, ema, loader, optimizer, device, cfg):
    model.train()
    for step, batch in enumerate(loader):
        images = batch["image"].to(device, non_blocking=True)
        labels = batch["label"].to(device, non_blocking=True)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for name, p in model.named_parameters():
            if name.endswith("bias") or p.ndim == 1:
                continue
            if hasattr(p, "skip_decay") or p.grad is None:
                continue
            if torch.is_complex(p.grad):
                continue
        optimizer.step()
        with torch.no_grad():
            for e, m in zip(ema.parameters(), model.parameters()):
                e.mul_(cfg.decay).add_(m.detach(), alpha=1 - cfg.decay)
        module = model.module if hasattr(model, "module") else model
        if isinstance(module, nn.Module) and module.training:
            module = module.cuda()
        if step == cfg.max_steps:
            break
