"""Turn a plain model into a Bayesian one and back, by a registry of module types.

``bayesianize`` dispatches on the module's type (walking its MRO), never on class-name strings, and
returns a NEW model; the input is not modified. Register your own layer types with
:func:`register_converter` and :func:`register_deterministic`, and types to leave alone on purpose with
:func:`register_left_deterministic`.

What happens to each module type:

* converted: ``nn.Linear``, ``nn.Conv1d``/``Conv2d``/``Conv3d`` (zero padding), ``nn.Embedding`` (no ``max_norm``, no
  ``sparse``), ``nn.LSTM`` and ``nn.GRU`` (unidirectional, no projections). An unsupported option of these types
  is refused with a ``NotImplementedError`` that names the module (``exclude`` it to keep it deterministic).
* left deterministic by design, silently: normalisation layers (``BatchNorm*``, ``SyncBatchNorm``, ``InstanceNorm*``,
  ``LayerNorm``, ``GroupNorm``, ``RMSNorm``): their affine parameters are few, act on normalised activations, and
  batch norm's running statistics are not weights one can put a posterior on; and whatever the user excludes. (A
  batch norm with running statistics AFTER a Bayesian layer gets one :class:`ConversionWarning`: its statistics
  average over weight draws, so each sampled network is normalised with statistics that are not its own.)
* left deterministic and reported with a :class:`ConversionWarning` (an error under ``strict=True``):
  ``nn.MultiheadAttention`` (not walked into: its packed projections are read by ``F.multi_head_attention_forward``,
  so swapping its ``out_proj`` would break its forward), ``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder``
  as a whole (they contain it, and their eval-mode fast path reads the weights of their ``Linear`` layers directly;
  ``nn.TransformerDecoderLayer`` has no such path: its ``Linear`` layers are converted, its attention reported), and
  any other module that owns parameters and has no registered Bayesian form (e.g. ``nn.Bilinear``,
  ``nn.EmbeddingBag``, ``nn.ConvTranspose2d``, ``nn.RNN``, ``nn.PReLU``, a custom module's own ``nn.Parameter``).
  The children of the last kind are still converted. Also left deterministic and reported, because converting them
  would silently change what they compute: a subclass of a convertible type that overrides ``forward`` (or
  ``_conv_forward``), a convertible module with parametrizations (``torch.nn.utils.parametrize``, e.g.
  ``parametrizations.weight_norm``) or with other parameters than its type's (the deprecated ``weight_norm`` /
  ``spectral_norm``), a module whose parameter is TIED to another module's (``decoder.weight = embedding.weight``:
  each tied module stays deterministic, so the tie holds), and a PARTLY frozen module (some parameters with
  ``requires_grad=False``).
* frozen modules (every parameter ``requires_grad=False``) are left deterministic and frozen by default, listed in the
  report (``"frozen, left deterministic ..."``), without a warning; ``frozen="convert"`` converts them (and partly
  frozen ones) like the others, with trainable variational parameters.
* a module object used at several places (``nn.Sequential(lin, nn.ReLU(), lin)``) becomes ONE Bayesian module used at
  the same places: one posterior and one KL term, as the plain network had one weight; its report row lists the other
  places in ``also_at``. Each call of a Bayesian layer draws its own weights, so the two uses see two draws of that
  one posterior within a forward pass (as with local reparameterization anyway). Excluding any one name of a shared
  module excludes it everywhere, and so does excluding a PARENT (by name or type) at one of its places: a module that
  sits inside a subtree left as it is (excluded, frozen, ``nn.MultiheadAttention``, a transformer encoder layer, a
  module that is Bayesian already) at one place stays as it is at all its places, one plain object; its report row
  names the subtree (deliberate when that subtree is excluded or frozen, warned otherwise). A module inside a module
  that a registered converter replaces as a whole cannot stay one object with its other places: that gets a
  :class:`ConversionWarning`.
* a converted layer is put on the plain module's device, its posteriors in its floating dtype (``float16``,
  ``bfloat16`` ...; the priors keep theirs), with the plain module's forward and backward hooks. A module on the meta
  device gives a meta Bayesian layer (``to_empty`` then a state dict fills it). A lazy module (``nn.LazyLinear``)
  must have run once first: its shapes are unknown, and it is refused with a ``ValueError`` saying so.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from torch import nn
from torch.distributions import Distribution
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedParameter
from torch.nn.utils import parametrize

from varbnn.families.base import VariationalFamily
from varbnn.families.gaussian import MeanField
from varbnn.nn.base import BayesianModule
from varbnn.nn.layers import (
    BayesConv1d,
    BayesConv2d,
    BayesConv3d,
    BayesEmbedding,
    BayesGRU,
    BayesLinear,
    BayesLSTM,
    _BayesConvNd,
    _BayesRNN,
)
from varbnn.priors import Normal, Prior, PriorSpec, as_prior

__all__ = [
    "bayesianize",
    "to_deterministic",
    "conversion_report",
    "register_converter",
    "register_deterministic",
    "register_left_deterministic",
    "ConversionContext",
    "ConversionReport",
    "ConvertedModule",
    "DeterministicModule",
    "ConversionWarning",
    "recalibrate_batchnorm",
]


class ConversionWarning(UserWarning):
    """``bayesianize`` left modules that own parameters deterministic without being asked to."""


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
_ATTENTION = "no Bayesian form: F.multi_head_attention_forward reads its packed projections"
_TRANSFORMER = "contains MultiheadAttention; left whole, as torch's eval fast path reads its Linear weights"
FROZEN = "frozen, left deterministic (requires_grad=False on all its parameters)"
_PARTLY_FROZEN = "partly frozen: {names} requires_grad=False; left deterministic as it was (frozen='convert' converts it)"
_OWN_FORWARD = "subclass of {base} with its own {method}; a Bayes layer would drop it"
_OTHER_PARAMETERS = "{base} with parameters {names}{missing} (weight_norm or spectral_norm?); a Bayes layer would drop them"
_PARAMETRIZED = "parametrized: {names} computed by torch.nn.utils.parametrize; a Bayes layer would drop it"
_TIED = "weight tying: {pairs}; left deterministic so the tie holds"

for _norm in (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", None)):
    if _norm is not None:
        register_left_deterministic(_norm, NORMALISATION)
register_left_deterministic(nn.MultiheadAttention, _ATTENTION, warn=True)
# torch's encoder layers (and stacks) read linear1.weight etc. on their eval-mode fast path, so converting their Linear
# layers would break them; the decoder layers call their sub-modules and are walked into like any container.
for _transformer in (nn.TransformerEncoder, nn.TransformerEncoderLayer):
    register_left_deterministic(_transformer, _TRANSFORMER, warn=True)


def _lookup(registry: dict[type[nn.Module], Any], module: nn.Module) -> Any:
    return _lookup_class(registry, module)[1]


def _lookup_class(registry: dict[type[nn.Module], Any], module: nn.Module) -> tuple[type[nn.Module] | None, Any]:
    """The registered class that ``module``'s type inherits from first (walking its MRO), and its registry entry."""
    for cls in type(module).__mro__:
        if cls in registry:
            return cls, registry[cls]
    return None, None


