"""A dropped wrapper frees its model, gradient buffers and shards (no cycle hidden in C++ hooks).

Parameters keep their gradient hooks in C++, out of the garbage collector's sight; a hook holding
the wrapper kept every ddp/ZeRO wrapper, its model and its buffers alive for the life of the
process (found by `bench zero`, whose later variants measured the earlier ones' memory)."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import gobrrr.parallel as gp
from gobrrr.models.gpt import GPT, GPTConfig


def _wrap(kind: str, model):
    def adamw(m):
        return torch.optim.AdamW(m.parameters(), lr=1e-3)

    if kind == "ddp":
        return gp.ddp(model), adamw(model)
    if kind == "naive-ddp":
        return gp.NaiveDDP(model), adamw(model)
    if kind == "naive-zero1":
        return gp.zero(model, adamw, stage=1, naive=True)
    return gp.zero(model, adamw, stage=int(kind[-1]))


@pytest.mark.parametrize("kind", ["ddp", "naive-ddp", "naive-zero1", "zero1", "zero2", "zero3"])
def test_wrapper_model_and_buffers_are_freed_when_dropped(kind):
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("tiny"))
    wrapped, opt = _wrap(kind, model)
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    for _ in range(2):
        loss = wrapped(x, x)[1]  # the logits (item 0) would hold the graph, and through it the parameters
        loss.backward()
        opt.step()
        opt.zero_grad()
    alive = [weakref.ref(wrapped), weakref.ref(model), weakref.ref(next(model.parameters()))]
    del wrapped, opt, model, loss
    gc.collect()
    assert [r() is None for r in alive] == [True, True, True]
