"""Smoke test: `gobrrr bench zero --quick` runs every variant on CPU (gloo, one rank) and records nothing."""
from __future__ import annotations

from gobrrr.cli import main as gobrrr_main


def test_zero_bench_quick(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    assert gobrrr_main(["bench", "zero", "--quick"]) == 0
    out = capsys.readouterr().out
    for variant in ("ddp", "zero1", "zero2", "zero3", "fsdp2"):
        assert f"\n{variant} " in out, out
    assert "over_ddp" in out and "formula_mb" in out
    assert not list(tmp_path.iterdir())  # --quick records nothing
