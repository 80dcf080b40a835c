"""Data parallel wrappers against a single-process reference (CPU, gloo; NCCL with GOBRRR_TEST_BACKEND=nccl).

Each world size is one spawn that runs many checks, so the file costs a few seconds:
  * NaiveDDP and ddp (default and tiny buckets) give the single-process gradient of the full batch,
    over two optimizer steps, with rank 0's weights and buffers broadcast at wrap time;
  * accumulation over k micro-steps on N ranks equals one batch of k*N micro-batches, and
    all_reduce is called only on the last micro-step (counted at torch.distributed's call site);
  * bf16 gradient compression reduces bf16 tensors and lands close to the fp32 result;
  * a parameter without a gradient is named in the error; mismatched models raise on every rank.
"""
from __future__ import annotations

import contextlib
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

import gobrrr.parallel as gp
from gobrrr.parallel.ddp import MiB, assign_buckets

BACKEND = os.environ.get("GOBRRR_TEST_BACKEND", "gloo")
MICRO = 4   # rows per rank per micro-step
DIM = 8


class Mixed(nn.Module):
    """Small model with fp32, fp64 and bf16 parameters, a frozen layer and a buffer."""

    def __init__(self, hidden: int = 32, unused: bool = False, freeze_mid: bool = False):
        super().__init__()
        self.inp = nn.Linear(DIM, hidden)
        self.frozen = nn.Linear(hidden, hidden).requires_grad_(False)
        self.scale64 = nn.Parameter(torch.linspace(0.5, 1.5, hidden, dtype=torch.float64))
        self.mid = nn.Linear(hidden, hidden).requires_grad_(not freeze_mid)
        self.head = nn.Linear(hidden, 2)
        self.gain16 = nn.Parameter(torch.tensor([1.0, -0.5], dtype=torch.bfloat16))
        self.register_buffer("shift", torch.full((hidden,), 0.1))
        if unused:
            self.unused = nn.Linear(hidden, hidden)

    def forward(self, x, y):
        h = torch.tanh(self.inp(x))                       # (B, H)
        h = h + 0.1 * torch.tanh(self.frozen(h))
        h = h * self.scale64.to(h.dtype)
        h = torch.tanh(self.mid(h)) + self.shift
        out = self.head(h) * self.gain16.to(h.dtype)      # (B, 2)
        return F.mse_loss(out, y)


def make_model(seed: int, device, **kw) -> Mixed:
    torch.manual_seed(seed)
    m = Mixed(**kw).to(device)
    with torch.no_grad():
        m.shift.add_(seed)  # a different buffer on other seeds: the broadcast must fix it
    return m


def data(n_rows: int, device, seed: int = 1234):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, DIM, generator=g)
    y = torch.randn(n_rows, 2, generator=g)
    return x.to(device), y.to(device)


def close(got: torch.Tensor, want: torch.Tensor, what: str, **tol) -> None:
    """assert_close, with room for bf16 gradients summed over micro-batches (cancellation in 8 bits)."""
    if want.dtype == torch.bfloat16 and not tol:
        tol = {"rtol": 2e-2, "atol": 1e-3}
    assert_close(got, want, msg=lambda m: f"{what}: {m}", **tol)


def grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}


@contextlib.contextmanager
def count_all_reduce():
    """Record the dtype of every torch.distributed.all_reduce call (the wrappers look it up at call time)."""
    calls: list[torch.dtype] = []
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.dtype)
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        yield calls
    finally:
        dist.all_reduce = original


def wrappers():
    return {
        "naive": lambda m: gp.NaiveDDP(m),
        "ddp": lambda m: gp.ddp(m),
        "ddp-tiny-buckets": lambda m: gp.ddp(m, bucket_mb=2048 / MiB, first_bucket_mb=300 / MiB),
    }


# ------------------------------------------------------------------------------ checks run in every rank

