"""The plan's model-state bytes against what gobrrr.parallel.zero and .tp really hold, on 1, 2 and 4 gloo ranks.

Each rank wraps the reference GPT (tiny and small; with 4 heads where tp = 4 needs them), runs one
fp32 AdamW step on CPU, and reports the bytes it holds: ZeRO through its own `memory_report()`, TP by
summing its parameters, gradients and optimizer moments. The plan (precision "fp32": 4 + 4 + 8 bytes
per parameter) must agree within 2% (ZeRO pads each flat to a multiple of the world size). The TP
model's activations too: the bytes autograd saves in one forward (saved-tensor hooks), with and
without sequence parallelism, against the plan's `saved_bytes`.
"""
from __future__ import annotations

import functools

import pytest
import torch

from gobrrr.plan.inputs import Layout, ModelShape
from gobrrr.plan.memory import model_state_bytes

WORLDS = (1, 2, 4)
MODELS = {  # name -> GPTConfig.from_name overrides
    "tiny": {"n_head": 4},    # 4 heads so that tp = 4 divides them (the named config has 2)
    "small": {"n_head": 4, "block_size": 32},  # 384 wide, 6 layers; short context to stay fast on CPU
}


def _shape(name: str) -> ModelShape:
    from gobrrr.models.gpt import GPTConfig

    c = GPTConfig.from_name(name, **MODELS[name])
    return ModelShape(name, c.n_layer, c.n_embd, c.n_head, c.vocab_size, c.block_size)


def _batch(vocab: int, rank: int):
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, vocab, (2, 16), generator=g)
    return x, torch.roll(x, 1, dims=1)


def _zero_held(rank) -> dict:
    """On each rank: {(model, stage): held bytes} after one ZeRO step (memory_report before zero_grad)."""
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.parallel.zero import memory_report, zero

    out = {}
    for name, over in MODELS.items():
        cfg = GPTConfig.from_name(name, **over)
        for stage in (1, 2, 3):
            torch.manual_seed(0)
            model, opt = zero(GPT(cfg), lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), stage=stage)
            x, y = _batch(cfg.vocab_size, rank.rank)
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            rep = memory_report(model)
            out[(name, stage)] = {k: rep.held[k] for k in ("params", "grads", "optimizer")}
    return out


def _tp_held(rank) -> dict:
    """On each rank: {model: held bytes} of a tp = world-size model after one step."""
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.models.gpt_plan import GPT_PLAN
    from gobrrr.parallel.tp.parallelize import tp

    out = {}
    for name, over in MODELS.items():
        cfg = GPTConfig.from_name(name, **over)
        torch.manual_seed(0)
        model = tp(GPT(cfg), None, GPT_PLAN)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = _batch(cfg.vocab_size, 0)  # every tp rank reads the same batch
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        params = list({id(p): p for p in model.parameters()}.values())
        moments = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
        out[name] = {"params": sum(p.numel() * p.element_size() for p in params),
                     "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
                     "optimizer": sum(v.numel() * v.element_size() for v in moments)}
    return out


def _tp_saved(rank) -> dict:
    """On each rank: {sequence_parallel: bytes autograd saves in one forward} of the tiny model at tp = world."""
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.models.gpt_plan import GPT_PLAN
    from gobrrr.parallel.tp.parallelize import tp
    from tests.test_plan import autograd_saved_bytes

    out = {}
    cfg = GPTConfig.from_name("tiny", **MODELS["tiny"])
    for sp in (False, True):
        torch.manual_seed(0)
        model = tp(GPT(cfg), None, GPT_PLAN, sequence_parallel=sp)
        x, y = _batch(cfg.vocab_size, 0)
        out[sp] = autograd_saved_bytes(model, lambda: model(x, y))  # noqa: B023 - called before the loop moves on
    return out


def _held(rank) -> dict:
    """Both checks in one process per rank (one spawn per world size keeps the suite fast)."""
    torch.set_num_threads(1)  # ranks share the CPU cores; intra-op threads only spin against each other
    return {"zero": _zero_held(rank), "tp": _tp_held(rank), "tp_saved": _tp_saved(rank)}


@functools.cache
def _run(world: int) -> list[dict]:
    from gobrrr.comm.testing import spawn

    return spawn(_held, world, timeout_s=240.0)


def _close(held: dict, plan: tuple[float, float, float], what: str) -> None:
    for key, want in zip(("params", "grads", "optimizer"), plan):
        assert held[key] == pytest.approx(want, rel=0.02), f"{what} {key}: held {held[key]} vs plan {want}"
    assert sum(held.values()) == pytest.approx(sum(plan), rel=0.02)


@pytest.mark.parametrize("world", WORLDS)
def test_zero_holds_what_the_plan_says(world):
    for rank, held in enumerate(_run(world)):
        for (name, stage), h in held["zero"].items():
            _close(h, model_state_bytes(_shape(name), Layout(world, 1, stage), "fp32"),
                   f"{name} ZeRO-{stage} rank {rank}/{world}")


@pytest.mark.parametrize("world", WORLDS)
def test_tensor_parallel_holds_what_the_plan_says(world):
    for rank, held in enumerate(_run(world)):
        for name, h in held["tp"].items():
            _close(h, model_state_bytes(_shape(name), Layout(1, world, 0), "fp32"), f"{name} tp {world} rank {rank}")


@pytest.mark.parametrize("world", WORLDS)
def test_tensor_parallel_saves_the_activations_the_plan_says(world):
    from gobrrr.plan.inputs import Options
    from gobrrr.plan.memory import saved_bytes

    x, _ = _batch(256, 0)
    b, s = x.shape
    for rank, held in enumerate(_run(world)):
        for sp, nbytes in held["tp_saved"].items():
            want = saved_bytes(_shape("tiny"), Layout(1, world, 0, False, sp), b, s, Options(precision="fp32", loss="full"))
            assert nbytes == pytest.approx(want, rel=0.02), f"tp {world} sp {sp} rank {rank}"
