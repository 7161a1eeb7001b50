"""Monte Carlo prediction, vectorised over weight samples, and predictive summaries."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import vmap

__all__ = ["predict", "ClassificationSummary", "classification_summary", "RegressionSummary", "regression_summary"]


@torch.no_grad()
def predict(
    model: nn.Module,
    x: torch.Tensor,
    samples: int = 16,
    *,
    chunk_size: int | None = None,
    vectorize: bool = True,
) -> torch.Tensor:
    """Outputs of ``samples`` weight draws, stacked: ``[samples, *model(x).shape]``.

    With ``vectorize`` the draws run as one batched pass (``torch.func.vmap`` with independent randomness per
    draw); ``chunk_size`` bounds how many draws are batched at once (memory). Models vmap cannot handle fall
    back to a Python loop over draws. The model's ``training`` flag is left as it is.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    if vectorize:
        try:
            return vmap(lambda _: model(x), randomness="different", chunk_size=chunk_size)(torch.arange(samples, device=x.device))
        except (RuntimeError, NotImplementedError):
            pass  # e.g. in-place random ops or data-dependent control flow: loop instead
    return torch.stack([model(x) for _ in range(samples)])


@dataclass(frozen=True)
class ClassificationSummary:
    """Monte Carlo predictive of a classifier, per example (entropies in nats).

    ``predictive_entropy = expected_entropy (aleatoric) + mutual_information (epistemic)``.
    """

    probs: torch.Tensor
    predictive_entropy: torch.Tensor
    expected_entropy: torch.Tensor
    mutual_information: torch.Tensor


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(-1)


def classification_summary(logits: torch.Tensor) -> ClassificationSummary:
    """Summarise ``logits`` of shape ``[samples, batch, classes]`` (as returned by :func:`predict`)."""
    if logits.dim() < 3:
        raise ValueError(f"logits must be [samples, batch, classes], got shape {tuple(logits.shape)}")
    per_sample = torch.softmax(logits, dim=-1)
    probs = per_sample.mean(0)
    total = _entropy(probs)
    expected = _entropy(per_sample).mean(0)
    return ClassificationSummary(probs, total, expected, (total - expected).clamp_min(0.0))


@dataclass(frozen=True)
class RegressionSummary:
    """Predictive of a Gaussian regressor: mean, and variance = aleatoric + epistemic."""

    mean: torch.Tensor
    aleatoric_variance: torch.Tensor
    epistemic_variance: torch.Tensor

    @property
    def variance(self) -> torch.Tensor:
        return self.aleatoric_variance + self.epistemic_variance


def regression_summary(means: torch.Tensor, noise_variance: float | torch.Tensor) -> RegressionSummary:
    """``means``: ``[samples, batch, ...]`` predicted means; ``noise_variance``: the likelihood's variance
    (a number, or a tensor broadcastable to ``means`` for heteroscedastic models, averaged over samples)."""
    if means.dim() < 2:
        raise ValueError(f"means must be [samples, batch, ...], got shape {tuple(means.shape)}")
    noise = torch.as_tensor(noise_variance, dtype=means.dtype, device=means.device)
    if (noise < 0).any() or not math.isfinite(float(noise.sum())):
        raise ValueError("noise_variance must be finite and >= 0")
    aleatoric = noise.expand_as(means).mean(0) if noise.dim() == means.dim() else noise.expand_as(means[0])
    return RegressionSummary(means.mean(0), aleatoric, means.var(0, unbiased=False))
