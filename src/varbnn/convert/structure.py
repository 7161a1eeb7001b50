"""What a model's structure says before it is converted.

Modules used at several places (their names; the pins of a module that also sits inside a subtree left as it is; the
warning when a registered converter splits one), parameters tied between modules (left deterministic so the tie
holds), and convertible modules that a Bayesian layer would not reproduce (a subclass with its own ``forward``,
parametrizations, parameters other than its type's, submodules).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn
from torch.nn.utils import parametrize

from varbnn.convert.registry import _OTHER_PARAMETERS, _OWN_FORWARD, _PARAMETRIZED, EXCLUDED, FROZEN
from varbnn.convert.report import ConversionWarning

# Plain parameter names of the built-in convertible types (a module of these types with other parameters or without its
# weight carries something their converters would drop, e.g. the deprecated weight_norm's weight_g and weight_v).
_BUILTIN_PARAMETERS: dict[type[nn.Module], tuple[str, ...]] = {
    nn.Linear: ("weight", "bias"),
    nn.Conv1d: ("weight", "bias"),
    nn.Conv2d: ("weight", "bias"),
    nn.Conv3d: ("weight", "bias"),
    nn.Embedding: ("weight",),
}
# The methods whose override by a subclass changes what a registered type computes (a converter would drop them).
_BEHAVIOUR_METHODS = ("forward", "_conv_forward")


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _structure_problem(module: nn.Module, registered: type[nn.Module]) -> tuple[str, bool] | None:
    """Why a module of a convertible type cannot become its Bayesian form without changing what it computes, and
    whether to leave it whole (``True``) or only its own parameters (its children are then still visited); ``None``
    when converting it is faithful."""
    if parametrize.is_parametrized(module):
        names = _quoted(getattr(module, "parametrizations").keys())  # noqa: B009  (a ModuleDict torch adds)
        return _PARAMETRIZED.format(names=names), True
    if type(module) is not registered:
        for method in _BEHAVIOUR_METHODS:
            own = getattr(type(module), method, None)
            if own is not None and own is not getattr(registered, method, None):
                return _OWN_FORWARD.format(base=registered.__name__, method=method), False
    if registered is nn.MultiheadAttention:
        return _attention_problem(module)
    if registered in (nn.LSTM, nn.GRU):
        expected: tuple[str, ...] | None = tuple(module._flat_weights_names)  # type: ignore[arg-type]
    else:
        expected = _BUILTIN_PARAMETERS.get(registered)
    if expected is None:
        return None
    other = [n for n, p in module._parameters.items() if p is not None and n not in expected]
    missing = [n for n in expected[:1] if n not in module._parameters]  # the weight (a bias may be None)
    if other or missing:
        absent = f" and no {_quoted(missing)}" if missing else ""
        return _OTHER_PARAMETERS.format(base=registered.__name__, names=_quoted(other) or "none", missing=absent), False
    if module._modules:
        return f"{registered.__name__} with submodules {_quoted(module._modules)}; a Bayes layer would drop them", False
    return None


_ATTENTION_PARAMETERS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k", "bias_v")


def _attention_problem(module: nn.Module) -> tuple[str, bool] | None:
    """Why an ``nn.MultiheadAttention`` cannot become a ``BayesMultiheadAttention`` as it is (its ``forward`` reads
    ``out_proj.weight`` and ``out_proj.bias`` as tensors, so ``out_proj`` must be a plain ``nn.Linear``); ``None``
    when it can. Such an attention is left whole."""
    other = [n for n, p in module._parameters.items() if p is not None and n not in _ATTENTION_PARAMETERS]
    if other:
        return _OTHER_PARAMETERS.format(base="MultiheadAttention", names=_quoted(other), missing=""), True
    extra = [n for n in module._modules if n != "out_proj"]
    out_proj = module._modules.get("out_proj")
    if extra or not isinstance(out_proj, nn.Linear):
        return f"MultiheadAttention with submodules {_quoted(module._modules)}; a Bayes attention would drop them", True
    if parametrize.is_parametrized(out_proj):
        names = _quoted(getattr(out_proj, "parametrizations").keys())  # noqa: B009  (a ModuleDict torch adds)
        return _PARAMETRIZED.format(names=f"out_proj {names}"), True
    if out_proj._modules or [n for n, p in out_proj._parameters.items() if p is not None and n not in ("weight", "bias")]:
        return "MultiheadAttention whose out_proj has other parameters or submodules; a Bayes attention would drop them", True
    return None


def _tied_parameters(model: nn.Module) -> dict[int, str]:
    """``id(module) -> "'weight' is 'emb.weight'"`` for every module that shares a parameter object with another
    module (weight tying, e.g. ``decoder.weight = embedding.weight``)."""
    owners: dict[int, list[tuple[str, str, int]]] = {}
    for module_name, module in model.named_modules():
        for parameter_name, parameter in module._parameters.items():
            if parameter is not None:
                owners.setdefault(id(parameter), []).append((module_name, parameter_name, id(module)))
    ties: dict[int, list[str]] = {}
    for entries in owners.values():
        if len({key for _, _, key in entries}) < 2:
            continue
        for _, parameter_name, key in entries:
            others = [f"{m}.{p}" if m else p for m, p, other in entries if other != key]
            ties.setdefault(key, []).append(f"{parameter_name!r} is {_quoted(others)}")
    return {key: "; ".join(pairs) for key, pairs in ties.items()}


def _places(model: nn.Module) -> dict[int, list[str]]:
    """``id(module) -> every qualified name it has`` (a module used twice has two)."""
    places: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        places.setdefault(id(module), []).append(name)
    return places


@dataclass(frozen=True)
class _Pin:
    """A module that sits inside a subtree left as it is (excluded, frozen, a module left whole ...) and at another place too:
    it stays as it is at that place as well, so that it remains one object."""

    module: nn.Module
    inner: str  # one of its places inside the subtree
    holder: str  # the place of the subtree left as it is
    holder_reason: str
    deliberate: bool

    def reason(self) -> str:
        if self.holder_reason == FROZEN:  # its parameters are the frozen subtree's: frozen too
            return FROZEN
        inside = f"one object with {self.inner!r}, inside {self.holder or '(model)'!r}"
        if self.holder_reason == EXCLUDED:
            return f"{EXCLUDED}: {inside}, which is excluded; left as it is at all its places"
        return f"{inside}, which is left whole ({self.holder_reason}); left as it is at all its places"


def _warn_split_by_converters(
    replaced: dict[int, tuple[nn.Module, str, nn.Module, str]], aliases: dict[int, list[str]], pins: dict[int, _Pin]
) -> None:
    """One :class:`ConversionWarning` for modules that sat inside a module converted as a whole (by a registered
    converter of a type with submodules) and at another place too: the converter made what it made of them, the
    other place got its own treatment, so they are no longer one object (two posteriors for what was one weight). A
    converted module that was pinned (left as it is, see :class:`_Pin`) was not converted: nothing split there."""
    split = []
    for module, inner, converted, holder in replaced.values():
        if id(converted) in pins:
            continue
        holders = aliases.get(id(converted), [holder])
        if "" in holders:  # the model itself was converted: nothing is outside it
            continue
        inside = tuple(f"{h}." for h in holders)
        outer = [p for p in aliases.get(id(module), []) if not p.startswith(inside)]
        if outer:
            split.append(f"{outer[0]!r} (also {inner!r} inside {holder!r})")
    if split:
        warnings.warn(
            f"bayesianize: {len(split)} modules used at several places sat inside a module that a registered converter "
            f"replaced as a whole, and their other place got its own treatment: {', '.join(split[:3])}"
            f"{', ...' if len(split) > 3 else ''}. They are no longer one object (e.g. two posteriors for what was one "
            "weight). Exclude the converted module to keep it and them plain and shared, or give the other place a copy "
            "of its own before bayesianize.",
            ConversionWarning,
            stacklevel=3,
        )
