"""Temperature scaling (Guo et al. 2017): the post-hoc calibration users pick instead of a Bayesian network.

One scalar ``T > 0`` divides a classifier's logits; it is fitted on a VALIDATION split by minimising the NLL, so the
predicted class (and the accuracy) never changes, only the confidence.

    calibrated = TemperatureScaled(net).fit(x_val, y_val)
    probs = calibrated(x_test).softmax(-1)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from varbnn._checks import as_float_in, as_positive_int, check_class_labels

__all__ = ["fit_temperature", "TemperatureScaled"]


def _tempered_nll(logits: torch.Tensor, labels: torch.Tensor, log_t: torch.Tensor) -> torch.Tensor:
    """Mean NLL of the predictive at temperature exp(log_t); ``logits`` are ``[N, C]`` or Monte Carlo ``[S, N, C]``
    (then the softmax of each draw is averaged before the log, as in the Monte Carlo predictive)."""
    scaled = logits / log_t.exp()
    if scaled.dim() == 2:
        return torch.nn.functional.cross_entropy(scaled, labels)
    log_probs = torch.logsumexp(torch.log_softmax(scaled, -1), dim=0) - math.log(scaled.shape[0])
    return -log_probs.gather(1, labels.unsqueeze(1)).mean()


def fit_temperature(
    logits: torch.Tensor, labels: torch.Tensor, *, bounds: tuple[float, float] = (0.05, 20.0), iterations: int = 60
) -> float:
    """The temperature ``T`` minimising the validation NLL of ``softmax(logits / T)``.

    Golden-section search rather than gradient descent: it needs no learning rate and cannot diverge.

    :param logits: ``[N, C]`` (a plain network) or ``[S, N, C]`` (Monte Carlo draws: the NLL of the mean softmax).
    :param labels: ``[N]`` class indices.
    :param bounds: the search interval for ``T`` (default 0.05 to 20).
    :param iterations: golden-section steps on ``log T`` (the NLL is unimodal in ``log T`` for a plain network; 60 steps
        pin ``log T`` to ~1e-12 of the interval).
    """
    if logits.dim() not in (2, 3) or labels.shape != logits.shape[-2:-1]:
        raise ValueError(
            f"logits must be [N, C] or [S, N, C] with labels [N]; got logits {tuple(logits.shape)}, labels {tuple(labels.shape)}"
        )
    check_class_labels(labels, logits.shape[-1], "labels", owner="fit_temperature")
    if labels.numel() == 0:
        raise ValueError("fit_temperature needs at least one validation example")
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
    f = lambda v: float(_tempered_nll(logits, labels, torch.tensor(v, dtype=torch.float64)))  # noqa: E731
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
    return math.exp((a + b) / 2)


class TemperatureScaled(nn.Module):
    """``model(x) / T``: a classifier with one fitted temperature (:func:`fit_temperature`).

    :param model: the classifier returning logits.
    :param temperature: the starting ``T`` (default 1: the model unchanged until :meth:`fit`).
    """

    temperature: torch.Tensor

    def __init__(self, model: nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        temperature = as_float_in(temperature, "temperature", 0.0, None, low_open=True, owner="TemperatureScaled")
        self.model = model
        self.register_buffer("temperature", torch.tensor(float(temperature)))
        inner = getattr(model, "predictive_draws", None)
        if callable(inner):  # an ensemble / Laplace inside: keep its own draws (varbnn.predict looks for this hook)
            self.predictive_draws = lambda x, samples: inner(x, samples) / self.temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x) / self.temperature

    @torch.no_grad()
    def fit(self, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1000, samples: int = 1) -> TemperatureScaled:
        """Fit ``T`` on validation data ``(x, y)`` (never the test set); returns ``self``. ``samples`` > 1 fits the
        temperature of the Monte Carlo predictive of a stochastic model (e.g. MC dropout or a BNN)."""
        from varbnn.predict import predict

        batch_size = as_positive_int(batch_size, "batch_size")
        was_training = self.model.training
        self.model.eval()
        reference = next(self.model.parameters(), None)
        device = reference.device if reference is not None else self.temperature.device
        self.temperature.data = self.temperature.data.to(device)
        chunks = [predict(self.model, x[i : i + batch_size].to(device), samples=samples)
                  for i in range(0, x.shape[0], batch_size)]  # fmt: skip
        logits = torch.cat(chunks, dim=1)
        self.temperature.fill_(fit_temperature(logits if samples > 1 else logits[0], y.to(device)))
        self.model.train(was_training)
        return self

    def extra_repr(self) -> str:
        return f"temperature={float(self.temperature):.4g}"
