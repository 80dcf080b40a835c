"""gobrrr plan: memory per GPU, bytes moved and step time of every parallel layout, from formulas.

    from gobrrr.plan.formulas import PRESETS, Batch, plan
    p = plan(PRESETS["7b"], machine, Batch(micro=1, seq_len=4096), gpus=8)  # machine: gobrrr.plan.machine
    for row in p.rows: print(row.dp, row.tp, row.zero, row.total_bytes, row.fits, row.step_s)

A layout is (dp, tp, ZeRO stage, activation recompute, sequence parallelism); world size = dp * tp,
tp inside one node. For each layout and each GPU the model gives (docs/plan.md states each formula
and its source; Ψ = parameters this GPU's tensor-parallel shard holds, N = dp):

  model states   ZeRO (Rajbhandari et al. 2020, section 5): stage 0 keeps p + g + o bytes per
                 parameter; stage 1 shards o over N, stage 2 also g, stage 3 also p.
                   precision  p  g  o   (o: Adam's two moments, plus fp32 master weights when p is bf16)
                   fp32       4  4  8   no autocast (the CPU tests)
                   amp        4  4  8   fp32 weights under bf16 autocast (`gobrrr train`); autocast
                                        keeps a bf16 copy of every matmul weight until backward
                   amp-res16  4  4  8   the same with a bf16 residual stream (train --bf16-residual)
                   bf16       2  2  12  bf16 weights, fp32 master + moments (the ZeRO paper's K = 12)
  activations    per block, Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
                 Transformer Models") re-counted for this GPT: with flash attention (no s x s
                 scores kept) and no dropout, a block saves (2r + 14c)·sbh + 4·abs bytes, where r and
                 c are the bytes of the residual stream and of the compute dtype (amp: 36·sbh;
                 amp-res16 and bf16: 32·sbh). TP shards 12c of the 2r + 14c; SP also 2r; full recompute
                 keeps only each block's input (r·sbh) plus one block live during its backward.
                 The loss adds (c + 12)·sbV bytes at its backward (logits, fp32 log-softmax, grads),
                 or one chunk of logits with gobrrr.ops' chunked loss (`head_bytes`).
  temporaries    autocast's bf16 weight copies (amp), ZeRO-3's gathered block (this one and the
                 prefetched next), ZeRO's gradient buckets.
  communication  bytes each GPU's link carries per optimizer step, with nccl-tests' bus factors
                 (all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n): DP or ZeRO on the dp
                 group, Megatron's 2 + 2 all-reduces per block (or SP's reduce-scatter + all-gather
                 pairs, the same bytes) on the tp group.
  step time      compute = FLOPs (GPT.flops_per_token; recompute adds a forward) / (MFU x peak),
                 + the optimizer's memory traffic / HBM bandwidth, + the communication that cannot
                 hide under compute: TP all-reduces are on the critical path; gradient reduction
                 hides under the backward of the last micro-step except the last bucket; ZeRO-1/2's
                 parameter all-gather after the step is exposed; ZeRO-3's gathers are prefetched
                 one block ahead and hide under that block's compute.

Bandwidths, peak FLOP/s and MFU come from a `Machine` (gobrrr/plan/machine.py: measured `bench comm`
/ `p2p` / `train` / `ddp` records when they exist, else named defaults); only the records change
when the machine does. `gobrrr plan` is gobrrr/plan/cli.py; `train_row` + `summary` give the one
line `gobrrr train` prints for its own layout. The plan covers layouts gobrrr itself may not run
(e.g. ZeRO-3 with tp > 1): it is the formulas, not a list of features.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

GB = 1e9


# ---------------------------------------------------------------- the model's shape

@dataclass(frozen=True)
class ModelShape:
    """A reference-GPT-shaped model (gobrrr/models/gpt.py): learned positions, pre-LN blocks with biases,
    multi-head attention, GELU MLP of 4x width, the head tied to the token embedding."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int
    vocab_size: int
    seq_len: int  # the block size (longest sequence), and the default training length

    def __post_init__(self):
        for f in ("n_layer", "n_embd", "n_head", "vocab_size", "seq_len"):
            if getattr(self, f) < 1:
                raise ValueError(f"model {f} must be >= 1, got {getattr(self, f)}; give a positive size")
        if self.n_embd % self.n_head:
            raise ValueError(f"width {self.n_embd} is not divisible by {self.n_head} heads; "
                             "pick a head count that divides the width")

    def block_params(self) -> int:
        """One block: qkv 3h^2 + 3h, proj h^2 + h, fc 4h^2 + 4h, proj 4h^2 + h, two LayerNorms 4h."""
        h = self.n_embd
        return 12 * h * h + 13 * h

    def params(self) -> int:
        """Ψ of the whole model: V h + T h + L (12 h^2 + 13 h) + 2 h (the head is tied: counted once)."""
        h = self.n_embd
        return self.vocab_size * h + self.seq_len * h + self.n_layer * self.block_params() + 2 * h

    def params_per_tp_rank(self, tp: int) -> int:
        """Ψ one tensor-parallel rank holds: the block matrices and column-parallel biases (qkv 3h, fc 4h)
        split tp ways, the vocabulary split tp ways (vocab-parallel embedding = the tied head, padded to a
        multiple of tp); row-parallel biases (2h), LayerNorms (4h per block + 2h) and positions replicated."""
        h, L = self.n_embd, self.n_layer
        block = (12 * h * h + 7 * h) // tp + 6 * h
        return math.ceil(self.vocab_size / tp) * h + self.seq_len * h + L * block + 2 * h

    def cast_params_per_tp_rank(self, tp: int) -> int:
        """Parameters autocast copies to bf16 (the inputs of matmuls: linear weights and biases, and the
        tied head); LayerNorm weights and the position table are not cast."""
        h, L = self.n_embd, self.n_layer
        return math.ceil(self.vocab_size / tp) * h + L * ((12 * h * h + 7 * h) // tp + 2 * h)

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token, as `GPT.flops_per_token`: 6 N (N without positions) + 12 L h T."""
        T = seq_len or self.seq_len
        n = self.params() - self.seq_len * self.n_embd
        return 6.0 * n + 12.0 * self.n_layer * self.n_embd * T

    def gpt_config(self):
        """The reference GPT's config of this shape (for building it, e.g. on the meta device)."""
        from gobrrr.models.gpt import GPTConfig

        return GPTConfig(vocab_size=self.vocab_size, block_size=self.seq_len, n_layer=self.n_layer,
                         n_head=self.n_head, n_embd=self.n_embd, dropout=0.0, bias=True)


# GPT-2 shapes up to 1.5b (vocab 50257 padded to 50304, as the reference GPT's 124m). 7b/13b/70b take
# the depth, width and head count of the common 32/40/80-layer, 4096/5120/8192-wide models (LLaMA's
# 32k vocabulary and 4096 context) but stay GPT-shaped: multi-head attention (no GQA), a GELU MLP of
# 4h (no SwiGLU of ~8h/3 x 3 matrices), LayerNorm with biases, learned positions, a tied head. So
# "70b" here has 64.7e9 parameters, not LLaMA-2-70B's 69e9; the formulas are the reference GPT's.
PRESETS: dict[str, ModelShape] = {
    "124m": ModelShape("124m", 12, 768, 12, 50304, 1024),
    "350m": ModelShape("350m", 24, 1024, 16, 50304, 1024),
    "1.5b": ModelShape("1.5b", 48, 1600, 25, 50304, 1024),
    "7b": ModelShape("7b", 32, 4096, 32, 32000, 4096),
    "13b": ModelShape("13b", 40, 5120, 40, 32000, 4096),
    "70b": ModelShape("70b", 80, 8192, 64, 32000, 4096),
}

# bytes per parameter of (parameters, gradients, optimizer state), residual stream, compute dtype
PRECISIONS: dict[str, tuple[int, int, int, int, int]] = {
    "fp32": (4, 4, 8, 4, 4),
    "amp": (4, 4, 8, 4, 2),
    "amp-res16": (4, 4, 8, 2, 2),
    "bf16": (2, 2, 12, 2, 2),
}


# ---------------------------------------------------------------- inputs and outputs

@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    zero: int = 0                    # 0 = plain data parallelism (all-reduce), 1-3 = ZeRO stage
    recompute: bool = False          # full activation recomputation, one checkpoint per block
    sequence_parallel: bool = False  # Korthikanti et al. 2022; only with tp > 1


@dataclass(frozen=True)
class Batch:
    micro: int                 # sequences per GPU per micro-step (b)
    seq_len: int               # tokens per sequence (s)
    global_batch: int | None = None  # sequences per optimizer step; None = micro x GPUs, so a layout
                                     # with tp > 1 accumulates tp micro-steps and all see one batch


@dataclass(frozen=True)
class Options:
    precision: str = "bf16"
    attention: str = "flash"   # flash: no s x s scores kept; eager: Korthikanti's 5 a s^2 b
    loss: str = "full"         # full: F.cross_entropy on (B, T, V) logits; chunked: gobrrr.ops.linear_cross_entropy
    bucket_mb: float = 25.0    # gradient bucket size (gobrrr.parallel.ddp's default)
    headroom: float = 0.10     # fraction of GPU memory kept free: CUDA context, allocator fragmentation

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        if self.attention not in ("flash", "eager"):
            raise ValueError(f"unknown attention {self.attention!r}; choose flash or eager")
        if self.loss not in ("full", "chunked"):
            raise ValueError(f"unknown loss {self.loss!r}; choose full or chunked")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom {self.headroom} must be in [0, 1)")


@dataclass
class Row:
    """One layout on one GPU: bytes held, bytes moved, time per optimizer step."""

    dp: int
    tp: int
    zero: int
    recompute: bool
    sequence_parallel: bool
    params: int                 # Ψ of the model
    micro_batch: int
    grad_accum: int
    global_batch: int
    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float
    temp_bytes: float
    total_bytes: float
    usable_bytes: float
    fits: bool
    comm_bytes_per_step: float
    comm_by_kind: dict[str, float]
    compute_s: float
    optimizer_s: float
    exposed_comm_s: float
    exposed_by_kind: dict[str, float]
    step_s: float
    tokens_per_s: float
    mfu: float
    best: bool = False
    reason: str = ""

    @property
    def layout(self) -> Layout:
        return Layout(self.dp, self.tp, self.zero, self.recompute, self.sequence_parallel)

    def name(self) -> str:
        return (f"dp{self.dp} tp{self.tp} z{self.zero}" + (" rc" if self.recompute else "")
                + (" sp" if self.sequence_parallel else ""))

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Plan:
    model: ModelShape
    gpus: int
    batch: Batch
    options: Options
    machine: object             # gobrrr.plan.machine.Machine
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # layouts not evaluated, and why


# ---------------------------------------------------------------- the formulas

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
    if opt.loss == "full":
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


def comm(model: ModelShape, layout: Layout, b: int, s: int, accum: int, opt: Options
         ) -> dict[str, tuple[float, int, str, str]]:
    """{kind: (bus bytes per optimizer step on one GPU's link, collectives per step, group, hides under)}.

    Bus bytes follow nccl-tests' busbw convention: size x 2(n-1)/n for all-reduce, size x (n-1)/n for
    all-gather and reduce-scatter, so time = bus bytes / bus bandwidth. "hides under" is what compute
    can cover it: the last micro-step's backward, every micro-step's backward, the next block's compute
    (prefetch), or nothing (on the critical path).
    """
    p, g, _, _, c = PRECISIONS[opt.precision]
    n, t, L = layout.dp, layout.tp, model.n_layer
    psi = model.params_per_tp_rank(t)
    bucket = opt.bucket_mb * 2**20
    out: dict[str, tuple[float, int, str, str]] = {}
    if n > 1:
        ag, ar = (n - 1) / n, 2 * (n - 1) / n
        calls = max(1, math.ceil(g * psi / bucket))
        if layout.zero == 0:    # accumulate locally (no_sync), all-reduce once
            out["dp_all_reduce"] = (ar * g * psi, calls, "dp", "last_backward")
        elif layout.zero == 1:  # accumulate unsharded, reduce-scatter once
            out["zero_reduce_scatter"] = (ag * g * psi, calls, "dp", "last_backward")
        else:                   # stage 2-3: reduce-scatter every micro-step into the sharded gradient
            out["zero_reduce_scatter"] = (ag * g * psi * accum, calls * accum, "dp", "each_backward")
        if layout.zero in (1, 2):  # updated shards back to every rank, after the optimizer step
            out["zero_all_gather"] = (ag * p * psi, calls, "dp", "none")
        if layout.zero == 3:    # gathered before forward and again before backward, one block at a time
            out["zero3_all_gather"] = (2 * ag * p * psi * accum, 2 * (L + 1) * accum, "dp", "prefetch")
    if t > 1:
        ar = 2 * (t - 1) / t
        per_block = 4 + (2 if layout.recompute else 0)  # f and g, forward and backward; recompute repeats g
        act = c * s * b * model.n_embd
        sp = layout.sequence_parallel
        name = "tp_sp_reduce_scatter_all_gather" if sp else "tp_all_reduce"
        out[name] = (ar * act * per_block * L * accum, per_block * L * accum * (2 if sp else 1), "tp", "none")
        # vocab-parallel embedding (an fp32 sum forward) and the head's input gradient (backward), plus
        # the loss's max and sum-of-exponentials and target logit (s·b floats each)
        out["tp_vocab_parallel"] = (ar * (4 + c + 3 * 4 / model.n_embd) * s * b * model.n_embd * accum,
                                    5 * accum, "tp", "none")
    return out


def _exposed(hides: str, t_comm: float, calls: int, accum: int, t_fwd: float, t_bwd: float,
             t_bucket: float) -> float:
    """The part of a kind's time over all micro-steps that compute cannot hide (module docstring)."""
    if hides == "last_backward":   # buckets launch during backward; the last one waits at the end
        return max(0.0, t_comm - t_bwd) + min(t_bucket, t_comm)
    per_micro = t_comm / accum
    if hides == "each_backward":
        return accum * (max(0.0, per_micro - t_bwd) + min(t_bucket, per_micro))
    if hides == "prefetch":        # the next block's gather under this block's compute; the first waits
        first = per_micro / max(1, calls // accum)
        return accum * (max(0.0, per_micro - (t_fwd + t_bwd)) + 2 * first)
    return t_comm


def evaluate(model: ModelShape, layout: Layout, batch: Batch, machine, opt: Options = Options()) -> Row:
    """The row of one layout: memory, communication and step time on one GPU of `machine`."""
    b, s = batch.micro, batch.seq_len
    G = batch.global_batch or b * layout.dp * layout.tp
    if G % (b * layout.dp):
        raise ValueError(f"global batch {G} is not a multiple of micro-batch {b} x dp {layout.dp}")
    accum = G // (b * layout.dp)
    p_b, g_b, o_b = model_state_bytes(model, layout, opt.precision)
    act = activation_bytes(model, layout, b, s, opt)
    temps = temp_bytes(model, layout, opt)
    total = p_b + g_b + o_b + act + sum(temps.values())
    usable = machine.mem_bytes * (1 - opt.headroom)

    flops = model.flops_per_token(s) * b * s / layout.tp  # one micro-step on this GPU (model FLOPs)
    rate = machine.mfu * machine.peak_flops
    t_fwd = flops / 3 / rate
    t_bwd = 2 * flops / 3 / rate + (t_fwd if layout.recompute else 0.0)
    compute = accum * (t_fwd + t_bwd)
    # fused AdamW reads p, g, m, v and writes p, m, v: 16 + 12 bytes per fp32 element it owns (+ bf16 copy)
    owned = model.params_per_tp_rank(layout.tp) / (layout.dp if layout.zero >= 1 else 1)
    opt_s = owned * (28 + (2 * PRECISIONS[opt.precision][0] if opt.precision == "bf16" else 0)) / machine.hbm_Bps

    kinds = comm(model, layout, b, s, accum, opt)
    spans_nodes = layout.dp * layout.tp > machine.gpus_per_node
    by_kind, exposed = {}, {}
    for kind, (nbytes, calls, group, hides) in kinds.items():
        link = machine.inter if (group == "dp" and spans_nodes) else machine.intra
        t_comm = nbytes / link.busbw_Bps + calls * link.latency_s
        t_bucket = opt.bucket_mb * 2**20 / link.busbw_Bps
        by_kind[kind] = nbytes
        exposed[kind] = _exposed(hides, t_comm, calls, accum, t_fwd, t_bwd, t_bucket)
    step = compute + opt_s + sum(exposed.values())
    tokens = G * s / step
    return Row(dp=layout.dp, tp=layout.tp, zero=layout.zero, recompute=layout.recompute,
               sequence_parallel=layout.sequence_parallel, params=model.params(), micro_batch=b,
               grad_accum=accum, global_batch=G, param_bytes=p_b, grad_bytes=g_b, optimizer_bytes=o_b,
               activation_bytes=act, temp_bytes=sum(temps.values()), total_bytes=total, usable_bytes=usable,
               fits=total <= usable, comm_bytes_per_step=sum(by_kind.values()), comm_by_kind=by_kind,
               compute_s=compute, optimizer_s=opt_s, exposed_comm_s=sum(exposed.values()),
               exposed_by_kind=exposed, step_s=step, tokens_per_s=tokens,
               mfu=model.flops_per_token(s) * tokens / (layout.dp * layout.tp * machine.peak_flops))


def layouts(model: ModelShape, gpus: int, gpus_per_node: int) -> tuple[list[Layout], list[str]]:
    """Every layout of `gpus` GPUs: tp divides gpus, tp <= gpus per node and divides the heads;
    ZeRO 1-3 only with dp > 1 (nothing to shard otherwise), SP only with tp > 1."""
    out, skipped = [], []
    for tp in range(1, gpus + 1):
        if gpus % tp:
            continue
        if tp > gpus_per_node:
            skipped.append(f"tp {tp}: more than {gpus_per_node} GPUs per node (TP stays inside a node)")
            continue
        if model.n_head % tp:
            skipped.append(f"tp {tp}: {model.n_head} heads are not divisible by {tp}")
            continue
        dp = gpus // tp
        for zero in range(4 if dp > 1 else 1):
            for recompute in (False, True):
                for sp in ((False, True) if tp > 1 else (False,)):
                    out.append(Layout(dp, tp, zero, recompute, sp))
    return out, skipped


def plan(model: ModelShape, machine, batch: Batch, gpus: int, opt: Options = Options()) -> Plan:
    """Every layout's row, the best few marked (`best`) and every other row's `reason`."""
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if batch.micro < 1 or batch.seq_len < 1:
        raise ValueError("micro-batch and sequence length must be >= 1")
    if batch.seq_len > model.seq_len:
        raise ValueError(f"sequence length {batch.seq_len} exceeds the model's {model.seq_len}")
    result = Plan(model, gpus, batch, opt, machine)
    candidates, result.skipped = layouts(model, gpus, machine.gpus_per_node)
    for lay in candidates:
        try:
            result.rows.append(evaluate(model, lay, batch, machine, opt))
        except ValueError as e:
            result.skipped.append(f"dp {lay.dp} x tp {lay.tp}: {e}")
    if not result.rows:
        raise ValueError("no layout is possible: " + "; ".join(dict.fromkeys(result.skipped)))
    rank_rows(result.rows)
    return result


def rank_rows(rows: list[Row], keep: int = 3) -> None:
    """Sort fitting rows by tokens/s (then by memory); mark the first `keep` best, give the rest a reason."""
    rows.sort(key=lambda r: (not r.fits, -round(r.tokens_per_s, 6), r.total_bytes))
    fitting = [r for r in rows if r.fits]
    for r in fitting[:keep]:
        r.best = True
        r.reason = "fastest that fits" if r is fitting[0] else f"{r.tokens_per_s / fitting[0].tokens_per_s:.0%} of the fastest"
    top = fitting[0] if fitting else None
    for r in rows:
        if r.best:
            continue
        if not r.fits:
            r.reason = f"does not fit: {r.total_bytes / GB:.1f} GB > {r.usable_bytes / GB:.1f} GB usable"
        else:
            r.reason = _why_slower(r, top)


def _why_slower(r: Row, top: Row) -> str:
    """The part of the step that grew most against the fastest layout, in one phrase."""
    parts = {"compute" + (" (recompute adds a forward)" if r.recompute and not top.recompute else ""):
             r.compute_s / max(r.global_batch, 1) - top.compute_s / max(top.global_batch, 1),
             "optimizer step": r.optimizer_s / r.global_batch - top.optimizer_s / top.global_batch}
    for kind in set(r.exposed_by_kind) | set(top.exposed_by_kind):
        parts[f"exposed {kind}"] = (r.exposed_by_kind.get(kind, 0.0) / r.global_batch
                                    - top.exposed_by_kind.get(kind, 0.0) / top.global_batch)
    worst = max(parts, key=parts.get)
    ratio = top.tokens_per_s / r.tokens_per_s - 1
    if ratio < 0.005:
        return f"as fast; needs {(r.total_bytes - top.total_bytes) / GB:+.1f} GB vs the fastest"
    return f"{ratio:.0%} slower: {worst}"


def train_row(gpt_config, *, world_size: int, micro_batch: int, seq_len: int, grad_accum: int = 1,
              gpu: str = "H200", gpu_mem_gb: float | None = None, tp: int = 1, zero: int = 0,
              recompute: bool = False, sequence_parallel: bool = False, precision: str = "amp",
              name: str = "run", gpus_per_node: int | None = None, loss: str = "full") -> Row:
    """The plan's row for a `gobrrr train` run: its GPT config, world size, batch and precision.

    `gpu` is a GPU model name (torch.cuda.get_device_name() works); ValueError if it is unknown.
    """
    from gobrrr.plan.machine import machine

    shape = ModelShape(name, gpt_config.n_layer, gpt_config.n_embd, gpt_config.n_head, gpt_config.vocab_size,
                       gpt_config.block_size)
    if world_size % tp:
        raise ValueError(f"world size {world_size} is not a multiple of tp {tp}")
    dp = world_size // tp
    mach = machine(gpu, gpu_mem_gb, gpus_per_node or world_size, model=name)
    batch = Batch(micro_batch, seq_len, micro_batch * dp * grad_accum)
    opt = Options(precision=precision, loss=loss)
    return evaluate(shape, Layout(dp, tp, zero, recompute, sequence_parallel), batch, mach, opt)


def summary(row: Row) -> str:
    """One line: the layout, the bytes per GPU by part, whether it fits, the step time and tokens/s."""
    return (f"plan: {row.name()}: params {row.param_bytes / GB:.2f} + grads {row.grad_bytes / GB:.2f} + optimizer "
            f"{row.optimizer_bytes / GB:.2f} + activations {row.activation_bytes / GB:.2f} + temp "
            f"{row.temp_bytes / GB:.2f} = {row.total_bytes / GB:.2f} GB per GPU "
            f"({'fits' if row.fits else 'DOES NOT FIT'} in {row.usable_bytes / GB:.0f} GB usable); "
            f"step {row.step_s * 1e3:.1f} ms, {row.tokens_per_s:,.0f} tokens/s at MFU {row.mfu:.1%} (docs/plan.md)")
