"""Mini-batches of tensors already in memory, without a ``Dataset`` / ``DataLoader`` per example."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

__all__ = ["TensorBatches"]


class TensorBatches:
    """Shuffled mini-batches of in-memory tensors, re-iterable (one pass per epoch), optionally dropping the final
    incomplete batch; one ``randperm`` per epoch instead of per-example indexing."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, shuffle: bool = True, drop_last: bool = False):
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"x and y hold different numbers of examples: {x.shape[0]} and {y.shape[0]}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.x, self.y, self.batch_size, self.shuffle, self.drop_last = x, y, batch_size, shuffle, drop_last

    def __len__(self) -> int:
        n = self.x.shape[0]
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = self.x.shape[0]
        order = torch.randperm(n) if self.shuffle else torch.arange(n)
        for i in range(len(self)):
            index = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self.x[index], self.y[index]
