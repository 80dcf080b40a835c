import time

import torch
import torchvision


def benchmark(model, x, iters=50, warmup=5):
    for _ in range(warmup):
        model(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        model(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def per_iteration_ms(fn, x, n=20):
    times = []
    for _ in range(n):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def main():
    model = torchvision.models.resnet50().cuda().eval()
    for bs in [1, 8, 32, 64]:
        x = torch.randn(bs, 3, 224, 224).cuda()
        with torch.no_grad():
            sec = benchmark(model, x)
        print(f"batch {bs}: {sec * 1e3:.2f} ms, {bs / sec:.0f} img/s")
        print(min(per_iteration_ms(model, x)))


if __name__ == "__main__":
    main()
