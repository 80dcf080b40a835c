"""Prefetcher, PinnedRing, GpuTimer and the batch walker on the CPU (the GPU half is test_prefetch_gpu.py)."""
from __future__ import annotations

import collections
import dataclasses
import gc
import threading
import time
from typing import NamedTuple

import pytest
import torch
from torch.testing import assert_close
from torch.utils.data import DataLoader, Dataset, TensorDataset

import gobrrr
from gobrrr.loader.pinned import PinnedRing
from gobrrr.loader.streams import GpuTimer, resolve_device
from gobrrr.loader.tree import map_tensors, tensors


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: int
    extra: dict = dataclasses.field(default_factory=dict)
    cached: int = dataclasses.field(default=7, init=False)


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    name: str


def nested_batch(i: int = 0):
    g = torch.Generator().manual_seed(i)
    return {
        "pair": Pair(torch.randn(3, 4, generator=g), torch.arange(3) + i),
        "list": [torch.randn(2, generator=g), "text", None, 3.5],
        "tuple": (torch.zeros(2, 2, dtype=torch.bool), (torch.tensor(i), b"raw")),
        "sample": Sample(torch.randn(2, 2, generator=g), label=i, extra={"m": torch.ones(1)}),
        "frozen": Frozen(torch.randn(1, generator=g), "f"),
        "ordered": collections.OrderedDict([("b", torch.ones(2)), ("a", torch.zeros(1))]),
        "default": collections.defaultdict(list, {"k": torch.full((2,), float(i))}),
    }


