"""Keep the profiler's own chatter out of the user's terminal.

torch's profiler library (Kineto) writes one line to stderr each time a trace starts or stops:

    USDT:2026-12-04 16:45:29 30114:30114 SyncActivityProfilerHandler.cpp:52] profiler_start

These are markers for tracing tools (USDT probes), not messages for a person; the doctor starts and
stops the profiler several times per run, so a user saw 2-8 of them. Kineto's only knob,
`KINETO_LOG_LEVEL`, is a minimum severity, and its USDT level sits *above* ERROR: the one level that
hides USDT lines (6) hides Kineto's errors too (a CUPTI permission error, say), which a user needs.
So the doctor filters instead: while a profiler call runs, file descriptor 2 points at a temporary
file; afterwards every line of it goes back to the real stderr except Kineto's USDT markers. Nothing
else is dropped (another thread's output in that moment is passed on, a few ms late). A user who
sets KINETO_LOG_LEVEL themselves gets exactly what they asked for.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

USDT_RE = re.compile(rb"^USDT:.*\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def kineto_quiet():
    """Run a profiler call (start, step, stop) without Kineto's USDT marker lines on stderr."""
    if "KINETO_LOG_LEVEL" in os.environ:  # the user chose Kineto's verbosity: leave it alone
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no stderr descriptor to redirect (an embedded interpreter): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        _flush()
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            _flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().splitlines(keepends=True) if not USDT_RE.match(line)]
            if kept:
                _write_fd2(b"".join(kept))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


def _write_fd2(data: bytes) -> None:
    while data:
        try:
            n = os.write(2, data)
        except OSError:
            return
        data = data[n:]
