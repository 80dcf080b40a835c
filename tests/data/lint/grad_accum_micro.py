import torch


def train(model, train_loader, optimizer, device, num_steps, grad_accum, master_process=True):
    train_iter = iter(train_loader)
    for step in range(num_steps):
        train_loss = 0.0
        for micro in range(grad_accum):
            x, y = next(train_iter)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = model(x, y) / grad_accum
            loss.backward()
            train_loss += loss.item()  # expect: GB002
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        if master_process and step % 10 == 0:
            print(f"step {step} loss {train_loss:.4f} norm {norm.item():.3f}")
