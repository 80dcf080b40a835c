"""Every op of gobrrr.comm.collectives, blocking and non-blocking, at world sizes 1, 2 and 4 (gloo, CPU),
checked against the result computed locally from what every rank put in.

One spawned group per (world size, blocking mode) runs all checks, so the whole file costs a few
seconds. The same body runs under NCCL on GPUs (tests/test_dist_gpu.py imports `all_op_checks`).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from gobrrr.comm import collectives as comm
from gobrrr.comm.ring import ring_all_reduce
from gobrrr.comm.testing import spawn


def data(r: int, shape=(3, 4), dtype=torch.float32, device="cpu") -> torch.Tensor:
    """What rank r contributes: distinct per rank and per element, exact in float32."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).reshape(shape) * (r + 1) + 10 * r - 3).to(dtype).to(device)


def all_op_checks(rank, async_op: bool) -> list[str]:
    """Run every op; assert each result equals the locally computed one; return the names checked."""
    n, r, dev = rank.world_size, rank.rank, rank.device
    done: list[str] = []
    everyone = [data(i, device=dev) for i in range(n)]
    total = torch.stack(everyone).sum(0)

    def run(handle):
        if async_op:
            assert isinstance(handle, comm.Handle)
        handle.wait()
        assert handle.is_completed()

    # all_reduce with every reduce op, and an integer tensor
    for op, ref in [("sum", total), ("avg", total / n), ("max", torch.stack(everyone).amax(0)),
                    ("min", torch.stack(everyone).amin(0)), ("product", torch.stack(everyone).prod(0))]:
        t = data(r, device=dev)
        run(comm.all_reduce(t, op, async_op=async_op))
        assert_close(t, ref, msg=lambda m: f"all_reduce {op}: {m}")
    ti = data(r, dtype=torch.int64, device=dev)
    run(comm.all_reduce(ti, async_op=async_op))
    assert_close(ti, torch.stack([data(i, dtype=torch.int64, device=dev) for i in range(n)]).sum(0))
    done.append("all_reduce")

    src = n - 1
    t = data(r, device=dev)
    run(comm.broadcast(t, src=src, async_op=async_op))
    assert_close(t, everyone[src])
    done.append("broadcast")

    for op, ref in [("sum", total), ("avg", total / n)]:
        t = data(r, device=dev)
        run(comm.reduce(t, dst=src, op=op, async_op=async_op))
        if r == src:
            assert_close(t, ref)
    done.append("reduce")

    out = torch.empty(3, 4, device=dev)
    inputs = [data(100 + i, device=dev) for i in range(n)] if r == 0 else None
    run(comm.scatter(out, inputs, src=0, async_op=async_op))
    assert_close(out, data(100 + r, device=dev))
    done.append("scatter")

    outs = [torch.empty(3, 4, device=dev) for _ in range(n)] if r == 0 else None
    run(comm.gather(data(r, device=dev), outs, dst=0, async_op=async_op))
    if r == 0:
        for i in range(n):
            assert_close(outs[i], everyone[i])
    done.append("gather")

    flat = torch.empty(3 * n, 4, device=dev)
    run(comm.all_gather(flat, data(r, device=dev), async_op=async_op))
    assert_close(flat, torch.cat(everyone))
    lst = [torch.empty(3, 4, device=dev) for _ in range(n)]
    run(comm.all_gather(lst, data(r, device=dev), async_op=async_op))
    for i in range(n):
        assert_close(lst[i], everyone[i])
    done.append("all_gather")

    big = [data(i, shape=(2 * n, 4), device=dev) for i in range(n)]  # every rank's input: n chunks of 2 rows
    big_total = torch.stack(big).sum(0)
    out = torch.empty(2, 4, device=dev)
    run(comm.reduce_scatter(out, big[r].clone(), async_op=async_op))
    assert_close(out, big_total[2 * r: 2 * r + 2])
    out = torch.empty(2, 4, device=dev)
    run(comm.reduce_scatter(out, list(big[r].clone().chunk(n)), "avg", async_op=async_op))
    assert_close(out, big_total[2 * r: 2 * r + 2] / n)
    done.append("reduce_scatter")

    # all_to_all: rank i's chunk j goes to rank j as its chunk i
    chunks = [[data(10 * i + j, shape=(2, 3), device=dev) for j in range(n)] for i in range(n)]
    out = torch.empty(2 * n, 3, device=dev)
    run(comm.all_to_all(out, torch.cat(chunks[r]), async_op=async_op))
    assert_close(out, torch.cat([chunks[i][r] for i in range(n)]))
    outs = [torch.empty(2, 3, device=dev) for _ in range(n)]
    run(comm.all_to_all(outs, [c.clone() for c in chunks[r]], async_op=async_op))
    for i in range(n):
        assert_close(outs[i], chunks[i][r])
    # uneven splits: rank i sends (j + 1) rows to rank j
    send_rows = [j + 1 for j in range(n)]
    recv_rows = [r + 1] * n
    inp = torch.cat([data(10 * r + j, shape=(j + 1, 3), device=dev) for j in range(n)])
    out = torch.empty(sum(recv_rows), 3, device=dev)
    run(comm.all_to_all(out, inp, recv_rows, send_rows, async_op=async_op))
    assert_close(out, torch.cat([data(10 * i + r, shape=(r + 1, 3), device=dev) for i in range(n)]))
    done.append("all_to_all")

    run(comm.barrier(async_op=async_op))
    done.append("barrier")

    if n > 1:
        right, left = (r + 1) % n, (r - 1) % n
        got = torch.empty(3, 4, device=dev)
        if async_op:  # everyone posts both halves, then waits: no ordering needed
            hs = comm.isend(data(r, device=dev), right), comm.irecv(got, left)
            for h in hs:
                h.wait()
        else:  # blocking: even ranks send first, odd ranks receive first, so the ring cannot deadlock
            if r % 2 == 0:
                comm.send(data(r, device=dev), right)
                comm.recv(got, left)
            else:
                comm.recv(got, left)
                comm.send(data(r, device=dev), right)
        assert_close(got, everyone[left])
        done.append("send_recv")

        got = torch.empty(3, 4, device=dev)
        h = comm.batch_p2p([comm.P2P("send", data(r, device=dev), right), comm.P2P("recv", got, left)],
                           async_op=async_op)
        h.wait()
        assert_close(got, everyone[left])
        done.append("batch_p2p")

    # ring all-reduce equals all_reduce, also when numel does not divide by n, or is smaller than n
    for shape in [(3, 4), (7,), (1,), (5, 3, 2)]:
        for op in ("sum", "max", "avg"):
            mine = data(r, shape=shape, device=dev)
            ref = mine.clone()
            comm.all_reduce(ref, op)
            assert_close(ring_all_reduce(mine, op), ref)
    odd = data(r, shape=(4, 3), device=dev).t()  # not contiguous: reduced in a copy, written back
    with pytest.raises(ValueError, match="not contiguous"):  # NCCL rejects it: so do we, on every backend
        comm.all_reduce(odd)
    ref = odd.contiguous()
    comm.all_reduce(ref)
    out = ring_all_reduce(odd)
    assert out is odd
    assert_close(odd, ref)
    done.append("ring_all_reduce")

    if n >= 4:  # subgroups: {0, 1} and {2, 3, ...}; every rank creates both, uses its own
        groups = [dist.new_group([0, 1]), dist.new_group(list(range(2, n)))]
        mine, members = (groups[0], [0, 1]) if r < 2 else (groups[1], list(range(2, n)))
        t = data(r, device=dev)
        comm.all_reduce(t, group=mine, async_op=async_op).wait()
        assert_close(t, sum(everyone[i] for i in members))
        t = data(r, shape=(5,), device=dev)
        assert_close(ring_all_reduce(t, group=mine), sum(data(i, shape=(5,), device=dev) for i in members))
        done.append("subgroups")
    return done


