"""gobrrr plan: the formulas against the reference GPT, autograd's saved tensors, the ZeRO paper's table,
nccl-tests' bus factors, the bench records, and the CLI's contract (rows, marks, one-line errors)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from gobrrr.models.gpt import GPT
from gobrrr.plan.cli import main
from gobrrr.plan.formulas import evaluate, plan
from gobrrr.plan.inputs import PRESETS, Batch, Layout, ModelShape, Options
from gobrrr.plan.machine import machine
from gobrrr.plan.memory import activation_bytes, model_state_bytes, saved_bytes, temp_bytes
from gobrrr.plan.timing import comm

REQUIRED = ("dp", "tp", "zero", "recompute", "sequence_parallel", "params", "param_bytes", "grad_bytes",
            "optimizer_bytes", "activation_bytes", "total_bytes", "fits", "comm_bytes_per_step", "step_s",
            "tokens_per_s")


@pytest.fixture
def no_records(tmp_path, monkeypatch):
    """An empty results folder, so defaults are used whatever bench/results holds."""
    monkeypatch.setenv("GOBRRR_BENCH_RESULTS", str(tmp_path))
    monkeypatch.setattr("gobrrr.plan.machine.REPO_RESULTS", tmp_path / "repo")
    return tmp_path


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_count_equals_the_reference_gpt_on_meta(name):
    shape = PRESETS[name]
    with torch.device("meta"):
        gpt = GPT(shape.gpt_config())
    assert shape.params() == gpt.num_params()
    assert shape.flops_per_token() == gpt.flops_per_token(shape.seq_len)
    assert shape.params_per_tp_rank(1) == shape.params()


def autograd_saved_bytes(model, run) -> int:
    """Bytes of the distinct non-parameter storages autograd saves while `run()` runs a forward of `model`.
    Also used by test_plan_crosscheck.py."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def _saved_by_autograd(shape: ModelShape, b: int, s: int, fused_loss=None, amp: bool = False,
                       res16: bool = False) -> int:
    """Bytes autograd saves during one forward on CPU (fp32, or fp32 weights under bf16 autocast: then
    autocast's weight copies are among them; res16: with train's bf16 residual stream)."""
    from gobrrr.train.step import bf16_residual

    torch.manual_seed(0)
    model = GPT(shape.gpt_config())
    bf16_residual(model, res16)
    if fused_loss is not None:
        model.fused_loss = fused_loss
    x = torch.randint(0, shape.vocab_size, (b, s))

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            model(x, x)

    return autograd_saved_bytes(model, run)


@pytest.mark.parametrize("shape,b", [(ModelShape("tiny", 2, 64, 2, 256, 64), 4),
                                     (ModelShape("wide-vocab", 3, 96, 4, 2048, 32), 2)])
def test_saved_activations_equal_what_autograd_saves(shape, b):
    measured = _saved_by_autograd(shape, b, shape.seq_len)
    predicted = saved_bytes(shape, Layout(1, 1), b, shape.seq_len, Options(precision="fp32", loss="full"))
    assert measured == pytest.approx(predicted, rel=0.01)
    # amp: fp32 residual stream, bf16 matmul inputs, and the bf16 weight copies autocast keeps
    amp = Options(precision="amp", loss="full")  # the model's own lm_head + F.cross_entropy
    measured = _saved_by_autograd(shape, b, shape.seq_len, amp=True)
    predicted = saved_bytes(shape, Layout(1, 1), b, shape.seq_len, amp) + temp_bytes(shape, Layout(1, 1), amp)[
        "autocast_bf16_weights"]
    assert measured == pytest.approx(predicted, rel=0.01)
    # amp-res16: the same with the stream between blocks in bf16 (train --bf16-residual)
    res16 = Options(precision="amp-res16", loss="full")
    measured = _saved_by_autograd(shape, b, shape.seq_len, amp=True, res16=True)
    predicted = saved_bytes(shape, Layout(1, 1), b, shape.seq_len, res16) + temp_bytes(shape, Layout(1, 1), res16)[
        "autocast_bf16_weights"]
    assert measured == pytest.approx(predicted, rel=0.01)


