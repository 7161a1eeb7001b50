"""Radial-and-directional posterior (Oh et al. 2020): KL closed forms, the half-Cauchy decomposition, radius
formulas, weight assembly per grouping, gradients, float32 stability, fallbacks and errors."""

import copy
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn
from torch.distributions import Gamma, InverseGamma, LogNormal, kl_divergence

from varbnn import BayesConv2d, BayesLinear, RadialDirectional, RadialDirectionalPrior, bayesianize, elbo_loss, kl, predict
from varbnn.distributions import HypersphericalUniform, VonMisesFisher
from varbnn.distributions.vmf import log_normalizer_and_resultant
from varbnn.divergence import half_cauchy_pair_kl
from varbnn.families import KTied, MeanField, Radial
from varbnn.families.rdp import _from_groups, _to_groups
from varbnn.priors import Normal, banerjee_concentration


def rdp(shape, grouping="row", **kwargs):
    return RadialDirectional(grouping=grouping, **kwargs).build(shape)


@pytest.mark.parametrize("m, s", [(0.3, 0.4), (-2.0, 0.05), (1.5, 1.2)])
@pytest.mark.parametrize(
    "prior",
    [
        lambda: Gamma(torch.tensor(0.5, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64)),
        lambda: Gamma(torch.tensor(0.5, dtype=torch.float64), torch.tensor(1e4, dtype=torch.float64)),
        lambda: InverseGamma(torch.tensor(0.5, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)),
        lambda: InverseGamma(torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)),
    ],
)
def test_lognormal_kls_match_monte_carlo(m, s, prior):
    q = LogNormal(torch.tensor(m, dtype=torch.float64), torch.tensor(s, dtype=torch.float64))
    p = prior()
    torch.manual_seed(0)
    x = q.sample((400_000,))
    log_ratio = q.log_prob(x) - p.log_prob(x)
    estimate, stderr = float(log_ratio.mean()), float(log_ratio.std()) / math.sqrt(x.numel())
    assert float(kl_divergence(q, p)) == pytest.approx(estimate, abs=5 * stderr + 1e-9)


@pytest.mark.parametrize("scale", [1.0, 5e-3])
def test_gamma_times_inverse_gamma_is_a_squared_half_cauchy(scale):
    """The prior's decomposition (eq. 7): sqrt(Gamma(1/2, rate 1/scale^2) * InvGamma(1/2, 1)) ~ C+(scale)."""
    torch.manual_seed(0)
    a = Gamma(torch.tensor(0.5, dtype=torch.float64), torch.tensor(1 / scale**2, dtype=torch.float64)).sample((20000,))
    b = InverseGamma(torch.tensor(0.5, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)).sample((20000,))
    samples = (a * b).sqrt().numpy()
    assert stats.kstest(samples, stats.halfcauchy(scale=scale).cdf).pvalue > 1e-3


def test_radius_formulas_match_samples_and_torch_lognormal():
    family = rdp((6, 30), "row", init_log_std=0.3)
    with torch.no_grad():
        family.row_local_loc.uniform_(-1, 1)
    mean, var = family.log_radius_moments("row")
    torch.manual_seed(1)
    with torch.no_grad():
        norms = torch.linalg.vector_norm(family.rsample((4000,)), dim=-1)
    log_norms = norms.log().double()
    torch.testing.assert_close(log_norms.mean(0), mean.double(), atol=0.04, rtol=0)
    torch.testing.assert_close(log_norms.var(0), var.double(), atol=0.02, rtol=0.1)
    for g in range(6):  # each row's norm is the radius: log-normal with those moments
        z = ((log_norms[:, g] - float(mean[g])) / math.sqrt(float(var[g]))).numpy()
        assert stats.kstest(z, "norm").pvalue > 1e-4
    local_mean, local_var = family.log_radius_moments("row", local_only=True)
    expected_mode = LogNormal(local_mean, local_var.sqrt()).mode.log()
    torch.testing.assert_close(family.log_radius_mode("row"), expected_mode)


@pytest.mark.parametrize("grouping", ["row", "column", "double"])
def test_mean_formula_matches_the_sample_average(grouping):
    family = rdp((5, 8), grouping, init_log_std=0.2, init_resultant=0.6)
    torch.manual_seed(2)
    with torch.no_grad():
        samples = family.rsample((20000,))
        mean = family.mean
    stderr = samples.std(0) / math.sqrt(samples.shape[0])
    assert bool(((samples.mean(0) - mean).abs() < 5 * stderr + 1e-4).all())


@pytest.mark.parametrize("sample_shape", [(), (3,)])
def test_a_dense_column_factor_draws_its_noise_in_the_weights_layout(monkeypatch, sample_shape):
    """Columns of a dense (out, in) weight are drawn as N(0, 1) noise of the weight's own shape, read transposed (the
    factor's output pass and the double grouping's product then run along memory); the column directions' gradient
    comes back in the parameter's layout. The distribution is checked by test_mean_formula_matches_the_sample_average."""
    family = rdp((5, 9), "double")
    shapes = []
    randn = torch.randn

    def recording(*args, **kwargs):
        shapes.append(tuple(args[0]) if len(args) == 1 and not isinstance(args[0], int) else tuple(args))
        return randn(*args, **kwargs)

    monkeypatch.setattr(torch, "randn", recording)
    w = family.rsample(sample_shape)
    weight, transposed = tuple(sample_shape) + (5, 9), tuple(sample_shape) + (9, 5)
    assert shapes.count(weight) == 2 and transposed not in shapes, shapes  # the row and the column factor's noise
    assert w.shape == weight and w.is_contiguous()
    (w * torch.arange(w.numel(), dtype=w.dtype).reshape(w.shape)).sum().backward()
    assert family.col_direction.grad is not None and family.col_direction.grad.is_contiguous()


def test_groups_round_trip_and_conv_grouping_follows_the_paper():
    w = torch.randn(4, 3, 2, 5)
    for grouping in ("row", "column"):
        assert torch.equal(_from_groups(_to_groups(w, grouping), w.shape, grouping), w)
    assert torch.equal(_to_groups(w, "row")[1], w[1].reshape(-1))  # row = output channel, dim in*kh*kw
    assert torch.equal(_to_groups(w, "column")[2], w[:, 2].reshape(-1))  # column = input channel, dim out*kh*kw
    family = rdp((4, 3, 2, 5), "column")
    with torch.no_grad():
        sample = family.rsample()
    assert sample.shape == (4, 3, 2, 5)
    norms = torch.linalg.vector_norm(sample.transpose(0, 1).reshape(3, -1), dim=1)
    mean, var = family.log_radius_moments("column")
    assert bool(((norms.log() - mean).abs() < 6 * var.sqrt()).all())  # one radius per input channel


