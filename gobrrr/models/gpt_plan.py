"""The reference GPT's tensor-parallel plan: which of gobrrr/models/gpt.py's modules is split how.

    from gobrrr.models.gpt_plan import GPT_PLAN
    model = gobrrr.parallel.tp(GPT(cfg).to(device), mesh, plan=GPT_PLAN, sequence_parallel=True)

A plan is data (gobrrr/parallel/tp/parallelize.py's docstring describes each style). It lives beside
the model it splits, as torchtitan keeps a parallelize function per model: gpt.py knows nothing of
parallelism, and gobrrr.parallel knows nothing of the GPT. Megatron's split of a block (Shoeybi et
al. 2019): the attention's fused qkv and the MLP's fc are column-parallel (each rank its heads, its
4C/n hidden features), the two output projections row-parallel; the vocabulary is split across the
tied embedding and head, and the loss runs on the vocab-sharded logits.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from gobrrr.parallel.tp.parallelize import Colwise, Dropout, ModuleInput, Replicate, Rowwise, VocabEmbedding

GPT_PLAN: dict[Any, Any] = {
    "wte": VocabEmbedding(),
    "wpe": Replicate(seq_dim=0),                       # pos (T,) -> (T, C): with SP keep my T/n rows
    "blocks.*.attn": ModuleInput(heads="n_head", sharded_random="dropout"),
    "blocks.*.attn.qkv": Colwise(chunks=3),            # [q | k | v]: my heads of each
    "blocks.*.attn.proj": Rowwise(),
    "blocks.*.mlp": ModuleInput(),
    "blocks.*.mlp.fc": Colwise(),
    "blocks.*.mlp.proj": Rowwise(),
    "lm_head": Colwise(gather_input=True, vocab_output=True),
    nn.LayerNorm: Replicate(),
    nn.Dropout: Dropout(),
}
