"""Run a function on N ranks in fresh processes, for tests: `spawn(fn, world_size, *args)`.

    def check_sum(rank, n):                      # module-level: it is pickled by name
        t = torch.full((n,), float(rank.rank))
        comm.all_reduce(t)
        return t.tolist()

    results = spawn(check_sum, 4, 8)             # [[6.0]*8, [6.0]*8, [6.0]*8, [6.0]*8]

Each rank runs in its own process with the process group already initialised through
`gobrrr.comm.init` (gloo on CPU by default; `backend="nccl"` gives rank r the GPU r). The parent
hosts the rendezvous store on a free port (bound to port 0), so parallel test runs never collide.

Failure handling, so that no test hangs:
  * a rank raises -> `SpawnError` carrying that rank's traceback (and every other rank's error,
    which usually names the rank that left); the other ranks get `pg_timeout_s + 5 s` to report,
    then they are killed;
  * past `timeout_s` -> every rank is killed and `TimeoutError` names the ranks still running;
  * each rank's stderr goes to a temporary file; for a rank that exits without a word (killed, a
    native crash, the peer monitor) its last lines are part of the error.

Gloo ranks come from a fork server that has already imported torch (fork of a warm interpreter,
~50 ms, instead of a cold `spawn` at ~2-3 s per rank). NCCL ranks use `spawn` (fresh
interpreters), so no rank can inherit an initialised CUDA driver.
"""
from __future__ import annotations

import datetime as _dt
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import shutil
import tempfile
import time
import traceback
from typing import Any, Callable

import torch.distributed as dist

# Imported once by the fork server, so every rank starts warm. torch.distributed.tensor is there
# because torch.testing.assert_close imports it (~1.5 s, sympy) as soon as a process group exists.
_PRELOAD = ["torch", "torch.distributed", "torch.testing", "torch.distributed.tensor",
            "torch._dynamo",  # every rank's first optimizer or dispatch mode imports it: ~2.5 s of CPU each, once here
            "gobrrr.comm.ranks", "gobrrr.comm.collectives", "gobrrr.comm.ring"]


class SpawnError(RuntimeError):
    """One or more ranks raised; `.failures` maps rank -> its traceback text, `.first` is the first to fail."""

    def __init__(self, failures: dict[int, str], first: int, killed: list[int]):
        self.failures, self.first, self.killed = failures, first, killed
        order = [first] + sorted(r for r in failures if r != first)
        msg = f"rank {first} failed first: {_last_line(failures[first])}"
        if killed:
            msg += f" (ranks {killed} were still running and were killed)"
        for r in order:
            msg += f"\n----- rank {r} -----\n{failures[r].rstrip()}"
        super().__init__(msg)


def _last_line(tb: str) -> str:
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no traceback)"


