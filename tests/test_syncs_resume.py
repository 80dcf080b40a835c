"""watch_syncs / sync_budget as decorators on generators, coroutines and async generators (CPU).

As in tests/test_syncs.py, a sync is torch's sync debug warning delivered by hand
(`warnings.warn(SYNC_WARNING)`: what a C++ sync point sends). The body must be watched on each
resumption, the consumer between resumptions must not be, and a budget covers the whole iteration.
tests/test_syncs_resume_gpu.py does the same with real CUDA syncs.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import warnings

import pytest
import torch

from gobrrr.syncs import watch as syncs
from gobrrr.syncs.watch import PROTOTYPE_WARNING, SYNC_WARNING, SyncError, sync_budget, watch_syncs

HERE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    with open(HERE) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# site:{marker}")]
    assert len(hits) == 1, marker
    return hits[0]


@watch_syncs()
def batches(n):
    for i in range(n):
        warnings.warn(SYNC_WARNING)  # site:gen
        yield i


@pytest.mark.filterwarnings("ignore:called a synchronizing")  # the unwatched ones are shown
def test_generator_body_is_watched_on_each_resumption():
    assert inspect.isgeneratorfunction(batches)  # still a generator function (pytest fixtures, etc.)
    seen = []
    for i in batches(3):
        seen.append(i)
        warnings.warn(SYNC_WARNING)  # the consumer's own sync: not the generator's
        assert not syncs.watching()  # nothing is watched between resumptions
    assert seen == [0, 1, 2]
    report = batches.sync_report
    assert report.count == 3
    (site,) = report.sites
    assert (site.file, site.line, site.count) == (HERE, line_of("gen"), 3)


def test_budget_covers_the_whole_iteration():
    closed = []

    @sync_budget(2)
    def three():
        try:
            for i in range(3):
                warnings.warn(SYNC_WARNING)  # site:budget
                yield i
        finally:
            closed.append(True)

    it = three()
    assert next(it) == 0 and next(it) == 1  # two syncs: within the budget
    with pytest.raises(SyncError, match="sync budget of 2 exceeded: 3 host-device syncs") as e:
        next(it)
    assert e.value.site.line == line_of("budget")
    assert closed == [True]  # the body was ended, its finally ran
    assert not syncs.watching()

    @sync_budget(3)
    def fine():
        for i in range(3):
            warnings.warn(SYNC_WARNING)
            yield i
    assert list(fine()) == [0, 1, 2]  # exactly the budget: passes


def test_raise_mode_raises_at_the_line_inside_the_body():
    @watch_syncs("raise")
    def gen():
        yield 1
        warnings.warn(SYNC_WARNING)  # site:raise
        yield 2

    it = gen()
    assert next(it) == 1
    with pytest.raises(SyncError) as e:
        next(it)
    assert e.value.site.line == line_of("raise")
    assert not syncs.watching()


def test_send_throw_close_and_return_value_pass_through():
    @watch_syncs()
    def echo():
        got = []
        try:
            while True:
                try:
                    x = yield len(got)
                except KeyError:
                    x = "thrown"
                warnings.warn(SYNC_WARNING)
                got.append(x)
                if x == "stop":
                    return got
        finally:
            warnings.warn(SYNC_WARNING)  # site:finally

    it = echo()
    assert next(it) == 0
    assert it.send("a") == 1
    assert it.throw(KeyError("k")) == 2
    with pytest.raises(StopIteration) as stop:
        it.send("stop")
    assert stop.value.value == ["a", "thrown", "stop"]
    assert echo.sync_report.count == 4  # three resumptions and the finally

    it = echo()
    next(it)
    it.close()  # the finally block runs watched
    assert echo.sync_report.count == 1 and echo.sync_report.sites[0].line == line_of("finally")


@pytest.mark.filterwarnings("ignore:called a synchronizing")  # the unwatched ones are shown
def test_coroutine_body_is_watched_not_the_other_tasks():
    @sync_budget(1)
    async def two_syncs():
        warnings.warn(SYNC_WARNING)
        await asyncio.sleep(0)
        warnings.warn(SYNC_WARNING)  # site:coro
        return "done"

    @watch_syncs()
    async def one_sync(other_done):
        warnings.warn(SYNC_WARNING)  # site:coro1
        await asyncio.sleep(0)
        await other_done
        return 7

    async def other_task():
        await asyncio.sleep(0)
        warnings.warn(SYNC_WARNING)  # runs between the watched coroutine's resumptions

    async def main():
        other = asyncio.ensure_future(other_task())
        return await one_sync(other)

    assert inspect.iscoroutinefunction(one_sync)
    assert asyncio.run(main()) == 7
    (site,) = one_sync.sync_report.sites
    assert (site.line, site.count) == (line_of("coro1"), 1)
    with pytest.raises(SyncError, match="budget of 1 exceeded: 2") as e:
        asyncio.run(two_syncs())
    assert {s.line for s in e.value.sites} == {line_of("coro"), line_of("coro") - 2}


def test_async_generator_body_is_watched():
    @sync_budget(2)
    async def stream(n):
        for i in range(n):
            warnings.warn(SYNC_WARNING)  # site:agen
            await asyncio.sleep(0)
            yield i

    async def take(n):
        return [x async for x in stream(n)]

    assert asyncio.run(take(2)) == [0, 1]
    assert stream.sync_report.count == 2 and stream.sync_report.sites[0].line == line_of("agen")
    with pytest.raises(SyncError, match="budget of 2 exceeded: 3"):
        asyncio.run(take(3))


def test_plain_functions_unchanged():
    @sync_budget(0)
    def f():
        warnings.warn(SYNC_WARNING)

    with pytest.raises(SyncError):
        f()
    assert f.sync_report.count == 1


def test_prototype_warning_is_not_shown(monkeypatch, recwarn):
    """torch warns once, when sync debug mode is first set, that the mode is a prototype: the detective
    sets it, the user did not ask for it, so that one warning is filtered where it is set."""
    modes = []

    def set_mode(m):
        warnings.warn(PROTOTYPE_WARNING + " and does not yet detect all synchronizing operations")
        modes.append(m)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_get_sync_debug_mode", lambda: modes[-1] if modes else 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_set_sync_debug_mode", set_mode, raising=False)
    warnings.simplefilter("always")
    with watch_syncs():
        warnings.warn("an unrelated warning of the user's")  # still shown
    assert modes == [1, 0]  # switched on while watching, back off after
    shown = [str(w.message) for w in recwarn]
    assert shown == ["an unrelated warning of the user's"]
