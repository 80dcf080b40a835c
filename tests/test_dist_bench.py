"""Smoke tests of `gobrrr bench comm` (under a real torchrun, 2 ranks, gloo) and `gobrrr bench p2p`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gobrrr.bench.comm import bus_factor, parse_bytes, sizes

ROOT = Path(__file__).resolve().parent.parent


def test_bus_factors_and_sizes():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0  # nothing crosses a link at world size 1
    assert [parse_bytes(x) for x in ("8", "1K", "64K", "1M", "2G", "512B")] == [8, 1024, 65536, 1 << 20, 2 << 30, 512]
    assert sizes(1000, 8192) == [1024, 2048, 4096, 8192]


@pytest.mark.timeout(180)
def test_bench_comm_under_torchrun(tmp_path):
    """The real launcher: torchrun sets RANK/WORLD_SIZE/MASTER_*; init() reads them (env:// rendezvous)."""
    env = {**os.environ, "GOBRRR_BENCH_RESULTS": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GOBRRR_DIST_DEBUG"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "gobrrr", "bench", "comm", "--quick", "--ops", "all_reduce,reduce_scatter,all_to_all",
           "--min-bytes", "1K", "--max-bytes", "4K"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("gobrrr bench comm: 2 rank(s), gloo") == 1  # the table prints on rank 0 only
    lines = (tmp_path / "comm.jsonl").read_text().splitlines()
    assert len(lines) == 1  # one record, from rank 0 only
    rec = json.loads(lines[0])
    assert rec["world_size"] == 2 and rec["config"]["backend"] == "gloo"
    rows = rec["rows"]
    assert [(r["op"], r["size"]) for r in rows] == [(op, s) for op in ("all_reduce", "reduce_scatter", "all_to_all")
                                                    for s in (1024, 2048, 4096)]
    for r in rows:
        assert r["count"] == r["size"] // 4 and r["time_us"] > 0 and r["raw_us"] > 0
        assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw"] == pytest.approx(r["algbw"] * bus_factor(r["op"], 2))
        assert r["vs_raw"] == pytest.approx(r["raw_us"] / r["time_us"])
    assert set(rec["figures"]) >= {"all_reduce_peak_busbw_GBs", "all_reduce_median_vs_raw"}


def test_bench_p2p_quick(tmp_path, monkeypatch, capsys):
    from gobrrr.bench import p2p

    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    assert p2p.main(["--quick", "--bytes", "64K"]) == 0
    out = capsys.readouterr().out
    assert "latency_us" in out
    rec = json.loads((tmp_path / "p2p.jsonl").read_text().splitlines()[-1])
    assert rec["rows"] and all(r["GBs"] > 0 and r["latency_us"] > 0 for r in rec["rows"])
    assert rec["config"]["bytes"] == 65536
