"""gobrrr.syncs: the runtime sync detective (Part 1: sync points).

    with gobrrr.watch_syncs() as report: step()     # every host-device sync, by the user's line
    with gobrrr.sync_budget(0): step()              # raises SyncError at the offending line

Open watch.py first (the watcher and budgets); report.py is what it found, printed with a fix per
kind. rules.py lists what counts as a sync; resume.py lets a budget carry on past a sync it
allowed; pytest_plugin.py gives tests the `sync_budget` marker and the `watch_syncs` fixture.
"""
__all__ = ["watch_syncs", "sync_budget", "SyncError", "SyncReport"]


def __getattr__(name: str):
    # lazy: the pytest plugin (gobrrr.syncs.pytest_plugin) loads in every pytest run and must not import torch
    if name in __all__:
        from gobrrr.syncs import watch

        return getattr(watch, name)
    raise AttributeError(f"module 'gobrrr.syncs' has no attribute {name!r}")
