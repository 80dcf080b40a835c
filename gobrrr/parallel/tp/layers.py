"""The tensor-parallel modules `tp()` puts in place of a model's own, and the state it leaves on the model.

  ColumnParallelLinear    y = x W_r^T + b_r: this rank's output features (B, T, out/n); gather_input applies
                          f (or SP's all-gather) to the input first; a vocab-parallel head marks its
                          (B, T, V/n) logits for LossParallel.
  RowParallelLinear       y = sum_r x_r W_r^T: the partial output through g (or SP's reduce-scatter), then + b
                          once (at n = 1 the bias rides in the GEMM, as in nn.Linear).
  VocabParallelEmbedding  this rank's V/n rows: masked lookup, then g (or SP's reduce-scatter).
  TPState                 the tp group, SP, how each parameter is split (`Split`, `shard_tensor`), the
                          random streams; `enter`/`leave` are f/g or SP's all-gather/reduce-scatter (ops.py).
  RandomStreams           the replicated and the sharded generator states (Megatron's RNG tracker).
  LossParallel            F.cross_entropy on marked (vocab-sharded) logits runs vocab_parallel_cross_entropy;
                          `loss_parallel()` for a loss computed outside the model's forward.

parallelize.py's docstring gives one block's schedule and how a plan chooses among these.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from gobrrr.parallel.tp.ops import (
    TPGroup,
    copy_to_tp,
    gather_seq,
    reduce_from_tp,
    scatter_seq,
    vocab_parallel_cross_entropy,
    vocab_parallel_embedding,
)


class TPError(ValueError):
    """The model, the plan or the ranks do not fit together; the message says what to change."""


@dataclass(frozen=True)
class Split:
    """How a parameter is split: along `dim`, each of `chunks` fused parts cut in n (dim None: whole)."""
    dim: int | None
    chunks: int = 1


# ---------------------------------------------------------------- random streams

class RandomStreams:
    """Two generator states: 'replicated' (torch's default, alike on tp ranks) and 'sharded' (per tp rank)."""

    def __init__(self, device: torch.device, seed: int):
        self.device = device
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        self.states: dict[str, torch.Tensor] = {"sharded": gen.get_state()}
        self.stack = ["replicated"]

    def _get(self) -> torch.Tensor:
        return torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else torch.get_rng_state()

    def _set(self, state: torch.Tensor) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state, self.device)
        else:
            torch.set_rng_state(state)

    def enter(self, name: str) -> None:
        if name != self.stack[-1]:
            self.states[self.stack[-1]] = self._get()
            self._set(self.states[name])
        self.stack.append(name)

    def exit(self) -> None:
        name = self.stack.pop()
        if name != self.stack[-1]:
            self.states[name] = self._get()
            self._set(self.states[self.stack[-1]])

    def hooks(self, module: nn.Module, name: str) -> None:
        module.register_forward_pre_hook(lambda m, a: self.enter(name))
        module.register_forward_hook(lambda m, a, o: self.exit(), always_call=True)


# ---------------------------------------------------------------- the loss on vocab-sharded logits

_VOCAB = "_gobrrr_vocab_shard"  # attribute on a logits tensor: (vocab_start, TPGroup)


def _vocab_mark(t: Any):
    if not isinstance(t, torch.Tensor):
        return None
    return getattr(t, _VOCAB, None) or getattr(t._base, _VOCAB, None)


class LossParallel(TorchFunctionMode):
    """Runs F.cross_entropy on vocab-sharded logits as vocab_parallel_cross_entropy; marks follow views."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.cross_entropy:
            names = ["input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                     "label_smoothing"]
            a = dict(zip(names, args), **kwargs)
            mark = _vocab_mark(a["input"])
            if mark is not None:
                if a.get("weight") is not None or a.get("label_smoothing", 0.0) or a.get("size_average") is not None \
                        or a.get("reduce") is not None:
                    raise TPError("vocab-parallel cross_entropy supports ignore_index and reduction only (no weight, "
                                  "label_smoothing or the deprecated size_average/reduce); drop those arguments")
                return vocab_parallel_cross_entropy(a["input"], a["target"], mark[0], mark[1],
                                                    a.get("ignore_index", -100), a.get("reduction", "mean"))
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.dim() and out._base is None:
            for t in list(args) + list(kwargs.values()):
                mark = _vocab_mark(t)
                if mark is not None and out.shape[-1] == t.shape[-1]:  # e.g. logits.float(): still my vocab
                    setattr(out, _VOCAB, mark)
                    break
        return out


def loss_parallel() -> LossParallel:
    """`with loss_parallel(): F.cross_entropy(logits, y)` for a loss computed outside the model's forward."""
    return LossParallel()


