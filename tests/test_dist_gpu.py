"""gobrrr.comm on GPUs with NCCL: the same checks as the CPU/gloo tests, one process per GPU.

World size 1 runs on any CUDA machine; the multi-rank cases run when several GPUs exist (marked
multigpu). The bodies are the CPU tests' own functions: only `backend="nccl"` changes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_dist_failures import dtype_mismatch_caught, op_mismatch_caught, raiser
from test_dist_ops import ALL_OPS, all_op_checks, overlap_compute

from gobrrr.comm.testing import SpawnError, spawn

ROOT = Path(__file__).resolve().parent.parent
N_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _world_sizes() -> list[int]:
    return sorted({n for n in (2, 4, N_GPUS) if 2 <= n <= N_GPUS}) or [2]


def nccl_facts_and_ops(rank):
    """Where the rank landed, then every op blocking and async, in one process (GPU start-up is slow)."""
    facts = (rank.backend, str(rank.device), torch.cuda.current_device())
    return facts, all_op_checks(rank, False), all_op_checks(rank, True)


@pytest.mark.gpu
@pytest.mark.timeout(240)
def test_nccl_world_size_one_every_op():
    ((facts, blocking, async_),) = spawn(nccl_facts_and_ops, 1, backend="nccl", timeout_s=180)
    assert facts == ("nccl", "cuda:0", 0)
    assert set(blocking) == set(async_) == ALL_OPS


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["plain", "torchrun"])
def test_bench_comm_on_one_gpu(tmp_path, launcher):
    """`python -m gobrrr.bench.comm` alone (world size 1, in-process store) and under torchrun (env://), NCCL."""
    env = {**os.environ, "GOBRRR_BENCH_RESULTS": str(tmp_path),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    run = ([sys.executable, "-m", "gobrrr.bench.comm"] if launcher == "plain" else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", "gobrrr.bench.comm"])
    proc = subprocess.run(run + ["--quick", "--ops", "all_reduce,all_gather"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = json.loads((tmp_path / "comm.jsonl").read_text().splitlines()[-1])
    assert rec["config"]["backend"] == "nccl" and rec["config"]["device"] == "cuda"
    assert all(r["time_us"] > 0 and r["vs_raw"] > 0 for r in rec["rows"])


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", _world_sizes())
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_nccl_every_op_matches_local_result(world_size, async_op):
    results = spawn(all_op_checks, world_size, async_op, backend="nccl", timeout_s=200)
    for done in results:
        assert set(done) == ALL_OPS | {"send_recv", "batch_p2p"} | ({"subgroups"} if world_size >= 4 else set())
    assert spawn(overlap_compute, world_size, backend="nccl", timeout_s=120) == [
        float(sum(range(1, world_size + 1)))] * world_size


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.timeout(300)
def test_nccl_debug_mode_raises_instead_of_hanging():
    n = min(N_GPUS, 3)
    for m in spawn(dtype_mismatch_caught, n, backend="nccl", debug=True, timeout_s=120, pg_timeout_s=30):
        assert "Mismatching ranks: [1]" in m, m
    if n >= 3:
        for m in spawn(op_mismatch_caught, n, backend="nccl", debug=True, timeout_s=120, pg_timeout_s=30):
            assert "Mismatching ranks: [2]" in m, m
        with pytest.raises(SpawnError) as info:  # a rank that raises is named; NCCL never gets to hang
            spawn(raiser, n, backend="nccl", debug=True, timeout_s=120, pg_timeout_s=30)
        assert "rank 2 raised valueerror" in info.value.failures[0].lower()
