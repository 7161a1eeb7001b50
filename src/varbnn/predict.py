"""Monte Carlo prediction, vectorised over weight samples, and predictive summaries.

:func:`predict` stacks the outputs of S weight draws ``f_s(x)``, ``w_s ~ q``; the summaries turn them into the
Monte Carlo predictive ``p(y | x) ~= (1/S) sum_s p(y | f_s(x))`` (Graves 2011 section 6: the expected distribution
under q) and its decomposition into aleatoric and epistemic parts. ``varbnn.predict`` (after ``import varbnn``) is
the function :func:`predict`; this module is ``import varbnn.predict``'s ``sys.modules`` entry.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import vmap

from varbnn.moments import MomentPredictive, moment_support
from varbnn.nn.attention import BayesMultiheadAttention
from varbnn.nn.base import BayesianModule
from varbnn.nn.layers import _BayesConvNd

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
    x: torch.Tensor | np.ndarray,
    samples: int = 16,
    *,
    chunk_size: int | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
    vectorize: bool | None = None,
    predictive: str = "sample",
) -> torch.Tensor:
    """Outputs of ``samples`` weight draws, stacked: ``[samples, *model(x).shape]``.

    With ``vectorize`` the draws run as one batched pass (``torch.func.vmap`` with independent randomness per
    draw); models vmap cannot handle fall back to a Python loop over draws. The default (``None``) batches the draws
    except for a model with Bayesian convolutions on the CPU, which loops (:func:`vectorized_by_default`): there a
    batched pass convolves with a different kernel per draw, and took 1.23-1.99x the loop's time for every family
    (LeNet-5, 16 draws of 500 images, one thread), while the batched draws of dense networks took 0.54-1.28x
    (MLP 784-400-400-10; above 1 for KTied and RadialDirectional) and 0.19-0.48x (a UCI-sized MLP 8-50-1) of it
    there, and on an H100 64 batched draws of
    LeNet-5 with MeanField, Radial and KTied take 0.28-0.50x the loop's time (``benchmarks/results/predict-time/``).
    Memory is capped by chunking: ``chunk_size`` draws are batched at once (default: all; the loop draws one at a
    time) over ``batch_size`` examples at a time (default: all), so the activations held at once are those of
    ``chunk_size * batch_size`` examples (e.g. LeNet-5, 64 draws of 10,000 images: ``chunk_size=16, batch_size=1000``
    peaks well under 2 GB; see ``benchmarks/predict_time.py``).

    ``seed``: every example batch replays the same seeded random stream in a forked RNG (the global RNG is left
    untouched), so results are reproducible, and with estimators that draw whole weights (``reparam``) draw ``s``
    is the same network on every batch. The batched draws depend on ``chunk_size`` (a different chunking gives
    different, equally distributed draws), and the loop's differ from the batched ones for the same seed.

    The model runs in ``eval()`` mode for the call (batch norm uses its running statistics and never updates them,
    plain dropout is off), and every submodule's ``training`` flag is restored afterwards, as it was. Bayesian layers
    sample in either mode; to sample dropout, wrap the network in :class:`varbnn.baselines.MCDropout`, whose dropout
    layers keep sampling in eval mode.

    A model that defines ``predictive_draws(x, samples)`` supplies its own draws (:class:`varbnn.baselines.DeepEnsemble`:
    its members' draws, see there; :class:`varbnn.laplace.LastLayerLaplace`).

    ``x`` is a ``torch.Tensor`` (used as it is: its dtype must be the one the model computes in, e.g. ``float16``
    inputs for a ``model.half()``) or a ``numpy.ndarray``, converted to a tensor on the model's device, a floating
    array in the dtype of the model's floating parameters (``float32`` for a network of the default dtype; integer
    arrays, e.g. token ids, keep their dtype). Anything else is a ``TypeError``.

    :param model: the network; a Bayesian layer draws fresh weights on every call (:mod:`varbnn.nn.base`).
    :param x: inputs ``[N, ...]`` (finite), a tensor or a NumPy array.
    :param samples: the number of draws S, an int >= 1 (default 16).
    :param predictive: ``"sample"`` (default): S passes of the network, each with its own weights, as above;
        ``"moments"``: one moment-propagation pass (:class:`varbnn.moments.MomentPredictive`), then S draws of the
        outputs from the propagated Gaussian (independent per output unit), a ``TypeError`` for a network it cannot
        follow (:func:`varbnn.moments.moment_support`); ``"auto"``: ``"moments"`` where it can follow a stochastic
        network without draws of its own and neither ``chunk_size`` nor ``vectorize`` is passed, ``"sample"``
        elsewhere. The moment predictive costs about 5 plain passes against about 50 for 32 weight draws of an MLP,
        and is an approximation: its validation NLL was within 1% of 64 weight draws' for every posterior on the
        Fashion-MNIST MLP but 0.4-9.5% above it on MNIST, and its test NLL -3.2% to +2.1% from theirs with a
        temperature fitted to each predictive (``benchmarks/results/moment-predictive/``); hence the default stays
        ``"sample"``.
    :param chunk_size: draws batched at once (default ``None``: all).
    :param batch_size: examples per pass (default ``None``: all).
    :param seed: seed of a forked random stream (default ``None``: the global one).
    :param vectorize: run the draws under ``torch.func.vmap`` (True; a model vmap refuses falls back to a loop) or in a
        loop (False); default ``None``: :func:`vectorized_by_default`.
    :returns: the stacked outputs ``[S, N, ...]`` (logits for a classifier), without gradients.
    """
    x = _as_input(model, x)
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
    if predictive not in PREDICTIVES:
        raise ValueError(f"predictive must be one of {PREDICTIVES}, got {predictive!r}")
    if predictive == "auto":  # the Monte Carlo knobs, passed, ask for weight draws
        asked_for_draws = chunk_size is not None or vectorize is not None
        predictive = "moments" if not asked_for_draws and _moments_apply(model) else "sample"
    if predictive == "moments":
        model = MomentPredictive(model)
    if vectorize is None:
        vectorize = vectorized_by_default(model, x)
    step = batch_size or max(int(x.shape[0]), 1)
    outputs = []
    with _prediction_mode(model):
        for start in range(0, max(int(x.shape[0]), 1), step):
            xb = x[start : start + step]
            if seed is None:
                outputs.append(_checked_draws(model, xb, samples, chunk_size, vectorize))
                continue
            devices = [x.device] if x.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                outputs.append(_checked_draws(model, xb, samples, chunk_size, vectorize))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


PREDICTIVES = ("sample", "moments", "auto")
"""The values of :func:`predict`'s ``predictive``."""