def test_row_and_double_posteriors_start_at_the_initial_weight():
    init = torch.randn(7, 9)
    row = RadialDirectional(grouping="row").build((7, 9), init)
    double = RadialDirectional(grouping="double").build((7, 9), init)
    torch.testing.assert_close(row.mode, init, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(double.mode, init, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("grouping", ["row", "double"])
def test_prior_radius_init_keeps_the_weights_and_puts_the_gamma_factors_at_their_kl_minimum(grouping):
    torch.manual_seed(0)
    prior = RadialDirectionalPrior(global_scale=1e-4, local_scale=5e-3)
    init = torch.randn(6, 8)
    even = RadialDirectional(grouping=grouping, radius_init="even").build((6, 8), init)
    adapted = RadialDirectional(grouping=grouping, radius_init="prior").build((6, 8), init)
    even.adapt_to_prior(prior)  # a no-op for "even"
    adapted.adapt_to_prior(prior)
    torch.testing.assert_close(adapted.mode, even.mode, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(adapted.mean, even.mean, rtol=1e-5, atol=1e-7)
    # the KL terms (checked against Monte Carlo above) of the Gamma factors and of the global InvGamma factor are
    # stationary in their locations; the local InvGamma factor carries the radius
    for g in adapted.groupings:
        for part, scale, stationary in (("local", 5e-3, [0]), ("global", 1e-4, [0, 1])):
            loc = adapted._param(g, f"{part}_loc").detach().double().requires_grad_(True)
            sigma = F.softplus(adapted._param(g, f"{part}_rho").detach().double())
            (grad,) = torch.autograd.grad(half_cauchy_pair_kl(loc, sigma, scale**-2).sum(), loc)
            assert grad[..., stationary].abs().max() < 1e-6, (g, part, grad)
    assert float(adapted.kl(prior)) < 1e-3 * float(even.kl(prior))  # ~1e8 nats of global-scale KL are gone


def test_log_concentration_parameter_starts_at_the_same_kappa_and_moves_it_by_a_factor_per_adam_step():
    init = torch.randn(6, 300)
    soft = RadialDirectional(grouping="row", concentration_param="softplus").build((6, 300), init)
    log = RadialDirectional(grouping="row", concentration_param="log").build((6, 300), init)
    kappa0 = float(soft.concentration("row"))
    assert float(log.concentration("row")) == pytest.approx(kappa0, rel=1e-5)
    torch.testing.assert_close(log.mode, soft.mode)
    for family in (soft, log):  # one Adam step that lowers kappa (a pure KL pull towards a weaker prior)
        optimizer = torch.optim.Adam([family.row_concentration_rho], lr=1e-2)
        family.concentration("row").backward()
        optimizer.step()
    assert kappa0 - float(soft.concentration("row")) == pytest.approx(1e-2, rel=1e-3)  # rho ~= kappa: -0.01
    assert float(log.concentration("row")) == pytest.approx(kappa0 * math.exp(-1e-2), rel=1e-4)  # x e^-0.01


def test_layers_adapt_the_family_to_its_prior():
    prior = RadialDirectionalPrior(global_scale=1e-3, local_scale=1e-2)
    layer = BayesLinear(8, 6, family=RadialDirectional(grouping="row"), prior=prior)
    family = layer.posteriors["weight"]
    var = F.softplus(family.row_global_rho.detach()).square()
    torch.testing.assert_close(family.row_global_loc.detach()[0], math.log(1e-3**2 / 2) - var[0] / 2)
    plain = BayesLinear(8, 6, family=RadialDirectional(grouping="row"), prior=Normal(0.0, 1.0))
    assert float(plain.posteriors["weight"].row_global_loc.detach().abs().max()) == 0.0  # no RDP prior: unchanged


@pytest.mark.parametrize("grouping", ["row", "column", "double"])
def test_gradients_reach_every_parameter_and_the_score_term_is_added(grouping):
    torch.manual_seed(0)
    layer = BayesLinear(6, 5, family=RadialDirectional(grouping=grouping), prior=RadialDirectionalPrior())
    x, y = torch.randn(16, 6), torch.randn(16, 5)
    terms = elbo_loss(F.mse_loss(layer(x), y), layer, n_data=100)
    assert layer.posteriors["weight"].pending_score is None  # taken by elbo_loss
    terms.loss.backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    # the score term changes the concentration gradient but not the loss value
    grads = {}
    for correction in (True, False):
        torch.manual_seed(3)
        layer.posteriors["weight"].score_correction = correction
        layer.zero_grad()
        terms = elbo_loss(F.mse_loss(layer(x), y), layer, n_data=100)
        terms.loss.backward()
        family = layer.posteriors["weight"]
        grads[correction] = (float(terms.loss), float(family._param(family.groupings[0], "concentration_rho").grad))
    assert grads[True][0] == pytest.approx(grads[False][0], rel=1e-6)
    assert grads[True][1] != pytest.approx(grads[False][1], rel=1e-6)


def test_no_nan_in_float32_for_rows_of_dimension_4096():
    torch.manual_seed(0)
    layer = BayesLinear(4096, 16, family=RadialDirectional(grouping="double"), prior=RadialDirectionalPrior())
    x = torch.randn(8, 4096)
    terms = elbo_loss(layer(x).square().mean(), layer, n_data=1000)
    terms.loss.backward()
    assert torch.isfinite(terms.loss) and torch.isfinite(terms.kl)
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_kl_is_the_sum_of_direction_and_radius_parts():
    family = rdp((4, 10), "row", init_resultant=0.7)
    uniform = RadialDirectionalPrior(global_scale=0.5, local_scale=2.0, direction="uniform")
    tied = RadialDirectionalPrior(global_scale=0.5, local_scale=2.0, concentration=7.0)
    kappa = family.concentration("row")
    e1 = torch.zeros(1, 10)
    e1[0, 0] = 1
    q = VonMisesFisher(e1, kappa.reshape(1))
    radius = 0.0
    for part, scale in (("local", 2.0), ("global", 0.5)):
        loc, sigma = getattr(family, f"row_{part}_loc"), F.softplus(getattr(family, f"row_{part}_rho"))
        radius += kl_divergence(LogNormal(loc[..., 0], sigma[..., 0]), Gamma(torch.tensor(0.5), torch.tensor(scale**-2))).sum()
        radius += kl_divergence(LogNormal(loc[..., 1], sigma[..., 1]), InverseGamma(torch.tensor(0.5), torch.tensor(1.0))).sum()
    direction_uniform = 4 * kl_divergence(q, HypersphericalUniform(10, torch.Size([1]))).sum()
    direction_tied = 4 * kl_divergence(q, VonMisesFisher(e1, torch.tensor([7.0]))).sum()
    torch.testing.assert_close(family.kl(uniform), direction_uniform + radius)
    torch.testing.assert_close(family.kl(tied), direction_tied + radius)
    # the tied direction KL vanishes when the concentrations agree
    matched = RadialDirectionalPrior(concentration=float(kappa))
    zero_dir = family.kl(matched) - family.kl(RadialDirectionalPrior(direction="uniform")) + direction_uniform
    assert float(zero_dir) == pytest.approx(0.0, abs=1e-3)


def test_the_kl_reuses_the_forward_passes_bessel_evaluation_once_and_never_a_stale_one():
    """The draw's fused (log C_d, A_d) evaluation (both groupings in one call) feeds the next KL of the same step: same
    value and gradient as a fresh evaluation; used once (a second KL and its backward work); ignored after the
    concentration changes. The batched evaluation equals one evaluation per sphere."""
    prior = RadialDirectionalPrior(global_scale=0.5, local_scale=2.0, concentration=7.0)
    family = rdp((4, 10), "double", init_resultant=0.7)
    rho = family.row_concentration_rho

    def kl_and_grad():
        value = family.kl(prior)
        (grad,) = torch.autograd.grad(value, rho)
        return value.detach(), grad

    batched = family.normalizers()
    for grouping in ("row", "column"):
        dim = family._param(grouping, "direction").shape[1]
        single = log_normalizer_and_resultant(dim, family.concentration(grouping).double())
        torch.testing.assert_close(batched[grouping][0], single[0], rtol=1e-13, atol=0)
        torch.testing.assert_close(batched[grouping][1], single[1], rtol=1e-13, atol=0)
    fresh_value, fresh_grad = kl_and_grad()  # nothing cached yet
    family.rsample()  # grad enabled: caches both groupings' evaluations
    assert family._normalizer_cache is not None and set(family._normalizer_cache[1]) == {"row", "column"}
    cached_value, cached_grad = kl_and_grad()
    assert family._normalizer_cache is None
    torch.testing.assert_close(cached_value, fresh_value, rtol=0, atol=0)
    torch.testing.assert_close(cached_grad, fresh_grad, rtol=1e-12, atol=0)
    again_value, _ = kl_and_grad()  # recomputed, not the consumed graph
    torch.testing.assert_close(again_value, fresh_value, rtol=0, atol=0)
    family.rsample()
    with torch.no_grad():
        rho.add_(0.5)  # an optimizer step: the cached evaluation is stale
    stale_value, _ = kl_and_grad()
    family._normalizer_cache = None
    torch.testing.assert_close(stale_value, kl_and_grad()[0], rtol=0, atol=0)
    assert float(stale_value) != pytest.approx(float(fresh_value))


def test_fallbacks_and_prior_errors():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = bayesianize(
            nn.Sequential(nn.Linear(13, 50), nn.ReLU(), nn.Linear(50, 1)), RadialDirectional(), RadialDirectionalPrior()
        )
    assert any("falls back to MeanField" in str(w.message) for w in caught)
    assert type(model[0].posteriors["weight"]) is RadialDirectional
    assert type(model[0].posteriors["bias"]) is MeanField and type(model[2].posteriors["weight"]) is MeanField
    # fallback tensors are scored against the prior's fallback Normal(0, 1)
    fallback = model[2].posteriors["weight"].kl(Normal(0.0, 1.0))
    torch.testing.assert_close(model[2].posteriors["weight"].kl(RadialDirectionalPrior()), fallback)
    assert torch.isfinite(kl(model))
    # a conv with one input channel keeps RDP (one column group of dimension out*kh*kw)
    conv = BayesConv2d(1, 6, 3, family=RadialDirectional(), prior=RadialDirectionalPrior())
    assert type(conv.posteriors["weight"]) is RadialDirectional
    wrong = BayesLinear(5, 4, family=RadialDirectional(), prior=Normal(0.0, 1.0))
    with pytest.raises(ValueError, match="needs a RadialDirectionalPrior"):
        kl(wrong)
    with pytest.raises(NotImplementedError, match="no density"):
        RadialDirectionalPrior().distribution((3, 3))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: RadialDirectional(grouping="diagonal"), "grouping must be one of"),
        (lambda: RadialDirectional(init_log_std=0.0), "init_log_std"),
        (lambda: RadialDirectional(init_resultant=1.0), "init_resultant"),
        (lambda: RadialDirectional(ratio_method="fast"), "ratio_method"),
        (lambda: RadialDirectional(radius_init="uniform"), r"radius_init must be one of \('prior', 'even'\)"),
        (lambda: RadialDirectional(concentration_param="sqrt"), r"concentration_param must be one of \('softplus', 'log'\)"),
        (lambda: RadialDirectionalPrior(global_scale=-1.0), "global_scale"),
        (lambda: RadialDirectionalPrior(direction="north"), "direction must be one of"),
        (lambda: RadialDirectionalPrior(concentration=0.0), "concentration"),
    ],
)
def test_bad_arguments_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_banerjee_concentration_gives_roughly_the_requested_resultant():
    for dim in (10, 100, 1000):
        kappa = banerjee_concentration(dim, 0.9)
        a = float(VonMisesFisher(torch.eye(dim)[:1].double(), torch.tensor([kappa], dtype=torch.float64)).mean_resultant_length)
        assert a == pytest.approx(0.9, abs=0.01)
    assert np.isclose(banerjee_concentration(3, 0.5), 0.5 * (3 - 0.25) / 0.75)


