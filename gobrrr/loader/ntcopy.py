"""Streaming (non-temporal) host copies into staging memory, with libc's memmove as the fallback.

Why: staging a pageable batch into pinned memory is a host memcpy, and on the H200 VM it is the
limit of the pageable path (pinned.py's module doc). An ordinary store first reads the destination
line into the cache ("read for ownership") and writes it back later: three trips through DRAM per
byte copied (read the source, read the destination, write it). A non-temporal store writes whole
64-byte lines straight to memory: two trips. glibc's memcpy switches to such stores only for single
copies larger than a threshold derived from the L3 size (hundreds of MB on a 300 MB-L3 VM), far above
the few-MB pieces each of our threads copies, and its threshold is read once at process start
(`GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=...`), too late for a library. Measured with
that tunable set by hand, the same staging copies ran 30-40% faster (38-43 GB/s on 8-16 threads
against 27-33). So this module carries its own copy loop:

    dst  |head: memcpy to the next 64-byte line|body: 16-byte loads, _mm_stream_si128 stores|tail|
    then one sfence, so the streamed lines are globally visible before the caller reports the copy
    done (the GPU's DMA, which later reads the slot, sees them).

The loop is 20 lines of C, built once per machine by the system C compiler into
~/.cache/gobrrr/ (or $GOBRRR_CACHE_DIR) and loaded with ctypes, which releases the GIL for the
call, so pool threads copy in parallel. No compiler, not x86-64, a failed build, or
GOBRRR_STREAM_COPY=0: `copy` is `ctypes.memmove`, the path measured before this module.
Destinations the cache should keep (small copies, < `STREAM_MIN_BYTES`) always use memmove.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

STREAM_MIN_BYTES = 256 << 10   # below this a copy is cheap, and its lines are likely to be read soon

_SOURCE = r"""
#include <emmintrin.h>
#include <stdint.h>
#include <string.h>

/* copy n bytes, src -> dst (no overlap), writing dst with non-temporal stores */
void gobrrr_stream_copy(char *dst, const char *src, size_t n) {
    size_t head = (64 - ((uintptr_t)dst & 63)) & 63;
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head; src += head; n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence();
    memcpy(dst + body, src + body, n - body);
}
"""

CopyFn = Callable[[int, int, int], None]   # (dst address, src address, nbytes)


def cache_dir() -> Path:
    return Path(os.environ.get("GOBRRR_CACHE_DIR") or Path.home() / ".cache" / "gobrrr")


def _build(out: Path) -> None:
    """Compile _SOURCE into `out` atomically (a concurrent build by another process is harmless)."""
    cc = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or ""]
    if not cc[0]:
        raise OSError("no C compiler (cc, gcc or $CC) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "ntcopy.c"
        src.write_text(_SOURCE)
        so = Path(tmp) / out.name
        subprocess.run([*cc, "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True,
                       capture_output=True, timeout=60)
        os.replace(so, out)


@functools.lru_cache(maxsize=None)   # one load per process; forked workers inherit it
def _stream_copy() -> CopyFn | None:
    if os.environ.get("GOBRRR_STREAM_COPY", "1") == "0":
        return None
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    key = hashlib.sha256((_SOURCE + platform.platform()).encode()).hexdigest()[:16]
    try:
        so = cache_dir() / f"ntcopy-{key}.so"   # (Path.home() raises without a home directory)
        if not so.exists():
            _build(so)
        fn = ctypes.CDLL(str(so)).gobrrr_stream_copy
    except Exception:      # no compiler, a read-only cache, no home, a broken build: memmove, as before
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    fn.restype = None
    return fn


def streaming() -> bool:
    """True when large copies use the streaming loop (else libc's memmove)."""
    return _stream_copy() is not None


def copy(dst: int, src: int, nbytes: int) -> None:
    """Copy `nbytes` from address `src` to address `dst` (the ranges must not overlap); the GIL is
    released during the copy. Large copies stream past the cache; small ones use memmove."""
    fn = _stream_copy() if nbytes >= STREAM_MIN_BYTES else None
    if fn is None:
        ctypes.memmove(dst, src, nbytes)
    else:
        fn(dst, src, nbytes)
