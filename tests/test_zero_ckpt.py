"""ZeRO checkpoints through torch.distributed.checkpoint (CPU, gloo).

  * saved at 4 ranks stage 3, loaded at 2 ranks stage 1, saved again: bit-identical files' contents
    (model and optimizer state); loaded at 1 process as a plain state_dict: bit-identical to the
    weights at save time; training continued at 2 ranks matches single-process AdamW all along;
  * a SIGKILL inside a save leaves the previous checkpoint the one `latest` points at, loadable;
  * the streaming export writes one plain file equal to the checkpoint.
"""
from __future__ import annotations

import os
import signal

import pytest
import torch
from torch.testing import assert_close

import gobrrr.parallel as gp
from gobrrr.comm.testing import SpawnError, spawn
from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.parallel.zero import checkpoint as zc

CFG = GPTConfig(vocab_size=61, block_size=8, n_layer=2, n_head=2, n_embd=12, bias=False)
GLOBAL_ROWS = 4  # the same global batch at every world size


def make_opt(m):
    decay = [p for p in m.parameters() if p.dim() >= 2]
    rest = [p for p in m.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-2)


def batch(step: int):
    g = torch.Generator().manual_seed(step)
    return (torch.randint(0, CFG.vocab_size, (GLOBAL_ROWS, CFG.block_size), generator=g),
            torch.randint(0, CFG.vocab_size, (GLOBAL_ROWS, CFG.block_size), generator=g))


def steps(model, opt, first: int, last: int, rank: int, world: int) -> None:
    rows = GLOBAL_ROWS // world
    for s in range(first, last):
        x, y = batch(s)
        _, loss = model(x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows])
        loss.backward()
        opt.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()


