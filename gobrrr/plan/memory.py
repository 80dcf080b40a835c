"""Bytes on one GPU, by part: model states (ZeRO's table), activations (Korthikanti et al. 2022,
re-counted for this GPT), the head and loss, and temporaries. formulas.py's docstring gives the
formulas in one place and docs/plan.md their sources; tests/test_plan.py checks them against
autograd's saved tensors and the ZeRO paper's table.
"""
from __future__ import annotations

import math

from gobrrr.plan.inputs import PRECISIONS, Layout, ModelShape, Options


def model_state_bytes(model: ModelShape, layout: Layout, precision: str) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer state) bytes on one GPU: ZeRO's table on this TP shard's Ψ."""
    p, g, o, _, _ = PRECISIONS[precision]
    psi, n = model.params_per_tp_rank(layout.tp), layout.dp
    params = p * psi / n if layout.zero >= 3 else p * psi
    grads = g * psi / n if layout.zero >= 2 else g * psi
    opt = o * psi / n if layout.zero >= 1 else o * psi
    return params, grads, opt


def block_activation_bytes(model: ModelShape, layout: Layout, b: int, s: int, opt: Options) -> float:
    """Bytes one block saves for its backward (no recompute), on one GPU.

    Saved tensors, in units of s·b·h: LayerNorm inputs 2r; qkv input c; q, k, v 3c; attention output
    c; fc input c; GELU input 4c; the last linear's input 4c; total 2r + 14c. Tensor parallelism
    shards the 12c that live inside the column/row-parallel pair (heads, the 4h hidden); sequence
    parallelism also shards the LayerNorm inputs (2r), while the all-gathered inputs of qkv and fc
    (2c) are kept whole for backward, as gobrrr.parallel.tp and torch's SequenceParallel do
    (Megatron gathers them again in backward instead, and so shards all 2r + 14c). Flash attention
    keeps its fp32 log-sum-exp (4·a·s·b bytes, sharded with the heads); eager attention keeps
    Korthikanti's 5·a·s^2·b instead.
    """
    _, _, _, r, c = PRECISIONS[opt.precision]
    h, a, t = model.n_embd, model.n_head, layout.tp
    sbh = s * b * h
    shard = t if layout.sequence_parallel else 1
    outside, inside = 2 * r * sbh / shard + 2 * c * sbh, 12 * c * sbh
    attn = 4 * a * s * b if opt.attention == "flash" else 5 * a * s * s * b
    stats = 2 * 2 * 4 * s * b / shard  # LayerNorm mean and rstd, fp32, two per block
    return outside + inside / t + attn / t + stats


CHUNK_LOGITS = 2**29  # gobrrr.ops.linear_cross_entropy: logits per chunk (1 GiB in bf16)


def head_bytes(model: ModelShape, layout: Layout, b: int, s: int, opt: Options) -> tuple[float, float]:
    """(bytes the head and loss save for backward, bytes live on top of that at their peak), one GPU.

    full (the reference GPT's F.cross_entropy under autocast): saved ln_f's input (r, sharded by SP)
        and the head's input (c, gathered whole) per sbh, and the fp32 log-softmax output 4·sbV/tp; at the log-softmax
        backward the logits (c·sbV/tp, still referenced) and two fp32 gradients (8·sbV/tp) are live too.
    chunked (gobrrr.ops.linear_cross_entropy, gradients computed in forward one chunk of at most
        2^29 logits at a time): saved ln_f's input (r·sbh), grad_x (c·sbh) and grad_W (c·Vh/tp);
        live during a chunk: its logits (c per logit; on a GPU the Triton pass gobrrr.ops.ce_rows
        writes their gradient over them), plus the bf16 copies of x and W. Until that kernel, the
        gradient took a second buffer and this term read 2c + 4 per logit.
    """
    _, _, _, r, c = PRECISIONS[opt.precision]
    h, Vt = model.n_embd, math.ceil(model.vocab_size / layout.tp)
    sbh = s * b * h
    shard = layout.tp if layout.sequence_parallel else 1
    if opt.loss_at(layout.tp) == "full":
        return r * sbh / shard + c * sbh + 4 * s * b * Vt, (c + 8) * s * b * Vt
    rows = s * b
    per_chunk = max(1, CHUNK_LOGITS // Vt)
    chunk = math.ceil(rows / math.ceil(rows / per_chunk)) * Vt
    return r * sbh / shard + c * sbh + c * Vt * h, chunk * c + c * Vt * h + c * sbh


def saved_bytes(model: ModelShape, layout: Layout, b: int, s: int, opt: Options) -> float:
    """Bytes autograd holds at the end of one micro-step's forward, on one GPU (no recompute):
    L blocks + what the head and the loss save (`head_bytes`)."""
    return model.n_layer * block_activation_bytes(model, layout, b, s, opt) + head_bytes(model, layout, b, s, opt)[0]


def activation_bytes(model: ModelShape, layout: Layout, b: int, s: int, opt: Options) -> float:
    """Peak activation bytes on one GPU during one micro-step (at the loss).

    no recompute: `saved_bytes` + the loss's live bytes at its peak (`head_bytes`).
    recompute:    L block inputs (r·sbh, /tp with SP) + the larger of the head and loss's peak and
                  one block recomputed during its backward plus two fp32 residual gradients.
    """
    _, _, _, r, c = PRECISIONS[opt.precision]
    sbh = s * b * model.n_embd
    shard = layout.tp if layout.sequence_parallel else 1
    saved_head, live = head_bytes(model, layout, b, s, opt)
    if not layout.recompute:
        return saved_bytes(model, layout, b, s, opt) + live
    block = block_activation_bytes(model, layout, b, s, opt)
    return model.n_layer * r * sbh / shard + max(saved_head + live, block + 2 * 4 * sbh / shard)


def temp_bytes(model: ModelShape, layout: Layout, opt: Options) -> dict[str, float]:
    """Buffers beyond model states and activations, by kind."""
    p, g, _, _, _ = PRECISIONS[opt.precision]
    out: dict[str, float] = {}
    if opt.precision.startswith("amp"):  # held from forward to backward by the matmuls that saved them; under
        # recompute only the head's (outside the checkpoints) and one recomputed block's
        cast = model.cast_params_per_tp_rank(layout.tp)
        if layout.recompute:
            blocks = cast - math.ceil(model.vocab_size / layout.tp) * model.n_embd
            cast = cast - blocks + blocks / model.n_layer
        out["autocast_bf16_weights"] = 2.0 * cast
    if layout.zero >= 3:
        block = model.block_params() / layout.tp
        out["zero3_gathered_blocks"] = 2 * p * block + g * block  # this + the prefetched next; its grads
    if layout.zero >= 1:
        out["zero_buckets"] = 2 * opt.bucket_mb * 2**20
    return out
