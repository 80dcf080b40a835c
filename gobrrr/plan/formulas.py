"""gobrrr plan: memory per GPU, bytes moved and step time of every parallel layout, from formulas.

    from gobrrr.plan import PRESETS, Batch, plan
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
                 or one chunk of logits with gobrrr.ops' chunked loss (`head_bytes`). By default the
                 loss is what `gobrrr train` runs (`Options.loss_at`): chunked at tp 1, vocab-parallel
                 F.cross_entropy on (B, T, V/tp) logits at tp > 1.
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

Files: inputs.py (the shape, presets, precisions, layout, batch, options), memory.py (bytes by part),
timing.py (bytes moved and what hides them); this file builds, ranks and explains the rows.
Bytes are decimal (GB = 1e9).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gobrrr.plan.inputs import GB, PRECISIONS, Batch, Layout, ModelShape, Options
from gobrrr.plan.memory import activation_bytes, model_state_bytes, temp_bytes
from gobrrr.plan.timing import comm, exposed

# ---------------------------------------------------------------- the rows

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


def evaluate(model: ModelShape, layout: Layout, batch: Batch, machine, opt: Options | None = None) -> Row:
    """The row of one layout: memory, communication and step time on one GPU of `machine` (opt: Options())."""
    opt = opt or Options()
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
    by_kind, exposed_s = {}, {}
    for kind, (nbytes, calls, group, hides) in kinds.items():
        link = machine.inter if (group == "dp" and spans_nodes) else machine.intra
        t_comm = nbytes / link.busbw_Bps + calls * link.latency_s
        t_bucket = opt.bucket_mb * 2**20 / link.busbw_Bps
        by_kind[kind] = nbytes
        exposed_s[kind] = exposed(hides, t_comm, calls, accum, t_fwd, t_bwd, t_bucket)
    step = compute + opt_s + sum(exposed_s.values())
    tokens = G * s / step
    return Row(dp=layout.dp, tp=layout.tp, zero=layout.zero, recompute=layout.recompute,
               sequence_parallel=layout.sequence_parallel, params=model.params(), micro_batch=b,
               grad_accum=accum, global_batch=G, param_bytes=p_b, grad_bytes=g_b, optimizer_bytes=o_b,
               activation_bytes=act, temp_bytes=sum(temps.values()), total_bytes=total, usable_bytes=usable,
               fits=total <= usable, comm_bytes_per_step=sum(by_kind.values()), comm_by_kind=by_kind,
               compute_s=compute, optimizer_s=opt_s, exposed_comm_s=sum(exposed_s.values()),
               exposed_by_kind=exposed_s, step_s=step, tokens_per_s=tokens,
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


def plan(model: ModelShape, machine, batch: Batch, gpus: int, opt: Options | None = None) -> Plan:
    """Every layout's row, the best few marked (`best`) and every other row's `reason` (opt: Options())."""
    opt = opt or Options()
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
              name: str = "run", gpus_per_node: int | None = None, loss: str = "train") -> Row:
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
