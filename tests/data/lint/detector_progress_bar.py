"""A detector's epoch: the progress bar iterates an enumerated loader, the labels move to the GPU
inside the loss call, and the bar's text is %-formatted from a device tensor of running means on
every step of the main rank."""
import numpy as np
import torch
from tqdm import tqdm

RANK = -1


def train_epoch(model, loader, optimizer, scaler, criterion, device, epoch, warmup_iters, accumulate=1):
    running = torch.zeros(3, device=device)
    bar = enumerate(loader)
    if RANK in (-1, 0):
        bar = tqdm(bar, total=len(loader))
    optimizer.zero_grad()
    for i, (images, labels, _paths) in bar:
        images = images.to(device, non_blocking=True).float() / 255
        if i <= warmup_iters:
            for g in optimizer.param_groups:
                g["lr"] = np.interp(i, [0, warmup_iters], [0.0, g["initial_lr"]])
        with torch.autocast("cuda"):
            preds = model(images)
            loss, parts = criterion(preds, labels.to(device))  # expect: GB009
        scaler.scale(loss).backward()
        if (i + 1) % accumulate == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        if RANK in (-1, 0):
            running = (running * i + parts) / (i + 1)
            bar.set_description(("%10s" + "%10.4g" * 3) % (f"{epoch}", *running))  # expect: GB003
    return running


def step_and_maybe_log(model, batch, optimizer, logger, step, log_every=50):
    """One step; the statistics below the early return are read only on logging steps."""
    loss = model(batch).mean()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step % log_every != 0:
        return loss.detach()
    logger.info("step %d loss %.4f norm %.3f", step, loss.item(), norm.item())
    return loss.detach()


def fit(model, loader, optimizer, logger, device):
    for step, batch in enumerate(loader):
        step_and_maybe_log(model, batch.to(device, non_blocking=True), optimizer, logger, step)


wait_gpu = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


def fit_in_lockstep(model, loader, optimizer, device):
    """Synchronizes after every step through a conditional alias, with no timer in sight."""
    for batch in loader:
        loss = model(batch.to(device, non_blocking=True)).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        wait_gpu()  # expect: GB004
