import torch
from torchvision import datasets, transforms


def mean_std(root):
    ds = datasets.ImageFolder(root, transform=transforms.ToTensor())
    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=4)
    mean, sq, n = torch.zeros(3), torch.zeros(3), 0
    for x, _ in loader:
        mean += x.mean(dim=(0, 2, 3)) * x.size(0)
        sq += (x ** 2).mean(dim=(0, 2, 3)) * x.size(0)
        n += x.size(0)
        if x.isnan().any():
            print("nan in batch", x.sum().item())
    mean = mean / n
    std = (sq / n - mean ** 2).sqrt()
    return mean.tolist(), std.tolist()


def tokenize_corpus(texts, tokenizer, max_len=512):
    ids = []
    for t in texts:
        enc = torch.tensor(tokenizer.encode(t))
        if enc.numel() > 0 and enc.max().item() < tokenizer.vocab_size:
            ids.append(enc[:max_len])
    lengths = torch.tensor([len(i) for i in ids])
    print("mean length", lengths.float().mean().item())
    return ids
