"""``fit``'s fast path for a ``DataLoader`` over a ``TensorDataset`` (``varbnn.data.batches.fast_batches``): the same
batches, element for element, from the same random draws, so that training through it is exactly training through the
``DataLoader``; every other loader is used as it is."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, TensorDataset
from torch.utils.data._utils.collate import default_collate

import varbnn
from varbnn.data.batches import _TensorLoaderBatches, fast_batches


def _epochs(loader, epochs=2):
    batches, states = [], []
    for _ in range(epochs):
        batches.append([[t.clone() for t in batch] for batch in loader])
        states.append(torch.get_rng_state())
    return batches, states


@pytest.mark.parametrize(("n", "batch_size", "shuffle", "drop_last"),
                         list(itertools.product((7, 32, 45), (1, 8, 50), (True, False), (True, False))))  # fmt: skip
def test_the_fast_batches_are_the_dataloaders_and_draw_the_same_random_numbers(n, batch_size, shuffle, drop_last):
    x = torch.randn(n, 3, 2)
    y = torch.randint(0, 5, (n,))
    w = torch.rand(n, dtype=torch.float64)
    loader = DataLoader(TensorDataset(x, y, w), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
    fast = fast_batches(loader)
    assert isinstance(fast, _TensorLoaderBatches) and len(fast) == len(loader)
    torch.manual_seed(3)
    expected, expected_states = _epochs(loader)
    torch.manual_seed(3)
    got, got_states = _epochs(fast)
    assert len(got) == len(expected)
    for epoch_got, epoch_expected in zip(got, expected, strict=True):
        assert len(epoch_got) == len(epoch_expected)
        for batch_got, batch_expected in zip(epoch_got, epoch_expected, strict=True):
            assert len(batch_got) == 3
            for a, b in zip(batch_got, batch_expected, strict=True):
                assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(got_states, expected_states, strict=True))
    if shuffle and n > 1 and batch_size < n:
        assert not torch.equal(torch.cat([b[0] for b in got[0]]), torch.cat([b[0] for b in got[1]]))  # reshuffled


def test_a_sequential_batch_is_a_copy_not_a_view_of_the_data():
    x = torch.zeros(6, 2)
    (first, *_), *_ = fast_batches(DataLoader(TensorDataset(x, torch.zeros(6)), batch_size=4))
    first += 1
    assert float(x.abs().sum()) == 0.0


def test_every_other_loader_is_used_as_it_is():
    data = TensorDataset(torch.randn(10, 2), torch.randn(10))
    others = [
        DataLoader(data, batch_size=4, num_workers=1),
        DataLoader(data, batch_size=4, collate_fn=lambda batch: default_collate(batch)),
        DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)),
        DataLoader(data, batch_size=4, sampler=RandomSampler(data, replacement=True)),
        DataLoader(data, batch_size=4, sampler=RandomSampler(data, num_samples=5)),
        DataLoader(data, batch_size=None),
        DataLoader(data, batch_size=4, sampler=SequentialSampler(range(5))),  # a sampler over other data: 5 rows
        DataLoader(data, batch_size=4, sampler=RandomSampler(range(5))),
        DataLoader(data, batch_size=4, timeout=3),  # the DataLoader refuses it without workers: it should say so
        DataLoader(list(zip(torch.randn(10, 2), torch.randn(10), strict=True)), batch_size=4),
        [(torch.randn(4, 2), torch.randn(4))],
    ]
    for loader in others:
        assert fast_batches(loader) is loader


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_are_contiguous_as_stacked_whatever_the_datas_layout(shuffle):
    images = torch.randn(9, 3, 4, 5).to(memory_format=torch.channels_last)
    table = torch.randn(4, 9).t()  # transposed: strides (1, 9)
    loader = DataLoader(TensorDataset(images, table), batch_size=4, shuffle=shuffle)
    fast = fast_batches(loader)
    assert isinstance(fast, _TensorLoaderBatches)
    torch.manual_seed(1)
    expected = list(loader)
    torch.manual_seed(1)
    for got, want in zip(fast, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            assert a.is_contiguous() and b.is_contiguous() and a.stride() == b.stride() and torch.equal(a, b)


def test_fit_through_the_fast_path_trains_exactly_as_through_the_dataloader():
    """The oracle: the same fit through a loader the fast path leaves alone (a collation of its own that is the
    default one) gives bit-for-bit the same parameters and history."""
    x, y = torch.randn(50, 4), torch.randint(0, 3, (50,))

    def train(collate):
        torch.manual_seed(0)
        model = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), varbnn.MeanField())
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, **collate)
        history = varbnn.fit(model, loader, n_data=50, epochs=3, progress=False, diagnose=False)
        return model.state_dict(), history

    fast_state, fast_history = train({})
    plain_state, plain_history = train({"collate_fn": lambda batch: default_collate(batch)})
    assert fast_state.keys() == plain_state.keys()
    assert all(torch.equal(fast_state[k], plain_state[k]) for k in fast_state)
    assert fast_history == plain_history
