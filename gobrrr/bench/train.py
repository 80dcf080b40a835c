"""`gobrrr bench train`: `gobrrr train`'s step against a plain compiled loop, side by side, one GPU.

    gobrrr bench train                                  # 124m, T=1024, B = 8, 16, 64 on one GPU
    gobrrr bench train --breakdown --attention cudnn     # every variant with SDPA's cuDNN attention first
    gobrrr bench train --quick                          # CPU smoke: tiny GPT, eager, a few seconds

Variants (each its own copy of the same initial weights, fed the same batch):
  plain        written here, as a careful user would: the GPT with lm_head + F.cross_entropy,
               `torch.compile(model)` (one whole-model graph), bf16 autocast, SDPA (in the model),
               fused AdamW with nanoGPT's decay groups, clip_grad_norm_(1.0), zero_grad(set_to_none)
  plain-ro     the same with torch.compile(mode="reduce-overhead"): torch's own CUDA graphs (cudagraph
               trees) over the compiled forward and backward; the optimizer step stays eager
  gobrrr       what `gobrrr train` runs: `gobrrr.train.step.train_step` (the function gobrrr train calls)
               on the model as `setup_model` prepares it for one rank (one whole-model graph, chunked
               cross-entropy, the bias-GELU kernels),
               wrapped in gobrrr ddp (world size 1: collectives are no-ops), train's make_optimizer,
               and the learning rate set per step as gobrrr train does; on a GPU the whole step is
               replayed as one CUDA graph (`gobrrr.train.graph.GraphedStep`), as gobrrr train does there
  gobrrr-unfused  the same step with GPT's MLP as written (fc with its bias, then F.gelu) instead of
               gobrrr.ops.bias_gelu's kernels
  gobrrr-nograph  the same step issued kernel by kernel from Python (`--no-cuda-graph`)
  gobrrr-blocks  the same step compiled per block, as train compiles it past one rank
  gobrrr-std   the same step with lm_head + F.cross_entropy (eager head)
  gobrrr-eager / plain-eager   the two without torch.compile
  gobrrr-mat   compiled with mode "max-autotune-no-cudagraphs" (long compile)

--bf16-residual runs every variant, the plain ones included, with the residual stream between blocks
in bf16 (`gobrrr.train.step.bf16_residual`): a precision choice the user makes, so the baseline makes
it too and the ratio still compares like with like.

--attention cudnn runs every variant with SDPA's cuDNN attention tried first (GOBRRR_CUDNN_ATTENTION=1
in a run). It is a whole-run switch because a compiled graph bakes in the attention kernel chosen
while tracing and dynamo does not guard on that choice: two variants of one code object in one
process would share the first one's kernel. Compare two runs for its effect.

Per batch size, every variant first runs --warmup steps (the first one compiles: its wall time is
reported as compile_s, never inside tokens/s), then --rounds interleaved rounds of --steps steps
(order reversed every other round); a variant's step time is the median over rounds, from CUDA
events. Columns: tokens/s, MFU (GPT.flops_per_token over the peak in gobrrr/plan/machine.py's GPUS
table, the one GPU table), peak memory (peak_gb, GB = 1e9 bytes:
the highest allocation from the variant's build through its warm-up and one more step: weights,
gradients, AdamW state and the step's activations; a CUDA-graph variant peaks while its step is
recorded, and its pool keeps about that much afterwards),
host_ms: the host's time to issue one step (when it nears ms_per_step, Python is the limit), and
ratio = tokens/s over plain's in the same round. --breakdown adds, at the largest batch size: the
head + loss alone (plain lm_head + float32 F.cross_entropy eager and compiled, against the chunked
loss with its torch pass eager and compiled and with the Triton pass: time and peak memory), the
attention of all layers with each SDPA backend forced in turn (cuDNN, FlashAttention-2,
memory-efficient; q, k, v split from one (B, T, 3C) tensor as the model splits them), and the
gobrrr step's parts (forward+backward, clip + AdamW step). --kernels profiles the gobrrr step
(issued eagerly: the kernels a replayed graph runs) at the largest batch size and splits its device
time by kind of kernel (gobrrr/bench/kernels.py): matmul and attention with the rate they ran at, the
loss's softmax pass, the optimizer, the rest. The variants themselves are built in train_variants.py.
"""
from __future__ import annotations

