"""Smoke test of `gobrrr bench train --quick` on CPU: both variants run the same batch, the breakdown
prints, and a quick run writes no results record."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from bench.train import main


def test_bench_train_quick_runs_both_variants_and_the_breakdown(capsys):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["--quick"]) == 0
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    assert "plain-eager" in out and "gobrrr " in out and "ratio_B4:" in out
    assert "head: chunked, compiled kernel" in out and "gobrrr step: clip + fused AdamW" in out
    assert not (Path(os.environ["GOBRRR_BENCH_RESULTS"]) / "train.jsonl").exists()
