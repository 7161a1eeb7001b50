"""The Radial distribution and family (Farquhar et al. 2020) against independent oracles.

Tolerances: Monte Carlo means are compared within 5 standard errors (estimated from the same draws), fixed seeds.
"""

import math

import pytest
import scipy.special
import scipy.stats
import torch

import varbnn
from varbnn.distributions import Radial
from varbnn.distributions.radial import radial_entropy_constant, radial_kl, radial_normal_cross_entropy
from varbnn.families import Radial as RadialFamily
from varbnn.priors import Laplace, Normal, RadialPrior

SHAPE = (4, 3)


def _q(seed=0, shape=SHAPE, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(shape, generator=g, dtype=dtype)
    scale = torch.rand(shape, generator=g, dtype=dtype) * 0.8 + 0.2
    return Radial(loc, scale)


def test_entropy_matches_monte_carlo_of_negative_log_prob():
    torch.manual_seed(0)
    q = _q()
    lp = q.log_prob(q.sample((200_000,)))
    mc, se = float(-lp.mean()), float(lp.std() / math.sqrt(lp.numel()))
    assert abs(float(q.entropy()) - mc) < 5 * se, (float(q.entropy()), mc, se)


def test_one_dimensional_radial_is_the_normal():
    q = Radial(torch.tensor([0.3], dtype=torch.float64), torch.tensor([0.7], dtype=torch.float64))
    w = torch.linspace(-2, 2, 7, dtype=torch.float64)[:, None]
    expected = scipy.stats.norm(0.3, 0.7).logpdf(w.numpy()[:, 0])
    torch.testing.assert_close(q.log_prob(w), torch.as_tensor(expected))
    assert float(q.entropy()) == pytest.approx(float(scipy.stats.norm(0.3, 0.7).entropy()), rel=1e-12)


def test_log_prob_matches_the_polar_density_in_three_dimensions():
    # Independent construction: direction uniform on S^2 (area 4 pi), radius half-normal; Jacobian rho^2.
    loc = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    scale = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    q = Radial(loc, scale)
    w = torch.randn(5, 3, dtype=torch.float64)
    z = ((w - loc) / scale).numpy()
    rho = (z**2).sum(-1) ** 0.5
    expected = (
        scipy.stats.halfnorm.logpdf(rho) - math.log(4 * math.pi) - 2 * scipy.special.log1p(rho - 1) - float(scale.log().sum())
    )
    torch.testing.assert_close(q.log_prob(w), torch.as_tensor(expected))


def test_entropy_constant_matches_mpmath_digamma_form():
    # -(D - 1) E[log |r|] uses E[log|r|] = (digamma(1/2) + log 2) / 2 = -(gamma + log 2) / 2.
    mpmath = pytest.importorskip("mpmath")
    for d in (1, 2, 10, 1000, 10**6):
        e_log_r = (mpmath.digamma(0.5) + mpmath.log(2)) / 2
        log_area = mpmath.log(2) + d / 2 * mpmath.log(mpmath.pi) - mpmath.loggamma(d / 2)
        h = -(mpmath.log(2) - mpmath.log(2 * mpmath.pi) / 2 - mpmath.mpf(1) / 2) + (d - 1) * e_log_r + log_area
        assert radial_entropy_constant(d) == pytest.approx(float(h), rel=1e-12, abs=1e-9)


def test_samples_have_half_normal_radius_and_uniform_direction():
    torch.manual_seed(1)
    q = _q(shape=(20, 10))
    w = q.sample((4000,))
    rho = q.radius(w)
    assert scipy.stats.kstest(rho.numpy(), scipy.stats.halfnorm.cdf).pvalue > 1e-3
    z = (w - q.loc) / q.scale
    u = z / rho[:, None, None]
    # E[u] = 0 and E[u_i^2] = 1/D for a uniform direction.
    d = q.dim
    assert (u.mean(0).abs() < 5 * math.sqrt(1 / d / 4000)).all()
    var_ratio = (u.square().mean(0) * d).flatten()
    assert abs(float(var_ratio.mean()) - 1) < 0.05


def test_variance_property_matches_samples():
    torch.manual_seed(2)
    q = _q()
    w = q.sample((100_000,))
    torch.testing.assert_close(w.var(0), q.variance, rtol=0.05, atol=0)


def test_closed_form_normal_cross_entropy_matches_monte_carlo():
    torch.manual_seed(3)
    q = _q()
    p = Normal(0.2, 0.6).to(torch.float64).distribution(SHAPE)
    terms = -p.log_prob(q.sample((200_000,)))
    exact = float(radial_normal_cross_entropy(q.loc, q.scale, torch.tensor(0.2), torch.tensor(0.6)))
    assert abs(float(terms.mean()) - exact) < 5 * float(terms.std()) / math.sqrt(terms.numel())


def test_kl_is_averaged_not_summed_over_samples():
    # With more Monte Carlo samples the KL estimate keeps its expectation (summing would multiply it).
    torch.manual_seed(4)
    q = _q()
    p = Normal(0.0, 1.0).to(torch.float64).distribution(SHAPE)
    exact = float(radial_normal_cross_entropy(q.loc, q.scale, torch.tensor(0.0), torch.tensor(1.0)) - q.entropy())
    for samples in (1, 8):
        estimates = torch.stack([radial_kl(q, p, samples) for _ in range(3000)])
        se = float(estimates.std()) / math.sqrt(estimates.numel())
        assert abs(float(estimates.mean()) - exact) < 5 * se, (samples, float(estimates.mean()), exact, se)


def test_kl_against_itself_as_a_radial_prior_is_zero_in_expectation():
    torch.manual_seed(5)
    q = _q()
    prior = RadialPrior(q.loc, q.scale)
    estimates = torch.stack([varbnn.kl(q, prior.distribution(SHAPE)) for _ in range(4000)])
    se = float(estimates.std()) / math.sqrt(estimates.numel())
    assert abs(float(estimates.mean())) < 5 * se
    # and positive against a different radial prior (Jensen: KL > 0)
    other = RadialPrior(q.loc + 0.5, q.scale * 2).distribution(SHAPE)
    assert float(torch.stack([varbnn.kl(q, other) for _ in range(500)]).mean()) > 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="scale"):
        Radial(torch.zeros(3), torch.ones(2))
    with pytest.raises(ValueError, match="init_std"):
        RadialFamily(init_std=-1)
    with pytest.raises(ValueError, match="estimator.*allowed"):
        RadialFamily(estimator="local")
    with pytest.raises(ValueError, match="cross_entropy"):
        RadialFamily(cross_entropy="exact")
    with pytest.raises(ValueError, match="kl_samples"):
        RadialFamily(kl_samples=0)
    with pytest.raises(ValueError, match="scale"):
        Radial(torch.zeros(3), -torch.ones(3), validate_args=True)  # torch's own argument validation
    family = RadialFamily(cross_entropy="closed_form").build(SHAPE)
    with pytest.raises(ValueError, match="needs a Normal prior"):
        family.kl(Laplace(0.0, 1.0))
    with pytest.raises(ValueError, match="local"):
        varbnn.bayesianize(torch.nn.LSTM(3, 4), family=RadialFamily(estimator="flipout"), prior=Normal(0, 1))


