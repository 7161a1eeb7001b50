"""Temperature scaling (Guo et al. 2017): the post-hoc calibration users pick instead of a Bayesian network.

One scalar ``T > 0`` divides a classifier's logits; it is fitted on a VALIDATION split by minimising the NLL, so the
predicted class (and the accuracy) never changes, only the confidence.

    calibrated = TemperatureScaled(net).fit(x_val, y_val)
    probs = calibrated(x_test).softmax(-1)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from varbnn._checks import as_float_in, as_positive_int, check_class_labels
from varbnn.baselines import DeepEnsemble
from varbnn.moments import moment_support, propagate
from varbnn.predict import _is_stochastic, predict

__all__ = ["fit_temperature", "TemperatureScaled"]


def _tempered_nll(logits: torch.Tensor, labels: torch.Tensor) -> Callable[[float], float]:
    """The mean NLL of the predictive at temperature ``exp(log_t)`` as a function of ``log_t``; ``logits`` are
    ``[N, C]`` or Monte Carlo ``[S, N, C]`` (then the softmax of each draw is averaged before the log, as in the Monte
    Carlo predictive).

    What does not depend on the temperature is computed once: each row's largest logit ``m`` (the largest of
    ``z / T`` is ``m / T`` for every ``T > 0``), the gaps ``d = z - m <= 0`` and the label's gap ``d_y``; then
    ``log softmax(z / T)_y = d_y / T - log sum_c exp(d_c / T)``, one exponential per logit and no ``[S, N, C]``
    log-softmax per evaluation (the search evaluates it about 65 times)."""
    gaps = logits - logits.amax(dim=-1, keepdim=True)
    label_gaps = gaps.gather(-1, labels.expand(gaps.shape[:-1]).unsqueeze(-1)).squeeze(-1)
    draws = gaps.shape[0] if gaps.dim() == 3 else 1

    def nll(log_t: float) -> float:
        inverse = math.exp(-log_t)
        label_log_probs = label_gaps * inverse - torch.log(torch.exp(gaps * inverse).sum(-1))
        if gaps.dim() == 3:
            label_log_probs = torch.logsumexp(label_log_probs, dim=0) - math.log(draws)
        return float(-label_log_probs.mean())

    return nll


def fit_temperature(
    logits: torch.Tensor, labels: torch.Tensor, *, bounds: tuple[float, float] = (0.05, 20.0), iterations: int = 60
) -> float:
    """The temperature ``T`` minimising the validation NLL of ``softmax(logits / T)``.

    Golden-section search rather than gradient descent: it needs no learning rate and cannot diverge. When the
    minimum lies at a bound (the NLL still falls beyond it), ``T`` is that bound and a ``UserWarning`` says which and
    what it suggests: at the upper bound, logits that barely predict the labels (``T -> inf`` is the uniform
    prediction: mismatched or shuffled labels, an untrained model); at the lower one, a model far too under-confident,
    or a validation set it classifies without error (the NLL keeps falling as ``T -> 0``). When the NLL does not
    depend on ``T`` at all (each example's logits all equal), ``T = 1`` with a ``UserWarning``.

    :param logits: ``[N, C]`` (a plain network) or ``[S, N, C]`` (Monte Carlo draws: the NLL of the mean softmax).
    :param labels: ``[N]`` class indices.
    :param bounds: the search interval for ``T`` (default 0.05 to 20).
    :param iterations: golden-section steps on ``log T`` (the NLL is unimodal in ``log T`` for a plain network; 60 steps
        pin ``log T`` to ~1e-12 of the interval).
    """
    temperature, bound = _fit_temperature(logits, labels, bounds, iterations)
    _warn_at_bound(temperature, bound, bounds, "fit_temperature", stacklevel=3)
    return temperature


def _fit_temperature(
    logits: torch.Tensor, labels: torch.Tensor, bounds: tuple[float, float], iterations: int
) -> tuple[float, str | None]:
    """:func:`fit_temperature`'s search: ``(T, None)``, ``(T, "lower" / "upper")`` when ``T`` is at that bound, or
    ``(1.0, "flat")`` when the NLL is the same for every ``T``."""
    if not isinstance(logits, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError(
            f"fit_temperature: logits and labels must be tensors, got {type(logits).__name__} and {type(labels).__name__}"
        )
    if logits.dim() not in (2, 3) or labels.shape != logits.shape[-2:-1]:
        raise ValueError(
            f"logits must be [N, C] or [S, N, C] with labels [N]; got logits {tuple(logits.shape)}, labels {tuple(labels.shape)}"
        )
    check_class_labels(labels, logits.shape[-1], "labels", owner="fit_temperature")
    if labels.numel() == 0:
        raise ValueError("fit_temperature needs at least one validation example (labels [N] with N >= 1)")
    if not torch.isfinite(logits).all():
        raise ValueError("logits contain NaN or infinite values")
    low, high = bounds
    if not (0 < low < high and math.isfinite(high)):
        raise ValueError(f"bounds must satisfy 0 < low < high < inf, got {bounds!r}")
    iterations = as_positive_int(iterations, "iterations")
    logits, labels = logits.detach().double(), labels.long()
    a, b = math.log(low), math.log(high)
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    f = _tempered_nll(logits, labels)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    found = (a + b) / 2
    f_found, f_low, f_high = f(found), f(math.log(low)), f(math.log(high))
    if f_low == f_high == f_found:  # every example's logits are all equal: no T changes the NLL
        return 1.0, "flat"
    # an end of the search interval that never moved (the NLL kept falling towards it), or as low an NLL at a bound
    # as at the optimum found (a NLL flat to the last bit near the bound, e.g. separable data as T -> 0)
    if b == math.log(high) or f_high <= f_found:
        return high, "upper"
    if a == math.log(low) or f_low <= f_found:
        return low, "lower"
    return math.exp(found), None


def _warn_at_bound(temperature: float, bound: str | None, bounds: tuple[float, float], owner: str, stacklevel: int) -> None:
    if bound is None:
        return
    if bound == "flat":
        warnings.warn(
            f"{owner}: the validation NLL is the same for every T in bounds={tuple(bounds)!r} (each example's logits "
            "are all equal, e.g. an untrained or collapsed model): T = 1 is kept",
            UserWarning,
            stacklevel=stacklevel,
        )
        return
    hint = (
        "the logits barely predict the labels (T -> inf is the uniform prediction): check that they belong together "
        "(the same examples, in the same order) and that the model is trained"
        if bound == "upper"
        else "the model is far too under-confident, or classifies every validation example correctly (then the NLL "
        "keeps falling as T -> 0 and no temperature is right: use more, or harder, validation data)"
    )
    warnings.warn(
        f"{owner}: the validation NLL is lowest at the {bound} bound T = {temperature:g} of bounds={tuple(bounds)!r} "
        f"(it falls further beyond it): {hint}; widen bounds to search further",
        UserWarning,
        stacklevel=stacklevel,
    )


class TemperatureScaled(nn.Module):
    """``model(x) / T``: a classifier with one fitted temperature (:func:`fit_temperature`).

    The temperature is a buffer of this module (its ``state_dict`` entry ``temperature``), so a ``copy.deepcopy``, a
    pickle or a ``load_state_dict`` carries its own ``T``. Wrapping a model with a ``predictive_draws`` hook (a
    :class:`varbnn.baselines.DeepEnsemble`, a :class:`varbnn.laplace.LastLayerLaplace`, another ``TemperatureScaled``
    of one) keeps that model's draws in :func:`varbnn.predict`, each divided by ``T``.

    :param model: the classifier returning logits.
    :param temperature: the starting ``T`` (default 1: the model unchanged until :meth:`fit`).
    """

    temperature: torch.Tensor
    _varbnn_delegates_draws = True  # varbnn.predict's _is_stochastic looks at the wrapped model

    def __init__(self, model: nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"TemperatureScaled: model must be an nn.Module, got {type(model).__name__}")
        temperature = as_float_in(temperature, "temperature", 0.0, None, low_open=True, owner="TemperatureScaled")
        self.model = model
        self.register_buffer("temperature", torch.tensor(float(temperature)))

    @property
    def predictive_draws(self) -> Callable[[torch.Tensor, int], torch.Tensor] | None:
        """The wrapped model's ``predictive_draws`` hook divided by ``T`` (what :func:`varbnn.predict` calls), or
        ``None`` when the model has none (then ``predict`` draws ``forward`` itself). Read from ``self`` on every
        access, so a copy uses its own temperature and model."""
        inner = getattr(self.model, "predictive_draws", None)
        if not callable(inner):
            return None
        hook: Callable[[torch.Tensor, int], torch.Tensor] = inner

        def draws(x: torch.Tensor, samples: int) -> torch.Tensor:
            return hook(x, samples) / self.temperature

        return draws

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) / self.temperature

    def moment_forward(self, mean: torch.Tensor, var: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The moment-propagation rule (:mod:`varbnn.moments`): the wrapped model's output moments, the mean divided by
        ``T`` and the variance by ``T^2``."""
        mean, var = propagate(self.model, mean, var)
        return mean / self.temperature, (None if var is None else var / self.temperature.square())

    def moment_support(self) -> str | None:
        """Why the moment propagation cannot follow the wrapped model, or ``None`` (:func:`varbnn.moments.moment_support`)."""
        return moment_support(self.model)

    @torch.no_grad()
    def fit(
        self,
        x: torch.Tensor | np.ndarray,
        y: torch.Tensor | np.ndarray,
        *,
        batch_size: int = 1000,
        samples: int | None = None,
        bounds: tuple[float, float] = (0.05, 20.0),
        predictive: str = "sample",
    ) -> TemperatureScaled:
        """Fit ``T`` on validation data ``(x, y)`` (never the test set); returns ``self``.

        ``T`` is fitted to the predictive the wrapped model gives at prediction time, :func:`varbnn.predict`'s
        draws (in eval mode; every submodule's mode is restored afterwards): the NLL of the mean softmax over
        ``samples`` draws (:func:`fit_temperature` on ``[S, N, C]``). ``samples`` (default ``None``): 1 for a
        deterministic model, where every draw is the same (an ensemble of plain networks gives its ``M`` members
        whatever ``samples`` is: all of them are used); 32 for a stochastic one (Bayesian layers, MC dropout, a
        Laplace model or an ensemble of such; rounded up to a multiple of an ensemble's members, so that each
        weighs the same). Pass the ``samples`` you will predict with to fit that predictive exactly.

        :param x: validation inputs ``[N, ...]``, ``N >= 1`` (a tensor or a NumPy array, as :func:`varbnn.predict`).
        :param y: their class labels ``[N]``.
        :param batch_size: examples per pass (default 1000; memory only).
        :param samples: draws of the predictive (default ``None``: see above).
        :param bounds: the search interval of ``T`` (default 0.05 to 20; a ``UserWarning`` when ``T`` ends at one).
        :param predictive: the predictive ``T`` is fitted to, as :func:`varbnn.predict`'s ``predictive`` (default
            ``"sample"``); predict the scaled model with the same one.
        """
        for name, value in (("x", x), ("y", y)):
            if not isinstance(value, (torch.Tensor, np.ndarray)):
                raise TypeError(
                    f"TemperatureScaled.fit: {name} must be a torch.Tensor or a numpy.ndarray, got {type(value).__name__}"
                )
        y = torch.as_tensor(y)
        if x.ndim == 0 or x.shape[0] == 0:
            raise ValueError(
                f"TemperatureScaled.fit: x holds no validation examples (shape {tuple(x.shape)}); the temperature needs "
                "x [N, ...] and y [N] with N >= 1"
            )
        if y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(
                f"TemperatureScaled.fit: y must be [N] class labels with N = x.shape[0] = {x.shape[0]}, got shape "
                f"{tuple(y.shape)}"
            )
        batch_size = as_positive_int(batch_size, "batch_size", owner="TemperatureScaled.fit")
        if samples is None:
            samples = 32 if _is_stochastic(self.model) else 1
            for module in self.model.modules():
                if isinstance(module, DeepEnsemble) and samples > 1:
                    size = len(module.members)
                    samples = -(-samples // size) * size
        samples = as_positive_int(samples, "samples", owner="TemperatureScaled.fit")
        reference = next(self.model.parameters(), None)
        device = reference.device if reference is not None else self.temperature.device
        self.temperature.data = self.temperature.data.to(device)
        if isinstance(x, torch.Tensor):
            x = x.to(device)  # a NumPy array is converted by predict, onto the model's device
        chunks = [predict(self.model, x[i : i + batch_size], samples=samples, predictive=predictive)
                  for i in range(0, x.shape[0], batch_size)]  # fmt: skip
        logits = torch.cat(chunks, dim=1)
        temperature, bound = _fit_temperature(logits if logits.shape[0] > 1 else logits[0], y.to(logits.device), bounds, 60)
        _warn_at_bound(temperature, bound, bounds, "TemperatureScaled.fit", stacklevel=4)
        self.temperature.fill_(temperature)
        return self

    def extra_repr(self) -> str:
        return f"temperature={float(self.temperature):.4g}"
