"""Fused operations the reference model can use in place of a plain composition of torch ops."""
from gobrrr.ops.linear_ce import ChunkedCrossEntropy, linear_cross_entropy

__all__ = ["ChunkedCrossEntropy", "linear_cross_entropy"]
