"""Monte Carlo prediction, vectorised over weight samples, and predictive summaries.

:func:`predict` stacks the outputs of S weight draws ``f_s(x)``, ``w_s ~ q``; the summaries turn them into the
Monte Carlo predictive ``p(y | x) ~= (1/S) sum_s p(y | f_s(x))`` (Graves 2011 section 6: the expected distribution
under q) and its decomposition into aleatoric and epistemic parts. ``varbnn.predict`` (after ``import varbnn``) is
the function :func:`predict`; this module is ``import varbnn.predict``'s ``sys.modules`` entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import vmap

__all__ = [
    "predict",
    "vectorized_by_default",
    "ClassificationSummary",
    "classification_summary",
    "RegressionSummary",
    "regression_summary",
]


@torch.no_grad()
def predict(
    model: nn.Module,
    x: torch.Tensor,
    samples: int = 16,
    *,
    chunk_size: int | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    vectorize: bool | None = None,
) -> torch.Tensor:
    """Outputs of ``samples`` weight draws, stacked: ``[samples, *model(x).shape]``.

    With ``vectorize`` the draws run as one batched pass (``torch.func.vmap`` with independent randomness per
    draw); models vmap cannot handle fall back to a Python loop over draws. The default (``None``) batches the draws
    except for a model with Bayesian convolutions on the CPU, which loops (:func:`vectorized_by_default`): there a
    batched pass convolves with a different kernel per draw, and took 1.13-2.68x the loop's time for every family
    (LeNet-5, 16 draws of 500 images, one thread), while the batched draws of dense networks took 0.52-1.20x
    (MLP 784-400-400-10) and 0.08-0.40x (a UCI-sized MLP 8-50-1) of it there, and on an H100 64 batched draws of
    LeNet-5 with MeanField, Radial and KTied take 0.28-0.50x the loop's time (``benchmarks/results/predict-time/``).
    Memory is capped by chunking: ``chunk_size`` draws are batched at once (default: all; the loop draws one at a
    time) over ``batch_size`` examples at a time (default: all), so the activations held at once are those of
    ``chunk_size * batch_size`` examples (e.g. LeNet-5, 64 draws of 10,000 images: ``chunk_size=16, batch_size=1000``
    peaks well under 2 GB; see ``benchmarks/predict_time.py``).

    ``seed``: every example batch replays the same seeded random stream in a forked RNG (the global RNG is left
    untouched), so results are reproducible, and with estimators that draw whole weights (``reparam``) draw ``s``
    is the same network on every batch. The batched draws depend on ``chunk_size`` (a different chunking gives
    different, equally distributed draws), and the loop's differ from the batched ones for the same seed.
    The model's ``training`` flag is left as it is.

    A model that defines ``predictive_draws(x, samples)`` supplies its own draws (:class:`varbnn.baselines.DeepEnsemble`:
    one per member, whatever ``samples``).

    :param model: the network; a Bayesian layer draws fresh weights on every call (:mod:`varbnn.nn.base`).
    :param x: inputs ``[N, ...]`` (finite).
    :param samples: the number of draws S, an int >= 1 (default 16).
    :param chunk_size: draws batched at once (default ``None``: all).
    :param batch_size: examples per pass (default ``None``: all).
    :param seed: seed of a forked random stream (default ``None``: the global one).
    :param vectorize: run the draws under ``torch.func.vmap`` (True; a model vmap refuses falls back to a loop) or in a
        loop (False); default ``None``: :func:`vectorized_by_default`.
    :returns: the stacked outputs ``[S, N, ...]`` (logits for a classifier), without gradients.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    for name, value in (("chunk_size", chunk_size), ("batch_size", batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    if x.dim() == 0:
        raise ValueError("x must have a batch dimension, got a scalar")
    if vectorize is not None and not isinstance(vectorize, bool):
        raise ValueError(
            "vectorize must be True, False or None (batched unless the model has Bayesian convolutions and x is on "
            f"the CPU), got {vectorize!r}"
        )
    if vectorize is None:
        vectorize = vectorized_by_default(model, x)
    step = batch_size or max(int(x.shape[0]), 1)
    outputs = []
    for start in range(0, max(int(x.shape[0]), 1), step):
        xb = x[start : start + step]
        if seed is None:
            outputs.append(_draws(model, xb, samples, chunk_size, vectorize))
            continue
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            outputs.append(_draws(model, xb, samples, chunk_size, vectorize))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def vectorized_by_default(model: nn.Module, x: torch.Tensor) -> bool:
    """:func:`predict`'s choice when ``vectorize=None``: False (a loop over draws) for inputs on the CPU to a model
    with a Bayesian convolution (:class:`~varbnn.BayesConv1d`, 2d, 3d), whose batched pass convolves with a kernel
    per draw and measured slower than the loop there; True (vmap) otherwise."""
    from varbnn.nn.layers import _BayesConvNd

    return x.device.type != "cpu" or not any(isinstance(m, _BayesConvNd) for m in model.modules())


def _draws(model: nn.Module, x: torch.Tensor, samples: int, chunk_size: int | None, vectorize: bool) -> torch.Tensor:
    own = getattr(model, "predictive_draws", None)
    if callable(own):  # e.g. a DeepEnsemble: its members are the draws
        return own(x, samples)
    if vectorize:
        try:
            return vmap(lambda _: model(x), randomness="different", chunk_size=chunk_size)(torch.arange(samples, device=x.device))
        except (RuntimeError, NotImplementedError):
            pass  # e.g. in-place random ops or data-dependent control flow: loop instead
    return torch.stack([model(x) for _ in range(samples)])


@dataclass(frozen=True)
class ClassificationSummary:
    """Monte Carlo predictive of a classifier, per example (entropies in nats), from S draws of softmax
    probabilities ``p_s = softmax(f_s(x))``.

    ``predictive_entropy = expected_entropy (aleatoric) + mutual_information (epistemic)``.

    :ivar probs: ``[N, C]`` mean probabilities ``p = (1/S) sum_s p_s``.
    :ivar predictive_entropy: ``[N]`` entropy of the mean, ``H[p] = -sum_c p_c log p_c``.
    :ivar expected_entropy: ``[N]`` mean entropy of the draws, ``(1/S) sum_s H[p_s]`` (aleatoric).
    :ivar mutual_information: ``[N]`` ``H[p] - (1/S) sum_s H[p_s]`` >= 0 (epistemic; the BALD score), clamped at 0.
    """

    probs: torch.Tensor
    predictive_entropy: torch.Tensor
    expected_entropy: torch.Tensor
    mutual_information: torch.Tensor


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(-1)


def _check_outputs(values: torch.Tensor, name: str, *, allow_negative_inf: bool = False) -> None:
    """Refuse NaN (and inf; -inf logits are a masked class, allowed) in a network's predicted outputs: a summary of
    them would be NaN or wrong without saying why."""
    bad = torch.isnan(values) | (values == math.inf)
    if not allow_negative_inf:
        bad |= values == -math.inf
    if bool(bad.any()):
        draws = bad.flatten(1).any(1).nonzero().flatten().tolist()
        shown = ", ".join(map(str, draws[:5])) + (", ..." if len(draws) > 5 else "")
        raise ValueError(
            f"{name} hold NaN or inf in {len(draws)} of {values.shape[0]} draws (draw {shown}): the network's outputs "
            "are not finite (non-finite inputs, or diverged weights: check the inputs, and the parameters with "
            "torch.isfinite)"
        )


def classification_summary(logits: torch.Tensor) -> ClassificationSummary:
    """The :class:`ClassificationSummary` of ``logits`` of shape ``[samples, batch, classes]`` (as returned by
    :func:`predict`): mean softmax probabilities, predictive and expected entropies and their difference, the
    mutual information between the label and the weights."""
    if logits.dim() < 3:
        raise ValueError(f"logits must be [samples, batch, classes], got shape {tuple(logits.shape)}")
    _check_outputs(logits, "logits", allow_negative_inf=True)
    per_sample = torch.softmax(logits, dim=-1)
    probs = per_sample.mean(0)
    total = _entropy(probs)
    expected = _entropy(per_sample).mean(0)
    return ClassificationSummary(probs, total, expected, (total - expected).clamp_min(0.0))


@dataclass(frozen=True)
class RegressionSummary:
    """Predictive of a Gaussian regressor: mean, and variance = aleatoric + epistemic (the law of total variance
    over the S draws of the mean ``f_s(x)``).

    :ivar mean: ``[N, ...]`` predictive mean ``(1/S) sum_s f_s(x)``.
    :ivar aleatoric_variance: ``[N, ...]`` the likelihood's noise variance, averaged over the draws.
    :ivar epistemic_variance: ``[N, ...]`` the variance of the draws' means, ``(1/S) sum_s (f_s(x) - mean)^2``.
    """

    mean: torch.Tensor
    aleatoric_variance: torch.Tensor
    epistemic_variance: torch.Tensor

    @property
    def variance(self) -> torch.Tensor:
        """The total predictive variance ``aleatoric_variance + epistemic_variance``."""
        return self.aleatoric_variance + self.epistemic_variance


def regression_summary(means: torch.Tensor, noise_variance: float | torch.Tensor) -> RegressionSummary:
    """The :class:`RegressionSummary` of ``means``, ``[samples, batch, ...]`` predicted means, under a Gaussian
    likelihood of variance ``noise_variance`` (a number, or a tensor broadcastable to ``means`` for heteroscedastic
    models, averaged over the samples): mean ``mean_s f_s``, aleatoric variance the noise, epistemic variance
    ``var_s f_s`` (population variance over the draws). A noise tensor with as many dimensions as ``means`` is read
    per draw (its first dimension over the draws, e.g. ``[S, N]``); one with fewer, per example (``[N]``): give a
    per-example noise of ``[N, 1]`` with means ``[S, N, 1]``, not ``[S, N]``."""
    if means.dim() < 2:
        raise ValueError(f"means must be [samples, batch, ...], got shape {tuple(means.shape)}")
    _check_outputs(means, "means")
    noise = torch.as_tensor(noise_variance, dtype=means.dtype, device=means.device)
    if (noise < 0).any() or not math.isfinite(float(noise.sum())):
        raise ValueError("noise_variance must be finite and >= 0")
    aleatoric = noise.expand_as(means).mean(0) if noise.dim() == means.dim() else noise.expand_as(means[0])
    return RegressionSummary(means.mean(0), aleatoric, means.var(0, unbiased=False))
