"""Part 5 of the demo: ZeRO stages 0-3 side by side, bytes held per rank against the paper's formula.

Every rank trains the same small GPT for a few AdamW steps four times: wrapped in `ddp` (stage 0,
plain data parallelism) and in `zero(stage=1|2|3)` (Rajbhandari et al. 2020). After the last
`opt.step()`, before `zero_grad()` (the moment parameters, gradients and optimizer state all
exist), each rank counts the bytes it holds:

    stage 0  ddp: every parameter, every `.grad` (the buckets), every Adam moment        16 psi
    stage 1  Adam moments and the master copy of 1/N of the elements                      8 psi +  8 psi / N
    stage 2  + only 1/N of the averaged gradient                                          4 psi + 12 psi / N
    stage 3  + only 1/N of the parameters (each block gathered just before it runs)       16 psi / N

(fp32 on CPU: 4 bytes of parameter, 4 of gradient and K = 8 of Adam moments per element; with bf16
compute the table of gobrrr/parallel/zero/stages.py applies.) Stage 0 is counted here from the
tensors themselves; stages 1-3 by `gobrrr.parallel.memory_report`. Each count must equal the
formula, and each stage's losses must equal ddp's (the same global batch, the same AdamW): sharding
changes where the bytes live, not the arithmetic.

    rows = run_zero(world_size=4)          # spawns the ranks (gloo on CPU; NCCL on >= 2 GPUs)
    print(format_table(rows)); draw(rows, "demo-out/zero_memory.png")
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gobrrr.models.gpt import GPT, GPTConfig

MB = 1e6                                   # decimal megabytes, as everywhere in gobrrr's tables
# no biases: a bias whose gradient is zero in exact arithmetic gets rounding noise, which Adam scales up to
# lr-sized steps of random sign; stages that sum in another order would then drift apart for no good reason
CFG = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=128, bias=False)
ROWS = 2                                   # sequences per rank per step
STEPS = 3
KINDS = ("params", "grads", "optimizer")
FORMULA = {0: "16 psi", 1: "8 psi + 8 psi/N", 2: "4 psi + 12 psi/N", 3: "16 psi/N"}  # fp32 + Adam (K = 8)


@dataclass
class StageRow:
    """What one stage held on rank 0, beside its formula, and the losses it trained to."""
    stage: int
    world: int
    psi: int                      # trainable elements the formula counts (ZeRO pads them to N shards)
    held: dict[str, float]        # bytes: params, grads, optimizer
    formula: dict[str, float]     # bytes the formula predicts
    losses: list[float]           # mean over ranks, per step
    backend: str = "gloo"         # gloo: CPU ranks; nccl: one GPU per rank

    @property
    def total(self) -> float:
        return sum(self.held[k] for k in KINDS)


def _batch(rank: int, world: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ROWS rows of one global batch (world x ROWS rows, the same on every rank and every step:
    the loss falls as the model learns it)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, CFG.vocab_size, (world * ROWS, CFG.block_size), generator=g)  # (N*ROWS, T)
    y = torch.roll(x, -1, dims=1)                                                       # the next token
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    return x[rows].to(device), y[rows].to(device)


def _ddp_held(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, float]:
    """Stage 0 counted from the tensors: parameters, gradients (views into ddp's buckets), Adam moments."""
    params = list(model.parameters())
    moments = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"params": sum(p.numel() * p.element_size() for p in params),
            "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
            "optimizer": sum(v.numel() * v.element_size() for v in moments)}


def _rank_body(rank, steps: int) -> dict:
    """On every rank: stages 0-3, `steps` AdamW steps each; bytes held after the last step, losses."""
    from gobrrr.parallel import ddp, memory_report, zero
    from gobrrr.parallel.zero.shard import formula_bytes

    torch.set_num_threads(1)  # the ranks share the machine's cores
    x, y = _batch(rank.rank, rank.world_size, rank.device)
    out = {}
    for stage in (0, 1, 2, 3):
        torch.manual_seed(0)  # the same initial weights for every stage
        model = GPT(CFG).to(rank.device)

        def make_opt(m):
            return torch.optim.AdamW(m.parameters(), lr=3e-3)

        if stage == 0:
            model = ddp(model)
            opt = make_opt(model)
        else:
            model, opt = zero(model, make_opt, stage=stage)
        losses = []
        for step in range(steps):
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            if step == steps - 1:  # parameters, gradients and Adam moments all exist now
                if stage == 0:
                    held = _ddp_held(model, opt)
                    psi = sum(p.numel() for p in model.parameters())
                    formula = formula_bytes(0, psi, rank.world_size, mixed=False)
                else:
                    rep = memory_report(model)
                    held, formula, psi = dict(rep.held), rep.formula, rep.psi
            opt.zero_grad()
            losses.append(loss.detach())
        out[stage] = {"held": {k: held[k] for k in KINDS}, "formula": {k: formula[k] for k in KINDS}, "psi": psi,
                      "losses": torch.stack(losses).cpu()}  # sync: once per stage, after its steps
    return out


