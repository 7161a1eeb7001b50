"""Evaluation metrics, torch-native (CPU or GPU), checked against scikit-learn in the tests.

Classification metrics take class probabilities ``probs`` of shape ``[N, C]`` (e.g. the Monte Carlo mean
from :func:`varbnn.predict.classification_summary`) and integer labels ``[N]``; every metric returns a Python
float. Regression metrics take predictions and targets of the same shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

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


def _check_probs(probs: torch.Tensor, labels: torch.Tensor) -> None:
    if probs.dim() != 2:
        raise ValueError(f"probs must have shape [N, classes], got {tuple(probs.shape)}")
    if labels.shape != probs.shape[:1]:
        raise ValueError(f"labels must have shape [{probs.shape[0]}], got {tuple(labels.shape)}")
    if not torch.isfinite(probs).all():
        raise ValueError("probs contains NaN or infinite values")


def accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of examples whose most probable class is the label: ``mean_n 1[argmax_c p_nc = y_n]``."""
    _check_probs(probs, labels)
    return float((probs.argmax(-1) == labels).float().mean())


def negative_log_likelihood(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean ``-log p_{n, y_n}`` over the examples, in nats (probabilities clamped at the dtype's smallest normal
    number). With the Monte Carlo mean probabilities this is the predictive NLL ``-mean_n log (1/S) sum_s p_s(y_n)``."""
    _check_probs(probs, labels)
    picked = probs.gather(1, labels.long().unsqueeze(1)).squeeze(1)
    return float(-torch.log(picked.clamp_min(torch.finfo(probs.dtype).tiny)).mean())


def brier_score(probs: torch.Tensor, labels: torch.Tensor) -> float:
    """Brier score, ``mean_n sum_c (p_nc - 1[y_n = c])^2`` (Brier 1950; scikit-learn's multiclass form, in [0, 2])."""
    _check_probs(probs, labels)
    onehot = torch.nn.functional.one_hot(labels.long(), probs.shape[1]).to(probs.dtype)
    return float(((probs - onehot) ** 2).sum(-1).mean())


@dataclass(frozen=True)
class CalibrationBins:
    """Equal-width confidence bins: edges, and per bin the count, mean confidence and accuracy.

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
    default 15), as a :class:`CalibrationBins` (the data of a reliability diagram)."""
    _check_probs(probs, labels)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).to(probs.dtype)
    edges = torch.linspace(0, 1, n_bins + 1, dtype=probs.dtype, device=probs.device)
    index = (torch.bucketize(confidence, edges, right=False) - 1).clamp(0, n_bins - 1)
    counts = torch.zeros(n_bins, dtype=probs.dtype, device=probs.device).index_add_(0, index, torch.ones_like(confidence))
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


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (1 = positive), ties counted as 1/2.

    Computed as the Mann-Whitney statistic from average ranks R: ``AUROC = (sum_{positives} R_n - n_+ (n_+ + 1) / 2) /
    (n_+ n_-)``, the probability that a random positive scores above a random negative. Needs both classes present.
    (The retina experiments' metric, Farquhar et al. 2020 section 3.2.)
    """
    scores, labels = scores.reshape(-1).double(), labels.reshape(-1)
    if scores.shape != labels.shape:
        raise ValueError(f"scores and labels must have the same number of elements, got {scores.numel()} and {labels.numel()}")
    positive = labels.bool()
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

    ``uncertainty`` is ``[N]`` (e.g. the predictive entropy or the mutual information of
    :class:`~varbnn.predict.ClassificationSummary`); the ``floor(f N)`` most uncertain examples are referred and the
    accuracy is taken over the rest (at least one). ``fractions`` lie in [0, 1).
    Returns one row per fraction: ``{"referred": f, "retained": n_kept, "accuracy": acc_on_kept}``; with
    ``with_auroc`` (two classes) also ``"auroc"``, the :func:`auroc` of ``probs[:, 1]`` on the kept examples (NaN when
    only one class is left), the metric of Farquhar et al.'s referral figure.
    """
    _check_probs(probs, labels)
    if with_auroc and probs.shape[-1] != 2:
        raise ValueError(f"with_auroc needs two classes (probs of shape [N, 2]), got {tuple(probs.shape)}")
    if uncertainty.shape != labels.shape:
        raise ValueError(f"uncertainty must have shape {tuple(labels.shape)}, got {tuple(uncertainty.shape)}")
    order = torch.argsort(uncertainty)  # most certain first
    correct = (probs.argmax(-1) == labels)[order].double()
    n = labels.numel()
    rows = []
    for fraction in fractions:
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"fractions must lie in [0, 1), got {fraction}")
        kept = max(1, n - int(math.floor(fraction * n)))
        row = {"referred": float(fraction), "retained": kept, "accuracy": float(correct[:kept].mean())}
        if with_auroc:
            chosen = order[:kept]
            try:
                row["auroc"] = auroc(probs[chosen, 1], labels[chosen])
            except ValueError:  # one class left
                row["auroc"] = float("nan")
        rows.append(row)
    return rows


def rmse(predictions: torch.Tensor, targets: torch.Tensor) -> float:
    """Root mean squared error ``sqrt(mean_n (f_n - y_n)^2)`` over all elements (same shapes required)."""
    if predictions.shape != targets.shape:
        raise ValueError(f"predictions {tuple(predictions.shape)} and targets {tuple(targets.shape)} differ in shape")
    return float(((predictions - targets) ** 2).mean().sqrt())


def gaussian_log_likelihood(sample_means: torch.Tensor, targets: torch.Tensor, noise_std: float | torch.Tensor) -> float:
    """Per-point Monte Carlo predictive log-likelihood of a Gaussian regressor (the UCI test log-likelihood of
    Hernandez-Lobato & Adams 2015 and Oh et al. 2020, section 5.1):
    ``mean_n [logsumexp_s log N(y_n | f_s(x_n), noise_std^2) - log S]``.

    ``sample_means``: ``[S, N]`` (or ``[S, *targets.shape]``); the logsumexp runs over the S weight
    samples, never over test points. ``noise_std`` > 0: a number or a tensor broadcastable to ``sample_means``.
    """
    if sample_means.shape[1:] != targets.shape:
        raise ValueError(
            f"sample_means must be [S, *targets.shape] = [S, {', '.join(map(str, targets.shape))}], "
            f"got {tuple(sample_means.shape)}"
        )
    noise = torch.as_tensor(noise_std, dtype=sample_means.dtype, device=sample_means.device)
    if not (noise > 0).all():
        raise ValueError(f"noise_std must be > 0, got {noise_std!r}")
    log_density = torch.distributions.Normal(sample_means, noise).log_prob(targets.unsqueeze(0))
    per_point = torch.logsumexp(log_density, dim=0) - math.log(sample_means.shape[0])
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
