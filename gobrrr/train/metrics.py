"""The run's metrics: metrics.jsonl (whole records only, each step once) and what rank 0 prints.

    log = StepLog(cfg, rank, start, ...)       # the loop's bookkeeping
    log.add(out)                               # (2,) on the device: loss, grad norm; no host read
    log.flush(step)                            # every --log-every steps: one all-reduce, one read
    records = read_metrics(out / "metrics.jsonl")

One log interval, phase by phase:
  1. each step appends its (loss, grad norm) pair, still on the device;
  2. at a log step the pairs are stacked, all-reduced over ranks (one collective per interval) and
     read in one go (`.tolist()`: # sync: the one device->host read per interval);
  3. rank 0 appends one JSON object per step to DIR/metrics.jsonl with one write (`MetricsLog`),
     and every rank learns whether that write worked (gobrrr.comm.agree), so a full disk stops all
     ranks with rank 0's message; then a progress bar (a terminal) or a plain line (--no-progress,
     a log file) shows the last step, and at the end one "done:" line.

The metrics log (JSON Lines, append only):
  * `append(records)` (or `write(line)`s then `flush()`, the shape of a file) puts every line of
    a flush on disk with one `os.write` on an O_APPEND descriptor (more only after a short write).
    If the write fails or is short (disk full, quota, file-size limit), the file is cut back to
    its length before the write (`ftruncate`) and `RunDirError` is raised: a record is on disk
    whole or not at all.
  * Opening repairs a torn tail (a last line without its newline, left by a kill or power cut in
    the middle of a write): the partial line is cut off and `repaired_bytes` says how many bytes went.
  * On resume from the checkpoint at step s, `cut_after(s)` cuts the records of steps past s (logged
    before the kill, and about to be run and logged again), so each step appears once; a
    {"event": "resume", "step": s, "repaired_bytes": ..., "cut_records": ...} record marks the seam.
  * `read_jsonl` skips a torn last line, so a folder written by an older version still reads;
    `read_metrics` keeps the later record of a step logged twice (folders of gobrrr 0.1).
"""
from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import torch

from gobrrr.comm import collectives as comm
from gobrrr.comm.agree import first_error
from gobrrr.train.config import TrainConfig, lr_at
from gobrrr.train.rundir import RunDirError, _why

METRICS = "metrics.jsonl"


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

    def cut_after(self, step: int) -> int:
        """Cut every line from the first record of a step past `step` on (a resume from the checkpoint at `step`:
        those steps run again and are logged again, so each step appears once); return the records cut."""
        offset, cut = 0, None
        with open(self.path, "rb") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    rec = {}
                if cut is None and "event" not in rec and rec.get("step", 0) > step:
                    cut = offset
                offset += len(line)
        if cut is None:
            return 0
        n = sum(1 for rec in read_jsonl(self.path) if "event" not in rec and rec.get("step", 0) > step)
        try:
            os.ftruncate(self._fd, cut)  # one call: the file is whole before and after it
        except OSError as e:
            raise RunDirError(f"cannot cut {self.path} back to step {step}: {e.strerror}; {_why(e)}") from e
        return n

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


