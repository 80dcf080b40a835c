"""The streaming staging copy (gobrrr.loader.ntcopy): exact bytes at every alignment, and memmove
whenever the loop cannot be built or is turned off."""
import platform
import shutil

import numpy as np
import pytest
import torch

from gobrrr.loader import ntcopy
from gobrrr.loader.pinned import PinnedRing


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """An empty cache folder and no loaded library: the next copy builds (or fails to build) anew."""
    monkeypatch.setenv("GOBRRR_CACHE_DIR", str(tmp_path))
    ntcopy._stream_copy.cache_clear()
    yield tmp_path
    ntcopy._stream_copy.cache_clear()


def _check_copies() -> None:
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, size=(3 << 20) + 77, dtype=np.uint8)
    for so in (0, 1, 13, 64):
        for do in (0, 3, 63):
            for n in (0, 1, 63, 64, 65, ntcopy.STREAM_MIN_BYTES - 1, ntcopy.STREAM_MIN_BYTES + 5, 3 << 20):
                dst = np.zeros(len(src) + 128, np.uint8)
                ntcopy.copy(dst.ctypes.data + do, src.ctypes.data + so, n)
                np.testing.assert_array_equal(dst[do:do + n], src[so:so + n], err_msg=f"{so=} {do=} {n=}")
                assert not dst[:do].any() and not dst[do + n:].any(), f"wrote outside the range ({so=} {do=} {n=})"


def test_streaming_copy_is_exact_at_every_alignment_and_size(fresh_build, monkeypatch):
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the streaming loop is x86-64 only (memmove elsewhere)")
    monkeypatch.delenv("CC", raising=False)   # the system's cc
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here (memmove is tested below)")
    assert ntcopy.streaming(), "a C compiler is on this machine, so the loop should build"
    assert list(fresh_build.glob("ntcopy-*.so")), "the built library is cached for the next process"
    _check_copies()


def test_no_compiler_falls_back_to_memmove(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", str(fresh_build / "no-such-compiler"))
    assert not ntcopy.streaming()
    assert not list(fresh_build.glob("ntcopy-*.so")), "a failed build leaves nothing half-written"
    _check_copies()


def test_unwritable_cache_falls_back_to_memmove(fresh_build, monkeypatch):
    blocker = fresh_build / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("GOBRRR_CACHE_DIR", str(blocker / "cache"))   # a folder under a file: cannot exist
    assert not ntcopy.streaming()
    _check_copies()


def test_turned_off_by_env(fresh_build, monkeypatch):
    monkeypatch.setenv("GOBRRR_STREAM_COPY", "0")
    assert not ntcopy.streaming()
    _check_copies()


def test_ring_stages_exact_bytes_through_the_streaming_copy(fresh_build):
    ring = PinnedRing(2, threads=2, pin=False, chunk_bytes=1 << 20)
    try:
        g = torch.Generator().manual_seed(0)
        batch = {"x": torch.randn(3, 1 << 18, generator=g), "y": torch.randint(0, 9, (1000,), generator=g),
                 "odd": torch.randn(12345, dtype=torch.float64, generator=g)}
        for _ in range(3):   # slots reused
            staged = ring.stage(batch)
            out = staged.result()
            for k in batch:
                assert out[k].data_ptr() != batch[k].data_ptr()
                torch.testing.assert_close(out[k], batch[k], rtol=0, atol=0)
            ring.release(staged, None)
    finally:
        ring.close()
