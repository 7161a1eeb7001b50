"""Mini-batches of tensors already in memory, without a ``Dataset`` / ``DataLoader`` per example."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["TensorBatches", "fast_batches"]


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


def _plain_tensor_loader(loader: object) -> tuple[tuple[torch.Tensor, ...], int, bool, bool] | None:
    """``(tensors, batch_size, shuffle, drop_last)`` of a ``DataLoader`` that only indexes an in-memory
    ``TensorDataset`` and stacks the examples (no workers, no timeout, default sampler over that dataset and default
    collation, no generator, no pinning); None for any other loader."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset
    from torch.utils.data._utils.collate import default_collate

    if type(loader) is not DataLoader or type(loader.dataset) is not TensorDataset:
        return None
    if loader.num_workers != 0 or loader.pin_memory or loader.generator is not None or loader.collate_fn is not default_collate:
        return None
    if loader.timeout != 0:  # refused by the DataLoader's own iterator without workers: let it say so
        return None
    sampler, batches = loader.sampler, loader.batch_sampler
    if getattr(sampler, "data_source", None) is not loader.dataset:  # a sampler over other data (e.g. range(5))
        return None
    if type(batches) is not BatchSampler or batches.sampler is not sampler or batches.batch_size is None:
        return None
    if type(sampler) is RandomSampler:
        if sampler.replacement or sampler.generator is not None or sampler._num_samples is not None:
            return None
    elif type(sampler) is not SequentialSampler:
        return None
    tensors = loader.dataset.tensors
    if not tensors or any(t.dim() == 0 or t.shape[0] != tensors[0].shape[0] for t in tensors):
        return None
    return tensors, int(batches.batch_size), type(sampler) is RandomSampler, bool(batches.drop_last)


def fast_batches(loader: object) -> Iterable[Any]:
    """``loader`` itself, or, for a ``DataLoader`` that only shuffles (or not) and stacks the rows of an in-memory
    ``TensorDataset``, an iterable of the same batches, equal element for element and drawn from the global random
    generator exactly as the ``DataLoader`` draws them (its base seed, then its sampler's seed, each epoch), by one
    index per batch instead of one ``__getitem__`` per example and a collation. ``varbnn.fit`` trains through it. Tested
    against ``DataLoader`` for every combination of shuffling, ``drop_last`` and a partial last batch."""
    plain = _plain_tensor_loader(loader)
    if plain is None:
        return loader  # type: ignore[return-value]
    return _TensorLoaderBatches(*plain)


class _TensorLoaderBatches:
    """The batches of a plain ``DataLoader`` over a ``TensorDataset`` (see :func:`fast_batches`)."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], batch_size: int, shuffle: bool, drop_last: bool) -> None:
        self.tensors, self.batch_size, self.shuffle, self.drop_last = tensors, batch_size, shuffle, drop_last

    def __len__(self) -> int:
        n = self.tensors[0].shape[0]
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        n = self.tensors[0].shape[0]
        torch.empty((), dtype=torch.int64).random_()  # the DataLoader iterator's base seed (for workers; unused here)
        if self.shuffle:  # RandomSampler: a generator seeded from the global one, one permutation per epoch
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
            order = torch.randperm(n, generator=generator)
            # the permutation on each tensor's device, once per epoch: indexing a GPU tensor with a CPU index would
            # copy the index to the device (and wait for it) every batch
            orders = {t.device: order.to(t.device) for t in self.tensors}
        for i in range(len(self)):
            if self.shuffle:
                rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
                yield [t[orders[t.device][rows]].contiguous() for t in self.tensors]  # contiguous, as stacked
            else:
                yield [t[i * self.batch_size : (i + 1) * self.batch_size].clone(memory_format=torch.contiguous_format)
                       for t in self.tensors]  # a contiguous copy, as stacked  # fmt: skip