def assert_same_structure(a, b):
    """Same container types all the way down; tensors equal; other leaves equal."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert_close(a, b, rtol=0, atol=0)
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys())
        for k in a:
            assert_same_structure(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_structure(x, y)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same_structure(getattr(a, f.name), getattr(b, f.name))
    else:
        assert a == b


# -- tree -----------------------------------------------------------------------------------------
def test_map_tensors_keeps_every_container_kind():
    batch = nested_batch(3)
    out = map_tensors(lambda t: t * 2 if t.dtype != torch.bool else ~t, batch)
    assert isinstance(out["pair"], Pair) and isinstance(out["sample"], Sample) and isinstance(out["frozen"], Frozen)
    assert isinstance(out["ordered"], collections.OrderedDict) and list(out["ordered"]) == ["b", "a"]
    assert isinstance(out["default"], collections.defaultdict) and out["default"].default_factory is list
    assert out["sample"].cached == 7 and out["sample"].label == 3 and out["list"][1:] == ["text", None, 3.5]
    assert_close(out["pair"].x, batch["pair"].x * 2)
    assert_close(out["sample"].extra["m"], torch.full((1,), 2.0))
    assert bool(out["tuple"][0].all())
    assert out["tuple"][1][1] == b"raw"
    # the input is not modified
    assert_close(batch["ordered"]["b"], torch.ones(2))


def test_tensors_visits_leaves_in_map_order():
    batch = nested_batch(1)
    seen = []
    map_tensors(lambda t: seen.append(t) or t, batch)
    assert [id(t) for t in tensors(batch)] == [id(t) for t in seen]
    assert len(seen) == 11


# -- Prefetcher on the CPU: pass-through ------------------------------------------------------------
def test_cpu_passthrough_every_container_kind():
    batches = [nested_batch(i) for i in range(4)]
    pf = gobrrr.Prefetcher(batches, device="cpu")
    out = list(pf)
    assert len(out) == 4
    for a, b in zip(batches, out):
        assert_same_structure(a, b)
    # pass-through: the very same tensors, nothing copied
    assert out[2]["pair"].x is batches[2]["pair"].x
    st = pf.stats()
    assert st.steps == 4 and st.bytes == 0 and len(st.host_wait_ms) == 4 and st.device == "cpu"
    assert "4 steps" in str(st) and st.to_dict()["steps"] == 4


def test_no_cuda_default_device_is_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    pf = gobrrr.Prefetcher([torch.ones(2)])
    assert pf.device == torch.device("cpu")
    assert_close(next(iter(pf)), torch.ones(2))


def test_cpu_transform_runs():
    pf = gobrrr.Prefetcher([torch.full((2,), 255, dtype=torch.uint8)], device="cpu",
                           transform=lambda t: t.float() / 255)
    (x,) = list(pf)
    assert_close(x, torch.ones(2))


def test_reiterable_across_epochs_and_len_forwards():
    data = TensorDataset(torch.arange(10.0), torch.arange(10))
    dl = DataLoader(data, batch_size=4)
    pf = gobrrr.Prefetcher(dl, device="cpu")
    assert len(pf) == 3
    for _ in range(3):
        xs = [x for x, _ in pf]
        assert [len(x) for x in xs] == [4, 4, 2]  # odd last batch passes as it is
        assert_close(torch.cat(xs), torch.arange(10.0))
    assert len(gobrrr.Prefetcher(DataLoader(data, batch_size=4, drop_last=True), device="cpu")) == 2


def test_len_of_a_generator_says_why():
    pf = gobrrr.Prefetcher((torch.ones(1) for _ in range(2)), device="cpu")
    with pytest.raises(TypeError, match="has no len"):
        len(pf)


def test_empty_iterable_yields_nothing():
    pf = gobrrr.Prefetcher([], device="cpu")
    assert list(pf) == [] and list(pf) == []
    assert pf.stats().steps == 0 and pf.stats().mean_wait_ms == 0.0


def test_early_break_releases_a_reiterable_source_and_the_next_loop_starts_over():
    pf2 = gobrrr.Prefetcher([torch.tensor([i]) for i in range(5)], device="cpu")
    for x in pf2:
        if int(x) == 1:
            break
    assert [int(t) for t in pf2] == [0, 1, 2, 3, 4]


def test_generator_source_continues_after_break_and_closes_with_the_prefetcher():
    closed = []

    def gen():
        try:
            for i in range(10):
                yield torch.tensor([i])
        finally:
            closed.append(True)

    pf = gobrrr.Prefetcher(gen(), device="cpu")
    first = []
    for x in pf:
        first.append(int(x))
        if len(first) == 3:
            break
    gc.collect()
    assert closed == [], "a break must not close a one-shot source: its remaining items would be lost"
    assert first + [int(x) for x in pf] == list(range(10))
    assert list(pf) == []   # exhausted, as the generator itself is
    del pf, x
    gc.collect()
    assert closed == [True]


# -- bad input ---------------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="iterable of batches"):
        gobrrr.Prefetcher(42, device="cpu")
    with pytest.raises(TypeError, match="iterable of batches"):
        gobrrr.Prefetcher("not batches", device="cpu")
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        gobrrr.Prefetcher([], device="gpu0")
    with pytest.raises(ValueError, match="depth must be"):
        gobrrr.Prefetcher([], device="cpu", depth=0)
    with pytest.raises(TypeError, match="transform must be callable"):
        gobrrr.Prefetcher([], device="cpu", transform=3)
    with pytest.raises(TypeError, match="device must be"):
        gobrrr.Prefetcher([], device=1.5)
    with pytest.raises(ValueError, match="not supported"):
        gobrrr.Prefetcher([], device="meta")


def test_cuda_device_without_cuda_says_what_to_do():
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="does not exist"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
    else:  # the README's promise: the same code passes batches through, with one notice
        with pytest.warns(UserWarning, match="CUDA is not available.*device=None"):
            assert gobrrr.Prefetcher([], device="cuda").device == torch.device("cpu")


class Exploding(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise ValueError(f"boom at sample {i}")
        return torch.tensor([float(i)])


@pytest.mark.timeout(60)
def test_worker_exception_propagates_with_original_traceback():
    dl = DataLoader(Exploding(), batch_size=2, num_workers=1)
    pf = gobrrr.Prefetcher(dl, device="cpu")
    got = []
    with pytest.raises(ValueError, match="boom at sample 5") as info:
        for x in pf:
            got.append(x)
    assert len(got) == 2  # the batches before the bad one arrive first
    text = str(info.value)
    assert "DataLoader worker process 0" in text and "Original Traceback" in text and "__getitem__" in text


def test_tensor_on_another_device_is_refused_on_cpu():
    meta = torch.empty(2, device="meta")
    with pytest.raises(ValueError, match="is on meta"):
        list(gobrrr.Prefetcher([meta], device="cpu"))


# -- leases (the PinnedWorkerLoader protocol) ----------------------------------------------------------
@dataclasses.dataclass
class FakeLease:
    batch: object
    release: object


class FakeLeaseLoader:
    """Yields views of ONE shared buffer, overwritten as soon as the previous lease is released."""
    yields_leases = True

    def __init__(self, n):
        self.n = n
        self.buf = torch.zeros(4)
        self.releases = []

    def __len__(self):
        return self.n

    def __iter__(self):
        free = [True]
        for i in range(self.n):
            assert free[0], "the consumer must release a lease before the next one is made"
            self.buf.fill_(i)
            free[0] = False

            def release(event, i=i):
                self.releases.append((i, event))
                free[0] = True
            yield FakeLease({"x": self.buf, "i": i}, release)


def test_lease_loader_on_cpu_copies_then_releases():
    loader = FakeLeaseLoader(5)
    pf = gobrrr.Prefetcher(loader, device="cpu")
    out = list(pf)
    assert len(pf) == 5
    assert [r for r in loader.releases] == [(i, None) for i in range(5)]
    for i, b in enumerate(out):  # each batch kept its values though the buffer was reused
        assert b["i"] == i
        assert_close(b["x"], torch.full((4,), float(i)))


# -- PinnedRing (pin=False runs the same logic without CUDA) --------------------------------------------
class GateEvent:
    """Stands in for a CUDA copy-done event: synchronize() blocks until the test opens the gate."""

    def __init__(self):
        self.gate = threading.Event()
        self.waited = False

    def synchronize(self):
        self.waited = True
        assert self.gate.wait(10)


def test_ring_stages_mixed_tensors_exactly():
    ring = PinnedRing(3, threads=2, pin=False, chunk_bytes=1000)
    big = torch.randn(10000)                                  # 40 kB: two chunks of 20 kB on 2 threads
    shared = torch.arange(6, dtype=torch.int16)
    batch = {
        "big": big, "nc": torch.randn(4, 6).t(),              # non-contiguous
        "scalar": torch.tensor(3.25, dtype=torch.float64), "empty": torch.empty(0, 3),
        "bool": torch.tensor([True, False, True]), "bf16": torch.randn(5).to(torch.bfloat16),
        "dup": [shared, shared], "label": "cat", "pair": Pair(torch.ones(2), torch.zeros(2, dtype=torch.long)),
        "complex": torch.randn(3, dtype=torch.complex64), "conj": torch.randn(2, dtype=torch.complex64).conj(),
    }
    staged = ring.stage(batch)
    out = staged.result()
    assert_same_structure(batch, out)
    assert out["big"].data_ptr() != big.data_ptr()           # a copy, in the slot
    assert out["nc"].is_contiguous()
    assert out["dup"][0] is out["dup"][1]                     # staged once
    buf = staged.slot.buf
    lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel()
    for t in tensors(out):
        if t.numel():
            assert lo <= t.data_ptr() < hi and t.data_ptr() % 64 == 0
    # one copy of the slot's used bytes rebuilds the whole batch (what the GPU path does per batch)
    flat = staged.slot.buf[:staged.nbytes].clone()
    rebuilt = staged.rebuild(flat, lambda t: t)
    assert_same_structure(batch, rebuilt)
    assert rebuilt["big"].untyped_storage().data_ptr() == flat.data_ptr()
    ring.release(staged, None)
    ring.close()


def test_ring_reuses_slots_without_new_allocation():
    ring = PinnedRing(3, threads=2, pin=False)
    for i in range(30):
        n = 1000 if i % 7 else 999          # an odd smaller batch fits the same buffers
        s = ring.stage([torch.full((n,), float(i))])
        out = s.result()
        assert_close(out[0], torch.full((n,), float(i)))
        ring.release(s, None)
    assert ring.allocations == 3            # one per slot, then reuse
    s = ring.stage([torch.zeros(10 ** 6)])  # a bigger batch grows one slot
    s.result()
    ring.release(s, None)
    assert ring.allocations == 4
    ring.close()


def test_ring_rewrites_a_slot_only_after_its_copy_done_event():
    ring = PinnedRing(2, threads=2, pin=False)
    first = ring.stage([torch.ones(100)])
    view = first.result()[0]
    ev = GateEvent()
    ring.release(first, ev)                 # "the GPU is still reading slot 0"
    second = ring.stage([torch.full((100,), 2.0)])   # slot 1: free, no event
    second.result()
    ring.release(second, None)
    third = ring.stage([torch.full((100,), 3.0)])    # slot 0 again: must wait for ev
    time.sleep(0.2)
    assert ev.waited and not third.done()
    assert_close(view, torch.ones(100))     # the bytes the GPU reads were not overwritten
    ev.gate.set()
    assert_close(third.result()[0], torch.full((100,), 3.0))
    ring.close()


def test_ring_refuses_to_overrun_held_slots_and_passes_nothing_to_stage():
    ring = PinnedRing(1, threads=1, pin=False)
    s = ring.stage([torch.ones(3)])
    with pytest.raises(RuntimeError, match="pinned slots are in use"):
        ring.stage([torch.ones(3)])
    ring.release(s, None)
    empty = ring.stage({"label": 3})        # nothing to stage: ready at once, no slot taken
    assert empty.done() and empty.slot is None and empty.result() == {"label": 3}
    ring.close()
    with pytest.raises(RuntimeError, match="closed"):
        ring.stage([torch.ones(1)])


def test_ring_deals_one_task_per_thread_covering_every_byte_once():
    import numpy as np

    from gobrrr.loader.pinned import _deal
    rng = np.random.default_rng(0)
    pieces, off = [], 0
    for n in rng.integers(1, 50_000, size=40):              # 40 tensors, 1 B to 50 kB
        pieces.append((off, rng.integers(0, 255, size=int(n), dtype=np.uint8)))
        off += -(-int(n) // 512) * 512
    groups = _deal(pieces, 3, 4096)
    assert len(groups) == 3                                  # one task per thread, not one per tensor
    sizes = [sum(len(s) for _, s in g) for g in groups]
    assert max(sizes) - min(sizes) <= 4096 * 3               # balanced to the page
    dst = np.zeros(off, np.uint8)
    hits = np.zeros(off, np.int64)
    for g in groups:
        for o, s in g:
            dst[o:o + len(s)] = s
            hits[o:o + len(s)] += 1
    for o, s in pieces:
        assert (dst[o:o + len(s)] == s).all() and (hits[o:o + len(s)] == 1).all()
    assert len(_deal(pieces, 8, 10 ** 9)) == 1              # a small batch is one task, not 8 tiny ones
    assert _deal([], 4, 1) == []


def test_ring_many_tensors_stage_exactly_with_few_threads():
    ring = PinnedRing(2, threads=3, pin=False, chunk_bytes=4096)
    batch = [torch.randn(int(n)) for n in torch.randint(1, 20_000, (25,), generator=torch.Generator().manual_seed(1))]
    for _ in range(3):
        s = ring.stage(batch)
        out = s.result()
        for a, b in zip(batch, out):
            assert_close(a, b)
        ring.release(s, None)
    ring.close()


def test_default_pin_threads_shares_cores_among_local_ranks(monkeypatch):
    from gobrrr.loader import pinned
    monkeypatch.setattr(pinned.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert pinned.default_pin_threads() == 12
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert pinned.default_pin_threads() == 1
    monkeypatch.setattr(pinned.os, "sched_getaffinity", lambda pid: set(range(128)), raising=False)
    assert pinned.default_pin_threads() == 12


def test_ring_close_and_gc_stop_its_threads():
    def pin_threads():
        return {t for t in threading.enumerate() if t.name.startswith("gobrrr-pin")}

    before = pin_threads()
    ring = PinnedRing(2, threads=3, pin=False, chunk_bytes=64)
    s = ring.stage([torch.randn(1000)])
    s.result()
    ring.release(s, None)
    mine = pin_threads() - before
    assert mine
    del ring, s
    gc.collect()
    deadline = time.time() + 5
    while any(t.is_alive() for t in mine) and time.time() < deadline:
        time.sleep(0.02)
    assert not any(t.is_alive() for t in mine)


# -- GpuTimer and devices -------------------------------------------------------------------------------
def test_gpu_timer_on_cpu_uses_perf_counter():
    timer = GpuTimer("cpu")
    for _ in range(3):
        with timer:
            time.sleep(0.01)
    assert timer.count == 3
    times = timer.times_ms()
    assert len(times) == 3 and all(9.0 <= t < 200.0 for t in times)
    assert timer.total_ms == pytest.approx(sum(times)) and timer.mean_ms == pytest.approx(sum(times) / 3)
    with pytest.raises(RuntimeError, match="without start"):
        timer.stop()
    timer.start()
    with pytest.raises(RuntimeError, match="twice"):
        timer.start()
    timer.reset()
    assert timer.count == 0 and timer.last_ms == 0.0


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("cuda:x")
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            assert resolve_device(0) == torch.device("cpu")


# -- smoke: the seed loop and `gobrrr bench copy` on the CPU ----------------------------------------------
def _load_seed_loop():
    import importlib.util
    import sys
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "examples" / "seed_loop.py"
    spec = importlib.util.spec_from_file_location("seed_loop", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("seed_loop", module)   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_seed_loop_smoke_on_cpu(capsys):
    seed_loop = _load_seed_loop()
    assert seed_loop.main(["--device", "cpu", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "naive" in out and "gobrrr" in out and "speedup" in out and "3 steps" in out
    # both loops saw the same batches and model: the same mean loss
    losses = [line.split("mean loss")[1].strip() for line in out.splitlines() if "mean loss" in line]
    assert len(losses) == 2 and losses[0] == losses[1]


def test_bench_copy_quick_on_cpu(tmp_path, monkeypatch, capsys):
    import json

    from gobrrr.bench import copy_bw
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    device = "cpu"
    assert copy_bw.main(["--quick", "--sizes", "0.25", "1", "--device", device]) == 0
    out = capsys.readouterr().out
    assert "host_memcpy" in out and "GB/s" in out
    entry = json.loads((tmp_path / "copy.jsonl").read_text().splitlines()[-1])
    assert entry["bench"] == "copy" and [r["size_MB"] for r in entry["rows"]] == [0.25, 1]
    assert all(r["GB/s"] > 0 for r in entry["rows"])


# -- the GPU code path, run on the CPU with stand-ins for streams and events ---------------------------------
# The real thing runs in test_prefetch_gpu.py; here every CUDA call the Prefetcher makes is replaced by a
# recording fake, so the ordering logic (what waits on what, which event releases which buffer, how far
# ahead copies run, what happens on errors and breaks) is checked in CI without a GPU.
class FakeEvent:
    def __init__(self, enable_timing=False):
        self.stream = None
        self.seq = None

    def record(self, stream=None):
        stream = stream if stream is not None else torch.cuda.current_stream()
        self.stream = stream
        self.seq = len(stream.log)
        stream.log.append(("record", stream.name, self))

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.5


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_event(self, event):
        assert event.stream is not None, "waiting on an event that was never recorded"
        self.log.append(("wait", self.name, event))

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))


@pytest.fixture
def fake_cuda(monkeypatch):
    import contextlib

    from gobrrr.loader import prefetch_pass
    log: list = []
    consumer = FakeStream("consumer", log)
    current = {"stream": None}

    @contextlib.contextmanager
    def stream_ctx(s):
        prev, current["stream"] = current["stream"], s
        try:
            yield
        finally:
            current["stream"] = prev

    recorded: list = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream("copy", log))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current["stream"] or consumer)
    monkeypatch.setattr(torch.cuda, "stream", stream_ctx)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: current.__setitem__("stream", s))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: recorded.append((t, s.name)))
    monkeypatch.setattr(prefetch_pass, "PinnedRing", lambda slots, **kw: PinnedRing(slots, **{**kw, "pin": False}))

    def make(iterable, **kw):
        pf = gobrrr.Prefetcher(iterable, device="cpu", **kw)
        pf._cuda = True   # take the GPU path; "copies" to the CPU device are views, so clone to keep
        return pf
    make.log, make.recorded = log, recorded
    return make


def test_gpu_path_orders_every_batch_by_events(fake_cuda):
    batches = [{"x": torch.full((3, 2), float(i)), "i": i, "p": Pair(torch.arange(2) + i, torch.ones(1))}
               for i in range(7)]
    pf = fake_cuda(batches, depth=2)
    log = fake_cuda.log
    it = iter(pf)
    assert ("wait_stream", "copy", "consumer") in log   # the copy stream starts after prior work
    copies_started = lambda: sum(1 for e in log if e[0] == "record" and e[1] == "copy")  # noqa: E731
    got = []
    for k, b in enumerate(it):
        assert copies_started() == min(7, k + 2)        # depth batches launched when batch k is handed
        got.append(map_tensors(lambda t: t.clone(), b))
        waits = [e for e in log if e[0] == "wait" and e[1] == "consumer"]
        assert len(waits) == k + 1 and waits[-1][2].stream.name == "copy"
    for a, b in zip(batches, got):
        assert_same_structure(a, b)
    # memory is allocated in the consumer's order, so no record_stream is needed without a transform;
    # instead every copy waited (on the "GPU") for the consumer's work enqueued before its allocation
    assert fake_cuda.recorded == []
    copy_waits = [e[2] for e in log if e[0] == "wait" and e[1] == "copy"]
    starts = [e[2] for e in log if e[0] == "record" and e[1] == "copy"]   # each copy's `copied` event
    assert len(copy_waits) == 7 and all(ev.stream.name == "consumer" for ev in copy_waits)
    assert all(w.seq < s.seq for w, s in zip(copy_waits, starts))
    # every staging slot was released with a copy-done event recorded on the copy stream
    for slot in pf._ring._slots:
        assert slot.buf is not None and not slot.held
        assert slot.event is None or slot.event.stream.name == "copy"
    st = pf.stats()
    assert st.steps == 7 and len(st.device_wait_ms) == 7 and st.copy_ms == pytest.approx(3.5)
    assert st.bytes == 7 * 3 * 512 and st.gbps == pytest.approx(7 * 3 * 512 / 3.5e6)  # 3 leaves, 512-aligned


def test_gpu_path_transform_is_waited_on(fake_cuda):
    pf = fake_cuda([torch.ones(2) for _ in range(3)], transform=lambda t: t * 3)
    out = [x.clone() for x in pf]
    assert all(bool((x == 3).all()) for x in out)
    log = fake_cuda.log
    waits = [e[2] for e in log if e[0] == "wait" and e[1] == "consumer"]
    copy_done = {id(copied) for _, copied, _, _ in pf._lane.times.pending}
    assert len(waits) == 3 and len(copy_done) == 3
    for ev in waits:    # the consumer waits on the event recorded after the transform, on the copy stream
        assert ev.stream.name == "copy" and id(ev) not in copy_done
    # the transform's inputs were read on the copy stream; its outputs, allocated there, used on the consumer's
    assert sorted(s for _, s in fake_cuda.recorded) == ["consumer"] * 3 + ["copy"] * 3


def test_gpu_path_leases_are_released_with_copy_events(fake_cuda):
    class EventLeases(FakeLeaseLoader):
        def __iter__(self):
            for i in range(self.n):
                def release(event, i=i):
                    self.releases.append((i, event))
                yield FakeLease({"x": torch.full((4,), float(i))}, release)

    loader = EventLeases(5)
    pf = fake_cuda(loader)
    out = [b["x"].clone() for b in pf]
    assert [i for i, _ in loader.releases] == list(range(5))
    assert all(ev is not None and ev.stream.name == "copy" for _, ev in loader.releases)
    assert_close(torch.stack(out), torch.arange(5.0)[:, None].expand(5, 4))


def test_gpu_path_source_error_after_earlier_batches_then_a_fresh_epoch(fake_cuda):
    state = {"fail": True}

    class Flaky:
        def __len__(self):
            return 6

        def __iter__(self):
            for i in range(6):
                if i == 4 and state["fail"]:
                    raise KeyError(f"sample {i} is missing")
                yield torch.full((2,), float(i))

    pf = fake_cuda(Flaky(), depth=3)
    seen = []
    with pytest.raises(KeyError, match="sample 4 is missing") as info:
        for x in pf:
            seen.append(float(x[0]))
    assert seen == [0.0, 1.0, 2.0, 3.0]
    import traceback
    assert "in __iter__" in "".join(traceback.format_tb(info.value.__traceback__))  # the source's own frame
    state["fail"] = False
    assert [float(x[0]) for x in pf] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_gpu_path_break_releases_slots_for_the_next_epoch(fake_cuda):
    data = [torch.full((100,), float(i)) for i in range(20)]
    pf = fake_cuda(data, depth=2)
    log = fake_cuda.log
    for _ in range(4):
        for k, x in enumerate(pf):
            if k == 3:
                break
        del x
        gc.collect()
        # the batch launched but never handed over: the consumer's stream was ordered after its copy
        assert log[-1][:2] == ("wait", "consumer") and log[-1][2].stream.name == "copy"
    out = [x.clone() for x in pf]
    assert_close(torch.stack(out), torch.stack(data))
    assert pf.stats().pinned_allocations == 2 * 2 + 1  # one per slot, reused by every epoch


def test_gpu_path_refuses_a_tensor_on_another_device(fake_cuda):
    with pytest.raises(ValueError, match="already on meta"):
        list(fake_cuda([{"x": torch.empty(2, device="meta")}]))


def test_gpu_path_gc_of_the_prefetcher_stops_its_pinning_threads(fake_cuda):
    def pin_threads():
        return {t for t in threading.enumerate() if t.name.startswith("gobrrr-pin")}

    before = pin_threads()
    pf = fake_cuda([torch.randn(5000) for _ in range(6)], pin_threads=2)
    it = iter(pf)
    next(it)
    next(it)                      # break mid-epoch, holding the iterator
    mine = pin_threads() - before
    assert mine
    del it, pf
    gc.collect()
    deadline = time.time() + 5
    while any(t.is_alive() for t in mine) and time.time() < deadline:
        time.sleep(0.02)
    import sys
    import traceback
    frames = sys._current_frames()
    alive = [t for t in mine if t.is_alive()]
    assert not alive, [(t.name, "".join(traceback.format_stack(frames[t.ident])[-3:])) for t in alive if t.ident in frames]


# -- iterating twice (issue 16): nothing dropped silently ------------------------------------------------------
def test_gpu_path_break_on_a_generator_keeps_the_batches_pulled_ahead(fake_cuda):
    pf = fake_cuda((torch.full((3,), float(i)) for i in range(12)), depth=3)
    got = []
    for x in pf:
        got.append(float(x[0]))
        if len(got) == 4:
            break            # depth 3: batches 4-6 are already pulled, pinned and "copied"
    for x in pf:
        got.append(float(x[0]))
    assert got == [float(i) for i in range(12)]


def test_second_pass_while_the_first_is_open_makes_the_first_raise(fake_cuda):
    for pf in (gobrrr.Prefetcher([torch.tensor([i]) for i in range(6)], device="cpu"),
               fake_cuda([torch.full((2,), float(i)) for i in range(6)], depth=2)):
        a = iter(pf)
        assert float(next(a)[0]) == 0.0
        b = iter(pf)
        assert [float(x[0]) for x in b] == [float(i) for i in range(6)]   # the new pass is whole
        with pytest.raises(RuntimeError, match="ended by a newer iter"):
            next(a)
        with pytest.raises(RuntimeError, match="ended by a newer iter"):
            list(zip(pf, pf))


def test_generator_prefetcher_closed_with_batches_pulled_ahead_says_how_many_were_dropped(fake_cuda):
    pf = fake_cuda((torch.full((3,), float(i)) for i in range(10)), depth=2)
    it = iter(pf)
    next(it)
    pf.close()
    with pytest.raises(RuntimeError, match=r"3 batch\(es\) already taken"):   # 1 copied + 2 pulled ahead
        iter(pf)


# -- issue 28: per-step host work, timing from the ordering events, no reference cycle -------------------------
def test_gpu_path_makes_three_events_and_two_stream_switches_per_step(fake_cuda, monkeypatch):
    made, switches = [], []
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: made.append(enable_timing) or FakeEvent())
    set_stream = torch.cuda.set_stream
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: switches.append(s.name) or set_stream(s))
    pf = fake_cuda([torch.full((4,), float(i)) for i in range(12)], depth=2)
    it = iter(pf)
    for _ in range(3):
        next(it)                  # warm: the first calls launch `depth` batches
    made.clear()
    switches.clear()
    for _ in range(5):
        next(it)
    # allocated, copied, waited_at: each both orders and times (a hand-rolled side stream makes one)
    assert len(made) == 5 * 3 and all(made)
    assert switches == ["copy", "consumer"] * 5
    pf._lane.timed = False        # the bench's switch: untimed events, and no waited_at
    made.clear()
    for _ in range(3):
        next(it)
    assert len(made) == 3 * 2 and not any(made)


class TimedEvent:
    """A completed event at a known time (ms)."""

    def __init__(self, t):
        self.t = t

    def elapsed_time(self, other):
        return other.t - self.t

    def query(self):
        return True

    def synchronize(self):
        pass


def test_step_times_come_from_the_ordering_events():
    from gobrrr.loader.prefetch_pass import FOLD_EVERY, StepTimes
    times = StepTimes()
    # step i: allocated at 10i; the copy stream is free again at ready(i-1); copy 3 ms; consumer waits at 10i + 4
    expect_copy, expect_wait, prev_ready = 0.0, [], None
    for i in range(3 * FOLD_EVERY + 5):
        allocated = TimedEvent(10.0 * i)
        start = max(allocated.t, prev_ready) if prev_ready is not None else allocated.t
        copied = TimedEvent(start + 3.0)
        ready = TimedEvent(copied.t + (1.0 if i % 2 else 0.0))     # odd steps: a 1 ms transform
        waited_at = TimedEvent(allocated.t + (2.0 if i % 3 else 6.0))
        times.add(allocated, copied, ready, waited_at)
        expect_copy += copied.t - start
        expect_wait.append(max(0.0, ready.t - waited_at.t))
        prev_ready = ready.t
    assert len(times.pending) < 3 * FOLD_EVERY       # folded as it went, FOLD_EVERY at a time
    times.resolve()
    assert times.copy_ms == pytest.approx(expect_copy)
    assert list(times.device_wait) == pytest.approx(expect_wait)


def test_a_generator_prefetcher_frees_its_pinned_ring_without_the_cyclic_collector(fake_cuda):
    import weakref
    gc.collect()
    gc.disable()
    try:
        pf = fake_cuda((torch.randn(1000) for _ in range(10)), depth=2, pin_threads=1)
        it = iter(pf)
        next(it)
        ring = weakref.ref(pf._ring)
        assert ring() is not None
        del pf, it               # reference counts alone: the pass holds the lane, not the Prefetcher
        deadline = time.time() + 5
        while ring() is not None and time.time() < deadline:
            time.sleep(0.01)     # fills already queued on the ring's thread still hold it until they ran
        assert ring() is None
    finally:
        gc.enable()


def test_a_loop_over_a_prefetcher_nobody_else_holds_gets_every_batch(fake_cuda):
    # `for x in Prefetcher(src)`: the Prefetcher itself is dropped once the loop has its pass
    data = [torch.full((3,), float(i)) for i in range(7)]
    assert [float(x[0]) for x in fake_cuda(data)] == [float(i) for i in range(7)]
    assert [float(x[0]) for x in fake_cuda(iter(data))] == [float(i) for i in range(7)]
    assert [float(x[0]) for x in gobrrr.Prefetcher(data, device="cpu")] == [float(i) for i in range(7)]
    assert [float(x[0]) for x in gobrrr.Prefetcher(iter(data), device="cpu")] == [float(i) for i in range(7)]