def _moments_apply(model: nn.Module) -> bool:
    """``predictive="auto"``'s choice: moments for a stochastic network :func:`~varbnn.moments.moment_support` can
    follow, without a ``predictive_draws`` hook of its own (an ensemble or a Laplace model keeps its draws)."""
    if callable(getattr(model, "predictive_draws", None)) or not _is_stochastic(model):
        return False
    return moment_support(model) is None


@contextlib.contextmanager
def _prediction_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Context manager: ``model.eval()`` inside the block (batch norm reads its running statistics and leaves them
    alone, plain dropout is off; :class:`varbnn.baselines.MCDropout` keeps its dropout sampling), then every
    submodule's ``training`` flag set back to what it was, one by one (a model mixing train- and eval-mode parts
    gets the same mix back). :func:`predict` runs its passes inside it."""
    previous = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, mode in previous:
            module.training = mode


def _floating_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating parameter (else buffer), None when it has neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def _model_device(model: nn.Module) -> torch.device | None:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return None


def _as_input(model: nn.Module, x: Any) -> torch.Tensor:
    """``x`` as :func:`predict` takes it: a tensor as it is; a NumPy array converted (floating arrays to the model's
    floating dtype, all to its device)."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        if x.dtype == object or not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise TypeError(f"predict: x must be a numeric numpy.ndarray, got one of dtype {x.dtype}")
        tensor = torch.from_numpy(np.ascontiguousarray(x))
        dtype = _floating_dtype(model) or torch.get_default_dtype()
        device = _model_device(model)
        return tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else None)
    raise TypeError(
        f"predict: x must be a torch.Tensor or a numpy.ndarray (converted to the model's dtype and device), got "
        f"{type(x).__module__}.{type(x).__qualname__}"
    )


def _checked_draws(model: nn.Module, x: torch.Tensor, samples: int, chunk_size: int | None, vectorize: bool) -> torch.Tensor:
    """:func:`_draws`, with a dtype mismatch between ``x`` and the model's parameters named (torch's own message
    names neither)."""
    try:
        return _draws(model, x, samples, chunk_size, vectorize)
    except RuntimeError as error:
        dtype = _floating_dtype(model)
        if x.is_floating_point() and dtype is not None and x.dtype != dtype and "type" in str(error):
            raise TypeError(
                f"predict: x has dtype {x.dtype} but the model's parameters are {dtype}; predict does not cast "
                f"tensors: pass x.to({dtype}) (or a NumPy array, which is converted)"
            ) from error
        raise


def _is_stochastic(model: nn.Module) -> bool:
    """Whether two prediction passes of ``model`` can differ: it holds a Bayesian layer in ``sample_mode="sample"``
    (:class:`varbnn.nn.base.BayesianModule`) with a posterior that is not a point mass (a layer whose tensors are all
    :attr:`~varbnn.families.VariationalFamily.point_mass`, e.g. Delta: a plain LoRA adapter, is deterministic), a
    :class:`varbnn.baselines.MCDropout`, or a module with a
    ``predictive_draws`` hook of its own (e.g. :class:`varbnn.laplace.LastLayerLaplace`; wrappers that only pass
    their inner model's draws on, :class:`~varbnn.baselines.DeepEnsemble` and
    :class:`~varbnn.calibration.TemperatureScaled`, count by what they wrap). Randomness a custom module draws in
    its own ``forward`` is not seen."""
    for module in model.modules():
        if isinstance(module, BayesianModule):
            if module.sample_mode == "sample" and any(not getattr(q, "point_mass", False) for q in module.posteriors.values()):
                return True
        elif getattr(module, "_varbnn_samples_at_prediction", False):
            return True
        elif not getattr(module, "_varbnn_delegates_draws", False) and callable(getattr(module, "predictive_draws", None)):
            return True
    return False


