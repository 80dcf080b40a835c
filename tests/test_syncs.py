"""The sync detective on CPU: report, modes, budget, attribution, threads, clean patching, the plugin.

Without a GPU there are no real host-device syncs, so these tests drive the two nets directly:
torch's sync debug warning is emitted with `warnings.warn(SYNC_WARNING)` (the C++ sync points deliver
exactly that warning, through the same machinery, in the thread that synced), and the wrappers are
exercised on plain functions. tests/test_syncs_gpu.py checks the real thing on CUDA.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import types
import warnings

import pytest
import torch

import gobrrr
from gobrrr.syncs import rules as sync_rules
from gobrrr.syncs import watch as syncs
from gobrrr.syncs.watch import SYNC_WARNING, SyncError, SyncWarning, sync_budget, watch_syncs

pytest_plugins = ["pytester"]

HERE = os.path.abspath(__file__)


def line_of(marker: str) -> int:
    """Line number of the line in this file ending with the comment `# site:<marker>`."""
    with open(HERE) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# site:{marker}")]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


def fake_sync():
    warnings.warn(SYNC_WARNING)  # what torch's sync debug mode delivers at a C++ sync point


def snapshot():
    return (dict(torch.Tensor.__dict__), warnings._showwarnmsg, list(warnings.filters),
            torch.nonzero, torch.unique, torch.cuda.synchronize)


def test_public_api_names():
    assert gobrrr.watch_syncs is watch_syncs
    assert gobrrr.sync_budget is sync_budget
    assert gobrrr.SyncError is SyncError


def test_nothing_patched_unless_watching():
    before = snapshot()
    assert not syncs.watching()
    with watch_syncs():
        assert syncs.watching()
        assert "item" in torch.Tensor.__dict__ and torch.nonzero is not before[3]
        with watch_syncs():  # nested: patched once, restored once
            pass
        assert "item" in torch.Tensor.__dict__
    assert snapshot() == before
    with pytest.raises(ZeroDivisionError):
        with watch_syncs():
            raise ZeroDivisionError
    assert snapshot() == before and not syncs.watching()


def test_cpu_tensors_do_not_sync():
    x = torch.arange(6.0)
    with watch_syncs() as report:
        x.sum().item(); x.tolist(); x.cpu(); x.numpy(); float(x[0]); bool(x[1]); int(x[2])
        str(x); f"{x[0]:.2f}"; x[x > 2]; torch.nonzero(x); torch.unique(x); x.masked_select(x > 1)
        x.to("cpu"); x.clone().copy_(x); x.to(torch.float64)
    assert report.count == 0 and report.sites == []


def test_warning_counts_at_the_users_line():
    with watch_syncs() as report:
        for _ in range(3):
            warnings.warn(SYNC_WARNING)  # site:direct
    (site,) = report.sites
    assert (site.file, site.line, site.count) == (HERE, line_of("direct"), 3)
    assert site.kind == "warn"  # the call expression at the line names the op
    assert site.code == "warnings.warn(SYNC_WARNING)  # site:direct"
    assert report.count == 3


def test_attribution_skips_library_frames(tmp_path, monkeypatch):
    """A sync raised deep inside torch (here: a stand-in package) lands on the user's line."""
    pkg = tmp_path / "fake_torch"
    pkg.mkdir()
    (pkg / "ops.py").write_text(
        "import warnings\n"
        "def _inner(x):\n    warnings.warn(%r)\n    return x\n"
        "def unique(x):\n    return _inner(x)\n" % SYNC_WARNING)
    monkeypatch.setattr(syncs, "_TORCH_DIR", str(pkg) + os.sep)
    monkeypatch.syspath_prepend(str(tmp_path))
    from fake_torch import ops

    with watch_syncs() as report:
        ops.unique(1)  # site:deep
    (site,) = report.sites
    assert (site.file, site.line, site.kind) == (HERE, line_of("deep"), "unique")
    assert site.hint == syncs.HINTS["unique"]


