"""`gobrrr doctor` under torchrun, on CPU with gloo: per-rank folders and one merged report, the straggler
named with its line and the others' wait, exposed communication with ddp's overlap on and off, and the
communication of each `gobrrr train` layout. The multi-rank runs are real torchrun launches of 2-4
processes; the figures they assert on are relative to what the scripts do (a known sleep, a known
overlap), never fixed times.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

STRAGGLER = """
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow, code = int(sys.argv[1]), int(sys.argv[2])


def log_metrics(step):
    if rank == slow:
        time.sleep(0.1)  # LATE: a rank-only chore, every step


for step in range(10):  # 3 warmup, the lead-in, 3 recorded, one to settle, 2 plain
    x = torch.randn(32, 64)
    log_metrics(step)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
sys.exit(code if rank == slow else 0)
"""


def _line(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if marker in line)


def _torchrun(tmp_path: Path, n: int, doctor_args: list[str], timeout: int = 420) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
           "-m", "gobrrr", "doctor"] + doctor_args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)


def _merged(out: Path, world: int) -> dict:
    for r in range(world):  # every rank's own folder and files
        d = out / f"rank-{r}"
        assert (d / "report.json").is_file() and (d / "trace.json").is_file() and (d / "comm.json").is_file(), d
        assert json.loads((d / "report.json").read_text())["rank"]["rank"] == r
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads((out / "report.json").read_text())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world,slow", [(2, 1), (4, 2)])
def test_straggler_is_named_with_its_line_and_the_others_wait(tmp_path, world, slow):
    (tmp_path / "strag.py").write_text(textwrap.dedent(STRAGGLER))
    code = 3 if world == 2 else 0  # the 2-rank run: the slow rank exits 3, the report must say so (and torchrun,
    # which stops rank 0 once rank 1 fails, must not cut rank 0's merge short: ranks.wait_recorded)
    r = _torchrun(tmp_path, world, ["--out", "d", "--steps", "3", "--plain-steps", "2", "strag.py", str(slow),
                                    str(code)])
    assert (r.returncode != 0) == (code != 0), r.stderr[-3000:]
    m = _merged(tmp_path / "d", world)
    print(r.stdout[-4000:])
    # printed once: rank 0's merged summary; the other ranks print nothing of the doctor's
    assert r.stdout.count("gobrrr doctor: ") == 1 and f"{world} ranks" in r.stdout, r.stdout[-3000:]
    assert r.stderr.count("gobrrr doctor: recorded 3 steps") == 1
    assert "USDT:" not in r.stderr and "USDT:" not in r.stdout
    ranks = m["ranks"]
    assert ranks["world_size"] == world and ranks["reported"] == list(range(world)) and not ranks["missing"]
    st = ranks["straggler"]
    assert st is not None and st["rank"] == slow, st
    assert st["site"] == f"strag.py:{_line(STRAGGLER, '# LATE')}" and "time.sleep(0.1)" in st["code"], st
    assert st["at"] == "all_reduce"
    for row in ranks["per_rank"]:  # the others waited about the sleep, in ddp's all_reduce; the slow one did not
        w = row["wait_ms_per_step"].get("all_reduce", 0.0)
        if row["rank"] == slow:
            assert w < 30, row
        else:
            assert 50 < w < 200 and row["wait_pct"] > 30, row
    assert m["advice"][0]["site"] == st["site"] and f"rank {slow}" in m["advice"][0]["change"]
    assert m["exit_code"] == code and m["exit_codes"] == {str(k): (code if k == slow else 0) for k in range(world)}
    assert "(exit code None)" not in r.stdout


OVERLAP = """
import sys, time
import torch
import torch.distributed as dist
from gobrrr.parallel.ddp import NaiveDDP, ddp


class Slow(torch.autograd.Function):
    # backward sleeps: compute that uses no CPU, so gloo's thread can run beside it on any machine
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.03)
        return g


class SlowLayer(torch.nn.Module):
    def forward(self, x):
        return Slow.apply(x)


dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(*[m for _ in range(12) for m in (torch.nn.Linear(1024, 1024), SlowLayer())])
model = ddp(model, bucket_mb=4.5, first_bucket_mb=4.5) if sys.argv[1] == "on" else NaiveDDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
x = torch.randn(8, 1024)
for step in range(15):  # 3 warmup, the lead-in, 8 recorded, one to settle, 2 plain
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


