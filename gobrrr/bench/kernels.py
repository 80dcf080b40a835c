"""Where a step's device time goes, by kind of kernel: `gobrrr bench train --kernels`.

A few steps run under torch.profiler (CUDA kernels on a GPU; ATen ops' own CPU time on a CPU), every
kernel is put in one category by its name, and each category gets its milliseconds per step, its
share of the summed kernel time, and, for matmuls and attention, the rate it ran at:

    matmul     cuBLAS / CUTLASS / nvjet GEMMs (every nn.Linear and the output head, forward and
               backward); rate = 6 N tokens / time, the 6N of MFU (N without position embeddings)
    attention  flash / cuDNN / efficient SDPA kernels and their backward's helpers (the dO.O row sums,
               dQ's conversion to 16 bits: "dot_do_o", "convert_dq"); rate = 12 L T C tokens / time,
               MFU's count (the full T x T scores; a causal kernel does about half of that work).
               cuDNN's kernels carry "flash" in their names too ("..._sdpa_sm90_flash_bprop_...")
    loss       the cross-entropy's softmax pass (kernels whose names carry logsumexp / log_softmax /
               nll / cross_entropy, and gobrrr.ops.ce_rows' Triton kernel)
    optimizer  AdamW and the gradient clip (multi_tensor_apply, fused Adam, foreach)
    copy       memcpy / memset
    other      everything else: LayerNorm, GELU, residual adds, casts (inductor's fused triton kernels
               and ATen's elementwise ones)

The categories are read off kernel names, so a new library version can move a kernel to "other";
the table prints the largest kernels of "other" (eight in `bench train --kernels`) so that such a
move shows, and so that the memory-bound work is itemized.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch

# first match wins: attention before matmul (cuDNN's SDPA kernels carry sm90 and gemm-like names)
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("attention", ("flash", "fmha", "sdpa", "attention", "attn", "dot_do_o", "convert_dq")),
    ("loss", ("logsumexp", "log_softmax", "nll_loss", "cross_entropy", "ce_rows")),
    ("optimizer", ("adam", "multi_tensor_apply", "foreach")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm",
                "aten::_addmm", "matmul")),
    ("copy", ("memcpy", "memset", "aten::copy_")),
]


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def summarize(kernels: list[tuple[str, float]], steps: int, *, matmul_flops: float = 0.0,
              attention_flops: float = 0.0, top_other: int = 3) -> list[dict]:
    """kernels: (name, microseconds) of every kernel over `steps` steps; *_flops: per step.
    Returns rows: category, ms per step, share of the summed kernel time, TFLOP/s where the FLOPs are known."""
    per = defaultdict(float)
    other = defaultdict(float)
    for name, us in kernels:
        cat = category(name)
        per[cat] += us
        if cat == "other":
            other[name] += us
    total = sum(per.values()) or 1.0
    flops = {"matmul": matmul_flops, "attention": attention_flops}
    rows = []
    for cat in [c for c, _ in CATEGORIES] + ["other"]:
        if cat not in per:
            continue
        ms = per[cat] / 1e3 / steps
        tflops = flops.get(cat, 0.0) / (ms / 1e3) / 1e12 if flops.get(cat) and ms > 0 else None
        rows.append({"category": cat, "ms_per_step": round(ms, 3), "share": round(per[cat] / total, 3),
                     "tflops": round(tflops, 1) if tflops else None})
    rows.append({"category": "sum of kernels", "ms_per_step": round(total / 1e3 / steps, 3), "share": 1.0,
                 "tflops": None})
    for name, us in sorted(other.items(), key=lambda kv: -kv[1])[:top_other]:
        rows.append({"category": f"  other: {name[:70]}", "ms_per_step": round(us / 1e3 / steps, 3),
                     "share": round(us / total, 3), "tflops": None})
    return rows


def profile_kernels(step: Callable[[], None], steps: int, device: torch.device) -> list[tuple[str, float]]:
    """Run `step` `steps` times under torch.profiler; (kernel name, microseconds) for each kernel run
    (on a CPU: each ATen op's own CPU time). One warm step first, outside the profile."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    step()
    if cuda:
        torch.cuda.synchronize(device)  # sync: benchmark boundary
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)  # sync: every kernel of the window has run before it closes
    out = []
    for e in prof.events():
        if cuda and e.device_type == DeviceType.CUDA:
            out.append((e.name, e.time_range.elapsed_us()))
        elif not cuda and e.name.startswith("aten::"):
            out.append((e.name, e.self_cpu_time_total))
    return out
