"""The sync detective on a real GPU: every kind counted exactly and put on the right line.

Each op below sits alone on a line marked `# site:NAME`; a test runs it three times inside
`watch_syncs()` and expects one site, on that line, of that kind, with count 3.
"""
from __future__ import annotations

import os
import threading

import pytest
import torch

import gobrrr
from gobrrr.syncs.watch import SyncError, sync_budget, watch_syncs

pytestmark = pytest.mark.gpu
pytest_plugins = ["pytester"]

HERE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    with open(HERE) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# site:{marker}")]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


@pytest.fixture
def d():
    """Inputs made before any watching: CUDA tensors, a pageable and a pinned host tensor, a stream, an event."""
    dev = torch.device("cuda")
    x = torch.randn(64, device=dev)                       # (64,)
    ev = torch.cuda.Event()
    ev.record()
    out = {"x": x, "s": x.abs().sum() + 1, "m": x > 0, "i": torch.randint(0, 5, (64,), device=dev),
           "h": torch.empty(64), "pinned": torch.randn(64).pin_memory(), "stream": torch.cuda.Stream(),
           "event": ev}
    torch.cuda.synchronize()
    return out


# ---- the sixteen kinds (and the blocking H2D copy), one per line
def op_item(d): return d["x"].sum().item()  # site:item
def op_print(d): print(d["x"])  # site:print
def op_format(d): return f"{d['s']:.3f}"  # site:format
def op_cpu(d): return d["x"].cpu()  # site:cpu
def op_tolist(d): return d["x"].tolist()  # site:tolist
def op_numpy(d): return d["x"].numpy(force=True)  # site:numpy
def op_float(d): return float(d["s"])  # site:float
def op_int(d): return int(d["s"])  # site:int
def op_nonzero(d): return torch.nonzero(d["x"])  # site:nonzero
def op_nonzero_method(d): return d["x"].nonzero()  # site:nonzero_method
def op_mask(d): return d["x"][d["m"]]  # site:mask
def op_unique(d): return torch.unique(d["i"])  # site:unique
def op_unique_method(d): return d["i"].unique()  # site:unique_method
def op_masked_select(d): return torch.masked_select(d["x"], d["m"])  # site:masked_select
def op_d2h(d): return d["x"].to("cpu")  # site:d2h
def op_d2h_copy(d): return d["h"].copy_(d["x"])  # site:d2h_copy
def op_h2d(d): return d["h"].to("cuda")  # site:h2d
def op_pageable(d): return d["h"].to("cuda", non_blocking=True)  # site:pageable
def op_pageable_cuda(d): return d["h"].cuda(non_blocking=True)  # site:pageable_cuda
def op_device_sync(d): torch.cuda.synchronize()  # site:device_sync
def op_stream_sync(d): d["stream"].synchronize()  # site:stream_sync
def op_event_sync(d): d["event"].synchronize()  # site:event_sync


def op_if(d):
    if d["s"]:  # site:if
        return 1
    return 0


KINDS = [
    (op_item, "item", "item"), (op_print, "print", "print"), (op_format, "format", "format"),
    (op_cpu, "cpu", "cpu"), (op_tolist, "tolist", "tolist"), (op_numpy, "numpy", "numpy"),
    (op_float, "float", "float"), (op_int, "int", "int"), (op_if, "if", "bool"),
    (op_nonzero, "nonzero", "nonzero"), (op_nonzero_method, "nonzero_method", "nonzero"),
    (op_mask, "mask", "bool_mask_index"), (op_unique, "unique", "unique"),
    (op_unique_method, "unique_method", "unique"), (op_masked_select, "masked_select", "masked_select"),
    (op_d2h, "d2h", "d2h_copy"), (op_d2h_copy, "d2h_copy", "d2h_copy"), (op_h2d, "h2d", "h2d_copy"),
    (op_pageable, "pageable", "pageable_non_blocking_copy"),
    (op_pageable_cuda, "pageable_cuda", "pageable_non_blocking_copy"),
    (op_device_sync, "device_sync", "device_synchronize"), (op_stream_sync, "stream_sync", "stream_synchronize"),
    (op_event_sync, "event_sync", "event_synchronize"),
]


@pytest.mark.parametrize("op,marker,kind", KINDS, ids=[k[1] for k in KINDS])
def test_each_kind_counted_exactly_at_its_line(d, op, marker, kind, capsys):
    op(d)  # warm up: lazy CUDA init, kernel loading
    torch.cuda.synchronize()
    with watch_syncs() as report:
        for _ in range(3):
            op(d)
    capsys.readouterr()
    assert report.count == 3, report.summary()
    (site,) = report.sites
    assert (site.file, site.line, site.kind, site.count) == (HERE, line_of(marker), kind, 3), report.summary()
    assert site.stall_s > 0 and site.hint