def test_family_kl_estimators_agree_in_expectation_and_gradients_reach_parameters():
    torch.manual_seed(6)
    mc = RadialFamily(init_std=0.3).build(SHAPE, torch.randn(SHAPE))
    exact = RadialFamily(init_std=0.3, cross_entropy="closed_form").build(SHAPE)
    exact.load_state_dict(mc.state_dict())
    prior = Normal(0.1, 0.8)
    target = float(exact.kl(prior))
    with torch.no_grad():
        estimates = torch.stack([mc.kl(prior) for _ in range(5000)])
    se = float(estimates.std()) / math.sqrt(estimates.numel())
    assert abs(float(estimates.mean()) - target) < 5 * se
    for family in (mc, exact):
        (family.kl(prior) + family.rsample().square().sum()).backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0 for p in family.parameters())


@pytest.mark.parametrize("estimator", ["reparam", "flipout"])
def test_linear_layer_output_has_the_exact_mean_and_variance(estimator):
    # y = x W^T: E[y] = x loc^T, Var[y_j] = sum_i x_i^2 sigma_ji^2 / D (directions are uncorrelated, E[u_i^2] = 1/D).
    torch.manual_seed(7)
    layer = varbnn.BayesLinear(5, 3, bias=False, family=RadialFamily(init_std=0.5, estimator=estimator), prior=Normal(0, 1))
    with torch.no_grad():
        layer.posteriors["weight"].rho.add_(torch.randn(3, 5) * 0.3)
    n = 10000
    x = torch.randn(1, 5)
    with torch.no_grad():  # one pass per draw (examples of one batch share the direction and radius draw)
        y = torch.cat([layer(x) for _ in range(n)])
    family = layer.posteriors["weight"]
    mean = x[0] @ family.loc.detach().T
    var = (x[0] ** 2) @ (family.scale.detach() ** 2).T / family.loc.numel()
    se_mean = (var / y.shape[0]).sqrt()
    assert ((y.mean(0) - mean).abs() < 5 * se_mean).all()
    torch.testing.assert_close(y.var(0), var, rtol=5 * math.sqrt(2 / n), atol=0)