def test_gap_threshold_rule():
    from varbnn.prune import gap_threshold

    scores = torch.tensor([-20.0, -19.5, -19.0, -3.0, -2.5, -2.0])
    assert gap_threshold(scores) == pytest.approx(-11.0)
    assert gap_threshold(torch.tensor([-2.0, -1.8, -1.5, -1.1])) == float("-inf")  # no gap >= 1 nat: keep all
    assert gap_threshold(torch.tensor([1.0])) == float("-inf")
    with pytest.raises(ValueError, match="NaN"):
        gap_threshold(torch.tensor([0.0, float("nan")]))


def test_unit_scores_masks_and_histograms(tmp_path):
    from varbnn.prune import score_histograms, select_units, unit_scores

    model = bayesianize(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), RadialDirectional(), RadialDirectionalPrior(),
                        pretrained=False)
    family = model[0].posteriors["weight"]
    with torch.no_grad():
        family.row_local_loc[:3] = -15.0  # three dead output units
    scores = unit_scores(model)
    assert set(scores) == {("0", "row"), ("0", "column"), ("2", "row"), ("2", "column")}
    torch.testing.assert_close(scores[("0", "row")], family.log_radius_mode("row").detach())
    keep = select_units(model)
    assert keep[("0", "row")].tolist() == [False] * 3 + [True] * 5
    assert bool(keep[("0", "column")].all())
    assert select_units(model, threshold=-100.0)[("0", "row")].all()
    with pytest.raises(ValueError, match="'gap'"):
        select_units(model, threshold="largest")
    path = score_histograms(model, tmp_path / "hist.png")
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="no RadialDirectional"):
        unit_scores(nn.Sequential(nn.Linear(2, 2)))


def _kill(family, grouping, units):
    with torch.no_grad():
        family._param(grouping, "local_loc")[units] = -15.0


