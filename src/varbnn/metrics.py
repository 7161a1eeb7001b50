"""Evaluation metrics, torch-native (CPU or GPU), checked against scikit-learn in the tests.

Classification metrics take class probabilities ``probs`` of shape ``[N, C]`` (e.g. the Monte Carlo mean
from :func:`varbnn.predict.classification_summary`) and integer labels ``[N]`` (any integer dtype) in ``[0, C)``;
every metric returns a Python float. Regression metrics take predictions and targets of the same shape.

Every metric is accumulated in float64 whatever the input's dtype (float16 and bfloat16 outputs included), so the
result is the float64 value of the given numbers. Bad input raises a ``ValueError`` naming the argument: no
examples, NaN or infinite values, labels outside ``[0, C)``, and "probabilities" that are not: values outside
``[0, 1]`` or rows that do not sum to 1 (within ``max(1e-3, 8 eps)`` of the dtype: 1e-3
for float32 and float64, 7.8e-3 for float16, 0.0625 for bfloat16), which is what logits
passed by mistake look like (apply ``softmax``, or use :func:`varbnn.predict.classification_summary`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from varbnn._checks import ArgumentTypeError, as_bool, as_float_in, as_int, check_class_labels

__all__ = [
    "mean_and_standard_error",
    "accuracy",
    "negative_log_likelihood",
    "expected_calibration_error",
    "calibration_bins",
    "CalibrationBins",
    "brier_score",
    "auroc",
    "referral_curve",
    "rmse",
    "gaussian_log_likelihood",
]


def _probability_tolerance(dtype: torch.dtype) -> float:
    """How far probabilities of ``dtype`` may stray outside ``[0, 1]`` and their rows' sums from 1 before the metrics
    refuse them: ``max(1e-3, 8 eps)``, i.e. 1e-3 for float32 and float64, 7.8e-3 for float16 and 0.0625 for bfloat16
    (a softmax rounded to the dtype, then averaged over draws, is off by a few ``eps`` at most)."""
    return max(1e-3, 8 * torch.finfo(dtype).eps)


def _check_finite(values: torch.Tensor, name: str) -> None:
    if values.is_complex():
        raise ValueError(f"{name} must be real, got dtype {values.dtype}")
    if (values.is_floating_point()) and not bool(torch.isfinite(values).all()):
        bad = "NaN" if bool(values.isnan().any()) else "infinite"
        raise ValueError(f"{name} contains NaN or infinite values ({bad} found); metrics need finite {name}")


def _check_probabilities(probs: torch.Tensor, name: str = "probs") -> None:
    """Refuse ``probs`` [N, C] that are not probabilities (logits, log-probabilities): values outside [0, 1] or rows
    that do not sum to 1, beyond :func:`_probability_tolerance`."""
    if not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of probabilities, got dtype {probs.dtype}")
    _check_finite(probs, name)
    tolerance = _probability_tolerance(probs.dtype)
    wide = probs.double()
    low, high = float(wide.min()), float(wide.max())
    hint = ("logits or log-probabilities? apply torch.softmax(logits, -1), or pass the Monte Carlo mean "
            "varbnn.predict.classification_summary(logits).probs")  # fmt: skip
    if low < -tolerance or high > 1 + tolerance:
        raise ValueError(f"{name} must be probabilities in [0, 1], got values from {low:.4g} to {high:.4g} ({hint})")
    sums = wide.sum(-1)
    worst = int((sums - 1).abs().argmax())
    if abs(float(sums[worst]) - 1) > tolerance:
        raise ValueError(
            f"{name} must be probabilities whose rows sum to 1 (within {tolerance:.3g} for {probs.dtype}), got a row "
            f"summing to {float(sums[worst]):.6g} (row {worst}; {hint})"
        )


def _check_probs(probs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Check ``probs [N, C]`` and ``labels [N]``; return them as float64 and int64 on ``probs``' device."""
    if not isinstance(probs, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError(f"probs and labels must be tensors, got {type(probs).__name__} and {type(labels).__name__}")
    if probs.dim() != 2:
        raise ValueError(f"probs must have shape [N, classes], got {tuple(probs.shape)}")
    if probs.shape[0] == 0 or probs.shape[1] == 0:
        raise ValueError(f"probs must hold at least one example and one class, got shape {tuple(probs.shape)}")
    if labels.shape != probs.shape[:1]:
        raise ValueError(f"labels must have shape [{probs.shape[0]}], got {tuple(labels.shape)}")
    _check_probabilities(probs)
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must hold integer class indices (any integer dtype), got dtype {labels.dtype}")
    check_class_labels(labels, probs.shape[1], "labels")
    return probs.double(), labels.to(device=probs.device, dtype=torch.long)


def _tiny(dtype: torch.dtype) -> float:
    """The clamp of :func:`negative_log_likelihood`: the dtype's smallest normal number, float32's for half
    precision (whose subnormal probabilities, down to 6e-8, are read as they are)."""
    return torch.finfo(dtype if torch.finfo(dtype).bits > 16 else torch.float32).tiny


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of examples whose most probable class is the label: ``mean_n 1[argmax_c p_nc = y_n]``."""
    wide, labels = _check_probs(probs, labels)
    return float((wide.argmax(-1) == labels).double().mean())


def negative_log_likelihood(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean ``-log p_{n, y_n}`` over the examples, in nats (probabilities clamped at the dtype's smallest normal
    number; float32's for float16 / bfloat16 inputs, whose subnormal probabilities are read as they are). With the
    Monte Carlo mean probabilities this is the predictive NLL ``-mean_n log (1/S) sum_s p_s(y_n)``."""
    wide, labels = _check_probs(probs, labels)
    picked = wide.gather(1, labels.unsqueeze(1)).squeeze(1)
    return float(-torch.log(picked.clamp_min(_tiny(probs.dtype))).mean())


def brier_score(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Brier score, ``mean_n sum_c (p_nc - 1[y_n = c])^2`` (Brier 1950; scikit-learn's multiclass form, in [0, 2])."""
    wide, labels = _check_probs(probs, labels)
    onehot = torch.nn.functional.one_hot(labels, probs.shape[1]).to(wide.dtype)
    return float(((wide - onehot) ** 2).sum(-1).mean())


@dataclass(frozen=True)
class CalibrationBins:
    """Equal-width confidence bins: edges, and per bin the count, mean confidence and accuracy (all float64).

    :ivar edges: ``[n_bins + 1]`` bin edges from 0 to 1.
    :ivar counts: ``[n_bins]`` examples per bin.
    :ivar confidence: ``[n_bins]`` mean top-class probability of the bin's examples (0 for an empty bin).
    :ivar accuracy: ``[n_bins]`` fraction of the bin's examples classified correctly (0 for an empty bin).
    """

    edges: torch.Tensor
    counts: torch.Tensor
    confidence: torch.Tensor
    accuracy: torch.Tensor


def calibration_bins(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> CalibrationBins:
    """Bin examples by top-class confidence ``max_c p_nc`` into ``n_bins`` equal-width bins of (0, 1] (right-closed;
    default 15), as a :class:`CalibrationBins` (the data of a reliability diagram), counted and summed in float64."""
    wide, labels = _check_probs(probs, labels)
    n_bins = as_int(n_bins, "n_bins", low=1)
    confidence, predicted = wide.max(-1)
    correct = (predicted == labels).to(wide.dtype)
    edges = torch.linspace(0, 1, n_bins + 1, dtype=wide.dtype, device=wide.device)
    index = (torch.bucketize(confidence, edges, right=False) - 1).clamp(0, n_bins - 1)
    counts = torch.zeros(n_bins, dtype=wide.dtype, device=wide.device).index_add_(0, index, torch.ones_like(confidence))
    conf_sum = torch.zeros_like(counts).index_add_(0, index, confidence)
    acc_sum = torch.zeros_like(counts).index_add_(0, index, correct)
    safe = counts.clamp_min(1)
    return CalibrationBins(edges, counts, conf_sum / safe, acc_sum / safe)


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error ``ECE = sum_b (n_b / N) |accuracy_b - confidence_b|`` over ``n_bins`` equal-width
    confidence bins (default 15; Guo et al. 2017), from :func:`calibration_bins`. In [0, 1]; 0 is calibrated."""
    bins = calibration_bins(probs, labels, n_bins)
    weights = bins.counts / bins.counts.sum()
    return float((weights * (bins.accuracy - bins.confidence).abs()).sum())


def _check_binary_labels(labels: torch.Tensor, name: str = "labels") -> torch.Tensor:
    """``labels`` as a bool tensor (1 = positive); only 0 and 1 (or False / True) are allowed."""
    if labels.is_complex():
        raise ValueError(f"{name} must hold binary labels 0 or 1, got dtype {labels.dtype}")
    if labels.dtype != torch.bool:
        _check_finite(labels, name)
        if labels.numel() and not bool(((labels == 0) | (labels == 1)).all()):
            others = torch.unique(labels[(labels != 0) & (labels != 1)])[:3].tolist()
            raise ValueError(f"{name} must hold binary labels 0 or 1 (1 = positive), got other values such as {others}")
    return labels.bool()


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (1 = positive), ties counted as 1/2.

    Computed as the Mann-Whitney statistic from average ranks R: ``AUROC = (sum_{positives} R_n - n_+ (n_+ + 1) / 2) /
    (n_+ n_-)``, the probability that a random positive scores above a random negative, in float64. Needs both
    classes present; ``scores`` must be finite (any real numbers, e.g. probabilities or entropies) and ``labels`` 0 or
    1 (any dtype, bool included).
    (The retina experiments' metric, Farquhar et al. 2020 section 3.2.)
    """
    scores, labels = scores.reshape(-1), labels.reshape(-1)
    if scores.shape != labels.shape:
        raise ValueError(f"scores and labels must have the same number of elements, got {scores.numel()} and {labels.numel()}")
    _check_finite(scores, "scores")
    scores = scores.double()
    positive = _check_binary_labels(labels).to(scores.device)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("auroc needs at least one positive and one negative label")
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, scores.numel() + 1, dtype=scores.dtype, device=scores.device)
    # average the ranks of tied scores
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    rank_sum = torch.zeros(counts.shape, dtype=scores.dtype, device=scores.device).index_add_(0, inverse, ranks[order])
    ranks[order] = (rank_sum / counts)[inverse]
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def referral_curve(
    probs: torch.Tensor,
    labels: torch.Tensor,
    uncertainty: torch.Tensor,
    fractions: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    with_auroc: bool = False,
) -> list[dict[str, float]]:
    """Accuracy on the examples kept after referring the most uncertain ``fraction`` to an expert (the referral
    curves of Leibig et al. 2017 and Farquhar et al. 2020, figure 7).

    ``uncertainty`` is ``[N]``, finite (e.g. the predictive entropy or the mutual information of
    :class:`~varbnn.predict.ClassificationSummary`); the ``floor(f N)`` most uncertain examples are referred and the
    accuracy is taken over the rest (at least one; of tied uncertainties the later examples are referred first).
    ``fractions`` lie in [0, 1).
    Returns one row per fraction: ``{"referred": f, "retained": n_kept, "accuracy": acc_on_kept}``; with
    ``with_auroc`` (two classes) also ``"auroc"``, the :func:`auroc` of ``probs[:, 1]`` on the kept examples (NaN when
    only one class is left), the metric of Farquhar et al.'s referral figure.
    """
    wide, labels = _check_probs(probs, labels)
    with_auroc = as_bool(with_auroc, "with_auroc")
    if with_auroc and probs.shape[-1] != 2:
        raise ValueError(f"with_auroc needs two classes (probs of shape [N, 2]), got {tuple(probs.shape)}")
    if not isinstance(uncertainty, torch.Tensor) or uncertainty.shape != labels.shape:
        got = tuple(uncertainty.shape) if isinstance(uncertainty, torch.Tensor) else type(uncertainty).__name__
        raise ValueError(f"uncertainty must be a tensor of shape {tuple(labels.shape)}, got {got}")
    _check_finite(uncertainty, "uncertainty")
    checked = [as_float_in(f, "fractions", 0.0, 1.0, high_open=True) for f in fractions]
    order = torch.argsort(uncertainty.double().to(wide.device), stable=True)  # most certain first; ties in order
    correct = (wide.argmax(-1) == labels)[order].double()
    n = labels.numel()
    rows = []
    for fraction in checked:
        kept = max(1, n - int(math.floor(fraction * n)))
        row = {"referred": float(fraction), "retained": kept, "accuracy": float(correct[:kept].mean())}
        if with_auroc:
            chosen = order[:kept]
            try:
                row["auroc"] = auroc(wide[chosen, 1], labels[chosen])
            except ValueError:  # one class left
                row["auroc"] = float("nan")
        rows.append(row)
    return rows


def _check_regression(values: torch.Tensor, name: str) -> torch.Tensor:
    """``values`` (floating or integer) as float64, refusing non-tensors, empty tensors and NaN / inf."""
    if not isinstance(values, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a tensor, got {type(values).__name__}")
    if values.dtype == torch.bool:
        raise ValueError(f"{name} must hold real numbers, got dtype torch.bool")
    _check_finite(values, name)
    if values.numel() == 0:
        raise ValueError(f"{name} must hold at least one value, got shape {tuple(values.shape)}")
    return values.double()


def rmse(predictions: torch.Tensor, targets: torch.Tensor) -> float:
    """Root mean squared error ``sqrt(mean_n (f_n - y_n)^2)`` over all elements, in float64 (same shapes required;
    integer predictions or targets are read as numbers; NaN, inf and empty tensors are refused)."""
    if not isinstance(predictions, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise ArgumentTypeError(
            f"predictions and targets must be tensors, got {type(predictions).__name__} and {type(targets).__name__}"
        )
    if predictions.shape != targets.shape:
        raise ValueError(
            f"predictions {tuple(predictions.shape)} and targets {tuple(targets.shape)} differ in shape (e.g. [N] "
            "against [N, 1]: reshape one of them)"
        )
    wide_predictions = _check_regression(predictions, "predictions")
    wide_targets = _check_regression(targets, "targets").to(wide_predictions.device)
    return float(((wide_predictions - wide_targets) ** 2).mean().sqrt())


def gaussian_log_likelihood(sample_means: torch.Tensor, targets: torch.Tensor, noise_std: float | torch.Tensor) -> float:
    """Per-point Monte Carlo predictive log-likelihood of a Gaussian regressor (the UCI test log-likelihood of
    Hernandez-Lobato & Adams 2015 and Oh et al. 2020, section 5.1):
    ``mean_n [logsumexp_s log N(y_n | f_s(x_n), noise_std^2) - log S]``, in float64.

    ``sample_means``: ``[S, N]`` (or ``[S, *targets.shape]``), S >= 1; the logsumexp runs over the S weight
    samples, never over test points. ``noise_std`` > 0 and finite: a number or a tensor broadcastable to
    ``sample_means``. NaN, inf and empty tensors are refused.
    """
    if not isinstance(sample_means, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise ArgumentTypeError(
            f"sample_means and targets must be tensors, got {type(sample_means).__name__} and {type(targets).__name__}"
        )
    if sample_means.dim() < 1 or sample_means.shape[1:] != targets.shape:
        raise ValueError(
            f"sample_means must be [S, *targets.shape] = [S, {', '.join(map(str, targets.shape))}], "
            f"got {tuple(sample_means.shape)}"
        )
    if sample_means.shape[0] == 0:
        raise ValueError(f"sample_means must hold at least one sample (S >= 1), got shape {tuple(sample_means.shape)}")
    means = _check_regression(sample_means, "sample_means")
    wide_targets = _check_regression(targets, "targets").to(means.device)
    if isinstance(noise_std, torch.Tensor):
        _check_finite(noise_std, "noise_std")
        noise = noise_std.double().to(means.device)
        if not bool((noise > 0).all()):
            raise ValueError(f"noise_std must be > 0 (and finite), got {noise_std!r}")
    else:
        number = as_float_in(noise_std, "noise_std", 0.0, None, low_open=True)
        noise = torch.tensor(number, dtype=torch.float64, device=means.device)
    log_density = torch.distributions.Normal(means, noise).log_prob(wide_targets.unsqueeze(0))
    per_point = torch.logsumexp(log_density, dim=0) - math.log(means.shape[0])
    return float(per_point.mean())


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n)) of the non-NaN ``values``; the error is NaN for
    fewer than two values, both are NaN for none."""
    finite = [float(v) for v in values if not math.isnan(float(v))]
    if not finite:
        return float("nan"), float("nan")
    mean = sum(finite) / len(finite)
    if len(finite) < 2:
        return mean, float("nan")
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1) / len(finite))
