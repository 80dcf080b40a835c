import torch


def train_detector(model, loader, criterion, optimizer, device, score_thresh=0.5):
    model.train()
    skipped = 0
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        boxes = targets["boxes"].to(device, non_blocking=True)
        out = model(images)
        keep = out["scores"] > score_thresh
        if keep.sum() == 0:  # expect: GB007
            skipped += 1
            continue
        kept = out["boxes"][keep]  # expect: GB008
        idx = torch.nonzero(keep).squeeze(1)  # expect: GB008
        loss = criterion(kept, boxes[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out["boxes"][~keep] = 0
        safe = torch.where(keep[:, None], out["boxes"], torch.zeros_like(out["boxes"]))
        del safe
    return skipped
