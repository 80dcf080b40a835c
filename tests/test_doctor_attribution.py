"""Where the GPU waits, by the user's line: the doctor's host-gap attribution on real Python frames.

tests/data/traces/imagenet_cpu_{fast,slow}.json.gz were recorded by `gobrrr doctor` on this CPU box
from examples/imagenet.py (its lines are the ones the traces name: test_the_example_is_the_recorded_one
says when the example changed and the traces must be recorded again):

    cd examples && PYTHONPATH=.. python -m gobrrr doctor --quiet --steps 3 --warmup 2 \\
        --out OUT imagenet.py --workers 2 --slow-ms 0 --steps 7 --print-freq 100 -b 4 --side 16
    (slow: --workers 1 --slow-ms 100)

They hold what a GPU trace holds on the host side: the Python frames of the main thread (the
user's `train`, torch's module calls, zero_grad, backward, step), the DataLoader's
`enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__` ranges and the aten ops. A CPU
trace has no GPU, so `gpu_like` gives it one: every innermost aten op launches a kernel (a 4 us
launch call at the op's start; the kernel runs as long as the op did, in order on one stream) and
`.item()`'s `_local_scalar_dense` becomes a D2H copy and a stream sync. The GPU then sits empty
exactly where the host was elsewhere (Python, the loader, launches), which is what the doctor
must name. The H200 traces (naive.json.gz) check the same on real GPU runs.
"""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from gobrrr.doctor import timeline as tl
from gobrrr.doctor.advice import LAUNCH_OVERHEAD_FIX, recommend
from gobrrr.doctor.host import HOST_OVERHEAD, HostAttribution, loader_ranges
from gobrrr.doctor.report import summary
from gobrrr.doctor.sources import SourceResolver

DATA = Path(__file__).parent / "data" / "traces"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SRC = EXAMPLES / "imagenet.py"
# examples/imagenet.py when the traces were recorded
RECORDED_SHA256 = "7b1a8340403eb8ad15c61d231bd593ec4c3202765c658edc5d2821e9a17c1269"


def line(text: str) -> str:
    """`imagenet.py:N` of the first line holding `text`."""
    n = next(i for i, t in enumerate(SRC.read_text().splitlines(), 1) if text in t)
    return f"imagenet.py:{n}"


def test_the_example_is_the_recorded_one():
    import hashlib

    assert hashlib.sha256(SRC.read_bytes()).hexdigest() == RECORDED_SHA256, (
        "examples/imagenet.py changed since tests/data/traces/imagenet_cpu_*.json.gz were recorded from it: record them "
        "again (module docstring) and update RECORDED_SHA256")


def gpu_like(path: Path, launch_us: float = 4.0, strip_frames: bool = False) -> dict:
    """A CPU trace with a stand-in GPU: see the module docstring."""
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    ev = data["traceEvents"]
    main = Counter(e["tid"] for e in ev if e.get("cat") == "python_function").most_common(1)[0][0]
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op" and e["tid"] == main), key=lambda e: (e["ts"], -e["dur"]))
    leaves = [o for i, o in enumerate(ops) if not (i + 1 < len(ops) and ops[i + 1]["ts"] < o["ts"] + o["dur"])]
    out, free, corr = [], 0.0, 10_000_000

    def call(name, ts, dur, c):
        out.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": main, "ts": ts, "dur": dur,
                    "args": {"correlation": c}})

    for o in leaves:
        ts, dur = o["ts"], o["dur"]
        corr += 1
        if o["name"] == "aten::_local_scalar_dense":  # .item(): a D2H copy, then the host waits for it
            start = max(ts + 1.0, free)
            call("cudaMemcpyAsync", ts, 1.0, corr)
            out.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": 7,
                        "ts": start, "dur": 2.0, "args": {"correlation": corr, "stream": 7, "bytes": 4}})
            free = start + 2.0
            call("cudaStreamSynchronize", ts + 1.0, max(ts + dur, free + 1.0) - ts - 1.0, -1)
            continue
        launch = min(launch_us, dur)
        start, run = max(ts + launch, free), max(dur, 1.0)
        call("cudaLaunchKernel", ts, launch, corr)
        out.append({"ph": "X", "cat": "kernel", "name": o["name"], "pid": 0, "tid": 7, "ts": start, "dur": run,
                    "args": {"correlation": corr, "stream": 7}})
        free = start + run
    if strip_frames:  # a trace recorded without with_stack: no Python frames at all
        ev = [e for e in ev if e.get("cat") != "python_function"]
    data["traceEvents"] = ev + out
    return data


@pytest.fixture(scope="module")
def fast():
    return tl.analyze(gpu_like(DATA / "imagenet_cpu_fast.json.gz"), source_roots=[EXAMPLES])


@pytest.fixture(scope="module")
def slow():
    return tl.analyze(gpu_like(DATA / "imagenet_cpu_slow.json.gz"), source_roots=[EXAMPLES])


