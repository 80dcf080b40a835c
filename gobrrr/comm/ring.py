"""Ring all-reduce from point-to-point messages: the algorithm inside NCCL's all_reduce, spelled out.

Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
J. Parallel Distrib. Comput. 69(2), 2009.

Cut the tensor into n chunks (n = ranks). Each rank only ever talks to its two ring neighbours:
it sends to the right (r+1) and receives from the left (r-1).

Phase 1, reduce-scatter (n-1 steps). At step s rank r sends chunk (r-s) mod n and receives chunk
(r-s-1) mod n, which it adds into its own copy. A chunk travels around the ring collecting one
addend per hop; after n-1 steps rank r holds the complete sum of chunk (r+1) mod n.

    n=3, step 0:  r0 sends c0 -> r1     r1 sends c1 -> r2     r2 sends c2 -> r0
          step 1:  r0 sends c2 -> r1     r1 sends c0 -> r2     r2 sends c1 -> r0
          now:     r0 owns sum(c1)       r1 owns sum(c2)       r2 owns sum(c0)

Phase 2, all-gather (n-1 steps). Same pattern, but the received chunk *replaces* the local one:
the finished sums travel around the ring until every rank has all of them.

Cost for S bytes, latency a per message, b seconds per byte on a link, g seconds per reduced byte:

    T = 2(n-1) * a  +  2(n-1)/n * S * b  +  (n-1)/n * S * g

The bandwidth term 2(n-1)/n * S * b is the lower bound for any all-reduce (each rank must send at
least that much, Patarasuk & Yuan Thm. 1) and is nearly independent of n: that is why rings scale
and why nccl-tests reports all-reduce "bus bandwidth" as algbw * 2(n-1)/n. The latency term grows
with n, which is why small messages use trees instead.

This implementation is for reading and for testing (it is checked equal to `comm.all_reduce`);
it runs each step as one `batch_p2p` (send right + receive left in one group call), so no step
can deadlock, and it is several times slower than NCCL's fused, pipelined kernels.
"""
from __future__ import annotations

import torch

from gobrrr.comm import collectives as comm
from gobrrr.comm import debug as _debug

_COMBINE = {
    "sum": torch.Tensor.add_,
    "max": lambda a, b: torch.maximum(a, b, out=a),
    "min": lambda a, b: torch.minimum(a, b, out=a),
    "product": torch.Tensor.mul_,
}


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", *, group=None) -> torch.Tensor:
    """All-reduce `tensor` in place with the two-phase ring; returns `tensor`. op: sum, avg, max, min, product."""
    name = {"mean": "avg", "prod": "product"}.get(op, op)
    if name not in (*_COMBINE, "avg"):
        raise ValueError(f"ring_all_reduce: unknown op {op!r}; use one of {sorted([*_COMBINE, 'avg'])}")
    combine = _COMBINE["sum" if name == "avg" else name]
    watch = _debug.watch_for(group)
    n, r = watch.size, watch.me
    if n == 1:
        return tensor
    right, left = watch.ranks[(r + 1) % n], watch.ranks[(r - 1) % n]  # global ranks of the neighbours

    work = tensor.contiguous()  # a copy only when the caller's tensor is not contiguous
    flat = work.view(-1)  # (numel,)
    chunks = list(torch.tensor_split(flat, n))  # n views, sizes differ by at most one element
    inbox = torch.empty(max(c.numel() for c in chunks), dtype=flat.dtype, device=flat.device)

    # Phase 1: reduce-scatter. After it, chunk (r+1) mod n on rank r holds the full reduction.
    for s in range(n - 1):
        send_i, recv_i = (r - s) % n, (r - s - 1) % n
        buf = inbox[: chunks[recv_i].numel()]
        _step(chunks[send_i], right, buf, left, group)
        combine(chunks[recv_i], buf)

    # Phase 2: all-gather. Pass the finished chunks around; each received chunk overwrites ours.
    for s in range(n - 1):
        send_i, recv_i = (r + 1 - s) % n, (r - s) % n
        buf = inbox[: chunks[recv_i].numel()]
        _step(chunks[send_i], right, buf, left, group)
        chunks[recv_i].copy_(buf)

    if name == "avg":
        flat.div_(n)
    if work.data_ptr() != tensor.data_ptr():
        tensor.copy_(work)
    return tensor


def _step(send: torch.Tensor, right: int, recv: torch.Tensor, left: int, group) -> None:
    """One ring step: send right and receive from the left at once. Empty chunks (numel < n) are skipped
    on both ends alike, since every rank computes the same chunk sizes."""
    ops = ([comm.P2P("send", send, right)] if send.numel() else []) + \
          ([comm.P2P("recv", recv, left)] if recv.numel() else [])
    if ops:
        comm.batch_p2p(ops, group=group)
