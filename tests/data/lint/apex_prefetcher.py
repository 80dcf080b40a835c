import torch


class DataPrefetcher:
    def __init__(self, loader, device):
        self.loader = iter(loader)
        self.stream = torch.cuda.Stream()
        self.device = device
        self.preload()

    def preload(self):
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = None
            self.next_target = None
            return
        with torch.cuda.stream(self.stream):
            self.next_input = self.next_input.to(self.device, non_blocking=True)
            self.next_target = self.next_target.to(self.device, non_blocking=True)

    def next(self):
        torch.cuda.current_stream().wait_stream(self.stream)
        inp, tgt = self.next_input, self.next_target
        if inp is not None:
            inp.record_stream(torch.cuda.current_stream())
        self.preload()
        return inp, tgt


def train(loader, model, criterion, optimizer, device):
    prefetcher = DataPrefetcher(loader, device)
    inp, tgt = prefetcher.next()
    i = 0
    while inp is not None:
        out = model(inp)
        loss = criterion(out, tgt)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        inp, tgt = prefetcher.next()
        i += 1
        if i % 100 == 0:
            torch.cuda.synchronize()
            print(i, loss.item())
