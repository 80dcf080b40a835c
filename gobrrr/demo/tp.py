"""Part 6 of the demo: what one GPT block sends under tensor parallelism, with and without SP.

On a (dp, tp) mesh of ranks (tp = 2; dp 2 x tp 2 on four ranks) every rank runs the same small GPT,
sharded by `tp(model, mesh, plan=GPT_PLAN)` (Megatron-LM, Shoeybi et al. 2019), once as is and once
with sequence parallelism (Korthikanti et al. 2022). Three things are measured, not read from a table:

  1. every collective of one block's forward and backward, with its tensor and the bytes one rank
     sends: the c10d calls of a 2-block step minus those of a 1-block step (a dispatch mode sees each
     call), checked equal to `gobrrr.parallel.tp.report.comm_plan`'s rows for that block;
         no SP  forward: g after attn.proj and after mlp.proj (all-reduce);  backward: f at each entry
         SP     each all-reduce becomes an all-gather + a reduce-scatter of the same bytes, and the
                replicated LayerNorm and bias gradients are all-reduced in backward;
  2. the largest tensor any op makes in forward + backward on one rank, against one process
     (the logits: (B, T, V/tp) per rank, never the whole (B, T, V));
  3. the loss of two training steps (ddp over dp, SGD) equals one process's on the same global batch.

    rows = run_tp(world_size=4)            # spawns the ranks (gloo on CPU; NCCL on >= 4 GPUs)
    print(format_report(rows))
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.models.gpt_plan import GPT_PLAN
from gobrrr.parallel.tp import tp

MB = 1e6                                   # decimal megabytes, as everywhere in gobrrr's tables
TP = 2
CFG = GPTConfig(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=64)
ROWS = 4                                   # sequences per dp replica
STEPS = 2
LR = 0.5
# c10d's op names -> our names, and where the op keeps the whole (unsharded) tensor
_OPS = {"allreduce_": ("all_reduce", lambda a: a[0][0]), "_allgather_base_": ("all_gather", lambda a: a[0]),
        "_reduce_scatter_base_": ("reduce_scatter", lambda a: a[1])}


class Collectives(TorchDispatchMode):
    """Every c10d collective issued while active: (op, elements of the whole tensor, bytes per element)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _OPS:
            op, whole = _OPS[name]
            t = whole(args)
            self.calls.append((op, t.numel(), t.element_size()))
        return func(*args, **(kwargs or {}))


class Largest(TorchDispatchMode):
    """The largest tensor any op returns while active (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.numel, self.shape, self.bytes = 0, (), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.shape, self.bytes = t.numel(), tuple(t.shape), t.numel() * t.element_size()
        return out


@contextlib.contextmanager
def saved_activations(model: torch.nn.Module):
    """Bytes autograd saves for backward while active, parameters left out: `with saved_activations(m) as box:`."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    box = {"bytes": 0}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen[ptr] = t.untyped_storage().nbytes()
            box["bytes"] += seen[ptr]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield box


@dataclass
class BlockComm:
    """One collective of one block: where the plan puts it, the whole tensor, the bytes one rank sends."""
    phase: str
    where: str
    op: str
    shape: tuple[int, ...]
    wire_bytes: float             # what one rank sends (= receives), ring algorithm
    why: str


@dataclass
class TPResult:
    """What rank 0 measured for one setting (with or without sequence parallelism)."""
    sp: bool
    dp: int
    tp: int
    block: list[BlockComm]
    largest: tuple[tuple[int, ...], int]       # per rank: shape, bytes
    largest_one: tuple[tuple[int, ...], int]   # one process, the same rows
    saved: int                                 # bytes of activations saved for backward, per rank
    saved_one: int                             # the same in one process
    params: int                                # bytes of parameters per rank
    params_one: int                            # the same in one process
    losses: list[float]                        # mean over dp replicas, per step
    losses_one: list[float]                    # one process on the global batch
    backend: str = "gloo"                      # gloo: CPU ranks; nccl: one GPU per rank


