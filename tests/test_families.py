"""Generic family tests driven by a FAMILIES table (like torch's distribution EXAMPLES)."""

import math

import numpy as np
import pytest
import scipy.stats
import torch

from varbnn.distributions.radial import radial_entropy_constant
from varbnn.families import FAMILIES, Delta, KTied, MeanField, Radial, make_family
from varbnn.families.meanfield import INIT_STD_RANGE
from varbnn.families.rdp import INIT_LOG_STD_RANGE, INIT_RESULTANT_RANGE
from varbnn.priors import Laplace, Normal

SHAPE = (4, 3)
# (spec, has_density): families with a density get the Monte Carlo KL and mode tests.
FAMILY_TABLE = [
    pytest.param(lambda: Delta(), False, id="delta"),
    pytest.param(lambda: MeanField(init_std=0.3), True, id="meanfield-reparam"),
    pytest.param(lambda: MeanField(init_std=0.3, estimator="local"), True, id="meanfield-local"),
    pytest.param(lambda: MeanField(init_std=0.3, estimator="flipout"), True, id="meanfield-flipout"),
    pytest.param(lambda: KTied(rank=2, init_std=0.3), True, id="ktied2-reparam"),
    pytest.param(lambda: KTied(rank=1, init_std=0.3, estimator="local"), True, id="ktied1-local"),
    pytest.param(lambda: KTied(rank=2, init_std=0.3, estimator="flipout"), True, id="ktied2-flipout"),
    # Radial's KL is analytic entropy + a Monte Carlo cross-entropy: enough draws that its own noise is below the
    # Monte Carlo reference's (the generic KL test compares the two within 5 of the reference's standard errors).
    pytest.param(lambda: Radial(init_std=0.3, kl_samples=40000), True, id="radial-reparam"),
    pytest.param(lambda: Radial(init_std=0.3, estimator="flipout", kl_samples=40000), True, id="radial-flipout"),
]
PRIOR_TABLE = [
    pytest.param(lambda: Normal(0.1, 0.5), id="normal"),
    pytest.param(lambda: Laplace(-0.1, 0.4), id="laplace"),
]


def built(spec):
    family = spec().build(SHAPE, torch.randn(SHAPE) * 0.5)
    if hasattr(family, "rho"):  # heterogeneous stds, so that a per-element bug cannot hide
        with torch.no_grad():
            family.rho.add_(torch.randn(SHAPE) * 0.5)
    if hasattr(family, "log_u"):
        with torch.no_grad():
            family.log_u.add_(torch.randn_like(family.log_u) * 0.3)
            family.log_v.add_(torch.randn_like(family.log_v) * 0.3)
    return family


@pytest.mark.parametrize("spec,has_density", FAMILY_TABLE)
def test_shapes(spec, has_density):
    family = built(spec)
    assert family.rsample().shape == SHAPE
    assert family.rsample((5, 2)).shape == (5, 2, *SHAPE)
    assert family.mean.shape == family.mode.shape == SHAPE
    assert family.distribution().event_shape == SHAPE


@pytest.mark.parametrize("spec,has_density", FAMILY_TABLE)
@pytest.mark.parametrize("prior", PRIOR_TABLE)
def test_gradients_reach_every_parameter(spec, has_density, prior):
    family = built(spec)
    loss = family.kl(prior()) + (family.rsample() ** 2).sum()
    loss.backward()
    for name, parameter in family.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all() and parameter.grad.abs().sum() > 0, name


@pytest.mark.parametrize("spec,has_density", [p for p in FAMILY_TABLE if p.values[1]])
@pytest.mark.parametrize("prior", PRIOR_TABLE)
def test_analytic_kl_matches_monte_carlo(spec, has_density, prior):
    family, p = built(spec), prior()
    q = family.distribution()
    with torch.no_grad():
        analytic = float(family.kl(p))
        w = q.sample((40000,))
        terms = (q.log_prob(w) - p.distribution(SHAPE).log_prob(w)).double()
    mc, se = float(terms.mean()), float(terms.std() / math.sqrt(terms.numel()))
    assert abs(analytic - mc) < 5 * se, (analytic, mc, se)


# Radial is left out: its density is +inf at the mode (rho^{1-D}), so the comparison could not fail.
@pytest.mark.parametrize("spec,has_density", [p for p in FAMILY_TABLE if p.values[1] and not p.id.startswith("radial")])
def test_mode_beats_samples_in_density(spec, has_density):
    family = built(spec)
    q = family.distribution()
    with torch.no_grad():
        assert q.log_prob(family.mode) >= q.log_prob(q.sample((2000,))).max()


def test_meanfield_log_prob_and_entropy_match_scipy():
    family = built(lambda: MeanField(init_std=0.3))
    mu, sd = family.loc.detach().double().numpy(), family.scale.detach().double().numpy()
    w = torch.randn(SHAPE)
    expected = scipy.stats.norm(mu, sd).logpdf(w.double().numpy()).sum()
    assert float(family.distribution().log_prob(w)) == pytest.approx(expected, rel=1e-5)
    assert float(family.distribution().entropy()) == pytest.approx(scipy.stats.norm(mu, sd).entropy().sum(), rel=1e-5)


