"""The reference GPT and its data sources (CPU): shapes, causality, parameter and FLOP counts,
deterministic batches and the rank slicing that makes W ranks see one rank's global batch."""
from __future__ import annotations

import math

import pytest
import torch

from gobrrr.models.gpt import GPT, GPTConfig
from gobrrr.train.data import DEFAULT_CORPUS, CharCorpus, SyntheticTokens

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one OpenMP thread


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("tiny", **overrides))


def test_forward_shapes_and_initial_loss():
    model = tiny()
    idx = torch.randint(256, (3, 16))
    logits, loss = model(idx)
    assert logits.shape == (3, 16, 256) and loss is None
    logits, loss = model(idx, torch.randint(256, (3, 16)))
    assert loss.shape == () and loss.dtype == torch.float32
    # small init: the first prediction is close to uniform over the 256 bytes (random targets;
    # targets equal to the inputs would score better, as the tied head favours the input token)
    assert abs(loss.item() - math.log(256)) < 0.3


def test_causal_future_tokens_do_not_change_the_past():
    model = tiny().eval()
    a = torch.randint(256, (2, 20))
    b = a.clone()
    b[:, 12:] = torch.randint(256, (2, 8))
    la, _ = model(a)
    lb, _ = model(b)
    torch.testing.assert_close(la[:, :12], lb[:, :12])
    assert not torch.allclose(la[:, 12:], lb[:, 12:])


def test_weight_tying_and_param_count_matches_a_hand_count():
    model = tiny()
    assert model.lm_head.weight is model.wte.weight
    c = model.config
    C, L, V, P = c.n_embd, c.n_layer, c.vocab_size, c.block_size
    per_block = (2 * 2 * C) + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    expected = V * C + P * C + L * per_block + 2 * C  # tied head counted once; final LayerNorm
    assert model.num_params() == expected
    assert model.num_params(include_position=False) == expected - P * C


def test_124m_is_gpt2_small_sized():
    with torch.device("meta"):  # no memory, no init cost
        model = GPT(GPTConfig.from_name("124m"))
    n = model.num_params()
    assert 123e6 < n < 126e6, n
    # 6N + 12 L C T at T = 1024 (PaLM appendix B)
    c = model.config
    assert model.flops_per_token(1024) == 6 * model.num_params(include_position=False) + 12 * c.n_layer * c.n_embd * 1024


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown GPT config 'huge'"):
        GPTConfig.from_name("huge")
    with pytest.raises(ValueError, match="n_heads"):
        GPTConfig.from_name("tiny", n_heads=3)
    with pytest.raises(ValueError, match="not divisible"):
        GPTConfig.from_name("tiny", n_head=3)
    with pytest.raises(ValueError, match="block_size"):
        tiny()(torch.zeros(1, 65, dtype=torch.long))


def test_a_few_steps_learn_a_repeated_batch():
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = CharCorpus(32, 4, seed=1).batch(0)
    first = None
    for _ in range(30):
        _, loss = model(x, y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.6 * first


# ---------------------------------------------------------------- data

def test_corpus_is_the_shipped_public_domain_text():
    text = DEFAULT_CORPUS.read_bytes()
    assert len(text) >= 200_000
    assert text.startswith(b"First Citizen:")
    assert (DEFAULT_CORPUS.parent / "README.txt").read_text().count("public domain") >= 1


def test_charcorpus_batches_are_shifted_windows_and_deterministic():
    c = CharCorpus(32, 4, seed=7)
    x, y = c.batch(5)
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    # every row is a real window of the text
    text = c.data.long()
    for row_x, row_y in zip(x, y):
        seq = torch.cat([row_x, row_y[-1:]])
        hits = (text.unfold(0, 33, 1) == seq).all(dim=1)
        assert hits.any()
    x2, y2 = CharCorpus(32, 4, seed=7).batch(5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, c.batch(6)[0])
    assert not torch.equal(x, CharCorpus(32, 4, seed=8).batch(5)[0])
    assert "Citizen" in c.decode(torch.tensor(list(b"Citizen")))


def test_ranks_see_slices_of_the_one_rank_global_batch():
    for W in (2, 4):
        full = CharCorpus(16, 2 * W, seed=3).batch(11)
        parts = [CharCorpus(16, 2, seed=3, rank=r, world_size=W).batch(11) for r in range(W)]
        assert torch.equal(torch.cat([p[0] for p in parts]), full[0])
        assert torch.equal(torch.cat([p[1] for p in parts]), full[1])
    syn_full = SyntheticTokens(1000, 8, 4, seed=2).batch(3)
    syn_parts = [SyntheticTokens(1000, 8, 2, seed=2, rank=r, world_size=2).batch(3) for r in range(2)]
    assert torch.equal(torch.cat([p[0] for p in syn_parts]), syn_full[0])


def test_val_split_is_disjoint_from_train_and_range_is_sized():
    train = CharCorpus(32, 2, split="train")
    val = CharCorpus(32, 2, split="val")
    assert len(train) + len(val) == len(DEFAULT_CORPUS.read_bytes())
    assert torch.equal(val.data[:100], torch.frombuffer(bytearray(DEFAULT_CORPUS.read_bytes()[len(train):len(train) + 100]),
                                                       dtype=torch.uint8))
    rng = train.batches(10, 13)
    assert len(rng) == 3
    got = [b[0] for b in rng]
    assert all(torch.equal(g, train.batch(i)[0]) for g, i in zip(got, range(10, 13)))
    assert train.check_state(train.state_dict(26)) == 26
    with pytest.raises(ValueError, match="same --seed"):
        CharCorpus(32, 2, seed=1).check_state(train.state_dict(26))


def test_synthetic_tokens_shape_range_and_errors():
    s = SyntheticTokens(50304, 64, 3, seed=0)
    x, y = s.batch(0)
    assert x.shape == (3, 64) and x.dtype == torch.int64
    assert 0 <= int(x.min()) and int(x.max()) < 50304
    torch.testing.assert_close(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        SyntheticTokens(10, 4, 1, rank=2, world_size=2)
    with pytest.raises(ValueError, match="too few"):
        CharCorpus(10**7, 1)
