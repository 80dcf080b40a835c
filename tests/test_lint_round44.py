"""gobrrr lint, issue 29's round on gpt-neox's rotary tables: a host cache a module builds in `__init__` through its own
helper (`cos, sin, inv = self._prepare_cache(n, precision, base)`), cast there with `.to(precision)`, is copied to the
device by every forward that does `self.cos_cached.to(x.device)`. From a minimal example, beside the neighbour that
must stay quiet."""
from __future__ import annotations

from lintcase import line_of, rules

ROTARY = """
import torch


class Rotary(torch.nn.Module):
    def __init__(self, dim, max_seq_len, base=10000, precision=torch.half):
        super().__init__()
        self.dim = dim
        cos_cached, sin_cached, inv_freq = self._prepare_cache(max_seq_len, precision, base)
        self.register_buffer("inv_freq", inv_freq)
        self.cos_cached = cos_cached
        self.sin_cached = sin_cached

    def _prepare_cache(self, seq_len, precision, base):
        inv_freq = 1.0 / (base ** (torch.arange(0, self.dim, 2).float() / self.dim))
        t = torch.arange(seq_len).type_as(inv_freq)
        emb = torch.einsum("i,j->ij", t, inv_freq)
        return emb.cos().to(precision), emb.sin().to(precision), inv_freq.to(precision)

    def forward(self, x):
        cos = self.cos_cached.to(x.device)
        freq = self.inv_freq.to(x.device)
        return x * cos + freq.sum()


rot = Rotary(64, 2048).cuda()
"""


def test_a_host_cache_built_in_init_is_copied_every_forward():
    """The tables `_prepare_cache` returns are host tensors (`.to(precision)` casts, it names no device), and plain
    attributes are not moved by `.cuda()`: each forward copies them; the registered buffer moved with the module."""
    found = rules(ROTARY)
    assert (line_of(ROTARY, "cos = self.cos_cached.to(x.device)"), "GB010") in found
    assert (line_of(ROTARY, "freq = self.inv_freq.to(x.device)"), "GB010") not in found