@pytest.mark.parametrize(
    "prior,logpdf",
    [
        (Normal(0.1, 0.5), lambda w: scipy.stats.norm(0.1, 0.5).logpdf(w)),
        (Laplace(-0.1, 0.4), lambda w: scipy.stats.laplace(-0.1, 0.4).logpdf(w)),
    ],
)
def test_delta_kl_is_negative_log_prior_density(prior, logpdf):
    family = built(lambda: Delta())
    expected = -logpdf(family.value.detach().double().numpy()).sum()
    assert float(family.kl(prior)) == pytest.approx(expected, rel=1e-5)


def test_meanfield_samples_have_the_posterior_moments():
    family = built(lambda: MeanField(init_std=0.3))
    with torch.no_grad():
        w = family.rsample((20000,))
    n = w.shape[0]
    sd = family.scale.detach()
    assert ((w.mean(0) - family.loc.detach()).abs() < 5 * sd / math.sqrt(n)).all()
    assert ((w.std(0) / sd - 1).abs() < 5 * math.sqrt(1 / (2 * n))).all()


def test_parameter_count():
    assert built(lambda: MeanField()).num_variational_parameters == 2 * np.prod(SHAPE)
    assert built(lambda: Delta()).num_variational_parameters == np.prod(SHAPE)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: MeanField(init_std=0.0), "init_std"),
        (lambda: MeanField(init_std=-1.0), "init_std"),
        (lambda: MeanField(init_std=float("nan")), "init_std"),
        (lambda: MeanField(estimator="bogus"), "estimator.*allowed"),
        (lambda: make_family("nope"), "unknown family name.*allowed"),
        (lambda: MeanField().build((2, 2), torch.zeros(3, 3)), "init has shape"),
    ],
)
def test_bad_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_unbuilt_family_says_so():
    with pytest.raises(RuntimeError, match="unbuilt"):
        MeanField().rsample()


def test_registry_lists_families():
    assert {"delta", "meanfield"} <= set(FAMILIES)


@pytest.mark.parametrize(
    "prior", [Normal(0.2, 0.7), Normal(torch.randn(SHAPE) * 0.1, torch.rand(SHAPE) + 0.5)], ids=["scalar", "elementwise"]
)
@pytest.mark.parametrize("spec", [lambda: MeanField(init_std=0.3), lambda: Delta()], ids=["meanfield", "delta"])
def test_fused_family_kl_equals_the_distribution_registry_with_gradients(prior, spec):
    from varbnn.divergence import kl_divergence

    family = built(spec)
    fused = family.kl(prior)
    reference = kl_divergence(family.distribution(), prior.distribution(SHAPE))
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-5)
    g_fused = torch.autograd.grad(fused, list(family.parameters()))
    g_ref = torch.autograd.grad(reference, list(family.parameters()))
    for a, b in zip(g_fused, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_meanfield_kl_gradcheck_float64():
    from varbnn._fast.softplus import _MeanFieldNormalKL

    loc = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    rho = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    prior_loc, prior_scale = torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.8, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda a, b: _MeanFieldNormalKL.apply(a, torch.nn.functional.softplus(b), prior_loc, prior_scale), (loc, rho)
    )
    elementwise = (torch.randn(3, 2, dtype=torch.float64), torch.rand(3, 2, dtype=torch.float64) + 0.5)
    assert torch.autograd.gradcheck(
        lambda a, b: _MeanFieldNormalKL.apply(a, torch.nn.functional.softplus(b), *elementwise), (loc, rho)
    )


def test_scale_cache_is_shared_within_a_step_and_never_stale():
    import copy

    family = MeanField(init_std=0.2).build((5, 4), torch.randn(5, 4))
    prior = Normal(0.1, 0.7)
    a = family.scale
    assert family.scale is a  # shared by forward and KL within a step
    loss = (family.scale**3).sum() + family.kl(prior)
    loss.backward()
    assert family._scale_cache is None  # dropped by the backward pass
    # the same loss without any caching or fusion gives the same gradients
    loc, rho = family.loc.detach().requires_grad_(), family.rho.detach().requires_grad_()
    sigma = torch.nn.functional.softplus(rho)
    reference = (sigma**3).sum() + torch.distributions.kl_divergence(
        torch.distributions.Normal(loc, sigma), torch.distributions.Normal(0.1, 0.7)
    ).sum()
    reference.backward()
    torch.testing.assert_close(family.rho.grad, rho.grad)
    torch.testing.assert_close(family.loc.grad, loc.grad)
    with torch.no_grad():
        family.rho.add_(1.0)  # an optimiser step bumps the version: a new sigma
    torch.testing.assert_close(family.scale, torch.nn.functional.softplus(family.rho.detach()))
    assert family.scale is family.scale  # populated cache; copies must still work
    copy.deepcopy(family)
    # separate backward passes through graphs sharing the cached sigma work (e.g. NLL and KL gradients apart)
    nll_like, kl = family.scale.sum(), family.kl(prior)  # both built on the one cached sigma
    g_nll = torch.autograd.grad(nll_like, family.rho)[0]
    g_kl = torch.autograd.grad(kl, family.rho)[0]
    assert torch.isfinite(g_nll).all() and torch.isfinite(g_kl).all()


