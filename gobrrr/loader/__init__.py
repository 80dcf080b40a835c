"""gobrrr.loader: batches cross to the GPU while the last step computes (Part 1: copy/compute overlap).

Open prefetch.py first (`Prefetcher`: a side copy stream, events, a pinned staging ring) and
prefetch_pass.py (one pass: what each `next()` enqueues, and why it costs the host so little).
Beside them: pinned.py (the ring of page-locked buffers filled by pool threads), worker_ring.py
(`PinnedWorkerLoader`: DataLoader workers collate straight into shared page-locked slots) with
ring_epoch.py (one epoch in the main process) and ring_worker.py (the worker process), forking.py
(workers that never touch CUDA, and what a dead one said), slots.py (those slots), ntcopy.py (the
streaming host memcpy), streams.py (copy streams, device resolution, GpuTimer) and tree.py
(walking nested batches).
"""
from gobrrr.loader.prefetch import Prefetcher, PrefetchStats
from gobrrr.loader.streams import GpuTimer
from gobrrr.loader.worker_ring import PinnedWorkerLoader

__all__ = ["Prefetcher", "PrefetchStats", "PinnedWorkerLoader", "GpuTimer"]