def test_flipout_draws_differ_between_examples_reparam_does_not():
    torch.manual_seed(8)
    x = torch.randn(1, 6).expand(4, 6)
    for estimator, same in (("reparam", True), ("flipout", False)):
        layer = varbnn.BayesLinear(6, 2, family=RadialFamily(init_std=0.5, estimator=estimator), prior=Normal(0, 1))
        y = layer(x)
        assert torch.allclose(y[0], y[1]) == same


def test_radial_works_in_conv_lstm_and_bayesianize():
    torch.manual_seed(9)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
    bnn = varbnn.bayesianize(net, family=RadialFamily(init_std=0.1), prior=Normal(0, 1))
    out = bnn(torch.randn(2, 1, 8, 8))
    assert out.shape == (2, 3)
    loss = varbnn.elbo_loss(out.square().mean(), bnn, n_data=100).loss
    loss.backward()
    assert all(p.grad is not None for p in bnn.parameters())
    lstm = varbnn.BayesLSTM(3, 5, family=RadialFamily(init_std=0.1), prior=Normal(0, 1))
    seq, _ = lstm(torch.randn(2, 7, 3))
    assert seq.shape == (2, 7, 5) and torch.isfinite(varbnn.kl(lstm))


def test_moments_drive_an_adaptive_normal_prior_to_its_optimum():
    # Graves eq. 15 with the radial posterior's exact moments (loc, sigma^2 / D).
    family = RadialFamily(init_std=0.4).build(SHAPE, torch.randn(SHAPE))
    prior = Normal(0.0, 1.0, adaptive=True)
    prior.update_([family])
    loc, var = family.moments()
    assert float(prior.loc) == pytest.approx(float(loc.mean()), rel=1e-6)
    assert float(prior.scale) ** 2 == pytest.approx(float((var + (loc - loc.mean()) ** 2).mean()), rel=1e-5)


@pytest.mark.parametrize("prior", [Normal(0.2, 0.8), Laplace(0.1, 0.5)], ids=["normal-fused", "laplace-generic"])
def test_family_monte_carlo_kl_equals_the_distribution_log_prob_path(prior):
    """The family's Monte Carlo KL (a one-pass path for scalar Normal priors) against -H - mean_s log p(w_s) computed
    with torch.distributions from the same draws: value and gradients."""
    family = RadialFamily(kl_samples=3).build(SHAPE, torch.randn(SHAPE, dtype=torch.float64))
    prior = prior.to(torch.float64)
    torch.manual_seed(7)
    got = family.kl(prior)
    got_grads = torch.autograd.grad(got, [family.loc, family.rho])
    torch.manual_seed(7)
    w = family.rsample(torch.Size([3]))
    expected = -family.entropy() - prior.distribution(SHAPE).log_prob(w).mean(0)
    expected_grads = torch.autograd.grad(expected, [family.loc, family.rho])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("elementwise", [False, True], ids=["scalar-prior", "elementwise-prior"])
