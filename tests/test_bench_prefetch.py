"""Smoke test of `gobrrr bench prefetch --quick`: every CPU-capable row runs and lands in the results file."""
from __future__ import annotations

import json

import pytest

from gobrrr.bench import prefetch


@pytest.mark.timeout(120)
def test_quick_run_records_every_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    assert prefetch.main(["--quick", "--steps", "3", "--no-busy"]) == 0
    out = capsys.readouterr().out
    assert "x_floor" in out and "floor: compute only" in out
    entry = json.loads((tmp_path / "prefetch.jsonl").read_text().splitlines()[-1])
    rows = entry["rows"]
    assert {r["regime"] for r in rows} == {"copy-bound", "compute-bound"}
    assert len(rows) == 2 * len(prefetch.ROWS)
    by = {(r["regime"], r["row"]): r for r in rows}
    for regime in ("copy-bound", "compute-bound"):
        for name in ("floor: compute only", "naive: pageable .to() + .item()",
                     "DataLoader(workers, pin_memory) + non_blocking",
                     "floor: workers' production (reused private buffer)",
                     "PinnedWorkerLoader + hand-rolled side stream"):
            r = by[(regime, name)]
            assert r["ms_per_step"] > 0, (regime, name)
        # worker rows are judged against the larger floor, in-process rows against the smaller
        naive = by[(regime, "naive: pageable .to() + .item()")]
        dl = by[(regime, "DataLoader(workers, pin_memory) + non_blocking")]
        assert naive["x_floor"] > 0 and dl["x_floor"] > 0
        prod = by[(regime, "floor: workers' production (reused private buffer)")]["ms_per_step"]
        compute = by[(regime, "floor: compute only")]["ms_per_step"]
        assert dl["x_floor"] == pytest.approx(dl["ms_per_step"] / max(prod, compute))
        assert naive["x_floor"] == pytest.approx(naive["ms_per_step"] / compute)
        assert by[(regime, "floor: copy only (pinned H2D)")]["note"] == "needs CUDA"
    assert entry["config"]["device"] == "cpu"


@pytest.mark.timeout(120)
def test_repeated_worker_rows_keep_the_median_and_spread(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    assert prefetch.main(["--quick", "--steps", "3", "--kinds", "workers", "--repeats", "2",
                          "--regime", "copy-bound"]) == 0
    out = capsys.readouterr().out
    assert "(pass 2/2)" in out and "min-max ms" in out
    entry = json.loads((tmp_path / "prefetch.jsonl").read_text().splitlines()[-1])
    assert entry["config"]["repeats"] == 2
    kinds = {r["kind"] for r in entry["rows"]}
    assert kinds == {"floor", "workers"}  # floors always run: the ratios need them
    for r in entry["rows"]:
        if r["ms_per_step"] is not None:
            lo, hi = (float(x) for x in r["min-max ms"].split("-"))
            assert lo - 0.005 <= r["ms_per_step"] <= hi + 0.005, r


def test_unknown_kind_is_refused():
    with pytest.raises(SystemExit):
        prefetch.main(["--quick", "--kinds", "gpu-rows"])


@pytest.mark.timeout(120)
def test_busy_pass_rows_and_ring_setup_are_recorded(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    assert prefetch.main(["--quick", "--steps", "2", "--kinds", "in-process,prebatched", "--regime", "copy-bound"]) == 0
    out = capsys.readouterr().out
    assert "busy process:" in out and "what each Prefetcher row ran through" in out
    entry = json.loads((tmp_path / "prefetch.jsonl").read_text().splitlines()[-1])
    busy = [r for r in entry["rows"] if r["regime"] == "copy-bound, busy"]
    assert {r["row"] for r in busy} == {name for name, method, _, _ in prefetch.ROWS if method in prefetch.BUSY_ROWS}
    by = {r["row"]: r for r in entry["rows"] if r["regime"] == "copy-bound"}
    for name in ("Prefetcher(DataLoader batch_size=None, workers)",
                 "Prefetcher(DataLoader(IterableDataset of batches), workers)"):
        assert by[name]["ms_per_step"] > 0 and by[name]["setup"].startswith("depth 2"), by[name]
        prod = by["floor: workers' production, pre-batched (copy into a reused buffer)"]["ms_per_step"]
        compute = by["floor: compute only"]["ms_per_step"]
        assert by[name]["x_floor"] == pytest.approx(by[name]["ms_per_step"] / max(prod, compute))


def test_busy_bench_without_cuda_says_so_in_one_line(capsys):
    from gobrrr.bench import prefetch_busy
    if prefetch_busy.torch.cuda.is_available():
        pytest.skip("a GPU is here: the bench would run")
    with pytest.raises(SystemExit) as info:
        prefetch_busy.main([])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gobrrr bench prefetch_busy: error: no CUDA device") and len(err.splitlines()) == 1


@pytest.mark.timeout(180)
def test_busy_bench_quick_records_both_windows_and_says_when_timm_is_missing(tmp_path, monkeypatch, capsys):
    from gobrrr.bench import prefetch_busy, prefetch_state
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    monkeypatch.setattr(prefetch_state, "timm_prefetch_loader", lambda: (None, "timm is not installed: (test)"))
    assert prefetch_busy.main(["--quick"]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "timm is not installed" in line]
    assert len(notes) == 2 and all(len(n) < 120 for n in notes)   # said once when built, once at the end
    entry = json.loads((tmp_path / "prefetch_busy.jsonl").read_text().splitlines()[-1])
    rows = entry["rows"]
    assert {r["state"] for r in rows} == {"fresh", "busy"}
    names = {r["row"] for r in rows}
    assert {"floor: compute", "floor: workers", "Prefetcher(pinned)", "Prefetcher(pageable)",
            "Prefetcher(workers)"} <= names
    for r in rows:   # the worker rows are also set against the workers' own rate (never a lower bound than the floor)
        if r["row"] == "Prefetcher(workers)":
            assert 0 < r["x_source"] <= r["x_floor"] + 1e-9
    for r in rows:                                        # the short window and the whole one, every row
        assert r["ms"] > 0 and r["ms_3"] > 0 and r["x_floor"] > 0 and len(r["first10"]) == 7
    assert [s["row"] for s in entry["startup"]] == ["floor: compute", "Prefetcher(pinned)"]
    assert entry["note"] == "timm is not installed: (test)"


def test_busy_bench_refuses_bad_shapes_in_one_line(capsys):
    from gobrrr.bench import prefetch_busy
    with pytest.raises(SystemExit) as info:
        prefetch_busy.main(["--quick", "--shapes", "256by160"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--shapes takes BxS pairs" in err and len(err.splitlines()) == 1