def test_library_code_run_from_the_stdlib_keeps_its_line(monkeypatch):
    """`python -m gobrrr demo`: the first frame outside gobrrr is runpy; the gobrrr line is the answer."""
    monkeypatch.setattr(syncs, "_GOBRRR_DIR", os.path.dirname(HERE) + os.sep)  # this file plays gobrrr

    def library_code():
        warnings.warn(SYNC_WARNING)  # site:library

    with watch_syncs() as report:
        t = threading.Thread(target=library_code)  # its caller is threading.py: the stdlib
        t.start()
        t.join(timeout=30)
    (site,) = report.sites
    assert (site.file, site.line) == (HERE, line_of("library"))


def test_wrapper_counts_once_and_times_the_stall():
    """One wrapped call that triggers two sync warnings (like .item()) counts one sync, with its stall."""
    def op(x):
        time.sleep(0.02)
        fake_sync()
        fake_sync()
        return x

    def never(args, kwargs):
        return None

    wrapped = syncs._wrap(op, "item", never, syncs._HOOKS)
    outer = syncs._wrap(lambda x: wrapped(wrapped(x)), "__repr__", never, syncs._HOOKS)
    with watch_syncs() as report:
        wrapped(1)  # site:wrapped
        outer(2)  # site:outer
    by_line = {s.line: s for s in report.sites}
    a, b = by_line[line_of("wrapped")], by_line[line_of("outer")]
    assert (a.kind, a.count) == ("item", 1) and (b.kind, b.count) == ("print", 1)
    assert a.stall_s >= 0.018 and b.stall_s >= 0.036
    assert report.sites[0] is b or report.sites[0].line == b.line  # longest stall first
    assert report.count == 2


def test_rule_predicts_without_a_warning():
    """The three kinds sync debug mode misses are counted from the wrapper's own rule."""
    wrapped = syncs._wrap(lambda: None, "synchronize", sync_rules.always("event_synchronize"), syncs._HOOKS)
    with watch_syncs() as report:
        wrapped()  # site:rule
    (site,) = report.sites
    assert (site.kind, site.line, site.count) == ("event_synchronize", line_of("rule"), 1)


def _t(cuda: bool, pinned: bool = False):
    return types.SimpleNamespace(is_cuda=cuda, device=torch.device("cuda" if cuda else "cpu"),
                                 is_pinned=lambda: pinned)


@pytest.mark.parametrize("src_cuda,dst_cuda,pinned,non_blocking,expected", [
    (True, False, False, False, "d2h_copy"),
    (True, False, True, True, None),                      # D2H into pinned memory: async
    (True, False, False, True, "pageable_non_blocking_copy"),
    (False, True, False, False, "h2d_copy"),
    (False, True, True, True, None),                      # pinned H2D: async
    (False, True, False, True, "pageable_non_blocking_copy"),
    (False, False, False, True, None),                    # host to host
    (True, True, False, False, None),                     # device to device
])
def test_copy_classification(src_cuda, dst_cuda, pinned, non_blocking, expected):
    src = _t(src_cuda, pinned)
    assert sync_rules.copy_kind(src, dst_cuda, lambda: pinned, non_blocking) == expected


def test_warn_mode_warns_once_per_site():
    with pytest.warns(SyncWarning) as caught:
        with watch_syncs("warn") as report:
            for _ in range(5):
                warnings.warn(SYNC_WARNING)  # site:warn
    ours = [w for w in caught if issubclass(w.category, SyncWarning)]
    assert len(ours) == 1 and report.count == 5
    assert ours[0].filename == HERE and ours[0].lineno == line_of("warn")
    assert "fix:" in str(ours[0].message)


def test_raise_mode_raises_at_the_line():
    with pytest.raises(SyncError) as info:
        with watch_syncs("raise"):
            warnings.warn(SYNC_WARNING)  # site:raise
    err = info.value
    assert err.site.line == line_of("raise") and err.site.file == HERE
    tb_lines = [tb.tb_lineno for tb in _walk_tb(err.__traceback__) if tb.tb_frame.f_code.co_filename == HERE]
    assert line_of("raise") in tb_lines
    assert "fix:" in str(err)