def test_export_removes_units_physically_and_matches_the_masked_model():
    from varbnn.models import lenet5
    from varbnn.prune import count_parameters_and_flops, export, lenet5_sizes, masked_model

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = bayesianize(lenet5(), RadialDirectional(), RadialDirectionalPrior())
    _kill(model[0].posteriors["weight"], "row", [0, 1, 2])  # conv1: 3 of 20 channels
    _kill(model[3].posteriors["weight"], "row", list(range(10, 50)))  # conv2: keep 10 of 50 channels
    _kill(model[3].posteriors["weight"], "column", [5])  # conv2 stops reading conv1 channel 5
    fc1_cols = [c * 16 + s for c in range(10) for s in range(0, 16, 2)]  # half the positions of the kept channels
    _kill(model[7].posteriors["weight"], "column", fc1_cols)
    _kill(model[7].posteriors["weight"], "row", list(range(100, 500)))  # fc1: keep 100 of 500
    x = torch.rand(6, 1, 28, 28)
    exported, report = export(model, x)
    assert not any(isinstance(m, nn.Module) and hasattr(m, "posteriors") for m in exported.modules())
    assert report["architecture"] == "16-10-80-100"
    convs = [m for m in exported if isinstance(m, nn.Conv2d)]
    linears = [m for m in exported if isinstance(m, nn.Linear)]
    assert [c.out_channels for c in convs] == [16, 10] and convs[1].in_channels == 16
    assert (linears[0].in_features, linears[0].out_features, linears[1].out_features) == (80, 100, 10)
    reference = masked_model(model, report)
    torch.testing.assert_close(exported(x), reference(x), rtol=1e-5, atol=1e-5)
    params, flops = count_parameters_and_flops(exported, x)
    assert (params, flops) == (report["parameters"], report["flops"])
    expected_params = (16 * 25 + 16) + (10 * 16 * 25 + 10) + (80 * 100 + 100) + (100 * 10 + 10)
    expected_flops = (25 + 1) * 24 * 24 * 16 + (25 * 16 + 1) * 8 * 8 * 10 + 81 * 100 + 101 * 10
    assert (params, flops) == (expected_params, expected_flops)
    assert report["dense_parameters"] == 431080  # LeNet-5-Caffe
    assert lenet5_sizes(report["architecture"]) == (params, flops)  # fc1 reads 80 of its kept channels' 160 positions


def test_lenet5_sizes_count_what_count_parameters_and_flops_counts_and_refuse_other_architectures():
    from varbnn.models import lenet5
    from varbnn.prune import count_parameters_and_flops, lenet5_sizes

    x = torch.zeros(1, 1, 28, 28)
    for c1, c2, h in ((20, 50, 500), (4, 7, 66), (1, 1, 1), (3, 13, 63)):
        assert lenet5_sizes((c1, c2, 16 * c2, h)) == count_parameters_and_flops(lenet5(widths=(c1, c2, h)), x)
    assert lenet5_sizes("20-50-800-500") == (431080, 2308230)
    for bad in ("4-7-113-66", "4-7-110", "0-7-50-66", (4, 7, 110, 66, 10)):  # 113 > 16 * 7 inputs; 3 or 5 numbers; 0
        with pytest.raises(ValueError, match="architecture"):
            lenet5_sizes(bad)


def test_export_of_an_mlp_selects_input_features_and_rejects_unsupported_models():
    from varbnn.models import mlp, row_lstm
    from varbnn.prune import SelectFeatures, export, masked_model

    model = bayesianize(mlp(20, (12,), 4), RadialDirectional(), RadialDirectionalPrior())
    _kill(model[1].posteriors["weight"], "column", list(range(0, 20, 3)))
    x = torch.rand(5, 20)
    exported, report = export(model, x)
    assert report["architecture"] == "13-12"
    assert isinstance(exported[1], SelectFeatures) and exported[1].index.numel() == 13
    torch.testing.assert_close(exported(x), masked_model(model, report)(x))
    with pytest.raises(NotImplementedError, match="nn.Sequential"):
        export(bayesianize(row_lstm(), RadialDirectional(), RadialDirectionalPrior()), torch.rand(2, 28, 28), keep={})


def test_lognormal_kls_take_python_number_priors_without_changing_the_value():
    from varbnn.divergence import lognormal_gamma_kl, lognormal_inverse_gamma_kl

    m, s = torch.tensor([-1.0, 0.3], dtype=torch.float64), torch.tensor([0.2, 1.5], dtype=torch.float64)
    for fn in (lognormal_gamma_kl, lognormal_inverse_gamma_kl):
        as_tensors = fn(m, s, torch.tensor(0.5, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64))
        torch.testing.assert_close(fn(m, s, 0.5, 2.0), as_tensors, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(fn(m.float(), s.float(), 0.5, 2.0), as_tensors.float())


@pytest.mark.parametrize("shape", [(2,), (7, 2)], ids=["global-pair", "local-pairs"])
def test_half_cauchy_pair_kl_equals_the_two_lognormal_kls_with_gradients(shape):
    from varbnn.divergence import half_cauchy_pair_kl, lognormal_gamma_kl, lognormal_inverse_gamma_kl

    g = torch.Generator().manual_seed(2)
    loc = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.5).requires_grad_()
    sigma = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.05).requires_grad_()
    rate = 0.37
    got = half_cauchy_pair_kl(loc, sigma, rate)
    expected = (
        lognormal_gamma_kl(loc[..., 0], sigma[..., 0], 0.5, rate).sum()
        + lognormal_inverse_gamma_kl(loc[..., 1], sigma[..., 1], 0.5, 1.0).sum()
    )
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got, [loc, sigma]), torch.autograd.grad(expected, [loc, sigma])):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="rate"):
        half_cauchy_pair_kl(loc, sigma, -1.0)
    with pytest.raises(ValueError, match=r"\[\.\.\., 2\]"):
        half_cauchy_pair_kl(loc[..., :1], sigma[..., :1], rate)


