"""Issue 25, "Conversion that covers less than the user thinks": every input of the audit, and what it gives now."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from bad_input_table import BadInput, check, params
from torch import nn

import varbnn
from varbnn import BayesConv1d, BayesConv3d, BayesEmbedding, BayesGRU, BayesLinear, ConversionWarning, Delta, MeanField
from varbnn.priors import Laplace, Normal


def quietly(fn: Any) -> Any:
    """Call ``fn`` and return ``(result, [ConversionWarning messages])``."""

    def call() -> Any:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            result = fn()
        return result, [str(w.message) for w in record if issubclass(w.category, ConversionWarning)]

    return call


def converted_to(layer_type: type[nn.Module], plain: nn.Module, *inputs: torch.Tensor) -> Any:
    """expect=: no warning, the module became ``layer_type``, and (Delta, pretrained) gives the plain output."""

    def expect(result: Any) -> None:
        model, messages = result
        assert not messages, messages
        assert isinstance(model, layer_type)
        got, want = model(*inputs), plain(*inputs)
        got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)

    return expect


def reported(*type_names: str, deliberate: bool = False) -> Any:
    """expect=: ``(model, report)`` lists these types as left deterministic; warned about unless ``deliberate``."""

    def expect(result: Any) -> None:
        (model, report), messages = result
        left = {d.type_name: d.deliberate for d in report.deterministic}
        for name in type_names:
            assert left.get(name) is deliberate, (name, left)
        if deliberate:
            assert not messages, messages
        else:
            assert len(messages) == 1 and all(name in messages[0] for name in type_names), messages

    return expect


torch.manual_seed(0)
EMBEDDING = nn.Embedding(9, 4, padding_idx=2)
TOKENS = torch.tensor([[1, 2, 8], [0, 2, 5]])
GRU = nn.GRU(3, 5, num_layers=2)
SEQUENCE = torch.randn(4, 2, 3)
CONV1D = nn.Conv1d(3, 2, 3)
CONV3D = nn.Conv3d(2, 2, 3, padding=1)


class WithAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(6, 2, batch_first=True)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attention(x, x, x)[0])


def attention_works(result: Any) -> None:
    (model, report), messages = result
    assert isinstance(model.attention, varbnn.nn.BayesMultiheadAttention) and isinstance(model.head, BayesLinear)
    assert model.eval()(torch.randn(2, 3, 6)).shape == (2, 3, 2)
    assert not report.unintended and not messages  # converted since issue 65


def attention_converted(model: nn.Module) -> None:
    assert isinstance(model.attention, varbnn.nn.BayesMultiheadAttention)  # strict=True has nothing to refuse


def prior_is(prior_type: type, **values: float) -> Any:
    def expect(model: nn.Module) -> None:
        prior = model.priors["weight"]
        assert isinstance(prior, prior_type)
        for name, value in values.items():
            assert float(getattr(prior, name)) == value

    return expect


def samples_in_eval(model: nn.Module) -> None:
    """eval() switches dropout and batch norm only; the weights are still drawn (``sample_mode`` decides)."""
    x = torch.ones(1, 3)
    assert not model.training and not torch.equal(model(x), model(x))
    with varbnn.sample_mode(model, "mean"):
        assert torch.equal(model(x), model(x))


CASES = [
    BadInput("embedding-converted", quietly(lambda: varbnn.bayesianize(EMBEDDING, Delta(), pretrained=True)),
             expect=converted_to(BayesEmbedding, EMBEDDING, TOKENS)),
    BadInput("gru-converted", quietly(lambda: varbnn.bayesianize(GRU, Delta(), pretrained=True)),
             expect=converted_to(BayesGRU, GRU, SEQUENCE)),
    BadInput("conv1d-converted", quietly(lambda: varbnn.bayesianize(CONV1D, Delta(), pretrained=True)),
             expect=converted_to(BayesConv1d, CONV1D, torch.randn(2, 3, 7))),
    BadInput("conv3d-converted", quietly(lambda: varbnn.bayesianize(CONV3D, Delta(), pretrained=True)),
             expect=converted_to(BayesConv3d, CONV3D, torch.randn(1, 2, 4, 4, 4))),
    BadInput("embedding-max-norm-refused", lambda: varbnn.bayesianize(nn.Sequential(nn.Embedding(5, 2, max_norm=1.0))),
             raises=NotImplementedError, match="'0': Embedding max_norm .* no Bayesian form; pass exclude=\\['0'\\]"),
    BadInput("embedding-sparse-refused", lambda: varbnn.bayesianize(nn.Embedding(5, 2, sparse=True)),
             raises=NotImplementedError, match="sparse=True is not supported"),
    BadInput("embedding-flipout-refused", lambda: varbnn.bayesianize(nn.Embedding(5, 2), MeanField(estimator="flipout")),
             raises=ValueError, match="estimator='flipout'\\) is not supported in embedding layers"),
    BadInput("gru-bidirectional-refused", lambda: varbnn.bayesianize(nn.GRU(2, 3, bidirectional=True)),
             raises=NotImplementedError, match="bidirectional GRUs"),
    BadInput("gru-local-refused", lambda: varbnn.bayesianize(nn.GRU(2, 3), MeanField(estimator="local")),
             raises=ValueError, match="not supported in gru layers.*\\['reparam', 'graves'\\]"),
    BadInput("conv1d-padding-mode-refused", lambda: varbnn.bayesianize(nn.Conv1d(2, 2, 3, padding_mode="circular")),
             raises=NotImplementedError, match="Conv1d padding_mode='circular' is not supported"),
    BadInput("batchnorm-deterministic-by-design",
             quietly(lambda: varbnn.bayesianize(nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 4)), report=True)),
             expect=reported("BatchNorm1d", deliberate=True)),
    BadInput("layernorm-deterministic-by-design",
             quietly(lambda: varbnn.bayesianize(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), report=True)),
             expect=reported("LayerNorm", deliberate=True)),
    BadInput("multihead-attention-forward-works", quietly(lambda: varbnn.bayesianize(WithAttention(), report=True)),
             expect=attention_works),
    BadInput("multihead-attention-strict", lambda: varbnn.bayesianize(WithAttention(), strict=True),
             expect=attention_converted),
    BadInput("bilinear-reported", quietly(lambda: varbnn.bayesianize(nn.Sequential(nn.Bilinear(2, 2, 1)), report=True)),
             expect=reported("Bilinear")),
    BadInput("bilinear-strict", lambda: varbnn.bayesianize(nn.Bilinear(2, 2, 1), strict=True),
             raises=ValueError, match="Bilinear x1 \\(no Bayesian form registered\\)"),
    BadInput("bilinear-excluded-is-deliberate",
             quietly(lambda: varbnn.bayesianize(nn.Sequential(nn.Bilinear(2, 2, 1)), exclude=[nn.Bilinear], report=True)),
             expect=reported("Bilinear", deliberate=True)),
    BadInput("embedding-bag-reported", quietly(lambda: varbnn.bayesianize(nn.Sequential(nn.EmbeddingBag(5, 2)), report=True)),
             expect=reported("EmbeddingBag")),
    BadInput("strict-not-a-bool", lambda: varbnn.bayesianize(nn.Linear(2, 2), strict="yes"),
             raises=TypeError, match="strict must be True or False"),
    BadInput("torch-normal-prior-accepted",
             lambda: varbnn.bayesianize(nn.Linear(2, 2), prior=torch.distributions.Normal(0.0, 0.5)),
             expect=prior_is(Normal, loc=0.0, scale=0.5)),
    BadInput("torch-laplace-prior-accepted",
             lambda: varbnn.bayesianize(nn.Linear(2, 2), prior=torch.distributions.Laplace(0.0, 0.1)),
             expect=prior_is(Laplace, loc=0.0, scale=pytest.approx(0.1))),
    BadInput("torch-gamma-prior-refused", lambda: varbnn.bayesianize(nn.Linear(2, 2), prior=torch.distributions.Gamma(1.0, 1.0)),
             raises=TypeError, match="prior must be a varbnn prior \\(varbnn.priors.Normal.*got torch.distributions.Gamma"),
    BadInput("torch-tensor-normal-prior-refused",
             lambda: varbnn.bayesianize(nn.Linear(2, 2), prior=torch.distributions.Normal(torch.zeros(2), torch.ones(2))),
             raises=TypeError, match="scalar loc and scale.*loc of shape \\(2,\\)"),
    BadInput("eval-still-samples", lambda: varbnn.bayesianize(nn.Linear(3, 3), MeanField(init_std=0.5)).eval(),
             expect=samples_in_eval),
]  # fmt: skip


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input(case: BadInput) -> None:
    check(case)