def check_matches_full_batch(r, wrap, steps: int = 2) -> None:
    """Two SGD steps: the wrapped model's grads and weights track the full-batch single-process run."""
    dev, N = r.device, r.world_size
    ref = make_model(0, dev)
    model = wrap(make_model(0 if r.rank == 0 else 100 + r.rank, dev))
    for (n, p), (_, q) in zip(ref.named_parameters(), model.module.named_parameters()):
        assert_close(q, p, msg=f"{n} was not broadcast from rank 0")
    assert_close(model.module.shift, ref.shift)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = data(N * MICRO, dev, seed=step)
        ref(x, y).backward()
        mine = slice(r.rank * MICRO, (r.rank + 1) * MICRO)
        model(x[mine], y[mine]).backward()
        g_ref, g = grads(ref), grads(model.module)
        for n in g_ref:
            if g_ref[n] is None:
                assert g[n] is None, f"frozen {n} got a gradient"
            else:
                close(g[n], g_ref[n], f"step {step}: gradient of {n}")
        opt_ref.step(), opt.step()
        opt_ref.zero_grad(), opt.zero_grad()  # set_to_none: the next backward must find its bucket again
    for (n, p), (_, q) in zip(ref.named_parameters(), model.module.named_parameters()):
        assert_close(q, p, msg=f"weights of {n} after {steps} steps")


def check_accumulation(r, wrap, k: int = 3) -> list[int]:
    """k micro-steps on N ranks == one batch of k*N micro-batches; collectives only on the last micro-step."""
    dev, N = r.device, r.world_size
    ref = make_model(0, dev)
    model = wrap(make_model(0, dev))
    x, y = data(k * N * MICRO, dev, seed=7)
    ref(x, y).backward()
    per_micro = []
    for i in range(k):
        rows = slice((i * N + r.rank) * MICRO, (i * N + r.rank + 1) * MICRO)  # micro-batch i*N + rank
        ctx = gp.no_sync(model) if i < k - 1 else contextlib.nullcontext()
        with count_all_reduce() as calls, ctx:
            (model(x[rows], y[rows]) / k).backward()
        per_micro.append(len(calls))
    for n, g in grads(ref).items():
        if g is not None:
            close(model.module.get_parameter(n).grad, g, f"accumulated gradient of {n}")
    assert per_micro[:-1] == [0] * (k - 1), f"collectives on no_sync micro-steps: {per_micro}"
    assert per_micro[-1] > 0, "the last micro-step issued no collective"
    return per_micro


def check_bf16_compression(r) -> None:
    dev, N = r.device, r.world_size
    ref = make_model(0, dev)
    model = gp.ddp(make_model(0, dev), grad_dtype=torch.bfloat16)
    x, y = data(N * MICRO, dev)
    ref(x, y).backward()
    with count_all_reduce() as calls:
        model(x[r.rank * MICRO:(r.rank + 1) * MICRO], y[r.rank * MICRO:(r.rank + 1) * MICRO]).backward()
    # fp32 and fp64 buckets travel as bf16; the bf16 bucket is already bf16
    assert calls and set(calls) == {torch.bfloat16}, calls
    for n, g in grads(ref).items():
        if g is not None:
            got = model.module.get_parameter(n).grad
            assert got.dtype == g.dtype, f"{n}: gradient dtype {got.dtype}, parameter dtype {g.dtype}"
            close(got, g, f"bf16-compressed gradient of {n}", rtol=2e-2, atol=2e-3)


def check_unused_parameter(r, wrap) -> str:
    model = wrap(make_model(0, r.device, unused=True))
    x, y = data(MICRO, r.device)
    with pytest.raises(RuntimeError, match=r"unused\.weight") as err:
        model(x, y).backward()
    assert "unused.bias" in str(err.value)
    model.zero_grad()
    with pytest.raises(RuntimeError, match=r"unused\.weight"):  # state was reset: the same error, not a hang
        model(x, y).backward()
    return str(err.value)


