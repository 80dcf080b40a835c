"""The loops `gobrrr bench train` compares, each built from the same initial weights and fed the same batch.

`_plain` is the baseline as a careful user writes it (not gobrrr's code); `_gobrrr` is `gobrrr train`'s
step with the preparation train gives one rank. `build(name, ...)` makes any variant of `ALL`; train.py's
docstring says what each one is and how they are timed.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

ALL = ("plain", "plain-ro", "gobrrr", "gobrrr-unfused", "gobrrr-nograph", "gobrrr-blocks", "gobrrr-std", "gobrrr-eager",
       "plain-eager", "gobrrr-mat")


@dataclass
class Variant:
    name: str
    step: Callable[[], None]
    state_bytes: int                 # weights + AdamW moments (gradients are None between steps)
    compile_s: float = 0.0
    times: list[float] | None = None
    host: list[float] | None = None
    peak: int = 0


def autocast_ctx(device: torch.device, cudnn_attention: bool | None = None):
    from gobrrr.train.step import autocast_for

    return autocast_for(device, cudnn_attention)


def _plain(base, batch, device, compile: bool, cudnn: bool, mode: str | None = None, tune: bool = False,
           res16: bool = False) -> Variant:
    """The baseline loop, written here on purpose (not gobrrr's code); `cudnn`: SDPA's cuDNN kernels first;
    `tune`: the same inductor options gobrrr's blocks get (not with a mode: torch.compile takes one);
    `res16`: the same bf16 residual stream gobrrr's variants get (a precision choice, not an optimization)."""
    from gobrrr.train.step import bf16_residual, compile_options

    if mode and not compile:
        raise ValueError(f"plain with mode {mode!r} needs torch.compile (drop --no-compile or this variant)")
    model = copy.deepcopy(base)
    model.fused_loss = None
    bf16_residual(model, res16)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), fused=device.type == "cuda")
    fwd = torch.compile(model, mode=mode, options=None if mode else compile_options(tune)) if compile else model
    x, y = batch
    autocast = autocast_ctx(device, cudnn_attention=cudnn and device.type == "cuda")

    def step():
        with autocast:
            _, loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    name = ("plain" + ("-ro" if mode == "reduce-overhead" else "")) if compile else "plain-eager"
    return Variant(name, step, 16 * _numel(model))


def _gobrrr(name, base, batch, device, *, compile: bool, scope=None, chunked=True, mode=None,
            cudnn: bool, graph: bool = False, tune: bool = False, res16: bool = False,
            fused_mlp: bool | None = None) -> Variant:
    """gobrrr train's step: the same function and the same preparation gobrrr train uses (by default the
    compile scope train picks for one rank)."""
    from gobrrr.parallel import ddp
    from gobrrr.train.config import TrainConfig, lr_at
    from gobrrr.train.graph import GraphedStep
    from gobrrr.train.layout import make_optimizer
    from gobrrr.train.step import compile_scope, prepare_model, train_step

    raw = copy.deepcopy(base)
    prepare_model(raw, compile=compile, scope=scope or compile_scope(1), chunked_loss=chunked, mode=mode,
                  tune=tune and not mode, fused_mlp=fused_mlp, residual_bf16=res16)
    model = ddp(raw)
    cfg = TrainConfig(model="124m", steps=1000, lr=1e-4, warmup=10)
    opt = make_optimizer(raw, cfg, device)
    params = list(raw.parameters())
    autocast = autocast_ctx(device, cudnn)
    counter = [0]

    def one(micro):
        return train_step(model, opt, micro, accum=1, params=params, grad_clip=1.0, autocast=autocast)

    graphed = GraphedStep(one, opt, device) if graph else None

    def step():
        lr = lr_at(counter[0] % cfg.steps, cfg)
        if graphed is not None:  # as gobrrr train does it on a GPU at world size 1
            graphed([batch], lr)
            if notice := graphed.pop_notice():  # the capture failed: this variant's rows are eager
                print(f"  {name}: {notice}", flush=True)
        else:
            for group in opt.param_groups:
                group["lr"] = lr
            one([batch])
        counter[0] += 1

    return Variant(name, step, 16 * _numel(raw))


def _numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


def build(name: str, base, batch, device, cfg: Any) -> Variant:
    """The variant `name` of ALL; cfg is train.py's BenchConfig (its compile, attention, tune, bf16_residual)."""
    c, a = cfg.compile, cfg.attention == "cudnn" and device.type == "cuda"
    t = cfg.tune and c
    g = device.type == "cuda"  # gobrrr train's default: the step as one CUDA graph on a GPU at world size 1
    # what every variant shares: the batch, SDPA's backend order, the residual stream's dtype
    plain = functools.partial(_plain, base, batch, device, cudnn=a, res16=cfg.bf16_residual)
    gob = functools.partial(_gobrrr, name, base, batch, device, cudnn=a, res16=cfg.bf16_residual)
    table = {
        "plain": lambda: plain(c, tune=t),
        "plain-ro": lambda: plain(c, mode="reduce-overhead", tune=t),
        "plain-eager": lambda: plain(False),
        "gobrrr": lambda: gob(compile=c, graph=g, tune=t),
        "gobrrr-unfused": lambda: gob(compile=c, graph=g, tune=t, fused_mlp=False),
        "gobrrr-nograph": lambda: gob(compile=c, tune=t),
        "gobrrr-blocks": lambda: gob(compile=c, graph=g, scope="blocks", tune=t),
        "gobrrr-std": lambda: gob(compile=c, chunked=False, tune=t),
        "gobrrr-eager": lambda: gob(compile=False),
        "gobrrr-mat": lambda: gob(compile=c, mode="max-autotune-no-cudagraphs"),
    }
    if name not in table:
        raise SystemExit(f"gobrrr bench train: error: unknown variant {name!r}; choose from {', '.join(ALL)}")
    return table[name]()