def test_chunked_loss_saves_what_the_plan_says():
    from gobrrr.ops import ChunkedCrossEntropy

    shape, b = ModelShape("wide-vocab", 2, 64, 2, 4096, 32), 2
    measured = _saved_by_autograd(shape, b, shape.seq_len, ChunkedCrossEntropy(chunk_rows=16))
    predicted = saved_bytes(shape, Layout(1, 1), b, shape.seq_len, Options(precision="fp32", loss="chunked"))
    assert measured == pytest.approx(predicted, rel=0.01)


def test_model_states_follow_the_zero_paper_table():
    shape, n = PRESETS["7b"], 8
    psi = shape.params()
    expect = {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}
    for stage, total in expect.items():
        assert sum(model_state_bytes(shape, Layout(n, 1, stage), "bf16")) == pytest.approx(total)
    # fp32 weights (amp or fp32): 8 psi + 8 psi / N at stage 1, 4 psi + 12 psi / N at stage 2
    assert sum(model_state_bytes(shape, Layout(n, 1, 1), "amp")) == pytest.approx(8 * psi + 8 * psi / n)
    assert sum(model_state_bytes(shape, Layout(n, 1, 2), "fp32")) == pytest.approx(4 * psi + 12 * psi / n)


def test_tensor_parallel_shards_add_up_to_the_model():
    shape = PRESETS["13b"]
    h, L = shape.n_embd, shape.n_layer
    replicated = shape.seq_len * h + L * 6 * h + 2 * h  # positions, LayerNorms, row-parallel biases, ln_f
    for t in (2, 4, 8):
        assert shape.params_per_tp_rank(t) * t - replicated * (t - 1) == shape.params()


def test_comm_bytes_use_nccl_bus_factors():
    shape, b, s = PRESETS["350m"], 2, 1024
    psi, opt = shape.params(), Options(precision="bf16")
    dp = comm(shape, Layout(4, 1, 0), b, s, 1, opt)
    assert dp["dp_all_reduce"][0] == pytest.approx(2 * 3 / 4 * 2 * psi)
    z3 = comm(shape, Layout(4, 1, 3), b, s, 1, opt)  # ZeRO-3: 3 psi elements each way, (n-1)/n on the bus
    assert z3["zero3_all_gather"][0] + z3["zero_reduce_scatter"][0] == pytest.approx(3 / 4 * 3 * 2 * psi)
    tp = comm(shape, Layout(1, 2, 0), b, s, 1, opt)["tp_all_reduce"]
    assert tp[0] == pytest.approx(2 * 1 / 2 * 2 * s * b * shape.n_embd * 4 * shape.n_layer)
    assert tp[1] == 4 * shape.n_layer  # 2 forward + 2 backward all-reduces per block
    sp = comm(shape, Layout(1, 2, 0, sequence_parallel=True), b, s, 1, opt)["tp_sp_reduce_scatter_all_gather"]
    assert sp[0] == tp[0] and sp[1] == 2 * tp[1]  # same bytes, twice the calls


def test_sharding_recompute_and_sp_lower_memory(no_records):
    shape, m, opt = PRESETS["7b"], machine("H200"), Options()
    batch = Batch(1, 4096)
    totals = [evaluate(shape, Layout(8, 1, z), batch, m, opt).total_bytes for z in range(4)]
    assert totals == sorted(totals, reverse=True)
    base = activation_bytes(shape, Layout(2, 4), 1, 4096, opt)
    assert activation_bytes(shape, Layout(2, 4, sequence_parallel=True), 1, 4096, opt) < base
    assert activation_bytes(shape, Layout(2, 4, recompute=True), 1, 4096, opt) < base
    assert "zero3_gathered_blocks" in temp_bytes(shape, Layout(8, 1, 3), opt)
    r0 = evaluate(shape, Layout(8, 1, 3), batch, m, opt)
    r1 = evaluate(shape, Layout(8, 1, 3, recompute=True), batch, m, opt)
    assert r1.compute_s == pytest.approx(r0.compute_s * 4 / 3)  # recompute = one more forward


