"""What a tp() model communicates per step, from its modules: every collective, its tensor size, the bytes.

    rows = comm_plan(model, batch_size=8, seq_len=1024)        # one row per (module, phase, op)
    print(format_plan(rows, n=tp_state(model).tpg.size))        # and the total bytes one rank sends

The formula, per collective over n tp ranks, for a tensor of S bytes (the whole, unsharded one):
all-reduce moves 2(n-1)/n * S per rank (ring: a reduce-scatter and an all-gather), all-gather and
reduce-scatter (n-1)/n * S each, so sequence parallelism moves the same bytes as the all-reduces it
replaces (Korthikanti et al. 2022, section 4.2.2). Which collectives there are (n = tp, B x T tokens,
C features):

  VocabEmbedding          forward all-reduce (B,T,C)          | SP: reduce-scatter fwd, all-gather bwd
  ModuleInput / gather    backward all-reduce (B,T,C)         | SP: all-gather fwd, reduce-scatter bwd
  Rowwise                 forward all-reduce (B,T,C_out)      | SP: reduce-scatter fwd, all-gather bwd
  vocab-parallel loss     forward all-gather of (2, B*T) fp32 stats from each rank
  SP only                 backward all-reduce of each replicated parameter's gradient (norms, biases)

tests/test_tp.py measures the collectives of a real step (sizes read from the c10d calls) and
asserts they equal these rows.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from gobrrr.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from gobrrr.parallel.tp.parallelize import tp_state


@dataclass(frozen=True)
class CommRow:
    module: str          # where it happens ("" for the model, e.g. the loss)
    phase: str           # "forward" | "backward"
    op: str              # "all_reduce" | "all_gather" | "reduce_scatter"
    elements: int        # elements of the whole (unsharded) tensor S
    element_size: int    # bytes per element

    def wire_bytes(self, n: int) -> float:
        """Bytes one rank sends (= receives) with ring algorithms."""
        factor = 2 * (n - 1) / n if self.op == "all_reduce" else (n - 1) / n
        return factor * self.elements * self.element_size


def _enter_width(m: nn.Module) -> int:
    """Features of a ModuleInput module's input: the in_features of its first column-parallel linear."""
    for sub in m.modules():
        if isinstance(sub, ColumnParallelLinear):
            return sub.weight.shape[1]
    raise ValueError(f"{type(m).__name__} has no column-parallel linear to read its input width from")


def comm_plan(model: nn.Module, batch_size: int, seq_len: int, element_size: int = 4) -> list[CommRow]:
    """Every collective one training step (forward + backward) of a tp() model issues, in module order.

    element_size: bytes of an activation element (4 for fp32, 2 under bf16 autocast); parameter
    gradients use their own dtype, the loss statistics are always fp32.
    """
    state = tp_state(model)
    if state is None:
        raise ValueError("comm_plan: the model was not given to tp()")
    sp, n, tokens = state.sequence_parallel, state.tpg.size, batch_size * seq_len
    holder = next(m for m in model.modules() if m.__dict__.get("_gobrrr_tp") is state)
    rows: list[CommRow] = []

    def enter(name: str, width: int) -> None:   # f, or SP's all-gather
        if sp:
            rows.append(CommRow(name, "forward", "all_gather", tokens * width, element_size))
            rows.append(CommRow(name, "backward", "reduce_scatter", tokens * width, element_size))
        else:
            rows.append(CommRow(name, "backward", "all_reduce", tokens * width, element_size))

    def leave(name: str, width: int) -> None:   # g, or SP's reduce-scatter
        rows.append(CommRow(name, "forward", "reduce_scatter" if sp else "all_reduce", tokens * width, element_size))
        if sp:
            rows.append(CommRow(name, "backward", "all_gather", tokens * width, element_size))

    for name, m in holder.named_modules():
        if isinstance(m, VocabParallelEmbedding):
            leave(name, m.weight.shape[1])
        elif isinstance(m, RowParallelLinear):
            leave(name, m.weight.shape[0])
        elif isinstance(m, ColumnParallelLinear):
            if m.gather_input:
                enter(name, m.weight.shape[1])
            if m.vocab_start is not None:
                rows.append(CommRow("", "forward", "all_gather", 2 * tokens * n, 4))
        elif name in state.inputs:
            enter(name, _enter_width(m))
    if sp:
        for name, p in holder.named_parameters():
            if not state.is_sharded(name) and p.requires_grad:
                rows.append(CommRow(name, "backward", "all_reduce", p.numel(), p.element_size()))
    return [r for r in rows if n > 1]


def totals(rows: list[CommRow]) -> dict[tuple[str, str], tuple[int, int]]:
    """{(phase, op): (calls, elements)} summed over the rows."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for r in rows:
        calls, elems = out.get((r.phase, r.op), (0, 0))
        out[(r.phase, r.op)] = (calls + 1, elems + r.elements)
    return out


def format_plan(rows: list[CommRow], n: int) -> str:
    """A table of the rows and the total bytes one rank sends per step."""
    lines = [f"{'module':<28} {'phase':<9} {'op':<15} {'elements':>12} {'MB on the wire':>15}  (MB = 1e6 bytes)"]
    for r in rows:
        lines.append(f"{r.module or '(loss)':<28} {r.phase:<9} {r.op:<15} {r.elements:>12,} "
                     f"{r.wire_bytes(n) / 1e6:>15.3f}")
    total = sum(r.wire_bytes(n) for r in rows)
    lines.append(f"{len(rows)} collectives per step, {total / 1e6:.3f} MB sent per rank (tp={n})")
    return "\n".join(lines)
