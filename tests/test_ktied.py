"""The k-tied Normal family: structure, initialisation, parameter counts and layer behaviour."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import varbnn
from varbnn import BayesConv2d, BayesLinear, BayesLSTM, KTied, MeanField
from varbnn.families import make_family
from varbnn.priors import Normal


@pytest.mark.parametrize("shape", [(6, 5), (8, 3, 3, 3), (12, 7)])
@pytest.mark.parametrize("rank", [1, 2])
def test_std_matrix_is_u_v_transposed_of_rank_k(shape, rank):
    torch.manual_seed(0)
    q = KTied(rank=rank, init_std=0.05).build(shape)
    m, n = KTied.matrix_shape(shape)
    assert q.tied and q.u.shape == (m, rank) and q.v.shape == (n, rank)
    matrix = q.scale.reshape(m, n)
    torch.testing.assert_close(matrix, q.u @ q.v.T)
    assert (matrix > 0).all()
    assert torch.linalg.matrix_rank(matrix.detach().double(), rtol=1e-5).item() == rank  # float32 rounding
    # initial stds have MeanField's mean (paper section 3.1), with a spread that breaks the columns' symmetry
    assert matrix.mean().item() == pytest.approx(0.05, rel=1e-5)
    if rank > 1:
        assert not torch.allclose(q.u[:, 0], q.u[:, 1])


def test_parameter_count_is_mn_plus_k_m_plus_n():
    layer = BayesLinear(400, 300, family=KTied(rank=2), bias_family=KTied(rank=2))
    weight, bias = layer.posteriors["weight"], layer.posteriors["bias"]
    assert weight.num_variational_parameters == 300 * 400 + 2 * (300 + 400)
    assert not bias.tied and bias.num_variational_parameters == 2 * 300  # 1-d: per-element std
    mf = BayesLinear(400, 300, family=MeanField()).posteriors["weight"].num_variational_parameters
    assert weight.num_variational_parameters / mf == pytest.approx(0.5 + 1400 / 240000)
    conv = BayesConv2d(3, 8, 3, family=KTied(rank=1)).posteriors["weight"]
    assert conv.num_variational_parameters == 8 * 27 + (8 + 27)


def test_rank_at_least_min_dimension_falls_back_to_per_element_stds():
    q = KTied(rank=3, init_std=0.1).build((3, 10))
    assert not q.tied and hasattr(q, "rho") and not hasattr(q, "log_u")
    torch.testing.assert_close(q.scale, torch.full((3, 10), 0.1))


def test_kl_against_normal_prior_is_the_closed_form():
    torch.manual_seed(1)
    q = KTied(rank=2, init_std=0.2).build((5, 4))
    prior = Normal(0.1, 0.7)
    sigma, mu = q.scale, q.loc
    want = (math.log(0.7) - sigma.log() + (sigma**2 + (mu - 0.1) ** 2) / (2 * 0.49) - 0.5).sum()
    torch.testing.assert_close(q.kl(prior), want)
    q.kl(prior).backward()
    assert q.log_u.grad is not None and q.log_v.grad is not None and q.loc.grad is not None


@pytest.mark.parametrize("estimator", ["local", "flipout"])
def test_fast_estimators_have_the_exact_output_moments(estimator):
    torch.manual_seed(2)
    layer = BayesLinear(5, 3, family=KTied(rank=1, init_std=0.4, estimator=estimator))
    x = torch.randn(4, 5)
    n = 20000
    out = varbnn.predict(layer, x, samples=n, vectorize=True)
    w, b = layer.posteriors["weight"], layer.posteriors["bias"]
    mean = (x @ w.loc.T + b.loc).detach()
    var = ((x * x) @ (w.scale**2).T + b.scale**2).detach()
    assert ((out.mean(0) - mean).abs() <= 5 * (var / n).sqrt()).all()
    assert ((out.var(0) - var).abs() <= 5 * var * math.sqrt(2 / n)).all()


def test_lstm_kernels_are_tied_as_matrices():
    lstm = BayesLSTM(28, 16, family=KTied(rank=2))
    for name, q in lstm.posteriors.items():
        if "weight" in name:
            assert q.tied and q.u.shape[0] == 64
    out, _ = lstm(torch.randn(3, 5, 28))
    assert out.shape == (3, 5, 16)


def test_bayesianize_and_training_reduce_the_loss():
    torch.manual_seed(3)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1)), KTied(rank=2), Normal(0, 1))
    x = torch.randn(256, 4)
    y = x.sum(-1, keepdim=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(150):
        terms = varbnn.elbo_loss(nn.functional.mse_loss(model(x), y, reduction="sum") / 256, model, n_data=256)
        opt.zero_grad()
        terms.loss.backward()
        opt.step()
        losses.append(terms.loss.item())
    assert sum(losses[-10:]) / 10 < 0.3 * sum(losses[:10]) / 10
    assert isinstance(make_family("ktied", rank=1), KTied)


@pytest.mark.parametrize("rank", [0, -1, 1.5, True, "2"])
def test_bad_rank(rank):
    with pytest.raises(ValueError, match="rank must be an int >= 1"):
        KTied(rank=rank)


def test_std_matrix_is_shared_within_a_step_with_exact_gradients_and_never_stale():
    """U V^T is computed once per step (forward and KL share it; custom backward) with the gradients of the plain
    product; dropped by the backward pass and after a parameter update; graphs built on it differentiate apart."""
    family = KTied(rank=2, init_std=0.1).build((6, 5), torch.randn(6, 5, dtype=torch.float64))
    prior = Normal(0.0, 0.5).double()
    a = family.scale
    assert family.scale is a
    torch.manual_seed(0)
    loss = (family.scale**3).sum() + family.kl(prior)
    grads = torch.autograd.grad(loss, [family.log_u, family.log_v])
    assert family._scale_cache is None
    log_u, log_v = family.log_u.detach().requires_grad_(), family.log_v.detach().requires_grad_()
    scale = log_u.exp() @ log_v.exp().T
    reference = (scale**3).sum() + torch.distributions.kl_divergence(
        torch.distributions.Normal(family.loc.detach(), scale), torch.distributions.Normal(0.0, 0.5)
    ).sum()
    for got, expected in zip(grads, torch.autograd.grad(reference, [log_u, log_v])):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    stale = family.scale
    with torch.no_grad():
        family.log_u.add_(0.3)
    assert family.scale is not stale
    torch.testing.assert_close(family.scale, (family.log_u.exp() @ family.log_v.exp().T).detach())
    nll_like, kl = family.scale.sum(), family.kl(prior)  # two graphs on the one cached matrix
    g_nll = torch.autograd.grad(nll_like, family.log_u)[0]
    g_kl = torch.autograd.grad(kl, family.log_u)[0]
    assert torch.isfinite(g_nll).all() and torch.isfinite(g_kl).all()


_USED = [(1, 1, 1, 1), (1, 0, 1, 1), (0, 1, 1, 1), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 1, 0, 0)]


@pytest.mark.parametrize(("with_square", "used"), [(True, u) for u in _USED] + [(False, u) for u in _USED if not u[1]])
def test_exp_outer_stats_node_gradcheck_float64(with_square, used, stats_objective):
    """The fused k-tied node (sigma = U V^T in a conv weight's shape, sigma^2, sum log sigma, sum sigma^2) against finite
    differences for every subset of outputs a step uses, and its values against the plain formulas."""
    from varbnn.families.ktied import _ExpOuterStats

    shape = torch.Size((4, 3, 1, 2))
    log_u = (0.3 * torch.randn(4, 2, dtype=torch.float64)).requires_grad_()
    log_v = (0.3 * torch.randn(6, 2, dtype=torch.float64)).requires_grad_()
    w1, w2 = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return stats_objective(_ExpOuterStats.apply(a, b, with_square, shape), used, w1, w2)

    assert torch.autograd.gradcheck(f, (log_u, log_v))
    sigma, square, sum_log, sum_sq = _ExpOuterStats.apply(log_u, log_v, with_square, shape)
    reference = (log_u.exp() @ log_v.exp().T).reshape(shape)
    torch.testing.assert_close(sigma, reference)
    torch.testing.assert_close(sum_log, reference.log().sum())
    torch.testing.assert_close(sum_sq, reference.square().sum())
    assert (square is None) != with_square


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_outer_product_node_gradcheck_float64(rank):
    """The compiled step's ``U V^T`` (its backward hands the thin factors to the GEMMs in other layouts) against finite
    differences, and its value and gradients against autograd's ``u @ v.T``."""
    from varbnn.families.ktied import _OuterProduct

    u = torch.randn(5, rank, dtype=torch.float64, requires_grad=True)
    v = torch.randn(7, rank, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 7, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: (_OuterProduct.apply(a, b) * weight).sum(), (u, v))
    out = _OuterProduct.apply(u, v)
    reference = u @ v.T
    torch.testing.assert_close(out, reference)
    grads = torch.autograd.grad((out * weight).sum(), (u, v))
    for got, expected in zip(grads, torch.autograd.grad((reference * weight).sum(), (u, v))):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("estimator", ["local", "reparam"])
def test_ktied_step_through_the_fused_node_equals_plain_autograd(estimator):
    family = KTied(rank=2, init_std=0.1).build((6, 5), torch.randn(6, 5, dtype=torch.float64))
    prior = Normal(0.1, 0.5).double()
    x, eps = torch.randn(7, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    fit_part = (x.square() @ family.variance.T).sum() if estimator == "local" else (x @ (family.loc + family.scale * eps).T).sum()
    (fit_part + family.kl(prior)).backward()
    assert family._scale_cache is None
    loc = family.loc.detach().requires_grad_()
    log_u, log_v = family.log_u.detach().requires_grad_(), family.log_v.detach().requires_grad_()
    sigma = log_u.exp() @ log_v.exp().T
    plain_fit = (x.square() @ sigma.square().T).sum() if estimator == "local" else (x @ (loc + sigma * eps).T).sum()
    plain_kl = torch.distributions.kl_divergence(torch.distributions.Normal(loc, sigma), torch.distributions.Normal(0.1, 0.5))
    (plain_fit + plain_kl.sum()).backward()
    for got, expected in [(family.log_u.grad, log_u.grad), (family.log_v.grad, log_v.grad), (family.loc.grad, loc.grad)]:
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