def test_family_closed_form_kl_equals_cross_entropy_minus_entropy(elementwise):
    """The family's fused closed-form KL against radial_normal_cross_entropy - Radial.entropy() (value, gradients)."""
    g = torch.Generator().manual_seed(5)
    family = RadialFamily(cross_entropy="closed_form").build(SHAPE, torch.randn(SHAPE, generator=g, dtype=torch.float64))
    with torch.no_grad():
        family.rho.copy_(torch.randn(SHAPE, generator=g, dtype=torch.float64))
    if elementwise:
        prior = Normal(torch.randn(SHAPE, generator=g), torch.rand(SHAPE, generator=g) + 0.5).to(torch.float64)
    else:
        prior = Normal(0.3, 0.8).to(torch.float64)
    got = family.kl(prior)
    got_grads = torch.autograd.grad(got, [family.loc, family.rho])
    q = Radial(family.loc, torch.nn.functional.softplus(family.rho))
    expected = radial_normal_cross_entropy(q.loc, q.scale, prior.loc, prior.scale) - q.entropy()
    expected_grads = torch.autograd.grad(expected, [family.loc, family.rho])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-10)
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_monte_carlo_kl_reuses_the_forward_draw_once_within_a_step():
    """kl_samples=1, reparam: the KL after a forward pass is -log p(w) - H(q) at THAT pass's weight (Blundell et al.
    2015), used once; a second call, a backward pass or a parameter update (or no grad) make it draw afresh."""
    family = RadialFamily(init_std=0.3).build((6, 5), torch.randn(6, 5, dtype=torch.float64))
    prior = Normal(0.1, 0.8).double()
    torch.manual_seed(0)
    w = family.weight("sample")
    expected = -torch.distributions.Normal(0.1, 0.8).log_prob(w).sum() - family.entropy()
    got = family.kl(prior)
    torch.testing.assert_close(got, expected)
    g_got = torch.autograd.grad(got, [family.loc, family.rho], retain_graph=True)
    g_expected = torch.autograd.grad(expected, [family.loc, family.rho])
    for a, b in zip(g_got, g_expected):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(family.kl(prior), got)  # taken once: the next call draws afresh
    w = family.weight("sample")
    (w.sum() + 0 * family.entropy()).backward()  # a backward pass through the draw ends the step
    assert family.take_forward_draw() is None
    family.weight("sample")
    with torch.no_grad():
        family.loc.add_(0.1)  # an optimizer step: the draw is stale
    assert family.take_forward_draw() is None
    family.weight("sample")
    with torch.no_grad():
        assert family.take_forward_draw() is None
    several = RadialFamily(init_std=0.3, kl_samples=3).build((6, 5), torch.randn(6, 5, dtype=torch.float64))
    w = several.weight("sample")
    assert several._forward_draw is not None
    several.kl(prior)
    assert several._forward_draw is not None  # several draws: not consumed


def test_layer_training_step_pairs_its_kl_with_the_forward_weight():
    layer = varbnn.bayesianize(torch.nn.Linear(5, 3), RadialFamily(init_std=0.2), Normal(0.0, 1.0))
    x = torch.randn(4, 5)
    out = layer(x)
    weight_family = layer.posteriors["weight"]
    w = weight_family._forward_draw[1]
    bias = layer.posteriors["bias"]._forward_draw[1]
    torch.testing.assert_close(out, x @ w.T + bias)
    kl = varbnn.kl(layer)
    assert weight_family._forward_draw is None and layer.posteriors["bias"]._forward_draw is None
    assert torch.isfinite(kl)


# --- support, expand and the Monte Carlo KL's seedable path (issue 25) -----------------------------------------------


@pytest.mark.parametrize("shape", [(5,), (4, 3), (2, 3, 2)])
def test_support_is_real_over_the_whole_event(shape):
    q = _q(shape=shape)
    assert q.support.event_dim == len(q.event_shape) == len(shape)
    assert q.support.check(q.sample()).shape == ()  # one verdict per event, not per element
    w = q.sample()
    w.view(-1)[0] = math.nan
    assert not bool(q.support.check(w))


