"""The peer monitor: on NCCL, exit with a clear message when a peer has left and we wait for it.

Why it exists. Under gloo a collective whose peer is gone raises (timeout or "connection closed"),
and gobrrr.comm.debug.explain_failure turns that into a message naming the ranks. Under NCCL
nothing raises in Python: `all_reduce` only *queues* a kernel; the host blocks later, in some
`.item()` or `synchronize()`, and stays blocked until NCCL's watchdog kills the process after the
timeout (300 s here, 10 minutes by NCCL's default) with a message that names the op but not who
is missing.

What it does. A daemon thread per process (started by `init()` for NCCL groups with more than one
rank; GOBRRR_DIST_MONITOR=1 forces it on for any backend, =0 off) polls one store counter every
second. When a peer posts "raised X and left" (the `session()` context manager and the test
harness do, on the way out), and this rank's latest collective is *still pending* `stall_s`
seconds later (GOBRRR_DIST_MONITOR_STALL_S, default 10), it prints

    gobrrr.comm: rank 0 gives up: rank 2 raised ValueError: boom and left. This rank's latest
    collective, all_reduce #17 on group WORLD, has waited 10 s for it and cannot complete. ...

and exits with code 75. It never fires while our latest op has completed (the rank is computing,
or writing a checkpoint, not waiting), nor for a peer that shut down cleanly.

Cost: one store round trip per second per rank, off the training thread.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from gobrrr.comm import debug as _debug

ENV_MONITOR = "GOBRRR_DIST_MONITOR"
ENV_STALL = "GOBRRR_DIST_MONITOR_STALL_S"
EXIT_CODE = 75  # EX_TEMPFAIL: the job failed elsewhere; this rank is fine but cannot go on
_POLL_S = 1.0


def wanted(backend: str, world_size: int) -> bool:
    setting = os.environ.get(ENV_MONITOR, "").lower()
    if setting in ("0", "false", "no", "off"):
        return False
    return world_size > 1 and (setting in ("1", "true", "yes", "on") or "nccl" in backend)


def start(world: _debug.GroupWatch, backend: str) -> threading.Thread | None:
    """Start the monitor for this process's world group, if wanted; `debug.uninstall()` stops it."""
    if world.root is None or not wanted(backend, world.size):
        return None
    stop = threading.Event()
    world.monitor_stop = stop
    stall_s = float(os.environ.get(ENV_STALL, 10.0))
    thread = threading.Thread(target=_loop, args=(world, stop, stall_s), name="gobrrr-dist-monitor", daemon=True)
    thread.start()
    return thread


def pending(work) -> bool:
    """Is this Work (or list of Works) still running? None counts as done."""
    if work is None:
        return False
    works = work if isinstance(work, list) else [work]
    return not all(w.is_completed() for w in works)


def _loop(world: _debug.GroupWatch, stop: threading.Event, stall_s: float) -> None:
    seen = 0
    left: dict[int, tuple[str, float]] = {}  # global rank -> (why, when we noticed)
    me = world.ranks[world.me]
    while not stop.wait(_POLL_S):
        try:
            count = int(world.root.add("exits", 0))
            if count != seen:
                seen = count
                for r in world.ranks:
                    if r != me and r not in left and world.root.check([f"exit/{r}"]):
                        why = world.root.get(f"exit/{r}").decode(errors="replace")
                        if why.startswith("raised"):  # a clean shutdown is not a failure
                            left[r] = (why, time.monotonic())
            if not left:
                continue
            stuck = [w for w in list(_debug._WATCHES.values()) if pending(w.last_work)]
            waited = time.monotonic() - min(t for _, t in left.values())
            if stuck and waited >= stall_s and not stop.is_set():
                _give_up(me, left, stuck[0], waited)
        except Exception:  # the store is gone (its host died) or we are shutting down: stay passive
            return


def _give_up(me: int, left: dict[int, tuple[str, float]], watch: _debug.GroupWatch, waited: float) -> None:
    who = "; ".join(f"rank {r} {why}" for r, (why, _) in sorted(left.items()))
    name, k = watch.last_op
    op = name if k is None else f"{name} #{k}"
    sys.stderr.write(
        f"gobrrr.comm: rank {me} gives up: {who}. This rank's latest collective, {op} on group "
        f"{watch.name}, has waited {waited:.0f} s for it and cannot complete. Exiting now (code {EXIT_CODE}) "
        f"instead of waiting {watch.timeout_s:g} s for the backend's timeout. Fix the rank that raised; "
        f"{ENV_MONITOR}=0 turns this monitor off.\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
