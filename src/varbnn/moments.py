"""A single-pass predictive: the mean and variance of every activation, propagated layer by layer (moment
propagation; the diagonal form of deterministic variational inference, Wu et al. 2019, "Deterministic Variational
Inference for Robust Bayesian Neural Networks").

Monte Carlo prediction (:func:`varbnn.predict`) costs one network pass per draw, and the draws a posterior needs for
its NLL to settle (within 1% of 64 draws) were 4 to 64 on the CPU benchmark (``benchmarks/results/uncertainty-cpu``).
Here every activation is summarised by an elementwise mean ``m`` and variance ``v`` instead, in one pass:

* a layer linear in its weights, ``y = op(x, W, b)``, with elementwise-independent weights of mean ``M`` and variance
  ``S`` (:meth:`~varbnn.families.VariationalFamily.moments`) and inputs of mean ``m`` and variance ``v``, independent of
  the weights: ``E[y] = op(m, M, E[b])`` and ``Var[y] = op(v, M^2) + op(m^2 + v, S) + Var[b]``, exact when the
  inputs are independent of each other (the network's input; the outputs of one Bayesian layer, whose rows of W are
  independent);
* ``ReLU`` and max pooling: the mean and variance of the max of independent Gaussians in closed form (Clark 1961,
  "The greatest of a finite set of random variables"; ``ReLU(z) = max(z, 0)``), taken pairwise over a pooling window;
* average pooling, batch norm in eval mode, ``Flatten``, ``Dropout`` in eval mode, ``Identity``: exact (linear).

Approximations: each activation is treated as Gaussian and independent of the other units of its layer (after the
first Bayesian layer the units share inputs and are correlated), and the output's units are independent too.
:class:`MomentPredictive` turns the output moments into draws of the logits (or regression means) from
``N(mean, variance)``, so :func:`varbnn.predict`, :class:`varbnn.calibration.TemperatureScaled` and the summaries take
it as they take any model. Whether the approximation is accurate enough for a given network is an empirical question:
``benchmarks/results/moment-predictive/`` measures its NLL against 64 Monte Carlo draws for each family.

Supported: ``nn.Sequential`` chains (nested too) of Bayesian linear and convolution layers whose weight and bias
families have independent elements (:class:`~varbnn.families.MeanField`, its subclass
:class:`~varbnn.families.KTied`, :class:`~varbnn.families.Delta`), plain ``nn.Linear`` / ``nn.Conv1d/2d/3d``,
``nn.ReLU``, ``nn.MaxPool1d/2d`` (no padding, dilation 1), ``nn.AvgPool1d/2d`` (no padding), ``nn.AdaptiveAvgPool2d``
to ``1x1``, ``nn.BatchNorm1d/2d`` (running statistics), ``nn.Flatten``, ``nn.Dropout`` (off, as in eval mode),
``nn.Identity`` and :class:`~varbnn.calibration.TemperatureScaled`. Anything else (a Radial or RDP family, whose
elements are dependent; a custom ``forward``; another activation) is a ``TypeError`` naming the module.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from varbnn.families import VariationalFamily
from varbnn.nn.layers import BayesConv1d, BayesConv2d, BayesConv3d, BayesLinear, _WeightOpLayer

__all__ = [
    "propagate_moments",
    "propagate",
    "moment_support",
    "MomentPredictive",
    "gaussian_max_moments",
    "relu_moments",
    "SUPPORTED_MODULES",
]

_Moments = tuple[torch.Tensor, "torch.Tensor | None"]  # (mean, variance); variance None: deterministic

SUPPORTED_MODULES = (
    "nn.Sequential, BayesLinear, BayesConv1d/2d/3d (MeanField, KTied or Delta families), nn.Linear, nn.Conv1d/2d/3d, "
    "nn.ReLU, nn.MaxPool1d/2d (no padding, dilation 1), nn.AvgPool1d/2d (no padding), nn.AdaptiveAvgPool2d(1), "
    "nn.BatchNorm1d/2d (running statistics), nn.Flatten, nn.Dropout, nn.Identity, TemperatureScaled"
)
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def _normal_pdf(a: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * a * a) / _SQRT_2PI


def gaussian_max_moments(
    m1: torch.Tensor, v1: torch.Tensor, m2: torch.Tensor, v2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``max(X1, X2)`` for independent ``X1 ~ N(m1, v1)``, ``X2 ~ N(m2, v2)`` (Clark 1961).

    With ``theta = sqrt(v1 + v2)``, ``a = (m1 - m2) / theta``: ``E = m1 Phi(a) + m2 Phi(-a) + theta phi(a)`` and
    ``Var = v1 Phi(a) + v2 Phi(-a) + theta^2 [a^2 Phi(a) Phi(-a) + a phi(a) (Phi(-a) - Phi(a)) - phi(a)^2]``, the
    variance written without the ``E[max^2] - E^2`` difference, which cancels catastrophically in float32 when
    ``|m1 - m2| >> theta``. Exact (``max`` of the means, variance 0) where both variances are 0. Half-precision inputs
    are computed in float32 and the results cast back.
    """
    if m1.dtype in (torch.float16, torch.bfloat16):  # half's tiny (6e-5) would floor theta at 0.008: work in float32
        mean, var = gaussian_max_moments(m1.float(), v1.float(), m2.float(), v2.float())
        return mean.to(m1.dtype), var.to(m1.dtype)
    theta2 = v1 + v2
    theta = theta2.clamp_min(torch.finfo(theta2.dtype).tiny).sqrt()
    a = (m1 - m2) / theta
    cdf, cdf_c, pdf = torch.special.ndtr(a), torch.special.ndtr(-a), _normal_pdf(a)
    mean = m1 * cdf + m2 * cdf_c + theta * pdf
    bracket = a * a * cdf * cdf_c + a * pdf * (cdf_c - cdf) - pdf * pdf
    variance = (v1 * cdf + v2 * cdf_c + theta2 * bracket).clamp_min(0.0)
    exact = theta2 <= 0
    if bool(exact.any()):
        mean = torch.where(exact, torch.maximum(m1, m2), mean)
        variance = torch.where(exact, torch.zeros_like(variance), variance)
    return mean, variance