@pytest.mark.parametrize("sample_shape", [(), (3,)], ids=["one-draw", "three-draws"])
def test_fused_radius_draw_matches_autograd_of_the_moments(sample_shape):
    """The one-node radius draw exp(m + sqrt(v) z) against autograd through log_radius_moments, and gradcheck."""
    from varbnn.families.rdp import _RADIUS_PARAMS, _LogNormalRadius

    torch.manual_seed(0)
    fam = RadialDirectional(grouping="row").build((5, 7), torch.randn(5, 7, dtype=torch.float64))
    with torch.no_grad():  # spread the standard deviations, one rho above softplus's linear threshold (20)
        fam.row_local_rho.copy_(torch.randn(5, 2, dtype=torch.float64) * 2)
        fam.row_local_rho[0, 1] = 21.0
        fam.row_global_rho.copy_(torch.tensor([-1.0, 0.5], dtype=torch.float64))
    params = [getattr(fam, f"row_{name}") for name in _RADIUS_PARAMS]
    z = torch.randn(sample_shape + (5,), dtype=torch.float64)
    weights = torch.randn(sample_shape + (5,), dtype=torch.float64)
    got = _LogNormalRadius.apply(*params, z)
    (got * weights).sum().backward()
    fused_grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    mean, variance = fam.log_radius_moments("row")
    want = torch.exp(mean + variance.sqrt() * z)
    (want * weights).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0)
    # rtol 1e-9: above rho = 20 torch's softplus backward uses 1 for sigmoid(rho) (1 - 2e-9 at 20), the node sigmoid itself
    for fused, reference in zip(fused_grads, (p.grad for p in params)):
        torch.testing.assert_close(fused, reference, rtol=1e-9, atol=1e-14)
    inputs = tuple(p.detach().clone().requires_grad_() for p in params)
    assert torch.autograd.gradcheck(lambda *a: _LogNormalRadius.apply(*a, z), inputs)
    # the plain operations a torch.func transform runs (predict's vmap over draws): the same value and gradients
    from varbnn.families.rdp import _log_normal_radius

    for p in params:
        p.grad = None
    plain = _log_normal_radius(*params, z)
    (plain * weights).sum().backward()
    torch.testing.assert_close(plain, got, rtol=1e-13, atol=0)
    for fused, reference in zip(fused_grads, (p.grad for p in params)):
        torch.testing.assert_close(reference, fused, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("grouping", ["row", "column", "double"])
def test_predict_batches_the_draws_under_vmap_and_matches_the_loop_in_distribution(grouping):
    """predict's vectorised path runs an RDP model under torch.func.vmap (it fell back to the loop over draws while
    the family's autograd Functions were not transform-ready), with independent draws, and its predictive mean and
    spread match the loop's within Monte Carlo error."""
    from torch.func import vmap

    torch.manual_seed(0)
    model = bayesianize(
        nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)), RadialDirectional(grouping=grouping), RadialDirectionalPrior()
    ).eval()
    x = torch.randn(7, 5)
    with torch.no_grad():
        draws = vmap(lambda _: model(x), randomness="different")(torch.arange(3))  # raises if not transform-ready
    assert not torch.equal(draws[0], draws[1])
    if grouping != "double":  # double grouping runs both spheres' code: the distribution check once, there
        return
    n = 2000
    vectorised = predict(model, x, samples=n, seed=1, vectorize=True)
    loop = predict(model, x, samples=n, seed=2, vectorize=False)
    se = torch.sqrt((vectorised.var(0) + loop.var(0)) / n)
    assert ((vectorised.mean(0) - loop.mean(0)).abs() <= 5 * se + 1e-6).all()
    torch.testing.assert_close(vectorised.std(0), loop.std(0), rtol=0.1, atol=1e-4)


def _labelled_by_itself(model, n=200, seed=0):
    """Inputs and the unpruned point model's own labels (its validation error is 0), keeping only inputs whose top two
    logits differ by > 1e-3 (a random network maps some inputs to all-zero hidden units: exact ties)."""
    from varbnn.convert import to_deterministic

    x = torch.randn(2 * n, model[0].in_features, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = to_deterministic(model, "mode")(x)
    top = logits.topk(2, dim=-1).values
    x, y = x[top[:, 0] - top[:, 1] > 1e-3][:n], logits.argmax(-1)[top[:, 0] - top[:, 1] > 1e-3][:n]
    assert len(x) == n
    return x, y


def test_validation_thresholds_stay_within_the_budget_and_no_single_removal_fits_more():
    from varbnn.prune import classification_error, export, unit_scores, validation_thresholds

    torch.manual_seed(1)
    model = bayesianize(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)), RadialDirectional(), RadialDirectionalPrior())
    _kill(model[0].posteriors["weight"], "row", [4])  # one dead hidden unit: the gap rule's start
    x, y = _labelled_by_itself(model)
    tolerance = 0.1
    keep, report = validation_thresholds(model, x, y, tolerance=tolerance)
    assert report["base_error"] == 0.0 and report["start_error"] == 0.0
    # the masks are the lowest-scored groups, counted in the report, with at least one kept per grouping
    scores = unit_scores(model)
    for key, mask in keep.items():
        n = report["removed"][f"{key[0]}/{key[1]}"]
        assert int((~mask).sum()) == n and bool(mask.any())
        if n:
            assert float(scores[key][~mask].max()) <= float(scores[key][mask].min())
    assert not keep[("0", "row")][4]  # the dead unit stays removed
    assert sum(report["removed"].values()) > 1  # it went beyond the gap rule

    def err(masks):
        return classification_error(export(model, x[:2], keep=masks)[0], x, y)

    assert err(keep) == pytest.approx(report["error"]) and report["error"] <= tolerance
    assert report["removed"]["2/row"] == 0  # the outputs are never searched over
    for key, mask in keep.items():  # oracle: every single further removal, recomputed here, breaks the budget
        if int(mask.sum()) == 1 or key == ("2", "row"):
            continue
        kept = mask.nonzero().flatten()
        one_more = mask.clone()
        one_more[kept[scores[key][kept].argmin()]] = False
        assert err({**keep, key: one_more}) > tolerance, key
    _, tight_report = validation_thresholds(model, x, y, tolerance=0.0)
    assert tight_report["error"] == 0.0
    with pytest.raises(ValueError, match="tolerance"):
        validation_thresholds(model, x, y, tolerance=1.5)


def test_finetune_restores_the_best_validation_epoch_and_never_makes_it_worse():
    from varbnn.prune import classification_error, finetune

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(600, 5, generator=generator)
    y = (x[:, :3] @ torch.randn(3, 3, generator=generator)).argmax(-1)
    train, val = (x[:400], y[:400]), (x[400:], y[400:])
    model = nn.Linear(5, 3)
    before = classification_error(model, *val)
    same, info = finetune(model, train, val, epochs=0)
    assert same is model and info["epoch"] == 0 and info["validation_error"] == before
    model, info = finetune(model, train, val, epochs=15, lr=1e-2, batch_size=50)
    assert info["validation_error"] == classification_error(model, *val) < min(before / 3, 0.2)
    assert info["epoch"] == min(h["epoch"] for h in info["history"] if h["validation_error"] == info["validation_error"])
    with pytest.raises(ValueError, match="epochs"):
        finetune(model, train, val, epochs=-1)
    # the cosine schedule: lr/2 after half the steps, 0 after the last; the constant one stays at lr
    _, info = finetune(nn.Linear(5, 3), train, val, epochs=4, lr=1e-2, batch_size=50, schedule="cosine")
    assert [h["lr"] for h in info["history"][1:]] == pytest.approx(
        [1e-2 * (1 + math.cos(math.pi * e / 4)) / 2 for e in (1, 2, 3, 4)], abs=1e-12
    )
    _, info = finetune(nn.Linear(5, 3), train, val, epochs=2, lr=1e-2, batch_size=50)
    assert [h["lr"] for h in info["history"][1:]] == [1e-2, 1e-2]
    with pytest.raises(ValueError, match="schedule"):
        finetune(model, train, val, schedule="step")


