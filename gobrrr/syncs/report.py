"""What the sync detective found: the syncing sites, their counts and host stalls, and a fix per kind.

`watch.py` fills a `SyncReport` while a block runs; this file is the record and its printing, which
the doctor reads too (the hints are the fixes it gives by line).
"""
from __future__ import annotations

import json
import linecache
import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

HINTS = {
    "item": "keep the value on the device (accumulate into a tensor) and read it once, e.g. every N steps",
    "tolist": "keep the values on the device; read them once outside the loop",
    "cpu": "keep it on the device, or copy with .to('cpu', non_blocking=True) and read after an event",
    "numpy": "keep it on the device; convert once outside the loop",
    "bool": "a tensor as a Python condition waits for the GPU: use torch.where / masking on the device",
    "float": "float(tensor) waits for the GPU: keep it a tensor, read it once every N steps",
    "int": "int(tensor) waits for the GPU: keep it a tensor, or compute the value on the host",
    "index": "a tensor used as a Python index waits for the GPU: pass a host int instead",
    "complex": "complex(tensor) waits for the GPU: keep it a tensor",
    "print": "printing a CUDA tensor copies it to the host: log a detached copy every N steps",
    "format": "formatting a CUDA tensor reads it on the host: log every N steps, not every step",
    "nonzero": "nonzero has a data-dependent shape: use torch.where(mask, x, 0) or nonzero_static",
    "bool_mask_index": "x[mask] has a data-dependent shape: use torch.where(mask, x, 0) or masked_fill",
    "unique": "unique has a data-dependent shape: precompute on the host or use a fixed-size bincount",
    "masked_select": "masked_select has a data-dependent shape: use torch.where(mask, x, 0)",
    "d2h_copy": "a blocking device-to-host copy: copy into pinned memory with non_blocking=True, read after an event",
    "h2d_copy": "a blocking host-to-device copy: pin the source and pass non_blocking=True (gobrrr.Prefetcher)",
    "pageable_non_blocking_copy": "non_blocking from pageable memory is synchronous: pin the host tensor first",
    "device_synchronize": "torch.cuda.synchronize waits for every stream: record an event and wait on it instead",
    "stream_synchronize": "Stream.synchronize blocks the host: use stream.wait_event(event) to order work instead",
    "event_synchronize": "Event.synchronize blocks the host: use stream.wait_event(event), or event.query() to poll",
}
DEFAULT_HINT = "this call waits for the GPU: keep the data on the device or move the read out of the hot loop"


@dataclass
class SyncSite:
    """One source line that synced: how often, and how long the host waited there in total."""
    kind: str
    file: str
    line: int
    code: str
    count: int = 0
    stall_s: float = 0.0
    hint: str = ""

    def where(self) -> str:
        try:
            rel = os.path.relpath(self.file)
        except ValueError:
            rel = self.file
        return f"{self.file if rel.startswith('..') else rel}:{self.line}"


class SyncError(RuntimeError):
    """A host-device sync where none was allowed (raise mode), or more syncs than a budget."""

    def __init__(self, message: str, sites: list[SyncSite]):
        super().__init__(message)
        self.sites = sites
        self.site = sites[0] if sites else None


class SyncWarning(UserWarning):
    """Warn mode: one warning per syncing site."""


@dataclass
class SyncReport:
    """What a `watch_syncs` block saw. Safe to read while other threads still add to it."""
    mode: str = "count"
    _sites: dict = field(default_factory=dict, repr=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False)

    def _add(self, kind: str, file: str, line: int, stall_s: float) -> tuple[SyncSite, bool]:
        key = (kind, file, line)
        with self._lock:
            site = self._sites.get(key)
            new = site is None
            if new:
                code = linecache.getline(file, line).strip()
                site = self._sites[key] = SyncSite(kind, file, line, code, hint=HINTS.get(kind, DEFAULT_HINT))
            site.count += 1
            site.stall_s += stall_s
        return site, new

    @property
    def sites(self) -> list[SyncSite]:
        """Every syncing site, the longest total host stall first."""
        with self._lock:
            sites = list(self._sites.values())
        return sorted(sites, key=lambda s: (-s.stall_s, -s.count, s.file, s.line))

    @property
    def count(self) -> int:
        with self._lock:
            return sum(s.count for s in self._sites.values())

    @property
    def stall_s(self) -> float:
        with self._lock:
            return sum(s.stall_s for s in self._sites.values())

    def to_dict(self) -> dict:
        return {"mode": self.mode, "count": self.count, "stall_s": self.stall_s,
                "sites": [asdict(s) for s in self.sites]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def summary(self, limit: int = 20) -> str:
        """A plain-text table: count, stall, kind, site and code; then one fix line per kind."""
        sites = self.sites
        if not sites:
            return "no host-device syncs"
        rows = [("count", "stall ms", "kind", "site", "code")]
        rows += [(str(s.count), f"{s.stall_s * 1e3:.3f}", s.kind, s.where(), s.code[:60]) for s in sites[:limit]]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [f"{self.count} host-device syncs at {len(sites)} sites, host blocked {self.stall_s * 1e3:.3f} ms"]
        for i, r in enumerate(rows):
            lines.append("  ".join(c.rjust(w) if j < 2 else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        if len(sites) > limit:
            lines.append(f"... and {len(sites) - limit} more sites")
        kinds = list(dict.fromkeys(s.kind for s in sites[:limit]))
        lines += ["fix:"] + [f"  {k}: {HINTS.get(k, DEFAULT_HINT)}" for k in kinds]
        return "\n".join(lines)

    def print(self, file: TextIO | None = None) -> None:
        print(self.summary(), file=file if file is not None else sys.stdout)
