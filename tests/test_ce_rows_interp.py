"""The Triton loss pass (gobrrr.ops.ce_rows) on a CPU, through Triton's interpreter (TRITON_INTERPRET=1):
the kernel's arithmetic against the torch pass it replaces, so CI checks it without a GPU
(tests/test_ce_rows_gpu.py runs it compiled on a GPU). Several slices per row with a partial last one,
a vocabulary smaller than a slice, ignored rows and extreme logits. The interpreter has to be chosen
before the kernel is defined, so the check runs in a fresh process."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _interpreter_missing() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (make setup installs it with the dev extras)"
    major, minor = (int(x) for x in importlib.metadata.version("triton").split(".")[:2])
    if (major, minor) < (3, 8):  # older interpreters trip over numpy 2's scalar conversion
        return f"Triton {major}.{minor}'s interpreter is too old for this numpy; 3.8 or newer runs it"
    return None


CHECK = r"""
import torch
from gobrrr.ops import ce_rows
from gobrrr.ops.linear_ce import _chunk_loss_and_grad

ce_rows.available = lambda t: True  # the interpreter runs the kernel on CPU tensors
torch.manual_seed(0)
for n, V, block in ((6, 1000, 256), (5, 3, 256), (4, 512, 256)):
    logits = torch.randn(n, V) * 3                     # (n, V)
    t = torch.randint(V, (n,))                          # (n,)
    t[1] = -100
    if V > 17:
        logits[2] += 3e4                                # far above zero
        logits[3, 17] = 1e4                             # one logit dominates
    scale = 1.0 / (t != -100).sum().float()
    ref_loss, ref_grad = _chunk_loss_and_grad(logits, t, scale, -100)
    work = logits.clone()
    ce_rows.BLOCK = block
    loss, grad = ce_rows.ce_rows(work, t, scale, -100)
    assert grad.data_ptr() == work.data_ptr()                         # written over the logits
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert torch.all(grad[1] == 0)                                    # the ignored row
loss, grad = ce_rows.ce_rows(torch.empty(0, 10), torch.empty(0, dtype=torch.long), scale, -100)
assert loss.item() == 0 and grad.shape == (0, 10)                     # no rows: nothing launched
print("interpreted ce_rows matches")
"""


MISSING = _interpreter_missing()


def run_interpreted(code: str, done: str, timeout: float = 300) -> None:
    """Run `code` in a fresh Python under Triton's interpreter; it must exit 0 and print `done`."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert done in proc.stdout


@pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
def test_ce_rows_arithmetic_under_the_triton_interpreter():
    run_interpreted(CHECK, "interpreted ce_rows matches", timeout=180)
