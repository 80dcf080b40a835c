"""The rank runtime: init without torchrun, session cleanup, seeds, print0, and each rank's data slice."""
from __future__ import annotations

import contextlib
import io

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import gobrrr
from gobrrr.comm import Rank, RankSampler, comm, print0, session, shard_indices
from gobrrr.comm.testing import spawn

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GOBRRR_DIST_BACKEND", "GOBRRR_DIST_DEBUG")


@pytest.fixture
def no_torchrun(monkeypatch):
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    if dist.is_initialized():
        pytest.skip("a process group from another test is still alive in this process")


def test_init_without_torchrun_is_world_size_one(no_torchrun):
    rank = gobrrr.comm.init(device="cpu", seed=123)
    try:
        assert rank == Rank(0, 0, 1, torch.device("cpu"), True, "gloo", 123)
        assert dist.is_initialized() and dist.get_world_size() == 1
        a = torch.randn(3)  # seeded: the same draw as a fresh generator with seed 123
        assert torch.equal(a, torch.randn(3, generator=torch.Generator().manual_seed(123)))
        t = torch.arange(4.0)
        comm.all_reduce(t, "avg").wait()  # collectives work (and are trivial) at world size 1
        assert torch.equal(t, torch.arange(4.0))
    finally:
        gobrrr.comm.shutdown()
    assert not dist.is_initialized()


def test_session_destroys_the_group_on_exception(no_torchrun):
    with pytest.raises(KeyError, match="inside"):
        with session(device="cpu") as rank:
            assert rank.world_size == 1 and dist.is_initialized()
            raise KeyError("inside")
    assert not dist.is_initialized()


def test_init_rejects_a_rank_outside_the_world(no_torchrun, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK=3 is outside"):
        gobrrr.comm.init(device="cpu")


def seeds_and_print(rank):
    """Model seed: equal on every rank. Data seed: different per rank. print0: rank 0 only."""
    weights = torch.randn(8)  # what a model would be initialised with after init(seed=...)
    noise = torch.randn(8, generator=rank.data_generator())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print0("hello from", rank.rank)
    return weights, noise, out.getvalue(), rank


@pytest.mark.timeout(60)
def test_seeds_device_and_print0_across_ranks():
    results = spawn(seeds_and_print, 4, timeout_s=45)
    weights, noise, printed, ranks = zip(*results)
    for w in weights[1:]:
        assert torch.equal(w, weights[0])
    assert len({tuple(x.tolist()) for x in noise}) == 4
    assert printed == ("hello from 0\n", "", "", "")
    assert [r.rank for r in ranks] == [0, 1, 2, 3]
    assert [r.is_main for r in ranks] == [True, False, False, False]
    assert {(r.world_size, r.backend, r.device.type) for r in ranks} == {(4, "gloo", "cpu")}
    assert len({r.data_seed for r in ranks}) == 4


@pytest.mark.parametrize("n", [0, 1, 3, 10, 12, 13])
@pytest.mark.parametrize("world_size", [1, 2, 4, 5])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shard_indices_pad_and_drop(n, world_size, shuffle):
    pad = [shard_indices(n, r, world_size, shuffle=shuffle, seed=7) for r in range(world_size)]
    drop = [shard_indices(n, r, world_size, drop_last=True, shuffle=shuffle, seed=7) for r in range(world_size)]
    per_pad = -(-n // world_size)
    # every rank gets the same number of samples (else the ranks issue different numbers of collectives)
    assert all(len(p) == per_pad for p in pad)
    assert all(len(d) == n // world_size for d in drop)
    # pad: nothing lost, only the wrap-around repeats; drop: nothing repeated, only the tail lost
    flat_pad = [i for p in pad for i in p]
    assert set(flat_pad) == set(range(n))
    assert len(flat_pad) - len(set(flat_pad)) == per_pad * world_size - n
    flat_drop = [i for d in drop for i in d]
    assert len(flat_drop) == len(set(flat_drop)) == (n // world_size) * world_size
    assert set(flat_drop) <= set(range(n))


def test_shuffle_is_shared_across_ranks_and_changes_per_epoch():
    e0 = [shard_indices(20, r, 4, shuffle=True, seed=1, epoch=0) for r in range(4)]
    e1 = [shard_indices(20, r, 4, shuffle=True, seed=1, epoch=1) for r in range(4)]
    assert sorted(i for p in e0 for i in p) == list(range(20))  # one permutation, partitioned
    assert e0 != e1
    assert e0 == [shard_indices(20, r, 4, shuffle=True, seed=1, epoch=0) for r in range(4)]


def test_rank_sampler_with_a_dataloader():
    data = list(range(10))
    seen = []
    for r in range(3):
        sampler = RankSampler(data, r, 3, shuffle=True, seed=5)
        sampler.set_epoch(2)
        batches = list(DataLoader(data, batch_size=2, sampler=sampler))
        assert len(sampler) == 4 and sum(len(b) for b in batches) == 4
        seen += [int(x) for b in batches for x in b]
    assert set(seen) == set(range(10)) and len(seen) == 12  # 2 padded repeats
    with pytest.raises(ValueError, match="rank 3 is not in 0..2"):
        RankSampler(10, 3, 3)


def init_twice(rank):
    """init() inside an initialised rank adopts the group instead of failing or creating another."""
    again = gobrrr.comm.init(device="cpu")
    t = torch.ones(2)
    comm.all_reduce(t)
    return again == rank, t.tolist()


@pytest.mark.timeout(60)
def test_init_adopts_an_existing_group():
    assert spawn(init_twice, 2, timeout_s=45) == [(True, [2.0, 2.0])] * 2


def rank_with_worker_processes(rank):
    """A rank may start processes of its own (DataLoader workers), so ranks must not be daemonic."""
    loader = DataLoader(torch.arange(8.0), batch_size=4, num_workers=1,
                        sampler=RankSampler(8, rank.rank, rank.world_size))
    return [b.tolist() for b in loader]


@pytest.mark.timeout(90)
def test_a_rank_can_use_dataloader_workers():
    assert spawn(rank_with_worker_processes, 2, timeout_s=60) == [[[0.0, 2.0, 4.0, 6.0]], [[1.0, 3.0, 5.0, 7.0]]]
