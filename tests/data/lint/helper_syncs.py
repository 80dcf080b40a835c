import torch
import torch.nn.functional as F
from torch.utils.tensorboard import SummaryWriter

synchronize = torch.cuda.synchronize


def accuracy(logits, target):
    return (logits.argmax(dim=-1) == target).float().mean().item()  # expect: GB002


def log_grad_norm(model, writer, step):
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += p.grad.norm().item() ** 2  # expect: GB002
    writer.add_scalar("grad_norm", total ** 0.5, step)


def wait_all():
    synchronize()  # expect: GB004


def summary(history):
    return sum(history) / max(len(history), 1)


def train(model, loader, optimizer, device, log_dir, epochs):
    writer = SummaryWriter(log_dir)
    history = []
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            log_grad_norm(model, writer, step)
            optimizer.step()
            optimizer.zero_grad()
            acc = accuracy(logits, y)
            history.append(acc)
            wait_all()
            writer.add_scalar("loss", loss, step)  # expect: GB003
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.3f} acc {acc:.3f}")
        print(f"epoch {epoch}: mean acc {summary(history):.3f}, last loss {loss.item():.3f}")
