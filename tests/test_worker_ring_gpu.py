"""PinnedWorkerLoader on a GPU: page-locked slots, exact batches through copies that lag, slot reuse after events."""
from __future__ import annotations

import gc
import multiprocessing

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from gobrrr.loader.worker_ring import PinnedWorkerLoader

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


class Pattern(Dataset):
    """Sample i: a (3, 16, 16) image that differs everywhere from every other sample, and label i."""

    def __init__(self, n: int = 150):
        self.n = n
        self.base = torch.arange(3 * 16 * 16, dtype=torch.float32).view(3, 16, 16)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.base * (i + 1) + i, i


def reference(ds, batch, epochs, seed):
    """Per-batch (image, label) exactly as a plain DataLoader gives them (in-process, no workers)."""
    dl = DataLoader(ds, batch, shuffle=True, generator=torch.Generator().manual_seed(seed))
    return [(x.clone(), y.clone()) for _ in range(epochs) for x, y in dl]


def checksums(pairs):
    """(n, 2) float64: a position-weighted sum of each batch's image and the sum of its labels."""
    out = []
    for x, y in pairs:
        w = torch.arange(1, x.numel() + 1, device=x.device, dtype=torch.float64).view_as(x)
        out.append(torch.stack([(x.double() * w).sum(), y.double().sum()]))
    return torch.stack(out)


def test_slots_are_page_locked_and_unregistered_on_close():
    ring = PinnedWorkerLoader(Pattern(64), 16, num_workers=2)
    leases = []
    for lease in ring:
        x, y = lease.batch
        assert x.is_pinned() and y.is_pinned(), "a slot view is not page-locked"
        leases.append(lease)
        if len(leases) == 2:
            break
    for lease in leases:
        lease.release(None)
    kept = leases[0].batch[0]   # a view that outlives the loader
    assert ring._ring.registered
    ring.close()
    assert not kept.is_pinned(), "close() must cudaHostUnregister the slots"
    del kept, leases, lease, x, y
    gc.collect()


def test_no_slot_reused_before_its_copy_done_event():
    """Copies lag ~2 ms each behind the host on a side stream; 3 slots and 2 fast workers race ahead.

    A slot rewritten before its copy finished would corrupt a batch; every batch must match the
    DataLoader reference exactly."""
    ds, dev = Pattern(150), torch.device("cuda")
    ring = PinnedWorkerLoader(ds, 16, num_workers=2, shuffle=True, slots=3,
                              generator=torch.Generator().manual_seed(7))
    copy_stream = torch.cuda.Stream()
    got = []
    for _ in range(3):
        for lease in ring:
            x, y = lease.batch
            with torch.cuda.stream(copy_stream):
                torch.cuda._sleep(4_000_000)   # the copy engine is busy elsewhere for a while
                xd, yd = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(copy_stream)
            lease.release(ev)
            got.append((xd, yd))
    torch.cuda.current_stream().wait_stream(copy_stream)
    want = reference(ds, 16, 3, seed=7)
    assert len(got) == len(want) == 3 * 10
    torch.testing.assert_close(checksums(got).cpu(), checksums(want), rtol=0, atol=0)
    for (a, b), (c, d) in zip(got, want):
        torch.testing.assert_close(a.cpu(), c, rtol=0, atol=0)
        torch.testing.assert_close(b.cpu(), d, rtol=0, atol=0)
    ring.close()


@pytest.mark.parametrize("how", ["dataloader", "ring3"])
def test_prefetcher_through_the_ring_matches_dataloader_with_slow_consumer(how):
    from gobrrr.loader.prefetch import Prefetcher

    ds, epochs = Pattern(150), 4
    if how == "dataloader":   # the Prefetcher swaps the DataLoader for a PinnedWorkerLoader itself
        src = DataLoader(ds, 16, num_workers=2, shuffle=True, generator=torch.Generator().manual_seed(3))
    else:                     # a ring of 3 slots handed over directly: slots recycle every few batches
        src = PinnedWorkerLoader(ds, 16, num_workers=2, shuffle=True, slots=3,
                                 generator=torch.Generator().manual_seed(3))
    pf = Prefetcher(src, device="cuda")
    assert type(pf.source).__name__ == "PinnedWorkerLoader"
    sums = []
    for _ in range(epochs):
        for x, y in pf:
            assert x.is_cuda and x.shape[1:] == (3, 16, 16)
            torch.cuda._sleep(2_000_000)   # a slow step: the producer side races ahead
            sums.append(checksums([(x, y)])[0])
    got = torch.stack(sums).cpu()
    want = checksums(reference(ds, 16, epochs, seed=3))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    del pf
    gc.collect()
    assert not multiprocessing.active_children()


class PatternShards(Dataset):
    """Item i: a whole batch (16 patterned images, 16 labels), for DataLoader(batch_size=None)."""

    def __init__(self, n: int = 12):
        self.n, self.inner = n, Pattern(16 * n)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        xs, ys = zip(*(self.inner[16 * i + k] for k in range(16)))
        return torch.stack(xs), torch.tensor(ys)


class PatternStream(torch.utils.data.IterableDataset):
    """The same batches streamed; worker w yields batches w, w + W, ... and worker 0 one extra at the end."""

    def __init__(self, n: int = 12):
        self.shards = PatternShards(n)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, W = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from (self.shards[i] for i in range(w, len(self.shards), W))
        if w == 0:
            yield self.shards[0]


@pytest.mark.parametrize("kind", ["batch_size=None", "IterableDataset"])
def test_prefetcher_over_unbatched_sources_uses_pinned_slots_and_exact_batches_with_slow_copies(kind):
    """Each worker its own page-locked slots; slow copies and a slow consumer; batches as the DataLoader's."""
    from gobrrr.loader.prefetch import Prefetcher

    ds = PatternShards() if kind == "batch_size=None" else PatternStream()
    make = lambda: DataLoader(ds, batch_size=None, num_workers=3, generator=torch.Generator().manual_seed(5))  # noqa: E731
    want = checksums([(x.clone(), y.clone()) for _ in range(3) for x, y in make()])
    pf = Prefetcher(make(), device="cuda")
    assert type(pf.source).__name__ == "PinnedWorkerLoader"
    sums = []
    for _ in range(3):
        for x, y in pf:
            assert x.is_cuda and x.shape == (16, 3, 16, 16)
            torch.cuda._sleep(2_000_000)   # a slow step: the workers and the copies race ahead
            sums.append(checksums([(x, y)])[0])
    ring = pf.source._ring
    assert ring.registered and ring.owners == 3 and ring.num_slots >= 3
    assert ring.views[0].is_pinned()
    torch.testing.assert_close(torch.stack(sums).cpu(), want, rtol=0, atol=0)
    assert "per worker" in pf.describe()
    del pf, ring
    gc.collect()
    assert not multiprocessing.active_children()