def _weights(module: nn.Module, names: Iterable[str], pretrained: bool) -> dict[str, torch.Tensor]:
    """CPU copies of the plain tensors to start the posterior means from (the layer is built on the CPU and then put
    where the plain module was); none for a tensor on the meta device (no values: the layer's own initialisation)."""
    if not pretrained:
        return {}
    tensors = {n: getattr(module, n, None) for n in names}
    return {n: t.detach().to("cpu", copy=True) for n, t in tensors.items() if t is not None and not t.is_meta}


# -- converters ---------------------------------------------------------------------------------------------


@register_converter(nn.Linear)
def _linear(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, nn.Linear)
    init = _weights(module, ("weight", "bias"), ctx.pretrained)
    return BayesLinear(
        module.in_features, module.out_features, module.bias is not None,
        init_weight=init.get("weight"), init_bias=init.get("bias"), **ctx.layer_kwargs(),
    )  # fmt: skip


_BAYES_CONV: dict[int, type[_BayesConvNd]] = {1: BayesConv1d, 2: BayesConv2d, 3: BayesConv3d}


@register_converter(nn.Conv1d)
@register_converter(nn.Conv2d)
@register_converter(nn.Conv3d)
def _conv(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
    if module.padding_mode != "zeros":
        raise ctx.refuse(f"{type(module).__name__} padding_mode={module.padding_mode!r} is not supported (only 'zeros')")
    init = _weights(module, ("weight", "bias"), ctx.pretrained)
    return _BAYES_CONV[len(module.kernel_size)](
        module.in_channels, module.out_channels, module.kernel_size, module.stride, module.padding,  # type: ignore[arg-type]
        module.dilation, module.groups, module.bias is not None,
        init_weight=init.get("weight"), init_bias=init.get("bias"), **ctx.layer_kwargs(),
    )  # fmt: skip


@register_converter(nn.Embedding)
def _embedding(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, nn.Embedding)
    if module.max_norm is not None:
        raise ctx.refuse("Embedding max_norm (an in-place renormalisation of the table) has no Bayesian form")
    if module.sparse:
        raise ctx.refuse("Embedding sparse=True is not supported (the gradient reaches the posterior densely)")
    init = _weights(module, ("weight",), ctx.pretrained)
    return BayesEmbedding(
        module.num_embeddings, module.embedding_dim, module.padding_idx, module.scale_grad_by_freq,
        family=ctx.family, prior=ctx.prior, init_weight=init.get("weight"),
    )  # fmt: skip


@register_converter(nn.LSTM)
@register_converter(nn.GRU)
def _recurrent(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, (nn.LSTM, nn.GRU))
    kind = type(module).__name__
    if module.bidirectional or module.proj_size:
        raise ctx.refuse(f"bidirectional {kind}s and proj_size > 0 are not supported by Bayes{kind}")
    names = [n for n, _ in module.named_parameters()]
    layer_type = BayesLSTM if isinstance(module, nn.LSTM) else BayesGRU
    return layer_type(
        module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first, module.dropout,
        init=_weights(module, names, ctx.pretrained), **ctx.layer_kwargs(),
    )  # fmt: skip


# -- the report ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvertedModule:
    """A Bayesian module of the converted model.

    :ivar name: qualified name (as in ``named_modules``; ``""`` for the model itself).
    :ivar bayesian_type: its type, e.g. ``"BayesLinear"``.
    :ivar source_type: the plain type it was converted from (``None`` when unknown: :func:`conversion_report`, or a
        module that was Bayesian already).
    :ivar num_weights: elements of its random tensors (the plain module's parameter count).
    :ivar num_variational_parameters: parameters of its posteriors.
    :ivar also_at: the other names at which the same module object sits (a module used twice in the plain model,
        e.g. ``nn.Sequential(lin, nn.ReLU(), lin)``, stays ONE Bayesian module at every place: one posterior and one
        KL term, as the plain network had one weight; each call still draws its own weights). Empty when used once.
    """

    name: str
    bayesian_type: str
    source_type: str | None
    num_weights: int
    num_variational_parameters: int
    also_at: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeterministicModule:
    """A module left as it was that owns parameters (or a subtree left whole: excluded, attention).

    :ivar name: qualified name (``""`` for the model itself).
    :ivar type_name: its type, e.g. ``"BatchNorm2d"``.
    :ivar num_parameters: parameters left deterministic (its own; a subtree's all).
    :ivar reason: why, e.g. ``"normalisation layer (deterministic by design)"``, ``"excluded by the user"``,
        ``"no Bayesian form registered"``.
    :ivar deliberate: ``True`` for normalisation layers, user exclusions and frozen modules (no warning); ``False`` for
        the modules the :class:`ConversionWarning` names and ``strict=True`` refuses.
    :ivar also_at: the other names at which the same module object sits (see :attr:`ConvertedModule.also_at`).
    """

    name: str
    type_name: str
    num_parameters: int
    reason: str
    deliberate: bool
    also_at: tuple[str, ...] = ()


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`bayesianize` made Bayesian and what it left deterministic; ``str(report)`` is a table.

    :ivar converted: one :class:`ConvertedModule` per Bayesian module (a module used at several places is one row,
        its other places in ``also_at``).
    :ivar deterministic: one :class:`DeterministicModule` per parameter-owning module left as it was.
    """

    converted: tuple[ConvertedModule, ...]
    deterministic: tuple[DeterministicModule, ...]

    @property
    def unintended(self) -> tuple[DeterministicModule, ...]:
        """The deterministic modules that are not deliberate: what the warning names and ``strict=True`` refuses."""
        return tuple(d for d in self.deterministic if not d.deliberate)

    @property
    def shared(self) -> tuple[ConvertedModule | DeterministicModule, ...]:
        """The rows whose module sits at several places of the model (``also_at`` not empty)."""
        rows: list[ConvertedModule | DeterministicModule] = [*self.converted, *self.deterministic]
        return tuple(row for row in rows if row.also_at)

    @property
    def frozen(self) -> tuple[DeterministicModule, ...]:
        """The modules left deterministic because all their parameters had ``requires_grad=False``."""
        return tuple(d for d in self.deterministic if d.reason == FROZEN)

    @property
    def num_bayesian_weights(self) -> int:
        """Elements of every random tensor of the converted modules (the plain model's weights they replace)."""
        return sum(c.num_weights for c in self.converted)

    @property
    def num_deterministic_parameters(self) -> int:
        """Parameters left deterministic, over every :class:`DeterministicModule`."""
        return sum(d.num_parameters for d in self.deterministic)

    def summary(self) -> str:
        """One line: how many modules and weights were converted, and what was left deterministic, by type and reason."""
        text = f"{len(self.converted)} modules Bayesian ({self.num_bayesian_weights:,} weights)"
        if not self.deterministic:
            text += "; nothing left deterministic"
        else:
            text += (
                f"; {len(self.deterministic)} left deterministic ({self.num_deterministic_parameters:,} parameters): "
                + _by_type(self.deterministic)
            )
        return text + _shared_text(self.shared)

    def __str__(self) -> str:
        lines = [f"Bayesian ({len(self.converted)} modules, {self.num_bayesian_weights:,} weights):"]
        rows = [
            (c.name or "(model)", f"{c.source_type} -> {c.bayesian_type}" if c.source_type else c.bayesian_type,
             f"{c.num_weights:,}", f"{c.num_variational_parameters:,}")
            for c in self.converted
        ]  # fmt: skip
        lines += _table(("name", "type", "weights", "variational parameters"), rows) if rows else ["  (none)"]
        lines.append(f"left deterministic ({len(self.deterministic)} modules, {self.num_deterministic_parameters:,} parameters):")
        rows = [
            (d.name or "(model)", d.type_name, f"{d.num_parameters:,}", d.reason + ("" if d.deliberate else "  [warned]"))
            for d in self.deterministic
        ]
        lines += _table(("name", "type", "parameters", "reason"), rows) if rows else ["  (none)"]
        if self.shared:
            lines.append("shared (one module object at several places; a Bayesian one has one posterior, one KL term):")
            lines += [f"  {row.name or '(model)'} also at {', '.join(row.also_at)}" for row in self.shared]
        return "\n".join(lines)


def _shared_text(rows: Sequence[ConvertedModule | DeterministicModule]) -> str:
    if not rows:
        return ""
    shown = "; ".join(f"{row.name or '(model)'!r} also at {', '.join(map(repr, row.also_at))}" for row in rows[:3])
    return f"; shared module{'s' if len(rows) > 1 else ''} (one object at several places): {shown}" + (
        ", ..." if len(rows) > 3 else ""
    )


def _by_type(entries: Iterable[DeterministicModule], names: bool = False) -> str:
    groups: dict[tuple[str, str], list[DeterministicModule]] = {}
    for entry in entries:
        groups.setdefault((entry.type_name, entry.reason), []).append(entry)
    parts = []
    for (type_name, reason), members in groups.items():
        listed = ""
        if names:
            shown = ", ".join(repr(m.name or "(model)") for m in members[:3])
            listed = f" at {shown}{', ...' if len(members) > 3 else ''}"
        parts.append(f"{type_name} x{len(members)} ({reason}){listed}")
    return "; ".join(parts)


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
# Forward and backward hooks registered on a module, carried over to the module that replaces it.
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
)


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


def _place_like(new: nn.Module, source: nn.Module) -> None:
    """Put a converted module on the device of the plain one (its priors too), and its posteriors in its floating
    dtype (float16, bfloat16, float64 ...); the priors keep theirs, so that the KL is not summed in half precision."""
    reference = next(iter(source.parameters()), None)
    if reference is None:
        return
    new.to(device=reference.device)
    if reference.is_floating_point():
        targets = list(new.posteriors.values()) if isinstance(new, BayesianModule) else [new]
        for target in targets:
            target.to(dtype=reference.dtype)


def _carry_hooks(source: nn.Module, new: nn.Module) -> None:
    """The forward (pre-)hooks and backward hooks registered on the plain module run on its replacement too."""
    for attribute in _HOOK_DICTS:
        hooks, target = getattr(source, attribute, None), getattr(new, attribute, None)
        if hooks and target is not None:
            target.update(hooks)
    if source._backward_hooks or source._backward_pre_hooks:
        new._is_full_backward_hook = source._is_full_backward_hook


class _Row:
    """A report row being collected, with the other places of its module."""

    def __init__(self, row: ConvertedModule | DeterministicModule) -> None:
        self.row = row
        self.also_at: list[str] = []

    def done(self) -> Any:
        return dataclasses.replace(self.row, also_at=tuple(self.also_at)) if self.also_at else self.row


@dataclass(frozen=True)
class _Pin:
    """A module that sits inside a subtree left as it is (excluded, frozen, attention ...) and at another place too:
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


class _Walker:
    """Walks a model top-down: converts what has a converter (when ``context`` is given), records the rest.

    A module object met again at another place (``nn.Sequential(lin, nn.ReLU(), lin)``) is given the same
    replacement there, and its row (and the rows of the modules inside it) lists the other place in ``also_at``.
    A module in ``pins`` (it sits inside a subtree left as it is, e.g. under an excluded parent) is left as it is at
    its other places too. ``dry=True`` decides without converting anything (the model is not changed) and collects in
    ``found_pins`` the modules inside the subtrees it leaves as they are: the ``pins`` of the walk that converts.
    """

    def __init__(
        self,
        context: Callable[[str], ConversionContext] | None,
        excluded_names: frozenset[str] = frozenset(),
        excluded_types: tuple[type[nn.Module], ...] = (),
        *,
        frozen: str = "keep",
        aliases: dict[int, list[str]] | None = None,
        ties: dict[int, str] | None = None,
        pins: dict[int, _Pin] | None = None,
        dry: bool = False,
    ) -> None:
        self.context = context
        self.pins = pins or {}
        self.dry = dry
        self.found_pins: dict[int, _Pin] = {}
        # id -> (a module inside one that a converter replaces whole, its place there, the converted one, its place)
        self.found_replaced: dict[int, tuple[nn.Module, str, nn.Module, str]] = {}
        self.excluded_names = excluded_names
        self.excluded_types = excluded_types
        self.frozen = frozen
        self.aliases = aliases or {}
        self.ties = ties or {}
        self.converted: list[_Row] = []
        self.deterministic: list[_Row] = []
        self._rows: dict[int, tuple[nn.Module, _Row]] = {}  # id(module placed in the model) -> its row
        self._done: dict[int, tuple[nn.Module, nn.Module]] = {}  # id(module visited) -> (it, what replaced it)

    def report(self) -> ConversionReport:
        return ConversionReport(tuple(r.done() for r in self.converted), tuple(r.done() for r in self.deterministic))

    def _add(self, rows: list[_Row], placed: nn.Module, row: ConvertedModule | DeterministicModule) -> None:
        entry = _Row(row)
        rows.append(entry)
        self._rows[id(placed)] = (placed, entry)

    def _leave(self, module: nn.Module, name: str, reason: str, deliberate: bool, recurse: bool = True) -> nn.Module:
        parameters = list(module.parameters(recurse=recurse))
        lazy = [p for p in parameters if isinstance(p, UninitializedParameter)]  # no size yet: counted as 0
        count = sum(p.numel() for p in parameters if not isinstance(p, UninitializedParameter))
        if count or lazy:
            self._add(self.deterministic, module, DeterministicModule(name, type(module).__name__, count, reason, deliberate))
        if recurse and self.dry:
            self._pin_inside(module, name, reason, deliberate)
        return module

    def _pin_inside(self, module: nn.Module, name: str, reason: str, deliberate: bool) -> None:
        """Note every module inside ``module`` (left as it is at ``name``, not walked into) in ``found_pins``."""
        for sub_name, sub in module.named_modules(prefix=name, remove_duplicate=False):
            if sub is not module and id(sub) not in self.found_pins:
                self.found_pins[id(sub)] = _Pin(sub, sub_name, name, reason, deliberate)

    def _record(self, name: str, new: nn.Module, source: nn.Module | None) -> nn.Module:
        variational = sum(p.numel() for p in new.parameters())
        if isinstance(new, BayesianModule):
            weights = sum(math.prod(q._require_built()) for _, q, _ in new.bayesian_tensors())
        else:
            weights = sum(p.numel() for p in (source if source is not None else new).parameters())
        source_type = type(source).__name__ if source is not None else None
        self._add(self.converted, new, ConvertedModule(name, type(new).__name__, source_type, weights, variational))
        return new

    def _also_at(self, placed: nn.Module, name: str) -> None:
        for sub_name, sub in placed.named_modules(prefix=name, remove_duplicate=False):
            found = self._rows.get(id(sub))
            if found is not None and found[0] is sub:
                row = found[1]
                if sub_name != row.row.name and sub_name not in row.also_at:
                    row.also_at.append(sub_name)

    def visit(self, module: nn.Module, name: str) -> nn.Module:
        """The module to put at ``name``: a converted one, or ``module`` itself (its children visited); a module met
        before gets what it got the first time."""
        done = self._done.get(id(module))
        if done is not None and done[0] is module:
            self._also_at(done[1], name)
            return done[1]
        placed = self._visit(module, name)
        self._done[id(module)] = (module, placed)
        return placed

    def _all_frozen(self, module: nn.Module, recurse: bool = True) -> bool:
        parameters = list(module.parameters(recurse=recurse))
        return self.frozen == "keep" and bool(parameters) and not any(p.requires_grad for p in parameters)

    def _visit(self, module: nn.Module, name: str) -> nn.Module:
        places = self.aliases.get(id(module), [name])
        if any(n in self.excluded_names for n in places) or (self.excluded_types and isinstance(module, self.excluded_types)):
            return self._leave(module, name, EXCLUDED, True)
        if isinstance(module, BayesianModule):
            if self.dry:
                self._pin_inside(module, name, "a Bayesian module already, left as it is", False)
                return module
            return self._record(name, module, None)
        pin = self.pins.get(id(module))
        if pin is not None and pin.module is module:  # also inside a subtree left as it is: one object, so here too
            self._leave(module, name, pin.reason(), pin.deliberate)
            found = self._rows.get(id(module))
            if found is not None and found[0] is module:
                found[1].also_at.extend(p for p in places if p != name and p not in found[1].also_at)
            return module
        registered, converter = _lookup_class(_CONVERTERS, module)
        if converter is not None:
            assert registered is not None
            return self._convert(module, name, registered, converter)
        left = _lookup(_LEFT, module)
        if left is not None:
            reason, warn = left
            if warn and self._all_frozen(module):
                return self._leave(module, name, FROZEN, True)
            return self._leave(module, name, reason, not warn)
        if any(True for _ in module.parameters(recurse=False)):
            if self._all_frozen(module, recurse=False):
                self._leave(module, name, FROZEN, True, recurse=False)
            else:
                self._leave(module, name, NO_BAYESIAN_FORM, False, recurse=False)
        return self._children(module, name)

    def _children(self, module: nn.Module, name: str) -> nn.Module:
        # module._modules, not named_children(): that skips a module's second place (nn.Sequential(lin, act, lin))
        for child_name, child in list(module._modules.items()):
            if child is None:
                continue
            new = self.visit(child, f"{name}.{child_name}" if name else child_name)
            if new is not child:
                setattr(module, child_name, new)
        return module

    def _convert(self, module: nn.Module, name: str, registered: type[nn.Module], converter: Converter) -> nn.Module:
        if self.frozen == "keep":
            frozen = [n for n, p in module.named_parameters() if not p.requires_grad]
            if frozen and self._all_frozen(module):
                return self._leave(module, name, FROZEN, True)
            if frozen:
                return self._leave(module, name, _PARTLY_FROZEN.format(names=_quoted(frozen)), False)
        problem = _structure_problem(module, registered)
        if problem is not None:
            reason, whole = problem
            if whole:
                return self._leave(module, name, reason, False)
            self._leave(module, name, reason, False, recurse=False)
            return self._children(module, name)
        if id(module) in self.ties:
            return self._leave(module, name, _TIED.format(pairs=self.ties[id(module)]), False)
        if self.context is None:
            return self._leave(module, name, _NOT_CONVERTED, False)
        if self.dry:
            for sub_name, sub in module.named_modules(prefix=name, remove_duplicate=False):
                if sub is not module:  # replaced with the module by its converter: not one object with another place
                    self.found_replaced.setdefault(id(sub), (sub, sub_name, module, name))
            return module
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
            where = repr(name) if name else "the model"
            raise ValueError(
                f"{where} is a {type(module).__name__} whose parameters are not initialised yet (a lazy module): run one "
                f"forward pass with an example input (model(x)) before bayesianize, so that its shapes are known"
                + (f", or pass exclude=[{name!r}]" if name else "")
            )
        new = converter(module, self.context(name))
        _place_like(new, module)
        _carry_hooks(module, new)
        return self._record(name, new, module)


def _prefixed(prior: PriorSpec | None, prefix: str) -> PriorSpec | None:
    if prior is None or isinstance(prior, (Prior, Distribution)) or not prefix:
        return prior
    return lambda tensor_name: prior(f"{prefix}.{tensor_name}")  # type: ignore[misc, operator]


def _check_prior(prior: PriorSpec | None) -> PriorSpec | None:
    """A torch distribution becomes its varbnn prior once (so that all tensors share it); bad types are refused."""
    if inspect.isclass(prior) and issubclass(prior, (Prior, Distribution)):
        name = prior.__name__
        raise TypeError(
            f"prior must be an instance such as {name}(...), a torch distribution or a callable of the parameter's "
            f"name and shape; got the class {name} itself"
        )
    if prior is None or isinstance(prior, Prior) or (callable(prior) and not isinstance(prior, Distribution)):
        return prior  # type: ignore[return-value]  # (mypy keeps type[object] from the class check above)
    return as_prior(prior)  # type: ignore[arg-type]


@overload
def bayesianize(
    model: nn.Module,
    family: VariationalFamily | None = ...,
    prior: PriorSpec | None = ...,
    *,
    bias_family: VariationalFamily | None = ...,
    bias_prior: PriorSpec | None = ...,
    exclude: Iterable[str | type[nn.Module]] = ...,
    pretrained: bool = ...,
    report: Literal[False] = ...,
    strict: bool = ...,
    frozen: Literal["keep", "convert"] = ...,
) -> nn.Module: ...


@overload
def bayesianize(
    model: nn.Module,
    family: VariationalFamily | None = ...,
    prior: PriorSpec | None = ...,
    *,
    bias_family: VariationalFamily | None = ...,
    bias_prior: PriorSpec | None = ...,
    exclude: Iterable[str | type[nn.Module]] = ...,
    pretrained: bool = ...,
    report: Literal[True],
    strict: bool = ...,
    frozen: Literal["keep", "convert"] = ...,
) -> tuple[nn.Module, ConversionReport]: ...


def bayesianize(
    model: nn.Module,
    family: VariationalFamily | None = None,
    prior: PriorSpec | None = None,
    *,
    bias_family: VariationalFamily | None = None,
    bias_prior: PriorSpec | None = None,
    exclude: Iterable[str | type[nn.Module]] = (),
    pretrained: bool = True,
    report: bool = False,
    strict: bool = False,
    frozen: Literal["keep", "convert"] = "keep",
) -> nn.Module | tuple[nn.Module, ConversionReport]:
    """A NEW model in which every registered layer is Bayesian; the input model is deep-copied, never modified.

    Converted: ``nn.Linear``, ``nn.Conv1d``/``Conv2d``/``Conv3d``, ``nn.Embedding``, ``nn.LSTM``, ``nn.GRU`` (and their
    subclasses; more with :func:`register_converter`). Left deterministic ON PURPOSE, without a warning: normalisation
    layers (``BatchNorm*``, ``SyncBatchNorm``, ``InstanceNorm*``, ``LayerNorm``, ``GroupNorm``, ``RMSNorm``) and what
    ``exclude`` names. Left
    deterministic and REPORTED: every other module that owns parameters (``nn.MultiheadAttention``, and
    ``nn.TransformerEncoderLayer``/``nn.TransformerEncoder`` as a whole, ``nn.Bilinear``, ``nn.EmbeddingBag``,
    transposed convolutions, custom modules with their own ``nn.Parameter`` ...), and the convertible modules that a
    Bayesian layer would not reproduce (a subclass with its own ``forward``, a parametrized or weight-normed module, a
    module with a parameter tied to another module's, a partly frozen module): one :class:`ConversionWarning` lists
    their types and names, ``strict=True`` makes it a ``ValueError``. Whatever stays deterministic has no KL term and
    adds no predictive uncertainty.

    Weight tying (a parameter object shared by two modules, e.g. a language model's ``decoder.weight =
    embedding.weight``) is kept by leaving EVERY tied module deterministic and warning: converting them separately
    would silently untie them (two posteriors for what was one weight), and a careful user decides between the tie and
    a posterior. Exclude all tied modules to keep the tie without the warning, or untie before converting (e.g.
    ``model.decoder.weight = nn.Parameter(model.decoder.weight.detach().clone())``). A module OBJECT used at several
    places is different: it becomes one Bayesian module at all of them (one posterior, one KL term; the report's
    ``also_at``), or stays one plain module at all of them when one of its places lies inside a subtree left as it is
    (an excluded parent, a frozen or attention module; its row says so). Frozen modules (all parameters
    ``requires_grad=False``) stay deterministic and frozen (``frozen``).
    A batch norm with running statistics after a Bayesian layer is warned about (once): in eval mode every sampled
    network is normalised with one set of statistics, estimated for other weights; a Bayesian bias right before it
    is cancelled by it, so its posterior drifts to the prior (build that layer with ``bias=False``). The warning lists
    the remedies; :func:`recalibrate_batchnorm` re-estimates the statistics under sampled weights.

    Weights are sampled on every forward pass, in ``model.eval()`` too: ``eval()`` switches dropout and batch norm
    only. Use ``varbnn.sample_mode(model, "mean")`` (or :func:`to_deterministic`) for deterministic passes.
    Cost: one deep copy of the model; the variational parameters are about twice the plain ones for the Gaussian
    families.

    :param model: the plain model; it is deep-copied, never modified.
    :param family: posterior spec (default ``MeanField()``), built once per tensor.
    :param prior: one ``Prior`` shared by all tensors (an adaptive one then pools them all, as in Graves 2011),
        or a callable ``qualified_tensor_name -> Prior`` (e.g. ``"0.weight"``) for one prior each.
        A ``torch.distributions.Normal`` / ``Laplace`` with scalar parameters is taken as the varbnn prior of the
        same name (:func:`varbnn.priors.as_prior`); other torch distributions are refused with a ``TypeError``.
        Default: one shared ``Normal(0, 1)``.
    :param bias_family: posterior spec of the bias tensors (default: ``family``).
    :param bias_prior: prior of the bias tensors (default: ``prior``).
    :param exclude: qualified module names (as in ``named_modules``; any name of a module used at several places
        excludes it at all of them) or module types to leave unchanged (deliberately: they are reported, not warned
        about), with everything inside them: a module inside an excluded one that is also used at another place
        stays plain there too (one object; reported as excluded, with the excluded place).
    :param pretrained: copy the plain weights into the posterior means (default True: a trained network keeps what it
        learned, and an untrained one starts from torch's own initialisation; on fresh networks the
        defaults study (two seeds) found each layer's own initialisation the better start for 4 of 5 families,
        MeanField the exception -- see ``benchmarks/results/defaults/``). ``False``: each layer's own initialisation
        (He-normal means; torch's default for embeddings and recurrent layers), as the paper reproductions use.
    :param report: also return a :class:`ConversionReport` (``(model, report)``): every module converted and every
        parameter-owning module left deterministic, with the reason.
    :param strict: raise ``ValueError`` instead of warning when modules that own parameters are left deterministic
        without being excluded.
    :param frozen: what to do with a convertible module whose parameters have ``requires_grad=False``: ``"keep"``
        (default) leaves a fully frozen one deterministic and frozen (reported as ``"frozen, left deterministic"``, no
        warning: freezing is a deliberate choice) and a partly frozen one (e.g. weight frozen, bias trainable)
        deterministic as it was, with the warning (converting it would make its frozen part trainable, and a Bayes
        layer cannot keep half of it fixed); ``"convert"`` converts both like any other module, with trainable
        variational parameters (freeze them afterwards if you want a fixed random layer).
    :returns: the Bayesian model, or ``(model, report)`` with ``report=True``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    for flag, value in (("pretrained", pretrained), ("report", report), ("strict", strict)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, got {value!r}")
    for label, spec in (("family", family), ("bias_family", bias_family)):
        if spec is not None and not isinstance(spec, VariationalFamily):
            raise TypeError(f"{label} must be a varbnn VariationalFamily (e.g. MeanField()), got {type(spec).__name__}")
    if isinstance(exclude, (str, type)):
        exclude = (exclude,)
    exclude = tuple(exclude)
    for entry in exclude:
        if not (isinstance(entry, str) or (isinstance(entry, type) and issubclass(entry, nn.Module))):
            raise TypeError(f"exclude must hold module names (str) or nn.Module types, got {entry!r}")
    if frozen not in ("keep", "convert"):
        raise ValueError(f"frozen must be 'keep' or 'convert', got {frozen!r}")
    names = {name for name, _ in model.named_modules(remove_duplicate=False) if name}
    unknown = sorted(e for e in exclude if isinstance(e, str) and e not in names)
    if unknown:
        listing = ", ".join(sorted(names)[:20]) + (", ..." if len(names) > 20 else "")
        raise ValueError(f"exclude names no module of the model: {unknown}; its modules are: {listing}")
    family = family if family is not None else MeanField()
    if pretrained:  # a family may start narrower around trained weights than from scratch
        family = family.for_trained_weights()
        bias_family = bias_family.for_trained_weights() if bias_family is not None else None
    prior = _check_prior(prior) if prior is not None else Normal(0.0, 1.0)
    bias_prior = _check_prior(bias_prior)

    def context(name: str) -> ConversionContext:
        return ConversionContext(
            name, family, bias_family, _prefixed(prior, name), _prefixed(bias_prior, name), pretrained
        )  # fmt: skip

    copied = _deep_copy(model)
    aliases, ties = _places(copied), _tied_parameters(copied)

    def walker(pins: dict[int, _Pin] | None = None, dry: bool = False) -> _Walker:
        return _Walker(
            context,
            frozenset(e for e in exclude if isinstance(e, str)),
            tuple(e for e in exclude if isinstance(e, type)),
            frozen=frozen,
            aliases=aliases,
            ties=ties,
            pins=pins,
            dry=dry,
        )

    pins: dict[int, _Pin] = {}
    replaced: dict[int, tuple[nn.Module, str, nn.Module, str]] = {}
    if any(len(places) > 1 for places in aliases.values()):
        # a module used at several places may sit inside a subtree left as it is (an excluded parent) at one of them:
        # find those first, so that it is left as it is at all its places (a split would be silent)
        scout = walker(dry=True)
        scout.visit(copied, "")
        pins, replaced = scout.found_pins, scout.found_replaced
    converting = walker(pins)
    new = converting.visit(copied, "")
    _warn_split_by_converters(replaced, aliases, pins)
    result = converting.report()
    unintended = result.unintended
    if unintended:
        count = sum(d.num_parameters for d in unintended)
        listing = _by_type(unintended, names=True)
        hints = _hints(unintended)
        if strict:
            raise ValueError(
                f"bayesianize(strict=True): {len(unintended)} modules that own parameters ({count:,} in all) would be left "
                f"deterministic: {listing}. Pass exclude=[names or types] to keep them deterministic on purpose, or "
                f"register_converter a Bayesian form{hints}"
            )
        warnings.warn(
            f"bayesianize left {len(unintended)} modules with parameters ({count:,} in all) deterministic, types: "
            f"{_by_type(unintended, names=True)}. They get no posterior, no KL and no predictive uncertainty. Pass "
            f"exclude=[...] to keep them deterministic on purpose (no warning), report=True for the full list, "
            f"strict=True to make this an error{hints}.",
            ConversionWarning,
            stacklevel=2,
        )
    _warn_batch_norm_after_bayesian(new, pretrained)
    return (new, result) if report else new


def _deep_copy(model: nn.Module) -> nn.Module:
    try:
        return copy.deepcopy(model)
    except RuntimeError as error:
        old_weight_norm = any(
            type(hook).__name__ == "WeightNorm" for m in model.modules() for hook in m._forward_pre_hooks.values()
        )
        hint = (
            " The model uses the deprecated torch.nn.utils.weight_norm, whose weight cannot be deep-copied after a "
            "forward pass: use torch.nn.utils.parametrizations.weight_norm instead (bayesianize leaves such a module "
            "deterministic and reports it), or torch.nn.utils.remove_weight_norm first."
            if old_weight_norm
            else ""
        )
        raise RuntimeError(
            f"bayesianize deep-copies the model (it never changes it) and torch could not: {error}.{hint}"
        ) from error


def _places(model: nn.Module) -> dict[int, list[str]]:
    """``id(module) -> every qualified name it has`` (a module used twice has two)."""
    places: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        places.setdefault(id(module), []).append(name)
    return places


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


def _hints(unintended: Sequence[DeterministicModule]) -> str:
    """What to do about the kinds of unintended rows that need more than ``exclude``."""
    hints = []
    if any(d.reason.startswith("weight tying") for d in unintended):
        hints.append(
            "Weight tying is kept by leaving every tied module deterministic: exclude all of them to say so (no "
            "warning), or untie the parameter before bayesianize (e.g. model.decoder.weight = "
            "nn.Parameter(model.decoder.weight.detach().clone())) to give each module its own posterior"
        )
    if any(d.reason.startswith("partly frozen") for d in unintended):
        hints.append(
            "A partly frozen module (some parameters requires_grad=False) is left deterministic as it was: exclude it "
            "to say so, or pass frozen='convert' to convert it (all its variational parameters trainable)"
        )
    if any(d.reason.startswith("subclass of") for d in unintended):
        hints.append(
            "A subclass of a convertible layer that overrides forward keeps its forward only as a plain layer: "
            "register_converter(YourClass) gives it a Bayesian form"
        )
    return "".join(f". {h}" for h in hints)


def _warn_batch_norm_after_bayesian(model: nn.Module, pretrained: bool) -> None:
    """One :class:`ConversionWarning` when a batch-norm layer with running statistics comes after a Bayesian module
    (in registration order, the order of ``named_modules``): in eval mode every sampled network is normalised with one
    set of running statistics, estimated for other weights. When the module registered just before the batch norm is
    a Bayesian layer with a bias, the warning says so: the batch norm subtracts that bias, the data cannot inform its
    posterior, which drifts to the prior, and each draw then shifts the channels by about the prior's scale (measured
    on the digits CNN: sampled accuracy 0.30 against 0.89 for the mean network after 100 epochs; 0.99 for both with
    ``bias=False``)."""
    first_bayesian = None
    previous: tuple[str, nn.Module] | None = None  # the last module with parameters of its own, in registration order
    inside: str | None = None  # the Bayesian module whose posteriors and priors named_modules is listing
    for name, module in model.named_modules():
        if inside is not None and name.startswith(inside):
            continue
        if isinstance(module, BayesianModule) and first_bayesian is None:
            first_bayesian = name or "(model)"
        if first_bayesian is not None and isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            estimated = "the plain network's weights" + ("" if pretrained else ", which pretrained=False re-initialised")
            bias = ""
            if previous is not None and isinstance(previous[1], BayesianModule) and "bias" in previous[1].posteriors:
                bias = (
                    f" The Bayesian layer {previous[0]!r} just before it has a bias: the batch norm subtracts it, so the "
                    "data cannot inform its posterior, which drifts to the prior during training, and every draw shifts "
                    "the channels by about the prior's scale; build that layer with bias=False (as ResNets do) before "
                    "converting."
                )
            warnings.warn(
                f"bayesianize: {type(module).__name__} {name!r} comes after the Bayesian module {first_bayesian!r}. In "
                f"eval() mode every sampled network is normalised with one set of running statistics (estimated for "
                f"{estimated}; training with varbnn.fit then averages them over weight draws), so the sampled "
                f"predictive can be much worse than the mean network's.{bias} What helps: keep the layers before batch "
                "norms deterministic (exclude=[names]); use GroupNorm or LayerNorm (per-example statistics); re-estimate "
                "the statistics under sampled weights with varbnn.convert.recalibrate_batchnorm(model, loader) (after "
                "pretrained=False or training; it cannot give each draw its own statistics). Compare predict(model, x) "
                "with the mean network (varbnn.sample_mode(model, 'mean')) before trusting it.",
                ConversionWarning,
                stacklevel=3,
            )
            return
        if isinstance(module, BayesianModule) or any(True for _ in module.parameters(recurse=False)):
            previous = (name, module)
        if isinstance(module, BayesianModule):
            inside = f"{name}." if name else None


def recalibrate_batchnorm(model: nn.Module, loader: Iterable[Any], *, samples: int = 1) -> nn.Module:
    """Re-estimate the running statistics of every batch norm of ``model`` under its Bayesian layers' weights, in place.

    Each batch-norm layer with ``track_running_stats`` gets its statistics reset and replaced by the plain average
    (``momentum=None``) of the batch statistics of ``samples`` forward passes per batch of ``loader``; a Bayesian
    layer draws new weights on every pass (in its current ``sample_mode``: the default ``"sample"`` draws; under
    ``varbnn.sample_mode(model, "mean")`` it recalibrates for the mean network). Everything else runs in eval mode
    (dropout off), without gradients, and each module's train/eval flag and each batch norm's momentum are restored.
    Use it when the statistics belong to other weights: after :func:`bayesianize` with ``pretrained=False`` (the
    plain network's statistics, the layers re-initialised), or after training, for the network you will predict
    with. The statistics then average over weight draws, so a single draw is still normalised with statistics that
    are not exactly its own: it does not repair a sampled predictive that needs per-draw statistics (e.g. a Bayesian
    bias just before the batch norm; see the warning of :func:`bayesianize`).

    Cost: ``samples`` forward passes over ``loader``.

    :param model: a model with batch-norm layers (``nn.BatchNorm1d/2d/3d``, ``nn.SyncBatchNorm``).
    :param loader: batches of inputs: tensors, or tuples / lists whose first element is the input (``(x, y)``, as
        a ``DataLoader`` over a ``TensorDataset`` yields them); moved to the device of the model's first parameter.
    :param samples: forward passes (weight draws) per batch, an int >= 1 (default 1).
    :returns: ``model``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        raise ValueError("model has no batch-norm layer with running statistics (track_running_stats=True) to recalibrate")
    reference = next(iter(model.parameters()), None)
    device = reference.device if reference is not None else None
    flags = [(m, m.training) for m in model.modules()]
    momenta = [(m, m.momentum) for m in norms]
    batches = 0
    try:
        model.eval()
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None
            norm.train()
        with torch.no_grad():
            for batch in loader:
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                if not isinstance(x, torch.Tensor):
                    raise TypeError(f"loader must yield tensors or (input, ...) tuples of tensors, got {type(x).__name__} inputs")
                x = x.to(device) if device is not None else x
                for _ in range(samples):
                    model(x)
                batches += 1
    finally:
        for module, training in flags:
            module.training = training
        for norm, momentum in momenta:
            norm.momentum = momentum
    if not batches:
        raise ValueError("loader yielded no batches: the batch-norm statistics were reset and not re-estimated")
    return model


def conversion_report(model: nn.Module) -> ConversionReport:
    """The :class:`ConversionReport` of a model as it is now: its Bayesian modules, and the modules that own
    parameters and are deterministic (a plain module of a convertible type is reported as not converted; the
    ``source_type`` of a Bayesian module is not known here and is ``None``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    walker = _Walker(None, aliases=_places(model), ties=_tied_parameters(model))
    walker.visit(model, "")
    return walker.report()


# -- back to plain modules ----------------------------------------------------------------------------------


@register_deterministic(BayesLinear)
def _det_linear(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, BayesLinear)
    plain = nn.Linear(module.in_features, module.out_features, "bias" in module.posteriors)
    _copy_point(module, plain, mode)
    return plain


_PLAIN_CONV: dict[int, type[nn.Module]] = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


@register_deterministic(_BayesConvNd)
def _det_conv(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, _BayesConvNd)
    plain = _PLAIN_CONV[module.dim](
        module.in_channels,
        module.out_channels,
        module.kernel_size,
        module.stride,
        module.padding,
        module.dilation,
        module.groups,
        "bias" in module.posteriors,
    )
    _copy_point(module, plain, mode)
    return plain


@register_deterministic(BayesEmbedding)
def _det_embedding(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, BayesEmbedding)
    plain = nn.Embedding(
        module.num_embeddings, module.embedding_dim, module.padding_idx, scale_grad_by_freq=module.scale_grad_by_freq
    )
    _copy_point(module, plain, mode)
    if module.padding_row is not None:
        with torch.no_grad():
            plain.weight[module.padding_idx].copy_(module.padding_row)
    return plain


@register_deterministic(_BayesRNN)
def _det_recurrent(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, _BayesRNN)
    plain_type = nn.LSTM if isinstance(module, BayesLSTM) else nn.GRU
    plain = plain_type(module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first, module.dropout)
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
    """A NEW plain model whose weights are the posterior ``"mean"`` or ``"mode"`` of each Bayesian layer.

    The model is deep-copied (the Bayesian one is not modified) and each Bayesian layer is replaced by the plain
    layer of its registered form (:func:`register_deterministic`: ``BayesLinear`` -> ``nn.Linear``, ...). The result
    runs as fast as the original network, with Graves' (2011, section 6) MAP approximation ``p(y | x, w*)`` for
    ``"mode"``. A Bayesian module used at several places becomes one plain module used at the same places; forward
    and backward hooks move to the plain module. A Bayesian module with no registered form raises
    ``NotImplementedError``.
    """
    if mode not in ("mean", "mode"):
        raise ValueError(f"mode must be 'mean' or 'mode', got {mode!r}")
    new = copy.deepcopy(model)
    root = _lookup(_DETERMINIZERS, new)
    if root is not None:
        return root(new, mode)  # type: ignore[no-any-return]

    done: dict[int, tuple[nn.Module, nn.Module]] = {}  # id(module) -> (it, its replacement): a shared one stays shared

    def convert(parent: nn.Module) -> None:
        for child_name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) in done and done[id(child)][0] is child:
                setattr(parent, child_name, done[id(child)][1])
                continue
            fn = _lookup(_DETERMINIZERS, child)
            if fn is None:
                convert(child)
                done[id(child)] = (child, child)
            else:
                plain = fn(child, mode)
                _carry_hooks(child, plain)
                done[id(child)] = (child, plain)
                setattr(parent, child_name, plain)

    convert(new)
    leftover = [n for n, m in new.named_modules() if isinstance(m, BayesianModule)]
    if leftover:
        raise NotImplementedError(f"no deterministic form registered for Bayesian modules {leftover}")
    return new
