"""Turn a plain model into a Bayesian one and back, by a registry of module types.

``bayesianize`` dispatches on the module's type (walking its MRO), never on class-name strings, and
returns a NEW model; the input is not modified. Register your own layer types with
:func:`register_converter` and :func:`register_deterministic`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from varbnn.families.base import VariationalFamily
from varbnn.families.gaussian import MeanField
from varbnn.nn.base import BayesianModule
from varbnn.nn.layers import BayesConv2d, BayesLinear, BayesLSTM
from varbnn.priors import Normal, Prior, PriorSpec

__all__ = [
    "bayesianize",
    "to_deterministic",
    "register_converter",
    "register_deterministic",
    "ConversionContext",
]

M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class ConversionContext:
    """What a converter needs besides the module: specs, priors (already resolved for this module), and
    whether to copy the plain weights into the posterior means."""

    name: str
    family: VariationalFamily
    bias_family: VariationalFamily | None
    prior: PriorSpec | None
    bias_prior: PriorSpec | None
    pretrained: bool

    def layer_kwargs(self) -> dict[str, Any]:
        """The keyword arguments every Bayesian layer takes: families and priors of weight and bias."""
        return {"family": self.family, "prior": self.prior, "bias_family": self.bias_family, "bias_prior": self.bias_prior}


Converter = Callable[[nn.Module, ConversionContext], nn.Module]
Determinizer = Callable[[nn.Module, str], nn.Module]
_CONVERTERS: dict[type[nn.Module], Converter] = {}
_DETERMINIZERS: dict[type[nn.Module], Determinizer] = {}


def register_converter(module_type: type[nn.Module]) -> Callable[[Converter], Converter]:
    """Decorator: ``fn(module, ctx) -> BayesianModule`` converts instances of ``module_type`` (and subclasses)."""

    def decorator(fn: Converter) -> Converter:
        _CONVERTERS[module_type] = fn
        return fn

    return decorator


def register_deterministic(module_type: type[nn.Module]) -> Callable[[Determinizer], Determinizer]:
    """Decorator: ``fn(bayes_module, "mean" | "mode") -> plain module`` for :func:`to_deterministic`."""

    def decorator(fn: Determinizer) -> Determinizer:
        _DETERMINIZERS[module_type] = fn
        return fn

    return decorator


def _lookup(registry: dict[type[nn.Module], Callable], module: nn.Module) -> Callable | None:  # type: ignore[type-arg]
    for cls in type(module).__mro__:
        if cls in registry:
            return registry[cls]
    return None


def _weights(module: nn.Module, names: Iterable[str], pretrained: bool) -> dict[str, torch.Tensor]:
    if not pretrained:
        return {}
    return {n: getattr(module, n).detach().clone() for n in names if getattr(module, n, None) is not None}


@register_converter(nn.Linear)
def _linear(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, nn.Linear)
    init = _weights(module, ("weight", "bias"), ctx.pretrained)
    return BayesLinear(
        module.in_features, module.out_features, module.bias is not None,
        init_weight=init.get("weight"), init_bias=init.get("bias"), **ctx.layer_kwargs(),
    )  # fmt: skip


@register_converter(nn.Conv2d)
def _conv2d(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, nn.Conv2d)
    if module.padding_mode != "zeros":
        raise NotImplementedError(f"{ctx.name}: Conv2d padding_mode={module.padding_mode!r} is not supported (only 'zeros')")
    init = _weights(module, ("weight", "bias"), ctx.pretrained)
    return BayesConv2d(
        module.in_channels, module.out_channels, module.kernel_size, module.stride, module.padding,  # type: ignore[arg-type]
        module.dilation, module.groups, module.bias is not None,  # type: ignore[arg-type]
        init_weight=init.get("weight"), init_bias=init.get("bias"), **ctx.layer_kwargs(),
    )  # fmt: skip


@register_converter(nn.LSTM)
def _lstm(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, nn.LSTM)
    if module.bidirectional or module.proj_size:
        raise NotImplementedError(f"{ctx.name}: bidirectional LSTMs and proj_size > 0 are not supported by BayesLSTM")
    names = [n for n, _ in module.named_parameters()]
    return BayesLSTM(
        module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first, module.dropout,
        init=_weights(module, names, ctx.pretrained), **ctx.layer_kwargs(),
    )  # fmt: skip


def _prefixed(prior: PriorSpec | None, prefix: str) -> PriorSpec | None:
    if prior is None or isinstance(prior, Prior):
        return prior
    return lambda tensor_name: prior(f"{prefix}.{tensor_name}")  # type: ignore[misc, operator]


def bayesianize(
    model: nn.Module,
    family: VariationalFamily | None = None,
    prior: PriorSpec | None = None,
    *,
    bias_family: VariationalFamily | None = None,
    bias_prior: PriorSpec | None = None,
    exclude: Iterable[str | type[nn.Module]] = (),
    pretrained: bool = False,
) -> nn.Module:
    """A NEW model in which every registered layer (Linear, Conv2d, LSTM, ...) is Bayesian.

    Args:
        model: the plain model; it is deep-copied, never modified.
        family: posterior spec (default ``MeanField()``), built once per tensor.
        prior: one ``Prior`` shared by all tensors (an adaptive one then pools them all, as in Graves 2011),
            or a callable ``qualified_tensor_name -> Prior`` (e.g. ``"0.weight"``) for one prior each.
            Default: one shared ``Normal(0, 1)``.
        bias_family, bias_prior: for bias tensors; default to ``family`` and ``prior``.
        exclude: qualified module names (as in ``named_modules``) or module types to leave unchanged.
        pretrained: copy the plain weights into the posterior means (otherwise He-initialised means).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    family = family if family is not None else MeanField()
    prior = prior if prior is not None else Normal(0.0, 1.0)
    excluded_names = {e for e in exclude if isinstance(e, str)}
    excluded_types = tuple(e for e in exclude if isinstance(e, type))
    new = copy.deepcopy(model)
    if isinstance(new, BayesianModule):
        return new

    def convert(parent: nn.Module, prefix: str) -> None:
        for child_name, child in list(parent.named_children()):
            name = f"{prefix}.{child_name}" if prefix else child_name
            if name in excluded_names or (excluded_types and isinstance(child, excluded_types)):
                continue
            if isinstance(child, BayesianModule):
                continue
            converter = _lookup(_CONVERTERS, child)
            if converter is None:
                convert(child, name)
                continue
            ctx = ConversionContext(
                name,
                family,
                bias_family,
                _prefixed(prior, name),
                _prefixed(bias_prior, name),
                pretrained,
            )
            setattr(parent, child_name, converter(child, ctx))

    root_converter = _lookup(_CONVERTERS, new)
    if root_converter is not None and not isinstance(new, excluded_types):
        ctx = ConversionContext("", family, bias_family, prior, bias_prior, pretrained)
        return root_converter(new, ctx)
    convert(new, "")
    return new