def _overlap_run(tmp_path: Path, attempt: int) -> tuple[dict, dict, dict]:
    """(each mode's merged report, median recorded step per mode, exposed communication per mode) of one
    on/off pair of the OVERLAP script under torchrun (2 gloo ranks)."""
    got = {}
    for mode in ("on", "off"):
        out = f"{mode}{attempt}"
        r = _torchrun(tmp_path, 2, ["--out", out, "--steps", "8", "--plain-steps", "2", "--quiet", "overlap.py", mode])
        assert r.returncode == 0, r.stderr[-3000:]
        got[mode] = _merged(tmp_path / out, 2)
    # each rank's median recorded step: one step slowed by a neighbour on a loaded CI machine moves a mean of
    # a few steps by as much as the overlap saves (CI once measured 9.6 ms saved for 28 ms less exposed)
    step = {mode: statistics.mean(json.loads((tmp_path / f"{mode}{attempt}" / f"rank-{r}" / "report.json").read_text())
                                  ["steps"]["median_ms"] for r in range(2)) for mode in got}
    exposed = {mode: statistics.mean(row["exposed_ms_per_step"] for row in got[mode]["ranks"]["per_rank"])
               for mode in got}
    return got, step, exposed


def _overlap_holds(step: dict, exposed: dict) -> bool:
    # What the doctor does not call exposed communication (compute, bucket copies, the hooks) must cost the
    # same with and without the overlap, to within a tenth of the step; the saving must have the right sign.
    # The two modes' difference is not compared with the saving directly: on a loaded 2-core CI machine the
    # bucketed path's copies and gloo's thread slow the rest of the step by tens of ms (a CI run saved 12.6 ms
    # of step time for 51 ms less exposed communication, its rest 38 ms dearer: 8% of a 490 ms step).
    rest = {mode: step[mode] - exposed[mode] for mode in step}
    return (exposed["on"] < 0.5 * exposed["off"] and step["off"] > step["on"]
            and abs(rest["on"] - rest["off"]) <= 0.1 * step["off"])


@pytest.mark.timeout(600)
def test_ddp_overlap_on_and_off_differ_in_exposed_communication_by_the_step_time(tmp_path):
    """Bucketed ddp all-reduces while backward computes; NaiveDDP all-reduces after it. The overlap makes the
    step faster, the doctor sees less than half the exposed communication, and the rest of the step (the step
    minus what the doctor calls exposed) costs the same in both modes: the doctor's figure accounts for the
    step time the overlap saved. The overlap needs a free core for gloo's thread: when other processes take
    both cores the hidden all-reduce is not hidden (measured once: 48 ms exposed with overlap against 63
    without), so a pair that misses is measured up to twice more before the test fails."""
    (tmp_path / "overlap.py").write_text(textwrap.dedent(OVERLAP))
    for attempt in range(3):
        got, step, exposed = _overlap_run(tmp_path, attempt)
        print(attempt, step, exposed)
        if _overlap_holds(step, exposed):
            break
    for mode in got:
        assert got[mode]["ranks"]["layout"]["name"] == "ddp"
    assert _overlap_holds(step, exposed), (step, exposed)


# gobrrr train flags -> the layout the doctor names, and a collective it must list (--zero 1 communicates as
# --zero 2 does, and is named by the same rule; left out to keep CI's 2 cores under budget)
LAYOUTS = {
    "": ("ddp", "all_reduce in backward"),
    "--zero 2": ("zero-1/2", "reduce_scatter in backward"),
    "--zero 3": ("zero-3", "all_gather in forward"),
    "--tp 2": ("tensor parallel", "all_reduce in forward"),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("flags", list(LAYOUTS))
def test_gobrrr_train_layouts_name_their_communication(tmp_path, flags):
    name, must = LAYOUTS[flags]
    r = _torchrun(tmp_path, 2, ["--out", "d", "--steps", "3", "--plain-steps", "2", "--quiet", "-m", "gobrrr", "train",
                                "--model", "tiny", "--device", "cpu", "--data", "synthetic", "--steps", "10",
                                "--batch-size", "2", "--seq-len", "16", "--no-progress", "--out", "run"] + flags.split())
    assert r.returncode == 0, r.stderr[-3000:]
    lay = _merged(tmp_path / "d", 2)["ranks"]["layout"]
    assert lay["name"] == name and must in lay["communication"], lay
    assert lay["schedule"] and lay["promise"] and lay["expected_exposed_ms_per_step"] is not None
