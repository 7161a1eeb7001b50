"""Bad inputs a third audit (issue 61) fed the metrics, the likelihoods and the last-layer Laplace: half-precision
outputs summed in their own dtype, NaN passed through as a NaN metric, logits taken for probabilities, int32 labels,
string hyperparameters. Each test feeds one and asserts the clear error or the float64 value."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from bad_input_table import BadInput, check, params
from torch import nn

from varbnn import metrics
from varbnn.laplace import LastLayerLaplace
from varbnn.likelihoods import Categorical, GammaPrecisionGaussian, Gaussian, HeteroscedasticGaussian

LOW = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}  # u: |round(p) - p| <= u |p|


def _classification(n: int = 4096, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 probabilities (every entry >= 1e-4, so half precision holds it as a normal number) and labels drawn
    from them."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(1.5 * torch.randn(n, classes, generator=g, dtype=torch.float64), -1)
    probs = (probs + 1e-3) / (1 + classes * 1e-3)
    return probs, torch.multinomial(probs, 1, generator=g).squeeze(1)


# ---------------------------------------------------------------- float64 oracles (NumPy, written from the formulas)
def _ece_oracle(p: np.ndarray, y: np.ndarray, n_bins: int = 15) -> float:
    confidence, predicted = p.max(1), p.argmax(1)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    total = 0.0
    for b in range(n_bins):
        low, high = edges[b], edges[b + 1]
        inside = (confidence > low) & (confidence <= high) if b else (confidence <= high)
        if inside.any():
            total += inside.sum() / len(y) * abs((predicted[inside] == y[inside]).mean() - confidence[inside].mean())
    return float(total)


def _oracles(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    onehot = np.eye(p.shape[1])[y]
    return {
        "accuracy": float((p.argmax(1) == y).mean()),
        "nll": float(-np.log(p[np.arange(len(y)), y]).mean()),
        "brier": float(((p - onehot) ** 2).sum(1).mean()),
        "ece": _ece_oracle(p, y),
    }


def _ours(p: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {
        "accuracy": metrics.accuracy(p, y),
        "nll": metrics.negative_log_likelihood(p, y),
        "brier": metrics.brier_score(p, y),
        "ece": metrics.expected_calibration_error(p, y),
    }


@pytest.mark.parametrize("dtype", LOW)
def test_classification_metrics_of_half_precision_probs_are_their_float64_values(dtype):
    p64, y = _classification()
    low = p64.to(dtype)
    exact = _oracles(low.double().numpy(), y.numpy())  # the float64 value of the numbers given
    ours = _ours(low, y)
    for name, value in exact.items():  # accumulated in float64: equal up to float64 round-off
        assert ours[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    # and against the unrounded probabilities, within what rounding the inputs moves the smooth metrics:
    # |d log p| <= u / (1 - u); |d Brier| <= sum_c 2 |p_c - 1[y = c]| u p_c + O(u^2) <= 4u
    u = UNIT_ROUNDOFF[dtype]
    unrounded = _oracles(p64.numpy(), y.numpy())
    assert ours["nll"] == pytest.approx(unrounded["nll"], abs=1.01 * u)
    assert ours["brier"] == pytest.approx(unrounded["brier"], abs=4.01 * u)


@pytest.mark.parametrize("dtype", LOW)
def test_calibration_bins_count_past_2048_in_half_precision(dtype):
    p64, y = _classification()
    bins = metrics.calibration_bins(p64.to(dtype), y, n_bins=1)  # one bin: every example in it
    assert bins.counts.dtype == torch.float64 and bins.counts.tolist() == [len(y)]
    confidence = p64.to(dtype).double().max(1).values
    assert float(bins.confidence[0]) == pytest.approx(float(confidence.mean()), rel=1e-12)


@pytest.mark.parametrize("dtype", LOW)
def test_auroc_and_referral_curve_of_half_precision_inputs(dtype):
    p64, _ = _classification(512, 2)
    y = (torch.rand(512, generator=torch.Generator().manual_seed(1), dtype=torch.float64) < p64[:, 1]).long()
    low = p64.to(dtype)
    from sklearn.metrics import roc_auc_score

    assert metrics.auroc(low[:, 1], y) == pytest.approx(roc_auc_score(y.numpy(), low[:, 1].double().numpy()), abs=1e-12)
    uncertainty = -low.max(1).values
    rows = metrics.referral_curve(low, y, uncertainty, fractions=[0.0, 0.5], with_auroc=True)
    order = torch.argsort(uncertainty.double(), stable=True)
    for row in rows:
        kept = order[: row["retained"]]
        assert row["accuracy"] == pytest.approx(float((low[kept].argmax(1) == y[kept]).double().mean()), abs=1e-12)


@pytest.mark.parametrize("dtype", LOW)
def test_regression_metrics_of_half_precision_values_are_their_float64_values(dtype):
    g = torch.Generator().manual_seed(0)
    targets = (300 * torch.randn(4096, generator=g)).to(dtype)  # squared residuals overflow float16 (max 65504)
    predictions = torch.zeros_like(targets)
    t = targets.double()
    assert metrics.rmse(predictions, targets) == pytest.approx(float(t.square().mean().sqrt()), rel=1e-12)
    draws = torch.stack([predictions, predictions + 1])
    ll = metrics.gaussian_log_likelihood(draws, targets, 100.0)
    expected = np.mean(np.logaddexp(*(-0.5 * ((t.numpy() - m) / 100) ** 2 for m in (0.0, 1.0)))
                       - math.log(100) - 0.5 * math.log(2 * math.pi) - math.log(2))  # fmt: skip
    assert ll == pytest.approx(float(expected), rel=1e-12)


# ---------------------------------------------------------------- NaN / inf, logits, labels, shapes (item 2, 3, 7)
_p, _y = _classification(8, 3)
_logits = torch.log(_p.float())
_nan_p = _p.clone()
_nan_p[2, 1] = float("nan")
_inf_p = _p.clone()
_inf_p[0, 0] = float("inf")
_half_rows = _p.float() / 2
_nan = torch.tensor([0.0, float("nan"), 1.0])
_inf = torch.tensor([0.0, float("inf"), 1.0])
_PROB_METRICS = {
    "accuracy": metrics.accuracy,
    "negative_log_likelihood": metrics.negative_log_likelihood,
    "brier_score": metrics.brier_score,
    "expected_calibration_error": metrics.expected_calibration_error,
    "calibration_bins": metrics.calibration_bins,
    "referral_curve": lambda p, y: metrics.referral_curve(p, y, torch.rand(len(y))),
}
_LOGITS = r"probs must be probabilities in \[0, 1\].*torch.softmax.*classification_summary"

CASES = [
    *(BadInput(f"{name}-logits", lambda f=f: f(_logits, _y), ValueError, _LOGITS) for name, f in _PROB_METRICS.items()),
    *(BadInput(f"{name}-rows-not-summing-to-1", lambda f=f: f(_half_rows, _y), ValueError,
               r"probs must be probabilities whose rows sum to 1 \(within 0.001 for torch.float32\).*softmax")
      for name, f in _PROB_METRICS.items()),  # fmt: skip
    *(BadInput(f"{name}-nan-probs", lambda f=f: f(_nan_p, _y), ValueError, "probs contains NaN")
      for name, f in _PROB_METRICS.items()),  # fmt: skip
    *(BadInput(f"{name}-inf-probs", lambda f=f: f(_inf_p, _y), ValueError, "probs contains NaN or infinite values")
      for name, f in _PROB_METRICS.items()),  # fmt: skip
    *(BadInput(f"{name}-empty", lambda f=f: f(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)), ValueError,
               "probs must hold at least one example") for name, f in _PROB_METRICS.items()),  # fmt: skip
    *(BadInput(f"{name}-float-labels", lambda f=f: f(_p, _y.double()), ValueError,
               "labels must hold integer class indices") for name, f in _PROB_METRICS.items()),  # fmt: skip
    *(BadInput(f"{name}-labels-out-of-range", lambda f=f: f(_p, _y + 3), ValueError,
               r"labels must hold class indices in \[0, 3\)") for name, f in _PROB_METRICS.items()),  # fmt: skip
    *(BadInput(f"{name}-int32-labels", lambda f=f: f(_p, _y.int()), expect=lambda r, f=f: _same(r, f(_p, _y)))
      for name, f in _PROB_METRICS.items() if name != "referral_curve"),  # fmt: skip
    BadInput("float32-softmax-accepted", lambda: metrics.accuracy(torch.softmax(_logits * 7, -1), _y),
             expect=lambda r: 0 <= r <= 1 or pytest.fail(str(r))),  # fmt: skip
    BadInput("float32-row-off-by-2e-3-refused", lambda: metrics.brier_score(_off(torch.float32), _y), ValueError,
             "rows sum to 1"),
    BadInput("float16-row-off-by-2e-3-accepted", lambda: metrics.brier_score(_off(torch.float16), _y),
             expect=lambda r: r > 0 or pytest.fail(str(r))),
    BadInput("one-class", lambda: metrics.expected_calibration_error(torch.ones(5, 1), torch.zeros(5, dtype=torch.long)),
             expect=lambda r: r == 0.0 or pytest.fail(str(r))),
    BadInput("n-bins-float", lambda: metrics.expected_calibration_error(_p, _y, 2.5), ValueError, "n_bins must be an int >= 1"),
    BadInput("n-bins-bool", lambda: metrics.calibration_bins(_p, _y, True), ValueError, "n_bins must be an int >= 1"),
    BadInput("referral-nan-uncertainty", lambda: metrics.referral_curve(_p, _y, torch.full((8,), float("nan"))),
             ValueError, "uncertainty contains NaN"),
    BadInput("referral-fraction-string", lambda: metrics.referral_curve(_p, _y, torch.rand(8), fractions=["0.5"]),
             ValueError, r"fractions must be a finite number in \[0, 1\)"),
    BadInput("referral-with-auroc-string", lambda: metrics.referral_curve(_p[:, :2] / _p[:, :2].sum(1, keepdim=True),
             _y.clamp(max=1), torch.rand(8), with_auroc="yes"), ValueError, "with_auroc must be True or False"),  # type: ignore[arg-type]
    BadInput("auroc-nan-scores", lambda: metrics.auroc(_nan, torch.tensor([0, 1, 1])), ValueError, "scores contains NaN"),
    BadInput("auroc-label-2", lambda: metrics.auroc(torch.rand(3), torch.tensor([0, 2, 1])), ValueError,
             "labels must hold binary labels 0 or 1"),
    BadInput("auroc-float-and-bool-labels", lambda: (metrics.auroc(torch.tensor([0.1, 0.9]), torch.tensor([0.0, 1.0])),
             metrics.auroc(torch.tensor([0.1, 0.9]), torch.tensor([False, True]))),
             expect=lambda r: r == (1.0, 1.0) or pytest.fail(str(r))),  # fmt: skip
    BadInput("rmse-nan-predictions", lambda: metrics.rmse(_nan, torch.zeros(3)), ValueError, "predictions contains NaN"),
    BadInput("rmse-nan-targets", lambda: metrics.rmse(torch.zeros(3), _nan), ValueError, "targets contains NaN"),
    BadInput("rmse-inf-targets", lambda: metrics.rmse(torch.zeros(3), _inf), ValueError, "targets contains NaN or inf"),
    BadInput("rmse-empty", lambda: metrics.rmse(torch.zeros(0), torch.zeros(0)), ValueError, "at least one value"),
    BadInput("rmse-n-against-n-1", lambda: metrics.rmse(torch.zeros(3), torch.zeros(3, 1)), ValueError,
             r"differ in shape.*reshape"),
    BadInput("rmse-integer-targets", lambda: metrics.rmse(torch.tensor([1, 2]), torch.tensor([0, 0])),
             expect=lambda r: r == pytest.approx(math.sqrt(2.5)) or pytest.fail(str(r))),
    BadInput("gll-nan-means", lambda: metrics.gaussian_log_likelihood(_nan.expand(2, 3), torch.zeros(3), 1.0), ValueError,
             "sample_means contains NaN"),
    BadInput("gll-nan-targets", lambda: metrics.gaussian_log_likelihood(torch.zeros(2, 3), _nan, 1.0), ValueError,
             "targets contains NaN"),
    BadInput("gll-no-samples", lambda: metrics.gaussian_log_likelihood(torch.zeros(0, 3), torch.zeros(3), 1.0), ValueError,
             r"at least one sample \(S >= 1\)"),
    BadInput("gll-noise-string", lambda: metrics.gaussian_log_likelihood(torch.zeros(2, 3), torch.zeros(3), "1"),
             ValueError, "noise_std must be a finite number"),  # type: ignore[arg-type]
    BadInput("gll-noise-nan-tensor", lambda: metrics.gaussian_log_likelihood(torch.zeros(2, 3), torch.zeros(3),
             torch.tensor(float("nan"))), ValueError, "noise_std contains NaN"),  # fmt: skip
    BadInput("gaussian-metrics-nan-outputs", lambda: Gaussian(1.0).metrics(_nan.expand(2, 3), torch.zeros(3)), ValueError,
             "Gaussian: outputs contains NaN"),
    BadInput("gaussian-metrics-nan-target", lambda: Gaussian(1.0).metrics(torch.zeros(2, 3), _nan), ValueError,
             "Gaussian: target contains NaN"),
    BadInput("hetero-metrics-inf-outputs", lambda: HeteroscedasticGaussian().metrics(torch.full((2, 3, 2), float("inf")),
             torch.zeros(3)), ValueError, "HeteroscedasticGaussian: outputs contains NaN or infinite"),  # fmt: skip
    BadInput("gamma-metrics-nan-target", lambda: GammaPrecisionGaussian().metrics(torch.zeros(2, 3), _nan), ValueError,
             "GammaPrecisionGaussian: target contains NaN"),
    BadInput("gaussian-metrics-no-draws", lambda: Gaussian(1.0).metrics(torch.zeros(0, 3), torch.zeros(3)), ValueError,
             r"samples >= 1"),
    BadInput("gaussian-metrics-integer-targets", lambda: Gaussian(1.0).metrics(torch.zeros(2, 3), torch.tensor([1, 2, 3])),
             expect=lambda r: r["rmse"] == pytest.approx(math.sqrt(14 / 3)) or pytest.fail(str(r))),
    BadInput("categorical-metrics-int32", lambda: Categorical().metrics(_logits.expand(2, 8, 3), _y.int()),
             expect=lambda r: r == Categorical().metrics(_logits.expand(2, 8, 3), _y) or pytest.fail(str(r))),
]


def _same(a, b) -> None:
    if isinstance(a, metrics.CalibrationBins):
        assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("edges", "counts", "confidence", "accuracy"))
    else:
        assert a == b


def _off(dtype: torch.dtype) -> torch.Tensor:
    """Probabilities whose first row sums to 1.002: beyond float32's 1e-3, within float16's 7.8e-3."""
    p = torch.full((8, 4), 0.25, dtype=dtype)
    p[0, 0] = 0.252
    return p


# ---------------------------------------------------------------- likelihood constructors (item 5)
_POSITIVE = {
    "Gaussian.noise_std": lambda v: Gaussian(noise_std=v),
    "Gaussian.init_noise_std": lambda v: Gaussian(init_noise_std=v),
    "Gaussian.init_noise_std (noise fixed)": lambda v: Gaussian(1.0, init_noise_std=v),
    "HeteroscedasticGaussian.min_variance": lambda v: HeteroscedasticGaussian(min_variance=v),
    "GammaPrecisionGaussian.prior_shape": lambda v: GammaPrecisionGaussian(prior_shape=v),
    "GammaPrecisionGaussian.prior_rate": lambda v: GammaPrecisionGaussian(prior_rate=v),
    "GammaPrecisionGaussian.init_shape": lambda v: GammaPrecisionGaussian(init_shape=v),
    "GammaPrecisionGaussian.init_rate": lambda v: GammaPrecisionGaussian(init_rate=v),
}
_BAD_POSITIVE = {"string": "6", "bool": True, "nan": float("nan"), "inf": float("inf"), "zero": 0.0, "negative": -1.0,
                 "list": [1.0]}  # fmt: skip
_gamma = GammaPrecisionGaussian()

CASES += [
    BadInput(f"{where}-{kind}", lambda make=make, v=v: make(v), ValueError,
             rf"{where.split('.')[0]}: {where.split('.')[1].split(' ')[0]} must be a finite number > 0")
    for where, make in _POSITIVE.items() for kind, v in _BAD_POSITIVE.items()
]  # fmt: skip
def _same_as_float(made: tuple[object, object], make: Callable[[object], torch.nn.Module]) -> None:
    """Both modules (from a NumPy scalar and a 0-d tensor) equal the one built from the Python float 2.0."""
    reference = make(2.0)
    for module in made:
        assert isinstance(module, torch.nn.Module)
        assert repr(module) == repr(reference)
        state, expected = module.state_dict(), reference.state_dict()
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[k], expected[k]) or (state[k].isnan().all() and expected[k].isnan().all())
                   for k in state)  # (an unset running statistic is NaN in both)


CASES += [
    BadInput(f"{where}-numpy-and-0d-tensor", lambda make=make: (make(np.float32(2.0)), make(torch.tensor(2.0))),
             expect=lambda r, make=make: _same_as_float(r, make)) for where, make in _POSITIVE.items()
]  # fmt: skip
CASES += [
    BadInput("gamma-string-prior-shape-named", lambda: GammaPrecisionGaussian(prior_shape="6"), TypeError,
             r"GammaPrecisionGaussian: prior_shape must be a finite number > 0, got str \('6'\)"),
    BadInput("gamma-init-shape-from-prior", lambda: float(GammaPrecisionGaussian(prior_shape=3.0).shape),
             expect=lambda r: r == pytest.approx(3.0) or pytest.fail(str(r))),
    BadInput("observe-decay-string", lambda: _gamma.observe(torch.zeros(3), torch.zeros(3), "0.5"), ValueError,
             r"decay must be a finite number in \[0, 1\)"),  # type: ignore[arg-type]
    BadInput("observe-decay-nan", lambda: _gamma.observe(torch.zeros(3), torch.zeros(3), float("nan")), ValueError,
             r"decay must be a finite number in \[0, 1\)"),
    BadInput("observe-decay-one", lambda: _gamma.observe(torch.zeros(3), torch.zeros(3), 1.0), ValueError,
             r"decay must be a finite number in \[0, 1\)"),
    BadInput("observe-empty", lambda: _gamma.observe(torch.zeros(0), torch.zeros(0), 0.5), ValueError,
             "at least one value"),
    BadInput("optimal-posterior-numpy-n", lambda: float(_gamma.optimal_posterior(0.0, np.int64(4))[0]),
             expect=lambda r: r == pytest.approx(8.0) or pytest.fail(str(r))),
    BadInput("optimal-posterior-bool-n", lambda: _gamma.optimal_posterior(0.0, True), ValueError,
             r"n \(the number of training points\) must be an int >= 1"),
]


# ---------------------------------------------------------------- Laplace labels (item 4)
def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4))


_lx = torch.randn(24, 3, generator=torch.Generator().manual_seed(2))
_ly = torch.arange(24) % 4


def _validation(y_val: torch.Tensor, x_val: torch.Tensor = _lx) -> float:
    la = LastLayerLaplace(_net()).fit([(_lx, _ly)])
    return la.optimize_prior_precision([0.1, 1.0, 10.0], method="validation", x_val=x_val, y_val=y_val, samples=4)


def _fit_with(labels: torch.Tensor) -> tuple[float, float]:
    la = LastLayerLaplace(_net()).fit([(_lx[:12], labels[:12]), (_lx[12:], labels[12:])])
    return la.log_likelihood, la.log_marginal_likelihood()


CASES += [
    *(BadInput(f"laplace-fit-{dtype}-labels", lambda dtype=dtype: _fit_with(_ly.to(dtype)),
               expect=lambda r: r == pytest.approx(_fit_with(_ly), rel=1e-12) or pytest.fail(str(r)))
      for dtype in (torch.int32, torch.int16, torch.int8, torch.uint8)),  # fmt: skip
    BadInput("laplace-validation-int32-labels", lambda: _validation(_ly.int()),
             expect=lambda r: r == _validation(_ly) or pytest.fail(str(r))),
    BadInput("laplace-validation-label-too-large", lambda: _validation(_ly + 1), ValueError,
             r"y_val must hold class indices in \[0, 4\), got values from 1 to 4"),
    BadInput("laplace-validation-label-negative", lambda: _validation(_ly - 1), ValueError,
             r"y_val must hold class indices in \[0, 4\)"),
    BadInput("laplace-validation-float-labels", lambda: _validation(_ly.float()), ValueError,
             "y_val must be an integer tensor"),
    BadInput("laplace-validation-empty", lambda: _validation(_ly[:0], _lx[:0]), ValueError,
             "x_val must hold at least one example"),
    BadInput("laplace-fit-label-out-of-range", lambda: _fit_with(_ly + 1), ValueError, r"y must lie in \[0, 4\)"),
    BadInput("laplace-prior-string", lambda: LastLayerLaplace(_net(), "1"), ValueError,
             "prior_precision must be a finite number > 0"),  # type: ignore[arg-type]
    BadInput("laplace-prior-0d-tensor", lambda: LastLayerLaplace(_net(), torch.tensor(2.0)).prior_precision,
             expect=lambda r: r == 2.0 or pytest.fail(str(r))),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_inputs(case: BadInput) -> None:
    check(case)


# ---------------------------------------------------------------- low precision in likelihoods and Laplace (item 6)
def _regression_case(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    target = (300 * torch.randn(64, generator=g)).to(dtype)  # residuals^2 above float16's 65504
    return torch.zeros(64, 1, dtype=dtype), target


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize(
    "make", [lambda: Gaussian(10.0), lambda: GammaPrecisionGaussian(init_rate=600.0)], ids=["Gaussian", "GammaPrecision"]
)
def test_regression_log_probs_of_half_precision_outputs_are_float32_values(dtype, make):
    lik = make()
    output, target = _regression_case(dtype)
    expected = lik.log_prob(output.float(), target.float())
    got = lik.log_prob(output, target)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(lik.nll(output, target), lik.nll(output.float(), target.float()))
    draws = torch.stack([output, output + 1])
    ours, reference = lik.metrics(draws, target), lik.metrics(draws.float(), target.float())
    assert ours == pytest.approx(reference, rel=1e-6)


@pytest.mark.parametrize("dtype", LOW)
def test_heteroscedastic_log_variance_above_11_in_half_precision(dtype):
    lik = HeteroscedasticGaussian()
    output = torch.tensor([[0.0, 12.0]] * 4, dtype=dtype)  # exp(12) = 162755 overflows float16
    target = torch.ones(4, dtype=dtype)
    torch.testing.assert_close(lik.log_prob(output, target), lik.log_prob(output.float(), target.float()))
    summary = lik.summary(output.unsqueeze(0))
    assert torch.isfinite(summary.aleatoric_variance).all()


@pytest.mark.parametrize("dtype", LOW)
def test_categorical_log_prob_of_half_precision_logits_is_float32(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(256, 10, generator=g)).to(dtype)
    target = torch.randint(0, 10, (256,), generator=g, dtype=torch.int32)
    got = Categorical().nll(logits, target)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, Categorical().nll(logits.float(), target.long()))


def test_gamma_observe_of_half_precision_residuals_above_256():
    lik = GammaPrecisionGaussian()
    lik.observe(torch.full((8,), 300.0, dtype=torch.float16), torch.zeros(8, dtype=torch.float16), decay=0.5)
    assert float(lik.mean_square) == pytest.approx(90000.0)


def _wide_posterior_laplace() -> tuple[LastLayerLaplace, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4)).half()
    x = (30 * torch.randn(16, 3)).half()
    y = torch.arange(16) % 4
    return LastLayerLaplace(net).fit([(x, y)]), x, y


def test_laplace_draws_of_a_float16_model_do_not_overflow():
    la, x, _ = _wide_posterior_laplace()
    la.prior_precision = 1e-12  # draws of about 1e6, beyond float16's 65504
    draws = la.predictive_draws(x, 4)
    assert draws.dtype == torch.float32 and bool(torch.isfinite(draws).all())


def test_laplace_validation_of_a_float16_model_scores_in_float64():
    la, x, y = _wide_posterior_laplace()
    # at 1e-12 the float16 draws overflowed to inf, the score was NaN and the NaN grid point won
    assert la.optimize_prior_precision([1e-12, 1.0], method="validation", x_val=x, y_val=y, samples=4) == 1.0


@pytest.mark.parametrize("dtype", LOW)
def test_laplace_fit_of_a_half_precision_model_matches_float64(dtype):
    net = _net()
    low = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4))
    low.load_state_dict(net.state_dict())
    low.to(dtype)
    reference = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4))
    reference.load_state_dict(low.state_dict())
    reference.double()
    ours = LastLayerLaplace(low).fit([(_lx.to(dtype), _ly.int())])
    exact = LastLayerLaplace(reference).fit([(_lx.to(dtype).double(), _ly)])
    # the forward pass in half precision rounds the features by u per layer: a relative error of a few u
    u = UNIT_ROUNDOFF[dtype]
    assert ours.log_marginal_likelihood() == pytest.approx(exact.log_marginal_likelihood(), rel=20 * u)
