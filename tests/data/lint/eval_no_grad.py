import torch
import torch.nn.functional as F


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        logits = model(images)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()  # expect: GB002
        correct += (logits.argmax(1) == labels).sum().item()  # expect: GB002
        total += labels.size(0)
    return correct / total, loss_sum / total


@torch.no_grad()
def evaluate_on_device(model, loader, device):
    """The same, with the counts kept on the device and read once."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    loss_sum = torch.zeros((), device=device)
    n = 0
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        logits = model(images)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum")
        correct += (logits.argmax(1) == labels).sum()
        n += labels.numel()
    return correct.item() / n, loss_sum.item() / n


def confusion_matrix(model, loader, num_classes, device):
    cm = torch.zeros(num_classes, num_classes, dtype=torch.long, device=device)
    with torch.inference_mode():
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            pred = model(x).argmax(dim=1)
            cm.index_put_((y, pred), torch.ones_like(y), accumulate=True)
    return cm.cpu()