# ---------------------------------------------------------------- the parallel modules (made from the model's own)

def shard_tensor(t: torch.Tensor, split: Split, tpg: TPGroup, what: str) -> torch.Tensor:
    """This rank's part of `t` (a fresh contiguous tensor)."""
    if split.dim is None:
        return t.detach()
    size = t.shape[split.dim]
    if size % (split.chunks * tpg.size):
        parts = f"{split.chunks} fused parts of {size // split.chunks}" if split.chunks > 1 else f"{size}"
        raise TPError(f"tp: {what} has {parts} along dim {split.dim}, not divisible by tp={tpg.size}; "
                      f"choose a tp that divides {size // split.chunks}")
    part = size // split.chunks // tpg.size
    v = t.detach().unflatten(split.dim, (split.chunks, size // split.chunks))
    return v.narrow(split.dim + 1, tpg.rank * part, part).flatten(split.dim, split.dim + 1).clone()


class ColumnParallelLinear(nn.Module):
    """y = x W_r^T + b_r: this rank's output features (for a fused linear, its part of each chunk)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, state: "TPState", gather_input: bool,
                 vocab_start: int | None):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.state, self.gather_input, self.vocab_start = state, gather_input, vocab_start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gather_input:
            x = self.state.enter(x)                               # (B, T, C) whole on every rank
        y = F.linear(x, self.weight, self.bias)                   # (B, T, out/n)
        if self.vocab_start is not None:
            setattr(y, _VOCAB, (self.vocab_start, self.state.tpg))
            self.state.start_loss_parallel()
        return y


class RowParallelLinear(nn.Module):
    """y = sum_r x_r W_r^T, then + b once: the input's last dim is this rank's slice."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, state: "TPState"):
        super().__init__()
        self.weight, self.bias, self.state = weight, bias, state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.state.tpg.size == 1:  # g is the identity: the bias rides in the GEMM (addmm), as in nn.Linear
            return F.linear(x, self.weight, self.bias)
        y = self.state.leave(F.linear(x, self.weight))            # (B, T, C) | (B, T/n, C) with SP
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    def __init__(self, weight: nn.Parameter, vocab_start: int, state: "TPState"):
        super().__init__()
        self.weight, self.vocab_start, self.state = weight, vocab_start, state

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_embedding(ids, self.weight, self.vocab_start, self.state.tpg,
                                        self.state.sequence_parallel)  # (B, T, C) | (B, T/n, C)


# ---------------------------------------------------------------- state kept on the model

@dataclass
class TPState:
    """What `tp()` did to a model: its group, SP, how each parameter is split, the random streams."""
    tpg: TPGroup
    sequence_parallel: bool
    device: torch.device
    splits: dict[str, Split] = field(default_factory=dict)     # every name in named_parameters(remove_duplicate=False)
    inputs: set[str] = field(default_factory=set)              # modules whose input enters a TP region (ModuleInput)
    streams: RandomStreams | None = None
    mesh: Any = None                                           # the tp DeviceMesh, when tp() was given one
    _mode: LossParallel | None = None
    _depth: int = 0

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """Into a tensor-parallel region: f, or SP's all-gather along the sequence."""
        return gather_seq(x, self.tpg, 1) if self.sequence_parallel else copy_to_tp(x, self.tpg)

    def leave(self, y: torch.Tensor) -> torch.Tensor:
        """Out of it: g, or SP's reduce-scatter along the sequence."""
        return scatter_seq(y, self.tpg, 1) if self.sequence_parallel else reduce_from_tp(y, self.tpg)

    def start_loss_parallel(self) -> None:
        if self._depth and self._mode is None:
            self._mode = LossParallel()
            self._mode.__enter__()

    def _root_pre(self, module, args) -> None:
        if getattr(module, "fused_loss", None) is not None:  # a head+loss op reading lm_head.weight whole
            raise TPError("tp: model.fused_loss is set, but under tp lm_head.weight holds only this rank's V/tp rows; "
                          "set model.fused_loss = None (the loss then runs vocab-parallel)")
        self._depth += 1

    def _root_post(self, module, args, out) -> None:
        self._depth -= 1
        if self._depth == 0 and self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)

    def is_sharded(self, name: str) -> bool:
        return self.splits[name].dim is not None
