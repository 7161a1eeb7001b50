import math

import numpy as np
import pytest
import scipy.stats
import torch

import varbnn
from varbnn.distributions import ScaleMixtureNormal
from varbnn.families import Delta, MeanField
from varbnn.priors import Laplace, Normal, ScaleMixture, Uniform, make_prior, update_adaptive_priors


def test_scale_mixture_log_prob_is_finite_in_the_tails_and_matches_scipy():
    prior = ScaleMixture(0.25, 1.0, math.exp(-6))
    w = torch.tensor([0.0, 1e-3, 0.5, 3.0, 40.0, -200.0], dtype=torch.float64)
    lp = prior.distribution(w.shape).log_prob(w.float()).item()
    dens1 = scipy.stats.norm(0, 1).logpdf(w.numpy()) + math.log(0.25)
    dens2 = scipy.stats.norm(0, math.exp(-6)).logpdf(w.numpy()) + math.log(0.75)
    expected = np.logaddexp(dens1, dens2).sum()
    assert math.isfinite(lp)
    assert lp == pytest.approx(expected, rel=1e-5)


def test_scale_mixture_sampling_matches_its_variance():
    dist = ScaleMixtureNormal(torch.tensor(0.3), torch.tensor(2.0), torch.tensor(0.1), (50000,))
    var = 0.3 * 4.0 + 0.7 * 0.01
    assert float(dist.sample().var()) == pytest.approx(var, rel=0.05)


def test_normal_laplace_closed_form_kl_matches_monte_carlo():
    q = torch.distributions.Normal(torch.tensor([0.3, -1.0, 0.0]), torch.tensor([0.2, 0.7, 1.5]))
    p = torch.distributions.Laplace(torch.tensor(0.1), torch.tensor(0.5))
    analytic = varbnn.kl_divergence(q, p)
    w = q.sample((200000,))
    terms = q.log_prob(w) - p.log_prob(w)
    se = terms.std(0) / math.sqrt(w.shape[0])
    assert ((analytic - terms.mean(0)).abs() < 5 * se).all()


def test_monte_carlo_fallback_for_scale_mixture_is_unbiased():
    family = MeanField(init_std=0.2).build((30,), torch.randn(30) * 0.3)
    prior = ScaleMixture(0.5, 1.0, 0.05)
    q, p = family.distribution(), prior.distribution((30,))
    with torch.no_grad():
        single = torch.stack([family.kl(prior) for _ in range(4000)])  # the library's 1-sample estimator
        w = q.sample((40000,))
        reference = (q.log_prob(w) - p.log_prob(w)).mean()
    se = single.std() / math.sqrt(single.numel())
    assert abs(float(single.mean() - reference)) < 5 * float(se)


def test_uniform_prior_gives_maximum_likelihood():
    family = Delta().build((3, 3))
    assert float(family.kl(Uniform())) == 0.0
    mf = MeanField(init_std=0.1).build((3, 3))
    assert float(mf.kl(Uniform())) == pytest.approx(-float(mf.distribution().entropy()))


def _bayes_model(family, prior):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    return varbnn.bayesianize(net, family, prior)


def test_adaptive_normal_prior_gaussian_posterior_is_graves_eq_15_pooled_over_the_model():
    prior = Normal(0.0, 1.0, adaptive=True)
    model = _bayes_model(MeanField(init_std=0.05), prior)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, varbnn.BayesianModule):
                for _, q, _ in module.bayesian_tensors():
                    q.rho.uniform_(-4, -1)
    assert update_adaptive_priors(model) == 1
    mus, variances = [], []
    for module in model.modules():
        if isinstance(module, varbnn.BayesianModule):
            for _, q, p in module.bayesian_tensors():
                assert p is prior
                mus.append(q.loc.detach().numpy().ravel())
                variances.append(q.scale.detach().numpy().ravel() ** 2)
    mu, var = np.concatenate(mus), np.concatenate(variances)
    assert float(prior.loc) == pytest.approx(mu.mean(), abs=1e-6)
    assert float(prior.scale) ** 2 == pytest.approx((var + (mu - mu.mean()) ** 2).mean(), rel=1e-5)
    # the update minimises the KL over the prior's parameters: perturbing them increases it
    best = float(varbnn.kl(model))
    for dloc, dscale in [(0.05, 0), (-0.05, 0), (0, 0.05), (0, -0.05)]:
        with torch.no_grad():
            prior.loc += dloc
            prior.scale += dscale
        assert float(varbnn.kl(model)) > best
        with torch.no_grad():
            prior.loc -= dloc
            prior.scale -= dscale


def test_adaptive_laplace_prior_delta_posterior_is_median_and_mean_absolute_deviation():
    prior = Laplace(0.0, 1.0, adaptive=True)
    model = _bayes_model(Delta(), prior)
    update_adaptive_priors(model)
    w = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    loc = float(prior.loc)
    # any median minimises sum |w - loc|
    assert np.abs(w - loc).sum() == pytest.approx(np.abs(w - np.median(w)).sum(), rel=1e-6)
    assert float(prior.scale) == pytest.approx(np.abs(w - loc).mean(), rel=1e-5)


def test_adaptive_normal_delta_posterior_is_mean_and_variance():
    prior = Normal(0.0, 1.0, adaptive=True)
    model = _bayes_model(Delta(), prior)
    update_adaptive_priors(model)
    w = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    assert float(prior.loc) == pytest.approx(w.mean(), abs=1e-6)
    assert float(prior.scale) == pytest.approx(w.std(), rel=1e-5)


def test_adaptive_loc_only_keeps_the_scale():
    prior = Normal(0.0, 0.3, adaptive="loc")
    model = _bayes_model(Delta(), prior)
    update_adaptive_priors(model)
    assert float(prior.scale) == pytest.approx(0.3)
    assert float(prior.loc) != 0.0


def test_adaptive_laplace_with_gaussian_posterior_is_refused():
    model = _bayes_model(MeanField(), Laplace(adaptive=True))
    with pytest.raises(NotImplementedError, match="Delta posteriors"):
        update_adaptive_priors(model)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: Normal(0.0, 0.0), "scale must be > 0"),
        (lambda: Normal(0.0, -1.0), "scale must be > 0"),
        (lambda: Laplace(0.0, float("nan")), "scale must be finite"),
        (lambda: ScaleMixture(1.5, 1.0, 0.1), r"pi must be a finite number in \(0, 1\)"),
        (lambda: ScaleMixture(0.5, 1.0, -0.1), "scale2 must be > 0"),
        (lambda: Normal(adaptive="both"), "adaptive must be one of"),
        (lambda: make_prior("cauchy"), "unknown prior name.*allowed"),
    ],
)
def test_bad_prior_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()
