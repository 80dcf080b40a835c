"""Tensor parallelism against the single-process GPT (CPU, gloo), in one 4-rank spawn plus one 2-rank spawn.

The 4-rank spawn checks, at tp = 2 (a (dp 2, tp 2) mesh: two tp groups side by side) and tp = 4, with
and without sequence parallelism:
  * the loss, the logits (gathered over the vocabulary) and every parameter's gradient equal the
    single-process model's (fp32, assert_close with the default tolerances);
  * the collectives of a step and their sizes, read from the c10d calls, equal report.comm_plan's
    rows (the formula the user can print);
  * the collectives of forward and backward, counted with torch's CommDebugMode at 1 and 2 layers:
    per block 2 all-reduces each way (SP: 2 all-gathers + 2 reduce-scatters each way, and in backward
    one all-reduce per replicated parameter used on the sequence shard: 6), plus only the embedding's,
    the head's and the loss's own;
  * the largest tensor any op produces in forward + backward is B*T*V/tp elements, while the
    single-process model makes B*T*V (checked with a dispatch mode, so the check can fail);
  * dropout: the sharded stream differs across tp ranks (attention), the replicated one agrees
    (residual dropout without SP), and with SP the residual dropout uses the sharded stream;
  * errors raise the same one-line message on every rank, and nothing hangs: heads or vocabulary not
    divisible, a module the plan does not cover, no plan at all (tp() knows no model's plan), a model
    already wrapped in ddp, tp differing across ranks (mesh and tp()).
The 2-rank spawn runs tp = 2 over the whole world (no mesh) and tp = 1 through the same code path.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gobrrr.comm.testing import SpawnError, spawn
from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.models.gpt_plan import GPT_PLAN

B, T = 2, 16


def _batch(vocab: int):
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab, (B, T), generator=g), torch.randint(0, vocab, (B, T), generator=g)


class _Sizes(TorchDispatchMode):
    """(op kind) -> [calls, elements of the whole tensor] for every c10d collective while active."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, list[int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).split(".")[-2] if str(func).count(".") > 1 else str(func)
        kind = _KIND.get(name)
        if kind is not None:
            whole = {"all_reduce": lambda: args[0][0], "all_gather": lambda: args[0],
                     "reduce_scatter": lambda: args[1]}[kind]()
            calls, elems = self.seen.get(kind, [0, 0])
            self.seen[kind] = [calls + 1, elems + whole.numel()]
        return func(*args, **(kwargs or {}))