def _walk_tb(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def test_raise_mode_before_the_call():
    ran = []
    wrapped = syncs._wrap(lambda: ran.append(1), "synchronize", sync_rules.always("device_synchronize"), syncs._HOOKS)
    with pytest.raises(SyncError):
        with watch_syncs("raise"):
            wrapped()
    assert ran == []  # a predicted sync raises before it blocks


def test_budget():
    with sync_budget(2) as report:
        fake_sync(); fake_sync()
    assert report.count == 2
    with pytest.raises(SyncError, match="sync budget of 1 exceeded: 3") as info:
        with sync_budget(1):
            for _ in range(3):
                warnings.warn(SYNC_WARNING)  # site:budget
    assert str(line_of("budget")) in str(info.value) and info.value.sites[0].count == 3
    with pytest.raises(KeyError):  # the block's own error wins over the budget
        with sync_budget(0):
            fake_sync()
            raise KeyError("mine")
    with pytest.raises(ValueError, match="non-negative int"):
        sync_budget(-1)
    with pytest.raises(ValueError, match="unknown mode"):
        watch_syncs("loud")


def test_decorator_form():
    @watch_syncs()
    def step(k):
        for _ in range(k):
            fake_sync()
        return k

    assert step(2) == 2 and step.sync_report.count == 2
    assert step(3) == 3 and step.sync_report.count == 3  # a fresh report per call

    @sync_budget(0)
    def clean():
        return 7

    @sync_budget(0)
    def dirty():
        fake_sync()

    assert clean() == 7
    with pytest.raises(SyncError):
        dirty()


def test_report_json_and_table(capsys):
    with watch_syncs() as report:
        fake_sync()
    data = json.loads(report.to_json())
    assert data["count"] == 1 and data["mode"] == "count"
    assert set(data["sites"][0]) == {"kind", "file", "line", "code", "count", "stall_s", "hint"}
    report.print()
    out = capsys.readouterr().out
    assert "1 host-device syncs at 1 sites" in out and "fix:" in out


def test_threads_each_attributed_to_their_own_line():
    n_threads, per_thread = 4, 50
    barrier = threading.Barrier(n_threads)

    def worker_a():
        barrier.wait()
        for _ in range(per_thread):
            warnings.warn(SYNC_WARNING)  # site:thread_a

    def worker_b():
        barrier.wait()
        for _ in range(per_thread):
            warnings.warn(SYNC_WARNING)  # site:thread_b

    threads = [threading.Thread(target=worker_a if i % 2 else worker_b) for i in range(n_threads)]
    with watch_syncs() as report, watch_syncs(all_threads=False) as mine:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        fake_sync()
    counts = {s.line: s.count for s in report.sites}
    half = n_threads // 2 * per_thread
    assert counts[line_of("thread_a")] == half and counts[line_of("thread_b")] == half
    assert report.count == n_threads * per_thread + 1
    assert mine.count == 1  # the main-thread-only watcher saw only its own sync


def test_other_warnings_pass_through():
    with watch_syncs() as report:
        with pytest.warns(UserWarning, match="unrelated"):
            warnings.warn("unrelated")
    assert report.count == 0


def test_plugin_without_cuda(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.sync_budget(0)
        def test_marked():
            assert 1 + 1 == 2

        def test_fixture(sync_watch):
            assert sync_watch.count == 0
        """)
    result = pytester.runpytest("-p", "no:gobrrr", "-p", "gobrrr.syncs.pytest_plugin", "--strict-markers", "-rs")
    if torch.cuda.is_available():
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(["*sync_watch needs a CUDA GPU*"])


def test_plugin_imports_cheaply():
    code = ("import sys; import gobrrr.syncs.pytest_plugin; "
            "print('torch' in sys.modules, 'gobrrr.syncs.watch' in sys.modules)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_plugin_rejects_a_bad_budget(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.sync_budget("many")
        def test_bad():
            pass
        """)
    result = pytester.runpytest("-p", "no:gobrrr", "-p", "gobrrr.syncs.pytest_plugin")
    result.stdout.fnmatch_lines(["*sync_budget(n) with a non-negative int n*"])
