import torch
from torch.utils.data import DataLoader


def pad_collate(batch):
    xs = [torch.as_tensor(b["x"]) for b in batch]
    lens = torch.tensor([len(x) for x in xs])
    out = torch.zeros(len(xs), lens.max().item(), dtype=torch.long)
    for i, x in enumerate(xs):
        out[i, : len(x)] = x
        if x.sum() > 0:
            out[i, 0] = 1
    return out, lens


def bucket_indices(lengths, bucket):
    order = torch.argsort(torch.tensor(lengths))
    return [order[i:i + bucket].tolist() for i in range(0, len(order), bucket)]


def make_loader(ds, device):
    return DataLoader(ds, batch_size=32, collate_fn=pad_collate, pin_memory=device.type == "cuda", num_workers=4)
