"""varbnn.moments (the single-pass moment predictive) against oracles: numerical integration (scipy) for the max of
two Gaussians and the rectified Gaussian; exact closed forms where the propagation is exact (one or two Bayesian
layers, batch norm, average pooling of independent inputs), checked by Monte Carlo; exact equality with the plain
forward pass for deterministic networks; clear errors for what it cannot follow."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from torch import nn

import varbnn
from varbnn.calibration import TemperatureScaled
from varbnn.models import lenet5
from varbnn.moments import MomentPredictive, gaussian_max_moments, propagate_moments, relu_moments


def _quad_max(m1: float, v1: float, m2: float, v2: float) -> tuple[float, float]:
    """E and Var of max(X1, X2), independent Gaussians, by integrating the density of the max
    (f(z) = phi1(z) Phi2(z) + phi2(z) Phi1(z))."""
    s1, s2 = math.sqrt(v1), math.sqrt(v2)

    def density(z: float) -> float:
        return stats.norm.pdf(z, m1, s1) * stats.norm.cdf(z, m2, s2) + stats.norm.pdf(z, m2, s2) * stats.norm.cdf(z, m1, s1)

    lo, hi = min(m1 - 12 * s1, m2 - 12 * s2), max(m1 + 12 * s1, m2 + 12 * s2)
    points = [m1, m2]
    e1 = integrate.quad(lambda z: z * density(z), lo, hi, points=points, limit=200, epsabs=1e-13)[0]
    e2 = integrate.quad(lambda z: (z - e1) ** 2 * density(z), lo, hi, points=points, limit=200, epsabs=1e-13)[0]
    return e1, e2


@pytest.mark.parametrize(
    "m1, v1, m2, v2",
    [(0.0, 1.0, 0.0, 1.0), (1.0, 0.5, -0.3, 2.0), (3.0, 0.1, 2.9, 0.01), (-2.0, 4.0, 1.0, 0.25), (5.0, 1.0, -5.0, 1.0)],
)
def test_gaussian_max_matches_numerical_integration(m1: float, v1: float, m2: float, v2: float) -> None:
    t = lambda a: torch.tensor([a], dtype=torch.float64)  # noqa: E731
    mean, var = gaussian_max_moments(t(m1), t(v1), t(m2), t(v2))
    e, v = _quad_max(m1, v1, m2, v2)
    assert mean.item() == pytest.approx(e, rel=1e-7, abs=1e-9)
    assert var.item() == pytest.approx(v, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("m, v", [(0.0, 1.0), (1.5, 0.2), (-1.0, 3.0), (-6.0, 1.0), (0.3, 1e-6)])
def test_relu_moments_match_the_rectified_gaussian(m: float, v: float) -> None:
    s = math.sqrt(v)
    lo, hi = max(0.0, m - 14 * s), max(0.0, m + 14 * s)
    e1 = integrate.quad(lambda z: z * stats.norm.pdf(z, m, s), lo, hi, limit=200, epsabs=1e-14)[0]
    e2 = integrate.quad(lambda z: z * z * stats.norm.pdf(z, m, s), lo, hi, limit=200, epsabs=1e-14)[0]
    mean, var = relu_moments(torch.tensor([m], dtype=torch.float64), torch.tensor([v], dtype=torch.float64))
    assert mean.item() == pytest.approx(e1, rel=1e-7, abs=1e-12)
    assert var.item() == pytest.approx(e2 - e1 * e1, rel=1e-5, abs=1e-12)


def test_relu_variance_is_accurate_in_float32_far_from_zero() -> None:
    # E[relu^2] - E[relu]^2 would lose the variance 1e-4 to rounding of 100 in float32; the form used keeps it
    mean, var = relu_moments(torch.tensor([10.0, -10.0]), torch.tensor([1e-4, 1e-4]))
    assert mean[0].item() == pytest.approx(10.0, rel=1e-6)
    assert var[0].item() == pytest.approx(1e-4, rel=1e-3)
    assert mean[1].item() == pytest.approx(0.0, abs=1e-12) and var[1].item() == pytest.approx(0.0, abs=1e-12)


def test_max_of_deterministic_values_is_exact() -> None:
    a, b = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([0.5, -1.0, 3.0])
    zero = torch.zeros(3)
    mean, var = gaussian_max_moments(a, zero, b, zero)
    assert torch.equal(mean, torch.maximum(a, b)) and torch.equal(var, zero)


def _monte_carlo(model: nn.Module, x: torch.Tensor, draws: int = 20_000) -> tuple[torch.Tensor, torch.Tensor]:
    out = varbnn.predict(model, x, samples=draws, seed=0).double()
    return out.mean(0), out.var(0)


def _assert_moments_match(model: nn.Module, x: torch.Tensor, draws: int = 20_000) -> None:
    """Exact propagation vs Monte Carlo: the mean within 5 standard errors, the variance within 6% (its relative
    standard error at 20,000 draws is sqrt(2 / 20,000) = 1%, a little more for heavy-tailed outputs)."""
    mean, var = propagate_moments(model, x)
    mc_mean, mc_var = _monte_carlo(model, x, draws)
    se = (mc_var / draws).sqrt()
    assert ((mean.double() - mc_mean).abs() <= 5 * se + 1e-6).all()
    ratio = var.double() / mc_var
    assert ratio.min() > 0.94 and ratio.max() < 1.06, (ratio.min().item(), ratio.max().item())


FAMILIES = {"meanfield": lambda: varbnn.MeanField(init_std=0.3), "ktied": lambda: varbnn.KTied(rank=2, init_std=0.3)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_bayesian_layer_is_exact(family: str) -> None:
    torch.manual_seed(0)
    layer = varbnn.BayesLinear(6, 4, family=FAMILIES[family]())
    x = torch.randn(5, 6)
    mean, var = propagate_moments(nn.Sequential(layer), x)
    # the closed form: E = x M^T + b, Var = x^2 (S^2)^T + Var[b]
    m, s2 = layer.posteriors["weight"].moments()
    bm, bv = layer.posteriors["bias"].moments()
    torch.testing.assert_close(mean, x @ m.T + bm)
    torch.testing.assert_close(var, (x * x) @ s2.T + bv)
    _assert_moments_match(nn.Sequential(layer), x)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_two_bayesian_layers_with_relu_are_exact(family: str) -> None:
    # the first layer's outputs are independent given x (distinct rows of W1), so the ReLU moments and the second
    # layer's marginal moments are exact: a sharp Monte Carlo oracle
    torch.manual_seed(1)
    net = varbnn.bayesianize(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)), FAMILIES[family]())
    _assert_moments_match(net, torch.randn(4, 5))


def test_batch_norm_and_a_plain_layer_after_a_bayesian_one_are_exact() -> None:
    torch.manual_seed(2)
    norm = nn.BatchNorm1d(6)
    norm.running_mean.normal_()
    norm.running_var.uniform_(0.5, 2.0)
    norm.weight.data.normal_()
    net = nn.Sequential(varbnn.BayesLinear(4, 6, family=varbnn.MeanField(init_std=0.3)), norm, nn.Linear(6, 2))
    _assert_moments_match(net.eval(), torch.randn(3, 4))


def test_pooling_of_independent_inputs() -> None:
    # a Bayesian 1x1 "convolution" would share its kernel across positions; independent inputs come from a linear
    # layer's outputs reshaped, so the pools are checked against Monte Carlo on independent Gaussians directly
    from varbnn.moments import propagate

    torch.manual_seed(3)
    mean, var = torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.rand(2, 3, 4, 4, dtype=torch.float64) + 0.1
    draws = mean + var.sqrt() * torch.randn(40_000, *mean.shape, dtype=torch.float64)
    avg = nn.AvgPool2d(2)
    m, v = propagate(avg, mean, var)
    torch.testing.assert_close(m, avg(mean))
    torch.testing.assert_close(v, avg(var) / 4)
    g_m, g_v = propagate(nn.AdaptiveAvgPool2d(1), mean, var)
    torch.testing.assert_close(g_v, var.sum(dim=(-2, -1), keepdim=True) / 16**2)
    # max of 2 (MaxPool1d(2)): Clark's formula is exact for two independent Gaussians
    m1, v1 = propagate(nn.MaxPool1d(2), mean.flatten(2), var.flatten(2))
    mc = nn.functional.max_pool1d(draws.flatten(0, 1).flatten(2), 2).view(40_000, 2, 3, 8)
    assert ((m1 - mc.mean(0)).abs() <= 5 * (mc.var(0) / 40_000).sqrt()).all()
    assert ((v1 / mc.var(0)) - 1).abs().max() < 0.05
    # max of 4 (MaxPool2d(2)): pairwise Clark, each running max treated as Gaussian: an approximation, within 1% of
    # the mean's scale and 15% of the variance here
    m2, v2 = propagate(nn.MaxPool2d(2), mean, var)
    mc2 = nn.functional.max_pool2d(draws.flatten(0, 1), 2).view(40_000, 2, 3, 2, 2)
    assert ((m2 - mc2.mean(0)).abs() <= 0.03 * mc2.std(0) + 5 * (mc2.var(0) / 40_000).sqrt()).all()
    assert ((v2 / mc2.var(0)) - 1).abs().max() < 0.15


def test_deterministic_networks_give_their_forward_pass_exactly() -> None:
    torch.manual_seed(4)
    x = torch.randn(3, 1, 28, 28)
    plain = lenet5().eval()
    mean, var = propagate_moments(plain, x)
    assert torch.equal(mean, plain(x)) and torch.equal(var, torch.zeros_like(var))
    delta = varbnn.bayesianize(lenet5(), varbnn.Delta()).eval()
    mean, var = propagate_moments(delta, x)
    assert torch.equal(mean, delta(x)) and not var.any()
    bayes = varbnn.bayesianize(lenet5(), varbnn.MeanField(init_std=0.1))
    with varbnn.nn.sample_mode(bayes, "mean"):
        mean, var = propagate_moments(bayes, x)
        assert torch.equal(mean, bayes(x)) and not var.any()


def test_lenet5_moments_are_close_to_monte_carlo() -> None:
    # max pooling over outputs that share a kernel (correlated, treated as independent) makes LeNet-5's propagation
    # approximate: at the default initial std (0.01) the mean is within one output std of Monte Carlo's (measured:
    # 0.56) and the variance within a factor 1.25 (0.99-1.13); the approximation worsens as the std grows (at 0.05
    # the variance is 1.6-1.7x Monte Carlo's), see benchmarks/results/moment-predictive for trained networks
    torch.manual_seed(5)
    net = varbnn.bayesianize(lenet5(), varbnn.MeanField(init_std=0.01))
    x = torch.rand(4, 1, 28, 28)
    mean, var = propagate_moments(net, x)
    mc_mean, mc_var = _monte_carlo(net, x, 4000)
    assert ((mean.double() - mc_mean).abs() <= mc_var.sqrt()).all()
    ratio = var.double() / mc_var
    assert ratio.min() > 0.8 and ratio.max() < 1.25


def test_moment_predictive_through_predict_and_temperature_scaling() -> None:
    torch.manual_seed(6)
    net = varbnn.bayesianize(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)), varbnn.MeanField(init_std=0.2))
    wrapper = MomentPredictive(net)
    x = torch.randn(7, 5)
    draws = varbnn.predict(wrapper, x, samples=16, seed=3)
    assert draws.shape == (16, 7, 3)
    assert torch.equal(draws, varbnn.predict(wrapper, x, samples=16, seed=3))  # seeded: reproducible
    mean, var = propagate_moments(net, x)
    big = varbnn.predict(wrapper, x, samples=20_000, seed=1).double()
    torch.testing.assert_close(big.mean(0), mean.double(), atol=float(5 * (var.max() / 20_000).sqrt()), rtol=0)
    assert wrapper(x).shape == (7, 3)
    # a temperature over the moment predictive: the moments are divided by T and T^2
    scaled = TemperatureScaled(net, temperature=2.0)
    m2, v2 = propagate_moments(scaled, x)
    torch.testing.assert_close(m2, mean / 2)
    torch.testing.assert_close(v2, var / 4)
    y = torch.randint(0, 3, (7,))
    fitted = TemperatureScaled(MomentPredictive(net)).fit(x, y, samples=8)
    scaled_draws = varbnn.predict(fitted, x, samples=4, seed=2)  # the wrapper's own draws, divided by T
    torch.testing.assert_close(scaled_draws, varbnn.predict(wrapper, x, samples=4, seed=2) / fitted.temperature)
    assert set(wrapper.state_dict()) == {f"model.{k}" for k in net.state_dict()}


def test_unsupported_models_are_named() -> None:
    radial = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2)), varbnn.Radial())
    with pytest.raises(TypeError, match="Radial posterior, whose elements are not independent"):
        propagate_moments(radial, torch.randn(2, 3))
    with pytest.raises(TypeError, match="Tanh is not supported.*supported modules: nn.Sequential"):
        propagate_moments(nn.Sequential(nn.Linear(3, 2), nn.Tanh()), torch.randn(2, 3))

    class Custom(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    with pytest.raises(TypeError, match="Custom is not supported"):
        propagate_moments(Custom(), torch.randn(2, 3))
    padded = nn.Sequential(varbnn.BayesConv2d(1, 2, 3), nn.MaxPool2d(2, padding=1))
    with pytest.raises(TypeError, match="padding=0"):
        propagate_moments(padded, torch.randn(1, 1, 8, 8))
    with pytest.raises(ValueError, match="NaN"):
        propagate_moments(nn.Sequential(nn.Linear(3, 2)), torch.tensor([[0.0, float("nan"), 1.0]]))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        propagate_moments(nn.Sequential(nn.Linear(3, 2)), np.zeros((2, 3)))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        MomentPredictive("net")  # type: ignore[arg-type]


def test_predict_evaluate_and_temperature_take_the_predictive() -> None:
    torch.manual_seed(7)
    net = varbnn.bayesianize(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)), varbnn.MeanField(init_std=0.2))
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    moments = varbnn.predict(net, x, samples=8, seed=0, predictive="moments")
    torch.testing.assert_close(moments, varbnn.predict(MomentPredictive(net), x, samples=8, seed=0))
    torch.testing.assert_close(varbnn.predict(net, x, samples=8, seed=0, predictive="auto"), moments)
    sampled = varbnn.predict(net, x, samples=8, seed=0, predictive="sample")
    assert not torch.allclose(sampled, moments)
    # "auto" draws the weights where moments cannot follow the network: a Radial posterior, an ensemble's own draws
    radial = varbnn.bayesianize(nn.Sequential(nn.Linear(5, 3)), varbnn.Radial())
    torch.testing.assert_close(
        varbnn.predict(radial, x, samples=4, seed=1, predictive="auto"), varbnn.predict(radial, x, samples=4, seed=1)
    )
    ensemble = varbnn.baselines.DeepEnsemble([net, copy.deepcopy(net)])
    torch.testing.assert_close(
        varbnn.predict(ensemble, x, samples=4, seed=1, predictive="auto"), varbnn.predict(ensemble, x, samples=4, seed=1)
    )
    with pytest.raises(TypeError, match="Radial posterior"):
        varbnn.predict(radial, x, predictive="moments")
    with pytest.raises(ValueError, match=r"predictive must be one of \('sample', 'moments', 'auto'\), got 'mean'"):
        varbnn.predict(net, x, predictive="mean")
    metrics = varbnn.evaluate(net, x, y, samples=8, predictive="moments")
    assert set(metrics) >= {"nll", "accuracy"}
    x = torch.randn(60, 5)
    y = propagate_moments(net, x)[0].argmax(-1)
    y[:25] = (y[:25] + 1) % 3  # 35 right, 25 wrong: a finite temperature
    torch.manual_seed(8)
    scaled = TemperatureScaled(net).fit(x, y, samples=8, predictive="moments")
    torch.manual_seed(8)
    manual = TemperatureScaled(MomentPredictive(net)).fit(x, y, samples=8)
    assert 0.05 < float(scaled.temperature) < 20
    assert float(scaled.temperature) == pytest.approx(float(manual.temperature), rel=1e-6)


def test_moment_support_names_the_first_unsupported_part() -> None:
    from varbnn.moments import moment_support

    assert moment_support(varbnn.bayesianize(lenet5())) is None
    assert moment_support(nn.Sequential(nn.Linear(2, 2), nn.GELU())) == "GELU is not supported"
    assert "Radial posterior" in moment_support(varbnn.bayesianize(nn.Sequential(nn.Linear(2, 2)), varbnn.Radial()))
    assert "padding" in moment_support(nn.Sequential(nn.MaxPool2d(2, padding=1)))
    assert moment_support(TemperatureScaled(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))) is None
    radial = TemperatureScaled(varbnn.bayesianize(nn.Sequential(nn.Linear(2, 2)), varbnn.Radial()))
    assert "Radial posterior" in moment_support(radial)  # a wrapper's own rule reports what it wraps
    with pytest.raises(TypeError, match="Radial posterior"):
        propagate_moments(nn.Sequential(radial), torch.randn(3, 2))
    # plain convolutions with another padding mode: the variance is padded as the mean (reflection copies values)
    conv = nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")
    net = nn.Sequential(varbnn.BayesConv2d(1, 1, 1, family=varbnn.MeanField(init_std=0.3)), conv)
    assert moment_support(net) is None
    x = torch.randn(2, 1, 5, 5)
    mean, var = propagate_moments(net, x)
    mc_mean, mc_var = _monte_carlo(net, x, 20_000)
    assert ((mean.double() - mc_mean).abs() <= 5 * (mc_var / 20_000).sqrt() + 1e-6).all()


def test_half_precision_keeps_small_variances() -> None:
    # float16's smallest normal number is 6e-5: the max's theta must not be floored at its square root
    m = torch.tensor([1.0, 0.0, -1.0])
    v = torch.full((3,), 1e-4)
    mean16, var16 = relu_moments(m.half(), v.half())
    mean32, var32 = relu_moments(m, v)
    assert mean16.dtype == torch.float16
    torch.testing.assert_close(mean16.float(), mean32, rtol=2e-3, atol=1e-4)
    torch.testing.assert_close(var16.float(), var32, rtol=5e-3, atol=1e-6)


def test_a_family_that_draws_its_own_way_is_not_followed() -> None:
    # the capability VariationalFamily.independent_elements is reset for a subclass that overrides rsample: its draws
    # may be dependent, so the propagation refuses it rather than trust MeanField's moments
    from varbnn.moments import moment_support

    class Correlated(varbnn.MeanField):
        def rsample(self, sample_shape=torch.Size()):  # one shared noise for every element
            eps = torch.randn(sample_shape + (1,) * self.loc.dim())
            return self.loc + self.scale * eps

    assert varbnn.KTied.independent_elements and varbnn.Delta.independent_elements
    assert not Correlated.independent_elements and not varbnn.Radial.independent_elements
    net = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2)), Correlated())
    assert "Correlated posterior, whose elements are not independent" in moment_support(net)
    with pytest.raises(TypeError, match="Correlated posterior"):
        propagate_moments(net, torch.randn(2, 3))
