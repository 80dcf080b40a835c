"""Token sources for the reference GPT: a shipped public-domain text and synthetic tokens.

Both sources are *stateless in the step*: batch number `i` is a pure function of
(seed, i), drawn from its own counter-based random stream. That gives three things
the training loop needs without any bookkeeping:

- bit-exact resume: the data position is just the next batch index, and nothing else
  about the source has to be saved (no generator state, no shuffled index lists);
- the same global batch at every world size: batch `i` is drawn for the whole world
  (`batch_size * world_size` rows) and rank r keeps rows [r*B, (r+1)*B), so two ranks
  of batch B see exactly the rows one rank of batch 2B sees;
- any prefetch depth: a Prefetcher that reads ahead cannot shift what step k gets.

Batches are CPU int64 tensors `(x, y)`, each (B, T), with y = x shifted left by one
token. Feed them through `gobrrr.Prefetcher(source.batches(start, stop), device=...)`.

The corpus is read byte by byte (vocab 256): the shipped text is plain ASCII, so a byte
is a character, and any other UTF-8 text also works without a tokenizer.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DEFAULT_CORPUS = DATA_DIR / "tinyshakespeare.txt"
BYTE_VOCAB = 256

_SPLITS = {"train": 0, "val": 1}


def _stream(seed: int, stream: int, index: int) -> np.random.Generator:
    """An independent random stream for batch `index` (PCG64 seeded by a SeedSequence)."""
    return np.random.default_rng([seed, stream, index])


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}; need 0 <= rank < world_size")


class _BatchSource:
    """Shared iteration protocol: `batch(i)`, `batches(start, stop)`, `state_dict()`."""

    batch_size: int
    seq_len: int
    seed: int

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def batches(self, start: int, stop: int) -> "BatchRange":
        """The batches with indices start..stop-1, as a sized iterable (for a Prefetcher)."""
        return BatchRange(self, start, stop)

    def state_dict(self, position: int) -> dict:
        """What a checkpoint needs to continue from batch `position`: the seed and the index."""
        return {"kind": type(self).__name__, "seed": self.seed, "position": int(position)}

    def check_state(self, state: dict) -> int:
        """Validate a checkpointed data state against this source; return its position."""
        if state.get("kind") != type(self).__name__ or state.get("seed") != self.seed:
            raise ValueError(
                f"checkpoint data state {state} does not match this run's {type(self).__name__} "
                f"with seed {self.seed}; resume with the same --seed and data source"
            )
        return int(state["position"])


class BatchRange:
    """A sized, re-iterable view of batches [start, stop) of a source."""

    def __init__(self, source: _BatchSource, start: int, stop: int):
        if start < 0 or stop < start:
            raise ValueError(f"batch range [{start}, {stop}) is empty or negative")
        self.source, self.start, self.stop = source, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self):
        for i in range(self.start, self.stop):
            yield self.source.batch(i)


class CharCorpus(_BatchSource):
    """Random windows of a text file, byte-level, as (x, y) int64 batches of shape (B, T).

    `batch_size` is per rank. The last `val_fraction` of the text is the "val" split, the
    rest "train"; windows never cross the boundary.
    """

    vocab_size = BYTE_VOCAB

    def __init__(
        self,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        *,
        path: str | Path | None = None,
        split: str = "train",
        val_fraction: float = 0.1,
        rank: int = 0,
        world_size: int = 1,
    ):
        _check_rank(rank, world_size)
        if split not in _SPLITS:
            raise ValueError(f"unknown split {split!r}; choose 'train' or 'val'")
        path = Path(path) if path is not None else DEFAULT_CORPUS
        if not path.is_file():
            raise FileNotFoundError(
                f"corpus file {path} not found; reinstall gobrrr (it ships {DEFAULT_CORPUS.name}) "
                "or pass path= to a text file"
            )
        raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        cut = int(len(raw) * (1.0 - val_fraction))
        part = raw[:cut] if split == "train" else raw[cut:]
        if len(part) < seq_len + 2:
            raise ValueError(
                f"the {split} split of {path.name} has {len(part)} bytes, too few for seq_len={seq_len}; "
                "use a shorter --seq-len or a longer text"
            )
        self.path, self.split = path, split
        self.data = torch.from_numpy(part.copy())  # (N,) uint8
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self._window = torch.arange(seq_len + 1)  # (T+1,)

    def __len__(self) -> int:
        """Bytes in this split."""
        return len(self.data)

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, W = self.batch_size, self.seq_len, self.world_size
        rng = _stream(self.seed, _SPLITS[self.split], index)
        starts = rng.integers(0, len(self.data) - T - 1, size=B * W)  # (W*B,) the world's batch
        mine = torch.from_numpy(starts[self.rank * B:(self.rank + 1) * B])  # (B,) this rank's rows
        chunk = self.data[mine[:, None] + self._window].long()  # (B, T+1)
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()  # (B, T), (B, T)

    def decode(self, ids: torch.Tensor) -> str:
        """Token ids back to text (bytes that are not valid UTF-8 become U+FFFD)."""
        return bytes(ids.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


class SyntheticTokens(_BatchSource):
    """Uniform random tokens, for throughput benchmarks: (x, y) int64 batches of shape (B, T).

    Nothing to learn here (the loss stays near ln(vocab_size)); use CharCorpus to see
    a model train. Costs one `randint` of (W*B, T+1) per batch on the host.
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        *,
        rank: int = 0,
        world_size: int = 1,
    ):
        _check_rank(rank, world_size)
        self.vocab_size, self.seq_len, self.batch_size, self.seed = vocab_size, seq_len, batch_size, seed
        self.rank, self.world_size = rank, world_size

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, W = self.batch_size, self.seq_len, self.world_size
        seed = int(_stream(self.seed, 2, index).integers(0, 2**62))
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(self.vocab_size, (W * B, T + 1), generator=g)  # (W*B, T+1) int64
        mine = tokens[self.rank * B:(self.rank + 1) * B]  # (B, T+1)
        return mine[:, :-1].contiguous(), mine[:, 1:].contiguous()  # (B, T), (B, T)