ALL_OPS = {"all_reduce", "broadcast", "reduce", "scatter", "gather", "all_gather", "reduce_scatter",
           "all_to_all", "barrier", "ring_all_reduce"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size, async_op, debug", [
    (1, False, False), (1, True, False), (2, False, False), (2, True, False), (4, False, False), (4, True, False),
    (3, True, True),  # debug mode: every op and p2p message checked, and no false alarm on a correct program
], ids=lambda v: str(v))
def test_every_op_matches_local_result(world_size, async_op, debug):
    results = spawn(all_op_checks, world_size, async_op, timeout_s=90, debug=debug)
    expected = ALL_OPS | ({"send_recv", "batch_p2p"} if world_size > 1 else set())
    expected |= {"subgroups"} if world_size >= 4 else set()
    assert len(results) == world_size
    for done in results:
        assert set(done) == expected


def overlap_compute(rank) -> float:
    """An async all_reduce is in flight while this rank computes; the result is right after wait()."""
    t = torch.full((1 << 16,), float(rank.rank + 1), device=rank.device)
    h = comm.all_reduce(t, async_op=True)
    x = torch.randn(64, 64, device=rank.device)
    for _ in range(10):  # overlap: all_reduce with this matmul loop
        x = torch.tanh(x @ x)
    h.wait()
    assert_close(t, torch.full_like(t, sum(range(1, rank.world_size + 1))))
    return float(t[0])


@pytest.mark.timeout(60)
def test_async_all_reduce_overlaps_compute():
    assert spawn(overlap_compute, 2, timeout_s=45) == [3.0, 3.0]


def with_emulations(rank) -> list[str]:
    """Force the fallbacks used where a backend lacks an op (older gloo), then run every check."""
    from gobrrr.comm import debug

    debug.watch_for(None).emulated.update({"all_gather", "reduce_scatter", "all_to_all"})
    return all_op_checks(rank, True)


@pytest.mark.timeout(60)
def test_emulated_ops_match_local_result():
    for done in spawn(with_emulations, 3, timeout_s=45):
        assert set(done) == ALL_OPS | {"send_recv", "batch_p2p"}