import argparse
import copy
import gc
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from gobrrr.bench.common import device_name, median, print_table, record
from gobrrr.bench.train_variants import ALL, Variant, autocast_ctx, build

GB = 1e9  # decimal, as every byte figure gobrrr prints


@dataclass
class BenchConfig:
    model: str = "124m"
    seq_len: int = 1024
    batch_sizes: tuple[int, ...] = (8, 16, 64)
    variants: tuple[str, ...] = ("plain", "plain-ro", "gobrrr")  # plain-ro: torch's own CUDA graphs
    attention: str = "default"   # "cudnn": every variant tries SDPA's cuDNN kernels first
    steps: int = 10         # steps per variant per round
    rounds: int = 5
    warmup: int = 3         # untimed steps per variant (the first compiles)
    breakdown: bool = False
    kernels: bool = False   # profile the gobrrr step at the largest B: device time by kind of kernel
    compile: bool = True
    tune: bool = False      # inductor's coordinate-descent kernel tuning, for every compiled variant alike
    bf16_residual: bool = False  # every variant carries its residual stream in bf16 (train --bf16-residual)

    @staticmethod
    def quick() -> "BenchConfig":
        return BenchConfig(model="tiny", seq_len=32, batch_sizes=(4,), variants=("plain", "gobrrr"), steps=2,
                           rounds=2, warmup=1, breakdown=True, kernels=True, compile=False)


