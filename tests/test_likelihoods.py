"""Likelihoods: NLLs against torch.distributions / scipy, predictive log-likelihoods against a direct computation,
and a heteroscedastic toy problem whose noise function must be recovered."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from varbnn import metrics
from varbnn.likelihoods import Categorical, GammaPrecisionGaussian, Gaussian, HeteroscedasticGaussian, as_likelihood

torch.set_default_dtype(torch.float32)


def _direct_log_predictive(log_probs: torch.Tensor) -> torch.Tensor:
    """log mean_s exp(log_probs[s]) in float64 by exponentiating (the oracle for the log-sum-exp)."""
    return log_probs.double().exp().mean(0).log()


def test_categorical_matches_torch_distribution() -> None:
    logits, y = torch.randn(7, 4), torch.randint(0, 4, (7,))
    lik = Categorical()
    expected = torch.distributions.Categorical(logits=logits).log_prob(y)
    torch.testing.assert_close(lik.log_prob(logits, y), expected)
    torch.testing.assert_close(lik.nll(logits, y), -expected.mean())
    torch.testing.assert_close(lik(logits, y), -expected.mean())  # callable as an nll= function


def test_gaussian_matches_torch_distribution_and_learns_its_noise() -> None:
    f, y = torch.randn(9), torch.randn(9)
    fixed = Gaussian(noise_std=0.3)
    torch.testing.assert_close(fixed.log_prob(f, y), torch.distributions.Normal(f, 0.3).log_prob(y))
    torch.testing.assert_close(fixed.log_prob(f.unsqueeze(-1), y), fixed.log_prob(f, y))  # [N, 1] outputs
    assert list(fixed.parameters()) == []
    learned = Gaussian(init_noise_std=2.0)
    assert float(learned.noise_std) == pytest.approx(2.0)
    learned.nll(f, y).backward()
    assert learned.log_noise_std.grad is not None and learned.log_noise_std.grad.abs() > 0


def test_heteroscedastic_matches_torch_distribution() -> None:
    out, y = torch.randn(6, 2), torch.randn(6)
    lik = HeteroscedasticGaussian(min_variance=1e-3)
    std = (out[:, 1].exp() + 1e-3).sqrt()
    torch.testing.assert_close(lik.log_prob(out, y), torch.distributions.Normal(out[:, 0], std).log_prob(y))


def test_gamma_precision_predictive_is_the_gaussian_integrated_over_tau() -> None:
    lik = GammaPrecisionGaussian(6.0, 6.0, init_shape=3.0, init_rate=2.0)
    f, y = torch.tensor([0.1, -0.4]), torch.tensor([0.7, 1.9])
    a, b = float(lik.shape), float(lik.rate)
    for fi, yi, got in zip(f.tolist(), y.tolist(), lik.log_prob(f, y).tolist()):
        density = lambda tau, yi=yi, fi=fi: stats.norm.pdf(yi, fi, 1 / math.sqrt(tau)) * stats.gamma.pdf(tau, a, scale=1 / b)  # noqa: E731
        oracle, _ = integrate.quad(density, 0, np.inf)
        assert got == pytest.approx(math.log(oracle), rel=1e-5)
    # the training term is the expected log-likelihood under q(tau) (Jensen: below the marginal)
    torch.testing.assert_close(lik.nll(f, y), -lik.expected_log_likelihood(y, f).mean())
    assert float(lik.nll(f, y)) > float(-lik.log_prob(f, y).mean())
    summary = lik.summary(torch.randn(5, 2, 1))
    torch.testing.assert_close(summary.aleatoric_variance, torch.full((2,), b / (a - 1)))


@pytest.mark.parametrize(
    "lik, outputs, target",
    [
        (Categorical(), torch.randn(5, 8, 3), torch.randint(0, 3, (8,))),
        (Gaussian(noise_std=0.5), torch.randn(5, 8, 1), torch.randn(8)),
        (HeteroscedasticGaussian(), torch.randn(5, 8, 2), torch.randn(8)),
        (GammaPrecisionGaussian(), torch.randn(5, 8, 1), torch.randn(8)),
    ],
    ids=["categorical", "gaussian", "heteroscedastic", "gamma-precision"],
)
def test_log_predictive_is_the_log_mean_density_over_draws(lik, outputs, target) -> None:
    direct = _direct_log_predictive(torch.stack([lik.log_prob(o, target) for o in outputs]))
    got = lik.log_predictive(outputs, target)
    assert got.shape == (8,)
    torch.testing.assert_close(got.double(), direct, rtol=1e-5, atol=1e-5)
    assert lik.metrics(outputs, target)["nll"] == pytest.approx(float(-direct.mean()), rel=1e-5)


def test_categorical_metrics_are_those_of_the_mean_probabilities() -> None:
    logits, y = torch.randn(6, 50, 4), torch.randint(0, 4, (50,))
    probs = torch.softmax(logits, -1).mean(0)
    got = Categorical().metrics(logits, y)
    assert got["accuracy"] == metrics.accuracy(probs, y)
    assert got["nll"] == pytest.approx(metrics.negative_log_likelihood(probs, y), rel=1e-5)
    assert got["ece"] == pytest.approx(metrics.expected_calibration_error(probs, y))
    assert got["brier"] == pytest.approx(metrics.brier_score(probs, y))


def test_gaussian_summary_splits_aleatoric_and_epistemic_variance() -> None:
    outputs = torch.randn(10, 4, 1)
    summary = Gaussian(noise_std=0.2).summary(outputs)
    torch.testing.assert_close(summary.mean, outputs[..., 0].mean(0))
    torch.testing.assert_close(summary.epistemic_variance, outputs[..., 0].var(0, unbiased=False))
    torch.testing.assert_close(summary.aleatoric_variance, torch.full((4,), 0.04))
    metrics_ = Gaussian(noise_std=0.2).metrics(outputs, torch.zeros(4))
    assert metrics_["rmse"] == pytest.approx(float(summary.mean.square().mean().sqrt()))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Categorical().nll(torch.randn(4, 3), torch.zeros(5, dtype=torch.long)), "logits"),
        (lambda: Categorical().nll(torch.randn(4, 3), torch.zeros(4)), "integer class indices"),
        (lambda: Gaussian(noise_std=1.0).nll(torch.randn(4, 3), torch.zeros(4)), r"output must have shape"),
        (lambda: HeteroscedasticGaussian().nll(torch.randn(4, 1), torch.zeros(4)), r"\(4, 2\)"),
        (lambda: Gaussian(noise_std=0.0), "noise_std must be a finite number > 0"),
        (lambda: Gaussian(init_noise_std=float("nan")), "init_noise_std"),
        (lambda: HeteroscedasticGaussian(min_variance=-1.0), "min_variance"),
        (lambda: Categorical().log_predictive(torch.randn(3, 4, 2), torch.zeros(5, dtype=torch.long)), r"\[samples, N"),
        (lambda: as_likelihood("poisson"), "categorical"),
    ],
)
def test_bad_arguments_get_clear_errors(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_as_likelihood_by_name() -> None:
    assert isinstance(as_likelihood("categorical"), Categorical)
    with pytest.raises(ValueError, match="learns parameters"):
        as_likelihood("gaussian")  # its learned noise would be lost inside fit
    lik = HeteroscedasticGaussian()
    assert as_likelihood(lik) is lik


def test_heteroscedastic_toy_problem_recovers_the_noise_function() -> None:
    """y = sin(3x) + s(x) eps with s(x) = 0.1 + 0.4 x^2 on x in [-1, 1]; a small network trained by the likelihood's
    NLL must predict s(x) on a grid. Tolerance: with ~n_local points per grid neighbourhood the ML std estimate has a
    relative standard error of ~1/sqrt(2 n_local); 4,000 points over 9 well-separated grid points give n_local of
    order 100-400 (error 4-7%), so 20% leaves room for the network's smoothing bias while a constant noise model
    (error >= 60% at the ends or the centre) fails."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4000, 1, generator=g) * 2 - 1
    noise = 0.1 + 0.4 * x.square()
    y = (torch.sin(3 * x) + noise * torch.randn(x.shape, generator=g)).squeeze(-1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 2))  # fmt: skip
    lik = HeteroscedasticGaussian()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(1500):
        idx = torch.randint(0, 4000, (256,), generator=g)
        opt.zero_grad()
        lik.nll(net(x[idx]), y[idx]).backward()
        opt.step()
    grid = torch.linspace(-0.9, 0.9, 9).unsqueeze(-1)
    with torch.no_grad():
        summary = lik.summary(net(grid).unsqueeze(0))
    predicted, true = summary.aleatoric_variance.sqrt(), (0.1 + 0.4 * grid.square()).squeeze(-1)
    assert ((predicted - true).abs() / true).max() < 0.2, (predicted, true)
    torch.testing.assert_close(summary.mean, torch.sin(3 * grid).squeeze(-1), atol=0.08, rtol=0)


def test_printing_a_likelihood_with_learned_parameters_warns_nothing() -> None:
    import warnings

    from varbnn.likelihoods import GammaPrecisionGaussian, Gaussian

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float() of a requires_grad tensor used to warn here
        assert repr(Gaussian(init_noise_std=0.5)) == "Gaussian(noise_std=0.5, learned=True)"
        assert repr(Gaussian(noise_std=2.0)) == "Gaussian(noise_std=2, learned=False)"
        assert "Gamma(6, 6)" in repr(GammaPrecisionGaussian())
