import torch
import torch.nn.functional as F


def train(model, loader, optimizer, lr_scheduler, device, max_norm=1.0, steps=1000):
    scaler = torch.cuda.amp.GradScaler()
    losses, skipped = [], 0
    for it, (x, y) in enumerate(loader):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if grad_norm > 10 * max_norm:  # expect: GB007
            skipped += 1
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        lr_scheduler.step()
        losses.append(loss.detach())
        if it % 10 == 0:
            print(f"it {it} loss {torch.stack(losses).mean().item():.4f} gnorm {grad_norm:.2f}")
            losses.clear()
        if it + 1 == steps:
            break
    return skipped
