"""ZeRO checkpoints of a tensor-parallel model: records in the plain model's shapes, loadable at another dp and tp.

  * `tp.checkpoint.place` puts every contiguous range of every tp rank's local tensor (Split whole, along
    dim 0, dim 1, and a fused [q; k; v] along dim 0) exactly where that rank's elements sit in the
    global tensor (checked against index tensors, no process group);
  * one 4-rank spawn (gloo, CPU): zero(tp(GPT), AdamW, stage 1) over dp 2 x tp 2 trains 3 steps and
    saves; the checkpoint loads into dp 2 x tp 2 at stage 2, dp 1 x tp 4 at stage 1, dp 4 x tp 1 at
    stage 2, a plain (no tp) ZeRO-2 and ZeRO-3 over 4 ranks: every whole weight equals the saved one
    exactly (torch.equal; stages 1-2, which hold whole weights), and each of them, saved again, holds
    bitwise the saved weights and Adam moments (ZeRO-3 too); a one-step continuation at dp 1 x tp 4 matches
    dp 2 x tp 2's (rtol 1e-5, atol 1e-6: fp32, another summation order); what the plain ZeRO-2 model wrote
    loads back into dp 2 x tp 2 (the records are in the plain model's shape); gobrrr 0.1's 1-D records refuse
    a tp model in one CheckpointFitError;
  * a SIGKILL of rank 0 inside the second save (dp 2 x tp 2: DCP has written every rank's pieces, the
    folder is not yet renamed) leaves `latest` at the first checkpoint, which holds the weights of then;
  * in one process, `load_plain` + `reshape_like` give the plain GPT's state_dict, equal to the
    weights at save time; `export` writes the same tensors into one file.
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from gobrrr.comm.testing import SpawnError, spawn
from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.models.gpt_plan import GPT_PLAN
from gobrrr.parallel.tp.checkpoint import CheckpointFitError, place
from gobrrr.parallel.tp.parallelize import Split
from gobrrr.train.checkpoints import export

CFG = GPTConfig.from_name("tiny", n_head=4, n_embd=32)
B, T = 2, 16


def _local(glob: torch.Tensor, split: Split, t: int, n: int) -> torch.Tensor:
    """tp rank t's part of `glob` (what tp() keeps; tp_tensors.unshard undoes it)."""
    if split.dim is None:
        return glob
    d, c = split.dim, split.chunks
    parts = glob.unflatten(d, (c, glob.shape[d] // c)).chunk(n, dim=d + 1)
    return parts[t].flatten(d, d + 1).contiguous()


@pytest.mark.parametrize("split,shape", [(Split(None), (6, 5)), (Split(0), (8, 3)), (Split(1), (3, 8)),
                                         (Split(0, chunks=3), (12, 5)), (Split(0, chunks=3), (12,))])
def test_place_puts_every_range_where_its_elements_live(split, shape):
    n = 2
    glob = torch.arange(torch.Size(shape).numel()).view(shape)
    for t in range(n):
        local = _local(glob, split, t, n)
        flat = local.reshape(-1)
        for a, b in itertools.combinations(range(flat.numel() + 1), 2):
            pieces = place(list(local.shape), a, b, split, t, n)
            assert sum(p.of(flat[a:b]).numel() for p in pieces) == b - a
            for p in pieces:
                box = glob[tuple(slice(o, o + s) for o, s in zip(p.offsets, p.sizes))]
                assert p.of(flat[a:b]).is_contiguous()
                assert torch.equal(p.of(flat[a:b]), box), (split, t, a, b, p)


def _batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 256, (2 * B, T), generator=g), torch.randint(0, 256, (2 * B, T), generator=g)


def _build(tp_degree: int | None, stage: int, seed: int):
    """zero(tp(GPT), AdamW, stage) over the dp ranks of a (4 / tp, tp) mesh; tp None: no tp() at all."""
    from gobrrr.parallel import zero
    from gobrrr.parallel.mesh import make_mesh
    from gobrrr.parallel.tp.parallelize import tp

    torch.manual_seed(seed)
    model = GPT(CFG)
    group = None
    if tp_degree is not None:
        mesh = make_mesh(tp_degree)
        model, group = tp(model, mesh, GPT_PLAN), mesh["dp"].get_group()
    return zero(model, lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3), stage=stage, group=group)


def _whole(model) -> dict[str, torch.Tensor]:
    """The whole weights, on every rank: unsharded over tp (stages 1-2 hold whole compute parameters over dp)."""
    from gobrrr.parallel.tp.parallelize import tp_state
    from gobrrr.parallel.tp.tensors import full_state
    from gobrrr.parallel.zero.checkpoint import full_state_dict

    if tp_state(model.module) is None:
        return {k: v for k, v in full_state_dict(model).items() if k in dict(model.module.named_parameters())}
    return full_state(model.module)


