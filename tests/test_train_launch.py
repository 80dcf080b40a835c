"""Multi-node launch as clusters do it, on one machine: two torchrun agents (--nnodes 2, one per
"node", c10d rendezvous on localhost) with two gloo processes each train the tiny GPT to the same
losses and weights as four processes under one agent."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gobrrr.train.checkpoints import read
from gobrrr.train.cli import read_metrics

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
RUN = [sys.executable, "-m", "torch.distributed.run"]
# 4 ranks x 1 row = a global micro-batch of 4; few steps: the point is the launch, not the training
TRAIN = ["-m", "gobrrr", "train", "--model", "tiny", "--device", "cpu", "--seq-len", "32", "--batch-size", "1",
         "--steps", "3", "--log-every", "1", "--ckpt-every", "3", "--lr", "3e-3", "--no-progress"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def losses(out: Path) -> dict[int, float]:
    return {s: r["loss"] for s, r in read_metrics(out / "metrics.jsonl").items()}


@pytest.mark.timeout(120)
def test_two_torchrun_agents_with_c10d_rendezvous_match_one_agent(tmp_path):
    port = free_port()
    two, one = tmp_path / "two_nodes", tmp_path / "one_node"
    agents = [subprocess.Popen(RUN + ["--nnodes", "2", "--node-rank", str(r), "--nproc-per-node", "2",
                                      "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
                                      "--rdzv-id", "gobrrr-test"] + TRAIN + ["--out", str(two)],
                               env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for r in (0, 1)]
    # the single-agent reference runs meanwhile: 8 processes on a small box, so overlap the waits
    ref = subprocess.run(RUN + ["--standalone", "--nproc-per-node", "4"] + TRAIN + ["--out", str(one)],
                         env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=110)
    logs = []
    for a in agents:
        try:
            logs.append(a.communicate(timeout=110)[0])
        finally:
            if a.poll() is None:
                a.kill()
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert [a.returncode for a in agents] == [0, 0], "\n".join(logs)
    l2, l1 = losses(two), losses(one)
    assert sorted(l2) == sorted(l1) == [1, 2, 3]
    torch.testing.assert_close(torch.tensor([l2[s] for s in (1, 2, 3)]), torch.tensor([l1[s] for s in (1, 2, 3)]),
                               rtol=1e-5, atol=1e-6)
    c2, c1 = read(two), read(one)
    assert c2["trainer"]["world_size"] == c1["trainer"]["world_size"] == 4
    for name, t in c1["model"].items():
        torch.testing.assert_close(c2["model"][name], t, rtol=1e-5, atol=1e-6)
