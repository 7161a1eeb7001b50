"""Graves (2011): adaptive-prior optima, MDL accounting, the Fisher variance gradient, pruning by |mu|/sigma."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import optimize, stats
from torch import nn

import varbnn
from varbnn.families import Delta, MeanField
from varbnn.models import mlp
from varbnn.nn import BayesLinear
from varbnn.objectives import (
    MDLReport,
    complexity_costs,
    complexity_is_finite,
    graves_gradients,
    mdl_report,
    per_example_gradients,
    transmitted_weights,
)
from varbnn.priors import Laplace, Normal, Uniform, update_adaptive_priors
from varbnn.prune import (
    SAFE_LAMBDA,
    count_nonzero_weights,
    density_ratio_masks,
    export_sparse,
    lambda_from_gamma,
    prune_by_density_ratio,
    relative_density_at_zero,
)
from varbnn.training import fit


def _delta_model(prior, seed=0):
    torch.manual_seed(seed)
    return varbnn.bayesianize(mlp(6, (9,), 4), Delta(), prior)


def _gauss_model(prior, seed=0, **options):
    torch.manual_seed(seed)
    model = varbnn.bayesianize(mlp(6, (9,), 4), MeanField(**{"init_std": 0.05, **options}), prior)
    with torch.no_grad():  # spread the stds so that the optimum is not a trivial average
        for p in model.parameters():
            if p.dim() and "rho" in [n for n, q in model.named_parameters() if q is p][0]:
                p.add_(0.5 * torch.randn_like(p))
    return model


# ---------------------------------------------------------------------------------------------------------
# Closed-form optimal prior parameters (eq. 7, 8, 15) vs numerical minimisation of the complexity loss
# ---------------------------------------------------------------------------------------------------------


def _weights(model) -> np.ndarray:
    return torch.cat([q.value.detach().reshape(-1) for _, q, _ in _tensors(model)]).double().numpy()


def _tensors(model):
    for module in model.modules():
        if isinstance(module, varbnn.nn.BayesianModule):
            yield from module.bayesian_tensors()


def test_adaptive_gaussian_prior_of_delta_posterior_minimises_the_complexity_loss():
    model = _delta_model(Normal(0.0, 1.0, adaptive=True))
    update_adaptive_priors(model)
    w = _weights(model)
    objective = lambda p: -stats.norm.logpdf(w, p[0], math.exp(p[1])).sum()  # noqa: E731  # L^C(alpha, w), eq. 8
    best = optimize.minimize(objective, [0.3, 0.0], method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12})
    prior = next(p for _, _, p in _tensors(model))
    assert float(prior.loc) == pytest.approx(best.x[0], abs=1e-5)
    assert float(prior.scale) == pytest.approx(math.exp(best.x[1]), rel=1e-5)
    assert float(varbnn.kl(model)) == pytest.approx(best.fun, rel=1e-5)


def test_adaptive_laplace_prior_of_delta_posterior_minimises_the_complexity_loss():
    model = _delta_model(Laplace(0.0, 1.0, adaptive=True))
    update_adaptive_priors(model)
    w = _weights(model)
    prior = next(p for _, _, p in _tensors(model))
    objective = lambda p: -stats.laplace.logpdf(w, p[0], math.exp(p[1])).sum()  # noqa: E731  # eq. 7
    best = optimize.minimize(objective, [0.1, -1.0], method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12})
    # the Laplace loss is piecewise linear in mu (flat between the two middle weights for an even count): compare values
    assert objective([float(prior.loc), math.log(float(prior.scale))]) <= best.fun + 1e-6
    assert float(prior.scale) == pytest.approx(math.exp(best.x[1]), rel=1e-4)
    for delta in (-1e-3, 1e-3):  # and it is a minimum in every direction
        assert objective([float(prior.loc) + delta, math.log(float(prior.scale))]) >= objective(
            [float(prior.loc), math.log(float(prior.scale))]
        )


def test_adaptive_gaussian_prior_of_gaussian_posterior_minimises_the_kl():
    model = _gauss_model(Normal(0.0, 1.0, adaptive=True))
    update_adaptive_priors(model)
    mus = torch.cat([q.loc.detach().reshape(-1) for _, q, _ in _tensors(model)]).double().numpy()
    sigmas = torch.cat([q.scale.detach().reshape(-1) for _, q, _ in _tensors(model)]).double().numpy()

    def objective(p):  # eq. 13
        m, s = p[0], math.exp(p[1])
        return float(np.sum(np.log(s / sigmas) + ((mus - m) ** 2 + sigmas**2 - s**2) / (2 * s**2)))

    best = optimize.minimize(objective, [0.2, 0.0], method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12})
    prior = next(p for _, _, p in _tensors(model))
    assert float(prior.loc) == pytest.approx(best.x[0], abs=1e-5)
    assert float(prior.scale) == pytest.approx(math.exp(best.x[1]), rel=1e-5)
    assert float(varbnn.kl(model)) == pytest.approx(best.fun, rel=1e-5)


# ---------------------------------------------------------------------------------------------------------
# MDL accounting
# ---------------------------------------------------------------------------------------------------------


def test_mdl_report_bits_are_nats_over_ln2_and_ratio_is_against_a_uniform_code():
    report = MDLReport(error_nats=700.0, complexity_nats=300.0, n_targets=1000, n_classes=10, n_weights=50)
    assert report.error_bits == pytest.approx(700.0 / math.log(2))
    assert report.complexity_bits == pytest.approx(300.0 / math.log(2))
    assert report.total_bits == pytest.approx(1000.0 / math.log(2))
    assert report.uniform_bits == pytest.approx(1000 * math.log2(10))
    assert report.ratio == pytest.approx((1000.0 / math.log(2)) / (1000 * math.log2(10)))
    assert report.bits_per_weight == pytest.approx(300.0 / math.log(2) / 50)
    undefined = MDLReport(error_nats=1.0, complexity_nats=None, n_targets=3, n_classes=10, n_weights=5)
    assert undefined.ratio is None and undefined.bits_per_weight is None and undefined.total_bits is None


def test_mdl_error_loss_of_a_delta_model_is_the_plain_models_summed_cross_entropy():
    model = _delta_model(Uniform())
    plain = varbnn.to_deterministic(model, "mode")
    x, y = torch.randn(37, 6), torch.randint(0, 4, (37,))
    report = mdl_report(model, x, y, samples=3, batch_size=10)
    assert report.error_nats == pytest.approx(float(F.cross_entropy(plain(x), y, reduction="sum")), rel=1e-6)
    assert report.complexity_nats is None and not complexity_is_finite(model)  # improper prior: infinite L^C
    assert report.n_classes == 4 and report.n_weights == sum(p.numel() for p in plain.parameters())


def test_mdl_error_loss_is_the_monte_carlo_expected_nll():
    model = _gauss_model(Normal(0.0, 1.0))
    x, y = torch.randn(20, 6), torch.randint(0, 4, (20,))
    torch.manual_seed(3)
    report = mdl_report(model, x, y, samples=4000, batch_size=20)
    torch.manual_seed(4)
    draws = torch.stack([F.cross_entropy(model(x), y, reduction="sum") for _ in range(4000)]).detach()
    assert report.error_nats == pytest.approx(float(draws.mean()), abs=4 * float(draws.std()) / math.sqrt(4000) * 1.5)
    assert report.complexity_nats == pytest.approx(float(varbnn.kl(model)), rel=1e-6)


def test_complexity_costs_are_eq_13_per_weight_and_sum_to_the_kl():
    model = _gauss_model(Normal(0.1, 0.7))
    costs = complexity_costs(model)
    total = 0.0
    for cost, (_, q, p) in zip(costs.values(), _tensors(model)):
        oracle = torch.distributions.kl_divergence(
            torch.distributions.Normal(q.loc, q.scale),
            torch.distributions.Normal(p.loc.expand_as(q.loc), p.scale.expand_as(q.loc)),
        )
        torch.testing.assert_close(cost, oracle.detach(), rtol=1e-5, atol=1e-6)
        total += float(cost.sum())
    assert total == pytest.approx(float(varbnn.kl(model)), rel=1e-5)


def test_complexity_costs_of_delta_weights_are_negative_log_prior_densities():
    model = _delta_model(Laplace(0.0, 0.2))
    costs = complexity_costs(model)
    for (_, cost), (_, q, _) in zip(costs.items(), _tensors(model)):
        oracle = -stats.laplace.logpdf(q.value.detach().double().numpy(), 0.0, 0.2)
        np.testing.assert_allclose(cost.double().numpy(), oracle, rtol=1e-5, atol=1e-6)  # float32 costs near 0
    with pytest.raises(ValueError, match="improper Uniform"):
        complexity_costs(_delta_model(Uniform()))


# ---------------------------------------------------------------------------------------------------------
# Per-example gradients and Graves' Fisher variance gradient
# ---------------------------------------------------------------------------------------------------------


def test_per_example_gradients_equal_a_python_loop_for_a_delta_model():
    model = _delta_model(Normal(0.0, 1.0))
    x, y = torch.randn(5, 6), torch.randint(0, 4, (5,))
    grads, values = per_example_gradients(model, x, y)
    for n in range(5):
        model.zero_grad()
        loss = F.cross_entropy(model(x[n : n + 1]), y[n : n + 1])
        loss.backward()
        assert float(values[n]) == pytest.approx(float(loss), rel=1e-6)
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name][n], p.grad, rtol=1e-5, atol=1e-7)


def test_graves_gradients_of_a_delta_model_equal_ordinary_backprop():
    model = _delta_model(Normal(0.0, 0.5))
    clone = _delta_model(Normal(0.0, 0.5))
    clone.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 6), torch.randint(0, 4, (8,))
    terms = graves_gradients(model, x, y, n_data=100, kl_weight=0.7)
    reference = varbnn.elbo_loss(F.cross_entropy(clone(x), y), clone, 100, kl_weight=0.7)
    reference.loss.backward()
    assert float(terms.loss) == pytest.approx(float(reference.loss), rel=1e-6)
    for (name, p), q in zip(model.named_parameters(), clone.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_per_example_gradients_refuse_batch_norm_in_training_mode_and_accept_it_in_eval_mode():
    model = nn.Sequential(BayesLinear(6, 5, family=Delta()), nn.BatchNorm1d(5), nn.Linear(5, 4))
    x, y = torch.randn(8, 6), torch.randint(0, 4, (8,))
    with pytest.raises(ValueError, match=r"batch normalisation.*\['1'\].*eval mode"):
        per_example_gradients(model, x, y)
    model.eval()  # running statistics: each example's output is its own, so the loop oracle applies
    grads, values = per_example_gradients(model, x, y)
    model.zero_grad()
    F.cross_entropy(model(x[2:3]), y[2:3]).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name][2], p.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("weight_draws", ["example", "batch"])
def test_graves_variance_gradient_matches_the_second_derivative_form_on_a_quadratic_loss(weight_draws):
    """On l_n(w) = (y_n - w.x_n)^2 / 2 with y_n = w*.x_n + N(0, 1) and q centred at w*, the empirical Fisher equals the
    Hessian in expectation over the data: E[g_n^2] = (1 + sigma^2 |x_n|^2) x_n^2 ~ x_n^2 = d^2 l_n / dw^2. Graves'
    estimate of d E_q[mean_n l_n] / d sigma must then match sigma * mean_n d^2 l_n / dw^2 (exact form, eq. 10),
    which a wrong factor 1/2 or a batch sum instead of a mean would miss."""
    torch.manual_seed(0)
    d, n, sigma = 3, 40000, 0.01
    layer = BayesLinear(d, 1, bias=False, family=MeanField(init_std=sigma, estimator="graves"), prior=Normal(0.0, 1.0))
    w_true = torch.tensor([[0.5, -1.0, 2.0]])
    with torch.no_grad():
        layer.posteriors["weight"].loc.copy_(w_true)
    x = torch.randn(n, d) * torch.tensor([0.5, 1.0, 2.0])
    y = x @ w_true[0] + torch.randn(n)
    nll = lambda out, target: 0.5 * (out.squeeze(-1) - target).square().mean()  # noqa: E731
    graves_gradients(layer, x, y, n_data=n, nll=nll, kl_weight=0.0, weight_draws=weight_draws)
    family = layer.posteriors["weight"]
    sigmoid = torch.sigmoid(family.rho.detach())
    estimate = family.rho.grad / sigmoid  # d/d sigma

    def loss_at(w: torch.Tensor, xn: torch.Tensor, yn: torch.Tensor) -> torch.Tensor:
        return 0.5 * (yn - w @ xn).square()

    hessians = torch.func.vmap(torch.func.hessian(loss_at), in_dims=(None, 0, 0))(w_true[0], x, y)
    exact = sigma * torch.diagonal(hessians, dim1=-2, dim2=-1).mean(0)  # d/dsigma of 1/2 sigma^2 mean_n H_nn
    torch.testing.assert_close(estimate[0], exact, rtol=0.05, atol=0.0)
    # the means get the ordinary (pathwise) gradient: mean_n (w.x_n - y_n) x_n
    expected_loc = ((x @ w_true[0] - y)[:, None] * x).mean(0)
    torch.testing.assert_close(family.loc.grad[0], expected_loc, rtol=0.0, atol=5 * sigma * float(x.square().mean()))


def test_graves_estimator_trains_through_fit_and_moves_the_stds():
    torch.manual_seed(0)
    model = varbnn.bayesianize(mlp(6, (8,), 3), MeanField(init_std=0.1, estimator="graves"), Normal(0.0, 1.0, adaptive=True))
    x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
    rho0 = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("rho")}
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    history = fit(model, batches, n_data=64, epochs=15, lr=1e-2, progress=False)
    assert history[-1]["loss"] < history[0]["loss"]
    assert all(not torch.equal(p, rho0[n]) for n, p in model.named_parameters() if n.endswith("rho"))


def test_fixed_std_weight_noise_trains_only_the_means():
    model = varbnn.bayesianize(mlp(6, (8,), 3), MeanField(init_std=0.075, learn_std=False), Uniform())
    assert not any(n.endswith("rho") for n, _ in model.named_parameters())
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    fit(model, [(x, y)], n_data=32, epochs=3, progress=False)
    for _, q, _ in _tensors(model):
        torch.testing.assert_close(q.scale, torch.full_like(q.scale, 0.075))
    with pytest.raises(ValueError, match="learn_std must be True or False"):
        MeanField(learn_std="no")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# Pruning by the relative density at zero (section 7)
# ---------------------------------------------------------------------------------------------------------


def test_pruning_mask_is_the_relative_density_definition():
    model = _gauss_model(Normal(0.0, 1.0))
    gamma = 0.3
    lam = lambda_from_gamma(gamma)
    assert lam == pytest.approx(math.sqrt(-2 * math.log(gamma)))
    assert SAFE_LAMBDA == pytest.approx(0.8326, abs=1e-4) and lambda_from_gamma(2**-0.5) == pytest.approx(SAFE_LAMBDA)
    masks = density_ratio_masks(model, lam)
    for keep, (_, q, _) in zip(masks.values(), _tensors(model)):
        mu, s = q.loc.detach().double().numpy(), q.scale.detach().double().numpy()
        relative = stats.norm.pdf(0.0, mu, s) / stats.norm.pdf(mu, mu, s)
        np.testing.assert_array_equal(keep.numpy(), ~(relative > gamma))
        np.testing.assert_allclose(relative_density_at_zero(q).double().numpy(), relative, rtol=1e-3, atol=1e-30)
    assert all(bool(m.all()) for m in density_ratio_masks(model, 0.0).values())  # lambda = 0 prunes nothing
    with pytest.raises(ValueError, match="lambda must be"):
        density_ratio_masks(model, -1.0)
    with pytest.raises(ValueError, match="gamma must be in"):
        lambda_from_gamma(0.0)


def test_safe_lambda_is_where_zero_becomes_less_probable_than_an_average_draw():
    """Eq. 20's rule: the density at 0 relative to the mode, exp(-lambda^2/2), equals the average density of a draw
    relative to the mode, E_q[q(w)] / q(mu) (Monte Carlo), at lambda = SAFE_LAMBDA."""
    torch.manual_seed(0)
    q = torch.distributions.Normal(0.3, 0.2)
    w = q.sample((400000,))
    average = float((q.log_prob(w) - q.log_prob(torch.tensor(0.3))).exp().mean())
    assert math.exp(-(SAFE_LAMBDA**2) / 2) == pytest.approx(average, rel=3e-3)


@pytest.mark.parametrize("estimator", ["reparam", "local", "flipout", "graves"])
def test_pruned_weights_are_zero_unsampled_free_and_frozen(estimator):
    model = _gauss_model(Normal(0.0, 0.5), estimator=estimator)
    report = prune_by_density_ratio(model, 1.0)
    assert 0 < report["kept"] < report["total"] == sum(q.loc.numel() for _, q, _ in _tensors(model))
    assert transmitted_weights(model) == report["kept"]
    layer = model[1]
    q = layer.posteriors["weight"]
    pruned = q.weight_mask == 0
    assert bool((q.rsample((5,))[:, pruned] == 0).all()) and bool((q.mode[pruned] == 0).all())
    # the KL counts kept weights only
    kept_cost = sum(float(c.sum()) for c in complexity_costs(model).values())
    assert float(varbnn.kl(model)) == pytest.approx(kept_cost, rel=1e-5)
    # a pruned input unit can not influence the output: zero its weights' effect via the mask and check gradients
    x, y = torch.randn(16, 6), torch.randint(0, 4, (16,))
    if estimator == "graves":
        graves_gradients(model, x, y, n_data=100)
    else:
        varbnn.elbo_loss(F.cross_entropy(model(x), y), model, 100).loss.backward()
    assert bool((q.loc.grad[pruned] == 0).all()) and bool((q.rho.grad[pruned] == 0).all())
    # weights pruned before stay pruned at a lower lambda
    again = prune_by_density_ratio(model, 0.0)
    assert again["kept"] == report["kept"]


def test_pruned_state_dict_round_trip_and_sparse_export():
    model = _gauss_model(Normal(0.0, 1.0))
    prune_by_density_ratio(model, 0.9)
    fresh = _gauss_model(Normal(0.0, 1.0), seed=5)
    fresh.load_state_dict(model.state_dict())
    assert transmitted_weights(fresh) == transmitted_weights(model)
    plain, sparse = export_sparse(model)
    assert isinstance(plain[1], nn.Linear)
    x = torch.randn(9, 6)
    with varbnn.sample_mode(model, "mode"):
        torch.testing.assert_close(plain(x), model(x))
    nonzero, total = count_nonzero_weights(plain)
    assert nonzero <= transmitted_weights(model) and total == sum(q.loc.numel() for _, q, _ in _tensors(model))
    assert sparse["1.weight"].is_sparse and torch.equal(sparse["1.weight"].to_dense(), plain[1].weight.detach())


def test_prune_mask_validation():
    q = MeanField().build((3, 4))
    with pytest.raises(ValueError, match="bool tensor of shape \\(3, 4\\)"):
        q.prune_(torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="no Gaussian"):
        density_ratio_masks(_delta_model(Normal()), 1.0)
    assert q.prune_(torch.zeros(3, 4, dtype=torch.bool)).kept == 0 and q.prune_(None).kept == 12


# ---------------------------------------------------------------------------------------------------------
# The experiments (quick forms)
# ---------------------------------------------------------------------------------------------------------


def test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network(data_dir, tmp_path):
    from varbnn_lab.graves import graves_config, run_graves_mnist
    from varbnn_lab.graves_prune import run_graves_prune

    config = graves_config("graves-mnist", quick=True)
    result = run_graves_mnist(config, out_dir=tmp_path, data_dir=str(data_dir), progress=False)
    rows = {r["variant"]: r for r in result["rows"]}
    assert len(rows) == 11 and (tmp_path / "graves-mnist-quick.png").exists()
    assert rows["maximum likelihood"]["ratio"] is None and rows["weight noise"]["ratio"] is None
    awn = rows["adaptive weight noise"]
    assert awn["ratio"][0] > 0 and awn["bits_per_weight"][0] > 0 and not awn["early_stopping"]
    assert 0.0 <= awn["test_error_mode"][0] <= 1.0
    # a rerun reuses the saved runs: nothing is retrained
    again = run_graves_mnist(config, out_dir=tmp_path, data_dir=str(data_dir), progress=False)
    assert json.dumps(again["rows"]) == json.dumps(result["rows"])  # (NaN standard errors of one seed compare equal)
    pruned = run_graves_prune(graves_config("graves-prune", quick=True), out_dir=tmp_path, data_dir=str(data_dir), progress=False)
    by_lambda = {r["lambda"]: r for r in pruned["rows"]}
    assert by_lambda[0.0]["weights"] == by_lambda[0.0]["total"] and by_lambda[0.0]["retrain_epochs"] == 0
    assert by_lambda[2.0]["weights"] < by_lambda[0.83]["weights"] < by_lambda[0.0]["weights"]
    assert (tmp_path / "graves-prune-quick.md").read_text().count("| 0.83 |") == 1


def test_graves_config_validation():
    from varbnn_lab.graves import GravesConfig, graves_config

    with pytest.raises(ValueError, match="unknown Graves experiment"):
        graves_config("graves-timit")
    with pytest.raises(ValueError, match="model must be one of"):
        GravesConfig(model="mdrnn")
    assert graves_config("graves-mnist-lstm").model == "row_lstm"


def test_graves_estimator_covers_the_recurrent_case():
    """Per-example gradients through a Bayesian LSTM (the row-LSTM of graves-mnist-lstm) equal a Python loop (Delta),
    and the Fisher variance gradient reaches the recurrent stds."""
    from varbnn.models import row_lstm

    torch.manual_seed(0)
    model = varbnn.bayesianize(row_lstm(rows=4, features=3, hidden=5, num_classes=2), Delta(), Normal(0.0, 1.0))
    x, y = torch.randn(3, 4, 3), torch.randint(0, 2, (3,))
    grads, _ = per_example_gradients(model, x, y)
    name = "lstm.posteriors.weight_hh_l0.value"
    for n in range(3):
        model.zero_grad()
        F.cross_entropy(model(x[n : n + 1]), y[n : n + 1]).backward()
        torch.testing.assert_close(grads[name][n], dict(model.named_parameters())[name].grad, rtol=1e-5, atol=1e-7)
    gauss = varbnn.bayesianize(row_lstm(rows=4, features=3, hidden=5, num_classes=2), MeanField(estimator="graves"), Normal())
    graves_gradients(gauss, x, y, n_data=10)
    rho = dict(gauss.named_parameters())["lstm.posteriors.weight_hh_l0.rho"]
    assert rho.grad is not None and bool(torch.isfinite(rho.grad).all()) and float(rho.grad.abs().sum()) > 0
