"""PinnedWorkerLoader on CPU: same batches as a plain DataLoader, leases, errors, clean shutdown."""
from __future__ import annotations

import collections
import dataclasses
import gc
import multiprocessing
import os
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from gobrrr.loader.worker_ring import Leased, PinnedWorkerLoader

pytestmark = pytest.mark.timeout(60)

Pair = collections.namedtuple("Pair", "a b")


class Nested(Dataset):
    """Each sample: dict with an image tensor, an int label, a string, a namedtuple and a numpy array."""

    def __init__(self, n: int = 37):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 3, 5, 4, generator=g)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"img": self.x[i], "label": i * 3, "name": f"s{i}",
                "pair": Pair(self.x[i, 0, 0], float(i) / 7),
                "np": np.full((2,), i, dtype=np.int32),
                "seq": [torch.tensor([i, -i]), torch.tensor(i % 2 == 0)]}


class Boom(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 13:
            raise_in_dataset(i)
        return torch.tensor([float(i)])


def raise_in_dataset(i):
    raise ValueError(f"sample {i} is corrupt")


class Dies(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 11:
            os._exit(7)
        return torch.tensor([float(i)])


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    idx: list


def dataclass_collate(samples):
    return Batch(torch.stack([s["img"] for s in samples]) * 2, [s["label"] for s in samples])


def consume(loader, epochs=1):
    """All batches of `epochs` epochs, cloned out of their slots and released."""
    out = []
    for _ in range(epochs):
        for lease in loader:
            assert isinstance(lease, Leased)
            out.append(clone_tree(lease.batch))
            lease.release(None)
    return out


def clone_tree(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: clone_tree(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(clone_tree(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(clone_tree(v) for v in x)
    if dataclasses.is_dataclass(x):
        return dataclasses.replace(x, **{f.name: clone_tree(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


def assert_same(got, ref):
    assert type(got) is type(ref), (type(got), type(ref))
    if isinstance(ref, torch.Tensor):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    elif isinstance(ref, dict):
        assert list(got) == list(ref)
        for k in ref:
            assert_same(got[k], ref[k])
    elif isinstance(ref, (list, tuple)):
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert_same(a, b)
    elif dataclasses.is_dataclass(ref):
        for f in dataclasses.fields(ref):
            assert_same(getattr(got, f.name), getattr(ref, f.name))
    else:
        assert got == ref


def no_children_left(timeout=5.0):
    deadline = time.monotonic() + timeout
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not multiprocessing.active_children()


@pytest.mark.parametrize("drop_last", [False, True])
def test_matches_dataloader_shuffled_nested_over_epochs(drop_last):
    ds = Nested(37)  # 37 = 4 * 8 + 5: an odd last batch unless dropped
    ring = PinnedWorkerLoader(ds, 8, num_workers=2, shuffle=True, drop_last=drop_last,
                              generator=torch.Generator().manual_seed(5))
    ref = DataLoader(ds, 8, num_workers=0, shuffle=True, drop_last=drop_last,
                     generator=torch.Generator().manual_seed(5))
    assert len(ring) == len(ref) == (4 if drop_last else 5)
    got, want = consume(ring, epochs=3), [clone_tree(b) for _ in range(3) for b in ref]
    assert len(got) == len(want) == 3 * len(ref)
    for g, w in zip(got, want):
        assert_same(g, w)
    assert got[0]["img"].shape == (8, 3, 5, 4)
    if not drop_last:
        assert got[4]["img"].shape == (5, 3, 5, 4)
    ring.close()
    assert no_children_left()


def test_tensors_are_views_of_the_slots_collated_in_place():
    ds = Nested(24)
    ring = PinnedWorkerLoader(ds, 8, num_workers=2)
    base = None
    for n, lease in enumerate(ring):
        if base is None:
            base, size = ring._ring.flat.data_ptr(), ring.ring_bytes
        for t in (lease.batch["img"], lease.batch["label"], lease.batch["np"], lease.batch["seq"][0]):
            assert base <= t.data_ptr() < base + size, "batch tensor is not inside the shared slots"
        lease.release(None)
    assert n == 2
    assert ring.ring_bytes == 4 * 2 * ring._ring.slot_bytes  # 4 slots per worker for small batches
    ring.close()


def test_custom_collate_dataclass_and_from_dataloader():
    ds = Nested(30)
    dl = DataLoader(ds, batch_size=7, num_workers=2, collate_fn=dataclass_collate, shuffle=True,
                    generator=torch.Generator().manual_seed(3))
    ring = PinnedWorkerLoader.from_dataloader(dl)
    assert len(ring) == len(dl) == 5 and ring.num_workers == 2
    want = [clone_tree(b) for b in DataLoader(ds, batch_size=7, collate_fn=dataclass_collate, shuffle=True,
                                               generator=torch.Generator().manual_seed(3))]
    for g, w in zip(consume(ring), want, strict=True):
        assert_same(g, w)
    ring.close()


class Big(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return {"x": torch.full((3, 32, 32), float(i)), "i": i}   # 12 KiB a sample


def test_batch_larger_than_its_slot_takes_the_pickled_path():
    ds = Big()
    ring = PinnedWorkerLoader(ds, 4, num_workers=2, slot_bytes=64)  # one page: far too small for 48 KiB
    want = [clone_tree(b) for b in DataLoader(ds, 4)]
    got = []
    with pytest.warns(UserWarning, match="did not fit"):
        for lease in ring:
            got.append(clone_tree(lease.batch))
            lease.release(None)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    ring.close()


class ShortFirst:
    """A batch sampler whose first batch is short: the slots must still fit the full batches."""
    batch_size = 8

    def __iter__(self):
        yield [0, 1, 2]
        yield from ([i + j for j in range(8)] for i in range(3, 35, 8))

    def __len__(self):
        return 5


def test_short_first_batch_still_sizes_slots_for_full_batches():
    import warnings
    ds = Nested(40)
    ring = PinnedWorkerLoader(ds, None, num_workers=2, batch_sampler=ShortFirst())
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no batch may take the pickled path
        got = consume(ring)
    want = [clone_tree(b) for b in DataLoader(ds, batch_sampler=ShortFirst())]
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    ring.close()


def test_worker_exception_reraised_with_the_workers_traceback():
    ring = PinnedWorkerLoader(Boom(), 4, num_workers=2)
    seen = []
    with pytest.raises(ValueError) as info:
        for lease in ring:
            seen.append(lease.batch.view(-1).tolist())
            lease.release(None)
    msg = str(info.value)
    assert "sample 13 is corrupt" in msg and "raise_in_dataset" in msg and "worker 1" in msg
    assert seen == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]
    assert no_children_left()
    ring.close()


def test_worker_init_fn_runs_in_each_worker_and_its_error_propagates():
    def bad_init(wid):
        raise KeyError(f"init of worker {wid}")

    with pytest.raises(KeyError, match="init of worker"):
        for _ in PinnedWorkerLoader(Nested(40), 4, num_workers=2, worker_init_fn=bad_init):
            pass
    assert no_children_left()


def test_dead_worker_is_reported():
    ring = PinnedWorkerLoader(Dies(), 4, num_workers=2, timeout_s=30)
    with pytest.raises(RuntimeError, match="exited with code 7"):
        for lease in ring:
            lease.release(None)
    assert no_children_left()
    ring.close()


def test_early_break_and_gc_stop_workers_and_close_frees_the_memory():
    ring = PinnedWorkerLoader(Nested(64), 4, num_workers=2)
    it = iter(ring)
    lease = next(it)
    pids = [w.pid for w in it.workers]
    assert len(pids) == 2 and all(w.is_alive() for w in it.workers)
    lease.release(None)
    del it, lease
    gc.collect()
    assert no_children_left(), "dropping the iterator must stop its workers"
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] in "ZX"
    # every slot is free again, so the next epoch runs in full
    assert len(consume(ring)) == 16
    start, nbytes = ring._ring.flat.data_ptr(), ring.ring_bytes
    mapping = f"{start:x}-{start + nbytes:x}"
    assert any(line.startswith(mapping) for line in open("/proc/self/maps"))
    ring.close()
    gc.collect()
    assert not any(line.startswith(mapping) for line in open("/proc/self/maps")), "slots still mapped"


def test_loader_garbage_collected_mid_epoch_leaves_nothing_behind():
    ring = PinnedWorkerLoader(Nested(64), 4, num_workers=2)
    for lease in ring:
        lease.release(None)
        break
    start, nbytes = ring._ring.flat.data_ptr(), ring.ring_bytes
    mapping = f"{start:x}-{start + nbytes:x}"
    del ring, lease
    gc.collect()
    assert no_children_left()
    assert not any(line.startswith(mapping) for line in open("/proc/self/maps"))


def test_unreleased_leases_raise_a_clear_error_and_double_release_too():
    ring = PinnedWorkerLoader(Nested(40), 4, num_workers=2, slots=3)
    leases = []
    with pytest.raises(RuntimeError, match="none was released"):
        for lease in ring:
            leases.append(lease)  # never released
    assert len(leases) == 3
    leases[0].release(None)
    with pytest.raises(RuntimeError, match="already released"):
        leases[0].release(None)
    ring.close()
    assert no_children_left()


def test_slow_consumer_with_few_slots_still_matches():
    """Slots recycle through release(): 3 slots, 2 workers, 10 batches, a consumer that holds two."""
    ds = Nested(40)
    ring = PinnedWorkerLoader(ds, 4, num_workers=2, slots=3)
    want = [clone_tree(b) for b in DataLoader(ds, 4)]
    held, got = [], []
    for lease in ring:
        held.append(lease)
        if len(held) == 2:  # hold one lease while taking the next, as a depth-2 prefetcher does
            got.append(clone_tree(held[0].batch))
            held.pop(0).release(None)
    got += [clone_tree(h.batch) for h in held]
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    ring.close()


def test_bad_arguments_say_what_to_do():
    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.zeros(1)

    with pytest.raises(ValueError, match="takes no shuffle"):
        PinnedWorkerLoader(Stream(), 2, shuffle=True)
    with pytest.raises(ValueError, match="slots of its own"):
        PinnedWorkerLoader(Stream(), 2, num_workers=3, slots=2)
    with pytest.raises(ValueError, match="at least one worker"):
        PinnedWorkerLoader(Nested(4), 2, num_workers=0)
    with pytest.raises(ValueError, match="batch_size=None"):
        PinnedWorkerLoader(Nested(4), 0, num_workers=1)
    with pytest.raises(ValueError, match="shuffle=True conflicts"):
        PinnedWorkerLoader(Nested(4), 2, shuffle=True, sampler=range(4))
    empty = PinnedWorkerLoader(Nested(0), 2, num_workers=1)
    assert len(empty) == 0 and list(empty) == []


class FakeEvent:
    """Stands in for a CUDA copy-done event: not complete until the test (or a wait) says so."""

    def __init__(self):
        self.done, self.waited = False, False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True
        self.done = True


def test_a_slot_is_reused_only_after_its_event_completed():
    ds = Nested(80)
    ring = PinnedWorkerLoader(ds, 4, num_workers=2, slots=4)
    want = [clone_tree(b) for b in DataLoader(ds, 4)]
    in_flight: dict[int, FakeEvent] = {}   # slot address -> the event of the copy reading it
    events, got = [], []
    for n, lease in enumerate(ring):
        addr = lease.batch["img"].data_ptr()
        ev = in_flight.get(addr)
        assert ev is None or ev.done, "slot handed out again before its copy-done event completed"
        got.append(clone_tree(lease.batch))
        ev = FakeEvent()
        lease.release(ev)
        in_flight[addr] = ev
        events.append(ev)
        if n % 3 == 0:   # the copy engine finishes some copies late, some never until waited on
            events[max(0, n - 2)].done = True
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    assert any(e.waited for e in events), "with every slot in flight the loader must wait (backpressure)"
    ring.close()


class WhoBuilt(Dataset):
    """Each sample: (a 1 KiB tensor, the pid of the process that built it)."""

    def __len__(self):
        return 60

    def __getitem__(self, i):
        return torch.full((256,), float(i)), os.getpid()


def test_each_worker_writes_only_its_own_slots():
    """Batch i is built by worker i % W into a slot s with s % W == i % W, in every epoch: a worker
    never writes (and so never page-faults on) another worker's slots."""
    ring = PinnedWorkerLoader(WhoBuilt(), 4, num_workers=3)
    for _ in range(2):
        builders: dict[int, set] = collections.defaultdict(set)   # slot -> pids that built into it
        for i, lease in enumerate(ring):
            x, pid = lease.batch
            slot = (x.data_ptr() - ring._ring.flat.data_ptr()) // ring._ring.slot_bytes
            assert slot % 3 == i % 3, f"batch {i} went to slot {slot}, which worker {i % 3} does not own"
            torch.testing.assert_close(x[:, 0], torch.arange(4 * i, 4 * i + 4, dtype=torch.float32))
            builders[slot].update(pid.tolist())
            lease.release(None)
        assert i == 14 and ring.num_slots == 12
        # (in the first epoch the main process collates batch 0 into slot 0 to size the slots)
        workers_per_slot = [p - {os.getpid()} for p in builders.values()]
        assert all(len(p) <= 1 for p in workers_per_slot), f"a slot written by two workers: {builders}"
        assert len(set().union(*builders.values()) - {os.getpid()}) == 3
    ring.close()
    assert no_children_left()


def _faults_writing(ring_views, use_prefault, q):
    import resource

    from gobrrr.loader.slots import prefault
    torch.set_num_threads(1)  # as the loader's workers do: the parent's thread pool did not survive the fork
    s = 1 if use_prefault else 0
    view = ring_views[s]                      # nothing of it is mapped in this child yet
    n = view.numel()
    want = (torch.arange(s * n, (s + 1) * n, dtype=torch.int64) % 256).to(torch.uint8)   # the parent's pattern
    how = prefault(view) if use_prefault else "none"
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    same = bool(torch.equal(view, want)) if use_prefault else None   # a read would map the pages too
    view.fill_(7)
    q.put((how, same, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0))


def test_prefault_maps_a_slot_so_the_workers_writes_take_no_page_faults():
    from gobrrr.loader.slots import PAGE, SlotRing
    ring = SlotRing(2, 4096 * PAGE, pin=False, device=None)   # 2 slots of 4096 pages
    ring.flat.copy_(torch.arange(ring.nbytes, dtype=torch.int64).to(torch.uint8))
    ctx = multiprocessing.get_context("fork")
    got = {}
    for use in (False, True):
        q = ctx.Queue()
        p = ctx.Process(target=_faults_writing, args=(ring.views, use, q))
        p.start()
        got[use] = q.get(timeout=30)
        p.join(timeout=30)
        assert p.exitcode == 0
    how, same, faults = got[True]
    assert how in ("populate", "touch") and same, "prefault must not change what a copy may be reading"
    assert faults < 256, f"{faults} page faults writing a prefaulted 4096-page slot"
    assert torch.equal(ring.views[1], torch.full_like(ring.views[1], 7)), "the child's writes are shared"
    print(f"faults writing 4096 pages in a forked child: {got[False][2]} without prefault, {faults} after {how}")
    ring.close()


def test_default_slots_per_worker_shrink_for_big_batches_but_never_below_two():
    from gobrrr.loader.worker_ring import default_slots
    gib = 2**30
    assert default_slots(6, 80 * 2**20, ram_bytes=128 * gib) == 24          # 1.9 GiB of slots: 4 each
    assert default_slots(8, 160 * 2**20, ram_bytes=128 * gib) == 8 * 4       # 5 GiB, under the 8 GiB cap
    assert default_slots(8, 300 * 2**20, ram_bytes=128 * gib) == 8 * 3       # 4 each would be 9.4 GiB
    assert default_slots(8, 300 * 2**20, ram_bytes=16 * gib) == 8 * 2        # RAM / 4 = 4 GiB: floor of 2
    assert default_slots(1, 2**40, ram_bytes=16 * gib) == 2