_USED = [(1, 1, 1, 1), (1, 0, 1, 1), (0, 1, 1, 1), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0)]


@pytest.mark.parametrize(("with_square", "used"), [(True, u) for u in _USED] + [(False, u) for u in _USED if not u[1]])
def test_softplus_stats_node_gradcheck_float64(with_square, used, stats_objective):
    """The fused node's backward against finite differences, for every subset of its outputs that a step uses."""
    from varbnn._fast.softplus import _SoftplusStats

    rho = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w1, w2 = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)

    def f(r: torch.Tensor) -> torch.Tensor:
        return stats_objective(_SoftplusStats.apply(r, with_square), used, w1, w2)

    assert torch.autograd.gradcheck(f, (rho,))
    sigma, square, sum_log, sum_sq = _SoftplusStats.apply(rho, with_square)
    reference = torch.nn.functional.softplus(rho)
    torch.testing.assert_close(sigma, reference)
    torch.testing.assert_close(sum_log, reference.log().sum())
    torch.testing.assert_close(sum_sq, reference.square().sum())
    assert (square is None) != with_square


@pytest.mark.parametrize("estimator", ["local", "reparam"])
@pytest.mark.parametrize("prior", [Normal(0.1, 0.7), Normal(torch.randn(5, 4) * 0.1, 0.7)], ids=["scalar", "elementwise-loc"])
def test_meanfield_step_through_the_fused_node_equals_plain_autograd(estimator, prior):
    """A layer's forward (local: x^2 sigma^2; reparam: sigma * eps) plus the KL, through the shared node, gives the
    gradients of the same loss written with plain torch ops; the NLL-like and KL parts can be differentiated apart."""
    family = MeanField(init_std=0.2).build((5, 4), torch.randn(5, 4))
    x, eps = torch.randn(7, 4), torch.randn(5, 4)
    fit_part = (x.square() @ family.variance.T).sum() if estimator == "local" else (x @ (family.loc + family.scale * eps).T).sum()
    loss = fit_part + family.kl(prior)
    loss.backward()
    assert family._scale_cache is None
    loc, rho = family.loc.detach().requires_grad_(), family.rho.detach().requires_grad_()
    sigma = torch.nn.functional.softplus(rho)
    plain_fit = (x.square() @ sigma.square().T).sum() if estimator == "local" else (x @ (loc + sigma * eps).T).sum()
    plain_kl = torch.distributions.kl_divergence(
        torch.distributions.Normal(loc, sigma), torch.distributions.Normal(prior.loc, prior.scale)
    ).sum()
    (plain_fit + plain_kl).backward()
    torch.testing.assert_close(family.rho.grad, rho.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(family.loc.grad, loc.grad, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        family.rho.add_(0.1)
    fit_part = (x.square() @ family.variance.T).sum() if estimator == "local" else family.scale.sum()
    kl = family.kl(prior)
    g_fit = torch.autograd.grad(fit_part, family.rho)[0]
    g_kl = torch.autograd.grad(kl, family.rho)[0]
    sigma = torch.nn.functional.softplus(family.rho.detach()).requires_grad_()
    expected_kl = torch.autograd.grad(
        torch.distributions.kl_divergence(
            torch.distributions.Normal(family.loc.detach(), sigma), torch.distributions.Normal(prior.loc, prior.scale)
        ).sum(),
        sigma,
    )[0] * torch.sigmoid(family.rho.detach())
    torch.testing.assert_close(g_kl, expected_kl, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(g_fit).all()


def test_normal_kl_from_stats_needs_a_scalar_prior_scale():
    from varbnn._fast.softplus import normal_kl_from_stats

    with pytest.raises(ValueError, match="scalar prior scale"):
        normal_kl_from_stats(torch.zeros(3), torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.0), torch.ones(3))


@pytest.mark.parametrize("var_scale", [1.0, 0.3])
def test_normal_kl_from_stats_gradcheck_and_value(var_scale):
    from varbnn._fast.softplus import normal_kl_from_stats

    loc = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    rho = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    prior_loc, prior_scale = torch.randn(4, 3, dtype=torch.float64) * 0.2, torch.tensor(0.7, dtype=torch.float64)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        sigma = torch.nn.functional.softplus(b)
        return normal_kl_from_stats(a, sigma.log().sum(), sigma.square().sum(), prior_loc, prior_scale, var_scale)

    assert torch.autograd.gradcheck(f, (loc, rho))
    sigma = torch.nn.functional.softplus(rho) * math.sqrt(var_scale)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(loc, sigma), torch.distributions.Normal(prior_loc, prior_scale)
    ).sum() + 0.5 * loc.numel() * math.log(var_scale)  # the formula omits the constant n log(v) / 2
    torch.testing.assert_close(f(loc, rho), expected)


def test_normal_kl_from_stats_with_a_trainable_prior_gives_the_prior_its_gradient():
    """A prior whose scale takes gradients goes through the recorded operations (the one-node form gives none to the
    prior); both forms agree on the value and on the posterior's gradients. (No form trains the prior mean.)"""
    from varbnn._fast.softplus import normal_kl_from_stats

    loc = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    sigma = torch.rand(4, 3, dtype=torch.float64) + 0.1
    prior_loc = torch.tensor(0.1, dtype=torch.float64)
    prior_scale = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    stats = (sigma.log().sum(), sigma.square().sum())
    trained = normal_kl_from_stats(loc, *stats, prior_loc, prior_scale)
    fixed = normal_kl_from_stats(loc, *stats, prior_loc, prior_scale.detach())
    expected = torch.distributions.kl_divergence(
        torch.distributions.Normal(loc, sigma), torch.distributions.Normal(prior_loc, prior_scale)
    ).sum()
    torch.testing.assert_close(trained, expected)
    torch.testing.assert_close(fixed, expected)
    grads = torch.autograd.grad(trained, (loc, prior_scale))
    reference = torch.autograd.grad(expected, (loc, prior_scale))
    for a, b in zip(grads, reference):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(torch.autograd.grad(fixed, loc)[0], reference[0])


# --- allowed ranges of the numeric init arguments (issue 25) ---------------------------------------------------------

# (family name, argument, its allowed closed interval, other arguments)
RANGE_TABLE = [
    pytest.param("meanfield", "init_std", INIT_STD_RANGE, {}, id="meanfield-init_std"),
    pytest.param("meanfield", "init_std", INIT_STD_RANGE, {"estimator": "local"}, id="meanfield-local-init_std"),
    pytest.param("meanfield", "init_std", INIT_STD_RANGE, {"estimator": "flipout"}, id="meanfield-flipout-init_std"),
    pytest.param("meanfield", "init_std", INIT_STD_RANGE, {"learn_std": False}, id="meanfield-fixed-init_std"),
    pytest.param("ktied", "init_std", INIT_STD_RANGE, {"rank": 1}, id="ktied-init_std"),
    pytest.param("ktied", "init_std", INIT_STD_RANGE, {"rank": 1, "estimator": "local"}, id="ktied-local-init_std"),
    pytest.param("radial", "init_std", INIT_STD_RANGE, {}, id="radial-init_std"),
    pytest.param("radial", "init_std", INIT_STD_RANGE, {"estimator": "flipout"}, id="radial-flipout-init_std"),
    pytest.param("rdp", "init_log_std", INIT_LOG_STD_RANGE, {"grouping": "double"}, id="rdp-double-init_log_std"),
    pytest.param("rdp", "init_log_std", INIT_LOG_STD_RANGE, {"grouping": "row"}, id="rdp-row-init_log_std"),
    pytest.param("rdp", "init_log_std", INIT_LOG_STD_RANGE, {"grouping": "column"}, id="rdp-column-init_log_std"),
    pytest.param("rdp", "init_resultant", INIT_RESULTANT_RANGE, {}, id="rdp-init_resultant"),
    pytest.param("rdp", "init_resultant", INIT_RESULTANT_RANGE, {"ratio_method": "bounds"}, id="rdp-bounds-init_resultant"),
    pytest.param("rdp", "fallback_init_std", INIT_STD_RANGE, {}, id="rdp-fallback_init_std"),
]


def _prior_for(name: str):
    from varbnn.priors import RadialDirectionalPrior

    return RadialDirectionalPrior() if name == "rdp" else Normal(0.0, 1.0)


@pytest.mark.parametrize("name, argument, allowed, extra", RANGE_TABLE)
def test_range_ends_give_finite_outputs_and_gradients_in_float32(name, argument, allowed, extra):
    """At both ends of the allowed interval a float32 layer's sampled, mean and mode outputs, its KL and every gradient
    are finite (before the ranges, init_std=1e-44 gave infinite gradients and RDP's init_log_std=10 a NaN mean output)."""
    from varbnn import kl
    from varbnn.nn import BayesLinear, set_sample_mode

    torch.manual_seed(0)
    x = torch.randn(8, 20)
    for value in allowed:
        layer = BayesLinear(20, 30, family=make_family(name, **{argument: value}, **extra), prior=_prior_for(name))
        assert all(p.dtype == torch.float32 for p in layer.parameters())
        for mode in ("sample", "mean", "mode"):
            set_sample_mode(layer, mode)
            layer.zero_grad()
            out = layer(x)
            loss = out.square().mean() + kl(layer) / 100
            loss.backward()
            assert torch.isfinite(out).all() and torch.isfinite(loss), (value, mode)
            for parameter_name, parameter in layer.named_parameters():
                if parameter.grad is not None:
                    assert torch.isfinite(parameter.grad).all(), (value, mode, parameter_name)


@pytest.mark.parametrize("name, argument, allowed, extra", RANGE_TABLE)
def test_values_just_outside_the_range_are_refused_by_name(name, argument, allowed, extra):
    low, high = allowed
    outside = [math.nextafter(low, -math.inf), math.nextafter(high, math.inf), 0.0, -1.0, math.nan, math.inf, -math.inf]
    for value in outside:
        with pytest.raises(ValueError, match=rf"{argument} must be a finite number in \[{low:g}, {high:g}\]"):
            make_family(name, **{argument: value}, **extra)


@pytest.mark.parametrize(
    "name, argument, value",
    [
        ("meanfield", "init_std", np.float32(0.25)),
        ("meanfield", "init_std", torch.tensor(0.25)),
        ("meanfield", "init_std", torch.tensor(0.25, dtype=torch.float64, requires_grad=True)),
        ("ktied", "init_std", np.float64(0.25)),
        ("ktied", "rank", np.int64(2)),
        ("ktied", "rank", torch.tensor(2)),
        ("radial", "init_std", torch.tensor(0.25)),
        ("radial", "kl_samples", np.int32(3)),
        ("rdp", "init_log_std", np.float32(0.25)),
        ("rdp", "init_resultant", torch.tensor(0.75)),
        ("rdp", "fallback_init_std", np.float16(0.25)),
        ("rdp", "score_correction", np.bool_(False)),
        ("meanfield", "learn_std", torch.tensor(False)),
    ],
)
def test_numbers_of_any_numeric_type_are_accepted(name, argument, value):
    family = make_family(name, **{argument: value})
    stored = family._hyperparameters[argument]
    want = value.item() if hasattr(value, "item") else value
    assert stored == want and type(stored) is type(want) and type(stored) in (int, float, bool)
    built = family.build((4, 3))  # the spec rebuilds from its plain-number hyperparameters
    assert built._hyperparameters == family._hyperparameters


@pytest.mark.parametrize(
    "name, argument, value, message",
    [
        ("meanfield", "init_std", True, r"init_std must be a finite number in .*got a bool"),
        ("meanfield", "init_std", "0.1", r"init_std must be a finite number in .*got str"),
        ("meanfield", "init_std", torch.tensor([0.1, 0.2]), r"init_std must be .*0-d tensor at most"),
        ("radial", "kl_samples", 2.0, r"kl_samples must be an int >= 1, got 2.0"),
        ("radial", "kl_samples", np.int64(0), r"kl_samples must be an int >= 1, got 0"),
        ("ktied", "rank", np.float64(2.0), r"rank must be an int >= 1"),
        ("rdp", "score_correction", "False", r"score_correction must be True or False"),
        ("meanfield", "learn_std", 1, r"learn_std must be True or False"),
    ],
)
def test_non_numbers_are_refused_by_name(name, argument, value, message):
    with pytest.raises(ValueError, match=message):
        make_family(name, **{argument: value})


# ------------------------------------------------------------------------------------------------------------------
# kl(model): the tensors with NormalKLParts in one autograd node (normal_kl_sum), against each tensor's own KL
# ------------------------------------------------------------------------------------------------------------------
def _mixed_model(dtype=torch.float32):
    """Layers of every kind of KL path: batched (MeanField, KTied, Delta, Radial's closed form; a nonzero prior mean;
    a float64 layer in its own group) and one by one (a pruned MeanField, a Laplace prior, Radial's Monte Carlo KL)."""
    from varbnn.nn import BayesLinear

    torch.manual_seed(0)
    layers = [
        BayesLinear(4, 3, family=MeanField(init_std=0.2), prior=Normal(0.1, 0.7)),
        BayesLinear(3, 3, family=KTied(rank=2, init_std=0.3)),
        BayesLinear(3, 3, family=Delta(), prior=Normal(-0.2, 1.5)),
        BayesLinear(3, 3, family=Radial(init_std=0.1, cross_entropy="closed_form"), prior=Normal(0.0, 0.5)),
        BayesLinear(3, 3, family=MeanField(init_std=0.2), prior=Laplace(0.0, 0.5)),
        BayesLinear(3, 3, family=Radial(init_std=0.1, kl_samples=1)),
        BayesLinear(3, 3, family=MeanField(init_std=0.2)),
        BayesLinear(3, 2, family=MeanField(init_std=0.2)).to(torch.float64),
    ]
    with torch.no_grad():
        for layer in layers:
            for parameter in layer.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.3)
    layers[6].posteriors["weight"].prune_(torch.rand(3, 3) > 0.5)
    return torch.nn.Sequential(*layers)