def vectorized_by_default(model: nn.Module, x: torch.Tensor) -> bool:
    """:func:`predict`'s choice when ``vectorize=None``: False (a loop over draws) for inputs on the CPU to a model
    with a Bayesian convolution (:class:`~varbnn.BayesConv1d`, 2d, 3d), whose batched pass convolves with a kernel
    per draw and measured slower than the loop there, or with attention (``nn.MultiheadAttention``,
    :class:`~varbnn.nn.BayesMultiheadAttention`), whose fused kernel vmap has no batching rule for (its fallback took
    about 2.3x the loop's time for the fine-tuned ViT of ``benchmarks/finetune_cpu.py``); True (vmap) otherwise."""
    if x.device.type != "cpu":
        return True
    return not any(isinstance(m, (_BayesConvNd, nn.MultiheadAttention, BayesMultiheadAttention)) for m in model.modules())


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
    mutual information between the label and the weights. float16 / bfloat16 logits are summarised in float32 (the
    mutual information, a small difference of two entropies, is lost to rounding in half precision: it kept no rank
    order with its float32 value), and the summary is float32."""
    if logits.dim() < 3:
        raise ValueError(f"logits must be [samples, batch, classes], got shape {tuple(logits.shape)}")
    _check_outputs(logits, "logits", allow_negative_inf=True)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
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
    """The :class:`RegressionSummary` of ``means``, ``[S, N, *D]`` predicted means (S draws of N examples, as returned
    by :func:`predict`), under a Gaussian likelihood of variance ``noise_variance``: mean ``mean_s f_s``, aleatoric
    variance the noise (averaged over the draws when given per draw), epistemic variance ``var_s f_s`` (population
    variance over the draws).

    The shape of ``noise_variance`` says how it is read, by its number of dimensions alone (never by its sizes, so
    ``N == S`` cannot be misread):

    * a number, or a tensor of one element: the same noise everywhere;
    * ``means.dim() - 2`` dimensions (means with output dimensions ``D`` only), ``[*D']``: per output, the same for
      every example, ``D'`` broadcastable to ``D`` (e.g. ``[D]`` with means ``[S, N, D]``);
    * ``means.dim() - 1`` dimensions, ``[N, *D']``: per example, ``N`` exactly, ``D'`` broadcastable to ``D``
      (e.g. ``[N]`` with means ``[S, N]``; ``[N, 1]`` or ``[N, D]`` with means ``[S, N, D]``);
    * ``means.dim()`` dimensions, ``[S, N, *D']``: per draw (a heteroscedastic model's predicted variances), ``S``
      and ``N`` exactly, ``D'`` broadcastable to ``D``.

    Any other shape is a ``ValueError`` naming the shapes accepted: e.g. ``[N, 1]`` with means ``[S, N]`` (give
    ``[N]``, or means ``[S, N, 1]``)."""
    if means.dim() < 2:
        raise ValueError(f"means must be [samples, batch, ...], got shape {tuple(means.shape)}")
    _check_outputs(means, "means")
    noise = torch.as_tensor(noise_variance, dtype=means.dtype, device=means.device)
    if (noise < 0).any() or not math.isfinite(float(noise.sum())):
        raise ValueError("noise_variance must be finite and >= 0")
    samples, examples, event = means.shape[0], means.shape[1], tuple(means.shape[2:])

    def fits(shape: tuple[int, ...]) -> bool:
        return len(shape) == len(event) and all(a in (1, b) for a, b in zip(shape, event))

    shape = tuple(noise.shape)
    if noise.numel() == 1:
        aleatoric = noise.reshape(()).expand_as(means[0])
    elif event and fits(shape):
        aleatoric = noise.expand_as(means[0])
    elif len(shape) == means.dim() - 1 and shape[0] == examples and fits(shape[1:]):
        aleatoric = noise.expand_as(means[0])
    elif len(shape) == means.dim() and shape[:2] == (samples, examples) and fits(shape[2:]):
        aleatoric = noise.expand_as(means).mean(0)
    else:
        d = "".join(f", {n}" for n in event)
        star = ", *D" if event else ""
        per_output = f"a per-output tensor [*D] = [{d[2:]}], " if event else ""
        raise ValueError(
            f"noise_variance of shape {shape} fits neither reading for means of shape {tuple(means.shape)} "
            f"[S, N{star}]: give a number, {per_output}a per-example tensor [N{star}] = [{examples}{d}] or a per-draw "
            f"tensor [S, N{star}] = [{samples}, {examples}{d}] (trailing sizes may be 1); the reading goes by the "
            "number of dimensions, so a per-example [N, 1] needs means [S, N, 1]"
        )
    return RegressionSummary(means.mean(0), aleatoric, means.var(0, unbiased=False))