@register_deterministic(BayesLinear)
def _det_linear(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, BayesLinear)
    plain = nn.Linear(module.in_features, module.out_features, "bias" in module.posteriors)
    _copy_point(module, plain, mode)
    return plain


@register_deterministic(BayesConv2d)
def _det_conv(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, BayesConv2d)
    plain = nn.Conv2d(
        module.in_channels,
        module.out_channels,
        module.kernel_size,
        module.stride,
        module.padding,  # type: ignore[arg-type]
        module.dilation,
        module.groups,
        "bias" in module.posteriors,
    )
    _copy_point(module, plain, mode)
    return plain


@register_deterministic(BayesLSTM)
def _det_lstm(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, BayesLSTM)
    plain = nn.LSTM(module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first, module.dropout)
    _copy_point(module, plain, mode)
    return plain


def _copy_point(bayes: BayesianModule, plain: nn.Module, mode: str) -> None:
    reference = next(bayes.parameters())
    plain.to(device=reference.device, dtype=reference.dtype)
    with torch.no_grad():
        for name, posterior, _ in bayes.bayesian_tensors():
            point = posterior.mean if mode == "mean" else posterior.mode
            getattr(plain, name).copy_(point)


def to_deterministic(model: nn.Module, mode: str = "mean") -> nn.Module:
    """A NEW plain model whose weights are the posterior ``"mean"`` or ``"mode"`` of each Bayesian layer."""
    if mode not in ("mean", "mode"):
        raise ValueError(f"mode must be 'mean' or 'mode', got {mode!r}")
    new = copy.deepcopy(model)
    root = _lookup(_DETERMINIZERS, new)
    if root is not None:
        return root(new, mode)

    def convert(parent: nn.Module) -> None:
        for child_name, child in list(parent.named_children()):
            fn = _lookup(_DETERMINIZERS, child)
            if fn is None:
                convert(child)
            else:
                setattr(parent, child_name, fn(child, mode))

    convert(new)
    leftover = [n for n, m in new.named_modules() if isinstance(m, BayesianModule)]
    if leftover:
        raise NotImplementedError(f"no deterministic form registered for Bayesian modules {leftover}")
    return new
