"""Debug mode and dead-rank diagnostics: name the ranks that disagree or never arrived.

Two failure modes make multi-rank programs miserable, and both are silent by default:

* **Mismatched collectives.** Rank 1 all-reduces a float32 tensor while rank 0 all-reduces an
  int32 tensor of the same byte size: gloo happily adds the bit patterns. Or rank 1 calls
  `barrier()` where rank 0 calls `all_reduce()`: NCCL hangs until its watchdog fires.
* **A rank that is gone.** One rank raises (or is killed); the others sit in the next collective
  until the timeout and then report a bare "timed out" or "connection closed by peer".

This module keeps, per process group, a `GroupWatch`: the c10d store the ranks rendezvoused
through, the group's members, and a counter of collectives issued on it (op #k).

Debug mode (`init(debug=True)` or `GOBRRR_DIST_DEBUG=1`), before every collective:

    rank r:  store.set("c/<k>/<r>", "all_reduce(float32[1024], op=sum)")   # my signature for op #k
             poll store.check("c/<k>/0" ... "c/<k>/<n-1>")                  # everyone's signature
             compare  -> equal: go ahead;  different: CollectiveMismatchError on EVERY rank
             missing past the timeout, or the missing rank is known dead: CollectiveTimeoutError

It costs four store round trips per collective (~0.1-1 ms), so it is for finding bugs, not for
production runs. Every rank sees every signature, so every rank raises the same message naming the
same ranks: no rank is left hanging.

Always on, for the first few collectives only: without debug mode, the same check runs for the
first GOBRRR_DIST_CHECK_FIRST collectives of each group (default 16, on groups of at most 32 ranks;
0 turns it off). Why: a dtype or shape mismatch is usually structural (the same code path every
step), so it shows in the first step, and gloo otherwise adds the bit patterns of an int32 and a
float32 tensor and returns garbage without a word. Measured on the 2-core CPU box (2 gloo ranks,
1 KB all-reduce): 0.7-1.5 ms per plain call, +0.7-1.3 ms per checked call, so ~20 ms once per
group. Not on bigger groups: every rank reads every rank's key from one store, n^2 reads per op.

Always on (no per-op cost): when a collective raises (gloo: timeout or "connection closed"; any
backend: an error surfacing in `wait()`), `explain_failure` posts "rank r failed at op #k" to the
store, waits a couple of seconds for the others to post theirs, and builds one message that says
which ranks reached op #k, which raised and left (the `session()` context manager and the test
harness post a rank's exception on its way out), which processes are dead, and which are silent.

On NCCL the always-on path sees less: a collective whose peer never comes does not raise in
Python (the host has only queued it; the GPU waits), so the first sign is NCCL's watchdog ending
the process after `timeout_s` with its own message (op and sequence number). Debug mode is what
names the missing ranks on NCCL, because its check-in happens on the host, before the launch.

The watch table is module-level, keyed by group name, because torch.distributed's own group table
is global: ours mirrors it, is filled by `gobrrr.comm.init()` and emptied by `shutdown()`.
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist

ENV_DEBUG = "GOBRRR_DIST_DEBUG"
ENV_CHECK_FIRST = "GOBRRR_DIST_CHECK_FIRST"
CHECK_FIRST_DEFAULT = 16     # collectives per group checked even without debug mode
CHECK_FIRST_MAX_RANKS = 32   # ... on groups up to this size (the check reads n keys on n ranks)
_POLL_S = 0.25          # how often a waiting rank looks for dead or departed peers
_REPORT_GRACE_S = 2.0   # how long a failing rank waits for its peers to post their own failure


class DistConfigError(ValueError):
    """The launch environment is wrong (a variable, the rendezvous); the message names what to fix."""


class CollectiveError(RuntimeError):
    """A collective failed; the message names the operation and the ranks involved."""


class CollectiveMismatchError(CollectiveError):
    """Ranks called different collectives (op, shape, dtype, root) at the same point."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """Some ranks never arrived at a collective within the timeout (dead, raised, or stuck elsewhere)."""


@dataclass
class GroupWatch:
    """What this process knows about one process group, for checks and error messages."""
    name: str                      # "WORLD" or the group's name
    store: dist.Store | None       # prefix store for this group's keys (None: no diagnostics)
    root: dist.Store | None        # prefix store shared by all groups ("who", "exit" keys)
    ranks: list[int]               # global rank of each group member, in group-rank order
    me: int                        # this process's rank within the group
    timeout_s: float
    debug: bool = False            # debug mode: from init(debug=...) or GOBRRR_DIST_DEBUG, read once at init
    seq: int = 0                   # collectives issued on this group so far (op #seq is next)
    p2p: dict[tuple[int, int], int] = field(default_factory=dict)  # (src, dst) -> messages so far
    backend: str = ""              # filled on first use by comm.py
    emulated: set[str] = field(default_factory=set)  # ops this backend lacks, done another way (comm.py)
    last_work: object = None       # the Work (or list) of the latest op issued here: is it still pending?
    last_op: tuple = ("", None)    # ("all_reduce", 17) or ("send to rank 1", None), for messages
    monitor_stop: object = None    # threading.Event that stops the peer monitor (monitor.py), world only
    lifeline_stop: object = None   # threading.Event that stops the launcher watch (lifeline.py), world only
    seed: int = 0                  # the model seed init() applied (world only): a second init() reports it
    check_first: int = 0           # ops #0..check_first-1 are checked as in debug mode (see the module docstring)

    @property
    def size(self) -> int:
        return len(self.ranks)

    def debugging(self) -> bool:
        return self.debug


_WATCHES: dict[str, GroupWatch] = {}


def check_first(size: int) -> int:
    """How many leading collectives of a group of `size` ranks to check without debug mode."""
    value = os.environ.get(ENV_CHECK_FIRST, "").strip()
    if value:
        try:
            return max(0, int(value))
        except ValueError:
            raise DistConfigError(f"gobrrr.comm: environment variable {ENV_CHECK_FIRST}={value!r} is not a whole "
                             f"number of collectives; set e.g. {CHECK_FIRST_DEFAULT}, or 0 to turn the check off.") from None
    return CHECK_FIRST_DEFAULT if size <= CHECK_FIRST_MAX_RANKS else 0


def _timedelta(s: float) -> _dt.timedelta:
    return _dt.timedelta(seconds=s)


def install(store: dist.Store | None, rank: int, world_size: int, timeout_s: float, debug: bool) -> GroupWatch:
    """Called by `init()`: register the world group and announce this process (host, pid)."""
    root = dist.PrefixStore("gobrrr/", store) if store is not None else None
    watch = GroupWatch("WORLD", dist.PrefixStore("gobrrr/WORLD/", store) if store is not None else None,
                       root, list(range(world_size)), rank, timeout_s, debug)
    watch.check_first = check_first(world_size)
    _WATCHES.clear()
    _WATCHES["WORLD"] = watch
    if root is not None:
        root.set(f"who/{rank}", f"{socket.gethostname()} {os.getpid()}")
    return watch


def uninstall() -> None:
    for watch in _WATCHES.values():
        for stop in (watch.monitor_stop, watch.lifeline_stop):
            if stop is not None:
                stop.set()
    _WATCHES.clear()


def _group_name(group) -> str:
    if group is None or group is dist.group.WORLD:
        return "WORLD"
    return str(getattr(group, "group_name", id(group)))


def watch_for(group=None) -> GroupWatch:
    """The watch for `group` (the world when None), created on first use for a subgroup."""
    name = _group_name(group)
    watch = _WATCHES.get(name)
    if watch is not None:
        return watch
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("gobrrr.comm: no process group; call gobrrr.comm.init() (or use "
                           "`with gobrrr.comm.session() as rank:`) before any communication.")
    world = _WATCHES.get("WORLD")
    if name == "WORLD" or world is None:
        # A group someone else created (init_process_group called directly): checks run without a store.
        ranks = list(range(dist.get_world_size())) if name == "WORLD" else dist.get_process_group_ranks(group)
        me = dist.get_rank(group)
        watch = GroupWatch(name, None, None, ranks, me, float(os.environ.get("GOBRRR_DIST_TIMEOUT_S", 300)))
    else:
        ranks = dist.get_process_group_ranks(group)
        watch = GroupWatch(name, dist.PrefixStore(f"gobrrr/{name}/", _base(world)), world.root, ranks,
                           dist.get_rank(group), world.timeout_s, world.debug)
        watch.check_first = check_first(len(ranks))
    _WATCHES[name] = watch
    return watch


def _base(world: GroupWatch) -> dist.Store:
    # PrefixStore.underlying_store exists on every torch we support; the prefix is re-applied per group.
    return world.root.underlying_store  # type: ignore[union-attr]


def note_exit(exc: BaseException | None = None, rank: int | None = None) -> None:
    """Post why this rank is leaving ('raised ValueError: ...', or a clean shutdown), so that peers
    waiting for it in a collective can say why it never arrived. The first note wins."""
    world = _WATCHES.get("WORLD")
    if world is None or world.root is None:
        return
    r = world.ranks[world.me] if rank is None else rank
    if exc is None:
        text = "called shutdown() and left"
    else:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        text = f"raised {type(exc).__name__}{': ' + first if first else ''} and left"
    try:
        if not world.root.check([f"exit/{r}"]):
            world.root.set(f"exit/{r}", text)
            world.root.add("exits", 1)  # one counter the peer monitors poll, instead of n keys each
    except Exception:  # the store itself may be gone; the original exception matters more
        pass


# ----------------------------------------------------------------------------------------------
# Signatures: what must agree across ranks for a collective to be well-formed.

def describe(t: torch.Tensor | None) -> str:
    if t is None:
        return "None"
    return f"{str(t.dtype).removeprefix('torch.')}[{','.join(map(str, t.shape))}]"


def signature(name: str, tensors: Sequence[torch.Tensor | None] = (), attrs: dict | None = None) -> str:
    """'all_reduce(float32[4,4], op=sum)': the part of a call every rank must share."""
    parts = [describe(t) for t in tensors] + [f"{k}={v}" for k, v in (attrs or {}).items()]
    return f"{name}({', '.join(parts)})"


# ----------------------------------------------------------------------------------------------
# Liveness: is a peer still there?

def _peer_state(watch: GroupWatch, group_rank: int) -> str | None:
    """Why a peer cannot arrive ('raised ValueError: ...', 'process 123 is gone'), or None if unknown."""
    if watch.root is None:
        return None
    g = watch.ranks[group_rank]
    try:
        if watch.root.check([f"exit/{g}"]):
            return watch.root.get(f"exit/{g}").decode(errors="replace")
        if watch.root.check([f"who/{g}"]):
            host, pid = watch.root.get(f"who/{g}").decode().split()
            if host == socket.gethostname() and not _alive(int(pid)):
                return f"died (process {pid} is gone)"
    except Exception:  # the store is unreachable: rank 0's store server died with its process
        return None
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) still answers kill(0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


# ----------------------------------------------------------------------------------------------
# Debug mode: the per-collective check-in.

def check_in(watch: GroupWatch, k: int, sig: str, op: str) -> None:
    """Debug mode: agree on op #k's signature with every rank of the group, or raise on all of them."""
    store = watch.store
    if store is None or watch.size == 1:
        return
    keys = [f"c/{k}/{i}" for i in range(watch.size)]
    try:
        store.set(f"c/{k}/{watch.me}", sig)
        _wait_for_all(watch, keys, k, op)
        raw = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(key) for key in keys]
    except CollectiveError:
        raise
    except Exception as exc:  # the store lives in rank 0 or in torchrun's agent: it died with its process
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CollectiveError(
            f"gobrrr.comm: {op} (collective #{k} on group {watch.name}): rank {watch.ranks[watch.me]} cannot reach "
            f"the rendezvous store ({type(exc).__name__}: {first}); the launcher (torchrun) or rank 0 has died. "
            "Read its log; this rank stops here.") from None
    sigs = [s.decode() for s in raw]
    if len(set(sigs)) > 1:
        by_sig: dict[str, list[int]] = {}
        for r, s in enumerate(sigs):
            by_sig.setdefault(s, []).append(r)
        # the odd ones out: everyone not in the largest camp (ties broken by rank 0's camp)
        main = max(by_sig, key=lambda s: (len(by_sig[s]), s == sigs[0]))
        odd = sorted(r for s, rs in by_sig.items() if s != main for r in rs)
        camps = "; ".join(f"{_ranks_str(rs)} called {s}" for s, rs in by_sig.items())
        raise CollectiveMismatchError(
            f"gobrrr.comm debug: ranks disagree at collective #{k} on group {watch.name}: {camps}. "
            f"Mismatching ranks: {odd}. Make every rank issue the same collectives in the same order "
            f"with the same shapes, dtypes and roots.")
    if k > 0:  # every rank has posted op #k, so all have finished reading op #k-1's keys
        store.delete_key(f"c/{k - 1}/{watch.me}")


