"""gobrrr lint against a real GPU: every line the lint flags makes the host wait, and its quiet neighbours do not.

Each case is a small function `run()` with a three-step training loop on "cuda" (TEMPLATE) and a few lines of
its own inside the loop. A line marked `# flagged` is one the case is about: the lint must report it; a line
marked `# quiet` is its neighbour: the lint must not. The lines the test then holds to the runtime truth are
the lint's own findings, from `lint_source(snippet, "case.py")`, never a hard-coded list.

The truth: the snippet is compiled with filename "case.py", run once to warm up (CUDA context, cuBLAS,
allocator), then run again under `torch.cuda.set_sync_debug_mode("warn")`. torch raises its warning
"called a synchronizing CUDA operation" from c10::cuda::memcpy_and_sync, stream_synchronize and
device_synchronize: `.item()`, `float(t)`, `bool(t)` (`if t > 0:`, the builtin `any()` of a tensor), nonzero
and boolean masks (they read the result's size), and every blocking copy between host and device, in either
direction and from pinned or pageable memory (aten/src/ATen/native/cuda/Copy.cu: `non_blocking=False` goes
through memcpy_and_sync), which covers `.cuda()`, `.to("cuda")`, `torch.tensor(list, device="cuda")` and a
CPU or numpy index moved to the device by advanced indexing. The warning reaches Python when the op returns,
so a hook on `warnings.showwarning` walks the stack up to the first frame of "case.py" (a sync inside torch's
own Python code, as in a distribution's argument validation, is put on the user's line that called it).

What the lint reports that the debug mode cannot see, and so is left out of the cases here:
  GB005  `x.to(dev, non_blocking=True)` of pageable memory. torch calls cudaMemcpyAsync and no sync function
         (Copy.cu's non_blocking branch); the driver stages the bytes through a pinned bounce buffer and the
         host waits for that, inside the CUDA call, where the debug mode has no hook. gobrrr's watch_syncs sees
         it through its wrapper around `to/cuda/copy_`; tests/test_syncs_gpu.py covers that.
  GB006  a DataLoader without pin_memory: the finding is on the constructor line, which never syncs; the wait
         it causes is at the copy of each batch (GB009, tested here).
  GB012  `dist.barrier()`: torch's docs say torch.distributed is not covered by the debug mode yet.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from gobrrr.lint.check import lint_source

SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's text, c10/cuda/CUDAFunctions.cpp
NOT_A_SYNC_POINT = {"GB005", "GB006"}  # see the module docstring
FILENAME = "case.py"

TEMPLATE = '''\
import numpy as np
import torch


def run():
    model = torch.nn.Linear(4, 1, device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
{setup}    for step in range(3):
        x = torch.randn(8, 4, device="cuda")
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
{body}'''

# name -> (lines before the loop, lines inside the loop)
CASES = {
    "item_of_the_loss": ("", """
        total = loss.item()  # flagged
        last = loss.detach()  # quiet
    """),
    "float_of_a_device_scalar": ("", """
        total = float(loss)  # flagged
    """),
    "device_scalar_as_a_condition": ("", """
        if loss > 0:  # flagged
            pass
    """),
    "builtin_any_of_a_device_tensor": ("", """
        t = x.sum(1)
        if any(t > 0):  # flagged
            pass
        flag = (t > 0).any()  # quiet
    """),
    "boolean_mask": ("", """
        m = x > 0
        y = x[m]  # flagged
        z = torch.where(m, x, 0)  # quiet
    """),
    "nonzero": ("", """
        idx = torch.nonzero(x)  # flagged
    """),
    "bincount_sizes_its_output_from_the_max": ("", """
        counts = torch.bincount((x > 0).long().flatten())  # flagged
    """),
    "python_list_read_with_a_device_scalar": ("""
        names = ["a", "b", "c", "d"]
    """, """
        label = x.sum(0).argmax()
        name = names[label]  # flagged
        first = names[0]  # quiet
    """),
    "tuple_of_ints_as_an_index": ("", """
        y = x[:, (2, 1, 0)]  # flagged
    """),
    "ints_unpacked_from_a_host_permutation": ("", """
        perm = torch.randperm(8)
        i, j = perm[:2]
        y = x[i] + x[j]  # quiet
    """),
    "cpu_index_tensor": ("""
        idx = torch.arange(4)
    """, """
        y = x[idx]  # flagged
    """),
    "numpy_index_array": ("""
        idx = np.arange(4)
    """, """
        y = x[idx]  # flagged
    """),
    "tensor_of_a_host_list": ("""
        vals = [1.0, 2.0]
    """, """
        w = torch.tensor(vals, device="cuda")  # flagged
    """),
    "from_numpy_then_to_cuda": ("""
        a = np.ones(4, dtype=np.float32)
    """, """
        w = torch.from_numpy(a).to("cuda")  # flagged
    """),
    "pinned_non_blocking_copy": ("""
        p = torch.ones(4).pin_memory()
    """, """
        w = p.to("cuda", non_blocking=True)  # quiet
        v = p.to("cuda")  # flagged
    """),
    "cuda_of_a_pageable_batch": ("""
        loader = iter(torch.utils.data.DataLoader(torch.randn(24, 4), batch_size=8))
    """, """
        w = next(loader).cuda()  # flagged
    """),
    "categorical_with_validation": ("", """
        probs = torch.softmax(x, 1)
        d = torch.distributions.Categorical(probs)  # flagged
        e = torch.distributions.Categorical(probs, validate_args=False)  # quiet
    """),
    "element_write_of_a_python_number": ("""
        r = torch.zeros(8, device="cuda")
    """, """
        r[step] = 0.5  # flagged
        r[step] += 0.5  # quiet
        r[2:4] = 1.0  # quiet
    """),
    "number_written_through_an_index_tensor": ("""
        buf = torch.zeros(8, 4, device="cuda")
        zero = torch.zeros((), device="cuda")
    """, """
        idx = x.argmax(1)
        buf[idx] = 0  # flagged
        _, top = x.topk(2)
        buf[top] = -1.5  # flagged
        buf[idx] = zero  # quiet
        buf.index_fill_(0, idx, 0)  # quiet
        buf[idx] += 1  # quiet
        buf[x > 0] = 0  # quiet
    """),
    "any_kept_in_device_arithmetic": ("", """
        y = x * (x > 0).any()  # quiet
    """),
    "item_of_a_cpu_tensor": ("""
        c = torch.ones(())
    """, """
        v = c.item()  # quiet
    """),
    "masked_writes": ("""
        buf = torch.zeros(4, 8, device="cuda")
        rows = torch.arange(2, device="cuda")
    """, """
        m = x[0] > 0
        m8 = torch.cat([m, m])
        buf[1, m8] = 0  # quiet
        buf[:, m8] = 0  # quiet
        buf[rows[:, None], m8] = 0  # flagged
        buf[:, m8] *= 2  # flagged
    """),
    "number_written_through_two_masks": ("""
        H = torch.ones(8, 8, device="cuda")
    """, """
        dead = torch.diag(H) > 2
        H[dead, dead] = 1  # flagged
        H[:, dead] = 0  # quiet
    """),
    "legacy_cuda_type_alias_mask": ("""
        ByteTensor = torch.cuda.ByteTensor if torch.cuda.is_available() else torch.ByteTensor
        q = torch.zeros(4, device="cuda")
        flags = [1, 0, 1, 0]
    """, """
        keep = ByteTensor(tuple(f > 0 for f in flags))  # flagged
        q[keep.bool()] = x[:2, 0]  # flagged
    """),
    "non_blocking_read_back": ("", """
        queued = loss.detach().to("cpu", non_blocking=True)  # quiet
        read = loss.detach().to("cpu")  # flagged
    """),
    "legacy_cuda_constructor": ("""
        sizes = [3, 4]
    """, """
        s = torch.cuda.LongTensor(sizes)  # flagged
        scratch = torch.cuda.FloatTensor(4, 3)  # quiet
    """),
    "appended_positions_index": ("", """
        row = []
        for i in range(3):
            row.append(i)
        pairs = x[:, row]  # flagged
        first = x[:, 0:3]  # quiet
    """),
    "device_parameter_numpy_index": ("""
        memory = torch.nn.Parameter(torch.zeros(16, 4).to("cuda"), requires_grad=False)
        nodes = np.array([1, 5, 7])
    """, """
        emb = memory[nodes]  # flagged
        block = memory[2:5]  # quiet
    """),
    "asserted_numpy_schedule": ("""
        betas = np.linspace(0.1, 0.2, 5)
    """, """
        assert isinstance(betas, np.ndarray)
        skip = (1.0 - betas)[1:].prod().item()  # quiet
        shown = loss.item()  # flagged
    """),
}


def snippet(setup: str, body: str) -> str:
    def block(text: str, indent: int) -> str:
        text = textwrap.dedent(text).strip("\n")
        return textwrap.indent(text, " " * indent) + "\n" if text else ""
    return TEMPLATE.format(setup=block(setup, 4), body=block(body, 8))


def marked(src: str, tag: str) -> set[int]:
    return {i for i, text in enumerate(src.splitlines(), 1) if text.rstrip().endswith(f"# {tag}")}


def flagged(src: str) -> dict[int, str]:
    """The lint's findings that name a line where the host should wait: line -> rule."""
    return {f.line: f.rule for f in lint_source(src, FILENAME) if f.rule not in NOT_A_SYNC_POINT}