def _batch(step: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's global batch: dp x ROWS sequences (the same on every rank; replica d takes its ROWS)."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randint(0, CFG.vocab_size, (dp * ROWS, CFG.block_size), generator=g)  # (dp*ROWS, T)
    return x, torch.roll(x, -1, dims=1)                                               # next token, wrapped


def _model(n_layer: int, device) -> GPT:
    torch.manual_seed(0)  # the same weights on every rank and in the one-process reference
    return GPT(GPTConfig(**{**CFG.__dict__, "n_layer": n_layer})).to(device)


def _measure(model, x, y) -> tuple[Counter, Counter, Largest, int]:
    """One forward + backward: its collectives by phase, the largest tensor, activation bytes saved for backward."""
    with Largest() as largest:
        with Collectives() as fwd, saved_activations(model) as saved:
            _, loss = model(x, y)
        with Collectives() as bwd:
            loss.backward()
    return Counter(fwd.calls), Counter(bwd.calls), largest, saved["bytes"]


_WHY = {  # (sequence parallel, phase, op, at a block's entry) -> what the collective is for
    (False, "forward", "all_reduce", False): "g: sum the partial outputs",
    (False, "backward", "all_reduce", True): "f: sum the input's gradient",
    (True, "forward", "all_gather", True): "gather the T/n shards",
    (True, "forward", "reduce_scatter", False): "sum partials, keep my T/n",
    (True, "backward", "reduce_scatter", True): "sum grads, keep my T/n",
    (True, "backward", "all_gather", False): "gather the grad's T/n",
    (True, "backward", "all_reduce", False): "replicated param, my T/n",
}


def _block_rows(plan_rows, n: int, block: str, model, sp: bool) -> list[BlockComm]:
    """comm_plan's rows of one block, with the tensor's shape and what each is for."""
    params = dict(model.named_parameters())
    out = []
    for r in plan_rows:
        where = r.module[len(block) + 1:]
        if r.module in params:  # SP: the gradient of a replicated parameter (LayerNorm, a bias)
            shape = tuple(params[r.module].shape)
        else:
            shape = (ROWS, CFG.block_size, r.elements // (ROWS * CFG.block_size))  # (B, T, C)
        entry = where in ("attn", "mlp")
        out.append(BlockComm(r.phase, where, r.op, shape, r.wire_bytes(n), _WHY.get((sp, r.phase, r.op, entry), "")))
    return out


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _one_block(mesh, sp: bool, x, y, dev) -> dict:
    """One block's collectives = (a 2-block step) - (a 1-block step), measured, checked against comm_plan."""
    from gobrrr.parallel.tp.report import comm_plan

    f1, b1, _, _ = _measure(tp(_model(1, dev), mesh, plan=GPT_PLAN, sequence_parallel=sp), x, y)
    model = tp(_model(2, dev), mesh, plan=GPT_PLAN, sequence_parallel=sp)
    f2, b2, largest, saved = _measure(model, x, y)
    measured = Counter({("forward",) + k: v for k, v in (f2 - f1).items()})
    measured += Counter({("backward",) + k: v for k, v in (b2 - b1).items()})
    rows = [r for r in comm_plan(model, ROWS, CFG.block_size) if r.module.startswith("blocks.0.")]
    planned = Counter((r.phase, r.op, r.elements, r.element_size) for r in rows)
    assert measured == planned, f"sp={sp}: one block measured {dict(measured)} != comm_plan {dict(planned)}"
    tp_degree = mesh["tp"].size()
    one_model = _model(2, dev)  # the same step in one process: its largest tensor and saved activations
    _, _, one, saved_one = _measure(one_model, x, y)
    return {"block": _block_rows(rows, tp_degree, "blocks.0", model, sp), "largest": (largest.shape, largest.bytes),
            "largest_one": (one.shape, one.bytes), "saved": saved, "saved_one": saved_one,
            "params": _param_bytes(model), "params_one": _param_bytes(one_model)}


def _train_beside_one_process(mesh, sp: bool, dev) -> dict:
    """STEPS of SGD (by hand: an optimizer would add nothing to the check), ddp over dp and tp inside, against
    one process on the whole global batch; the losses must agree."""
    from torch.testing import assert_close

    from gobrrr.comm import collectives as comm
    from gobrrr.parallel import ddp

    dp, d = mesh["dp"].size(), mesh["dp"].get_local_rank()
    mine = slice(d * ROWS, (d + 1) * ROWS)  # this dp replica's rows of every global batch
    model = ddp(tp(_model(2, dev), mesh, plan=GPT_PLAN, sequence_parallel=sp), group=mesh["dp"].get_group())
    ref = _model(2, dev)
    losses, losses_one = [], []
    for step in range(STEPS):
        gx, gy = _batch(step, dp)
        _, loss = model(gx[mine].to(dev), gy[mine].to(dev))  # sync: the check's host-made batch, copied per step
        _, loss_one = ref(gx.to(dev), gy.to(dev))  # sync: the same batch for the one-process reference
        loss.backward()
        loss_one.backward()
        with torch.no_grad():
            for m in (model, ref):
                for p in m.parameters():
                    p -= LR * p.grad
                    p.grad = None
        losses.append(loss.detach())
        losses_one.append(loss_one.detach())
    avg = torch.stack(losses)                        # (STEPS,) this replica's loss
    comm.all_reduce(avg, "sum", group=mesh["dp"].get_group())
    avg /= dp                                         # the global batch's loss (replicas hold equal rows)
    one = torch.stack(losses_one)
    assert_close(avg, one, rtol=1e-5, atol=1e-5, msg=lambda m: f"sp={sp}: the loss differs from one process's: {m}")
    # sync: once, after the steps: the figures go back to the parent
    return {"losses": avg.cpu().tolist(), "losses_one": one.cpu().tolist()}


def _rank_body(rank, tp_degree: int) -> list[dict]:
    """On every rank, without and with SP: one block's collectives and memory, then two steps' losses."""
    from gobrrr.parallel import make_mesh

    torch.set_num_threads(1)  # the ranks share the machine's cores
    mesh = make_mesh(tp=tp_degree)
    dp, d, dev = mesh["dp"].size(), mesh["dp"].get_local_rank(), rank.device
    x, y = (t[d * ROWS:(d + 1) * ROWS].to(dev) for t in _batch(0, dp))  # this replica's rows
    return [{"sp": sp, "dp": dp, "tp": tp_degree, **_one_block(mesh, sp, x, y, dev),
             **_train_beside_one_process(mesh, sp, dev)} for sp in (False, True)]


def run_tp(world_size: int = 4, tp_degree: int = TP, timeout_s: float = 120.0) -> list[TPResult]:
    """Spawn the ranks (NCCL with one GPU each when there are enough GPUs, gloo on CPU); rank 0's figures."""
    from gobrrr.comm.testing import spawn

    backend = "nccl" if torch.cuda.device_count() >= world_size else "gloo"
    per_rank = spawn(_rank_body, world_size, tp_degree, timeout_s=timeout_s, backend=backend)
    return [TPResult(**r, backend=backend) for r in per_rank[0]]


def _shape(s: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, s)) + ")"


def format_report(results: list[TPResult]) -> str:
    """One table per setting: the block's collectives and bytes, then activations and losses."""
    r0 = results[0]
    lines = [f"mesh dp {r0.dp} x tp {r0.tp} ({r0.backend}); GPT of {CFG.n_layer} blocks, C = {CFG.n_embd}, V = {CFG.vocab_size}, "
             f"B x T = {ROWS} x {CFG.block_size} per dp replica, fp32; MB = 1e6 bytes"]
    for r in results:
        title = "with sequence parallelism (SP)" if r.sp else "without sequence parallelism (Megatron's f and g)"
        lines.append(f"\none block's collectives per tp rank, {title}")
        lines.append(f"  {'phase':<9} {'where':<15} {'collective':<15} {'tensor (whole)':<15} {'MB sent':>8}   what for")
        for c in sorted(r.block, key=lambda c: c.phase != "forward"):
            lines.append(f"  {c.phase:<9} {c.where:<15} {c.op:<15} {_shape(c.shape):<15} {c.wire_bytes / MB:>8.4f}   {c.why}")
        total = sum(c.wire_bytes for c in r.block)
        lines.append(f"  {len(r.block)} collectives, {total / MB:.4f} MB sent per rank per block "
                     "(measured: 2-block step - 1-block step, == comm_plan)")
        (s, b), (s1, b1) = r.largest, r.largest_one
        lines.append(f"  largest tensor (the logits): per rank {_shape(s)} {b / MB:.3f} MB; one process {_shape(s1)} "
                     f"{b1 / MB:.3f} MB")
        lines.append(f"  activations saved for backward: per rank {r.saved / MB:.3f} MB; one process "
                     f"{r.saved_one / MB:.3f} MB")
        lines.append(f"  parameters: per rank {r.params / MB:.3f} MB; one process {r.params_one / MB:.3f} MB")
        lines.append(f"  loss, {len(r.losses)} SGD steps (ddp over dp): " + "  ".join(f"{v:.4f}" for v in r.losses)
                     + " == one process: " + "  ".join(f"{v:.4f}" for v in r.losses_one))
    return "\n".join(lines)


def draw(results: list[TPResult], path) -> Path:
    """Left: MB held per rank against one process; right: MB one rank sends per block, by collective."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.6, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    by_sp = {r.sp: r for r in results}
    one, plain, sp = by_sp[False], by_sp[False], by_sp[True]
    what = ["parameters", "activations saved\nfor backward", "largest tensor\n(the logits)"]
    bars = {"one process": [one.params_one, one.saved_one, one.largest_one[1]],
            f"tp {plain.tp}": [plain.params, plain.saved, plain.largest[1]],
            f"tp {sp.tp} + SP": [sp.params, sp.saved, sp.largest[1]]}
    width = 0.27
    for i, (name, vals) in enumerate(bars.items()):
        left.bar([j + (i - 1) * width for j in range(len(what))], [v / MB for v in vals], width, label=name,
                 color=("#8C8C8C", "#4C72B0", "#55A868")[i])
    left.set_xticks(range(len(what)), what, fontsize=8)
    left.set_ylabel("MB per rank (1 MB = 1e6 bytes)")
    left.set_title("what one rank holds", fontsize=10)
    left.legend(fontsize=8, frameon=False)
    colors = {"all_reduce": "#C44E52", "all_gather": "#4C72B0", "reduce_scatter": "#DD8452"}
    labelled, top = set(), 0.0
    for i, r in enumerate((plain, sp)):
        bottom = 0.0
        for op, color in colors.items():
            mb = sum(c.wire_bytes for c in r.block if c.op == op) / MB
            n = sum(1 for c in r.block if c.op == op)
            if not n:
                continue
            right.bar(i, mb, 0.5, bottom=bottom, color=color, label=None if op in labelled else op.replace("_", "-"))
            labelled.add(op)
            bottom += mb
        right.annotate(f"{len(r.block)} collectives", (i, bottom), textcoords="offset points", xytext=(0, 3),
                       ha="center", fontsize=8)
        top = max(top, bottom)
    right.set_ylim(0, top * 1.35)
    right.set_xticks([0, 1], [f"tp {plain.tp}", f"tp {sp.tp} + SP"])
    right.set_ylabel("MB one rank sends per block")
    right.set_title("one block, forward + backward", fontsize=10)
    right.legend(fontsize=8, frameon=False, loc="upper center", ncol=3)
    fig.suptitle(f"tensor parallelism, dp {plain.dp} x tp {plain.tp}: GPT C = {CFG.n_embd}, V = {CFG.vocab_size}, "
                 f"B x T = {ROWS} x {CFG.block_size}, fp32", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
