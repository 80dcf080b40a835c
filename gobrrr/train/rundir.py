"""A run folder that belongs to one live run, and a metrics log that is never torn.

    lock = take_run_folder(out)          # creates `out`; RunDirError if another live run holds it
    log = MetricsLog(out / "metrics.jsonl")
    log.append([{"step": 1, "loss": 5.2}, {"step": 2, "loss": 5.1}])   # all lines, or none
    log.close(); lock.release()

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
     one all-reduce of one number tells every rank whether it could, so all ranks stop together
     with rank 0's reason.

The metrics log (JSON Lines, append only):
  * `append(records)` (or `write(line)`s then `flush()`, the shape of a file) puts every line of
    a flush on disk with one `os.write` on an O_APPEND descriptor (more only after a short write).
    If the write fails or is short (disk full, quota, file-size limit), the file is cut back to
    its length before the write (`ftruncate`) and `RunDirError` is raised: a record is on disk
    whole or not at all.
  * Opening repairs a torn tail (a last line without its newline, left by a kill or power cut in
    the middle of a write, or by older versions on a full disk): the partial line is cut off and
    `repaired_bytes` says how many bytes went, so the resume record can say so.
  * `read_jsonl` skips a torn last line, so a folder written by an older version still reads.

Cost: one write system call per log interval (the trainer flushes every --log-every steps).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

LOCK_NAME = "run.lock"


class RunDirError(RuntimeError):
    """The run folder cannot be used as asked; the message says what to change."""


def _why(e: OSError) -> str:
    """One clause of advice for an OSError met while writing into a run folder."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full; free space (or point --out at a larger disk) and continue with --resume"
    if e.errno == errno.EFBIG:
        return "the file is larger than this process may write (ulimit -f); raise the limit and continue with --resume"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "the folder is read-only for this process; choose an --out folder you can write to"
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
        raise RunDirError(f"cannot create the run folder {folder}: {e.strerror}; {_why(e)}") from e
    probe = folder / f".gobrrr-write-probe.{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise RunDirError(f"cannot write into the run folder {folder}: {e.strerror}; {_why(e)}") from e
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
        raise RunDirError(f"cannot open {path}: {e.strerror}; {_why(e)}") from e
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


# ---------------------------------------------------------------- the metrics log

def repair_torn_tail(path: str | os.PathLike) -> int:
    """Cut a last line that lacks its newline off `path`; return the number of bytes removed."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        keep, chunk = 0, 1 << 16
        pos = size
        while pos > 0:  # scan back for the last newline
            start = max(0, pos - chunk)
            f.seek(start)
            block = f.read(pos - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep


class MetricsLog:
    """Append-only JSON Lines file; each flush lands whole or not at all (see the module docstring).

    File-like on purpose, so a trainer keeps its `write(line)` ... `flush()` shape: `write` only
    buffers in memory, `flush` is the one system call."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._buffer: list[str] = []
        self._fd: int | None = None
        try:
            self.repaired_bytes = repair_torn_tail(self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise RunDirError(f"cannot open {self.path}: {e.strerror}; {_why(e)}") from e

    def write(self, text: str) -> None:
        self._buffer.append(text)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Write `records` as one flush."""
        for r in records:
            self._buffer.append(json.dumps(r) + "\n")
        self.flush()

    def flush(self) -> None:
        data = "".join(self._buffer).encode()
        self._buffer.clear()
        if not data:
            return
        before = os.fstat(self._fd).st_size
        try:
            done = 0
            while done < len(data):  # a short write means the disk filled up: the next write says why
                n = os.write(self._fd, data[done:])
                if n == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += n
        except OSError as e:
            try:
                os.ftruncate(self._fd, before)  # take the partial lines back: whole records only
            except OSError:
                pass
            raise RunDirError(f"could not append to {self.path}: {e.strerror or e}; the records logged so "
                              f"far are intact; {_why(e)}") from e

    def close(self) -> None:
        """Close the file; what was written but not flushed is dropped (callers flush what counts)."""
        self._buffer.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a JSON Lines file; a torn last line (no newline, not valid JSON) is skipped."""
    text = Path(path).read_text()
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:  # the last line has no newline: a record cut by a kill or a full disk
                break
            raise ValueError(f"{path}:{i + 1} is not a JSON record ({e.msg}); the file was edited or damaged") from e
    return records


# ---------------------------------------------------------------- every rank agrees

@contextlib.contextmanager
def claim(folder: str | os.PathLike, is_main: bool, device: Any) -> Iterator[RunLock | None]:
    """`with claim(out, rank.is_main, rank.device):` rank 0 takes the folder (take_run_folder) and
    every rank learns whether it could, so that all stop together with rank 0's reason. One
    all-reduce of one number at start (a no-op at world size 1); the lock is dropped on exit."""
    import torch
    import torch.distributed as dist

    error, lock = None, None
    if is_main:
        try:
            lock = take_run_folder(folder)
        except RunDirError as e:
            error = e
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        failed = torch.tensor([0.0 if error is None else 1.0], device=device)
        dist.all_reduce(failed)
        if failed.item() and error is None:  # sync: once, at start
            error = RunDirError(f"rank 0 could not take the run folder {folder}; see its message")
    if error is not None:
        raise error
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()