def _no_bare_names(rows):
    for r in rows:
        assert "thread" not in (r.get("site", "") + r.get("cause", "")), r
        assert not (r.get("site") or r.get("cause", "")).startswith("aten::"), r


def test_every_host_gap_names_a_line_of_the_script(fast):
    rows = fast.host_bound_sites
    assert rows and fast.idle_breakdown_ms["host_bound"] > 0
    _no_bare_names(rows)
    assert all(r["site"].startswith("imagenet.py:") for r in rows), rows
    assert sum(r["idle_ms"] for r in rows) == pytest.approx(fast.idle_breakdown_ms["host_bound"], rel=0.01)
    by_site = {r["site"]: r for r in rows}
    # what the main thread runs between launches, each by its own line
    for text, callee in (("loss.backward()", "backward"), ("optimizer.step()", "step"),
                         ("optimizer.zero_grad()", "zero_grad"), ("output = model(images)", "module call")):
        assert by_site[line(text)]["callee"] == callee, (text, by_site.get(line(text)))
    # inside the user's own modules, the innermost user frame is the model's forward
    assert line("out = self.relu(self.bn1(self.conv1(x)))") in by_site


def test_item_sync_is_named_by_its_line(fast):
    rows = {(s["site"], s["kind"]): s for s in fast.syncs}
    item = rows[(line("losses.update(loss.item(), images.size(0))"), "stream sync")]
    assert item["callee"] == "item" and item["count"] == 3  # once per recorded step


def test_module_calls_in_a_run_get_their_own_lines():
    """`output = model(images)` then `loss = criterion(output, target)`: two module calls back to back,
    told apart by their order; `images.to()` then `target.to()` likewise."""
    tr = tl.parse(DATA / "imagenet_cpu_fast.json.gz")
    host = HostAttribution(tr, SourceResolver([EXAMPLES]))
    frames = tr.frames[host.main]
    train = next(f for f in frames if f.func == "train")
    kids = host.kids(host.main, train)
    keys = [host.call_key(host.main, k) for k in kids]
    mods = [k for k, key in zip(kids, keys) if key == "module call"][:2]
    tos = [k for k, key in zip(kids, keys) if key == "to"][:2]  # under the sync detective's wrapper
    sites = host.locate([(host.main, k.ts + 0.01, k.ts + 0.02) for k in mods + tos])
    assert [f"{s.file}:{s.line}" for s in sites] == [
        line("output = model(images)"), line("loss = criterion(output, target)"),
        line("images = images.to(device"), line("target = target.to(device")]


def test_slow_loader_is_the_top_cause_on_the_for_line(slow):
    assert slow.top_cause == "data_loader", slow.idle_breakdown_ms
    (row,) = slow.loader_sites
    assert row["site"] == line("for i, (images, target) in enumerate(loader):")
    assert row["loader"] == "loader" and row["in_process"] is False
    assert row["idle_ms"] == pytest.approx(slow.idle_breakdown_ms["data_loader"])
    recs = recommend(slow)
    top = recs[0]
    assert top.site == row["site"]
    for word in ("`loader`", "num_workers", "pin_memory", "gobrrr.Prefetcher"):
        assert word in top.change, top.change
    text = summary({"script": "imagenet.py", "steps": {"source": "optimizer", "recorded": 3, "warmup": 2,
                                                           "median_ms": 1.0},
                    "gpu": {k: getattr(slow, k) for k in (
                        "span_ms", "compute_idle_pct", "idle_breakdown_pct", "idle_pct", "copy_overlap_pct",
                        "copies", "pageable", "top_kernels", "loader_sites", "host_bound_sites")},
                    "advice": [r.to_dict() for r in recs], "files": {}})
    assert "waiting for data (host in the DataLoader's __next__)" in text
    assert "while the host waited for the DataLoader `loader`" in text


def test_loader_ranges_come_from_the_record_function_names():
    tr = tl.parse(DATA / "imagenet_cpu_slow.json.gz")
    main = HostAttribution(tr, SourceResolver([EXAMPLES])).main
    ranges = loader_ranges(tr, main)
    assert len(ranges) == 3 and all("_MultiProcessingDataLoaderIter" in r.name for r in ranges)
    assert all(r.end - r.ts > 50_000 for r in ranges)  # 4 samples x 100 ms on one worker


def test_without_python_frames_the_cause_is_named_launch_overhead():
    f = tl.analyze(gpu_like(DATA / "imagenet_cpu_fast.json.gz", strip_frames=True), source_roots=[EXAMPLES])
    assert f.host_bound_sites and all(r["site"] == "" and r["cause"] == HOST_OVERHEAD for r in f.host_bound_sites)
    # the DataLoader's record_function ranges still tell its waits apart (no line to name without frames)
    assert f.idle_breakdown_ms["data_loader"] > 0 and f.loader_sites[0]["site"] == "DataLoader"
    recs = recommend(f)
    first = next(r for r in recs if r.why.startswith("the GPU waited for the host"))
    assert first.change.startswith(LAUNCH_OVERHEAD_FIX) and first.saved_ms > 0


