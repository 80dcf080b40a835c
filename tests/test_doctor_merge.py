"""The doctor's per-rank figures without launching ranks: collective names, the torchrun environment, waits
and the straggler from hand-built rank data, the layout from its collectives, the merged picture, and per-rank
communication/computation overlap agreeing with Holistic Trace Analysis on a hand-written 2-rank GPU trace
folder (HTA reads the folder of per-rank traces, as it would a real run's)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gobrrr.doctor import collectives, merge
from gobrrr.doctor.ranks import rank_from_env
from gobrrr.doctor.trace import parse


def test_collective_names():
    names = {"c10d::allreduce_": "all_reduce", "c10d::_reduce_scatter_base_": "reduce_scatter",
             "c10d::_allgather_base_": "all_gather", "c10d::allgather_": "all_gather", "c10d::broadcast_": "broadcast",
             "c10d::send": "send/recv", "c10d::recv_": "send/recv", "gloo:all_reduce": "all_reduce",
             "gloo:reduce_scatter": "reduce_scatter", "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "all_reduce",
             "ncclKernel_AllGather_RING_LL_Sum_int8_t": "all_gather", "ncclDevKernel_SendRecv": "send/recv",
             "c10d::barrier": "barrier", "c10d::alltoall_base_": "all_to_all", "c10d::reduce_": "reduce",
             "_c10d_functional::wait_tensor": None, "aten::mm": None}
    assert {n: collectives.canonical(n) for n in names} == names


def test_rank_from_env():
    assert rank_from_env({}) is None and rank_from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    r = rank_from_env({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "2", "MASTER_PORT": "29500"})
    assert (r.rank, r.world_size, r.local_rank, r.is_main) == (2, 4, 2, False)
    assert r.out_dir(Path("d")) == Path("d/rank-2")
    assert rank_from_env({"WORLD_SIZE": "2", "RANK": "x"}) is None


def _rank(arrivals: list[float], lines: list[dict], end_pad: float = 2000.0, steps: int = 2) -> dict:
    """A rank's collectives.py data: all_reduces arriving at `arrivals` (us), ending `end_pad` after the
    last arrival of their point (filled in by _align), with the per-interval line times given."""
    rows = [{"kind": "all_reduce", "n": i, "issue_us": a, "arrival_us": a, "end_us": 0.0, "phase": "backward",
             "step": i % steps, "lines": ln, "code": {k: f"code of {k}" for k in ln},
             "depth": {k: (2 if "sleep" in k else 1) for k in ln}} for i, (a, ln) in enumerate(zip(arrivals, lines))]
    return {"hostname": "h", "n_steps": steps, "collectives": rows, "exposed_ms_per_step": 1.0, "comm_ms_per_step": 2.0}


def _align(comms: dict[int, dict], pad: float = 2000.0) -> None:
    for i in range(len(comms[0]["collectives"])):
        last = max(c["collectives"][i]["arrival_us"] for c in comms.values())
        for c in comms.values():
            row = c["collectives"][i]
            row["end_us"] = last + pad
            row["idle"] = [[row["arrival_us"], row["end_us"]]]  # nothing computes beside it


def test_waits_and_the_straggler_from_rank_data():
    # 3 ranks, 4 all_reduces over 2 steps; rank 2 arrives 50 ms late at the first of each step because of a
    # sleep in train.py:30 (inside the loop's call at train.py:12, which also shows the excess, less deep)
    base = [0.0, 60_000.0, 100_000.0, 160_000.0]
    lines = lambda late: [  # noqa: E731
        {"train.py:12": 5.0 + (50.0 if late else 0), "train.py:30 sleep": 50.0 if late else 0.0, "train.py:14": 3.0},
        {"train.py:14": 3.0}, {"train.py:12": 5.0 + (50.0 if late else 0), "train.py:30 sleep": 50.0 if late else 0.0},
        {"train.py:14": 3.0}]
    comms = {0: _rank(base, lines(False)), 1: _rank([a + 200 for a in base], lines(False)),
             2: _rank([a + (50_000 if i % 2 == 0 else 100) for i, a in enumerate(base)], lines(True))}
    _align(comms)
    w = merge.waits(comms)
    st = w["straggler"]
    assert st["rank"] == 2 and st["site"] == "train.py:30 sleep" and st["late_at"] == 2 and st["at"] == "all_reduce"
    assert st["excess_ms_per_step"] == pytest.approx(50.0)
    # each other rank waited ~50 ms per step (two late points over two steps), the slow one ~0
    assert w["per_rank"][0]["wait_total_ms_per_step"] == pytest.approx(50.0, abs=0.5)
    assert w["per_rank"][1]["wait_total_ms_per_step"] == pytest.approx(49.8, abs=0.5)
    assert w["per_rank"][2]["wait_total_ms_per_step"] < 0.2
    assert st["others_wait_ms_per_step"] == {0: pytest.approx(50.0, abs=0.5), 1: pytest.approx(49.8, abs=0.5)}


def test_wait_under_compute_is_not_counted():
    """An async bucket whose wait runs under backward compute costs nothing: only idle parts count."""
    comms = {0: _rank([0.0], [{}], steps=1), 1: _rank([30_000.0], [{}], steps=1)}
    _align(comms)
    comms[0]["collectives"][0]["idle"] = [[25_000.0, 32_000.0]]  # computing until 25 ms
    w = merge.waits(comms)
    assert w["per_rank"][0]["wait_total_ms_per_step"] == pytest.approx(5.0)
    assert w["straggler"]["rank"] == 1


def test_no_straggler_when_ranks_keep_pace():
    comms = {0: _rank([0.0, 10_000.0], [{}, {}]), 1: _rank([300.0, 10_200.0], [{}, {}])}
    _align(comms)
    assert merge.waits(comms)["straggler"] is None


def _rows(spec):
    """[(kind, phase, arrival, end)] -> collective rows of one step."""
    return [{"kind": k, "n": i, "phase": p, "issue_us": a, "arrival_us": a, "end_us": e, "step": 0}
            for i, (k, p, a, e) in enumerate(spec)]


@pytest.mark.parametrize("spec,name,expected", [
    ([("all_reduce", "backward", 0, 1000), ("all_reduce", "backward", 2000, 5000)], "ddp", 3.0),
    ([("reduce_scatter", "backward", 0, 1000), ("reduce_scatter", "backward", 2000, 3000),
      ("all_gather", "other", 4000, 6000)], "zero-1/2", 3.0),
    ([("all_gather", "forward", 0, 1000), ("all_gather", "forward", 1000, 3000), ("all_gather", "backward", 4000, 5000),
      ("reduce_scatter", "backward", 5000, 5500), ("reduce_scatter", "backward", 6000, 8000)], "zero-3", 3.0),
    ([("all_reduce", "forward", 0, 1000), ("all_reduce", "backward", 2000, 2500)], "tensor parallel", 1.5),
])
def test_layout_is_named_from_its_collectives(spec, name, expected):
    lay = merge.layout({"collectives": _rows(spec), "n_steps": 1, "exposed_ms_per_step": 4.0, "comm_ms_per_step": 5.0})
    assert lay["name"] == name and lay["schedule"] and lay["promise"]
    assert lay["expected_exposed_ms_per_step"] == pytest.approx(expected)
    assert lay["exposed_beyond_promise_ms_per_step"] == pytest.approx(max(4.0 - expected, 0.0))
    # waiting for a later rank is not the schedule's: taken off the transfer it promises
    waited = merge.layout({"collectives": _rows(spec), "n_steps": 1}, {(spec[-1][0], len(spec) - 1): 0.5})
    assert waited["waiting_ms_per_step"] == pytest.approx(0.5)


def test_merged_timeline_draws_every_rank(tmp_path):
    from gobrrr.doctor.plot_ranks import plot_ranks

    comms = {r: _rank([0.0 + 30_000 * r], [{"t.py:3": 1.0}], steps=1) for r in range(3)}
    _align(comms)
    for r, c in comms.items():
        c["steps"] = [[1, -1000.0, 100_000.0]]
        c["lanes"] = {"t0": -1000.0, "t1": 100_000.0, "host": [[0.0, 500.0]], "comm": [[0.0, 62_000.0]],
                      "compute": [], "lines": [[0.0, 60_000.0, "t.py:3"]] if r == 2 else []}
    st = merge.waits(comms)["straggler"]
    path = plot_ranks(comms, tmp_path / "t.png", title="t", straggler=st)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


# -- per-rank figures against Holistic Trace Analysis --------------------------------------------------

def _gpu_rank_trace(rank: int, comm_shift: float) -> dict:
    """A 2-step GPU trace of one rank: compute kernels on stream 7, an NCCL all-reduce on stream 20 per step
    whose start moves by `comm_shift` us (so its overlap with compute differs by rank), launched from
    `c10d::allreduce_` ops, with the runtime calls that tie them together (correlation ids)."""
    pid, tid = 100 + rank, 100 + rank
    ev = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
          {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "python main"}},
          {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}]
    corr = 1
    for s in range(2):
        t0 = 1000 + 1000 * s
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": pid, "tid": tid,
                   "ts": t0, "dur": 1000, "args": {"External id": s + 1}})
        for j, (ks, kd) in enumerate([(20, 300), (350, 250), (700, 200)]):  # compute kernels
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                       "ts": t0 + ks - 15, "dur": 8, "args": {"correlation": corr, "External id": 10 + corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7,
                       "ts": t0 + ks, "dur": kd, "args": {"device": 0, "stream": 7, "correlation": corr}})
            corr += 1
        a = t0 + 450 + comm_shift
        ev.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid, "tid": tid,
                   "ts": a - 40, "dur": 30, "args": {"External id": 500 + s}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "pid": pid, "tid": tid,
                   "ts": a - 30, "dur": 10, "args": {"correlation": corr, "External id": 600 + s}})
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
                   "ts": a, "dur": 400, "args": {"device": 0, "stream": 20, "correlation": corr}})
        corr += 1
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "handmade GPU"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}, "displayTimeUnit": "ms",
            "traceName": f"rank{rank}", "traceEvents": ev}


@pytest.mark.filterwarnings("ignore")  # HTA 0.5.0 warns about pandas deprecations
def test_per_rank_overlap_agrees_with_hta(tmp_path, monkeypatch):
    pytest.importorskip("hta", reason="HolisticTraceAnalysis is not importable (make setup installs it)")
    import logging

    from hta.trace_analysis import TraceAnalysis

    from gobrrr.doctor import timeline

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    logging.getLogger("hta").setLevel(logging.ERROR)
    folder = tmp_path / "traces"
    folder.mkdir()
    ours = {}
    for rank, shift in ((0, 0.0), (1, 300.0)):
        data = _gpu_rank_trace(rank, shift)
        path = folder / f"rank-{rank}.json"
        path.write_text(json.dumps(data))
        tr = parse(path)
        fig = timeline.analyze(tr)
        c = collectives.extract(tr, fig)
        assert [r["kind"] for r in c["collectives"]] == ["all_reduce", "all_reduce"] and c["backend"] == "nccl"
        ours[rank] = {"overlap": 100.0 * (1 - c["exposed_ms_per_step"] / c["comm_ms_per_step"]),
                      "idle": fig.idle_pct, "compute_idle": fig.compute_idle_pct}
    a = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    overlap = a.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
    tb = a.get_temporal_breakdown(visualize=False).set_index("rank")
    assert ours[0]["overlap"] != pytest.approx(ours[1]["overlap"], abs=5)  # the two ranks differ...
    for rank in (0, 1):  # ...and HTA agrees with each
        assert ours[rank]["overlap"] == pytest.approx(float(overlap[rank]), abs=1.0), (rank, ours, overlap)
        assert ours[rank]["idle"] == pytest.approx(float(tb.loc[rank, "idle_time_pctg"]), abs=1.0)
        assert ours[rank]["compute_idle"] == pytest.approx(100 - float(tb.loc[rank, "compute_time_pctg"]), abs=1.0)
    shutil.rmtree(folder)
