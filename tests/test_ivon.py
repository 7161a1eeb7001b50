"""varbnn.optim.IVON (Shen et al. 2024, from the paper): on Bayesian linear regression it reaches the mean-field
optimum known in closed form (means = the exact posterior mean, variances = 1 / diag(posterior precision)); what it
trains is an ordinary MeanField model; bad input is named."""

from __future__ import annotations

import math

import pytest
import torch
from bad_input_table import BadInput, check, params
from torch import nn

import varbnn
from varbnn.optim import IVON
from varbnn.training import read_checkpoint

NOISE_STD, PRIOR_STD = 0.5, 1.0


def _regression(n: int = 200, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.tensor([1.5, -0.7, 0.3], dtype=torch.float64)[:d]
    return x, x @ w + NOISE_STD * torch.randn(n, generator=g, dtype=torch.float64)


def _gaussian_nll(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The batch-mean NLL of N(target | output, NOISE_STD^2), without its constant."""
    return (output.squeeze(-1) - target).square().mean() / (2 * NOISE_STD**2)


def _model(d: int = 3, estimator: str = "reparam") -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(d, 1, bias=False)).double()
    return varbnn.bayesianize(net, varbnn.MeanField(estimator=estimator), varbnn.priors.Normal(0.0, PRIOR_STD))


@pytest.mark.parametrize(
    "estimator", ["reparam", pytest.param("local", marks=pytest.mark.slow)]  # local: the same check, ~30 s on 2 cores
)
def test_ivon_reaches_the_closed_form_mean_field_optimum_of_bayesian_linear_regression(estimator):
    x, y = _regression()
    n = x.shape[0]
    precision = x.T @ x / NOISE_STD**2 + torch.eye(3, dtype=x.dtype) / PRIOR_STD**2
    exact_mean = torch.linalg.solve(precision, x.T @ y / NOISE_STD**2)
    exact_std = precision.diagonal().rsqrt()  # the mean-field optimum's standard deviations
    model = _model(estimator=estimator)
    optimizer = IVON(model, n_data=n, lr=0.1, beta2=0.999, hess_init=1.0)
    batches = [(x, y)]  # full batch: the gradient's noise is the weight draw's only
    varbnn.fit(model, batches, n_data=n, epochs=2000, optimizer=optimizer, nll=_gaussian_nll, progress=False,
               diagnose=False)  # fmt: skip
    for group in optimizer.param_groups:
        group["lr"] = 0.01  # a smaller step for the last phase: the mean's stationary spread ~ sqrt(lr / 2) sigma
    varbnn.fit(model, batches, n_data=n, epochs=3000, optimizer=optimizer, nll=_gaussian_nll, progress=False,
               diagnose=False)  # fmt: skip
    family = model[0].posteriors["weight"]
    mean, std = family.loc.detach().reshape(-1), family.scale.detach().reshape(-1)
    # tolerances: the mean within 0.3 sigma (the last phase's spread is ~0.07 sigma); sigma within 5% (h is an average
    # over ~1/(1 - beta2) = 1000 draws of a curvature estimate whose relative spread is ~1.5: ~5% spread of h, 2.5% of
    # sigma; local reparameterisation's estimate is noisier by its per-example draws)
    assert torch.all((mean - exact_mean).abs() < 0.3 * exact_std), (mean, exact_mean, exact_std)
    torch.testing.assert_close(std, exact_std, rtol=0.05, atol=0)
    torch.testing.assert_close(optimizer.sigma(family).reshape(-1), std)  # the model samples IVON's posterior


def test_the_kl_weight_tempers_the_posterior_and_hess_init_none_keeps_the_models_sigma():
    x, y = _regression()
    model = _model()
    sigma0 = model[0].posteriors["weight"].scale.detach().clone()
    IVON(model, n_data=len(x))  # h0 from the current sigma: nothing changes
    torch.testing.assert_close(model[0].posteriors["weight"].scale.detach(), sigma0)
    cold, warm = _model(), _model()
    a, b = IVON(cold, n_data=200, hess_init=2.0), IVON(warm, n_data=200, hess_init=2.0, kl_weight=0.25)
    # sigma^2 = 1 / (ess (h0 + delta)) with delta = 1 / (ess s^2): 1 / (ess h0 + 1 / s^2), ess = n_data / kl_weight
    for optimizer, model, ess in ((a, cold, 200.0), (b, warm, 800.0)):
        sigma = optimizer.sigma(model[0].posteriors["weight"])
        torch.testing.assert_close(sigma, torch.full_like(sigma, (ess * 2.0 + 1 / PRIOR_STD**2) ** -0.5))
        torch.testing.assert_close(model[0].posteriors["weight"].scale.detach(), sigma)


def test_an_ivon_model_is_an_ordinary_meanfield_model_and_its_checkpoint_resumes(tmp_path):
    x, y = _regression()
    torch.manual_seed(0)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))).double()
    path = tmp_path / "ivon.pt"
    optimizer = IVON(model, n_data=200, lr=0.05)
    history = varbnn.fit(model, [(x, y)], n_data=200, epochs=3, optimizer=optimizer, nll=_gaussian_nll,
                         checkpoint=path, progress=False, diagnose=False)  # fmt: skip
    assert len(history) == 3 and all(math.isfinite(r["loss"]) and r["beta"] == 0.0 for r in history)
    assert history[-1]["kl"] > 0  # the model's KL is still reported (the prior is in the update, not the loss)
    state = read_checkpoint(path)
    assert "hess" in state["optimizer"]["state"][0]
    draws = varbnn.predict(model, x[:5], samples=4)
    assert draws.shape == (4, 5, 1) and not torch.equal(draws[0], draws[1])
    plain = varbnn.to_deterministic(model, "mean")
    assert isinstance(plain[0], nn.Linear)
    resumed_model = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))).double()
    resumed = IVON(resumed_model, n_data=200, lr=0.05)
    varbnn.fit(resumed_model, [(x, y)], n_data=200, epochs=3, optimizer=resumed, nll=_gaussian_nll, checkpoint=path,
               resume=True, progress=False, diagnose=False)  # fmt: skip
    for a, b in zip(model.state_dict().values(), resumed_model.state_dict().values()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
    assert torch.equal(optimizer.state[model[0].posteriors["weight"].loc]["hess"],
                       resumed.state[resumed_model[0].posteriors["weight"].loc]["hess"])  # fmt: skip


def test_plain_parameters_take_the_momentum_step():
    torch.manual_seed(0)
    model = nn.Sequential(varbnn.bayesianize(nn.Linear(3, 4)), nn.BatchNorm1d(4), nn.Linear(4, 2))
    optimizer = IVON(model, n_data=64)
    before = model[2].weight.detach().clone()
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    varbnn.fit(model, [(x, y)], n_data=64, epochs=1, optimizer=optimizer, progress=False, diagnose=False)
    assert not torch.equal(before, model[2].weight.detach())


def test_the_held_sigma_draw_is_the_softplus_draw_with_the_same_gradients():
    """IVON's families draw from the sigma it holds (one addcmul, d loss / d sigma into the held tensor): the same
    outputs, mean gradients and d loss / d sigma as the draw through softplus(rho) from the same noise, in float64."""
    torch.manual_seed(0)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))).double()
    IVON(model, n_data=100, lr=0.05)
    families = [f for m in model.modules() for _, f, _ in getattr(m, "bayesian_tensors", lambda: ())()]
    held = [f.held_scale() for f in families]
    assert all(h is not None for h in held)
    x = torch.randn(9, 5, dtype=torch.float64)
    torch.manual_seed(1)
    out_held = model(x)
    out_held.square().sum().backward()
    assert all(f.rho.grad is None for f in families)
    grads_held = [(f.loc.grad.clone(), h.grad.clone()) for f, h in zip(families, held)]
    for f in families:
        f.loc.grad = None
        f.hold_scale_(None)
    torch.manual_seed(1)
    out_rho = model(x)
    out_rho.square().sum().backward()
    torch.testing.assert_close(out_held, out_rho, rtol=1e-12, atol=0)
    for f, (loc_grad, sigma_grad) in zip(families, grads_held):
        torch.testing.assert_close(loc_grad, f.loc.grad, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(sigma_grad, f.rho.grad / torch.sigmoid(f.rho), rtol=1e-10, atol=1e-15)


def test_a_change_of_rho_ends_the_hold_and_copies_do_not_carry_it():
    import copy

    torch.manual_seed(0)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 4)))
    optimizer = IVON(model, n_data=10)
    family = model[0].posteriors["weight"]
    assert family.held_scale() is not None
    copied = copy.deepcopy(model)[0].posteriors["weight"]
    assert copied.held_scale() is None and "_held_scale" not in copied.__dict__
    model.load_state_dict(model.state_dict())  # a load rewrites rho: the family draws from softplus(rho) again
    assert family.held_scale() is None
    x, y = torch.randn(8, 3), torch.randint(0, 4, (8,))
    varbnn.fit(model, [(x, y)], n_data=10, epochs=1, optimizer=optimizer, progress=False, diagnose=False)
    assert family.held_scale() is not None  # the step wrote rho and holds the new sigma
    torch.testing.assert_close(family.held_scale(), torch.nn.functional.softplus(family.rho), rtol=1e-5, atol=0)
    with torch.no_grad():
        family.rho.add_(0.1)
    assert family.held_scale() is None
    with pytest.raises(ValueError, match="hold_scale_: sigma must be a leaf tensor of shape"):
        family.hold_scale_(torch.ones(2, requires_grad=True))


def _ivon(model_factory, **kwargs):
    return IVON(model_factory(), **{"n_data": 10, **kwargs})


def _with(family=None, prior=None):
    return lambda: varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2)), family or varbnn.MeanField(), prior)


CASES = [
    BadInput("Radial", lambda: _ivon(_with(varbnn.Radial())), ValueError, r"IVON trains MeanField .* got Radial at '0.weight'"),
    BadInput("KTied", lambda: _ivon(_with(varbnn.KTied(rank=1))), ValueError, r"got KTied"),
    BadInput("graves", lambda: _ivon(_with(varbnn.MeanField(estimator="graves"))), ValueError, r"estimator='graves'"),
    BadInput("learn_std=False", lambda: _ivon(_with(varbnn.MeanField(learn_std=False))), ValueError, r"learn_std=False"),
    BadInput("adaptive prior", lambda: _ivon(_with(prior=varbnn.priors.Normal(adaptive=True))), ValueError,
             r"IVON's prior is a Normal of scalar loc and scale"),
    BadInput("Laplace prior", lambda: _ivon(_with(prior=varbnn.priors.Laplace())), ValueError, r"IVON's prior is a Normal"),
    BadInput("a plain network", lambda: IVON(nn.Linear(3, 2), n_data=10), ValueError, r"no MeanField tensors"),
    BadInput("not a module", lambda: IVON([torch.zeros(2)], n_data=10), TypeError, r"IVON: model must be a torch.nn.Module"),
    BadInput("n_data=0", lambda: _ivon(_with(), n_data=0), ValueError, r"IVON: n_data must be an int >= 1"),
    BadInput("lr=0", lambda: _ivon(_with(), lr=0.0), ValueError, r"IVON: lr must be a finite number > 0"),
    BadInput("beta2=1", lambda: _ivon(_with(), beta2=1.0), ValueError, r"IVON: beta2 must be a finite number in \[0, 1\)"),
    BadInput("hess_init=-1", lambda: _ivon(_with(), hess_init=-1.0), ValueError, r"hess_init \(or None\) must be"),
    BadInput("kl_weight=True", lambda: _ivon(_with(), kl_weight=True), ValueError, r"IVON: kl_weight must be .* got a bool"),
    BadInput("fit with a kl_weight too", lambda: _fit_with_weight(), ValueError,
             r"includes the prior in its update .* leave fit's kl_weight unset"),
]


def _fit_with_weight():
    model = _with()()
    return varbnn.fit(model, [(torch.randn(4, 3), torch.zeros(4, dtype=torch.long))], n_data=10, epochs=1,
                      optimizer=IVON(model, n_data=10), kl_weight=1.0, progress=False)  # fmt: skip


@pytest.mark.parametrize("case", params(CASES))
def test_bad_ivon_input(case: BadInput) -> None:
    check(case)