class _Peak(TorchDispatchMode):
    """The largest tensor any op returns while active (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.numel, self.shape = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.shape = t.numel(), tuple(t.shape)
        return out


_KIND = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather", "allgather_": "all_gather",
         "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter"}


def _kinds(cm) -> dict[str, int]:
    out: dict[str, int] = {}
    for op, n in cm.get_comm_counts().items():
        k = _KIND.get(str(op).split(".")[-1], str(op))
        out[k] = out.get(k, 0) + n
    return out


def _sub(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b) if a.get(k, 0) - b.get(k, 0)}


def _gather_vocab(logits: torch.Tensor, tpg) -> torch.Tensor:
    parts = [torch.empty_like(logits) for _ in range(tpg.size)]
    dist.all_gather(parts, logits.contiguous(), group=tpg.group)
    return torch.cat(parts, dim=-1)


def _parity(group_or_mesh, sp: bool, n_layer: int, counts: dict, peaks: dict, key) -> None:
    from torch.distributed.tensor.debug import CommDebugMode

    from gobrrr.parallel.tp.parallelize import tp, tp_state
    from gobrrr.parallel.tp.report import comm_plan, totals
    from gobrrr.parallel.tp.tensors import full_state

    cfg = GPTConfig.from_name("tiny", n_layer=n_layer, n_head=4, n_embd=32)
    torch.manual_seed(0)
    ref = GPT(cfg)
    model = tp(copy.deepcopy(ref), group_or_mesh, GPT_PLAN, sequence_parallel=sp)
    tpg = tp_state(model).tpg
    x, y = _batch(cfg.vocab_size)
    with _Peak() as peak:
        with CommDebugMode() as fwd, _Sizes() as fwd_sizes:
            logits, loss = model(x, y)
        with CommDebugMode() as bwd, _Sizes() as bwd_sizes:
            loss.backward()
    counts[(key, n_layer)] = (_kinds(fwd), _kinds(bwd))
    plan = totals(comm_plan(model, B, T))  # the formula, from the model's modules
    measured = {(phase, k): tuple(v) for phase, sizes in (("forward", fwd_sizes), ("backward", bwd_sizes))
                for k, v in sizes.seen.items()}
    assert measured == plan, f"tp={tp_state(model).tpg.size} sp={sp}: measured {measured} != comm_plan {plan}"
    assert logits.shape == (B, T, cfg.vocab_size // tpg.size)
    with _Peak() as ref_peak:
        ref_logits, ref_loss = ref(x, y)
        ref_loss.backward()
    peaks[key] = (peak.numel, peak.shape, ref_peak.numel)
    assert_close(loss, ref_loss)
    assert_close(_gather_vocab(logits.detach(), tpg), ref_logits)
    got = full_state(model, grads=True)
    want = dict(ref.named_parameters())
    assert set(got) == set(want), (sorted(got), sorted(want))
    for name, g in got.items():
        assert_close(g, want[name].grad, msg=lambda m, name=name: f"tp={tpg.size} sp={sp} grad of {name}: {m}")


def _dropout_streams(mesh, sp: bool) -> None:
    """Draws made inside attention (sharded) and the residual dropout, compared across the tp ranks."""
    from gobrrr.parallel.tp.parallelize import tp, tp_state

    torch.manual_seed(0)
    model = tp(GPT(GPTConfig.from_name("tiny", n_head=4, n_embd=32, dropout=0.1)), mesh, GPT_PLAN, sequence_parallel=sp)
    tpg = tp_state(model).tpg
    draws: dict[str, torch.Tensor] = {}
    model.blocks[0].attn.register_forward_pre_hook(lambda m, a: draws.__setitem__("attn", torch.rand(4)))
    model.blocks[0].attn.resid_drop.register_forward_pre_hook(lambda m, a: draws.__setitem__("resid", torch.rand(4)))
    model(*_batch(256))
    after = torch.rand(4)  # the replicated stream after a forward: alike on the tp ranks
    seen = {k: [torch.empty(4) for _ in range(tpg.size)] for k in ("attn", "resid", "after")}
    for k, t in (("attn", draws["attn"]), ("resid", draws["resid"]), ("after", after)):
        dist.all_gather(seen[k], t, group=tpg.group)
    assert not torch.equal(seen["attn"][0], seen["attn"][1]), "attention dropout must differ across tp ranks"
    assert torch.equal(seen["after"][0], seen["after"][1]), "the replicated stream must agree across tp ranks"
    same_resid = torch.equal(seen["resid"][0], seen["resid"][1])
    assert same_resid != sp, f"residual dropout with sequence_parallel={sp}: equal across tp ranks = {same_resid}"


def _errors(rank) -> dict[str, str]:
    """Each bad input raises on every rank; returns the messages."""
    from gobrrr.parallel.mesh import MeshError, make_mesh
    from gobrrr.parallel.tp.parallelize import TPError, tp

    said = {}

    def expect(name, exc_type, fn):
        try:
            fn()
        except exc_type as e:
            said[name] = str(e)
        else:
            raise AssertionError(f"{name}: no error raised")

    model = GPT(GPTConfig.from_name("tiny", n_head=2))
    expect("heads", TPError, lambda: tp(model, None, GPT_PLAN))
    assert isinstance(model.wte, torch.nn.Embedding), "a failed tp() must leave the model untouched"
    expect("vocab", TPError, lambda: tp(GPT(GPTConfig.from_name("tiny", vocab_size=250, n_head=4)), None, GPT_PLAN))
    plan = {k: v for k, v in GPT_PLAN.items() if k != "blocks.*.mlp.fc"}
    expect("plan", TPError, lambda: tp(GPT(GPTConfig.from_name("tiny", n_head=4)), None, plan))
    from gobrrr.parallel import ddp

    expect("wrapped", TPError, lambda: tp(ddp(GPT(GPTConfig.from_name("tiny", n_head=4))), None, GPT_PLAN))
    expect("no plan", TPError, lambda: tp(GPT(GPTConfig.from_name("tiny", n_head=4)), None))
    expect("mesh", MeshError, lambda: make_mesh(2 if rank.rank < 2 else 4))
    g01, g23 = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine = g01 if rank.rank < 2 else None  # ranks 0-1 think tp=2, ranks 2-3 think tp=4
    del g23
    expect("groups", TPError, lambda: tp(GPT(GPTConfig.from_name("tiny", n_head=4)), mine, GPT_PLAN))
    return said


def _four_ranks(rank):
    from gobrrr.parallel.mesh import make_mesh

    torch.set_num_threads(1)  # 4 ranks on a 2-core CI box: one thread each

    counts: dict = {}
    peaks: dict = {}
    for n in (2, 4):
        mesh = make_mesh(n)
        for sp in (False, True):
            for n_layer in (1, 2):
                _parity(mesh, sp, n_layer, counts, peaks, (n, sp))
        if n == 2:
            for sp in (False, True):
                _dropout_streams(mesh, sp)
    return {"counts": counts, "peaks": peaks, "errors": _errors(rank)}


def _two_ranks(rank):
    torch.set_num_threads(1)
    counts: dict = {}
    peaks: dict = {}
    _parity(None, True, 2, counts, peaks, (2, True))       # tp over the whole world, no mesh
    _parity(dist.new_group([rank.rank]), False, 2, counts, peaks, (1, False))  # tp = 1: same path, no collective
    return counts


@pytest.fixture(scope="module")
def four():
    try:
        return spawn(_four_ranks, 4, timeout_s=300)
    except SpawnError as e:
        pytest.fail(str(e), pytrace=False)


def test_forward_and_every_gradient_match_one_process(four):
    assert len(four) == 4  # the comparisons ran (and passed) inside every rank; this is their return


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_collectives_per_block(four, n, sp):
    counts = four[0]["counts"]
    (f1, b1), (f2, b2) = counts[((n, sp), 1)], counts[((n, sp), 2)]
    per_fwd, per_bwd = _sub(f2, f1), _sub(b2, b1)
    extra_fwd, extra_bwd = _sub(f1, per_fwd), _sub(b1, per_bwd)
    if not sp:
        assert per_fwd == {"all_reduce": 2} and per_bwd == {"all_reduce": 2}
        assert extra_fwd == {"all_reduce": 1, "all_gather": 1}   # embedding's g; the loss's (2, N) stats
        assert extra_bwd == {"all_reduce": 1}                    # lm_head's f
    else:
        assert per_fwd == {"all_gather": 2, "reduce_scatter": 2}
        # + the gradients of ln1, ln2 (weight, bias) and of both proj biases: partial over the sequence
        assert per_bwd == {"all_gather": 2, "reduce_scatter": 2, "all_reduce": 6}
        assert extra_fwd == {"reduce_scatter": 1, "all_gather": 2}   # embedding; lm_head input, loss stats
        assert extra_bwd == {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 3}  # + ln_f w, b and wpe


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_largest_activation_is_a_vocab_shard(four, n, sp):
    numel, shape, ref_numel = four[0]["peaks"][(n, sp)]
    V = 256
    assert ref_numel == B * T * V          # the check can see a full (B, T, V)
    assert numel == B * T * V // n, shape  # ... and TP never makes one


@pytest.mark.parametrize("what,needles", [
    ("heads", ["n_head = 2 heads", "tp=4"]),
    ("vocab", ["250 rows", "tp=4"]),
    ("plan", ["'blocks.0.mlp.fc' (Linear)", "add an entry"]),
    ("wrapped", ["wrapped in DDP", "apply tp() to the bare model first"]),
    ("no plan", ["no plan given", "pass plan=", "from gobrrr.models.gpt_plan import GPT_PLAN"]),
    ("mesh", ["ranks [0, 1] asked for tp=2", "ranks [2, 3] asked for tp=4", "same --tp"]),
    ("groups", ["disagree on tp", "rank 2: tp=4"]),
])
def test_errors_name_the_numbers_on_every_rank(four, what, needles):
    for r, result in enumerate(four):
        msg = result["errors"][what]
        for needle in needles:
            assert needle in msg, f"rank {r}: {msg}"


def test_two_ranks_world_group_and_tp1_same_path():
    try:
        counts = spawn(_two_ranks, 2, timeout_s=200)[0]
    except SpawnError as e:
        pytest.fail(str(e), pytrace=False)
    assert counts[((1, False), 2)] == ({}, {})  # tp = 1: not one collective
    fwd, bwd = counts[((2, True), 2)]
    assert fwd == {"reduce_scatter": 5, "all_gather": 6}


def test_bench_tp_runs_in_one_process():
    from gobrrr.bench.tp import BenchConfig, run_bench

    cfg = BenchConfig(model="tiny", batch_size=2, seq_len=16, steps=1, rounds=1, warmup=1)
    result = run_bench(cfg, torch.device("cpu"), world=1)
    assert [r["variant"] for r in result["rows"]] == ["plain", "tp", "tp-sp"]
    assert result["figures"]["tp_over_plain"] > 0
