"""PinnedWorkerLoader workers whatever the parent holds: no collection of the parent's objects in a
worker, stderr forwarded, and a death reported with its signal, last lines and likely cause (issue 28)."""
from __future__ import annotations

import gc
import os

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from gobrrr.loader.forking import death_message, no_collection_in_children
from gobrrr.loader.worker_ring import PinnedWorkerLoader

pytestmark = pytest.mark.timeout(60)


class CollectsInWorker(Dataset):
    """Runs a full garbage collection in the worker before every sample, as a busy worker would sooner or later."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        if get_worker_info() is not None:   # batch 0 is built by the main process
            gc.collect()
        return torch.full((3,), float(i))


class HoldsCudaLike:
    """Stands for a parent object whose destructor calls CUDA (a pinned block a copy read, a Prefetcher):
    run in a forked child it ends the process as the C++ terminate does (SIGABRT)."""

    def __init__(self, parent_pid: int, ran: list):
        self.parent_pid, self.ran = parent_pid, ran
        self.me = self   # a reference cycle: only the cyclic collector frees it

    def __del__(self):
        if os.getpid() != self.parent_pid:
            os.write(2, b"terminate called after throwing an instance of 'c10::AcceleratorError'\n")
            os.abort()
        self.ran.append(os.getpid())


def test_parent_garbage_is_never_collected_in_a_worker_and_is_collected_in_the_parent():
    ran: list = []
    gc.collect()
    HoldsCudaLike(os.getpid(), ran)        # unreachable at once: garbage the parent has not collected yet
    gc.disable()                           # keep it uncollected until the workers have forked
    try:
        ring = PinnedWorkerLoader(CollectsInWorker(), 4, num_workers=2, timeout_s=30)
        got = []
        for lease in ring:
            got.append(lease.batch.clone())
            lease.release(None)
    finally:
        gc.enable()
    assert torch.equal(torch.cat(got)[:, 0], torch.arange(24.0))   # no worker died
    assert ran == []                       # not collected by anyone yet ...
    gc.collect()
    assert ran == [os.getpid()]            # ... and the parent collects it once unfrozen (nothing leaked)
    assert gc.get_freeze_count() == 0
    ring.close()


def test_a_freeze_the_user_made_is_left_in_place():
    gc.collect()
    gc.freeze()
    try:
        n = gc.get_freeze_count()
        with no_collection_in_children():
            assert gc.get_freeze_count() >= n
        assert gc.get_freeze_count() >= n   # theirs (and ours) stay frozen
    finally:
        gc.unfreeze()


class AbortsWithACudaError(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 9:   # what the C++ runtime does: write to fd 2, then abort
            os.write(2, b"terminate called after throwing an instance of 'c10::AcceleratorError'\n"
                        b"  what():  CUDA error: initialization error\n")
            os.abort()
        return torch.tensor([float(i)])


def test_a_worker_killed_by_a_signal_is_reported_with_its_last_stderr_lines_and_the_cause():
    ring = PinnedWorkerLoader(AbortsWithACudaError(), 2, num_workers=2, timeout_s=30)
    with pytest.raises(RuntimeError) as info:
        for lease in ring:
            lease.release(None)
    msg = str(info.value)
    assert "was killed by SIGABRT (exit code -6)" in msg, msg
    assert "CUDA error: initialization error" in msg, msg          # the worker's own words
    assert "CUDA was called in the forked worker" in msg, msg      # and what that means
    ring.close()


class Chatty(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        os.write(2, f"worker note {i}\n".encode())   # fd 2, as native code writes (pytest swaps sys.stderr)
        return torch.tensor([float(i)])


def test_worker_stderr_still_reaches_ours(capfd):
    ring = PinnedWorkerLoader(Chatty(), 2, num_workers=2, timeout_s=30)
    for lease in ring:
        lease.release(None)
    ring.close()
    err = capfd.readouterr().err
    assert all(f"worker note {i}" in err for i in range(2, 8)), err   # batch 0 is built by the main process


def test_death_message_names_signals_and_causes():
    m = death_message("worker 1", 42, -9, [])
    assert "SIGKILL" in m and "out of memory" in m and "wrote nothing" in m
    m = death_message("worker 1", 42, 3, ["Traceback ...", "ValueError: bad"])
    assert "exited with code 3" in m and "ValueError: bad" in m
    m = death_message("worker 2", 7, -11, ["x"])
    assert "SIGSEGV" in m and "native code" in m


def test_the_death_message_leaves_out_faulthandlers_dump():
    """Under pytest (or -X faulthandler) an aborting worker also prints every frame and extension module:
    the message keeps what the worker itself said, however long that dump (a full test run loads ~90 modules)."""
    from gobrrr.loader.forking import death_message

    lines = ["terminate called after throwing an instance of 'c10::AcceleratorError'",
             "  what():  CUDA error: initialization error", "Fatal Python error: Aborted",
             "Current thread 0x00007f (most recent call first):"]
    lines += [f'  File "/x/mod{i}.py", line {i} in f{i}' for i in range(40)]
    lines += ["Extension modules: " + ", ".join(f"ext{i}" for i in range(90)) + " (total: 90)"]
    msg = death_message("worker 0", 123, -6, lines)
    assert "CUDA error: initialization error" in msg and "Likely cause: CUDA was called" in msg
    assert 'File "/x/mod' not in msg and "Extension modules" not in msg