def test_model_kl_equals_the_sum_of_each_tensors_kl_with_gradients():
    import varbnn

    model = _mixed_model()
    params = list(model.parameters())
    x = torch.randn(5, 4)
    torch.manual_seed(1)
    model[:-1](x)  # Radial's Monte Carlo term on the forward pass's draw (kl_samples=1; the last layer is float64)
    batched = varbnn.kl(model)
    grads = torch.autograd.grad(batched, params, allow_unused=True)
    torch.manual_seed(1)  # the same forward draws
    model[:-1](x)
    one_by_one = sum(posterior.kl(prior) for layer in model for _, posterior, prior in layer.bayesian_tensors())
    reference = torch.autograd.grad(one_by_one, params, allow_unused=True)
    assert batched.dtype == one_by_one.dtype == torch.float64  # the float64 layer promotes the sum, as before
    assert torch.allclose(batched, one_by_one, rtol=1e-6)
    for got, want in zip(grads, reference, strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)


def test_model_kl_batches_the_normal_tensors_into_one_node_per_dtype():
    import varbnn
    from varbnn.nn import BayesLinear

    model = torch.nn.Sequential(*(BayesLinear(3, 3, family=spec) for spec in (MeanField(), KTied(rank=1), Delta())))
    total = varbnn.kl(model)
    assert type(total.grad_fn).__name__ == "_NormalKLSumBackward"  # 6 tensors, one node
    radial = torch.nn.Sequential(BayesLinear(3, 3, family=Radial()), BayesLinear(3, 3, family=Radial()))
    radial(torch.randn(2, 3))  # the Monte Carlo cross-entropy on the forward draws joins the node too
    assert type(varbnn.kl(radial).grad_fn).__name__ == "_NormalKLSumBackward"
    assert type(varbnn.kl(radial).grad_fn).__name__ != "_NormalKLSumBackward"  # no forward draw left: own draws
    mixed = varbnn.kl(_mixed_model())  # the batched groups and the one-by-one terms summed
    assert mixed.dim() == 0


