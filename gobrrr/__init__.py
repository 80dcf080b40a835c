"""gobrrr: keep GPUs busy, from one GPU to many.

The public API is small and explicit. Names are imported lazily, so `import gobrrr`
costs almost nothing and pulls in no submodule you do not use.

    import gobrrr as gb
    loader = gb.Prefetcher(dataloader, device="cuda")   # batches arrive on the device, event-ordered
    with gb.watch_syncs() as report: step()              # every host-device sync, by source line
    rank = gb.comm.init()                                # torchrun env -> process group, device, seeds
    model = gb.parallel.ddp(model)                       # bucketed all-reduce overlapped with backward
"""
from __future__ import annotations

import importlib

from gobrrr import _moved

__version__ = "0.1.0"

# public name -> "module:attribute" (attribute None means the module itself)
_LAZY = {
    "Prefetcher": "gobrrr.loader.prefetch:Prefetcher",
    "GpuTimer": "gobrrr.loader.streams:GpuTimer",
    "PinnedWorkerLoader": "gobrrr.loader.worker_ring:PinnedWorkerLoader",
    "watch_syncs": "gobrrr.syncs:watch_syncs",
    "sync_budget": "gobrrr.syncs:sync_budget",
    "SyncError": "gobrrr.syncs:SyncError",
    "doctor": "gobrrr.doctor:",
    "comm": "gobrrr.comm:",
    "dist": "gobrrr.comm:",  # the 0.1 name of gobrrr.comm
    "parallel": "gobrrr.parallel:",
    "plan": "gobrrr.plan:",
}

__all__ = sorted(_LAZY) + ["__version__"]

_moved.install()  # old import paths (gobrrr.device.*, gobrrr.dist.*) resolve for one release


def __getattr__(name: str):
    try:
        target = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'gobrrr' has no attribute {name!r}") from None
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value  # cache: the next lookup is a plain dict hit
    return value


def __dir__():
    return __all__