def test_sync_free_code_counts_zero(d):
    idx = torch.randint(0, 64, (16,), device="cuda")
    d["pinned"].to("cuda", non_blocking=True)  # warm up
    torch.cuda.synchronize()
    with watch_syncs() as report:
        for _ in range(3):
            y = d["pinned"].to("cuda", non_blocking=True)    # pinned H2D: async
            z = torch.randn(1000, device="cuda")             # made on the device
            d["event"].record()
            d["stream"].wait_event(d["event"])               # ordering on the device
            done = d["event"].query()                        # a poll, not a wait
            w = d["x"] * 2 + 1
            v = w[1:3] + w[idx].sum() + torch.where(d["m"], w, 0).sum()
            del y, z, v, done
    assert report.count == 0, report.summary()


def test_long_tail_through_sync_debug_mode(d):
    """An op without a wrapper (repeat_interleave with tensor repeats) is seen through torch's sync debug mode."""
    reps = torch.full((64,), 2, device="cuda")
    torch.repeat_interleave(d["x"], reps)
    with watch_syncs() as report:
        torch.repeat_interleave(d["x"], reps)  # site:long_tail
    print(report.summary())  # for the log: how many warnings torch delivered for one call
    assert report.count >= 1, "sync debug mode delivered nothing: the long tail is not seen on this torch"
    assert {(s.line, s.kind) for s in report.sites} == {(line_of("long_tail"), "repeat_interleave")}


def test_raise_mode_raises_at_the_line(d):
    with pytest.raises(SyncError) as info:
        with watch_syncs("raise"):
            y = d["x"] * 2
            y.sum().item()  # site:raise
    assert info.value.site.line == line_of("raise") and info.value.site.kind == "item"
    tb, lines = info.value.__traceback__, []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == HERE:
            lines.append(tb.tb_lineno)
        tb = tb.tb_next
    assert line_of("raise") in lines


def test_raise_mode_long_tail(d):
    reps = torch.full((64,), 2, device="cuda")
    with pytest.raises(SyncError) as info:
        with watch_syncs("raise"):
            torch.repeat_interleave(d["x"], reps)  # site:raise_tail
    assert info.value.site.line == line_of("raise_tail")


def test_budget(d):
    with sync_budget(3) as report:
        for _ in range(3):
            d["x"].sum().item()
    assert report.count == 3
    with pytest.raises(SyncError, match="sync budget of 2 exceeded: 3"):
        with gobrrr.sync_budget(2):
            for _ in range(3):
                d["x"].sum().item()


def test_threads_attributed_to_their_own_lines(d):
    n = 20
    barrier = threading.Barrier(2)

    def reader_a():
        barrier.wait()
        for _ in range(n):
            d["x"].sum().item()  # site:thread_a

    def reader_b():
        barrier.wait()
        for _ in range(n):
            d["x"].max().item()  # site:thread_b

    with watch_syncs() as report:
        threads = [threading.Thread(target=reader_a), threading.Thread(target=reader_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    counts = {s.line: s.count for s in report.sites}
    assert counts == {line_of("thread_a"): n, line_of("thread_b"): n}, report.summary()


def test_stall_time_after_a_long_kernel(d):
    cycles = int(2e8)  # ~100 ms at the H200's ~2 GHz
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    with watch_syncs() as report:
        torch.cuda.synchronize()  # site:stall
    (site,) = report.sites
    assert site.line == line_of("stall") and site.stall_s > 0.02, report.summary()
    torch.cuda._sleep(cycles)
    with watch_syncs() as report:
        d["x"].sum().item()  # site:stall_item
    assert report.sites[0].stall_s > 0.02 and report.sites[0].line == line_of("stall_item")


def test_prefetcher_loop_is_sync_free():
    batches = [torch.randn(64, 256) for _ in range(12)]              # pageable host batches
    loader = gobrrr.Prefetcher(batches, device="cuda", depth=2)
    it = iter(loader)
    total = next(it).sum()                                           # warm-up step outside the watch
    torch.cuda.synchronize()
    with watch_syncs() as report:
        steps = 1
        for b in it:
            total = total + b.sum()
            steps += 1
    assert steps == 12
    assert report.count == 0, report.summary()
    torch.testing.assert_close(total, torch.stack([b.sum() for b in batches]).sum().cuda(), rtol=1e-4, atol=1e-2)


def test_plugin_marker_and_fixture(pytester):
    pytester.makepyfile(
        """
        import pytest, torch
        x = torch.ones(4, device="cuda")

        @pytest.mark.sync_budget(1)
        def test_within_budget():
            x.sum().item()

        @pytest.mark.sync_budget(0)
        def test_over_budget():
            x.sum().item()

        def test_fixture(sync_watch):
            x.sum().item()
            x.sum().item()
            assert sync_watch.count == 2
        """)
    result = pytester.runpytest("-p", "no:gobrrr", "-p", "gobrrr.syncs.pytest_plugin")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*sync budget of 0 exceeded: 1 host-device syncs*"])