def test_normal_kl_sum_gradcheck_float64():
    from varbnn.divergence import NormalKLParts, normal_kl_sum

    torch.manual_seed(0)
    locs = [torch.randn(3, 2, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    sigmas = [torch.rand(3, 2, dtype=torch.float64) + 0.1 for _ in range(2)]
    logs = [s.log().sum().requires_grad_() for s in sigmas]
    squares = [s.square().sum().requires_grad_() for s in sigmas]
    prior_locs = [torch.tensor(v, dtype=torch.float64) for v in (0.0, 0.3, -0.1)]
    prior_scales = [torch.tensor(v, dtype=torch.float64) for v in (1.0, 0.4, 2.0)]

    def total(*inputs):
        a, b, c, la, lb, sa, sb = inputs
        parts = [
            NormalKLParts(a, la, sa, prior_locs[0], prior_scales[0], 1.0, 0.0),
            NormalKLParts(b, None, None, prior_locs[1], prior_scales[1], 1.0, 2.5),
            NormalKLParts(c, lb, sb, prior_locs[2], prior_scales[2], 1.0 / 6, -1.0),
        ]
        return normal_kl_sum(parts)

    inputs = (*locs, logs[0], logs[1], squares[0], squares[1])
    assert torch.autograd.gradcheck(total, inputs)
    value = total(*inputs)

    def one(loc, sum_log, sum_sq, m, s, v, constant):
        n = loc.numel()
        return n * s.log() - sum_log + (v * sum_sq + (loc - m).square().sum()) / (2 * s**2) - n / 2 + constant

    zero = torch.zeros((), dtype=torch.float64)
    want = (
        one(locs[0], logs[0], squares[0], prior_locs[0], prior_scales[0], 1.0, 0.0)
        + one(locs[1], zero, zero, prior_locs[1], prior_scales[1], 1.0, 2.5)
        + one(locs[2], logs[1], squares[1], prior_locs[2], prior_scales[2], 1.0 / 6, -1.0)
    )
    assert torch.allclose(value, want, rtol=1e-12)
    with pytest.raises(ValueError, match="no parts"):
        normal_kl_sum([])
    trainable = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="prior_scale must be a 0-d tensor without gradient"):
        normal_kl_sum([NormalKLParts(locs[0], None, None, prior_locs[0], trainable)])
    with pytest.raises(ValueError, match="prior_loc must be a 0-d tensor"):
        normal_kl_sum([NormalKLParts(locs[0], None, None, torch.zeros(3, 2, dtype=torch.float64), prior_scales[0])])


@pytest.mark.parametrize("draws", [1, 2])
@pytest.mark.parametrize("kl_first", [False, True])
def test_meanfield_rsample_through_the_fused_sample_node_equals_plain_autograd(draws, kl_first):
    """A training step's draw ``loc + softplus(rho) * eps`` comes from one node with sigma's statistics (the first draw
    of a step; a second draw, or a draw after the KL, uses the cached statistics): values, and the gradients of
    ``sum_d <w_d, c_d> + KL`` against the same loss in plain torch ops with the same noise."""
    family = MeanField(init_std=0.2).build((5, 4), torch.randn(5, 4))
    with torch.no_grad():
        family.rho.add_(torch.randn(5, 4) * 0.5)
    prior = Normal(0.1, 0.7)
    weights = [torch.randn(5, 4) for _ in range(draws)]
    torch.manual_seed(3)
    kl = family.kl(prior) if kl_first else None
    draws_made = [family.rsample() for _ in range(draws)]
    if kl is None:
        kl = family.kl(prior)
    fused_first = not kl_first
    assert (type(draws_made[0].grad_fn).__name__ == "_SoftplusSampleBackward") == fused_first
    loss = sum((w * c).sum() for w, c in zip(draws_made, weights, strict=True)) + kl
    loss.backward()
    assert family._scale_cache is None
    loc, rho = family.loc.detach().requires_grad_(), family.rho.detach().requires_grad_()
    sigma = torch.nn.functional.softplus(rho)
    torch.manual_seed(3)
    plain = [loc + sigma * torch.randn(5, 4) for _ in range(draws)]
    for got, want in zip(draws_made, plain, strict=True):
        torch.testing.assert_close(got, want)
    plain_kl = torch.distributions.kl_divergence(
        torch.distributions.Normal(loc, sigma), torch.distributions.Normal(prior.loc, prior.scale)
    ).sum()
    (sum((w * c).sum() for w, c in zip(plain, weights, strict=True)) + plain_kl).backward()
    torch.testing.assert_close(family.rho.grad, rho.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(family.loc.grad, loc.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("used", [(1, 1, 1, 1), (1, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 1), (0, 0, 1, 1), (0, 1, 1, 0)])
def test_softplus_sample_node_gradcheck_float64(used):
    from varbnn._fast.softplus import _SoftplusSample

    loc = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    rho = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    eps, c1, c2 = (torch.randn(4, 3, dtype=torch.float64) for _ in range(3))

    def f(a: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        w, sigma, sum_log, sum_sq = _SoftplusSample.apply(a, r, eps)
        terms = [(w * c1).sum(), (sigma * c2).sum(), 0.7 * sum_log, -0.3 * sum_sq]
        return sum(t for t, u in zip(terms, used, strict=True) if u)

    assert torch.autograd.gradcheck(f, (loc, rho))


def test_radial_rsample_through_the_fused_sample_node_equals_plain_autograd():
    """Radial's first draw of a step, ``loc + softplus(rho) * (eps / ||eps||) r``, through the statistics node: the same
    draw as the plain formula with the same noise, and the same gradients of ``<w, c> + KL`` (closed form)."""
    family = Radial(init_std=0.2, cross_entropy="closed_form").build((5, 4), torch.randn(5, 4))
    with torch.no_grad():
        family.rho.add_(torch.randn(5, 4) * 0.5)
    prior, c = Normal(0.1, 0.7), torch.randn(5, 4)
    torch.manual_seed(4)
    w = family.rsample()
    assert type(w.grad_fn).__name__ == "_SoftplusSampleBackward"
    ((w * c).sum() + family.kl(prior)).backward()
    loc, rho = family.loc.detach().requires_grad_(), family.rho.detach().requires_grad_()
    sigma = torch.nn.functional.softplus(rho)
    torch.manual_seed(4)
    eps, r = torch.randn(5, 4), torch.randn(1, 1)
    plain = loc + sigma * eps * (r / eps.norm())
    torch.testing.assert_close(w, plain)
    n = loc.numel()
    plain_kl = (  # the closed form: -H[q] - E_q log N(w | m, s^2), Var_q[w_i] = sigma_i^2 / n
        (0.5 * ((loc - 0.1).square() + sigma.square() / n) / 0.7**2).sum()
        + n * (math.log(0.7) + 0.5 * math.log(2 * math.pi))
        - sigma.log().sum()
        - radial_entropy_constant(n)
    )
    ((plain * c).sum() + plain_kl).backward()
    torch.testing.assert_close(family.rho.grad, rho.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(family.loc.grad, loc.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", [lambda: MeanField(init_std=0.2), lambda: KTied(rank=2, init_std=0.2), lambda: Radial()])
def test_outside_a_training_step_sigma_is_computed_alone(spec):
    """Prediction (no gradients recorded) computes sigma without the KL's statistics (no log over the tensor) and leaves
    no per-step cache; the values are the training step's."""
    from torch.profiler import profile

    family = spec().build((6, 5), torch.randn(6, 5))
    with torch.no_grad():
        with profile() as prof:
            scale = family.scale
            family.rsample()
            if isinstance(family, MeanField):
                variance = family.variance
        ops = {event.key for event in prof.key_averages()}
    assert "aten::log" not in ops and "aten::dot" not in ops
    assert family._scale_cache is None and scale.grad_fn is None
    torch.testing.assert_close(scale, family.scale.detach())  # the same sigma as within a step
    if isinstance(family, MeanField):
        torch.testing.assert_close(variance, scale.square())


@pytest.mark.parametrize("kl_first", [False, True])
def test_ktied_rsample_through_the_fused_sample_node_equals_plain_autograd(kl_first):
    """KTied's first draw of a step, ``loc + (U V^T) * eps``, through the statistics node (:class:`_ExpOuterSample`):
    the same draw and the same gradients of ``<w, c> + KL`` as plain torch ops with the same noise."""
    family = KTied(rank=2, init_std=0.2).build((5, 4), torch.randn(5, 4))
    with torch.no_grad():
        family.log_u.add_(torch.randn_like(family.log_u) * 0.3)
    prior, c = Normal(0.1, 0.7), torch.randn(5, 4)
    torch.manual_seed(5)
    kl = family.kl(prior) if kl_first else None
    w = family.rsample()
    assert (type(w.grad_fn).__name__ == "_ExpOuterSampleBackward") != kl_first
    ((w * c).sum() + (kl if kl is not None else family.kl(prior))).backward()
    loc = family.loc.detach().requires_grad_()
    log_u, log_v = family.log_u.detach().requires_grad_(), family.log_v.detach().requires_grad_()
    sigma = log_u.exp() @ log_v.exp().T
    torch.manual_seed(5)
    plain = loc + sigma * torch.randn(5, 4)
    torch.testing.assert_close(w, plain)
    plain_kl = torch.distributions.kl_divergence(
        torch.distributions.Normal(loc, sigma), torch.distributions.Normal(prior.loc, prior.scale)
    ).sum()
    ((plain * c).sum() + plain_kl).backward()
    for got, want in ((family.loc, loc), (family.log_u, log_u), (family.log_v, log_v)):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-6)


def test_ktied_sample_node_gradcheck_float64():
    from varbnn.families.ktied import _ExpOuterSample

    shape = torch.Size((4, 3))
    loc = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    log_u = (torch.randn(4, 2, dtype=torch.float64) * 0.3).requires_grad_()
    log_v = (torch.randn(3, 2, dtype=torch.float64) * 0.3).requires_grad_()
    eps, c1, c2 = (torch.randn(4, 3, dtype=torch.float64) for _ in range(3))

    def f(a: torch.Tensor, lu: torch.Tensor, lv: torch.Tensor) -> torch.Tensor:
        w, sigma, sum_log, sum_sq = _ExpOuterSample.apply(a, lu, lv, eps, shape)
        return (w * c1).sum() + (sigma * c2).sum() + 0.7 * sum_log - 0.3 * sum_sq

    assert torch.autograd.gradcheck(f, (loc, log_u, log_v))


@pytest.mark.parametrize(
    "spec", [lambda: MeanField(init_std=0.2), lambda: KTied(rank=1, init_std=0.2), lambda: Radial(cross_entropy="closed_form")]
)
@pytest.mark.parametrize("kl_first", [False, True])
def test_activation_checkpointing_recomputes_the_fused_draw(spec, kl_first):
    """Non-reentrant activation checkpointing reruns the forward pass in the backward, when the step's statistics are
    cached: the cached draw must save what the fused draw saved (it raised CheckpointError), and the gradients equal the
    step without checkpointing."""
    import varbnn
    from varbnn.nn import BayesLinear

    torch.manual_seed(0)
    layer, x = BayesLinear(4, 3, family=spec()), torch.randn(5, 4)
    grads = []
    for use_checkpoint in (False, True):
        layer.zero_grad()
        torch.manual_seed(1)
        kl = varbnn.kl(layer) if kl_first else None
        out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False) if use_checkpoint else layer(x)
        (out.square().sum() + (kl if kl is not None else varbnn.kl(layer))).backward()
        grads.append([p.grad.clone() for p in layer.parameters()])
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(checkpointed, plain)


def test_meanfield_subclasses_with_their_own_sigma_keep_it_in_training_and_prediction():
    """A subclass that overrides the ``scale`` property, or only ``_scale_stats``, draws with its own sigma in a
    training step and outside one (the fused draw and the plain sigma are MeanField's softplus)."""

    class Shifted(MeanField):
        @property
        def scale(self):
            return torch.nn.functional.softplus(self.rho) + 0.5

    class Exp(MeanField):
        def _scale_stats(self, with_square=False):
            sigma = self.rho.exp()
            return sigma, sigma.square() if with_square else None, sigma.log().sum(), sigma.square().sum()

    shifted = Shifted(init_std=0.01).build((300, 300), torch.zeros(300, 300))
    assert abs(float(shifted.rsample().std()) - 0.51) < 0.02
    with torch.no_grad():
        assert abs(float(shifted.rsample().std()) - 0.51) < 0.02
    exp = Exp(init_std=0.01).build((3, 3), torch.zeros(3, 3))
    with torch.no_grad():
        exp.rho.zero_()
        torch.testing.assert_close(exp.scale, torch.ones(3, 3))
        torch.testing.assert_close(exp.variance, torch.ones(3, 3))
    torch.testing.assert_close(exp.scale, torch.ones(3, 3))


def test_traced_softplus_equals_softplus_with_its_gradient():
    """While torch.compile traces, sigma is ``log1p(exp(min(rho, 20)))`` (rho above 20): the same values as F.softplus
    everywhere (far below, at and around the threshold, far above), and the same gradient, finite where exp(rho)
    overflows; eager calls F.softplus itself."""
    import torch._dynamo
    import torch.nn.functional as F

    from varbnn._fast.softplus import softplus

    rho = torch.tensor([-200.0, -30.0, -5.0, 0.0, 3.0, 19.99, 20.0, 20.01, 88.0, 100.0, 1e4], dtype=torch.float64)
    weights = torch.linspace(0.5, 2.0, len(rho), dtype=rho.dtype)

    def value_and_grad(fn):
        x = rho.clone().requires_grad_()
        y = fn(x)
        (g,) = torch.autograd.grad((y * weights).sum(), x)
        return y.detach(), g

    reference, reference_grad = value_and_grad(F.softplus)
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    backend = CompileCounterWithBackend("aot_eager")
    traced = torch.compile(softplus, backend=backend, fullgraph=True)
    for y, g in (value_and_grad(softplus), value_and_grad(traced)):
        assert torch.equal(y, reference)
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, reference_grad, rtol=1e-12, atol=0)
    targets = {str(node.target) for node in backend.graphs[0].graph.nodes}
    assert str(torch.log1p) in targets and str(F.softplus) not in targets  # the traced branch was the one compared
