"""pytest plugin (entry point pytest11): hold a test to a host-device sync budget.

    @pytest.mark.sync_budget(0)          # the test body may not sync the host with the GPU
    def test_step_is_sync_free(): ...

    def test_one_read(sync_watch):      # a gobrrr SyncReport, watching the test body
        step(); assert sync_watch.count == 1

The plugin imports only pytest when it loads, so every pytest run stays cheap; torch and the sync
detective load when a marked test or the fixture runs. Without CUDA there are no host-device syncs:
the budget is not enforced (the test runs as usual) and `sync_watch` skips the test.
"""
from __future__ import annotations

import functools

import pytest


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "sync_budget(n): fail the test when its body makes more than n host-device syncs (needs CUDA; "
        "not enforced without it)")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _budget(item) -> int | None:
    marker = item.get_closest_marker("sync_budget")
    if marker is None:
        return None
    n = marker.args[0] if marker.args else marker.kwargs.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.sync_budget(n) with a non-negative int n, "
                                f"got {n!r}")
    return n


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item) -> None:
    n = _budget(item)
    if n is None or not hasattr(item, "obj") or not _cuda_available():
        return
    from gobrrr.syncs.watch import sync_budget

    test_fn = item.obj
    if getattr(test_fn, "_gobrrr_budget", None) == n:
        return  # already wrapped (a rerun of the same item)

    @functools.wraps(test_fn)
    def budgeted(*args, **kwargs):
        with sync_budget(n):
            return test_fn(*args, **kwargs)

    budgeted._gobrrr_budget = n
    item.obj = budgeted


@pytest.fixture
def sync_watch():
    """A gobrrr SyncReport watching the test (count mode); skips the test without CUDA."""
    if not _cuda_available():
        pytest.skip("sync_watch needs a CUDA GPU: without one there are no host-device syncs to watch")
    from gobrrr.syncs.watch import watch_syncs

    with watch_syncs() as report:
        yield report
