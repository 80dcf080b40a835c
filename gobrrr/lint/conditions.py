"""What the test of an `if` says about how often its body runs, read from names alone: train or eval mode,
TorchScript or a compiler, CUDA or another backend, an option switched on, a logging or saving switch. hot.HotMap
combines them into rare and hot branches."""
from __future__ import annotations

import ast
import re

from gobrrr.lint.loops import dotted, name_of

# names in a condition that make the branch rare: logging, evaluation, saving, the first step
RARE_WORDS = {"log", "logging", "print", "interval", "every", "freq", "frequency", "first",
              "verbose", "debug", "save", "saving", "ckpt", "checkpoint", "eval", "evaluate", "evaluation", "val",
              "valid", "validate", "validation", "warmup", "report", "display", "show", "visualize", "profile",
              "profiling", "dump", "tensorboard", "wandb", "plot", "plots"}
# a word after `log` that makes the name a log-space quantity, not a logging switch (`self.log_ent_coef`, `log_std`)
_LOG_SPACE = {"prob", "probs", "std", "stds", "alpha", "alphas", "coef", "coeff", "var", "variance", "sigma", "sigmas",
              "scale", "det", "density", "likelihood", "lik", "pi", "ratio", "temperature", "temp", "snr", "partition",
              "ent", "entropy", "beta", "lambda", "rho", "odds", "softmax", "sum", "mean", "norm"}
RATE_WORDS = {"interval", "every", "freq", "frequency", "first", "warmup"}   # a rate, not an option
_TRACKERS = {"wandb", "tensorboard", "writer", "tb", "logger", "run", "tracker"}


_GRAPH_MODE = re.compile(r"(^|\.)(is_scripting|is_tracing|_is_tracing|is_compiling|is_exporting|"
                         r"is_dynamo_compiling|is_torchdynamo_compiling)$")


def graph_mode(test: ast.AST) -> bool:
    """`torch.jit.is_scripting()`, `torch.compiler.is_compiling()` (or several, joined by or): code
    for TorchScript, tracing or a compiler, never run eagerly step by step."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return all(graph_mode(v) for v in test.values)
    if isinstance(test, ast.BoolOp):
        return any(graph_mode(v) for v in test.values)
    return isinstance(test, ast.Call) and bool(_GRAPH_MODE.search(dotted(test.func)))


_CUDA_FLAGS = {"use_cuda", "cuda", "is_cuda", "on_gpu", "use_gpu", "has_cuda", "cuda_available"}


def cuda_test(test: ast.AST) -> bool | None:
    """True for a test that holds on the GPU (`torch.cuda.is_available()`, `device_type == "cuda"`,
    `"cuda" in device`, `use_cuda`, `x.is_cuda`), False for its negation, None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = cuda_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Call):
        return True if dotted(test.func).endswith("cuda.is_available") else None
    if isinstance(test, (ast.Name, ast.Attribute)):
        return True if name_of(test) in _CUDA_FLAGS else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        sides = [test.left, test.comparators[0]]
        if any(isinstance(x, ast.Constant) and x.value == "cuda" for x in sides):
            if isinstance(test.ops[0], (ast.Eq, ast.In)):
                return True
            if isinstance(test.ops[0], (ast.NotEq, ast.NotIn)):
                return False
    return None


_MODE = re.compile(r"^(is_)?train(ing)?$|^train_mode$|^is_eval(uation)?$|^eval_mode$")


def mode_switch(test: ast.AST) -> bool:
    """`if self.training:`, `if not self.training:`, `if model.training and ...`, `if is_train:`: train
    or eval mode, two main paths. A receiver is no mode: `config.train` in `step % config.train.every == 0`."""
    receivers = {id(n.value) for n in ast.walk(test) if isinstance(n, ast.Attribute)}   # `config.train` in
    return any(id(n) not in receivers and (                                        # `config.train.eval_interval`
        isinstance(n, ast.Attribute) and n.attr == "training" or isinstance(n, (ast.Name, ast.Attribute))
        and bool(_MODE.match(name_of(n)))) for n in ast.walk(test))


_BACKENDS = {"mps", "xla", "npu", "xpu", "hpu"}