def relu_moments(mean: torch.Tensor, variance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of ``ReLU(Z)``, ``Z ~ N(mean, variance)`` (the rectified Gaussian): :func:`gaussian_max_moments`
    with ``X2 = 0``."""
    zero = torch.zeros_like(mean)
    return gaussian_max_moments(mean, variance, zero, zero)


def _independent_moments(family: VariationalFamily, owner: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mean, variance) of a tensor whose elements are independent; variance None for a point mass (Delta)."""
    if family.point_mass and family.independent_elements:  # Delta: no variance to carry
        return family.moments()[0], None
    if family.independent_elements:  # MeanField, KTied (VariationalFamily.independent_elements)
        return family.moments()
    raise TypeError(
        f"propagate_moments: {owner} has a {type(family).__name__} posterior, whose elements are not independent "
        "(the moment propagation needs MeanField, KTied or Delta families); predict it with Monte Carlo draws "
        "(varbnn.predict)"
    )


def _family(layer: _WeightOpLayer, name: str) -> VariationalFamily:
    return cast(VariationalFamily, layer.posteriors[name])


def _weight_layer(layer: _WeightOpLayer, mean: torch.Tensor, var: torch.Tensor | None) -> _Moments:
    name = type(layer).__name__
    if not isinstance(layer, (BayesLinear, BayesConv1d, BayesConv2d, BayesConv3d)):
        raise TypeError(f"propagate_moments: {name} is not supported; supported modules: {SUPPORTED_MODULES}")
    if layer.sample_mode != "sample":  # sample_mode(model, "mean" / "mode"): the layer runs with point estimates
        weight = _family(layer, "weight").weight(layer.sample_mode)
        return layer(mean), (None if var is None else layer._op(var, weight.square(), None))
    op = layer._op
    w_mean, w_var = _independent_moments(_family(layer, "weight"), name)
    b_mean = b_var = None
    if "bias" in layer.posteriors:
        b_mean, b_var = _independent_moments(_family(layer, "bias"), f"{name}'s bias")
    out_mean = op(mean, w_mean, b_mean)
    terms = []
    if var is not None:
        terms.append(op(var, w_mean.square(), None))
    if w_var is not None:
        second = mean.square() if var is None else mean.square() + var
        terms.append(op(second, w_var, None))
    if b_var is not None:
        terms.append(op.add_bias(torch.zeros_like(out_mean), b_var))
    if not terms:
        return out_mean, None
    out_var = terms[0]
    for term in terms[1:]:
        out_var = out_var + term
    return out_mean, out_var


def _plain_weight_layer(
    layer: nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d, mean: torch.Tensor, var: torch.Tensor | None
) -> _Moments:
    out = layer(mean)
    if var is None:
        return out, None
    weight = layer.weight.square()
    if isinstance(layer, nn.Linear):
        return out, F.linear(var, weight)
    return out, layer._conv_forward(var, weight, None)  # padding of the variance as of the mean (any padding_mode)


def _max_pool(layer: nn.Module, mean: torch.Tensor, var: torch.Tensor | None) -> _Moments:
    if var is None:
        return layer(mean), None
    dims = 2 if isinstance(layer, nn.MaxPool2d) else 1
    kernel = nn.modules.utils._ntuple(dims)(layer.kernel_size)  # type: ignore[attr-defined]
    stride = nn.modules.utils._ntuple(dims)(layer.stride if layer.stride is not None else layer.kernel_size)  # type: ignore[attr-defined]
    padding = nn.modules.utils._ntuple(dims)(layer.padding)  # type: ignore[attr-defined]
    dilation = nn.modules.utils._ntuple(dims)(layer.dilation)  # type: ignore[attr-defined]
    if any(padding) or any(d != 1 for d in dilation) or layer.ceil_mode or layer.return_indices:
        raise TypeError(
            f"propagate_moments: {type(layer).__name__} is supported with padding=0, dilation=1, ceil_mode=False and "
            f"return_indices=False only, got {layer!r}"
        )
    m, v, first = mean, var, mean.dim() - dims
    for axis in range(dims):  # windows: one trailing axis per pooled dimension
        dim = first + axis
        m, v = m.unfold(dim, kernel[axis], stride[axis]), v.unfold(dim, kernel[axis], stride[axis])
    m, v = m.flatten(-dims), v.flatten(-dims)
    out_m, out_v = m[..., 0], v[..., 0]
    for k in range(1, m.shape[-1]):
        out_m, out_v = gaussian_max_moments(out_m, out_v, m[..., k], v[..., k])
    return out_m.contiguous(), out_v.contiguous()


def _avg_pool(layer: nn.Module, mean: torch.Tensor, var: torch.Tensor | None) -> _Moments:
    out = layer(mean)
    if var is None:
        return out, None
    if isinstance(layer, nn.AdaptiveAvgPool2d):
        size = nn.modules.utils._pair(layer.output_size)  # type: ignore[attr-defined]
        if size != (1, 1):
            raise TypeError(f"propagate_moments: AdaptiveAvgPool2d is supported with output_size 1 only, got {layer!r}")
        count = var.shape[-1] * var.shape[-2]
        return out, var.sum(dim=(-2, -1), keepdim=True) / count**2
    dims = 2 if isinstance(layer, nn.AvgPool2d) else 1
    padding = nn.modules.utils._ntuple(dims)(layer.padding)  # type: ignore[attr-defined]
    if any(padding) or layer.ceil_mode or getattr(layer, "divisor_override", None) is not None:
        raise TypeError(
            f"propagate_moments: {type(layer).__name__} is supported with padding=0, ceil_mode=False and no "
            f"divisor_override only, got {layer!r}"
        )
    count = math.prod(nn.modules.utils._ntuple(dims)(layer.kernel_size))  # type: ignore[attr-defined]
    return out, layer(var) / count  # mean of the window's variances / count = sum of them / count^2


def _batch_norm(layer: nn.modules.batchnorm._BatchNorm, mean: torch.Tensor, var: torch.Tensor | None) -> _Moments:
    if layer.running_var is None:
        raise TypeError(
            f"propagate_moments: {type(layer).__name__} without running statistics (track_running_stats=False) is not supported"
        )
    out = F.batch_norm(mean, layer.running_mean, layer.running_var, layer.weight, layer.bias, False, 0.0, layer.eps)
    if var is None:
        return out, None
    scale = torch.rsqrt(layer.running_var + layer.eps)
    if layer.weight is not None:
        scale = scale * layer.weight
    shape = (1, -1) + (1,) * (var.dim() - 2)
    return out, var * scale.square().view(shape)


def propagate(module: nn.Module, mean: torch.Tensor, var: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One module's output moments from its input's: ``(mean, variance)``, the variance ``None`` for a deterministic
    value (the building block of :func:`propagate_moments`, for a module's own ``moment_forward``). A module that
    defines ``moment_forward(mean, var)`` (and optionally ``moment_support()``, returning ``None`` or the reason it
    cannot be followed) is followed by its own rule: :class:`varbnn.calibration.TemperatureScaled` divides by ``T``."""
    if isinstance(module, nn.Sequential):
        for child in module:
            mean, var = propagate(child, mean, var)
        return mean, var
    own = getattr(module, "moment_forward", None)
    if callable(own):
        reason = moment_support(module)
        if reason is not None:
            raise TypeError(f"propagate_moments: {reason}; supported modules: {SUPPORTED_MODULES}")
        result: tuple[torch.Tensor, torch.Tensor | None] = own(mean, var)
        return result
    if isinstance(module, _WeightOpLayer):
        return _weight_layer(module, mean, var)
    kind = type(module)
    if kind in (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d):
        return _plain_weight_layer(module, mean, var)  # type: ignore[arg-type]
    if kind is nn.ReLU:
        return (F.relu(mean), None) if var is None else relu_moments(mean, var)
    if kind in (nn.MaxPool1d, nn.MaxPool2d):
        return _max_pool(module, mean, var)
    if kind in (nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool2d):
        return _avg_pool(module, mean, var)
    if kind in (nn.BatchNorm1d, nn.BatchNorm2d):
        return _batch_norm(module, mean, var)  # type: ignore[arg-type]
    if kind is nn.Flatten:
        return module(mean), (None if var is None else module(var))
    if kind in (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d):
        return mean, var  # dropout is off at prediction (eval mode); MC dropout is not a Gaussian posterior
    raise TypeError(
        f"propagate_moments: {kind.__name__} is not supported (a custom module's forward cannot be followed); "
        f"supported modules: {SUPPORTED_MODULES}"
    )


def moment_support(model: nn.Module) -> str | None:
    """Why :func:`propagate_moments` cannot follow ``model`` (the first unsupported module or family, as its error
    would say), or ``None`` when it can. A structural check: nothing runs."""
    if isinstance(model, nn.Sequential):
        for child in model:
            reason = moment_support(child)
            if reason is not None:
                return reason
        return None
    if callable(getattr(model, "moment_forward", None)):  # the module's own rule (e.g. TemperatureScaled)
        own = getattr(model, "moment_support", None)
        return own() if callable(own) else None
    if isinstance(model, _WeightOpLayer):
        if not isinstance(model, (BayesLinear, BayesConv1d, BayesConv2d, BayesConv3d)):
            return f"{type(model).__name__} is not supported"
        for name, family in model.posteriors.items():
            if not getattr(family, "independent_elements", False):
                return (
                    f"{type(model).__name__}'s {name} has a {type(family).__name__} posterior, whose elements are not independent"
                )
        return None
    kind = type(model)
    if kind in (nn.MaxPool1d, nn.MaxPool2d):
        if any(nn.modules.utils._ntuple(1)(model.padding)) or model.ceil_mode or model.return_indices:  # type: ignore[attr-defined]
            return f"{kind.__name__} with padding, ceil_mode or return_indices is not supported"
        if any(d != 1 for d in nn.modules.utils._ntuple(1)(model.dilation)):  # type: ignore[attr-defined]
            return f"{kind.__name__} with dilation is not supported"
        return None
    if kind in (nn.AvgPool1d, nn.AvgPool2d):
        if any(nn.modules.utils._ntuple(1)(model.padding)) or model.ceil_mode or getattr(model, "divisor_override", None):  # type: ignore[attr-defined]
            return f"{kind.__name__} with padding, ceil_mode or divisor_override is not supported"
        return None
    if kind is nn.AdaptiveAvgPool2d and nn.modules.utils._pair(model.output_size) != (1, 1):  # type: ignore[attr-defined]
        return "AdaptiveAvgPool2d with an output size other than 1 is not supported"
    if kind in (nn.BatchNorm1d, nn.BatchNorm2d) and model.running_var is None:
        return f"{kind.__name__} without running statistics is not supported"
    if kind in _FOLLOWED:
        return None
    return f"{kind.__name__} is not supported"


_FOLLOWED = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ReLU, nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d,
    nn.AdaptiveAvgPool2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.Flatten, nn.Identity, nn.Dropout, nn.Dropout1d,
    nn.Dropout2d, nn.Dropout3d,
)  # fmt: skip


@torch.no_grad()
def propagate_moments(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise mean and variance of ``model(x)`` under the posterior, in one pass (see the module docstring).

    :param model: an ``nn.Sequential`` chain of the supported modules (:data:`SUPPORTED_MODULES`).
    :param x: inputs ``[N, ...]``, finite, in the model's dtype and device (deterministic: variance 0).
    :returns: ``(mean, variance)``, each of the shape of ``model(x)``; the variance is exactly 0 for a network without
        random weights (a Delta posterior, a plain network).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"propagate_moments: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"propagate_moments: x must be a torch.Tensor, got {type(x).__name__}")
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise ValueError("propagate_moments: x contains NaN or infinite values")
    mean, var = propagate(model, x, None)
    return mean, (torch.zeros_like(mean) if var is None else var)


class MomentPredictive(nn.Module):
    """``model``'s predictive from one moment-propagation pass (:func:`propagate_moments`): :func:`varbnn.predict`
    returns ``samples`` draws of the outputs from ``N(mean, variance)`` (independent per output unit), at the cost of
    one pass of roughly three times a plain network's arithmetic plus the draws of the outputs only.

    ``predict(MomentPredictive(model), x, samples=64)`` is the single-pass counterpart of ``predict(model, x,
    samples=64)``; wrap it in :class:`~varbnn.calibration.TemperatureScaled` to fit a temperature to this predictive.
    ``forward`` returns one draw (so the wrapper behaves as a stochastic network wherever one is expected); the mean
    output is ``propagate_moments(wrapper.model, x)[0]``. The wrapper holds no parameters of its own: its state
    dict is ``model``'s under the prefix ``model.``.

    :param model: a network :func:`propagate_moments` supports (checked on the first call; a ``TypeError`` names
        the first unsupported module).
    """

    _varbnn_samples_at_prediction = True  # predict's _is_stochastic: a temperature is fitted with several draws

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"MomentPredictive: model must be an nn.Module, got {type(model).__name__}")
        self.model = model

    def predictive_draws(self, x: torch.Tensor, samples: int) -> torch.Tensor:
        """``samples`` draws ``[S, *output.shape]`` from the Gaussian with the propagated mean and variance (the hook
        :func:`varbnn.predict` calls)."""
        mean, var = propagate_moments(self.model, x)
        eps = torch.randn((samples, *mean.shape), dtype=mean.dtype, device=mean.device)
        return torch.addcmul(mean.expand_as(eps), var.sqrt().expand_as(eps), eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictive_draws(x, 1)[0]
