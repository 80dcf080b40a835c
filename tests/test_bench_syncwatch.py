"""Smoke test: `gobrrr bench syncwatch --quick` runs on CPU and records every mode."""
from __future__ import annotations

import json

from gobrrr.cli import main as gobrrr_main


def test_syncwatch_quick(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    assert gobrrr_main(["bench", "syncwatch", "--quick", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "patched while nobody watches: 0" in out
    (line,) = (tmp_path / "syncwatch.jsonl").read_text().splitlines()
    entry = json.loads(line)
    modes = {(r["reads/step"], r["mode"]) for r in entry["rows"]}
    assert modes == {(r, m) for r in (0, 1) for m in ("off", "imported", "not_watching", "count", "warn")}
    assert entry["figures"]["patched_while_not_watching"] == 0
    assert all(r["ms/step"] > 0 for r in entry["rows"])
