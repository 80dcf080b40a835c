import torch
import torch.distributed as dist


@torch.no_grad()
def gather_predictions(model, loader, device, world_size):
    all_preds = []
    for batch in loader:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        logits = model(**batch).logits
        preds = logits.argmax(-1)
        gathered = [torch.zeros_like(preds) for _ in range(world_size)]
        dist.all_gather(gathered, preds)
        all_preds.extend(torch.cat(gathered).cpu().numpy())  # expect: GB002
    return all_preds