def test_iterative_budget_in_one_stage_is_budget_units_and_retrains_in_stages():
    from varbnn.prune import _export_plain, _RankedGroups, budget_units, classification_error, export, iterative_budget

    torch.manual_seed(3)
    layers = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))
    model = bayesianize(layers, RadialDirectional(), RadialDirectionalPrior())
    _kill(model[0].posteriors["weight"], "row", [2])
    x, y = _labelled_by_itself(model, n=300)
    train = _labelled_by_itself(model, n=300, seed=1)
    val = (x, y)
    # one stage without retraining: exactly budget_units' selection, exported
    keep, one_shot = budget_units(model, x, y, max_flops=60)
    exported, report = iterative_budget(model, train, val, max_flops=60, stages=1, epochs=0)
    assert report["architecture"] == export(model, x[:2], keep=keep)[1]["architecture"]
    assert (report["parameters"], report["flops"]) == (one_shot["parameters"], one_shot["flops"])
    assert report["validation_error"] == one_shot["error"] == classification_error(exported, x, y)
    # three stages with retraining: budgets fall geometrically to the target, the kept units only shrink, and the
    # returned model is the last stage's retrained one
    exported, report = iterative_budget(model, train, val, max_flops=60, stages=3, epochs=3, lr=1e-2, batch_size=50)
    stages = report["stages"]
    budgets = [stage["max_flops"] for stage in stages]
    assert budgets[-1] == 60 and budgets == sorted(budgets, reverse=True) and len(set(budgets)) == 3
    assert all(stage["flops"] <= stage["max_flops"] for stage in stages) and report["reached"]
    assert report["flops"] <= 60
    assert report["validation_error"] == classification_error(exported, x, y) <= stages[-1]["validation_error_before"]
    widths = [[int(a) for a in stage["architecture"].split("-")] for stage in stages]
    assert all(all(b <= a for a, b in zip(prev, cur)) for prev, cur in zip(widths, widths[1:]))
    # the write-back: exporting the updated dense copy with the same masks gives the retrained model exactly
    groups = _RankedGroups(model, x, y, "gap", 1.0, "mode", 1000)
    counts = dict(groups.start)
    small, small_report = _export_plain(groups.dense, x[:2], groups.masks(counts), groups.shapes)
    with torch.no_grad():
        for p in small.parameters():
            p.add_(torch.randn_like(p))
    groups.load_exported(small, small_report)
    again, _ = _export_plain(groups.dense, x[:2], groups.masks(counts), groups.shapes)
    torch.testing.assert_close(again(x), small(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="stages"):
        iterative_budget(model, train, val, max_flops=60, stages=0)
    with pytest.raises(ValueError, match="needs soft_targets"):  # checked before any search or retraining
        iterative_budget(model, train, val, max_flops=60, distill_weight=0.5)
    with pytest.raises(ValueError, match="schedule"):
        iterative_budget(model, train, val, max_flops=60, schedule="linear")
    with pytest.raises(ValueError, match="max_flops"):
        iterative_budget(model, train, val)


def test_finetune_distillation_with_one_hot_targets_is_plain_retraining_and_learns_soft_targets():
    from varbnn.prune import classification_error, finetune, predictive_targets

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=generator)
    y = (x[:, :3] @ torch.randn(3, 3, generator=generator)).argmax(-1)
    train, val = (x[:300], y[:300]), (x[300:], y[300:])
    torch.manual_seed(0)
    start = nn.Linear(5, 3)
    plain, _ = finetune(copy.deepcopy(start), train, val, epochs=2, lr=1e-2, batch_size=50)
    one_hot = nn.functional.one_hot(train[1], 3).float()
    distilled, _ = finetune(
        copy.deepcopy(start), train, val, epochs=2, lr=1e-2, batch_size=50, soft_targets=one_hot, distill_weight=1.0
    )
    for a, b in zip(plain.parameters(), distilled.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    half, _ = finetune(
        copy.deepcopy(start), train, val, epochs=2, lr=1e-2, batch_size=50, soft_targets=one_hot, distill_weight=0.5
    )
    for a, b in zip(plain.parameters(), half.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # soft targets of other labels (y + 1 mod 3) at weight 1: the model learns those labels, not y
    shifted = (y + 1) % 3
    soft = nn.functional.one_hot(shifted[:300], 3).float() * 0.9 + 0.1 / 3
    learned, info = finetune(
        copy.deepcopy(start), train, (x[300:], shifted[300:]), epochs=15, lr=1e-2, batch_size=50, soft_targets=soft,
        distill_weight=1.0,
    )  # fmt: skip
    assert info["validation_error"] < 0.2 and classification_error(learned, x[300:], y[300:]) > 0.8
    uniform = torch.full((300, 3), 1 / 3)
    with pytest.raises(ValueError, match="needs soft_targets"):
        finetune(start, train, val, distill_weight=0.5)
    with pytest.raises(ValueError, match="soft_targets must be"):
        finetune(start, train, val, soft_targets=uniform[:10], distill_weight=0.5)
    with pytest.raises(ValueError, match="distill_weight"):
        finetune(start, train, val, soft_targets=uniform, distill_weight=1.5)
    # the predictive's probabilities: rows sum to 1, reproducible for a seed, and differ between seeds
    layers = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    model = bayesianize(layers, RadialDirectional(), RadialDirectionalPrior())
    probs = predictive_targets(model, x, samples=3, batch_size=150, seed=1)
    assert probs.shape == (400, 3) and torch.allclose(probs.sum(-1), torch.ones(400))
    assert torch.equal(probs, predictive_targets(model, x, samples=3, batch_size=150, seed=1))
    assert not torch.equal(probs, predictive_targets(model, x, samples=3, batch_size=150, seed=2))


def test_budget_units_meets_the_budget_by_removing_the_dead_units_first():
    from varbnn.prune import budget_units, classification_error, export

    torch.manual_seed(2)
    model = bayesianize(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), RadialDirectional(), RadialDirectionalPrior(),
                        pretrained=False)
    _kill(model[0].posteriors["weight"], "row", [1, 4, 6])  # three dead hidden units, left in by start=-1e9
    x, y = _labelled_by_itself(model, n=400)
    full = export(model, x[:2], threshold=-1e9)[1]
    target = int(full["parameters"]) - 3 * (6 + 1 + 3)  # exactly the three dead units' weights and biases
    keep, report = budget_units(model, x, y, max_parameters=target, start=-1e9)
    assert report["reached"] and report["parameters"] <= target
    assert keep[("0", "row")].tolist() == [True, False, True, True, False, True, False, True]
    exported, check = export(model, x[:2], keep=keep)
    assert (check["parameters"], check["flops"]) == (report["parameters"], report["flops"])
    assert classification_error(exported, x, y) == report["error"]
    # the same saving where the last layer has stopped reading three units: the rule removes exactly those (free),
    # not the three lowest-scored rows of the first layer (two of them are those units, the third is live and costs)
    torch.manual_seed(2)
    other = bayesianize(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), RadialDirectional(), RadialDirectionalPrior(),
                        pretrained=False)
    _kill(other[2].posteriors["weight"], "column", [0, 3, 5])
    xo, yo = _labelled_by_itself(other, n=400)
    keep, report = budget_units(other, xo, yo, max_parameters=target, start=-1e9)
    assert report["reached"] and report["error"] == 0.0
    assert export(other, xo[:2], keep=keep)[1]["keep_out"][0] == [False, True, True, False, True, False, True, True]
    lowest_rows = other[0].posteriors["weight"].log_radius_mode("row").argsort()[:3]
    assert set(lowest_rows.tolist()) - {0, 3, 5}  # a live unit among them
    ones = {key: torch.ones_like(mask) for key, mask in keep.items()}
    rows_only = {**ones, ("0", "row"): ~torch.isin(torch.arange(8), lowest_rows)}
    assert classification_error(export(other, xo[:2], keep=rows_only)[0], xo, yo) > 0  # what a size-only rule takes
    # a budget no pruning reaches: stops where no removal lowers the excess, and says so
    keep, report = budget_units(model, x, y, max_parameters=1, max_flops=1)
    assert not report["reached"]
    assert all(int(mask.sum()) >= 1 for mask in keep.values())
    assert report["removed"]["0/row"] == 7 and report["removed"]["0/column"] == 5  # one unit and one input left
    with pytest.raises(ValueError, match="max_flops"):
        budget_units(model, x, y)


