"""Last-layer KFAC Laplace: factors vs autograd Hessians, covariance vs a dense inverse, draws vs the covariance,
evidence vs a dense logdet, the predict path, and the clear errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from bad_input_table import BadInput, check, params
from torch import nn
from torch.autograd.functional import hessian

from varbnn.laplace import LastLayerLaplace
from varbnn.predict import classification_summary, predict

CLASSES, HIDDEN, INPUTS = 4, 5, 3


def _model(bias: bool = True, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """The exactness oracles use float64 models: the factors use the model's own logits, the oracles recompute them."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(INPUTS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES, bias=bias)).to(dtype)


def _data(n: int, seed: int = 1, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, INPUTS, generator=g, dtype=dtype), torch.randint(0, CLASSES, (n,), generator=g)


def _batches(x: torch.Tensor, y: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def _features(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """phi~ computed from the model's pieces (not through the hook), float64."""
    phi = torch.tanh(model[0](x)).detach().double()
    return torch.cat([phi, torch.ones(len(x), 1, dtype=phi.dtype)], 1) if model[2].bias is not None else phi


def _fitted(
    n: int = 40, bias: bool = True, prior_precision: float = 0.7, dtype: torch.dtype = torch.float32
) -> tuple[LastLayerLaplace, torch.Tensor, torch.Tensor]:
    x, y = _data(n, dtype=dtype)
    return LastLayerLaplace(_model(bias, dtype=dtype), prior_precision).fit(_batches(x, y, 16)), x, y


def _dense_precision(la: LastLayerLaplace, delta: float) -> torch.Tensor:
    assert la.output_factor is not None and la.input_factor is not None
    kron = torch.kron(la.output_factor, la.input_factor)
    return kron + delta * torch.eye(len(kron), dtype=torch.float64)


@pytest.mark.parametrize("bias", [True, False])
def test_kfac_with_one_example_equals_the_autograd_hessian(bias: bool) -> None:
    """N = 1: A (x) G = Lambda (x) phi~ phi~^T is the exact Hessian of the cross-entropy w.r.t. vec(W~) (the logits
    are linear in W~, so GGN = Hessian; the KFAC expectation factorisation is exact for one example)."""
    model = _model(bias, dtype=torch.float64)
    x, y = _data(1, dtype=torch.float64)
    la = LastLayerLaplace(model).fit([(x, y)])
    phi = _features(model, x)
    theta = la.posterior_mean.flatten().clone()
    loss = lambda t: F.cross_entropy(phi @ t.view(CLASSES, -1).T, y, reduction="sum")  # noqa: E731
    exact = hessian(loss, theta)
    assert la.output_factor is not None and la.input_factor is not None
    assert la.num_parameters == CLASSES * (HIDDEN + bias) == len(theta)
    torch.testing.assert_close(torch.kron(la.output_factor, la.input_factor), exact, rtol=0, atol=1e-12)
    assert la.log_likelihood == pytest.approx(-float(loss(theta)), rel=1e-12)


def test_factors_are_the_summed_logit_hessians_and_the_mean_feature_outer_product() -> None:
    """A = sum_n d^2 CE_n / d f_n^2 (per-example autograd Hessians w.r.t. the logits), G = (1/N) sum phi~ phi~^T; the
    result does not depend on the batching."""
    model = _model(dtype=torch.float64)
    x, y = _data(30, dtype=torch.float64)
    phi = _features(model, x)
    logits = phi @ LastLayerLaplace(model).fit([(x, y)]).posterior_mean.T
    a_exact = sum(hessian(lambda f, n=n: F.cross_entropy(f[None], y[n : n + 1]), logits[n]) for n in range(len(x)))
    for size in (1, 7, 30):
        la = LastLayerLaplace(model).fit(_batches(x, y, size))
        assert la.num_data == 30
        torch.testing.assert_close(la.output_factor, a_exact, rtol=0, atol=1e-12)
        torch.testing.assert_close(la.input_factor, phi.T @ phi / 30, rtol=0, atol=1e-12)
        assert la.log_likelihood == pytest.approx(-float(F.cross_entropy(logits, y, reduction="sum")), rel=1e-12)


@pytest.mark.parametrize("delta", [1e-3, 0.7, 50.0])
def test_posterior_covariance_equals_the_dense_inverse(delta: float) -> None:
    la, _, _ = _fitted()
    la.prior_precision = delta
    dense = torch.linalg.inv(_dense_precision(la, delta))
    torch.testing.assert_close(la.posterior_covariance(), dense, rtol=1e-9, atol=1e-9 * float(dense.abs().max()))
    torch.testing.assert_close(la.posterior_variance().flatten(), dense.diagonal(), rtol=1e-9, atol=0)


def test_weight_draws_have_the_posterior_mean_and_covariance() -> None:
    """20,000 draws of the 24 parameters. With the known mean m, the sample covariance S_ij = 1/n sum (x_i - m_i)(x_j -
    m_j) of a Gaussian has variance (Sigma_ii Sigma_jj + Sigma_ij^2) / n, and the sample mean has variance Sigma_ii / n;
    5 standard errors per entry: a Gaussian tail of 5.7e-7 per entry, at most 300 + 24 distinct entries, so a false
    alarm has probability < 2e-4 (and the seed is fixed)."""
    la, _, _ = _fitted(prior_precision=0.3)
    n = 20_000
    torch.manual_seed(0)
    draws = la.sample_parameters(n).flatten(1)
    assert draws.shape == (n, la.num_parameters) and draws.dtype == torch.float64
    sigma = la.posterior_covariance()
    mean = la.posterior_mean.flatten()
    centred = draws - mean
    sample = centred.T @ centred / n
    variance = sigma.diagonal()
    standard_error = ((torch.outer(variance, variance) + sigma.pow(2)) / n).sqrt()
    assert ((sample - sigma).abs() <= 5 * standard_error).all(), float(((sample - sigma).abs() / standard_error).max())
    assert ((draws.mean(0) - mean).abs() <= 5 * (variance / n).sqrt()).all()


def test_log_marginal_likelihood_equals_a_dense_laplace_evidence() -> None:
    """log Z = log p(D|theta*) + log N(theta*; 0, delta^-1 I) + (P/2) log 2 pi - 1/2 logdet(A (x) G + delta I), with the
    likelihood and theta* taken from the model directly and the logdet computed densely."""
    la, x, y = _fitted(dtype=torch.float64)
    model = la.model
    theta = torch.cat([model[2].weight.detach().flatten(), model[2].bias.detach()]).double()
    log_lik = -float(F.cross_entropy(model(x).double(), y, reduction="sum"))
    p = la.num_parameters

    def dense(delta: float) -> float:
        log_prior = float(torch.distributions.Normal(torch.zeros((), dtype=torch.float64), delta**-0.5).log_prob(theta).sum())
        return log_lik + log_prior + 0.5 * p * math.log(2 * math.pi) - 0.5 * float(torch.logdet(_dense_precision(la, delta)))

    deltas = [1e-3, 0.05, 1.0, 30.0]
    for delta in deltas:
        assert la.log_marginal_likelihood(delta) == pytest.approx(dense(delta), rel=1e-10, abs=1e-8)
    for d1, d2 in zip(deltas, deltas[1:]):
        assert la.log_marginal_likelihood(d1) - la.log_marginal_likelihood(d2) == pytest.approx(dense(d1) - dense(d2), abs=1e-8)
    la.prior_precision = 0.05
    assert la.log_marginal_likelihood() == la.log_marginal_likelihood(0.05)


def test_optimize_prior_precision_returns_the_grid_argmax() -> None:
    la, _, _ = _fitted()
    default_grid = torch.logspace(-4, 4, 81, dtype=torch.float64).tolist()
    chosen = la.optimize_prior_precision()
    scores = [la.log_marginal_likelihood(d) for d in default_grid]
    assert chosen == default_grid[max(range(81), key=scores.__getitem__)] == la.prior_precision
    assert 1e-4 < chosen < 1e4  # an interior optimum on this problem
    grid = [0.01, 0.1, 1.0, 10.0]
    best = max(range(4), key=lambda i: la.log_marginal_likelihood(grid[i]))
    assert la.optimize_prior_precision(torch.tensor(grid)) == grid[best]


def test_optimize_prior_precision_by_validation_matches_predict() -> None:
    """method="validation" picks the grid point whose Monte Carlo predictive (the draws of predict(seed=)) has the
    smallest validation NLL."""
    la, _, _ = _fitted()
    x_val, y_val = _data(25, seed=7)
    grid = [1e-3, 0.01, 0.1, 1.0, 10.0, 100.0]

    def nll(delta: float) -> float:
        la.prior_precision = delta
        log_probs = torch.log_softmax(predict(la, x_val, samples=16, seed=3).double(), -1)
        picked = log_probs.gather(-1, y_val.expand(16, -1).unsqueeze(-1)).squeeze(-1)
        return -float((torch.logsumexp(picked, 0) - math.log(16)).mean())

    expected = grid[min(range(len(grid)), key=lambda i: nll(grid[i]))]
    assert la.optimize_prior_precision(grid, method="validation", x_val=x_val, y_val=y_val, samples=16, seed=3) == expected


def test_predict_path_shapes_map_and_reproducibility() -> None:
    la, x, _ = _fitted()
    la.eval()
    logits = predict(la, x, samples=32)
    assert logits.shape == (32, len(x), CLASSES) and logits.dtype == torch.float32
    assert torch.equal(la(x), la.model(x))
    torch.testing.assert_close(predict(la, x, samples=8, seed=5), predict(la, x, samples=8, seed=5), rtol=0, atol=0)
    assert not torch.equal(predict(la, x, samples=8, seed=5), predict(la, x, samples=8, seed=6))
    summary = classification_summary(logits)
    torch.testing.assert_close(summary.probs.sum(-1), torch.ones(len(x)))
    assert (summary.mutual_information > 0).all()
    # the draws are the sampled last layers applied to the features: f_s = W~_s phi~ (same global RNG stream)
    torch.manual_seed(11)
    weights = la.sample_parameters(8)
    torch.manual_seed(11)
    draws = la.predictive_draws(x, 8)
    expected = torch.einsum("nd,scd->snc", _features(la.model, x), weights)
    torch.testing.assert_close(draws.double(), expected, rtol=1e-5, atol=1e-5)


def test_nested_model_and_repr() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(INPUTS, HIDDEN), nn.ReLU())
            self.head = nn.Linear(HIDDEN, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(x))

    x, y = _data(10)
    la = LastLayerLaplace(Net()).fit([(x, y)])
    assert la.layer_name == "head" and "fitted on N=10" in repr(la)
    assert predict(la, x, samples=3).shape == (3, 10, CLASSES)


def _softmax_model() -> nn.Module:
    return nn.Sequential(nn.Linear(INPUTS, CLASSES), nn.LogSoftmax(-1))


def _big_model() -> LastLayerLaplace:
    x = torch.randn(4, 200)
    return LastLayerLaplace(nn.Sequential(nn.Linear(200, 50))).fit([(x, torch.zeros(4, dtype=torch.long))])


_x, _y = _data(6)

CASES = [
    BadInput("no-linear", lambda: LastLayerLaplace(nn.Sequential(nn.Tanh())), ValueError, "no nn.Linear"),
    BadInput("not-a-module", lambda: LastLayerLaplace(lambda x: x), TypeError, "must be an nn.Module"),  # type: ignore[arg-type]
    BadInput("softmax-after-last-linear", lambda: LastLayerLaplace(_softmax_model()).fit([(_x, _y)]), ValueError,
             r"not the output of the last nn.Linear \('0', 3 -> 4\).*no softmax"),
    BadInput("prior-zero", lambda: LastLayerLaplace(_model(), 0.0), ValueError, "prior_precision must be a finite number > 0"),
    BadInput("prior-negative", lambda: LastLayerLaplace(_model(), -1.0), ValueError, "prior_precision must be a finite"),
    BadInput("prior-nan", lambda: LastLayerLaplace(_model(), float("nan")), ValueError, "prior_precision must be a finite"),
    BadInput("prior-inf", lambda: LastLayerLaplace(_model(), float("inf")), ValueError, "prior_precision must be a finite"),
    BadInput("prior-bool", lambda: LastLayerLaplace(_model(), True), ValueError, "prior_precision must be a finite"),
    BadInput("prior-set-zero", lambda: setattr(_fitted()[0], "prior_precision", 0.0), ValueError, "prior_precision must be"),
    BadInput("marglik-zero", lambda: _fitted()[0].log_marginal_likelihood(0.0), ValueError, "prior_precision must be"),
    BadInput("unfitted-draws", lambda: LastLayerLaplace(_model()).predictive_draws(_x, 2), RuntimeError, r"not fitted.*\.fit"),
    BadInput("unfitted-marglik", lambda: LastLayerLaplace(_model()).log_marginal_likelihood(), RuntimeError, "not fitted"),
    BadInput("unfitted-covariance", lambda: LastLayerLaplace(_model()).posterior_covariance(), RuntimeError, "not fitted"),
    BadInput("unfitted-optimize", lambda: LastLayerLaplace(_model()).optimize_prior_precision(), RuntimeError, "not fitted"),
    BadInput("empty-loader", lambda: LastLayerLaplace(_model()).fit([]), ValueError, "no examples"),
    BadInput("float-labels", lambda: LastLayerLaplace(_model()).fit([(_x, _y.float())]), ValueError, "y must be an integer"),
    BadInput("bool-labels", lambda: LastLayerLaplace(_model()).fit([(_x, _y > 1)]), ValueError, "labels y must be an integer"),
    BadInput("label-out-of-range", lambda: LastLayerLaplace(_model()).fit([(_x, _y + 4)]), ValueError, r"y must lie in \[0, 4\)"),
    BadInput("label-wrong-shape", lambda: LastLayerLaplace(_model()).fit([(_x, _y[:3])]), ValueError, r"y must have shape \[N\]"),
    BadInput("loader-not-pairs", lambda: LastLayerLaplace(_model()).fit([_x]), ValueError, r"loader must yield \(x, y\)"),
    BadInput("grid-empty", lambda: _fitted()[0].optimize_prior_precision([]), ValueError, "grid must contain"),
    BadInput("grid-negative", lambda: _fitted()[0].optimize_prior_precision([1.0, -1.0]), ValueError, "every grid value must be"),
    BadInput("bad-method", lambda: _fitted()[0].optimize_prior_precision(method="cv"), ValueError, "method must"),  # type: ignore
    BadInput("validation-no-data", lambda: _fitted()[0].optimize_prior_precision(method="validation"), ValueError, "needs x_val"),
    BadInput("samples-zero", lambda: _fitted()[0].predictive_draws(_x, 0), ValueError, "samples must be a positive integer"),
    BadInput("covariance-too-large", lambda: _big_model().posterior_covariance(), ValueError, "max_dense_parameters = 5000"),
    BadInput("variance-of-large-layer-works", lambda: _big_model().posterior_variance(),
             expect=lambda v: (v.shape == (50, 201) and bool((v > 0).all())) or pytest.fail(f"bad variance {v.shape}")),
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_inputs(case: BadInput) -> None:
    check(case)