def _write(path, rec):
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def test_bandwidths_hbm_and_mfu_come_from_records(no_records):
    d = no_records
    rows = [{"op": "all_reduce", "size": 1024, "time_us": 30.0, "busbw": 1.0},
            {"op": "all_reduce", "size": 1 << 28, "time_us": 900.0, "busbw": 480.0}]
    _write(d / "comm.jsonl", {"device": "NVIDIA H200", "time": "2027-01-01", "world_size": 8, "gpus": 8, "rows": rows})
    _write(d / "comm.jsonl", {"device": "NVIDIA H200", "time": "2027-01-02", "world_size": 16, "gpus": 8,
                              "rows": [dict(r, busbw=r["busbw"] / 10) for r in rows]})
    _write(d / "comm.jsonl", {"device": "NVIDIA A100", "time": "2027-01-03", "world_size": 8, "gpus": 8,
                              "rows": [dict(r, busbw=1.0) for r in rows]})  # another GPU: ignored
    _write(d / "p2p.jsonl", {"device": "NVIDIA H200", "time": "2027-01-01", "rows": [],
                             "figures": {"gpus": 1, "d2d_read_write_GBs": 4000.0}})
    _write(d / "ddp.jsonl", {"device": "NVIDIA H200", "time": "2027-01-01", "config": {"model": "124m", "batch_size": 16},
                             "rows": [{"variant": "plain", "mfu": 0.3}]})
    m = machine("H200", model="124m", prefer=("ddp",))
    assert m.intra.busbw_Bps == 480e9 and m.intra.latency_s == pytest.approx(30e-6)
    assert m.inter.busbw_Bps == 48e9
    assert m.hbm_Bps == 4000e9 and m.mfu == 0.3 and "bench ddp" in m.sources["mfu"]
    assert machine("H200", model="7b").mfu == 0.40  # the record is for another model
    _write(d / "train.jsonl", {"device": "NVIDIA H200", "time": "2027-01-01", "config": {"model": "124m"},
                               "rows": [{"B": 8, "variant": "gobrrr", "mfu": 0.41}, {"B": 16, "variant": "gobrrr", "mfu": 0.45},
                                        {"B": 16, "variant": "plain", "mfu": 0.2}]})
    assert machine("H200", model="124m", micro_batch=8).mfu == 0.41  # gobrrr train's step at that batch
    assert machine("H200", model="124m", micro_batch=4).mfu == 0.45  # else the largest batch measured
    assert machine("H200", model="124m", prefer=("ddp",)).mfu == 0.3
    fast = evaluate(PRESETS["124m"], Layout(8, 1, 0), Batch(8, 1024), m, Options())
    slow = evaluate(PRESETS["124m"], Layout(8, 1, 0), Batch(8, 1024), machine("H200", records=d / "none", model="124m",
                                                                              mfu=0.3), Options())
    assert fast.exposed_comm_s < slow.exposed_comm_s  # 480 GB/s measured against the 360 GB/s default


def test_best_rows_are_the_fastest_that_fit_and_the_rest_say_why(no_records):
    p = plan(PRESETS["13b"], machine("H200", mem_gb=80), Batch(1, 4096), gpus=16)
    best = [r for r in p.rows if r.best]
    assert 1 <= len(best) <= 3 and all(r.fits for r in best)
    fastest = max((r for r in p.rows if r.fits), key=lambda r: r.tokens_per_s)
    assert best[0] is fastest
    assert all(r.reason for r in p.rows)
    assert all(r.reason.startswith("does not fit") for r in p.rows if not r.fits)
    assert all(r.tp <= 8 for r in p.rows)  # tp stays inside a node
    assert all(r.global_batch == 16 for r in p.rows)  # the same batch for every layout


