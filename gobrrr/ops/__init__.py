"""Fused operations the reference model can use in place of a plain composition of torch ops."""
from gobrrr.ops import bias_gelu
from gobrrr.ops.linear_ce import ChunkedCrossEntropy, linear_cross_entropy

__all__ = ["bias_gelu", "ChunkedCrossEntropy", "linear_cross_entropy"]
