"""Smoke test of `gobrrr bench train --quick` on CPU: both variants run the same batch, the breakdown
prints, and a quick run writes no results record."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from gobrrr.bench.kernels import category, summarize
from gobrrr.bench.train import main


def test_bench_train_quick_runs_both_variants_and_the_breakdown(capsys):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["--quick"]) == 0
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    assert "plain-eager" in out and "gobrrr " in out and "ratio_B4:" in out
    for part in ("head: chunked, torch pass compiled", "head: chunked, Triton pass", "gobrrr step: clip + fused AdamW"):
        assert part in out, part
    assert "device time by kind of kernel" in out and "sum of kernels" in out   # --kernels, on the CPU's ops
    assert not (Path(os.environ["GOBRRR_BENCH_RESULTS"]) / "train.jsonl").exists()


# kernel names as torch.profiler reports them on an H200 (torch 2.11, CUDA 13) and on a CPU
KERNELS = {
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT": "matmul",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1": "matmul",
    "cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_256x128x64_1x2x1_0_tnn_align8_warpspecialized": "matmul",
    "aten::addmm": "matmul",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>":  # noqa: E501
        "attention",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128>>": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0": "attention",
    "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, void*, void*, unsigned int)":
        "attention",
    "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int, unsigned int)": "attention",
    "triton_red_fused__to_copy_exp_logsumexp_sub_0": "loss",
    "_ce_rows_kernel": "loss",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>": "optimizer",
    "aten::_fused_adamw_": "optimizer",
    "Memcpy DtoD (Device -> Device)": "copy",
    "triton_per_fused_add_native_layer_norm_native_layer_norm_backward_3": "other",
    "triton_poi_fused_gelu_gelu_backward_2": "other",
}


def test_kernel_categories_from_real_names():
    for name, want in KERNELS.items():
        assert category(name) == want, name


def test_summary_rates_and_shares():
    kernels = [("nvjet_gemm_a", 3000.0), ("nvjet_gemm_b", 1000.0), ("flash_fwd_kernel", 1000.0),
               ("triton_poi_fused_gelu_2", 500.0), ("triton_poi_fused_add_7", 500.0)]   # microseconds over 2 steps
    rows = {r["category"]: r for r in summarize(kernels, 2, matmul_flops=4e12, attention_flops=1e12)}
    assert rows["matmul"]["ms_per_step"] == 2.0 and rows["matmul"]["share"] == round(4000 / 6000, 3)
    assert rows["matmul"]["tflops"] == 2000.0                    # 4e12 FLOP per step in 2 ms
    assert rows["attention"]["tflops"] == 2000.0 and rows["other"]["ms_per_step"] == 0.5
    assert rows["sum of kernels"]["ms_per_step"] == 3.0
    assert any(k.startswith("  other: triton_poi_fused_gelu_2") for k in rows)