def run_zero(world_size: int = 4, steps: int = STEPS, timeout_s: float = 120.0) -> list[StageRow]:
    """Spawn the ranks, check every stage against its formula and ddp's losses; one row per stage.

    NCCL (one GPU per rank) when there are at least `world_size` GPUs, gloo on CPU otherwise.
    """
    from torch.testing import assert_close

    from gobrrr.comm.testing import spawn

    backend = "nccl" if torch.cuda.device_count() >= world_size else "gloo"
    per_rank = spawn(_rank_body, world_size, steps, timeout_s=timeout_s, backend=backend)
    rows = []
    for stage in (0, 1, 2, 3):
        for r, res in enumerate(per_rank):
            got = res[stage]
            for k in KINDS:  # the count is the formula, byte for byte (psi padded to the shards)
                if got["held"][k] != got["formula"][k]:
                    raise AssertionError(f"zero stage {stage}, rank {r}: holds {got['held'][k]:.0f} bytes of {k}, "
                                         f"the formula says {got['formula'][k]:.0f}")
            # sharding moves bytes, not arithmetic: each rank's losses are ddp's
            assert_close(got["losses"], per_rank[r][0]["losses"], rtol=1e-5, atol=1e-5,  # NCCL sums in its own order
                         msg=lambda m, s=stage, r=r: f"zero stage {s}, rank {r}: losses differ from ddp's: {m}")
        mean = torch.stack([res[stage]["losses"] for res in per_rank]).mean(0)  # (steps,) the global batch's loss
        first = per_rank[0][stage]
        rows.append(StageRow(stage, world_size, first["psi"], first["held"], first["formula"],
                             mean.tolist(), backend))  # sync: none, CPU tensors back from the ranks
    return rows


def format_table(rows: list[StageRow]) -> str:
    """Bytes per rank by stage, each beside its formula; then the losses."""
    n, psi0 = rows[0].world, rows[0].psi
    head = (f"bytes held per rank after opt.step(), MB = 1e6 bytes; {n} ranks ({rows[0].backend}), psi = {psi0:,} "
            f"fp32 parameters, AdamW (K = 8)")
    lines = [head, f"{'stage':<10} {'params MB':>10} {'grads MB':>10} {'optim MB':>10} {'total MB':>10}   "
                   f"{'formula':<18} {'= MB':>8}  {'x of ddp':>8}"]
    base = rows[0].total
    for r in rows:
        name = "0 ddp" if r.stage == 0 else f"{r.stage} zero"
        lines.append(f"{name:<10} " + " ".join(f"{r.held[k] / MB:>10.3f}" for k in KINDS)
                     + f" {r.total / MB:>10.3f}   {FORMULA[r.stage]:<18} {sum(r.formula.values()) / MB:>8.3f}"
                     + f"  {r.total / base:>8.2f}")
    lines.append("every count equals its formula (psi padded to a multiple of N in stages 1-3)")
    lines.append(f"loss per step (mean over ranks), {len(rows[0].losses)} steps:")
    for r in rows:
        same = "(the reference)" if r.stage == 0 else "== ddp's, assert_close on every rank"
        lines.append(f"  stage {r.stage}: " + "  ".join(f"{v:.4f}" for v in r.losses) + f"   {same}")
    return "\n".join(lines)


def draw(rows: list[StageRow], path: Path) -> Path:
    """A stacked bar per stage (parameters, gradients, optimizer state) with the formula's total marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    names = ["0: ddp", "1: optimizer", "2: + grads", "3: + params"]
    colors = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}
    bottom = [0.0] * len(rows)
    for k in KINDS:
        vals = [r.held[k] / MB for r in rows]
        ax.bar(names, vals, bottom=bottom, color=colors[k], label=f"{k} (measured)", width=0.6)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.scatter(names, [sum(r.formula.values()) / MB for r in rows], marker="_", s=900, color="black", zorder=3,
               label="formula (Rajbhandari et al. 2020)")
    for i, r in enumerate(rows):
        ax.annotate(FORMULA[r.stage].replace("psi", "ψ"), (i, r.total / MB), textcoords="offset points",
                    xytext=(0, 4), ha="center", fontsize=8)
    ax.set_ylabel("MB held per rank (1 MB = 1e6 bytes)")
    ax.set_xlabel("ZeRO stage: what is sharded")
    ax.set_title(f"ZeRO on {rows[0].world} ranks: ψ = {rows[0].psi:,} fp32 parameters, AdamW", fontsize=10)
    ax.set_ylim(0, max(r.total for r in rows) / MB * 1.15)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