def test_reinitialize_keeps_the_exported_architecture_and_redraws_every_weight_reproducibly():
    from varbnn.prune import SelectFeatures, export, reinitialize

    torch.manual_seed(4)
    layers = nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))
    model = bayesianize(layers, RadialDirectional(grouping="double"), RadialDirectionalPrior())
    _kill(model[0].posteriors["weight"], "row", [2, 5])
    _kill(model[0].posteriors["weight"], "column", [1])
    x, _ = _labelled_by_itself(model, n=50)
    exported, report = export(model, x[:2])
    assert report["architecture"] == "5-8"  # a pruned model: one input and two hidden units gone
    state = {k: v.clone() for k, v in exported.state_dict().items()}
    before = torch.get_rng_state()
    fresh = reinitialize(exported, seed=7)
    assert torch.equal(torch.get_rng_state(), before)  # the global random state is untouched
    for key, value in exported.state_dict().items():  # the original is not modified
        assert torch.equal(value, state[key])
    fresh_state = fresh.state_dict()
    assert fresh_state.keys() == state.keys()
    for key, value in fresh_state.items():
        assert value.shape == state[key].shape, key
        if key.endswith("index"):  # SelectFeatures' kept-input indices are part of the architecture
            assert torch.equal(value, state[key])
        else:
            assert not torch.equal(value, state[key]), key
    assert any(isinstance(m, SelectFeatures) for m in fresh.modules())
    assert fresh(x).shape == exported(x).shape
    # the same seed gives the same weights; another seed other weights; the draw is PyTorch's default init
    again = reinitialize(exported, seed=7)
    for a, b in zip(fresh.parameters(), again.parameters()):
        assert torch.equal(a, b)
    other = reinitialize(exported, seed=8)
    assert not torch.equal(next(fresh.parameters()), next(other.parameters()))
    first = next(m for m in fresh.modules() if isinstance(m, nn.Linear))
    bound = 1 / math.sqrt(first.in_features)  # kaiming_uniform(a=sqrt(5)) of nn.Linear: U(-1/sqrt(fan_in), ...)
    assert float(first.weight.abs().max()) <= bound
    with pytest.raises(ValueError, match="plain model"):
        reinitialize(model)
    with pytest.raises(TypeError, match="nn.Module"):
        reinitialize("model")  # type: ignore[arg-type]


def test_a_converted_trained_network_starts_its_directions_narrower_unless_told_otherwise():
    """bayesianize(pretrained=True) builds RDP with PRETRAINED_INIT_RESULTANT when init_resultant is left at its
    default (the conversion study's choice), 0.95 with pretrained=False, and never overrides a value the user set."""
    from varbnn.families.rdp import INIT_RESULTANT, PRETRAINED_INIT_RESULTANT

    assert (INIT_RESULTANT, PRETRAINED_INIT_RESULTANT) == (0.95, 0.999)
    net = nn.Sequential(nn.Linear(20, 8), nn.ReLU(), nn.Linear(8, 3))

    def concentration(model, grouping="row"):
        return float(model[0].posteriors["weight"].concentration(grouping))

    trained = bayesianize(net, RadialDirectional(), RadialDirectionalPrior(), pretrained=True)
    fresh = bayesianize(net, RadialDirectional(), RadialDirectionalPrior(), pretrained=False)
    pinned = bayesianize(net, RadialDirectional(init_resultant=0.95), RadialDirectionalPrior(), pretrained=True)
    for grouping, dim in (("row", 20), ("column", 8)):
        assert concentration(trained, grouping) == pytest.approx(banerjee_concentration(dim, 0.999), rel=1e-5)
        assert concentration(fresh, grouping) == pytest.approx(banerjee_concentration(dim, 0.95), rel=1e-5)
        assert concentration(pinned, grouping) == pytest.approx(banerjee_concentration(dim, 0.95), rel=1e-5)
    # the mean network is still the trained one, and the family objects themselves are untouched
    with torch.no_grad():
        x = torch.randn(5, 20)
        from varbnn import sample_mode

        with sample_mode(trained, "mode"):
            assert torch.allclose(trained(x), net(x), atol=1e-3)  # log-normal modes: exp(m - v), v = 1e-4
    assert RadialDirectional().for_trained_weights().init_resultant == 0.999
    pinned_family = RadialDirectional(init_resultant=0.9)
    assert pinned_family.for_trained_weights() is pinned_family
    # MeanField keeps one init_std: a fresh network converted with pretrained=True (its measured-better start) would
    # get a trained network's width too (see benchmarks/results/conversion-defaults)
    assert MeanField().for_trained_weights().init_std == 1e-2