def _ranks_str(rs: list[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}"


def _wait_for_all(watch: GroupWatch, keys: list[str], k: int, op: str) -> None:
    _wait_for_keys(watch, dict(enumerate(keys)), f"{op} (collective #{k} on group {watch.name})")


def _wait_for_keys(watch: GroupWatch, keys: dict[int, str], what: str) -> None:
    """Wait until every key (posted by group rank r) exists; fail fast when a poster is known gone.

    Polls with `check` (non-blocking) and a short back-off rather than `store.wait(timeout)`, whose
    timeouts log a C++ warning each time."""
    store = watch.store
    start = time.monotonic()
    deadline, next_look, nap = start + watch.timeout_s, start + _POLL_S, 0.0005
    pending = dict(keys)
    while True:
        pending = {r: key for r, key in pending.items() if not store.check([key])}
        if not pending:
            return
        now = time.monotonic()
        if now >= next_look or now >= deadline:
            next_look = now + _POLL_S
            gone = {r: s for r in pending if (s := _peer_state(watch, r)) is not None}
            if gone or now >= deadline:
                raise CollectiveTimeoutError(_missing_message(watch, what, sorted(pending), gone))
        time.sleep(nap)
        nap = min(nap * 2, 0.02)


def _missing_message(watch: GroupWatch, what: str, missing: list[int], gone: dict[int, str]) -> str:
    text = f"gobrrr.comm: {what}: rank {watch.me} waited, ranks {missing} never arrived"
    if gone:
        text += ": " + "; ".join(f"rank {i} {s}" for i, s in gone.items())
    silent = [i for i in missing if i not in gone]
    if silent:
        text += f"{'; ' if gone else ': '}ranks {silent} are silent after {watch.timeout_s:g} s"
    text += (". Read the errors of the ranks that left. A silent rank is slow, or blocked in compute, "
             "in point-to-point, or in a collective on another group")
    if not watch.debugging():
        text += "; GOBRRR_DIST_DEBUG=1 also checks that every rank issues the same collectives"
    return text + "."


def p2p_post(watch: GroupWatch, kind: str, peer: int, tensor: torch.Tensor):
    """Debug mode, point-to-point: post what this side sends/receives; return a check to run later.

    Message n from src to dst: the sender posts "p/src>dst/n/s", the receiver "p/src>dst/n/r"; each
    verifies the other's. Posting never blocks (isend/irecv stay non-blocking, rings cannot
    deadlock on the check); blocking send/recv run the check before the transfer, async ones in wait().
    """
    me = watch.ranks[watch.me]
    src, dst = (me, peer) if kind == "send" else (peer, me)
    n = watch.p2p.get((src, dst), 0)
    watch.p2p[(src, dst)] = n + 1
    base = f"p/{src}>{dst}/{n}"
    mine, theirs = (f"{base}/s", f"{base}/r") if kind == "send" else (f"{base}/r", f"{base}/s")
    watch.store.set(mine, describe(tensor))

    def verify() -> None:
        if peer not in watch.ranks:
            raise ValueError(f"gobrrr.comm: peer rank {peer} is not in group {watch.name} (ranks {watch.ranks}).")
        what = f"{kind} {'to' if kind == 'send' else 'from'} rank {peer} (message #{n} from {src} to {dst})"
        _wait_for_keys(watch, {watch.ranks.index(peer): theirs}, what)
        mine_sig, their_sig = describe(tensor), watch.store.get(theirs).decode()
        if mine_sig != their_sig:
            sent, got = (mine_sig, their_sig) if kind == "send" else (their_sig, mine_sig)
            raise CollectiveMismatchError(
                f"gobrrr.comm debug: message #{n} from rank {src} to rank {dst}: rank {src} sends {sent} but "
                f"rank {dst} receives into {got}. Mismatching ranks: {sorted({src, dst})}. Make the receive "
                f"buffer match the sent tensor's shape and dtype.")
        if n > 0:  # the peer posted message n, so it finished checking message n-1
            watch.store.delete_key(f"p/{src}>{dst}/{n - 1}/{mine[-1]}")

    return verify


# ----------------------------------------------------------------------------------------------
# Always on: explain a backend failure.

def explain_failure(watch: GroupWatch, k: int, op: str, exc: BaseException) -> CollectiveError:
    """Build the error to raise when op #k raised `exc`: who reached it, who left, who is silent."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    head = f"gobrrr.comm: {op} (collective #{k} on group {watch.name}) failed on rank {watch.me}: {first}"
    if watch.size == 1:
        return CollectiveError(head + ".")
    if watch.store is None:
        return CollectiveError(head + ". (Create the group with gobrrr.comm.init() so that errors can name "
                               "the ranks involved.)")
    try:
        watch.store.set(f"fail/{watch.me}", f"{k} {op}")
        others = [i for i in range(watch.size) if i != watch.me]
        reached: list[int] = []
        elsewhere: dict[int, str] = {}
        gone: dict[int, str] = {}
        deadline = time.monotonic() + _REPORT_GRACE_S
        while True:
            pending = []
            for i in others:
                if i in reached or i in elsewhere or i in gone:
                    continue
                if watch.store.check([f"fail/{i}"]):
                    kk, oop = watch.store.get(f"fail/{i}").decode().split(" ", 1)
                    (reached.append(i) if int(kk) == k else elsewhere.__setitem__(i, f"#{kk} {oop}"))
                elif (s := _peer_state(watch, i)) is not None:
                    gone[i] = s
                else:
                    pending.append(i)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
    except Exception as store_exc:  # the store lives in rank 0 (or torchrun's agent): it may be gone too
        return CollectiveError(f"{head}. (Could not ask the other ranks: the store is unreachable: "
                               f"{type(store_exc).__name__}: {store_exc}.) Rank 0 or the launcher may have died.")
    never = sorted([*gone, *elsewhere, *pending])
    parts = [head + "."]
    if never:
        parts.append(f"Ranks that never arrived at #{k}: {never}.")
    for i, s in sorted(gone.items()):
        parts.append(f"Rank {i} {s}.")
    for i, s in sorted(elsewhere.items()):
        parts.append(f"Rank {i} failed at collective {s} instead.")
    if pending:
        parts.append(f"Ranks {sorted(pending)} did not report: stuck elsewhere, or the store cannot reach them.")
    if reached:
        parts.append(f"Ranks {sorted(reached)} reached #{k} and failed too.")
    parts.append("Fix the first rank that failed; GOBRRR_DIST_DEBUG=1 checks that every rank issues the same collectives.")
    cls = CollectiveTimeoutError if never else CollectiveError
    return cls(" ".join(parts))
