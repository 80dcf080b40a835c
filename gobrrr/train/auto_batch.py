"""The default batch size on a GPU: as many rows as the step needs to keep the GPU busy, and fit.

    B, line = auto_batch_size(raw, device, seq_len, grad_accum=1)   # before the model is wrapped

A short probe, eager, before anything else is on the GPU:
  1. forward + backward of the model at B = 1 and B = 2 (token id 0 everywhere: no RNG drawn, so
     the run's random stream is the same whether the size was probed or given), reading the peak
     allocated memory after each (`# sync:` twice, once per run, before training starts);
  2. per-row memory = peak(2) - peak(1); fixed memory = peak(1) - per-row, plus AdamW's two
     float32 moments (8 bytes per parameter) that do not exist yet;
  3. B = the largest power of two with fixed + B x per-row <= FILL x free memory, capped at
     TARGET_TOKENS / seq_len rows, and at least 1. Past 64k tokens a bigger micro-batch raises
     tokens/s a little (the 124m on an H200 at T = 1024 with --bf16-residual: 3.5% from B = 64 to
     B = 256, BENCHMARKS.md, `train`) while it changes the training itself (a quarter as many
     optimizer steps for the same tokens), so the default stops there; `--batch-size` goes further.
Eager activations are larger than compiled ones, so the estimate errs on the safe side. Under
several ranks every rank probes and all take the smallest answer (one all-reduce).

`underuse_hint` is the cheaper half for a size given by hand: after some steps, the peak memory
says how much larger a batch would fit.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

FILL = 0.80                 # fraction of the free memory the estimate may use
TARGET_TOKENS = 64 * 1024   # rows x seq_len per micro-step beyond which the probe stops growing B
MAX_ROWS = 1024
GB = 1e9  # printed memory in GB = 1e9 bytes, as gobrrr plan's line beside it (issue 30 item 13)


def _peak_bytes(model: nn.Module, rows: int, seq_len: int, device: torch.device) -> int:
    torch.cuda.reset_peak_memory_stats(device)
    idx = torch.zeros(rows, seq_len, dtype=torch.long, device=device)  # (rows, T)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, loss = model(idx, idx)
    loss.backward()
    peak = torch.cuda.max_memory_allocated(device)  # sync: probe only, before training
    for p in model.parameters():
        p.grad = None
    return peak


def auto_batch_size(model: nn.Module, device: torch.device, seq_len: int) -> tuple[int, str]:
    """(rows per micro-step, a one-line explanation) for `model` on the GPU `device`."""
    free, total = torch.cuda.mem_get_info(device)
    in_use = torch.cuda.memory_allocated(device)
    p1 = _peak_bytes(model, 1, seq_len, device)
    p2 = _peak_bytes(model, 2, seq_len, device)
    per_row = max(1, p2 - p1)
    n_params = sum(p.numel() for p in model.parameters())
    fixed = max(0, p1 - per_row - in_use) + 8 * n_params  # + AdamW moments, not allocated yet
    budget = FILL * (free + in_use) - in_use - fixed
    fits = max(1, int(budget // per_row))
    cap = max(1, min(MAX_ROWS, TARGET_TOKENS // seq_len))
    rows = 1
    while rows * 2 <= min(fits, cap):
        rows *= 2
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = torch.tensor([rows], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)  # every rank must use the same size
        rows = int(t.item())  # sync: once, before training
    line = (f"batch size {rows} per rank (auto: {per_row / GB:.2f} GB per row of {seq_len} tokens, "
            f"{free / GB:.0f} of {total / GB:.0f} GB free, {fits} rows would fit, cap {cap}; "
            f"--batch-size sets it)")
    return rows, line


def underuse_hint(rows: int, seq_len: int, peak_bytes: int, total_bytes: int, n_params: int) -> str | None:
    """A one-line hint when a hand-picked batch leaves the GPU underused and a larger one would fit
    (up to the probe's cap), else None."""
    fixed = 16 * n_params  # weights, gradients and AdamW moments in float32
    per_row = max(1.0, (peak_bytes - fixed) / max(1, rows))
    fits = int((FILL * total_bytes - fixed) // per_row)
    limit = min(fits, max(1, min(MAX_ROWS, TARGET_TOKENS // seq_len)))
    suggest = 1
    while suggest * 2 <= limit:
        suggest *= 2
    if suggest <= rows:
        return None
    return (f"hint: batch size {rows} peaked at {peak_bytes / GB:.1f} of {total_bytes / GB:.0f} GB; about "
            f"{fits} rows would fit and {suggest} x {seq_len} tokens keep the GPU busier (--batch-size {suggest}, "
            "or omit --batch-size to choose automatically)")