def synced_lines(src: str) -> set[int]:
    """The lines of the snippet where torch's sync debug mode saw the host wait for the device."""
    namespace: dict = {}
    exec(compile(src, FILENAME, "exec"), namespace)
    namespace["run"]()  # warm-up, unwatched
    torch.cuda.synchronize()
    hits: set[int] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING not in str(message):
            return
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != FILENAME:
            frame = frame.f_back
        hits.add(frame.f_lineno if frame is not None else -1)  # -1: a sync outside the snippet's frames

    before = torch.cuda.get_sync_debug_mode()
    validating = torch.distributions.Distribution._validate_args
    # torch's default, whatever ran before in this process: the first torch.compile turns validation off for
    # the whole process (see test_torch_compile_turns_validation_off_for_the_process)
    torch.distributions.Distribution.set_default_validate_args(True)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            namespace["run"]()
        finally:
            torch.cuda.set_sync_debug_mode(before)
            torch.distributions.Distribution.set_default_validate_args(validating)
    torch.cuda.synchronize()
    return hits


@pytest.mark.parametrize("name", list(CASES))
def test_the_lint_reads_each_case_as_marked(name):
    """Without a GPU: the lint flags each case's `# flagged` lines and none of its `# quiet` ones, so the cases
    the GPU test runs stay about what they say."""
    src = snippet(*CASES[name])
    found = flagged(src)
    assert marked(src, "flagged") <= set(found) and not marked(src, "quiet") & set(found), (name, found)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_what_the_lint_flags_syncs_on_a_gpu_and_its_quiet_neighbours_do_not(name):
    src = snippet(*CASES[name])
    found = flagged(src)
    numbered = "\n".join(f"{i:3d}  {t}" for i, t in enumerate(src.splitlines(), 1))
    # the case still shows what it is about (the lint's own tests hold the details)
    assert marked(src, "flagged") <= set(found), f"the lint no longer flags the case's line:\n{numbered}"
    assert not marked(src, "quiet") & set(found), f"the lint flags a quiet neighbour:\n{numbered}"

    synced = synced_lines(src)
    missed = {line: rule for line, rule in found.items() if line not in synced}
    assert not missed, f"flagged, but the host never waited there: {missed}; synced lines {sorted(synced)}\n{numbered}"
    noisy = marked(src, "quiet") & synced
    assert not noisy, f"quiet neighbour lines that synced: {sorted(noisy)}\n{numbered}"


_VALIDATION_PROBE = """
import warnings, torch
def syncs():
    probs = torch.softmax(torch.randn(8, 4, device="cuda"), 1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            torch.distributions.Categorical(probs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return any("synchroniz" in str(x.message) for x in w)
syncs()
before = syncs()
torch.compile(torch.nn.Linear(4, 4).cuda())   # created, never run
print(before, syncs())
"""


@pytest.mark.gpu
def test_torch_compile_turns_validation_off_for_the_process():
    """The premise of the lint's rule that a compiling project validates no distribution (GB013 stays quiet): in a
    fresh process a Categorical syncs (argument validation reads its check back), and after one torch.compile
    call, even one never run, it does not (torch/_dynamo/eval_frame.py, TorchPatcher.patch). Found when this
    file's Categorical case passed alone and failed after a compiled test in the same process."""
    out = subprocess.run([sys.executable, "-c", _VALIDATION_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["True", "False"], out.stdout

