"""Parallelism applied to an unmodified model: `ddp(model)` today; ZeRO and tensor parallel next."""
from gobrrr.parallel.ddp import DDP, NaiveDDP, ddp, no_sync

__all__ = ["DDP", "NaiveDDP", "ddp", "no_sync"]