def _tail(path: str, chars: int = 3000) -> str:
    """The end of a rank's stderr, for the report on a rank that exited without a word."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-chars:].strip()
    except OSError:
        return ""
    return f"\nlast lines of its stderr:\n{text}" if text else ""


def _context(backend: str) -> mp.context.BaseContext:
    # GPU ranks start from a fresh interpreter: a fork of any process that has touched the CUDA
    # driver cannot use CUDA, and we cannot promise what an import does on every torch version.
    if backend == "gloo" and "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # only takes effect when the server first starts
        return ctx
    return mp.get_context("spawn")


def _child(fn: Callable, rank: int, world_size: int, args: tuple, addr: str, port: int, backend: str,
           pg_timeout_s: float, debug: bool, env: dict[str, str], conn, stderr_path: str) -> None:
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)  # this rank's stderr (warnings, native crashes) goes to a file the parent reads back
    os.close(fd)
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": addr, "MASTER_PORT": str(port)})
    from gobrrr.comm import debug as dbg
    from gobrrr.comm.ranks import init, shutdown

    failed_at = None
    try:
        store = dist.TCPStore(addr, port, world_size, False, timeout=_dt.timedelta(seconds=pg_timeout_s))
        device = "cpu" if backend == "gloo" else None
        rank_info = init(backend, timeout_s=pg_timeout_s, device=device, debug=debug or None, store=store)
        try:
            value = fn(rank_info, *args)
        except BaseException as exc:
            failed_at = time.time()
            dbg.note_exit(exc)  # peers waiting for us can say why we never arrived
            raise
        finally:
            try:
                shutdown()
            except Exception:  # tearing down after a failure may fail too; keep the first error
                pass
        # plain pickle, not the connection's ForkingPickler: torch registers a reduction there that
        # passes tensors as shared-memory handles, which die with this process
        conn.send_bytes(pickle.dumps(("ok", value)))
    except BaseException:
        try:
            conn.send_bytes(pickle.dumps(("err", (traceback.format_exc(), failed_at or time.time()))))
        except Exception:
            pass
    finally:
        conn.close()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 60.0, backend: str = "gloo",
          debug: bool = False, pg_timeout_s: float | None = None, env: dict[str, str] | None = None) -> list:
    """Run `fn(rank: Rank, *args)` on `world_size` fresh processes; return the results in rank order.

    timeout_s:    hard limit for the whole run; past it every rank is killed (TimeoutError).
    backend:      "gloo" (CPU) or "nccl" (one GPU per rank).
    debug:        turn on gobrrr.comm debug mode in every rank.
    pg_timeout_s: the process-group timeout inside the ranks (default: half of `timeout_s`, so the
                  ranks' own diagnostics fire before the harness kills them).
    env:          extra environment variables for the ranks.
    """
    if world_size < 1:
        raise ValueError(f"spawn: world_size must be >= 1, got {world_size}")
    pg_timeout_s = float(pg_timeout_s if pg_timeout_s is not None else max(2.0, timeout_s / 2))
    addr = "127.0.0.1"
    server = dist.TCPStore(addr, 0, world_size, True, timeout=_dt.timedelta(seconds=timeout_s),
                           wait_for_workers=False)
    ctx = _context(backend)
    logs = tempfile.mkdtemp(prefix="gobrrr-spawn-")
    procs, readers = [], []
    for r in range(world_size):
        recv, send = ctx.Pipe(duplex=False)
        # not daemonic: a rank may start processes of its own (DataLoader workers); we reap them below
        p = ctx.Process(target=_child, name=f"gobrrr-rank{r}", daemon=False,
                        args=(fn, r, world_size, args, addr, server.port, backend, pg_timeout_s, debug,
                              dict(env or {}), send, os.path.join(logs, f"rank{r}.stderr")))
        p.start()
        send.close()
        procs.append(p)
        readers.append(recv)

    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    first_failure: tuple[float, int] | None = None  # (when the harness heard, rank)
    failed_at: dict[int, float] = {}                   # rank -> when it failed, by its own clock
    done: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(done) < world_size:
            limit = deadline
            if first_failure is not None:
                limit = min(deadline, first_failure[0] + pg_timeout_s + 5.0)
            remaining = limit - time.monotonic()
            if remaining <= 0:
                break
            waitables = [readers[r] for r in range(world_size) if r not in done]
            waitables += [procs[r].sentinel for r in range(world_size) if r not in done]
            for obj in mpc.wait(waitables, timeout=remaining):
                r = next(i for i in range(world_size) if obj is readers[i] or obj == procs[i].sentinel)
                if r in done:
                    continue
                try:
                    kind, payload = pickle.loads(readers[r].recv_bytes())
                except (EOFError, OSError):  # the process exited without a word
                    procs[r].join(timeout=5)
                    kind, payload = "err", (f"rank {r} exited with code {procs[r].exitcode} before returning "
                                            f"(killed, os._exit, or a crash in native code)"
                                            + _tail(os.path.join(logs, f"rank{r}.stderr")), time.time())
                done.add(r)
                if kind == "ok":
                    results[r] = payload
                else:
                    failures[r], failed_at[r] = payload
                    if first_failure is None:
                        first_failure = (time.monotonic(), r)
    finally:
        running = [r for r in range(world_size) if r not in done]
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for rd in readers:
            rd.close()
        shutil.rmtree(logs, ignore_errors=True)
    if failures:
        raise SpawnError(failures, min(failed_at, key=failed_at.get), running)
    if running:
        raise TimeoutError(f"spawn: ranks {running} still running after {timeout_s:g} s; killed all "
                           f"{world_size} ranks. A rank is probably waiting in a collective that another "
                           f"rank never issued: rerun with debug=True to name the mismatch.")
    del server  # keep the store alive until every rank is done
    return [results[r] for r in range(world_size)]
