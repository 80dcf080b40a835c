"""Prefetcher on a GPU: ordering, allocator safety, pinned staging, memory, syncs (run on an H200).

Every test checks data against a CPU reference computed in float64, so a race (a batch overwritten
before the consumer read it) shows up as a wrong checksum, not as a flaky timing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close
from torch.utils.data import DataLoader, Dataset

import gobrrr
from gobrrr.loader.streams import GpuTimer

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
CYCLES_100US = 200_000   # torch.cuda._sleep cycles: about 100 us at the H200's ~2 GHz
CYCLES_300US = 600_000


def make_data(n_distinct: int, shape, seed: int = 0, pinned: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = [torch.randn(*shape, generator=g) for _ in range(n_distinct)]
    return [d.pin_memory() for d in data] if pinned else data


def host_pinned_allocs() -> int | None:
    """torch's own count of pinned host allocations, where this torch reports it."""
    stats = getattr(torch.cuda, "host_memory_stats", lambda: {})()
    for key in ("num_host_alloc", "allocations.allocated", "segment.allocated"):
        if key in stats:
            return int(stats[key])
    return None


# -- correctness under allocator reuse --------------------------------------------------------------
@pytest.mark.parametrize("source", ["pageable", "pinned", "pageable+transform"])
def test_checksum_1000_batches_with_a_slow_consumer(source):
    n, data = 1000, make_data(16, (64, 256), pinned=(source == "pinned"))
    transform = (lambda b: {**b, "x": b["x"] * 2.0}) if "transform" in source else None
    scale = 2.0 if transform else 1.0
    expected = torch.tensor([data[i % 16].double().sum().item() * scale for i in range(n)], dtype=torch.float64)
    pf = gobrrr.Prefetcher(({"x": data[i % 16], "i": i, "tag": "b"} for i in range(n)),
                           device="cuda", depth=2, transform=transform)
    sums = torch.zeros(n, dtype=torch.float64, device="cuda")
    for b in pf:
        assert b["tag"] == "b" and b["x"].is_cuda
        # the consumer lags behind: the host (and the copy stream) race ahead, so any batch
        # memory handed back to the allocator too early would be overwritten before this read
        torch.cuda._sleep(CYCLES_300US)
        sums[b["i"]] = b["x"].double().sum()
    assert_close(sums.cpu(), expected, rtol=1e-9, atol=1e-6)
    st = pf.stats()
    assert st.steps == n and len(st.device_wait_ms) == n and len(st.host_wait_ms) == n
    assert st.bytes == n * 64 * 256 * 4 and st.gbps > 0


