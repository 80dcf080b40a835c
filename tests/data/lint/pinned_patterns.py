import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


def make_loader(ds, use_cuda):
    kwargs = {"num_workers": 4, "pin_memory": True} if use_cuda else {}
    return DataLoader(ds, batch_size=64, shuffle=True, **kwargs)


def train(model, ds, opt, device, special_ids, use_cuda=True):
    loader = make_loader(ds, use_cuda)
    staging = torch.empty(64, 1024, pin_memory=True)
    for step, (x, y) in enumerate(loader):
        staging.copy_(x)
        xb = staging.to(torch.bfloat16).to(device, non_blocking=True)  # expect: GB005
        yb = torch.as_tensor(y, dtype=torch.long).pin_memory().to(device, non_blocking=True)
        ids = torch.tensor(special_ids, dtype=torch.long, pin_memory=True).cuda(non_blocking=True)
        mask = torch.ones(x.size(0)).to(device)  # expect: GB001
        loss = F.cross_entropy(model(xb, ids) * mask[:, None], yb)
        loss.backward()
        opt.step()
        opt.zero_grad()


def train_kwargs_loader(model, ds, opt, device, cuda_kwargs):
    train_kwargs = {"batch_size": 64}
    train_kwargs.update(cuda_kwargs)
    loader = DataLoader(ds, **train_kwargs)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def train_pageable(model, ds, opt, device):
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4)  # expect: GB006
    for x, y in loader:
        x = x.to(device, non_blocking=True)  # expect: GB005
        y = y.to(device, non_blocking=True)  # expect: GB005
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
