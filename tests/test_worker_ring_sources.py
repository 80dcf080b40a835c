"""The worker ring on sources without automatic batching: DataLoader(batch_size=None) and IterableDataset.

Reference: torch's own DataLoader with the same dataset, workers and generator. Same batches, same
order (an IterableDataset's workers are interleaved round-robin, an exhausted one drops out),
the same errors with the worker's traceback, and no process left behind.
"""
from __future__ import annotations

import gc
import multiprocessing
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from gobrrr.loader.worker_ring import PinnedWorkerLoader

pytestmark = pytest.mark.timeout(60)


class Shards(Dataset):
    """Item i is a whole batch: a dict of a (4, 3) image block, labels, a name and a numpy array."""

    def __len__(self):
        return 11

    def __getitem__(self, i):
        if i == 7 and getattr(self, "corrupt", False):
            raise OSError(f"shard {i} is unreadable")
        return {"x": torch.arange(12, dtype=torch.float32).view(4, 3) + 100 * i, "y": torch.arange(4) + i,
                "name": f"shard-{i}", "np": np.full((2,), i, dtype=np.int64)}


class Stream(IterableDataset):
    """Worker w yields counts[w] items (batches of 2 rows, or rows when batched by the loader),
    each carrying fresh randomness from the worker's seeded generators."""

    def __init__(self, counts, rows: int = 2, fail_at=None):
        self.counts, self.rows, self.fail_at = counts, rows, fail_at

    def __len__(self):
        return sum(self.counts)

    def __iter__(self):
        info = get_worker_info()
        w = info.id if info is not None else 0
        for k in range(self.counts[w]):
            if (w, k) == self.fail_at:
                explode(w, k)
            yield (torch.full((self.rows,), float(100 * w + k)), torch.rand(2),
                   torch.from_numpy(np.random.rand(1)))


def explode(w, k):
    raise KeyError(f"record {k} of worker {w} is missing")


def taken(loader):
    """Every batch of one epoch, copied out of its slot, each lease released."""
    out = []
    for lease in loader:
        out.append(clone(lease.batch))
        lease.release(None)
    return out


def clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(clone(v) for v in x)
    return x


def same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            same(a, b)
    else:
        assert got == want


def no_children_left(timeout=5.0):
    deadline = time.monotonic() + timeout
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not multiprocessing.active_children()


def test_batch_size_none_matches_the_dataloader_shuffled_over_two_epochs():
    kw = dict(batch_size=None, num_workers=3, shuffle=True)
    ring = PinnedWorkerLoader.from_dataloader(DataLoader(Shards(), generator=torch.Generator().manual_seed(4), **kw))
    ref = DataLoader(Shards(), generator=torch.Generator().manual_seed(4), **kw)
    assert len(ring) == len(ref) == 11
    for _ in range(2):
        got, want = taken(ring), [clone(b) for b in ref]
        assert len(got) == len(want) == 11
        for g, w in zip(got, want):
            same(g, w)
    assert ring._ring is not None and ring._ring.owners == 3   # each worker its own slots
    ring.close()
    assert no_children_left()


@pytest.mark.parametrize("batch_size,drop_last", [(None, False), (3, False), (3, True)])
def test_iterable_dataset_matches_the_dataloader_round_robin_with_uneven_workers(batch_size, drop_last):
    ds = Stream([5, 1, 7])   # worker 1 ends first, worker 0 next: both drop out of the rotation
    kw = dict(batch_size=batch_size, drop_last=drop_last, num_workers=3)
    ring = PinnedWorkerLoader.from_dataloader(DataLoader(ds, generator=torch.Generator().manual_seed(9), **kw))
    ref = DataLoader(ds, generator=torch.Generator().manual_seed(9), **kw)
    for _ in range(2):   # a second epoch: workers forked again into the slots made for the first
        got, want = taken(ring), [clone(b) for b in ref]
        assert [g[0].tolist() for g in got] == [w[0].tolist() for w in want]
        for g, w in zip(got, want):   # the workers' random streams too: seeded as DataLoader seeds them
            same(g, w)
    assert len(ring) == len(ref)
    ring.close()
    assert no_children_left()


def test_iterable_dataset_worker_error_is_reraised_after_the_batches_before_it():
    ds = Stream([4, 4], fail_at=(1, 2))
    ring = PinnedWorkerLoader(ds, None, num_workers=2)
    seen = []
    with pytest.raises(KeyError) as info:
        for lease in ring:
            seen.append(float(lease.batch[0][0]))
            lease.release(None)
    assert seen == [0.0, 100.0, 1.0, 101.0, 2.0]
    msg = str(info.value)
    assert "record 2 of worker 1 is missing" in msg and "explode" in msg and "worker 1" in msg
    assert no_children_left()
    ring.close()


def test_batch_size_none_error_and_break_leave_no_worker_behind():
    ds = Shards()
    ds.corrupt = True
    ring = PinnedWorkerLoader(ds, None, num_workers=2)
    with pytest.raises(OSError, match="shard 7 is unreadable"):
        taken(ring)
    assert no_children_left()
    ds.corrupt = False
    it = iter(ring)
    lease = next(it)
    assert lease.batch["name"] == "shard-0"
    lease.release(None)
    del it, lease
    gc.collect()
    assert no_children_left(), "dropping the iterator must stop its workers"
    assert [b["name"] for b in taken(ring)] == [f"shard-{i}" for i in range(11)]
    ring.close()


def test_iterable_dataset_empty_or_failing_to_start():
    assert taken(PinnedWorkerLoader(Stream([0, 0]), None, num_workers=2)) == []

    class NoStart(IterableDataset):
        def __iter__(self):
            raise RuntimeError("cannot open the stream")

    with pytest.raises(RuntimeError, match="cannot open the stream"):
        taken(PinnedWorkerLoader(NoStart(), None, num_workers=2, slot_bytes=4096))   # no probe: workers raise
    with pytest.raises(RuntimeError, match="cannot open the stream"):
        taken(PinnedWorkerLoader(NoStart(), None, num_workers=2))                    # the probe raises
    assert no_children_left()


def test_second_iter_of_the_ring_makes_the_first_raise():
    ring = PinnedWorkerLoader(Shards(), None, num_workers=2)
    a = iter(ring)
    next(a).release(None)
    assert len(taken(ring)) == 11
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(a)
    ring.close()
    assert no_children_left()
