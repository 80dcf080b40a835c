"""`watch_syncs` and `sync_budget` on generator functions, coroutines and async generators.

A decorator that wraps a call in `with watcher:` watches only what runs during the call. Calling a
generator function or an `async def` runs none of its body: it returns a generator or a coroutine,
and the body runs later, a piece at a time, each time the consumer (a `for` loop, an event loop)
resumes it. So the watch is entered around each resumption instead:

    consumer: next(gen) / gen.send(v) / gen.throw(e) / coro.send(None) from the event loop
      -> enter a watcher that adds to the call's one report
      -> the body runs until its next `yield` / `await` that suspends   (its syncs count, by line)
      -> exit the watcher: a budget is checked against the report so far (the whole iteration)
    consumer code between resumptions is not watched, nor are other tasks of the event loop.

One report per call, kept on the wrapper as `.sync_report` (set when the body first runs).
mode="raise" raises SyncError inside the body at the syncing line, as it does for a plain function.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Generator


def drive(it: Any, watcher, report) -> Generator:
    """Resume `it` (a generator, a coroutine, or an async generator's asend/athrow awaitable) one step
    at a time, each step inside a fresh watcher adding to `report`; yields what `it` yields."""
    to_send, to_throw = None, None
    while True:
        done, result = False, None
        try:
            with watcher._resumption(report):
                try:
                    out = it.throw(to_throw) if to_throw is not None else it.send(to_send)
                except StopIteration as e:
                    done, result = True, e.value
        except BaseException:
            if not done:
                it.close()  # a budget broken on exit leaves the body suspended: end it
            raise
        if done:
            return result
        try:
            to_send, to_throw = (yield out), None
        except GeneratorExit:
            with watcher._resumption(report):
                it.close()  # its `finally:` blocks run watched too
            raise
        except BaseException as e:  # thrown in by the consumer: pass it on to the body
            to_send, to_throw = None, e


class _Steps:
    """An awaitable that runs a coroutine (or an asend/athrow step) through `drive`."""

    def __init__(self, it, watcher, report):
        self.it, self.watcher, self.report = it, watcher, report

    def __await__(self):
        return drive(self.it, self.watcher, self.report)


def resumable(watcher, fn: Callable) -> Callable:
    """The decorator form of `watcher` for a generator function, a coroutine function or an async
    generator function: the body is watched on each resumption (see the module docstring)."""
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def watched_agen(*args, **kwargs):
            report = watched_agen.sync_report = watcher._fresh_report()
            agen = fn(*args, **kwargs)
            to_send, pending = None, None
            while True:
                step = agen.athrow(pending) if pending is not None else agen.asend(to_send)
                try:
                    item = await _Steps(step, watcher, report)
                except StopAsyncIteration:
                    return
                pending = None
                try:
                    to_send = yield item
                except GeneratorExit:
                    await _Steps(agen.aclose(), watcher, report)
                    raise
                except BaseException as e:
                    to_send, pending = None, e
        watched_agen.sync_report = None
        return watched_agen

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def watched_coro(*args, **kwargs):
            report = watched_coro.sync_report = watcher._fresh_report()
            return await _Steps(fn(*args, **kwargs), watcher, report)
        watched_coro.sync_report = None
        return watched_coro

    @functools.wraps(fn)
    def watched_gen(*args, **kwargs):
        report = watched_gen.sync_report = watcher._fresh_report()
        return (yield from drive(fn(*args, **kwargs), watcher, report))
    watched_gen.sync_report = None
    return watched_gen