def other_backend(test: ast.AST, flags: set[str] = frozenset()) -> bool:
    """The test holds only when the run is on another backend than CUDA: `device.type == "mps"`, `dev in
    ("mps", "xla")`, `torch.backends.mps.is_available()`, `x.is_mps`, or a name of `flags` bound to such a test
    (demucs' `is_mps = x.device.type == 'mps'`), alone or and-ed with other conditions."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for p in parts:
        if isinstance(p, ast.Name) and p.id in flags or isinstance(p, ast.Attribute) \
                and p.attr in ("is_mps", "is_xpu", "is_xla", "is_hpu"):
            return True
        if isinstance(p, ast.Compare) and len(p.ops) == 1 and isinstance(p.ops[0], (ast.Eq, ast.In)):
            side = p.comparators[0]
            names = [side] if isinstance(side, ast.Constant) else side.elts if isinstance(side, (ast.Tuple, ast.List,
                                                                                                   ast.Set)) else []
            if names and all(isinstance(c, ast.Constant) and c.value in _BACKENDS for c in names):
                return True
        if isinstance(p, ast.Call) and name_of(p.func) == "is_available" and isinstance(p.func, ast.Attribute) \
                and name_of(p.func.value) in _BACKENDS:
            return True
    return False


def option_flags(test: ast.AST, rated: set[str] = frozenset()) -> set[int]:
    """id of the parts of a condition that are options named like logging or saving, and nothing
    else: `args.verbose`, `train_config.save_metrics`, `wandb_run` (an optional tracker), `valid`, joined
    by and/or/not. Such a branch runs every step once the option is on, so it is rare only if it
    does rare work itself (saves, evaluates, plots); empty if the test is anything else, or a name of
    `rated` (`will_log = step % every == 0`: a rate decided per step)."""
    parts = test.values if isinstance(test, ast.BoolOp) else [test]
    out: set[int] = set()
    for p in parts:
        p = p.operand if isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not) else p
        if isinstance(p, ast.Compare) and len(p.ops) == 1 and isinstance(p.ops[0], (ast.Is, ast.IsNot)):
            p = p.left   # `if tb_writer is not None:`
        elif isinstance(p, ast.Compare) and len(p.ops) == 1 and isinstance(p.ops[0], (ast.Eq, ast.NotEq)) \
                and isinstance(p.comparators[0], ast.Constant) and isinstance(p.comparators[0].value, bool):
            p = p.left   # `if self.debug == False:`, as `if not self.debug:`
        if _switched_on(p):   # `self.write_interval > 0`: logging on, every step, not a rate
            out |= {id(n) for n in ast.walk(p)}
            continue
        if isinstance(p, ast.Name) and p.id in rated:
            return set()
        tracker = isinstance(p, ast.Name) and words(p.id) & _TRACKERS
        if not (isinstance(p, (ast.Attribute, ast.Name)) or tracker) or not words(name_of(p)) & (RARE_WORDS - RATE_WORDS):
            return set()
        out |= {id(n) for n in ast.walk(p)}
    return out


def _switched_on(test: ast.AST) -> bool:
    """`interval > 0`, `save_freq != 0`, `log_every >= 1`: a rate compared with its off value says the
    option is on; the branch then runs on every step, and the rate is applied (if at all) inside it."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, (ast.Name, ast.Attribute))
            and isinstance(test.comparators[0], ast.Constant) and words(name_of(test.left)) & RATE_WORDS):
        return False
    op, value = test.ops[0], test.comparators[0].value
    return isinstance(op, (ast.Gt, ast.NotEq)) and value == 0 or isinstance(op, ast.GtE) and value == 1


def words(name: str) -> set[str]:
    """'logInterval' / 'log_interval' -> {'log', 'interval'}; `log` is left out of a log-space quantity's
    name (`log_ent_coef`, `log_std`), which is no logging switch."""
    words = set(re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower().split("_"))
    return words - {"log"} if words & _LOG_SPACE else words


__all__ = ["RARE_WORDS", "cuda_test", "graph_mode", "mode_switch", "option_flags", "other_backend",
           "words"]