def test_expand_adds_independent_batch_dimensions():
    q = _q()
    e = q.expand((5, 2))
    assert e.batch_shape == (5, 2) and e.event_shape == q.event_shape and isinstance(e, Radial)
    torch.manual_seed(6)
    w = e.rsample((3,))
    assert w.shape == (3, 5, 2, *SHAPE)
    # every batch member is the same distribution: log_prob and entropy as the unbatched one, per member
    torch.testing.assert_close(e.log_prob(w), q.log_prob(w.reshape(-1, *SHAPE)).reshape(3, 5, 2))
    torch.testing.assert_close(e.entropy(), q.entropy().expand(5, 2))
    torch.testing.assert_close(e.variance, q.variance.expand(5, 2, *SHAPE))
    # independent draws: each member has its own radius and direction
    radii = e.radius(w).reshape(-1)
    assert len(set(radii.tolist())) == radii.numel()
    # draws of the batch have the half-normal radius of one radial distribution
    big = e.rsample((4000,))
    r = e.radius(big).reshape(-1).numpy()
    assert scipy.stats.kstest(r, scipy.stats.halfnorm.cdf).pvalue > 1e-3
    # expanding again broadcasts as torch does; an incompatible shape is refused by name
    assert e.expand((7, 5, 2)).batch_shape == (7, 5, 2)
    with pytest.raises(ValueError, match=r"Radial.expand: batch_shape \(3,\)"):
        e.expand((3,))


def test_the_kl_with_a_generator_is_repeatable_and_within_its_monte_carlo_error():
    """kl_divergence(Radial, p) is a one-draw Monte Carlo estimate (random from call to call); radial_kl with a
    torch.Generator gives the same value for the same seed. Reference: the exact KL against a Normal prior, and a
    400,000-draw estimate against a Laplace prior; tolerances 5 standard errors of the estimate (and of the reference)."""
    q = _q()
    normal = Normal(0.1, 0.8).to(torch.float64).distribution(SHAPE)
    laplace = Laplace(-0.1, 0.5).to(torch.float64).distribution(SHAPE)
    for p in (normal, laplace):
        a = radial_kl(q, p, samples=50, generator=torch.Generator().manual_seed(7))
        b = radial_kl(q, p, samples=50, generator=torch.Generator().manual_seed(7))
        c = radial_kl(q, p, samples=50, generator=torch.Generator().manual_seed(8))
        assert float(a) == float(b) and float(a) != float(c)
    torch.manual_seed(9)
    one, two = torch.distributions.kl_divergence(q, normal), torch.distributions.kl_divergence(q, normal)
    assert float(one) != float(two)  # random without a seed, as documented
    exact = float(radial_normal_cross_entropy(q.loc, q.scale, torch.tensor(0.1), torch.tensor(0.8)) - q.entropy())
    reference = {normal: (exact, 0.0)}
    g = torch.Generator().manual_seed(10)
    terms = -laplace.log_prob(q.rsample((400_000,), generator=g)) - q.entropy()
    reference[laplace] = (float(terms.mean()), float(terms.std()) / math.sqrt(terms.numel()))
    for p, (want, want_se) in reference.items():
        g = torch.Generator().manual_seed(11)
        draws = q.rsample((4000,), generator=g)
        se = float(p.log_prob(draws).std()) / math.sqrt(4000)
        estimate = float(radial_kl(q, p, samples=4000, generator=torch.Generator().manual_seed(11)))
        assert estimate == pytest.approx(float(-q.entropy() - p.log_prob(draws).mean()), rel=1e-12)
        assert abs(estimate - want) < 5 * math.hypot(se, want_se), (estimate, want, se, want_se)


def test_radial_kl_takes_numbers_of_any_integer_type():
    import numpy as np

    q = _q()
    p = Normal(0.0, 1.0).to(torch.float64).distribution(SHAPE)
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert float(radial_kl(q, p, np.int64(3), g())) == float(radial_kl(q, p, 3, g()))
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="samples must be an int >= 1"):
            radial_kl(q, p, bad)


def test_per_element_init_gives_each_weight_a_std_of_one_hundredth():
    """Radial(init_std=None): sigma = 1e-2 sqrt(D), so each element of a draw has std 1e-2 (Var = sigma^2 / D,
    E r^2 = 1). Averaged over 5,000 elements of 400 draws the variance estimate's relative error is ~1e-3; 5%."""
    from varbnn.families import Radial

    family = Radial(init_std=None).build((100, 50), torch.zeros(100, 50))
    assert float(family.scale[0, 0]) == pytest.approx(1e-2 * math.sqrt(5000), rel=1e-5)
    with torch.no_grad():
        draws = family.rsample((400,))
    assert float(draws.square().mean().sqrt()) == pytest.approx(1e-2, rel=0.05)
    assert float(Radial(init_std=0.3).build((4, 3), torch.zeros(4, 3)).scale[0, 0]) == pytest.approx(0.3, rel=1e-5)
