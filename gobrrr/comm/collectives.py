"""Point-to-point and collective communication: thin, readable wrappers over torch.distributed.

Every function takes `group=None` (the world) and `async_op=False`, and returns a `Handle`:

    h = comm.all_reduce(grad, op="avg", async_op=True)   # launched; returns at once
    loss = next_layer_backward()                          # overlap: all-reduce with this compute
    h.wait()                                              # grad now holds the average

A blocking call returns an already-waited handle, so `op(..., async_op=flag).wait()` reads the
same either way. On CUDA (NCCL) `wait()` does not block the host: it makes the *current stream*
wait for the communication stream, which is all later kernels need.

What the wrappers add over calling torch.distributed directly (and nothing more; the benchmark
`gobrrr bench comm` measures the cost next to the raw call):
  * each collective is op #k on its group; in debug mode (GOBRRR_DIST_DEBUG=1), and for the first
    16 ops of every group of up to 32 ranks always (GOBRRR_DIST_CHECK_FIRST), every rank checks
    that op #k has the same name, shapes, dtypes and root everywhere, and raises on all ranks
    naming the odd ones out instead of hanging or adding mismatched bits (see gobrrr.comm.debug);
  * a failure (timeout, dead peer) is re-raised as CollectiveError naming the op and the ranks
    that never arrived;
  * ops a backend lacks are emulated (gloo: AVG via SUM, all_to_all of lists via p2p, and
    reduce_scatter via all_reduce on old torch), so tests of every op run on CPU.

Notation in the pictures: n ranks (r0..r2 drawn), S = bytes of one rank's tensor
(`t.numel() * t.element_size()`). "Moves" is what one rank sends (= receives) with the usual
ring / tree algorithms; it is where the bus-bandwidth factors of `gobrrr bench comm` come from.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from gobrrr.comm import debug as _debug

_AVG = dist.ReduceOp.AVG
_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "mean": dist.ReduceOp.AVG,
        "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT,
        "prod": dist.ReduceOp.PRODUCT}
# prefer the newer names (torch >= 2.13) and fall back to the old ones (the GPU box runs 2.11)
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Handle:
    """A launched communication. `wait()` until its result is usable; `is_completed()` polls."""

    __slots__ = ("_work", "_explain", "_after", "_verify", "_done")

    def __init__(self, work, explain: Callable[[BaseException], BaseException] | None,
                 after: Callable[[], None] | None = None, verify: Callable[[], None] | None = None,
                 done: bool = False):
        self._work = work  # a torch Work, a list of them (batched p2p), or None
        self._explain, self._after, self._verify, self._done = explain, after, verify, done

    def wait(self) -> None:
        if self._done:
            return
        if self._verify is not None:  # debug mode, async p2p: check the peer agrees before trusting data
            self._verify()
        _wait(self._work, self._explain)
        if self._after is not None:  # e.g. divide by n for an emulated AVG, copy out an emulated result
            self._after()
        self._done = True

    def is_completed(self) -> bool:
        w = self._work
        if self._done or w is None:
            return True
        return all(x.is_completed() for x in w) if isinstance(w, list) else w.is_completed()


_DONE = Handle(None, None, done=True)  # what every blocking call returns: already waited, immutable


def _wait(work, explain) -> None:
    try:
        if isinstance(work, list):
            for w in work:
                w.wait()  # sync: (gloo) host waits for the transfer; (NCCL) current stream waits, host does not
        elif work is not None:
            work.wait()  # sync: as above
    except _debug.CollectiveError:
        raise
    except RuntimeError as exc:
        raise explain(exc) from exc


# ----------------------------------------------------------------------------------------------
# plumbing: count, check, launch, explain

_NAMES = {"mean": "avg", "prod": "product"}


def _reduce_op(op) -> tuple[str, dist.ReduceOp]:
    """(canonical name, ReduceOp) for "sum"/"avg"/... or a ReduceOp."""
    if op.__class__ is str:
        try:
            return _NAMES.get(op, op), _OPS[op]
        except KeyError:
            if op.lower() in _OPS:
                return _reduce_op(op.lower())
            raise ValueError(f"unknown reduce op {op!r}; use one of {sorted(_OPS)}") from None
    for name, value in _OPS.items():
        if value == op:
            return _NAMES.get(name, name), op
    return str(op), op


def _backend(watch: _debug.GroupWatch, group) -> str:
    if not watch.backend:
        watch.backend = str(dist.get_backend(group)).lower()
    return watch.backend


def _collective(name: str, group, sig: Sequence[torch.Tensor | None], attrs: dict, launch: Callable,
                async_op: bool, after: Callable[[], None] | None = None,
                watch: _debug.GroupWatch | None = None) -> Handle:
    """Count the call as op #k on its group, check it in debug mode, launch it, wait if blocking.
    Kept lean (~1 us of Python): it sits in front of every small message. A blocking call goes to the
    backend's blocking form, not async + wait: on NCCL that runs on the current stream with no event
    pair (about 10 us less per call on an H200). Its Work is then None, so the peer monitor
    (monitor.py) only sees async collectives; a blocking one behind a dead peer ends at the timeout."""
    for t in sig:
        if t is not None and not t.is_contiguous():
            raise _not_contiguous(name, t)
    watch = watch or _debug.watch_for(group)
    k = watch.seq
    watch.seq = k + 1
    if watch.debug or k < watch.check_first:  # the first few ops of a group are always checked (debug.py)
        _debug.check_in(watch, k, _debug.signature(name, sig, attrs), name)

    def explain(exc: BaseException) -> BaseException:
        return _debug.explain_failure(watch, k, name, exc)

    try:
        work = launch(watch, async_op)  # blocking: the backend's own blocking call (NCCL runs it on the current stream)
    except (_debug.CollectiveError, ValueError, TypeError):
        raise
    except RuntimeError as exc:
        raise explain(exc) from exc
    watch.last_work, watch.last_op = work, (name, k)  # for the peer monitor (monitor.py)
    if async_op:
        return Handle(work, explain, after)
    _wait(work, explain)
    if after is not None:
        after()
    return _DONE


def _not_contiguous(name: str, t: torch.Tensor) -> ValueError:
    """NCCL rejects strided tensors and gloo takes them: checked here on every backend, so a program
    tested on CPU does not first fail on the GPUs."""
    return ValueError(
        f"{name}: the tensor (shape {tuple(t.shape)}, strides {t.stride()}) is not contiguous, and NCCL "
        "moves contiguous memory only. Pass t.contiguous() and copy the result back (t.copy_(c)), or use "
        "gobrrr.comm.ring_all_reduce, which does that for you.")


def _unsupported(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, NotImplementedError) or any(
        s in text for s in ("not supported", "does not support", "unsupported", "not implemented"))


def _native_or_emulated(watch: _debug.GroupWatch, name: str, native: Callable, emulated: Callable):
    """Try the backend's own op; if it says 'not supported' (raised before any data moves, on every
    rank alike), remember that and use the emulation from now on."""
    if name not in watch.emulated:
        try:
            return native()
        except RuntimeError as exc:
            if not _unsupported(exc):
                raise
            watch.emulated.add(name)
    return emulated()


def _needs_avg_emulation(watch, group, op: dist.ReduceOp, t: torch.Tensor) -> bool:
    if op != dist.ReduceOp.AVG:
        return False
    if not (t.is_floating_point() or t.is_complex()):
        raise ValueError(f"op='avg' needs a floating-point tensor, got {t.dtype}; use op='sum' and divide.")
    return _backend(watch, group) != "nccl"  # gloo (and others): SUM, then divide by n


# ----------------------------------------------------------------------------------------------
# point-to-point

@dataclass(frozen=True)
class P2P:
    """One half of a message for `batch_p2p`: ("send", t, peer) or ("recv", t, peer); peers are global ranks."""
    kind: str
    tensor: torch.Tensor
    peer: int


def _p2p_explain(watch: _debug.GroupWatch, what: str, peer: int | None):
    def explain(exc: BaseException) -> BaseException:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        why = ""
        if peer is not None and peer in watch.ranks:
            state = _debug._peer_state(watch, watch.ranks.index(peer))
            why = f" Rank {peer} {state}." if state else f" Rank {peer} did not complete its side."
        return _debug.CollectiveError(f"gobrrr.comm: {what} failed on rank {watch.ranks[watch.me]}: {first}.{why}")
    return explain


def _p2p(ops: Sequence[P2P], group, async_op: bool, tag: int = 0, batch: bool = False) -> Handle:
    watch = _debug.watch_for(group)
    for o in ops:
        if o.kind not in ("send", "recv"):
            raise ValueError(f"P2P kind must be 'send' or 'recv', got {o.kind!r}")
    verifies = []
    if watch.debug and watch.store is not None:
        verifies = [_debug.p2p_post(watch, o.kind, o.peer, o.tensor) for o in ops if o.peer is not None]
    if verifies and not async_op:  # blocking: check before moving data, so a mismatch cannot hang
        for v in verifies:
            v()
        verifies = []
    what = ", ".join(f"{o.kind} {'to' if o.kind == 'send' else 'from'} rank {o.peer}" for o in ops)
    peer = ops[0].peer if len(ops) == 1 else None
    explain = _p2p_explain(watch, what, peer)
    try:
        if not batch:
            o = ops[0]
            fn = dist.isend if o.kind == "send" else dist.irecv
            works = fn(o.tensor, o.peer, group=group, tag=tag)
        else:
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend if o.kind == "send" else dist.irecv,
                                                       o.tensor, o.peer, group, tag) for o in ops])
    except (ValueError, TypeError):
        raise
    except RuntimeError as exc:
        raise explain(exc) from exc
    watch.last_work, watch.last_op = works, (what, None)

    def verify_all() -> None:
        for v in verifies:
            v()

    if async_op:
        return Handle(works, explain, verify=verify_all if verifies else None)
    _wait(works, explain)
    return _DONE


def send(tensor: torch.Tensor, dst: int, *, group=None, tag: int = 0, async_op: bool = False) -> Handle:
    """Send `tensor` to rank `dst` (a global rank). Moves: S out of this rank, S into `dst`.

        r0 --[t]--> r1        (r1 calls recv(buf, src=0) with a buffer of the same shape and dtype)

    On NCCL a blocking send returns once the transfer is queued on the stream, and it pairs with the
    peer's recv: two ranks that both `send` before they `recv` may deadlock -- use `batch_p2p`.
    """
    return _p2p((P2P("send", tensor, dst),), group, async_op, tag)


def recv(tensor: torch.Tensor, src: int | None = None, *, group=None, tag: int = 0,
         async_op: bool = False) -> Handle:
    """Receive into `tensor` from rank `src` (None: from any rank; gloo only). Moves: S into this rank.

        r0 --[t]--> r1: buf        (buf must have t's shape and dtype; debug mode checks it)
    """
    return _p2p((P2P("recv", tensor, src),), group, async_op, tag)


def isend(tensor: torch.Tensor, dst: int, *, group=None, tag: int = 0) -> Handle:
    """Non-blocking `send`: returns a Handle at once; the tensor must not change until `wait()`."""
    return send(tensor, dst, group=group, tag=tag, async_op=True)


def irecv(tensor: torch.Tensor, src: int | None = None, *, group=None, tag: int = 0) -> Handle:
    """Non-blocking `recv`: returns a Handle at once; read the tensor only after `wait()`."""
    return recv(tensor, src, group=group, tag=tag, async_op=True)


def batch_p2p(ops: Sequence[P2P], *, group=None, async_op: bool = False) -> Handle:
    """Launch several sends and receives as one batch (NCCL: one group call, so a ring exchange in
    which every rank sends to its right and receives from its left cannot deadlock).

        r0 --> r1 --> r2 --> r0        ops on r1: [P2P("send", a, 2), P2P("recv", b, 0)]

    Moves: the sum of the sent tensors out, the sum of the received ones in.
    """
    return _p2p(list(ops), group, async_op, batch=True)


# ----------------------------------------------------------------------------------------------
# collectives

def barrier(*, group=None, async_op: bool = False) -> Handle:
    """Wait until every rank of the group has called barrier. Moves: ~nothing (a tiny all-reduce).

        r0 ----|            r0 ... continues
        r1 --------|  ->    r1 ... continues    (all leave after the last one arrives)
        r2 ------|          r2 ... continues
    """
    return _collective("barrier", group, (), {}, lambda w, a: dist.barrier(group=group, async_op=a), async_op)


def broadcast(tensor: torch.Tensor, src: int = 0, *, group=None, async_op: bool = False) -> Handle:
    """Copy rank `src`'s tensor into every rank's tensor. Moves: S per rank (pipelined ring/tree).

        r0: [a]           r0: [a]
        r1: [.]    ->     r1: [a]
        r2: [.]           r2: [a]
    """
    return _collective("broadcast", group, (tensor,), {"src": src},
                       lambda w, a: dist.broadcast(tensor, src, group=group, async_op=a), async_op)


def all_reduce(tensor: torch.Tensor, op="sum", *, group=None, async_op: bool = False) -> Handle:
    """Reduce `tensor` elementwise over all ranks, in place on every rank.

        r0: [a0 a1]         r0: [a0+b0+c0  a1+b1+c1]
        r1: [b0 b1]   ->    r1: [a0+b0+c0  a1+b1+c1]
        r2: [c0 c1]         r2: [a0+b0+c0  a1+b1+c1]

    Moves: 2(n-1)/n * S per rank with a ring (a reduce-scatter, then an all-gather; see ring.py).
    op: "sum", "avg", "max", "min", "product" (or a torch ReduceOp).
    """
    name, rop = _reduce_op(op)
    watch = _debug.watch_for(group)
    emulate = _avg_emulated(watch, group, name, tensor)
    after = (lambda: tensor.div_(watch.size)) if emulate else None
    return _collective("all_reduce", group, (tensor,), {"op": name},
                       lambda w, a: dist.all_reduce(tensor, op=dist.ReduceOp.SUM if emulate else rop, group=group,
                                                    async_op=a), async_op, after, watch)


def _avg_emulated(watch, group, name: str, t) -> bool:
    return name == "avg" and _needs_avg_emulation(watch, group, _AVG, t)


def reduce(tensor: torch.Tensor, dst: int = 0, op="sum", *, group=None, async_op: bool = False) -> Handle:
    """Reduce `tensor` over all ranks into rank `dst`'s tensor (the others' tensors are scratch).

        r0: [a]           r0: [a+b+c]
        r1: [b]    ->     r1: (undefined)
        r2: [c]           r2: (undefined)

    Moves: S per rank (pipelined ring/tree), like broadcast run backwards.
    """
    name, rop = _reduce_op(op)
    watch = _debug.watch_for(group)
    emulate = _avg_emulated(watch, group, name, tensor)
    me_is_dst = watch.ranks[watch.me] == dst
    after = (lambda: tensor.div_(watch.size)) if emulate and me_is_dst else None
    return _collective("reduce", group, (tensor,), {"dst": dst, "op": name},
                       lambda w, a: dist.reduce(tensor, dst, op=dist.ReduceOp.SUM if emulate else rop,
                                                group=group, async_op=a), async_op, after)


def scatter(output: torch.Tensor, inputs: Sequence[torch.Tensor] | None = None, src: int = 0, *,
            group=None, async_op: bool = False) -> Handle:
    """Rank `src` sends inputs[i] to rank i; every rank receives into `output` (inputs only on src).

        r0: [x0 x1 x2]        r0: [x0]
        r1:            ->     r1: [x1]
        r2:                   r2: [x2]

    Moves: src sends (n-1) * S, every other rank receives S.
    """
    watch = _debug.watch_for(group)
    is_src = watch.ranks[watch.me] == src
    if is_src and (inputs is None or len(inputs) != watch.size):
        raise ValueError(f"scatter: rank {src} (the source) must pass {watch.size} input tensors, one per rank.")
    return _collective("scatter", group, (output,), {"src": src},
                       lambda w, a: dist.scatter(output, list(inputs) if is_src else None, src=src, group=group,
                                                 async_op=a), async_op)


def gather(tensor: torch.Tensor, outputs: Sequence[torch.Tensor] | None = None, dst: int = 0, *,
           group=None, async_op: bool = False) -> Handle:
    """Every rank sends `tensor` to rank `dst`, which receives rank i's into outputs[i].

        r0: [a]           r0: [a b c]
        r1: [b]    ->     r1:
        r2: [c]           r2:

    Moves: every other rank sends S, dst receives (n-1) * S.
    """
    watch = _debug.watch_for(group)
    is_dst = watch.ranks[watch.me] == dst
    if is_dst and (outputs is None or len(outputs) != watch.size):
        raise ValueError(f"gather: rank {dst} (the destination) must pass {watch.size} output tensors.")
    return _collective("gather", group, (tensor,), {"dst": dst},
                       lambda w, a: dist.gather(tensor, list(outputs) if is_dst else None, dst=dst, group=group,
                                                async_op=a), async_op)


def all_gather(output: torch.Tensor | list[torch.Tensor], tensor: torch.Tensor, *, group=None,
               async_op: bool = False) -> Handle:
    """Every rank receives every rank's tensor: output = [t0; t1; ...] (one tensor of n*len rows,
    concatenated along dim 0, or a list of n tensors).

        r0: [a]           r0: [a b c]
        r1: [b]    ->     r1: [a b c]
        r2: [c]           r2: [a b c]

    Moves: (n-1) * S per rank, in and out (S = one rank's input; that is (n-1)/n of the output).
    """
    if isinstance(output, (list, tuple)):
        return _collective("all_gather", group, (tensor,), {"outputs": len(output)},
                           lambda w, a: dist.all_gather(list(output), tensor, group=group, async_op=a), async_op)

    def launch(w, a):
        def emulated():  # list all_gather into views of the flat output (dim-0 chunks are contiguous)
            return dist.all_gather(list(output.chunk(w.size)), tensor, group=group, async_op=True)
        return _native_or_emulated(w, "all_gather", lambda: _all_gather_tensor(output, tensor, group=group,
                                                                              async_op=a), emulated)
    return _collective("all_gather", group, (tensor, output), {}, launch, async_op)


def reduce_scatter(output: torch.Tensor, input: torch.Tensor | list[torch.Tensor], op="sum", *, group=None,
                   async_op: bool = False) -> Handle:
    """Reduce over ranks, then rank i keeps the i-th chunk: output = (sum over ranks of input)[chunk i].
    `input` is one tensor of n * len(output) rows (chunked along dim 0) or a list of n tensors.

        r0: [a0 a1 a2]        r0: [a0+b0+c0]
        r1: [b0 b1 b2]  ->    r1: [a1+b1+c1]
        r2: [c0 c1 c2]        r2: [a2+b2+c2]

    Moves: (n-1)/n of the input per rank, in and out (the first half of a ring all-reduce).
    """
    name, rop = _reduce_op(op)
    watch = _debug.watch_for(group)
    avg = _avg_emulated(watch, group, name, output)
    use_op = dist.ReduceOp.SUM if avg else rop
    state: dict = {}

    def launch(w, a):
        def native():
            if isinstance(input, (list, tuple)):
                return dist.reduce_scatter(output, list(input), op=use_op, group=group, async_op=a)
            return _reduce_scatter_tensor(output, input, op=use_op, group=group, async_op=a)

        def emulated():  # all-reduce a copy of the whole input, keep our chunk (moves 2x the bytes)
            flat = torch.cat([t.reshape(-1) for t in input]) if isinstance(input, (list, tuple)) else input.clone()
            state["buf"] = flat
            return dist.all_reduce(flat, op=use_op, group=group, async_op=True)
        return _native_or_emulated(w, "reduce_scatter", native, emulated)

    def after():
        if "buf" in state:
            output.copy_(state["buf"].reshape(watch.size, -1)[watch.me].view_as(output))
        if avg:
            output.div_(watch.size)
    ins = tuple(input) if isinstance(input, (list, tuple)) else (input,)
    return _collective("reduce_scatter", group, (output, *ins[:1]), {"op": name}, launch, async_op, after)


def all_to_all(output: torch.Tensor | list[torch.Tensor], input: torch.Tensor | list[torch.Tensor],
               output_split_sizes: list[int] | None = None, input_split_sizes: list[int] | None = None, *,
               group=None, async_op: bool = False) -> Handle:
    """Rank i sends its j-th chunk to rank j, which stores it as its i-th chunk (a transpose).
    Tensors are chunked along dim 0 (evenly, or by the split sizes); or pass lists of n tensors.

        r0: [a0 a1 a2]        r0: [a0 b0 c0]
        r1: [b0 b1 b2]  ->    r1: [a1 b1 c1]
        r2: [c0 c1 c2]        r2: [a2 b2 c2]

    Moves: (n-1)/n of the buffer per rank, out and in.
    """
    if isinstance(output, (list, tuple)):
        outs, ins = list(output), list(input)

        def launch(w, a):
            # gloo lacks the list form on some torch versions: emulate with one batch of isend/irecv
            return _native_or_emulated(w, "all_to_all",
                                       lambda: dist.all_to_all(outs, ins, group=group, async_op=a),
                                       lambda: _all_to_all_p2p(w, outs, ins, group))
        sig = (ins[0] if ins else None,)
        return _collective("all_to_all", group, sig, {"chunks": len(ins)}, launch, async_op)

    uneven = output_split_sizes is not None or input_split_sizes is not None
    sig = () if uneven else (output, input)
    attrs = {"dtype": str(input.dtype).removeprefix("torch.")} if uneven else {}
    return _collective("all_to_all", group, sig, attrs,
                       lambda w, a: dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                                           group=group, async_op=a), async_op)


def _all_to_all_p2p(watch, outs: list[torch.Tensor], ins: list[torch.Tensor], group):
    me = watch.me
    outs[me].copy_(ins[me])  # our own chunk stays here
    ops = []
    for j, g in enumerate(watch.ranks):
        if j != me:
            ops.append(dist.P2POp(dist.isend, ins[j], g, group))
            ops.append(dist.P2POp(dist.irecv, outs[j], g, group))
    return dist.batch_isend_irecv(ops) if ops else None
