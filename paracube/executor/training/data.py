"""Training data: the global batch of step k, split over data parallelism into micro-batches.

The batch of step k is a pure function of (source, seed, k): a resumed run sees exactly the data an
uninterrupted run would have seen, and every layout of the same plan trains on the same tokens.
Sources:
- `synthetic`: learnable token sequences (each sequence counts up from a random start by a random
  stride in 1..4, mod vocab), so a few steps already lower the loss; uniform random tokens could not.
- `text` (default): byte-level text (vocab 256) of Python's own `pydoc_data.topics`, present wherever
  Python is; or `text:PATH` for any file (read as bytes).
Each micro-batch is `(ids, labels)`, both [b, s] int64, labels = the next tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from paracube.errors import ParacubeError, check

SOURCES_HELP = "synthetic, text (Python's pydoc topics) or text:PATH"
MicroBatch = tuple[torch.Tensor, torch.Tensor]


@lru_cache(maxsize=4)
def _text_bytes(path: str | None) -> np.ndarray:
    """The corpus as uint8; cached so each rank reads the file once."""
    if path is None:
        from pydoc_data.topics import topics

        # Sorted keys: the same corpus on every Python that ships the same topics.
        data = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    else:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ParacubeError(f"cannot read data file {path!r}: {exc.strerror}") from None
    return np.frombuffer(data, dtype=np.uint8)


@dataclass(frozen=True)
class DataSource:
    """Where tokens come from; `batch(step)` is deterministic in (seed, step)."""

    kind: str  # "synthetic" | "text"
    vocab: int
    seq_len: int
    seed: int = 0
    path: str | None = None  # text only; None: pydoc_data.topics

    def __post_init__(self) -> None:
        check(self.kind in ("synthetic", "text"), f"data source {self.kind!r} is not valid; valid: {SOURCES_HELP}")
        if self.kind == "text":
            check(self.vocab >= 256, f"byte-level text needs vocab >= 256, the model has vocab={self.vocab}; "
                  "use --data synthetic")
            n = len(_text_bytes(self.path))
            check(n > self.seq_len + 1, f"data file {self.path!r} has {n} bytes; need more than seq_len+1="
                  f"{self.seq_len + 1}")

    def _rng(self, step: int) -> np.random.Generator:
        # Seeded by (seed, step) alone: no state carried between steps, so resume needs no data state.
        return np.random.default_rng(np.random.SeedSequence([self.seed, step, 0x70A7]))

    def batch(self, step: int, global_batch: int) -> torch.Tensor:
        """[global_batch, seq_len + 1] int64 tokens of step `step` (inputs and shifted labels)."""
        rng = self._rng(step)
        s1 = self.seq_len + 1
        if self.kind == "synthetic":
            start = rng.integers(0, self.vocab, size=(global_batch, 1))
            stride = rng.integers(1, 5, size=(global_batch, 1))
            tokens = (start + stride * np.arange(s1)[None, :]) % self.vocab
        else:
            corpus = _text_bytes(self.path)
            offsets = rng.integers(0, len(corpus) - s1, size=global_batch)
            tokens = np.stack([corpus[o:o + s1] for o in offsets]).astype(np.int64)
        return torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))


def parse_source(text: str, vocab: int, seq_len: int, seed: int = 0) -> DataSource:
    """`synthetic`, `text` or `text:PATH` -> DataSource."""
    kind, _, path = text.partition(":")
    check(kind in ("synthetic", "text") and (kind == "text" or not path),
          f"data source {text!r} is not valid; valid: {SOURCES_HELP}")
    return DataSource(kind, vocab, seq_len, seed, path or None)


def replica_micro_batches(source: DataSource, step: int, global_batch: int, dp: int, dp_index: int,
                          micro_batch: int) -> list[MicroBatch]:
    """This data-parallel replica's micro-batches of step `step`: rows
    [dp_index * global_batch/dp, (dp_index+1) * global_batch/dp) of the global batch, in chunks of `micro_batch`."""
    check(global_batch % (dp * micro_batch) == 0,
          f"global batch {global_batch} is not divisible by dp={dp} x micro-batch={micro_batch}")
    check(0 <= dp_index < dp, f"dp index {dp_index} is outside 0..{dp - 1}")
    per_replica = global_batch // dp
    rows = source.batch(step, global_batch)[dp_index * per_replica:(dp_index + 1) * per_replica]
    out: list[MicroBatch] = []
    for lo in range(0, per_replica, micro_batch):
        chunk = rows[lo:lo + micro_batch]
        out.append((chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()))
    return out


__all__ = ["SOURCES_HELP", "DataSource", "MicroBatch", "parse_source", "replica_micro_batches"]
