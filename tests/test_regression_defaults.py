"""fit(kl_weight=None) with a regression likelihood takes each family's ``default_regression_kl_weight`` where it sets
one (issue 63: the classification defaults were chosen on classification data only;
benchmarks/results/regression-defaults/)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from bad_input_table import BadInput, check, params
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn.families import KTied, MeanField, Radial, VariationalFamily
from varbnn.likelihoods import Categorical, GammaPrecisionGaussian, Gaussian, HeteroscedasticGaussian
from varbnn.objectives import default_kl_weight


def _mlp(family: VariationalFamily, out: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return varbnn.bayesianize(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, out)), family)


@pytest.fixture
def distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Classification and regression defaults that cannot be confused (KTied subclasses MeanField: set both)."""
    monkeypatch.setattr(MeanField, "default_kl_weight", 0.25)
    monkeypatch.setattr(MeanField, "default_regression_kl_weight", 0.05)
    monkeypatch.setattr(KTied, "default_kl_weight", 0.5)
    monkeypatch.setattr(KTied, "default_regression_kl_weight", 0.02)


def test_a_family_without_a_regression_default_keeps_its_classification_default() -> None:
    """No family sets one yet (benchmarks/results/regression-defaults/: the validation choice flips with early
    stopping), so regression and classification get the same weight."""
    for family in (MeanField(), KTied(), Radial()):
        assert type(family).default_regression_kl_weight is None
        model = _mlp(family)
        assert default_kl_weight(model, Gaussian()) == default_kl_weight(model) == type(family).default_kl_weight


@pytest.mark.usefixtures("distinct")
@pytest.mark.parametrize(
    ("likelihood", "expected"),
    [
        (None, 0.25), (Categorical(), 0.25), ("categorical", 0.25), (F.cross_entropy, 0.25), (F.mse_loss, 0.25),
        (Gaussian(), 0.05), (Gaussian(noise_std=0.3), 0.05), (HeteroscedasticGaussian(), 0.05),
        (GammaPrecisionGaussian(), 0.05), ("gaussian", 0.05), ("heteroscedastic", 0.05), ("gamma-precision", 0.05),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", type(v).__name__),
)  # fmt: skip
def test_default_kl_weight_follows_the_likelihoods_task(likelihood: object, expected: float) -> None:
    """A likelihood whose ``task`` is ``"regression"`` (object or name) takes the regression default; anything else
    (no likelihood, Categorical, a plain loss function, which cannot say its task) the classification one."""
    assert default_kl_weight(_mlp(MeanField()), likelihood) == expected  # type: ignore[arg-type]


@pytest.mark.usefixtures("distinct")
def test_mixed_families_take_the_smallest_and_uncovered_families_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    mixed = nn.Sequential(varbnn.bayesianize(nn.Linear(3, 8), MeanField()), varbnn.bayesianize(nn.Linear(8, 1), KTied()))
    assert default_kl_weight(mixed, Gaussian()) == 0.02
    assert default_kl_weight(mixed) == 0.25
    monkeypatch.setattr(Radial, "default_kl_weight", 0.3)
    assert default_kl_weight(_mlp(Radial()), Gaussian()) == 0.3  # no regression default: the classification one
    assert default_kl_weight(nn.Linear(3, 1), Gaussian()) == 1.0  # no Bayesian tensors: the true ELBO


@pytest.mark.usefixtures("distinct")
def test_fit_uses_the_regression_default_with_a_regression_likelihood() -> None:
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    y, labels = x.sum(1), (x.sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    run = lambda **kw: varbnn.fit(kw.pop("model"), kw.pop("loader", loader), n_data=32, epochs=1, progress=False, **kw)  # noqa: E731
    assert run(model=_mlp(MeanField()), likelihood=Gaussian())[0]["beta"] == 0.05
    assert run(model=_mlp(KTied()), likelihood=Gaussian())[0]["beta"] == 0.02
    assert run(model=_mlp(MeanField(), out=2), likelihood=HeteroscedasticGaussian())[0]["beta"] == 0.05
    assert run(model=_mlp(MeanField()), nll=Gaussian())[0]["beta"] == 0.05  # a Likelihood passed as nll
    assert run(model=_mlp(MeanField()), likelihood=Gaussian(), kl_weight=0.7)[0]["beta"] == 0.7  # given: kept
    classify = DataLoader(TensorDataset(x, labels), batch_size=16)
    assert run(model=_mlp(MeanField(), out=2), loader=classify)[0]["beta"] == 0.25
    assert run(model=_mlp(MeanField(), out=2), loader=classify, likelihood="categorical")[0]["beta"] == 0.25


BAD_INPUTS = [
    BadInput("unknown likelihood name", lambda: default_kl_weight(_mlp(MeanField()), "poisson"), ValueError,
             r"likelihood must be a Likelihood, one of \['categorical', 'gamma-precision', 'gaussian', 'heteroscedastic'\]"),
    BadInput("likelihood of another type", lambda: default_kl_weight(_mlp(MeanField()), 3), TypeError,  # type: ignore[arg-type]
             r"likelihood must be a varbnn.likelihoods.Likelihood, one of \[.*\], a loss function or None, got int"),
]  # fmt: skip


@pytest.mark.parametrize("case", params(BAD_INPUTS))
def test_bad_inputs(case: BadInput) -> None:
    check(case)