def check_mismatch(r) -> list[str]:
    """Rank 1 builds a different model: every rank raises at wrap time, naming the difference."""
    msgs = []
    for kw in ({"hidden": 48}, {"freeze_mid": True}):
        model = make_model(0, r.device, **(kw if r.rank == 1 else {}))
        with pytest.raises(RuntimeError, match="different models") as err:
            gp.ddp(model)
        msgs.append(str(err.value))
    with pytest.raises(RuntimeError, match="settings differ"):
        gp.ddp(make_model(0, r.device), bucket_mb=25 if r.rank else 10)
    return msgs


def run_all_checks(r) -> dict:
    torch.set_num_threads(1)  # N ranks share 2 cores
    out = {}
    for name, wrap in wrappers().items():
        check_matches_full_batch(r, wrap)
        out[f"accum-{name}"] = check_accumulation(r, wrap)
    check_bf16_compression(r)
    out["unused-ddp"] = check_unused_parameter(r, wrappers()["ddp"])
    out["unused-naive"] = check_unused_parameter(r, wrappers()["naive"])
    out["mismatch"] = check_mismatch(r)
    if r.world_size == 2:
        from gobrrr.bench.ddp import BenchConfig, run_bench
        out["bench"] = run_bench(r, BenchConfig.quick())
    return out


def _spawn(world_size: int):
    from gobrrr.comm.testing import spawn

    return spawn(run_all_checks, world_size, timeout_s=90.0, backend=BACKEND)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_match_single_process(world_size):
    if BACKEND == "nccl" and world_size > torch.cuda.device_count():
        pytest.skip(f"NCCL runs one rank per GPU: {world_size} ranks need {world_size} GPUs")
    results = _spawn(world_size)
    n_tensors = 8  # trainable parameter tensors of Mixed
    for res in results:
        assert res["accum-naive"][-1] == n_tensors       # one collective per gradient tensor
        assert 1 <= res["accum-ddp"][-1] <= 3            # one per bucket: dtypes fp32, fp64, bf16
        assert res["accum-ddp-tiny-buckets"][-1] > res["accum-ddp"][-1]
        assert "unused.weight" in res["unused-ddp"] and "unused.weight" in res["unused-naive"]
        shape_msg, grad_msg = res["mismatch"]
        assert "'scale64' has shape (32,) on rank 0 but (48,) on rank 1" in shape_msg
        assert "'mid.weight' has requires_grad True on rank 0 but False on rank 1" in grad_msg
    if world_size == 2:
        rows = results[0]["bench"]["rows"]
        assert {row["variant"] for row in rows} >= {"plain", "ddp", "naive", "torch-ddp"}
        assert all(row["tokens_per_s"] > 0 for row in rows)


# ------------------------------------------------------------------------------ in-process (world size 1)

class _Solo:
    """The Rank fields the checks use, for one process without a process group."""
    rank, world_size, device = 0, 1, torch.device("cpu")


def test_world_size_1_same_path_without_a_group():
    assert not dist.is_initialized(), "a process group leaked into the test process"
    for name, wrap in wrappers().items():
        check_matches_full_batch(_Solo, wrap)
    ref = make_model(0, "cpu")
    model = gp.ddp(make_model(0, "cpu"), bucket_mb=2048 / MiB, first_bucket_mb=300 / MiB)
    x, y = data(3 * MICRO, "cpu")
    ref(x, y).backward()
    for i in range(3):
        rows = slice(i * MICRO, (i + 1) * MICRO)
        with model.no_sync() if i < 2 else contextlib.nullcontext():
            (model(x[rows], y[rows]) / 3).backward()
        assert model.reductions == (0 if i < 2 else len(model.buckets))  # the hooks ran; nothing to send
    for n, g in grads(ref).items():
        if g is not None:
            close(model.module.get_parameter(n).grad, g, f"accumulated gradient of {n}")
    check_unused_parameter(_Solo, wrappers()["ddp"])


class _FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("boom in backward")