def _release(device: torch.device) -> None:
    """Free what earlier variants held (their CUDA graphs' pools sit in reference cycles until a collection)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync: benchmark boundary, outside timed work


def _time_steps(v: Variant, n: int, device: torch.device) -> tuple[float, float]:
    """(seconds per step on the device, host seconds to issue the first step into an empty queue:
    Python's cost of a step, before back-pressure from the launch queue hides it)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    v.step()
    host = time.perf_counter() - t0
    for _ in range(n - 1):
        v.step()
    if device.type != "cuda":
        host = (time.perf_counter() - t0) / n
    if device.type == "cuda":
        end.record()
        end.synchronize()  # sync: benchmark boundary
        return start.elapsed_time(end) / 1e3 / n, host
    return host, host


def run_batch(cfg: BenchConfig, base, B: int, device: torch.device, flops_tok: float, peak_flops) -> list[dict]:
    from gobrrr.train.data import SyntheticTokens

    # forget graphs compiled for another batch size: a run trains at one size, so every variant here
    # compiles for this B with static shapes, as it would in a run (not a dynamic-shape recompile)
    torch._dynamo.reset()
    src = SyntheticTokens(base.config.vocab_size, cfg.seq_len, B, seed=0)
    batch = tuple(t.to(device) for t in src.batch(0))  # (B, T) each
    variants = []
    failed = []
    for name in cfg.variants:
        if device.type == "cuda":  # the variant's whole footprint: weights, optimizer, the step (or its graph's pool)
            _sync(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        try:
            v = build(name, base, batch, device, cfg)
            _sync(device)
            t0 = time.perf_counter()
            v.step()  # compiles
            _sync(device)
            v.compile_s = time.perf_counter() - t0
            for _ in range(cfg.warmup - 1):
                v.step()
            _sync(device)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # one variant that cannot run (e.g. a compile error) must not hide the others
            failed.append({"B": B, "variant": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            print(f"  B={B} {name}: failed: {failed[-1]['error']}", flush=True)
            continue
        if device.type == "cuda":  # the highest point since the build: a graph's step peaks while it is recorded
            v.step()
            _sync(device)
            v.peak = torch.cuda.max_memory_allocated(device) - before
        v.times, v.host = [], []
        variants.append(v)
    for r in range(cfg.rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            dev_s, host_s = _time_steps(v, cfg.steps, device)
            v.times.append(dev_s)
            v.host.append(host_s)
    rows = []
    tokens = B * cfg.seq_len
    for v in variants:
        s = median(v.times)
        tok = tokens / s
        rows.append({"B": B, "variant": v.name, "ms_per_step": s * 1e3, "tokens_per_s": tok,
                     "mfu": flops_tok * tok / peak_flops if peak_flops else None,
                     "peak_gb": v.peak / GB if v.peak else None, "host_ms": median(v.host) * 1e3,
                     "compile_s": v.compile_s})
    rows += failed
    plain = next((r for r in rows if r["variant"] == "plain"), None) or next(
        (r for r in rows if r["variant"] == "plain-eager"), None)
    best = max((r["tokens_per_s"] for r in rows if r["variant"].startswith("plain") and "error" not in r),
               default=None)
    for row in rows:
        if "error" in row:
            continue
        row["ratio"] = row["tokens_per_s"] / plain["tokens_per_s"] if plain else None
        row["ratio_best"] = row["tokens_per_s"] / best if best else None
    return rows


def _timed(fn: Callable[[], None], device: torch.device, reps: int = 5) -> tuple[float, int]:
    """(median ms of fn, peak bytes above what was allocated before), after one untimed call."""
    fn()
    _sync(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else 0
    return median(times) * 1e3, peak


def _part(name: str, N: int, fn: Callable[[], None], device: torch.device) -> dict:
    try:
        ms, peak = _timed(fn, device)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:  # report it and go on with the other parts
        return {"part": name, "N": N, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    return {"part": name, "N": N, "ms": ms, "peak_gb": peak / GB}


def breakdown(cfg: BenchConfig, base, B: int, device: torch.device) -> list[dict]:
    """What limits the step: the head + loss alone, four ways; the gobrrr step's parts."""
    from gobrrr.ops import ChunkedCrossEntropy
    from gobrrr.ops.linear_ce import CHUNK_ELEMENTS
    from gobrrr.parallel import ddp
    from gobrrr.train.config import TrainConfig
    from gobrrr.train.data import SyntheticTokens
    from gobrrr.train.layout import make_optimizer
    from gobrrr.train.step import compile_scope, prepare_model

    N, C, V = B * cfg.seq_len, base.config.n_embd, base.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(N, C, generator=gen).to(device).requires_grad_()            # (N, C)
    w = (torch.randn(V, C, generator=gen) * 0.02).to(device).requires_grad_()   # (V, C)
    t = torch.randint(V, (N,), generator=gen).to(device)                         # (N,)
    autocast = autocast_ctx(device)

    def plain_head(x, w, t):
        return F.cross_entropy(F.linear(x, w), t)

    compiled_head = torch.compile(plain_head) if cfg.compile else plain_head
    heads = {"head: lm_head + F.cross_entropy, eager": plain_head,
             "head: lm_head + F.cross_entropy, compiled": compiled_head,
             "head: chunked, torch pass eager": ChunkedCrossEntropy(compile=False, kernel="torch"),
             "head: chunked, torch pass compiled": ChunkedCrossEntropy(compile=cfg.compile, kernel="torch"),
             "head: chunked, Triton pass (ce_rows; torch's on a CPU)": ChunkedCrossEntropy(compile=cfg.compile),
             "head: chunked x4 rows, Triton pass": ChunkedCrossEntropy(
                 compile=cfg.compile, chunk_rows=4 * max(1, CHUNK_ELEMENTS // V))}
    rows = []
    for name, fn in heads.items():
        def run(fn=fn):
            with autocast:
                loss = fn(x, w, t)
            loss.backward()
            x.grad = w.grad = None
        rows.append(_part(name, N, run, device))

    if device.type == "cuda":  # attention alone, all layers, each SDPA backend forced in turn
        from torch.nn.attention import SDPBackend, sdpa_kernel

        H, D = base.config.n_head, C // base.config.n_head
        qkv = torch.randn(B, cfg.seq_len, 3 * C, device=device, dtype=torch.bfloat16,
                          requires_grad=True)  # (B, T, 3C), split as the model splits it
        for label, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("FlashAttention-2", SDPBackend.FLASH_ATTENTION),
                               ("memory-efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def attn(backend=backend):
                with sdpa_kernel([backend]):
                    for _ in range(base.config.n_layer):
                        q, k, v = (z.view(B, cfg.seq_len, H, D).transpose(1, 2) for z in qkv.chunk(3, dim=2))
                        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()  # (B, H, T, D)
                qkv.grad = None
            rows.append(_part(f"attention x{base.config.n_layer} layers fwd+bwd, {label} only", N, attn, device))
        del qkv

    raw = copy.deepcopy(base)
    prepare_model(raw, compile=cfg.compile, scope=compile_scope(1),  # as train prepares it for one rank
                  residual_bf16=cfg.bf16_residual)
    model = ddp(raw)
    opt = make_optimizer(raw, TrainConfig(model="124m", lr=1e-4), device)
    src = tuple(tt.to(device) for tt in SyntheticTokens(V, cfg.seq_len, B, seed=0).batch(0))  # (B, T) each

    def fwd_bwd():
        with autocast:
            _, loss = model(*src)
        loss.backward()

    def opt_step():
        torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
        opt.step()

    fwd_bwd()
    opt_step()
    ms, peak = _timed(fwd_bwd, device)
    rows.append({"part": "gobrrr step: forward + backward", "N": N, "ms": ms, "peak_gb": peak / GB})
    ms, _ = _timed(opt_step, device)
    rows.append({"part": "gobrrr step: clip + fused AdamW", "N": N, "ms": ms, "peak_gb": None})
    return rows


def kernel_table(cfg: BenchConfig, base, B: int, device: torch.device, steps: int = 3) -> list[dict]:
    """The gobrrr step at batch B under the profiler: device time per step by kind of kernel."""
    from gobrrr.bench.kernels import profile_kernels, summarize
    from gobrrr.train.data import SyntheticTokens

    torch._dynamo.reset()
    _release(device)  # the timed variants' graphs and pools, before another copy of the model is built
    batch = tuple(t.to(device) for t in SyntheticTokens(base.config.vocab_size, cfg.seq_len, B, seed=0).batch(0))
    v = build("gobrrr-nograph", base, batch, device, cfg)
    for _ in range(max(1, cfg.warmup)):
        v.step()   # the first compiles
    kernels = profile_kernels(v.step, steps, device)
    tokens, c = B * cfg.seq_len, base.config
    return summarize(kernels, steps, matmul_flops=6.0 * base.num_params(include_position=False) * tokens,
                     attention_flops=12.0 * c.n_layer * c.n_embd * cfg.seq_len * tokens, top_other=8)


def main(argv: list[str] | None = None) -> int:
    d = BenchConfig()
    p = argparse.ArgumentParser(prog="gobrrr bench train", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CPU smoke: tiny GPT, eager, no results file")
    p.add_argument("--model", default=None, help=f"GPT config ({d.model})")
    p.add_argument("--seq-len", type=int, default=None, help=f"({d.seq_len})")
    p.add_argument("--batch-sizes", default=None, help=f"comma list ({','.join(map(str, d.batch_sizes))})")
    p.add_argument("--variants", default=None, help=f"comma list from {','.join(ALL)} ({','.join(d.variants)})")
    p.add_argument("--steps", type=int, default=None, help=f"steps per variant per round ({d.steps})")
    p.add_argument("--rounds", type=int, default=None, help=f"({d.rounds})")
    p.add_argument("--warmup", type=int, default=None, help=f"untimed steps, the first compiles ({d.warmup})")
    p.add_argument("--breakdown", action="store_true", default=None, help="head/loss and step parts at the largest B")
    p.add_argument("--kernels", action="store_true", default=None,
                   help="profile the gobrrr step at the largest B: device time by kind of kernel, matmul TFLOP/s")
    p.add_argument("--no-compile", dest="compile", action="store_false", default=None, help="every variant eager")
    p.add_argument("--attention", choices=["default", "cudnn"], default=None,
                   help="cudnn: every variant tries SDPA's cuDNN attention first (default: SDPA's own order)")
    p.add_argument("--tune", action="store_true", default=None,
                   help="inductor's coordinate-descent kernel tuning for every compiled variant (minutes to compile)")
    p.add_argument("--bf16-residual", dest="bf16_residual", action="store_true", default=None,
                   help="every variant (plain ones too) carries its residual stream in bf16, as train --bf16-residual")
    p.add_argument("--device", default=None, help="cpu or cuda (default cuda when available; --quick: cpu)")
    a = p.parse_args(argv)
    cfg = BenchConfig.quick() if a.quick else BenchConfig()
    for field in ("model", "seq_len", "steps", "rounds", "warmup", "breakdown", "kernels", "compile", "attention",
                  "tune", "bf16_residual"):
        if getattr(a, field) is not None:
            cfg = replace(cfg, **{field: getattr(a, field)})
    try:
        if a.batch_sizes:
            cfg = replace(cfg, batch_sizes=tuple(int(x) for x in a.batch_sizes.split(",") if x.strip()))
    except ValueError:
        p.error(f"--batch-sizes {a.batch_sizes!r} is not a comma list of integers; e.g. --batch-sizes 8,16,32")
    if a.variants:
        cfg = replace(cfg, variants=tuple(x.strip() for x in a.variants.split(",") if x.strip()))
    bad = [v for v in cfg.variants if v not in ALL]
    if bad:
        p.error(f"unknown variant(s) {bad}; choose from {', '.join(ALL)}")
    device = torch.device(a.device or ("cpu" if a.quick or not torch.cuda.is_available() else "cuda"))

    import gobrrr.comm as gd
    from gobrrr.models.gpt import GPT, GPTConfig
    from gobrrr.plan.machine import peak_flops

    rank = gd.init(device=device)  # ddp needs a process group; at world size 1 its collectives are no-ops
    try:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(0)
        base = GPT(GPTConfig.from_name(cfg.model)).to(rank.device)
        flops_tok = base.flops_per_token(cfg.seq_len)
        peak, peak_src = peak_flops(rank.device)
        title = (f"bench train: GPT {cfg.model} on {device_name(rank.device)}, T={cfg.seq_len}, median of "
                 f"{cfg.rounds} interleaved rounds x {cfg.steps} steps; attention {cfg.attention}; "
                 f"{'tuned kernels; ' if cfg.tune and cfg.compile else ''}"
                 f"{'bf16 residual stream; ' if cfg.bf16_residual else ''}MFU of {peak_src}")
        print(title, flush=True)
        rows, parts, kernels = [], [], []
        cols = ["B", "variant", "ms_per_step", "tokens_per_s", "mfu", "ratio", "ratio_best", "peak_gb", "host_ms",
                "compile_s", "error"]
        for B in cfg.batch_sizes:
            try:
                got = run_batch(cfg, base, B, rank.device, flops_tok, peak)
            except torch.cuda.OutOfMemoryError as e:
                print(f"  B={B}: out of memory ({str(e).splitlines()[0][:80]}); larger batch sizes skipped")
                break
            finally:
                _release(device)
            rows += got
            print_table(got, cols)
        largest = max(r["B"] for r in rows) if rows else cfg.batch_sizes[0]
        try:
            if cfg.breakdown:
                parts = breakdown(cfg, base, largest, rank.device)
                print_table(parts, ["part", "N", "ms", "peak_gb", "error"], title="what the step spends (largest B):")
            if cfg.kernels:
                kernels = kernel_table(cfg, base, largest, rank.device)
                print_table(kernels, ["category", "ms_per_step", "share", "tflops"],
                            title=f"the gobrrr step's device time by kind of kernel (B={largest}, profiled):")
        except torch.cuda.OutOfMemoryError as e:  # the timed rows above are still recorded
            print(f"  --breakdown/--kernels: out of memory ({str(e).splitlines()[0][:80]}); "
                  "rerun them with a smaller --batch-sizes")
    finally:
        gd.shutdown()
    figures = {}
    for r in rows:
        if r["variant"] == "gobrrr" and r.get("ratio") is not None:
            figures[f"ratio_B{r['B']}"] = r["ratio"]
            figures[f"ratio_best_B{r['B']}"] = r["ratio_best"]
        if r["variant"] == "gobrrr" and r.get("mfu") is not None:
            figures[f"mfu_B{r['B']}"] = r["mfu"]
    for key, value in figures.items():
        print(f"  {key}: {value:.3f}")
    if not a.quick:
        path = record("train", config=asdict(cfg), rows=rows, figures=figures, breakdown=parts, kernels=kernels,
                      world_size=1)
        print(f"  appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
