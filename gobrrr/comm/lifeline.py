"""The lifeline: a rank started by torchrun exits when its launcher dies, instead of training on.

Why it exists. torchrun's agent starts each rank in a session of its own, so a signal to the
launcher's process group never reaches the ranks, and a SIGKILL to the launcher (an OOM killer,
`kill -9`, a scheduler cleaning up) leaves them running as orphans: they keep training, writing
metrics and checkpoints into a folder that a restarted job is about to use.

What it does. At `gobrrr.comm.init()`, when the process was started by torchrun (TORCHELASTIC_RUN_ID
is set) or GOBRRR_LIFELINE=1, a daemon thread remembers the parent process id (the agent) and
polls `os.getppid()` every GOBRRR_LIFELINE_POLL_S (default 0.5 s). When the parent changes, the
launcher is gone (the orphan was re-parented to init or a subreaper), and the thread prints

    gobrrr.comm: rank 1: the launcher (process 4242) is gone; exiting (code 75) instead of
    running on as an orphan. GOBRRR_LIFELINE=0 turns this off.

and ends the process with `os._exit(75)`. GOBRRR_LIFELINE=0 turns it off (for a launcher that
is meant to exit early).

Why this cannot leave a half checkpoint: checkpoints are written aside and renamed into place
(gobrrr.train.checkpoint_io), so a process that ends at any instant leaves the previous checkpoint or
the new one, never a mix, and at worst a stale temporary file the next save removes; the
metrics log is cut back to its last whole record on the next open (gobrrr.train.metrics).

Why polling, not prctl(PR_SET_PDEATHSIG): the death signal fires when the *thread* that forked
the child exits, not the process, and torch's agent may start ranks from a helper thread; and a
signal handler in Python only runs between bytecodes of the main thread, which may be blocked in
a collective. A thread that reads the parent id costs one system call every half second.
"""
from __future__ import annotations

import os
import sys
import threading

ENV = "GOBRRR_LIFELINE"
ENV_POLL = "GOBRRR_LIFELINE_POLL_S"
EXIT_CODE = 75  # EX_TEMPFAIL, as the peer monitor: the job failed elsewhere


def wanted() -> bool:
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    return setting in ("1", "true", "yes", "on") or bool(os.environ.get("TORCHELASTIC_RUN_ID"))


def start(rank: int, parent: int | None = None) -> threading.Event | None:
    """Watch the parent process (default: the current one); return the Event that stops the watch."""
    if not wanted():
        return None
    parent = os.getppid() if parent is None else parent
    if parent <= 1:  # already orphaned (or started by init itself): nothing to watch
        return None
    try:
        poll_s = float(os.environ.get(ENV_POLL, 0.5))
    except ValueError:
        poll_s = 0.5
    stop = threading.Event()
    thread = threading.Thread(target=_watch, args=(rank, parent, stop, max(poll_s, 0.01)),
                              name="gobrrr-lifeline", daemon=True)
    thread.start()
    return stop


def _watch(rank: int, parent: int, stop: threading.Event, poll_s: float) -> None:
    while not stop.wait(poll_s):
        if os.getppid() != parent:
            sys.stderr.write(f"gobrrr.comm: rank {rank}: the launcher (process {parent}) is gone; exiting "
                             f"(code {EXIT_CODE}) instead of running on as an orphan. {ENV}=0 turns this off.\n")
            sys.stderr.flush()
            os._exit(EXIT_CODE)