def test_a_backward_that_died_midway_leaves_no_stale_state():
    for wrap in wrappers().values():
        ref, model = make_model(0, "cpu"), wrap(make_model(0, "cpu"))
        x, y = data(MICRO, "cpu")
        with pytest.raises(ValueError, match="boom"):  # the parameters' hooks ran, the end-of-backward did not
            model(_FailsInBackward.apply(x.clone().requires_grad_()), y).backward()
        model.zero_grad()
        ref(x, y).backward()
        model(x, y).backward()
        for n, g in grads(ref).items():
            if g is not None:
                close(model.module.get_parameter(n).grad, g, f"gradient of {n} after a failed backward")


def test_bucket_assignment_mixed_sizes_and_dtypes():
    f32, f64, bf16 = torch.float32, torch.float64, torch.bfloat16
    sizes = [(100, f32), (300, f32), (50, bf16), (400, f32), (10, f64), (1000, f32), (20, bf16), (5, f32)]
    # caps: first bucket 1000 bytes (250 fp32), then 2000 bytes
    got = assign_buckets(sizes, bucket_bytes=2000, first_bucket_bytes=1000)
    # 5 fills a whole bucket alone: it travels alone and closes the open bucket [3] before it
    assert got == [[0, 1], [3], [4], [5], [2, 6], [7]]  # in the order they complete
    assert assign_buckets(sizes, bucket_bytes=10_000, first_bucket_bytes=10_000) == [[4], [2, 6], [0, 1, 3, 5, 7]]
    # a single parameter larger than the cap gets a bucket to itself
    assert assign_buckets([(10_000, f32), (1, f32)], 16, 16) == [[0], [1]]


def test_buckets_of_a_wrapped_model():
    model = gp.ddp(make_model(0, "cpu"), bucket_mb=2048 / MiB, first_bucket_mb=300 / MiB)
    names = [n for b in model.buckets for n in b.names]
    trainable = [n for n, p in model.module.named_parameters() if p.requires_grad]
    assert sorted(names) == sorted(trainable) and "frozen.weight" not in names
    for b in model.buckets:
        assert len({p.dtype for p in b.params}) == 1 and b.buffer.dtype == b.params[0].dtype
        order = [trainable.index(n) for n in b.names]
        assert order == sorted(order, reverse=True), f"bucket {b.index} not in reverse registration order"
        for p, v in zip(b.params, b.views):  # every gradient lives in its bucket
            assert p.grad.data_ptr() == v.data_ptr()
    assert model.buckets[0].names[0] == trainable[-1]  # the last registered parameter opens the first bucket
    first = model.buckets[0]  # the small first bucket closed with the parameter that took it past 300 bytes
    assert first.nbytes >= 300 and first.nbytes - first.params[-1].numel() * first.buffer.element_size() < 300
    assert [len(b.names) for b in model.buckets] == [3, 1, 2, 1, 1]


def test_no_sync_on_an_unwrapped_model_raises():
    with pytest.raises(TypeError, match="not wrapped by gobrrr.parallel"):
        gp.no_sync(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="must be > 0"):
        gp.ddp(nn.Linear(2, 2), bucket_mb=0)


def test_bench_quick_runs_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    from gobrrr.bench.ddp import _baseline_tokens_per_gpu, main

    assert main(["--quick", "--variants", "plain,ddp"]) == 0  # the 2-rank spawn above runs every variant
    out = capsys.readouterr().out
    assert "ddp/plain" in out
    rec = json.loads((tmp_path / "ddp.jsonl").read_text().splitlines()[-1])
    plain = next(r for r in rec["rows"] if r["variant"] == "plain")
    assert rec["world_size"] == 1 and rec["figures"]["ddp_over_plain_step_time"] > 0
    # a later multi-GPU run reads this record as its single-GPU baseline
    assert _baseline_tokens_per_gpu(str(tmp_path / "ddp.jsonl")) == plain["tokens_per_s_per_gpu"]
