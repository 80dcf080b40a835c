"""watch_syncs / sync_budget on generators and coroutines with real CUDA syncs (see test_syncs_resume.py)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import torch

from gobrrr.syncs.watch import SyncError, sync_budget, watch_syncs

pytestmark = pytest.mark.gpu
HERE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    with open(HERE) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# site:{marker}"))


def test_generator_item_syncs_counted_per_step():
    x = torch.randn(256, 256, device="cuda")

    @watch_syncs()
    def losses(n):
        for _ in range(n):
            yield (x @ x).mean().item()  # site:item

    seen = []
    for v in losses(3):
        seen.append(v)
        torch.cuda.synchronize()  # the consumer's: not counted
    report = losses.sync_report
    assert len(seen) == 3 and report.count == 3, report.summary()
    (site,) = report.sites
    assert (site.line, site.kind) == (line_of("item"), "item")


def test_budget_zero_on_a_generator_raises_with_real_syncs():
    x = torch.randn(64, device="cuda")

    @sync_budget(0)
    def steps(n):
        for _ in range(n):
            yield bool(x.sum() > 0)  # site:bool

    with pytest.raises(SyncError) as e:
        list(steps(3))
    assert e.value.site.line == line_of("bool")

    @watch_syncs("raise")
    def raising():
        yield float(x.sum())

    with pytest.raises(SyncError):
        next(raising())


def test_async_def_counts_real_syncs():
    x = torch.randn(128, 128, device="cuda")

    @watch_syncs()
    async def work():
        a = (x @ x).sum().item()  # site:async
        await asyncio.sleep(0)
        torch.cuda.synchronize()  # site:async_sync
        return a

    asyncio.run(work())
    lines = {s.line: s.kind for s in work.sync_report.sites}
    assert lines == {line_of("async"): "item", line_of("async_sync"): "device_synchronize"}, lines


def test_prototype_warning_never_reaches_the_user():
    code = ("import warnings; warnings.simplefilter('always'); import torch, gobrrr\n"
            "with gobrrr.watch_syncs() as r:\n    torch.ones(4, device='cuda').sum().item()\n"
            "print('syncs', r.count)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(HERE))})
    assert r.returncode == 0, r.stderr
    assert "syncs 1" in r.stdout
    assert "prototype" not in r.stderr, r.stderr