@pytest.mark.parametrize("family", ["meanfield", "ktied", "rdp", "radial"])
def test_the_elbo_gradient_under_torch_func_grad_equals_autograd(family):
    """torch.func.grad through a model's whole ELBO (NLL, KL and RDP's rejection-score term): the hand-written autograd
    Functions are not transform-ready, so under a transform their callers take plain operations (the Bessel Functions
    are transform-ready); with the same draws the gradient equals eager autograd's. Radial's Monte Carlo KL term uses
    another draw under a transform (per tensor) than eagerly (the forward's), so there only finiteness is checked."""
    from torch.func import functional_call, grad

    from varbnn.distributions.vmf import fixed_rejection_rounds

    torch.manual_seed(0)
    spec = {
        "meanfield": (MeanField(), None),
        "ktied": (KTied(rank=2), None),
        "rdp": (RadialDirectional(grouping="double"), RadialDirectionalPrior()),
        "radial": (Radial(), None),
    }[family]
    model = bayesianize(nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)), *spec).double()
    x, y = torch.randn(8, 5, dtype=torch.float64), torch.randint(0, 3, (8,))

    class Loss(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, y):
            return elbo_loss(F.cross_entropy(self.inner(x), y), self.inner, 100).loss

    loss = Loss(model)
    params = {k: v.detach() for k, v in loss.named_parameters()}
    torch.manual_seed(1)
    transformed = grad(lambda p: functional_call(loss, p, (x, y)))(params)
    torch.manual_seed(1)
    with fixed_rejection_rounds():  # the eager draws a transform takes (Wood's fixed proposals)
        loss(x, y).backward()
    for name, p in loss.named_parameters():
        assert torch.isfinite(transformed[name]).all()
        if family != "radial":
            torch.testing.assert_close(transformed[name], p.grad, rtol=1e-9, atol=1e-12)


def test_one_concentration_per_group_kl_is_the_sum_of_each_groups_vmf_kl_and_equals_the_shared_one_when_equal():
    """``shared_concentration=False``: a concentration per row (and column); the direction KL is each group's own vMF
    KL, summed (against ``kl_divergence`` of each group's own VonMisesFisher, uniform and tied priors: this checks the
    per-group evaluation and the sum, the vMF KL itself is tested against Monte Carlo in test_vmf.py); with every
    group at the shared value the family is the shared one (its KL and, with the same proposals, its draws for the
    same seed)."""
    torch.manual_seed(0)
    init = torch.randn(4, 10)
    shared = RadialDirectional(grouping="double", init_resultant=0.7).build(torch.Size([4, 10]), init)
    group = RadialDirectional(grouping="double", init_resultant=0.7, shared_concentration=False).build(
        torch.Size([4, 10]), init
    )
    assert group.row_concentration_rho.shape == (4,) and group.col_concentration_rho.shape == (10,)
    assert shared.row_concentration_rho.shape == ()
    for prior in (RadialDirectionalPrior(global_scale=0.5, local_scale=2.0), RadialDirectionalPrior(concentration=7.0)):
        torch.testing.assert_close(group.kl(prior), shared.kl(prior), rtol=1e-6, atol=1e-6)
    from varbnn.distributions.vmf import fixed_rejection_rounds

    with fixed_rejection_rounds():  # the same proposals for both (on the CPU a shared concentration draws from a pool)
        torch.manual_seed(3)
        a = shared.rsample()
        torch.manual_seed(3)
        b = group.rsample()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # different concentrations per group, rows and columns: the direction KL is the sum of the groups' own
    with torch.no_grad():
        group.row_concentration_rho.copy_(torch.log(torch.tensor([2.0, 20.0, 200.0, 2000.0])))
        group.col_concentration_rho.copy_(torch.log(torch.logspace(0, 3, 10)))
    for prior in (RadialDirectionalPrior(global_scale=0.5, local_scale=2.0, direction="uniform"),
                  RadialDirectionalPrior(global_scale=0.5, local_scale=2.0, concentration=7.0)):  # fmt: skip
        radius_only = group.kl(prior) - sum(_direction_part(group, g, prior) for g in ("row", "column"))
        expected = torch.zeros(())
        for grouping, dim in (("row", 10), ("column", 4)):
            kappa = group.concentration(grouping)
            loc = F.normalize(torch.randn(kappa.shape[0], dim), dim=-1)
            target = (HypersphericalUniform(dim, kappa.shape) if prior.direction == "uniform"
                      else VonMisesFisher(loc, torch.full_like(kappa, prior.direction_concentration(dim))))  # fmt: skip
            expected = expected + kl_divergence(VonMisesFisher(loc, kappa), target).sum()
        torch.testing.assert_close(group.kl(prior), expected + radius_only, rtol=1e-5, atol=1e-4)
    # every group's concentration gets its own gradient
    terms = group.kl(prior)
    (grad,) = torch.autograd.grad(terms, group.row_concentration_rho)
    assert grad.shape == (4,) and len(set(grad.tolist())) == 4
    with pytest.raises(TypeError, match="shared_concentration"):
        RadialDirectional(shared_concentration="no")
    # each row's draws have the resultant length its own concentration predicts (and a sample shape works)
    rows = RadialDirectional(grouping="row", shared_concentration=False).build(torch.Size([4, 10]), init)
    with torch.no_grad():
        rows.row_concentration_rho.copy_(torch.log(torch.tensor([2.0, 20.0, 200.0, 2000.0])))
        draws = rows.rsample((4000,))  # [4000, 4, 10]
    cosines = (F.normalize(draws, dim=-1) * rows.mean_direction("row")).sum(-1)  # [4000, 4]
    expected_a = VonMisesFisher(rows.mean_direction("row"), rows.concentration("row")).mean_resultant_length
    se = cosines.std(0) / math.sqrt(cosines.shape[0])
    assert ((cosines.mean(0) - expected_a).abs() < 5 * se + 1e-4).all(), (cosines.mean(0), expected_a)


def _direction_part(family, grouping, prior):
    """The family's own direction KL of one grouping, via its KL function."""
    from varbnn.families.rdp import _direction_kl

    return _direction_kl(family, grouping, prior, family.normalizers()[grouping])


def test_one_concentration_per_group_trains_predicts_and_saves():
    """The per-group option through the user's path: fit, predict (the vmap path over draws), the mean and the mode,
    and a state_dict round trip."""
    from torch.utils.data import DataLoader, TensorDataset

    from varbnn import fit

    torch.manual_seed(0)
    x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
    family = RadialDirectional(grouping="double", shared_concentration=False)
    model = bayesianize(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), family, RadialDirectionalPrior())
    history = fit(model, DataLoader(TensorDataset(x, y), batch_size=16), n_data=64, epochs=2, progress=False,
                  diagnose=False)  # fmt: skip
    assert all(math.isfinite(h["loss"]) for h in history)
    rho = model[0].posteriors["weight"].row_concentration_rho
    assert rho.shape == (8,) and len(set(rho.tolist())) > 1  # trained apart
    draws = predict(model, x, samples=8)
    assert draws.shape == (8, 64, 3) and torch.isfinite(draws).all()
    batched = torch.func.vmap(lambda _: model(x), randomness="different")(torch.arange(4))  # the vmap path itself
    assert batched.shape == (4, 64, 3) and torch.isfinite(batched).all() and not torch.equal(batched[0], batched[1])
    posterior = model[0].posteriors["weight"]
    assert torch.isfinite(posterior.mean).all() and torch.isfinite(posterior.mode).all()
    clone = bayesianize(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)),
                        RadialDirectional(grouping="double", shared_concentration=False), RadialDirectionalPrior())  # fmt: skip
    clone.load_state_dict(model.state_dict())
    torch.testing.assert_close(clone[0].posteriors["weight"].mean, posterior.mean)