def test_real_gpu_trace_charges_autograd_thread_launches_to_the_python_line():
    """On an H200 backward's kernels are launched by the autograd engine's thread (no Python frames):
    the gap is the user's `loss.backward()` line, not "host thread N" or an aten op."""
    f = tl.analyze(DATA / "naive.json.gz", source_roots=[DATA, DATA.parent])
    _no_bare_names(f.host_bound_sites)
    sites = {r["site"]: r["callee"] for r in f.host_bound_sites}
    assert sites["record_traces.py:49"] == "backward" and sites["record_traces.py:50"] == "step", sites
    assert sites["record_traces.py:48"] == "module call" and sites["record_traces.py:51"] == "zero_grad", sites
    changes = {r.site: r.change for r in recommend(f)}
    assert "torch.compile" in changes["record_traces.py:49"] and "fused=True" in changes["record_traces.py:50"]


def test_operators_between_calls_are_host_launch_overhead_of_their_function():
    f = tl.analyze(DATA / "launch_bound.json.gz", source_roots=[DATA, DATA.parent])
    top = f.host_bound_sites[0]
    assert top["callee"] == HOST_OVERHEAD and top["func"] == "step" and top["site"].startswith("record_traces.py:")


def test_installed_packages_are_library_code():
    """The profiler names files relative to their sys.path entry: `torchvision/models/resnet.py` is a
    library's (a site-packages folder holds it), `imagenet.py` is the user's."""
    from gobrrr.doctor.sources import is_library_file

    assert is_library_file("matplotlib/pyplot.py") and is_library_file("torch/nn/modules/module.py")
    assert not is_library_file("imagenet.py") and not is_library_file("examples/imagenet.py")
    assert is_library_file("<nn.Module: ResNet_0>")  # a marker frame, not source


def test_data_parallel_walk_is_named(tmp_path):
    """nn.DataParallel on one GPU walks the parameters every step before calling the model: a gap in
    that walk is DataParallel's (the fix: call the module, or DDP); a gap in the model's own forward
    under it is not."""
    src = tmp_path / "dp_train.py"
    src.write_text("def train(model, loader, opt):\n    for x in loader:\n        out = model(x)\n"
                   "        out.sum().backward()\n        opt.step()\n")
    f = str(src)

    def fr(name, ts, dur):
        return {"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    ev = [fr(f"{f}(1): train", 0, 1000),
          fr("nn.Module: DataParallel_0", 100, 800),
          fr("torch/nn/modules/module.py(1783): _call_impl", 101, 798),
          fr("torch/nn/parallel/data_parallel.py(170): forward", 102, 796),
          fr("torch/nn/modules/module.py(2800): parameters", 110, 300),    # the walk: 110-410
          fr("nn.Module: ResNet_0", 420, 470),                              # the model itself: 420-890
          fr("torch/nn/modules/module.py(1783): _call_impl", 421, 468),
          fr("<built-in method conv2d of type object at 0x1>", 430, 20)]
    tr = tl.parse({"traceEvents": ev})
    host = HostAttribution(tr, SourceResolver([tmp_path]))
    walk, model = host.locate([(1, 150, 400), (1, 600, 800)])
    assert (walk.line, walk.callee, walk.detail) == (3, "module call", "DataParallel")
    assert (model.line, model.callee, model.detail) == (3, "module call", "")
    from gobrrr.doctor.advice import host_change

    assert "DistributedDataParallel" in host_change({"site": "dp_train.py:3", "callee": "module call",
                                                     "detail": "DataParallel"})


def test_waiting_in_a_prefetcher_is_waiting_for_data(tmp_path):
    """Time in gobrrr.Prefetcher's __next__ (its source is slow) counts as waiting for data, on the `for`
    line, and the fix speaks of its source rather than suggesting a Prefetcher."""
    src = tmp_path / "pf_train.py"
    src.write_text("def train(model, loader):\n    for x in loader:\n        model(x)\n")
    f = str(src)
    ev = [{"ph": "X", "cat": "python_function", "name": n, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
          for n, ts, dur in ((f"{f}(1): train", 0, 1000), ("gobrrr/loader/prefetch_pass.py(234): __next__", 100, 500),
                             ("nn.Module: Net_0", 620, 300))]
    for i, (ts, dur) in enumerate(((50, 40), (610, 5), (700, 20))):  # kernels before and after the wait
        ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts - 5,
                "dur": 4, "args": {"correlation": i}},
               {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"correlation": i, "stream": 7}}]
    fig = tl.analyze({"traceEvents": ev}, source_roots=[tmp_path])
    (row,) = fig.loader_sites
    assert row["site"].endswith("pf_train.py:2") and row["ours"] and row["loader"] == "loader"
    assert fig.top_cause == "data_loader" and row["idle_ms"] == pytest.approx(0.5)  # 100-600 of the 90-610 gap
    change = recommend(fig)[0].change
    assert "num_workers" in change and "wrap it in gobrrr.Prefetcher" not in change