def test_cli_json_rows(no_records, capsys):
    assert main(["--model", "124m", "--gpus", "4", "--gpu-mem", "80", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(k in r for r in rows for k in REQUIRED)
    assert {(r["dp"], r["tp"]) for r in rows} == {(4, 1), (2, 2), (1, 4)}
    assert {r["zero"] for r in rows if r["dp"] > 1} == {0, 1, 2, 3}
    assert all(r["params"] == PRESETS["124m"].params() for r in rows)
    assert all(math.isclose(r["total_bytes"], r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"]
                            + r["activation_bytes"] + r["temp_bytes"]) for r in rows)


def test_cli_table_names_its_sources_and_marks_the_best(no_records, capsys):
    from gobrrr.cli import main as gobrrr_main

    assert gobrrr_main(["plan", "--layers", "4", "--width", "256", "--heads", "4", "--seq-len", "512",
                        "--gpus", "16", "--gpus-per-node", "4", "--gpu-mem", "24", "--global-batch", "64"]) == 0
    out = capsys.readouterr().out
    assert "default NVLink" in out and "default InfiniBand" in out and "MFU 40.0%" in out
    assert "\n*" in out and "slower" in out
    assert "tp 8: more than 4 GPUs per node" in out


@pytest.mark.parametrize("argv,words", [
    (["--model", "7x", "--gpus", "8"], "invalid choice"),
    (["--model", "7b"], "--gpus"),
    (["--model", "7b", "--gpus", "0"], "--gpus must be >= 1"),
    (["--model", "7b", "--gpus", "8", "--gpu-mem", "-1"], "--gpu-mem"),
    (["--layers", "2", "--gpus", "8"], "--layers, --width and --heads"),
    (["--layers", "2", "--width", "100", "--heads", "3", "--gpus", "1"], "not divisible by 3 heads"),
    (["--model", "124m", "--gpus", "8", "--global-batch", "7"], "no layout is possible"),
    (["--model", "124m", "--gpus", "1", "--seq-len", "0"], "must be >= 1"),
    (["--model", "124m", "--gpus", "1", "--gpu", "TPU"], "GOBRRR_PEAK_FLOPS its peak"),
    (["--model", "124m", "--gpus", "1", "--top", "0"], "--top must be >= 1"),
    (["--model", "124m", "--gpus", "1", "--records", "/no/such/folder"], "--records /no/such/folder: no such folder"),
])
def test_cli_bad_input_is_one_line_and_exit_2(no_records, capsys, argv, words):
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1
    assert err.startswith("gobrrr plan: error: ") and words in err
    assert "--peak-tflops" not in err  # no such flag


def test_a_bad_peak_in_the_environment_is_one_line(no_records, capsys, monkeypatch):
    monkeypatch.setenv("GOBRRR_PEAK_FLOPS", "fast")
    assert main(["--model", "124m", "--gpus", "1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "GOBRRR_PEAK_FLOPS='fast' is not a positive number" in line


def test_the_peak_from_the_environment_is_used_and_named(no_records, capsys, monkeypatch):
    """The same override as gobrrr train's and the benches' (machine.peak_flops): one table, one override."""
    base = machine("H200")
    monkeypatch.setenv("GOBRRR_PEAK_FLOPS", "2e15")
    m = machine("H200")
    assert m.peak_flops == 2e15 and base.peak_flops == 989e12 and "GOBRRR_PEAK_FLOPS" in m.sources["peak"]
    assert main(["--model", "124m", "--gpus", "1", "--top", "1"]) == 0
    assert "GOBRRR_PEAK_FLOPS 2000 TFLOP/s" in capsys.readouterr().out


def test_top_prints_that_many_rows(no_records, capsys):
    assert main(["--model", "124m", "--gpus", "4", "--format", "json", "--top", "2"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


@pytest.mark.parametrize("precision,bf16_advice", [("bf16", False), ("amp", True)])
def test_nothing_fits_says_what_to_do(no_records, capsys, precision, bf16_advice):
    """70b on one GPU: every ZeRO stage and recompute are in the table already, so the advice is GPUs
    (enough for the model states under ZeRO-3), a smaller micro-batch, and bf16 only when it is not
    already the precision (bf16 is the default)."""
    argv = ["--model", "70b", "--gpus", "1", "--micro-batch", "2"] + (["--precision", precision] if precision != "bf16" else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    (advice,) = [line for line in out.splitlines() if line.startswith("nothing fits")]
    assert " NO " in out and "--gpus 16" in advice and "need 9 GPUs' memory under ZeRO-3" in advice
    assert "--micro-batch" in advice
    assert ("--precision bf16" in advice) == bf16_advice
    assert "ZeRO-3 and recompute" not in advice  # the rows above already are ZeRO-3 and recompute


def _measured_train_peaks() -> dict[tuple[int, bool], float]:
    """{(B, bf16 residual): peak bytes} of gobrrr train's step for the 124m on an H200, the latest
    `gobrrr bench train` record of each (bench/results/train.jsonl, committed)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "results" / "train.jsonl"
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("config", {}).get("model") != "124m" or "H200" not in str(rec.get("device")):
            continue
        for row in rec.get("rows", []):
            peak = row.get("peak_gb", 0) * 1e9 or row.get("peak_gib", 0) * 2**30
            if row.get("variant") == "gobrrr" and peak:
                out[(row["B"], bool(rec["config"].get("bf16_residual")))] = peak
    return out


def test_the_default_loss_is_what_gobrrr_train_runs(no_records, capsys):
    """Issue 30: `gobrrr plan` sized a full (B, T, V) loss by default, 35.1 GB for the 124m at batch 32,
    against 13.0 GB measured for `gobrrr train`, which runs the chunked loss (vocab-parallel at tp > 1)."""
    assert Options().loss == "train"
    assert Options().loss_at(1) == "chunked" and Options().loss_at(2) == "full"
    assert Options(loss="full").loss_at(1) == "full"

    def first_row(*extra):
        assert main(["--model", "124m", "--gpus", "1", "--micro-batch", "32", "--format", "json", *extra]) == 0
        rows = json.loads(capsys.readouterr().out)
        return next(r for r in rows if (r["dp"], r["tp"], r["zero"], r["recompute"]) == (1, 1, 0, False))

    default, full = first_row(), first_row("--loss", "full")
    assert default["total_bytes"] == first_row("--loss", "chunked")["total_bytes"]
    assert default["total_bytes"] / 1e9 == pytest.approx(13.0, rel=0.05)   # the measured peak of issue 30
    assert full["total_bytes"] / 1e9 == pytest.approx(35.1, rel=0.02)      # what it said before
    # and against every committed measurement of gobrrr train's step (fp32 weights under autocast: "amp")
    peaks = _measured_train_peaks()
    assert len(peaks) >= 4, peaks
    for (b, res16), measured in peaks.items():
        precision = "amp-res16" if res16 else "amp"
        planned = evaluate(PRESETS["124m"], Layout(1, 1), Batch(b, 1024), machine("H200"), Options(precision))
        assert planned.total_bytes == pytest.approx(measured, rel=0.15), (b, precision)


def test_plan_check_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU message")
    from gobrrr.bench.plan_check import main as check_main

    assert check_main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_plan_check_quick_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from gobrrr.bench.plan_check import check

    rows = check([4], steps=3, warmup=1, train_steps=0)
    assert [(r["B"], r["recompute"]) for r in rows] == [(4, False), (4, True)]
    for r in rows:  # the plan's activations against torch.cuda.max_memory_allocated, within 15%
        assert abs(r["act_ratio"] - 1) <= 0.15, r


def test_train_row_is_the_plan_row_of_a_run(no_records):
    from gobrrr.models.gpt import GPTConfig
    from gobrrr.plan.formulas import summary, train_row

    row = train_row(GPTConfig.from_name("124m"), world_size=4, micro_batch=8, seq_len=1024, grad_accum=2,
                    gpu="NVIDIA H200", name="124m", zero=2)
    same = evaluate(PRESETS["124m"], Layout(4, 1, 2), Batch(8, 1024, 64), machine("H200", gpus_per_node=4),
                    Options(precision="amp"))
    assert row.as_dict() == same.as_dict() and row.grad_accum == 2
    line = summary(row)
    assert line.startswith("plan: dp4 tp1 z2") and "fits" in line and "\n" not in line
    with pytest.raises(ValueError, match="unknown GPU"):
        train_row(GPTConfig.from_name("tiny"), world_size=1, micro_batch=1, seq_len=8, gpu="cpu")
