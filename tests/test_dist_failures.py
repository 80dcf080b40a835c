"""When ranks disagree, raise, die or hang, every surviving rank must exit with a message naming the
operation and the ranks at fault -- within the timeout, never a hung test (gloo, CPU)."""
from __future__ import annotations

import os
import time

import pytest
import torch

from gobrrr.comm import CollectiveError, CollectiveMismatchError, CollectiveTimeoutError, comm
from gobrrr.comm.testing import SpawnError, spawn


def _catch(fn) -> str:
    """Run fn; return the gobrrr error's class and message (the test checks every rank got one)."""
    try:
        fn()
    except CollectiveError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def dtype_mismatch(rank) -> str:
    # rank 1 reduces int32 where the others reduce float32: same byte count, so gloo would not notice
    t = torch.ones(4, dtype=torch.int32 if rank.rank == 1 else torch.float32, device=rank.device)
    comm.all_reduce(t)  # debug mode compares this call across ranks before any data moves
    return "no error"


def dtype_mismatch_caught(rank) -> str:
    comm.all_reduce(torch.ones(2, device=rank.device))  # one good collective first: the check counts ops per group
    return _catch(lambda: dtype_mismatch(rank))


def op_mismatch_caught(rank) -> str:
    t = torch.ones(3, device=rank.device)
    return _catch(lambda: comm.barrier() if rank.rank == 2 else comm.all_reduce(t))


def p2p_mismatch_caught(rank) -> str:
    if rank.rank == 0:
        return _catch(lambda: comm.send(torch.ones(4), 1))
    return _catch(lambda: comm.recv(torch.empty(5), 0))


@pytest.mark.timeout(60)
def test_debug_mode_names_the_mismatching_rank_on_every_rank():
    t0 = time.monotonic()
    msgs = spawn(dtype_mismatch_caught, 3, timeout_s=40, debug=True, pg_timeout_s=10)
    for m in msgs:
        assert m.startswith("CollectiveMismatchError"), m
        assert "Mismatching ranks: [1]" in m and "int32[4]" in m and "float32[4]" in m and "#1" in m, m
    msgs = spawn(op_mismatch_caught, 3, timeout_s=40, debug=True, pg_timeout_s=10)
    for m in msgs:
        assert "Mismatching ranks: [2]" in m and "barrier()" in m and "all_reduce(float32[3], op=sum)" in m, m
    msgs = spawn(p2p_mismatch_caught, 2, timeout_s=40, debug=True, pg_timeout_s=10)
    for m in msgs:
        assert m.startswith("CollectiveMismatchError") and "Mismatching ranks: [0, 1]" in m, m
        assert "sends float32[4]" in m and "receives into float32[5]" in m, m
    assert time.monotonic() - t0 < 30  # each mismatch is found at once, not after a timeout


def debug_env_var(rank) -> str:
    # GOBRRR_DIST_DEBUG=1 in the environment turns the check on without any code change
    return _catch(lambda: comm.all_reduce(torch.ones(2 + rank.rank)))


@pytest.mark.timeout(60)
def test_debug_mode_from_environment_variable():
    msgs = spawn(debug_env_var, 2, timeout_s=40, env={"GOBRRR_DIST_DEBUG": "1"}, pg_timeout_s=10)
    for m in msgs:
        assert "float32[2]" in m and "float32[3]" in m and "Mismatching ranks" in m, m


def raiser(rank):
    if rank.rank == 2:
        raise ValueError("boom in the data loader")
    comm.all_reduce(torch.ones(8, device=rank.device))
    return "finished"


def dier(rank):
    if rank.rank == 1:
        os._exit(7)  # no exception, no cleanup: as if the OOM killer took it
    comm.all_reduce(torch.ones(8))
    return "finished"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_rank_that_raises_is_named_by_the_others(debug):
    t0 = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(raiser, 3, timeout_s=60, debug=debug, pg_timeout_s=20)
    err = info.value
    assert err.first == 2 and "ValueError: boom in the data loader" in err.failures[2]
    for r in (0, 1):  # the survivors exit on their own, naming the op and the rank
        tb = err.failures[r]
        assert "CollectiveError" in tb or "CollectiveTimeoutError" in tb, tb
        assert "all_reduce (collective #0" in tb, tb
        assert "rank 2 raised valueerror: boom in the data loader" in tb.lower(), tb
    assert not err.killed
    assert time.monotonic() - t0 < 20  # well before the 20 s collective timeout