def reference(n: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    m = GPT(CFG)
    opt = make_opt(m)
    for s in range(n):
        x, y = batch(s)
        m(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    return m.state_dict()


def wrapped(r, stage: int):
    torch.manual_seed(0)
    return gp.zero(GPT(CFG), make_opt, stage=stage)


def save_at(r, folder: str, stage: int, n: int):
    torch.set_num_threads(1)
    model, opt = wrapped(r, stage)
    steps(model, opt, 0, n, r.rank, r.world_size)
    sd = zc.full_state_dict(model)
    zc.save(model, folder, n, extra={"note": "hello"})
    return sd if r.rank == 0 else None


def load_continue_save(r, src: str, dst: str, stage: int, first: int, last: int):
    torch.set_num_threads(1)
    model, opt = wrapped(r, stage)
    extra = zc.load(model, src)
    zc.save(model, dst, first)  # an immediate re-save: must equal the source bit for bit
    steps(model, opt, first, last, r.rank, r.world_size)
    sd = zc.full_state_dict(model)
    return (extra, sd) if r.rank == 0 else None


@pytest.mark.timeout(240)
def test_reshard_4_ranks_stage3_to_2_ranks_stage1_to_one_plain_file(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    at_save = spawn(save_at, 4, a, 3, 3, timeout_s=120)[0]
    extra, continued = spawn(load_continue_save, 2, a, b, 1, 3, 5, timeout_s=120)[0]
    assert extra["step"] == 3 and extra["world_size"] == 4 and extra["stage"] == 3 and extra["extra"] == {"note": "hello"}

    plain_a, plain_b = zc.load_plain(a), zc.load_plain(b)
    for part in ("model", "optim"):
        assert plain_a[part].keys() == plain_b[part].keys()
    for k, v in plain_a["model"].items():
        assert torch.equal(v, plain_b["model"][k]), k
    for name, st in plain_a["optim"].items():
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"}, st.keys()
        for key, v in st.items():
            assert torch.equal(v, plain_b["optim"][name][key]), (name, key)

    # one process, no group: a plain state_dict equal to the weights at save time
    sd = zc.reshape_like(GPT(CFG), plain_a["model"])
    for k, v in at_save.items():
        assert torch.equal(sd[k], v), k
    GPT(CFG).load_state_dict(sd)  # loadable as is (tied head included)

    want = reference(5)  # and the resumed run trained on as if nothing happened
    for k in want:
        assert_close(continued[k], want[k], msg=lambda m: f"{k}: {m}")

    # streaming export: one torch.save file, the same tensors
    out = zc.export(a, tmp_path / "export.pt")
    exported = torch.load(out, weights_only=True)
    assert exported.keys() == plain_a["model"].keys()
    for k, v in exported.items():
        assert torch.equal(v, plain_a["model"][k]), k


@pytest.mark.usefixtures("one_thread")  # bitwise equal steps: one thread, one summation order for both models
def test_world_size_one_loads_into_a_wrapped_model(tmp_path):
    class R:
        rank, world_size = 0, 1
    model, opt = wrapped(R, 2)
    steps(model, opt, 0, 2, 0, 1)
    before = zc.full_state_dict(model)
    zc.save(model, tmp_path, 2)
    model2, opt2 = wrapped(R, 3)
    zc.load(model2, tmp_path)
    after = zc.full_state_dict(model2)
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    steps(model, opt, 2, 3, 0, 1)
    steps(model2, opt2, 2, 3, 0, 1)
    for k, v in zc.full_state_dict(model).items():
        assert torch.equal(zc.full_state_dict(model2)[k], v), k


def die_inside_second_save(rank: int, model, folder: str, step, whole) -> str:
    """step(0), save step 1 and keep its whole weights (`whole()`, by rank 0 into ../after_step1.pt),
    step(1), then rank 0 is SIGKILLed inside the second save, after DCP wrote the new shards and
    before the folder is renamed into place."""
    step(0)
    zc.save(model, folder, 1)
    sd = whole()
    if rank == 0:
        torch.save(sd, os.path.join(folder, "..", "after_step1.pt"))
    step(1)
    if rank == 0:
        zc.save_checkpoint = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    zc.save(model, folder, 2)
    return "saved"


def killed_inside_second_save(r, folder: str):
    torch.set_num_threads(1)
    model, opt = wrapped(r, 2)
    return die_inside_second_save(r.rank, model, folder, lambda i: steps(model, opt, i, i + 1, r.rank, r.world_size),
                                  lambda: zc.full_state_dict(model))


@pytest.mark.timeout(120)
def test_sigkill_during_save_leaves_the_previous_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    with pytest.raises(SpawnError) as info:
        spawn(killed_inside_second_save, 2, str(folder), timeout_s=90, pg_timeout_s=20)
    assert_first_checkpoint_survived(info.value, folder, tmp_path / "after_step1.pt", CFG)


def assert_first_checkpoint_survived(error: SpawnError, folder, saved_weights, model_cfg: GPTConfig) -> None:
    """A rank SIGKILLed inside the second save: `latest` still names step 1, whose whole weights equal
    `saved_weights` (a torch.save of them taken right after that save) for a GPT of `model_cfg`."""
    assert "exited with code -9" in error.failures[0], error.failures[0]
    assert zc.latest(folder).name.startswith("step-00000001.")
    assert (folder / ".tmp-step-00000002").is_dir()  # the half-finished save, never pointed at
    want = torch.load(saved_weights, weights_only=True)
    sd = zc.reshape_like(GPT(model_cfg), zc.load_plain(folder)["model"])
    for k, v in want.items():
        assert torch.equal(sd[k], v), k



class WithBuffer(torch.nn.Module):
    def __init__(self, shift: float):
        super().__init__()
        self.lin = torch.nn.Linear(3, 5)
        self.frozen = torch.nn.Linear(5, 5).requires_grad_(False)
        self.register_buffer("shift", torch.full((5,), shift))

    def forward(self, x):
        return (self.frozen(self.lin(x)) + self.shift).square().mean()


@pytest.mark.parametrize("stage", [2, 3])
def test_buffers_and_frozen_parameters_are_saved(tmp_path, stage):
    torch.manual_seed(0)
    model, opt = gp.zero(WithBuffer(0.5), lambda m: torch.optim.AdamW(m.lin.parameters(), lr=1e-2), stage=stage)
    model(torch.ones(2, 3)).backward()
    opt.step()
    zc.save(model, tmp_path, 1)
    torch.manual_seed(1)
    other, _ = gp.zero(WithBuffer(9.0), lambda m: torch.optim.AdamW(m.lin.parameters(), lr=1e-2), stage=3 - stage % 2)
    zc.load(other, tmp_path)
    want, got = model.state_dict(), other.state_dict()
    assert want.keys() == got.keys() and {"shift", "frozen.weight", "lin.weight"} <= set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
