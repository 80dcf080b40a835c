import math
import os
import time

import numpy as np
import torch

from model import GPT, GPTConfig

batch_size, block_size, grad_accum = 12, 1024, 40
eval_interval, log_interval, eval_iters = 2000, 1, 200
max_iters, learning_rate, min_lr = 600000, 6e-4, 6e-5
device = "cuda"
device_type = "cuda" if "cuda" in device else "cpu"
data_dir = os.path.join("data", "openwebtext")


def get_batch(split):
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


model = GPT(GPTConfig())
model.to(device)
scaler = torch.cuda.amp.GradScaler(enabled=True)
optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.95), device_type)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()  # expect: GB002
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    if it < 2000:
        return learning_rate * it / 2000
    decay_ratio = (it - 2000) / (max_iters - 2000)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)


X, Y = get_batch("train")
t0 = time.time()
iter_num, best_val_loss = 0, 1e9
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss:
            best_val_loss = losses["val"]
            torch.save({"model": model.state_dict(), "iter_num": iter_num}, "ckpt.pt")
    for micro_step in range(grad_accum):
        logits, loss = model(X, Y)
        loss = loss / grad_accum
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num % log_interval == 0:
        lossf = loss.item() * grad_accum
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms")
    iter_num += 1
    if iter_num > max_iters:
        break
