"""A user's script in one process (issue 28): model on the GPU, Prefetchers over pinned, pageable and worker
sources, a new Prefetcher per epoch over the same DataLoader, a second loader alive, one dropped mid-epoch,
and garbage that holds CUDA memory (the state in which forked workers used to die of SIGABRT).

Every batch is checked against a float64 CPU reference, so a race shows up as a wrong sum."""
from __future__ import annotations

import gc

import pytest
import torch
from torch.testing import assert_close
from torch.utils.data import DataLoader, Dataset, get_worker_info

import gobrrr

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]
B, S = 32, 24   # batches (B, 3, S, S) float32


class Shards(Dataset):
    """Item i: stored batch i % n and its index; in a worker, a full garbage collection first (a busy
    worker gets one sooner or later; here every item, so that the parent's garbage is seen at once)."""

    def __init__(self, batches: list[torch.Tensor], length: int, collect: bool = True):
        self.batches, self.length, self.collect = batches, length, collect

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        if self.collect and get_worker_info() is not None:
            gc.collect()
        return self.batches[i % len(self.batches)], torch.tensor(i)


def cuda_garbage(pinned: torch.Tensor) -> None:
    """Leave unreachable cycles holding a pinned block a copy read and a device block used on two streams:
    freeing either calls CUDA (torch records an event for each stream that used it)."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        dev = pinned.to("cuda", non_blocking=True)
    dev.record_stream(torch.cuda.current_stream())
    box: dict = {"pinned": pinned.clone().pin_memory(), "dev": dev}
    box["box"] = box
    with torch.cuda.stream(side):
        box["pinned"].to("cuda", non_blocking=True)
    torch.cuda.synchronize()


def checksum(x: torch.Tensor) -> torch.Tensor:
    return x.double().sum(dim=(1, 2, 3))          # (B,) on the device


def test_a_users_script_in_one_process():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(3 * S * S, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).cuda()
    g = torch.Generator().manual_seed(1)
    pageable = [torch.randn(B, 3, S, S, generator=g) for _ in range(6)]
    pinned = [t.pin_memory() for t in pageable]
    want = [t.double().sum(dim=(1, 2, 3)) for t in pageable]
    gc.collect()
    gc.disable()   # keep the garbage below uncollected in this process until the workers have forked
    try:
        cuda_garbage(pinned[0])
        # 1. pinned tensors through a generator; the Prefetcher is left un-closed in a dropped cycle
        pf = gobrrr.Prefetcher((pinned[i % 6] for i in range(40)), device="cuda")
        for i, x in enumerate(pf):
            model(x).sum()
            assert_close(checksum(x).cpu(), want[i % 6])
            if i == 20:
                break
        holder: dict = {"pf": pf, "it": iter(pf)}
        holder["me"] = holder
        del holder, pf
        # 2. pageable tensors: pinned by the ring's threads; dropped in a cycle too, mid-epoch
        pf = gobrrr.Prefetcher([pageable[i % 6] for i in range(30)], device="cuda")
        it = iter(pf)
        for i in range(12):
            x = next(it)
            model(x).sum()
            assert_close(checksum(x).cpu(), want[i % 6])
        holder = {"pf": pf, "it": it}
        holder["me"] = holder
        del holder, pf, it, x
        # 3. a second loader, alive for the rest of the script (a validation DataLoader). torch's own workers
        #    are forked with the same garbage and would die the same way if they collected it: not ours to fix
        other = DataLoader(Shards(pageable, 10 ** 4, collect=False), batch_size=None, num_workers=2, pin_memory=True,
                           persistent_workers=True)
        other_it = iter(other)
        for _ in range(5):
            xv, iv = next(other_it)
            assert_close(checksum(xv.cuda(non_blocking=True)).cpu(), want[int(iv) % 6])
        # 4. the training loader: a new Prefetcher per epoch over the same DataLoader (its workers fork
        #    while all the garbage above is still there); epoch 1 is dropped mid-epoch
        train = DataLoader(Shards(pageable, 24), batch_size=None, num_workers=3, shuffle=True,
                           generator=torch.Generator().manual_seed(2))
        seen = []
        for epoch in range(3):
            pf = gobrrr.Prefetcher(train, device="cuda")
            got = []
            for k, (x, i) in enumerate(pf):
                model(x).sum()
                assert_close(checksum(x).cpu(), want[int(i) % 6])
                got.append(int(i))
                if epoch == 1 and k == 7:
                    break                 # dropped mid-epoch: its workers stop, its slots come back
            seen.append(got)
            del pf, x, i
        assert sorted(seen[0]) == list(range(24)) and sorted(seen[2]) == list(range(24))
        assert len(seen[1]) == 8 and seen[0] != seen[2]          # shuffled per epoch, as the DataLoader
        xv, iv = next(other_it)                                  # the other loader is still fine
        assert_close(checksum(xv.cuda()).cpu(), want[int(iv) % 6])
    finally:
        gc.enable()
    del other_it, other
    gc.collect()                  # the garbage is collected here, in the process that owns CUDA
    torch.cuda.synchronize()