@pytest.mark.timeout(90)
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_rank_that_dies_is_named_by_the_others(debug):
    t0 = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(dier, 3, timeout_s=60, debug=debug, pg_timeout_s=20)
    err = info.value
    assert "exited with code 7" in err.failures[1]
    for r in (0, 2):
        tb = err.failures[r]
        assert "all_reduce (collective #0" in tb and "rank 1 died (process" in tb.lower(), tb
    assert time.monotonic() - t0 < 20


def sleeper(rank):
    if rank.rank == 1:
        time.sleep(3.0)  # alive, but never calls the collective the others are waiting in
        return "overslept"
    comm.all_reduce(torch.ones(8))
    return "finished"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_silent_rank_times_out_with_its_name(debug):
    with pytest.raises(SpawnError) as info:
        spawn(sleeper, 2, timeout_s=30, debug=debug, pg_timeout_s=1.5)
    tb = info.value.failures[0]
    assert "CollectiveTimeoutError" in tb and "all_reduce (collective #0" in tb, tb
    assert "[1]" in tb, tb  # the rank that never arrived
    assert info.value.failures.keys() == {0}  # rank 1 itself returned normally


def hangs(rank):
    time.sleep(60)


@pytest.mark.timeout(30)
def test_spawn_kills_everything_past_its_timeout():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] still running"):
        spawn(hangs, 2, timeout_s=2)
    assert time.monotonic() - t0 < 15


def test_error_classes():
    assert issubclass(CollectiveMismatchError, CollectiveError)
    assert issubclass(CollectiveTimeoutError, TimeoutError)


# monitor on for gloo, fast; no leading-collective check (it would name the departed peer itself,
# as it would on NCCL: these tests stand in for an NCCL host blocked behind a queued kernel)
MONITOR_ENV = {"GOBRRR_DIST_MONITOR": "1", "GOBRRR_DIST_MONITOR_STALL_S": "1", "GOBRRR_DIST_CHECK_FIRST": "0"}


def stuck_behind_departed_peer(rank):
    from gobrrr.comm import debug

    if rank.rank == 1:
        debug.note_exit(ValueError("boom in step 7"))  # what session() posts on its way out
        time.sleep(4)  # alive: a dead peer would make gloo raise by itself (NCCL would not)
        return "slept"
    comm.all_reduce(torch.ones(4), async_op=True)  # pending: rank 1 never joins
    time.sleep(30)  # stands in for the host blocked in a CUDA sync behind an NCCL kernel
    return "never"


def busy_after_peer_departed(rank):
    from gobrrr.comm import debug

    comm.all_reduce(torch.ones(4))  # completes: both ranks take part
    if rank.rank == 1:
        debug.note_exit(ValueError("boom after the last step"))
        return "left"
    time.sleep(3)  # computing, not waiting on a collective: the monitor must leave this rank alone
    return "finished"


@pytest.mark.timeout(60)
def test_monitor_exits_a_rank_stuck_behind_a_departed_peer():
    t0 = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(stuck_behind_departed_peer, 2, timeout_s=40, pg_timeout_s=30, env=MONITOR_ENV)
    text = info.value.failures[0]
    assert "exited with code 75" in text, text
    assert "rank 0 gives up: rank 1 raised ValueError: boom in step 7 and left" in text, text
    assert "all_reduce #0 on group WORLD" in text, text
    assert time.monotonic() - t0 < 20  # not the 30 s collective timeout
    assert spawn(busy_after_peer_departed, 2, timeout_s=40, pg_timeout_s=30, env=MONITOR_ENV) == [
        "finished", "left"]
