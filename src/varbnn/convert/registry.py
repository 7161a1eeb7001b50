"""The registries behind :func:`bayesianize` and :func:`to_deterministic`, looked up along a module type's MRO.

Which plain type becomes which Bayesian layer (:func:`register_converter`), which Bayesian type goes back to which
plain one (:func:`register_deterministic`), and which types are left as they are, with the reason the report shows
(:func:`register_left_deterministic`; the normalisation layers are registered here). :class:`ConversionContext` is
what a converter gets besides the module. The built-in converters are in :mod:`~varbnn.convert.converters`, the
built-in deterministic forms in :mod:`~varbnn.convert.to_plain`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from varbnn.families.base import VariationalFamily
from varbnn.priors import PriorSpec


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

    def refuse(self, what: str) -> NotImplementedError:
        """The error for an option of a convertible type that has no Bayesian form, with the way out."""
        where = repr(self.name) if self.name else "the model"
        hint = f"; pass exclude=[{self.name!r}] to keep it deterministic" if self.name else ""
        return NotImplementedError(f"{where}: {what}{hint}")


Converter = Callable[[nn.Module, ConversionContext], nn.Module]
Determinizer = Callable[[nn.Module, str], nn.Module]
_CONVERTERS: dict[type[nn.Module], Converter] = {}
_DETERMINIZERS: dict[type[nn.Module], Determinizer] = {}
_LEFT: dict[type[nn.Module], tuple[str, bool]] = {}


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


def register_left_deterministic(module_type: type[nn.Module], reason: str, *, warn: bool = False) -> None:
    """Make ``bayesianize`` leave instances of ``module_type`` (and subclasses) as they are, without looking inside.

    They are listed in the :class:`ConversionReport` with ``reason``; ``warn=True`` also names them in the
    :class:`ConversionWarning` (and ``strict=True`` refuses them), for types left deterministic because no Bayesian
    form exists rather than by design.
    """
    if not (isinstance(module_type, type) and issubclass(module_type, nn.Module)):
        raise TypeError(f"module_type must be an nn.Module subclass, got {module_type!r}")
    if not isinstance(reason, str) or not reason:
        raise ValueError(f"reason must be a non-empty string, got {reason!r}")
    _LEFT[module_type] = (reason, bool(warn))


NORMALISATION = "normalisation layer (deterministic by design)"
EXCLUDED = "excluded by the user"
NO_BAYESIAN_FORM = "no Bayesian form registered"
_NOT_CONVERTED = "not converted (a Bayesian form is registered; excluded by the user?)"
FROZEN = "frozen, left deterministic (requires_grad=False on all its parameters)"
_PARTLY_FROZEN = "partly frozen: {names} requires_grad=False; left deterministic as it was (frozen='convert' converts it)"
_OWN_FORWARD = "subclass of {base} with its own {method}; a Bayes layer would drop it"
_OTHER_PARAMETERS = "{base} with parameters {names}{missing} (weight_norm or spectral_norm?); a Bayes layer would drop them"
_PARAMETRIZED = "parametrized: {names} computed by torch.nn.utils.parametrize; a Bayes layer would drop it"
_TIED = "weight tying: {pairs}; left deterministic so the tie holds"

for _norm in (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", None)):
    if _norm is not None:
        register_left_deterministic(_norm, NORMALISATION)
# nn.MultiheadAttention has a converter (converters.py); the transformer layers and stacks are walked into like any
# container, and their eval-mode fast paths are switched off where they hold a Bayesian module (fastpath.py).


def _lookup(registry: dict[type[nn.Module], Any], module: nn.Module) -> Any:
    return _lookup_class(registry, module)[1]


def _lookup_class(registry: dict[type[nn.Module], Any], module: nn.Module) -> tuple[type[nn.Module] | None, Any]:
    """The registered class that ``module``'s type inherits from first (walking its MRO), and its registry entry."""
    for cls in type(module).__mro__:
        if cls in registry:
            return cls, registry[cls]
    return None, None