def _step(model, opt, step: int, dp_rank: int, dp: int) -> torch.Tensor:
    x, y = _batch(step)
    rows = slice(dp_rank * (2 * B // dp), (dp_rank + 1) * (2 * B // dp))
    _, loss = model(x[rows], y[rows])
    loss.backward()
    opt.clip_grad_norm_(0.05)
    opt.step()
    opt.zero_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)  # every rank's loss: tp ranks alike, so the mean over dp
    return mean / 4


def _four_ranks(rank, folder: str):
    from gobrrr.parallel.zero import checkpoint as zc

    torch.set_num_threads(1)  # 4 ranks on a 2-core CI box: one thread each
    model, opt = _build(2, 1, 0)
    dp_rank = rank.rank // 2
    for s in range(3):
        _step(model, opt, s, dp_rank, 2)
    zc.save(model, f"{folder}/a")
    saved = {k: v.clone() for k, v in _whole(model).items()}  # replicated ones are the live parameters
    next_loss = _step(model, opt, 3, dp_rank, 2)
    layouts = [(2, 2), (4, 1), (1, 2), (None, 2), (None, 3)]  # (tp, stage); None: a plain ZeRO model, no tp()
    for k, (tp_degree, stage) in enumerate(layouts):
        other, other_opt = _build(tp_degree, stage, 1)  # other weights until loaded
        zc.load(other, f"{folder}/a")
        what = f"(dp 2, tp 2) -> (tp {tp_degree}, stage {stage})"
        if stage < 3:
            for name, w in _whole(other).items():
                assert torch.equal(w, saved[name]), f"{what}: {name}"
        zc.save(other, f"{folder}/b{k}")
        if tp_degree == 4:  # continue one step at another layout: the same loss as the saving layout's
            t = rank.rank // 4
            assert_close(_step(other, other_opt, 3, t, 1), next_loss, rtol=1e-5, atol=1e-6, msg=what)
    other, _ = _build(2, 2, 1)  # b3: written by the plain ZeRO-2 model, in the plain shapes tp can cut
    zc.load(other, f"{folder}/b3")
    for name, w in _whole(other).items():
        assert torch.equal(w, saved[name]), f"plain ZeRO-2 -> (dp 2, tp 2): {name}"
    if rank.rank == 0:  # gobrrr 0.1's records of a model without tp: 1-D
        import torch.distributed.checkpoint as dcp

        flat = {f"model/{k}": v.detach().reshape(-1) for k, v in GPT(CFG).named_parameters()}
        dcp.save(flat, checkpoint_id=f"{folder}/old", no_dist=True)
    dist.barrier()
    with pytest.raises(CheckpointFitError, match="saved 1-D, without tensor parallelism"):
        zc.load(other, f"{folder}/old")
    return saved if rank.rank == 0 else None


@pytest.mark.timeout(240)
def test_dp2_tp2_checkpoint_loads_at_other_dp_tp_stage_and_in_one_process(tmp_path):
    from gobrrr.parallel.zero import checkpoint as zc

    try:
        saved = spawn(_four_ranks, 4, str(tmp_path), timeout_s=200)[0]
    except SpawnError as e:
        pytest.fail(str(e), pytrace=False)
    a = zc.load_plain(tmp_path / "a")
    plain = zc.reshape_like(GPT(CFG), a["model"])  # the plain GPT's state_dict, whole tensors
    GPT(CFG).load_state_dict(plain)
    for name, w in saved.items():
        assert torch.equal(plain[name], w), name
    exported = torch.load(export(tmp_path / "a", tmp_path / "plain.pt"), weights_only=True)
    assert exported.keys() == a["model"].keys() and all(torch.equal(exported[k], v) for k, v in a["model"].items())
    assert set(a["optim"]) == set(saved)
    assert all({"exp_avg", "exp_avg_sq", "step"} <= set(v) for v in a["optim"].values())
    for k in range(5):  # every layout wrote back exactly what it read: weights and both Adam moments
        b = zc.load_plain(tmp_path / f"b{k}")  # a plain ZeRO model (k = 3, 4) writes 1-D records
        for name, w in a["model"].items():
            assert torch.equal(b["model"][name].view(w.shape), w), (k, name)
        for name, st in a["optim"].items():
            for key, v in st.items():
                assert torch.equal(b["optim"][name][key].view(v.shape), v), (k, name, key)


def _killed_inside_second_save(rank, folder: str):
    from tests.test_zero_ckpt import die_inside_second_save, zero_built

    torch.set_num_threads(1)
    model, opt = _build(2, 2, 0)
    return die_inside_second_save(rank, zero_built(rank, model, opt), folder,
                                  lambda i: _step(model, opt, i, rank.rank // 2, 2),
                                  lambda: {k: v.clone() for k, v in _whole(model).items()})


@pytest.mark.timeout(120)
def test_sigkill_during_a_dp2_tp2_save_leaves_the_previous_checkpoint(tmp_path):
    from tests.test_zero_ckpt import assert_first_checkpoint_survived

    out = tmp_path / "run"
    with pytest.raises(SpawnError) as info:
        spawn(_killed_inside_second_save, 4, str(out), timeout_s=90, pg_timeout_s=20)
    assert_first_checkpoint_survived(info.value, out, tmp_path / "after_step1.pt", CFG)