def test_checksums_under_the_cuda_sanitizer(tmp_path):
    script = tmp_path / "csan_prefetch.py"
    script.write_text(textwrap.dedent("""
        import torch, gobrrr
        g = torch.Generator().manual_seed(1)
        data = [torch.randn(32, 128, generator=g) for _ in range(8)]
        pinned = [d.pin_memory() for d in data]
        for src in (data, pinned):
            pf = gobrrr.Prefetcher(({"x": src[i % 8], "y": src[(i + 3) % 8], "i": i} for i in range(100)),
                                   device="cuda", depth=2, transform=lambda b: {**b, "x": b["x"] + 1})
            sums = torch.zeros(100, dtype=torch.float64, device="cuda")
            for b in pf:
                w = torch.randn(128, 128, device="cuda")
                sums[b["i"]] = ((b["x"] @ w).sum() * 0 + b["x"].sum() + b["y"].sum()).double()
            want = torch.tensor([(src[i % 8] + 1).double().sum().item() + src[(i + 3) % 8].double().sum().item()
                                 for i in range(100)], dtype=torch.float64)
            torch.testing.assert_close(sums.cpu(), want, rtol=1e-5, atol=1e-3)
        print("CSAN-OK")
    """))
    env = dict(os.environ, TORCH_CUDA_SANITIZER="1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "CSAN-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "CSAN detected a possible data race" not in proc.stderr, proc.stderr[-6000:]


# -- pinned staging ----------------------------------------------------------------------------------
def test_every_leaf_is_pinned_before_its_host_to_device_copy():
    from torch.utils._python_dispatch import TorchDispatchMode
    aten = torch.ops.aten

    class H2DWatch(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sources_pinned: list[bool] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func is aten._to_copy.default:
                src, dst = args[0], out
            elif func is aten.copy_.default:
                dst, src = args[0], args[1]
            else:
                return out
            if isinstance(src, torch.Tensor) and src.device.type == "cpu" and dst.device.type == "cuda":
                self.sources_pinned.append(src.is_pinned())
            return out

    pinned = torch.arange(6.0).pin_memory()
    batches = [{"a": torch.randn(4, 8), "nc": torch.randn(8, 4).t(), "p": pinned, "n": 3, "s": torch.tensor(i)}
               for i in range(20)]
    watch = H2DWatch()
    with watch:
        out = [(b["a"].sum(), b["nc"].sum(), b["p"].sum(), b["s"].clone()) for b in gobrrr.Prefetcher(batches, "cuda")]
    torch.cuda.synchronize()
    assert watch.sources_pinned and all(watch.sources_pinned), watch.sources_pinned
    for b, (a, nc, p, s) in zip(batches, out):
        assert_close(a.cpu(), b["a"].sum())
        assert_close(nc.cpu(), b["nc"].sum())
        assert_close(p.cpu(), pinned.sum())
        assert int(s) == int(b["s"])


def test_no_pinned_allocation_and_flat_reserved_memory_over_20_epochs():
    data = make_data(8, (256, 1024))                  # 1 MiB each, pageable
    pf = gobrrr.Prefetcher(data, device="cuda", depth=2)
    acc = torch.zeros((), device="cuda")
    reserved, ring_allocs, torch_allocs, streams = [], [], [], set()
    for epoch in range(20):
        for b in pf:
            acc += b.sum()
        torch.cuda.synchronize()  # test only: read the allocator between epochs
        reserved.append(torch.cuda.memory_reserved())
        ring_allocs.append(pf.stats().pinned_allocations)
        torch_allocs.append(host_pinned_allocs())
        streams.add(pf._stream)
    assert_close(acc.cpu(), torch.stack([d.sum() for d in data]).sum() * 20, rtol=1e-4, atol=1e-2)
    # flat: a leak of even one 1 MiB batch per epoch would add 17 MiB over epochs 3-20; allow the
    # allocator a couple of 2 MiB segments of timing slack (a block whose record_stream event was
    # still pending when the next copy allocated)
    assert max(reserved[3:]) - reserved[3] <= 4 << 20, reserved
    assert ring_allocs[0] <= 2 * pf.depth + 1 and ring_allocs == [ring_allocs[0]] * 20
    if torch_allocs[0] is not None:
        assert torch_allocs[1:] == [torch_allocs[1]] * 19, torch_allocs
    assert len(streams) == 1   # one copy stream for the Prefetcher's whole life


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_peak_device_memory_is_at_most_depth_plus_one_batches(depth):
    data = make_data(6, (1 << 20,))                   # 4 MiB each
    batch_bytes = 4 << 20
    acc = torch.zeros((), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    for b in gobrrr.Prefetcher(data * 4, device="cuda", depth=depth):
        torch.cuda._sleep(CYCLES_100US)   # the consumer lags: the host runs many steps ahead
        acc += b.sum()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= (depth + 1) * batch_bytes + (1 << 20), (peak / batch_bytes, depth)
    # and the allocator holds no more either (memory is reused in the consumer stream's order, not
    # parked behind record_stream events while the host runs ahead); 20 MiB: one allocator segment
    peak_reserved = torch.cuda.max_memory_reserved() - base_reserved
    assert peak_reserved <= (depth + 1) * batch_bytes + (20 << 20), (peak_reserved / batch_bytes, depth)


# -- zero syncs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("pinned", [False, True])
def test_zero_host_device_syncs_per_step(pinned):
    try:
        from gobrrr import watch_syncs
    except (ImportError, AttributeError):
        pytest.skip("gobrrr.watch_syncs is not available yet")
    data = make_data(4, (128, 512), pinned=pinned)
    pf = gobrrr.Prefetcher(data * 25, device="cuda", depth=2)
    acc = torch.zeros((), device="cuda")
    for b in pf:                       # warm-up epoch: pinned buffers and streams are created here
        acc += b.sum()
    with watch_syncs() as report:      # every thread, the pinning threads included
        for b in pf:
            acc += b.sum()
    assert report.count == 0, report.to_json()
    assert_close(acc.cpu(), torch.stack([d.sum() for d in data]).sum() * 50, rtol=1e-4, atol=1e-1)


# -- API on the GPU ------------------------------------------------------------------------------------
def test_break_then_reiterate_and_transform_on_the_copy_stream():
    raw = [torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))
           for i in range(10)]
    mean = torch.tensor([0.5, 0.4, 0.3], device="cuda").view(1, 3, 1, 1)

    def normalize(x):
        return (x.float() / 255 - mean) / 0.25

    pf = gobrrr.Prefetcher(raw, device="cuda", depth=3, transform=normalize)
    for i, x in enumerate(pf):
        if i == 4:
            break
    del x
    out = [x.clone() for x in pf]      # a fresh epoch after the break starts from batch 0
    assert len(out) == len(pf) == 10
    for r, x in zip(raw, out):
        assert x.dtype == torch.float32 and x.device.type == "cuda"
        assert_close(x.cpu(), (r.float() / 255 - mean.cpu()) / 0.25)


def test_tensor_already_on_the_device_passes_through_and_empty_iterable():
    on_device = torch.arange(3.0, device="cuda")
    (b,) = list(gobrrr.Prefetcher([{"x": on_device, "y": torch.ones(2)}], device="cuda"))
    assert b["x"] is on_device and b["y"].is_cuda
    assert list(gobrrr.Prefetcher([], device="cuda")) == []


@pytest.mark.multigpu
def test_tensor_on_another_gpu_is_refused():
    other = torch.ones(2, device="cuda:1")
    with pytest.raises(ValueError, match="already on cuda:1"):
        list(gobrrr.Prefetcher([other], device="cuda:0"))


class Exploding(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise ValueError(f"boom at sample {i}")
        return torch.full((4,), float(i))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("worker_ring", [True, False])
def test_dataloader_with_workers_and_worker_errors(worker_ring):
    class Squares(Dataset):
        def __len__(self):
            return 37

        def __getitem__(self, i):
            return torch.full((16,), float(i * i)), i

    dl = DataLoader(Squares(), batch_size=8, num_workers=2, pin_memory=not worker_ring)
    pf = gobrrr.Prefetcher(dl, device="cuda", worker_ring=worker_ring)
    assert len(pf) == 5
    for _ in range(2):
        got = [(x.clone(), y.clone()) for x, y in pf]
        assert [len(y) for _, y in got] == [8, 8, 8, 8, 5]  # odd last batch
        for x, y in got:
            assert_close(x.cpu(), (y.cpu().double() ** 2).float()[:, None].expand(-1, 16))
    pf.close()
    bad = gobrrr.Prefetcher(DataLoader(Exploding(), batch_size=2, num_workers=1), device="cuda",
                            worker_ring=worker_ring)
    seen = []
    with pytest.raises(Exception, match="boom at sample 5") as info:
        for x in bad:
            seen.append(x.clone())
    assert "Traceback" in str(info.value) or info.value.__traceback__ is not None
    assert len(seen) == 2
    bad.close()


def test_gpu_timer_resolves_lazily():
    timer = GpuTimer("cuda")
    for _ in range(5):
        with timer:
            torch.cuda._sleep(CYCLES_100US)
    assert timer.count == 5
    times = timer.times_ms()
    assert len(times) == 5 and all(0.01 < t < 50 for t in times), times


def test_cuda1_creates_no_context_on_gpu0(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    script = tmp_path / "ctx.py"
    script.write_text(textwrap.dedent("""
        import torch, gobrrr
        has_ctx = getattr(torch._C, "_cuda_hasPrimaryContext", None)
        if has_ctx is None:
            print("SKIP"); raise SystemExit(0)
        data = [torch.randn(64, 64) for _ in range(6)] + [torch.randn(64, 64).pin_memory()]
        pf = gobrrr.Prefetcher(data, device="cuda:1", transform=lambda x: x * 2)
        acc = torch.zeros((), device="cuda:1")
        for x in pf:
            acc += x.sum()
        print(pf.stats())
        torch.cuda.synchronize(1)
        print("CTX", has_ctx(0), has_ctx(1))
    """))
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if "SKIP" in proc.stdout:
        pytest.skip("this torch has no _cuda_hasPrimaryContext")
    assert "CTX False True" in proc.stdout, proc.stdout


# -- smoke: the seed loop and `gobrrr bench copy` on the GPU ---------------------------------------------
def test_seed_loop_smoke_on_gpu(capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("seed_loop", ROOT / "examples" / "seed_loop.py")
    seed_loop = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("seed_loop", seed_loop)
    spec.loader.exec_module(seed_loop)
    assert seed_loop.main(["--steps", "5", "--side", "64"]) == 0
    out = capsys.readouterr().out
    assert "naive" in out and "gobrrr" in out and "speedup" in out and "5 steps" in out


def test_bench_copy_quick_on_gpu(tmp_path, monkeypatch, capsys):
    from gobrrr.bench import copy_bw
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    assert copy_bw.main(["--quick", "--sizes", "4"]) == 0
    out = capsys.readouterr().out
    for kind in copy_bw.KINDS:
        assert kind in out
    assert "pinned H2D peak" in out