def read_metrics(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """metrics.jsonl as {step: record}; for a step logged twice (a folder of gobrrr 0.1, before a kill and after
    the resume) the later record wins. Event records ({"event": ...}) are skipped."""
    records: dict[int, dict[str, Any]] = {}
    for rec in read_jsonl(path):  # a torn last line (a crash mid-write) is skipped
        if "event" not in rec:
            records[rec["step"]] = rec
    return records


class Progress:
    """Rank 0's view: a rich progress bar on a terminal (unless --no-progress), else one plain line per log
    interval; nothing on the other ranks."""

    def __init__(self, main: bool, bar: bool, total: int, start: int, title: str):
        self.bar, self.main, self.total = None, main, total
        if not (main and bar):
            return
        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[stats]}"), TimeRemainingColumn(), console=console)
            self.task = self.bar.add_task(title, total=total, completed=start, stats="")
            self.bar.start()

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def report(self, step: int, loss: float, tokens_per_s: float | None, mfu: float | None) -> None:
        if not self.main:
            return
        stats = (f"loss {loss:.4f}" + (f"  {tokens_per_s:,.0f} tok/s" if tokens_per_s else "")
                 + (f"  MFU {mfu:.1%}" if mfu is not None else ""))
        if self.bar is not None:
            self.bar.update(self.task, stats=stats)
        else:
            print(f"step {step}/{self.total}  {stats}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class StepLog:
    """The loop's bookkeeping: losses on the device until a log step, metrics.jsonl, tokens/s, MFU, progress."""

    def __init__(self, cfg: TrainConfig, rank, start: int, *, tokens_per_step: int, flops_per_token: float,
                 peak: float | None, title: str):
        self.cfg, self.device, self.world, self.main = cfg, rank.device, rank.world_size, rank.is_main
        self.tokens_per_step, self.flops_per_token, self.peak = tokens_per_step, flops_per_token, peak
        self.pending: list[torch.Tensor] = []   # per step: (loss, grad_norm) stacked, still on the device
        self.logged: dict[int, float] = {}
        self.rates: list[float] = []
        self.t_last, self.t_step = time.perf_counter(), start  # the clock of this interval, and its first step
        self.metrics = MetricsLog(Path(cfg.out) / METRICS) if self.main else None
        self.progress = Progress(self.main, cfg.progress, cfg.steps, start, title)
        if self.metrics is not None and cfg.resume:  # the steps past the checkpoint run (and are logged) again
            cut = self.metrics.cut_after(start)
            self.metrics.append([{"event": "resume", "step": start, "time": time.time(),
                                  "repaired_bytes": self.metrics.repaired_bytes, "cut_records": cut}])

    def add(self, out: torch.Tensor) -> None:
        self.pending.append(out)
        self.progress.advance()

    def restart_clock(self, now: float, step: int) -> None:
        """The first step (compilation, allocation) is timed apart: the next interval starts here."""
        self.t_last, self.t_step = now, step

    def flush(self, step: int) -> None:
        if not self.pending:
            return
        both = torch.stack(self.pending)             # (n, 2): loss, grad norm per step
        comm.all_reduce(both)                        # one collective per log interval (names a dead rank)
        rows = (both / self.world).tolist()          # sync: the one device->host read per log interval
        now = time.perf_counter()
        dt = (now - self.t_last) / (step - self.t_step) if step > self.t_step else None
        tok_s = self.tokens_per_step / dt if dt else None
        mfu = self.flops_per_token * tok_s / (self.peak * self.world) if (self.peak and tok_s) else None
        first, error = step - len(rows) + 1, None
        for i, (loss, norm) in enumerate(rows):
            self.logged[first + i] = loss
        if self.metrics is not None:
            try:
                self.metrics.append({"step": first + i, "loss": loss, "lr": lr_at(first + i - 1, self.cfg),
                                     "grad_norm": norm, "tokens_per_s": tok_s, "step_ms": dt * 1e3 if dt else None,
                                     "mfu": mfu} for i, (loss, norm) in enumerate(rows))
            except RunDirError as e:
                error = e
        if (error := first_error(error, device=self.device)) is not None:  # rank 0's write, known to every rank
            raise error
        if tok_s:
            self.rates.append(tok_s)
        self.progress.report(step, rows[-1][0], tok_s, mfu)
        self.pending.clear()
        self.t_last, self.t_step = now, step

    def summary(self) -> tuple[float | None, float | None]:
        """(median tokens/s past the first interval, its MFU)."""
        steady = self.rates[1:] or self.rates  # the first step is timed apart; skip one more interval
        tok_s = sorted(steady)[len(steady) // 2] if steady else None
        mfu = self.flops_per_token * tok_s / (self.peak * self.world) if (self.peak and tok_s) else None
        return tok_s, mfu

    def close(self) -> None:
        self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
