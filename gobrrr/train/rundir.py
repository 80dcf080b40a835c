"""A run folder that belongs to one live run.

    lock = take_run_folder(out)          # creates `out`; RunDirError if another live run holds it
    ...
    lock.release()

The run folder, step by step:
  1. `prepare_folder`: create the folder (and its parents); a path that is a file, lies under a
     file, or cannot be written raises `RunDirError` with one sentence of what to do, instead of
     `FileExistsError` / `NotADirectoryError` / `OSError: [Errno 30]` from deep inside a run;
  2. `take_run_folder`: open DIR/run.lock and take an exclusive POSIX record lock on it
     (`fcntl.lockf`, non-blocking). The kernel drops the lock when its process dies, however it
     dies (SIGKILL included), so a lock left by a dead run never blocks the next one and there is
     no "stale lock" to clean up by hand. The holder writes "host pid start-time" into the file;
     a second run that cannot take the lock reads it and names the live run. POSIX locks are
     not inherited by fork()ed children (DataLoader workers), and work over NFS; on a
     filesystem without locks the run goes on unguarded, with a warning.
     The file stays after the run (removing it would race with a run that just opened it);
  3. `claim(out, is_main, device)`: the multi-rank form, as `with`: rank 0 takes the folder and
     every rank learns whether it could (gobrrr.comm.agree: one all-reduce of one number), so all
     ranks stop together with rank 0's reason. A folder the claim created and the run left holding
     nothing but run.lock (it failed before writing anything) is removed again on the way out.

The metrics log that lives in the folder is gobrrr.train.metrics; the checkpoints,
gobrrr.train.checkpoints.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from gobrrr.comm.agree import first_error

LOCK_NAME = "run.lock"


class RunDirError(RuntimeError):
    """The run folder cannot be used as asked; the message says what to change."""


def _why(e: OSError, started: bool = True) -> str:
    """One clause of advice for an OSError met while writing into a run folder; `started`: a run is in the
    folder already, so --resume continues it (not so while the folder is being made)."""
    then = " and continue with --resume" if started else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full; free space (or point --out at a larger disk){then}"
    if e.errno == errno.EFBIG:
        return f"the file is larger than this process may write (ulimit -f); raise the limit{then}"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "the folder is read-only for this process; choose an --out folder you can write to"
    if not started:
        return "choose an --out folder in a place you can write to"
    return "check the disk and the folder's permissions, then continue with --resume"


def prepare_folder(folder: str | os.PathLike) -> Path:
    """Create `folder` (with parents) and check that files can be created in it."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise RunDirError(f"--out {folder} is a file, not a folder; choose a folder path for the run")
    for parent in folder.parents:
        if parent.exists():
            if not parent.is_dir():
                raise RunDirError(f"--out {folder} lies under {parent}, which is a file; choose a folder path")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot create the run folder {folder}: {e.strerror}; {_why(e, started=False)}") from e
    probe = folder / f".gobrrr-write-probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise RunDirError(f"cannot write into the run folder {folder}: {e.strerror}; {_why(e, started=False)}") from e
    return folder


class RunLock:
    """The lock on a run folder, held by this process until `release()` or its death."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the POSIX lock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> str:
    """Who holds the lock, from the file's text ("host pid start"), in words."""
    for _ in range(20):  # the holder writes its name right after taking the lock: give it a moment
        text = os.pread(fd, 256, 0).decode(errors="replace").split()
        if len(text) >= 2:
            host, pid = text[0], text[1]
            since = ""
            if len(text) >= 3:
                try:
                    since = ", started " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(text[2])))
                except ValueError:
                    pass
            return f"process {pid} on host {host}{since}"
        time.sleep(0.05)
    return "another process (it has not written its name yet)"


def take_run_folder(folder: str | os.PathLike) -> RunLock:
    """Create `folder` if needed and make this process its only writer; RunDirError names the live holder."""
    folder = prepare_folder(folder)
    path = folder / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise RunDirError(f"cannot open {path}: {e.strerror}; {_why(e, started=False)}") from e
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            # a filesystem without locks (some FUSE/NFS setups): run unguarded rather than not at all
            sys.stderr.write(f"gobrrr: warning: {folder} does not support file locks ({e.strerror}); a second "
                             "run into it would not be stopped\n")
            return RunLock(path, fd)
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            os.close(fd)
            raise RunDirError(f"cannot lock {path}: {e.strerror}; use a local folder for --out") from e
        who = _holder(fd)
        os.close(fd)
        raise RunDirError(f"{folder} is in use by a live run ({who}); wait for it, stop it, "
                          "or choose another --out") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()} {os.getpid()} {time.time():.0f}\n".encode(), 0)
    except OSError:
        pass  # the lock is what counts; the name only makes the refusal message friendlier
    return RunLock(path, fd)


# ---------------------------------------------------------------- every rank agrees

@contextlib.contextmanager
def claim(folder: str | os.PathLike, is_main: bool, device: Any) -> Iterator[RunLock | None]:
    """`with claim(out, rank.is_main, rank.device):` rank 0 takes the folder (take_run_folder) and
    every rank learns whether it could, so that all stop together with rank 0's reason. One
    all-reduce of one number at start (a no-op at world size 1); the lock is dropped on exit, and a
    folder this claim created is removed again when the run failed before writing anything into it."""
    error, lock, created = None, None, False
    if is_main:
        created = not Path(folder).exists()
        try:
            lock = take_run_folder(folder)
        except RunDirError as e:
            error = e
    error = first_error(error, device=device)  # every rank: rank 0's reason (sync: once, at start)
    if error is not None:
        raise error
    try:
        yield lock
    except BaseException:
        if created and lock is not None:
            _remove_if_untouched(Path(folder), lock)
        raise
    finally:
        if lock is not None:
            lock.release()


def _remove_if_untouched(folder: Path, lock: RunLock) -> None:
    """The run failed before writing anything: leave no folder holding only run.lock behind."""
    try:
        if {p.name for p in folder.iterdir()} == {LOCK_NAME}:
            lock.path.unlink()
            folder.rmdir()
    except OSError:
        pass  # a folder we cannot tidy is still a correct one
