"""gobrrr.loader: batches cross to the GPU while the last step computes (Part 1: copy/compute overlap).

Open prefetch.py first (`Prefetcher`: a side copy stream, events, a pinned staging ring). Beside it:
pinned.py (the ring of page-locked buffers filled by pool threads), worker_ring.py
(`PinnedWorkerLoader`: DataLoader workers collate straight into shared page-locked slots),
slots.py (those slots), ntcopy.py (the streaming host memcpy), streams.py (copy streams, device
resolution, GpuTimer) and tree.py (walking nested batches).
"""
from gobrrr.loader.prefetch import Prefetcher, PrefetchStats
from gobrrr.loader.streams import GpuTimer
from gobrrr.loader.worker_ring import PinnedWorkerLoader

__all__ = ["Prefetcher", "PrefetchStats", "PinnedWorkerLoader", "GpuTimer"]
