"""An ImageNet training script shaped like the common public example, for `gobrrr doctor` to read.

    python examples/imagenet.py --steps 20                          # random images, a small ResNet
    python examples/imagenet.py --arch resnet50 --workers 12        # torchvision's ResNet-50, if installed
    gobrrr doctor --steps 5 examples/imagenet.py --workers 1 --slow-ms 2   # too few workers: data-bound

What it does, as the well-known script does it: a dataset of random images with labels (like
torchvision's FakeData, or `--dummy`), a DataLoader with worker processes and pinned memory, a
ResNet wrapped in DataParallel on a GPU, SGD with momentum, and per step: the batch copied with
`non_blocking=True`, forward, loss, `loss.item()` read for the running average (a sync every
step), zero_grad, backward, step. Nothing here uses gobrrr: it is the code the doctor is judged on.

`--slow-ms` makes each sample cost that many milliseconds to load (decoding JPEGs does, in real
life), so with few workers the GPU waits for data.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    """`n` random (3, side, side) images with labels, made per index (FakeData's contract)."""

    def __init__(self, n: int, side: int, classes: int, slow_ms: float = 0.0):
        self.n, self.side, self.classes, self.slow_ms = n, side, classes, slow_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.slow_ms:
            time.sleep(self.slow_ms / 1e3)  # stands for JPEG decoding and augmentation
        g = torch.Generator().manual_seed(i)
        image = torch.randn(3, self.side, self.side, generator=g)  # (3, S, S)
        return image, i % self.classes


class Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions and a shortcut (He et al. 2016)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.short = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.short = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.short(x))


class SmallResNet(nn.Module):
    """A four-stage ResNet of basic blocks, `width` channels in the first stage."""

    def __init__(self, classes: int, width: int = 16, blocks: int = 1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        layers, c = [], width
        for stage in range(4):
            c_out = width * 2 ** stage
            for b in range(blocks):
                layers.append(Block(c, c_out, 2 if stage and b == 0 else 1))
                c = c_out
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))  # (B, C, S/8, S/8)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))  # (B, classes)


def make_model(arch: str, classes: int) -> nn.Module:
    if arch == "small":
        return SmallResNet(classes)
    import torchvision  # only for the torchvision architectures

    return torchvision.models.__dict__[arch](num_classes=classes)


class Average:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, value: float, n: int = 1) -> None:
        self.sum += value * n
        self.count += n

    @property
    def avg(self) -> float:
        return self.sum / max(self.count, 1)


def accuracy(output, target):
    with torch.no_grad():
        return (output.argmax(1) == target).float().mean() * 100


def train(loader, model, criterion, optimizer, device, steps: int, print_freq: int):
    losses, data_time = Average(), Average()
    model.train()
    end = time.perf_counter()
    for i, (images, target) in enumerate(loader):
        data_time.update(time.perf_counter() - end)
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        losses.update(loss.item(), images.size(0))  # sync: the running average reads the loss every step
        acc1 = accuracy(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % print_freq == 0:
            print(f"step {i:4d}  loss {losses.avg:.4f}  acc@1 {float(acc1):5.1f}  data {data_time.avg * 1e3:.1f} ms")
        end = time.perf_counter()
        if i + 1 >= steps:
            break
    return losses.avg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="ImageNet-shaped training on random images")
    p.add_argument("--arch", default="small", help="'small' (defined here) or a torchvision model name")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("-b", "--batch-size", type=int, default=None, help="default 64 on a GPU, 8 on the CPU")
    p.add_argument("--side", type=int, default=None, help="image side (default 64 on a GPU, 32 on the CPU)")
    p.add_argument("-j", "--workers", type=int, default=4)
    p.add_argument("--slow-ms", type=float, default=0.0, help="extra load time per sample (ms)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--print-freq", type=int, default=10)
    p.add_argument("--device", default=None, help="'cuda' or 'cpu' (default: the GPU if any)")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    batch, side = args.batch_size or (64 if gpu else 8), args.side or (64 if gpu else 32)
    torch.manual_seed(0)
    model = make_model(args.arch, args.classes)
    if gpu:
        model = nn.DataParallel(model).to(device)  # the public example's single-node default
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    dataset = RandomImages(batch * (args.steps + 2), side, args.classes, args.slow_ms)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=args.workers, pin_memory=gpu,
                        persistent_workers=args.workers > 0)
    t0 = time.perf_counter()
    loss = train(loader, model, criterion, optimizer, device, args.steps, args.print_freq)
    ms = (time.perf_counter() - t0) * 1e3 / args.steps
    print(f"imagenet-shaped {args.arch} on {device}: batch {batch}x3x{side}x{side}, {args.workers} workers, "
          f"{ms:.1f} ms/step, loss {loss:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
