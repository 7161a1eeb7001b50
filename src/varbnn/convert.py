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
  The children of the last kind are still converted.
"""

from __future__ import annotations

import copy
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from torch import nn
from torch.distributions import Distribution

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

for _norm in (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", None)):
    if _norm is not None:
        register_left_deterministic(_norm, NORMALISATION)
register_left_deterministic(nn.MultiheadAttention, _ATTENTION, warn=True)
# torch's encoder layers (and stacks) read linear1.weight etc. on their eval-mode fast path, so converting their Linear
# layers would break them; the decoder layers call their sub-modules and are walked into like any container.
for _transformer in (nn.TransformerEncoder, nn.TransformerEncoderLayer):
    register_left_deterministic(_transformer, _TRANSFORMER, warn=True)


def _lookup(registry: dict[type[nn.Module], Any], module: nn.Module) -> Any:
    for cls in type(module).__mro__:
        if cls in registry:
            return registry[cls]
    return None


def _weights(module: nn.Module, names: Iterable[str], pretrained: bool) -> dict[str, torch.Tensor]:
    if not pretrained:
        return {}
    return {n: getattr(module, n).detach().clone() for n in names if getattr(module, n, None) is not None}


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
    """

    name: str
    bayesian_type: str
    source_type: str | None
    num_weights: int
    num_variational_parameters: int


@dataclass(frozen=True)
class DeterministicModule:
    """A module left as it was that owns parameters (or a subtree left whole: excluded, attention).

    :ivar name: qualified name (``""`` for the model itself).
    :ivar type_name: its type, e.g. ``"BatchNorm2d"``.
    :ivar num_parameters: parameters left deterministic (its own; a subtree's all).
    :ivar reason: why, e.g. ``"normalisation layer (deterministic by design)"``, ``"excluded by the user"``,
        ``"no Bayesian form registered"``.
    :ivar deliberate: ``True`` for normalisation layers and user exclusions (no warning); ``False`` for the modules the
        :class:`ConversionWarning` names and ``strict=True`` refuses.
    """

    name: str
    type_name: str
    num_parameters: int
    reason: str
    deliberate: bool


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`bayesianize` made Bayesian and what it left deterministic; ``str(report)`` is a table.

    :ivar converted: one :class:`ConvertedModule` per Bayesian module.
    :ivar deterministic: one :class:`DeterministicModule` per parameter-owning module left as it was.
    """

    converted: tuple[ConvertedModule, ...]
    deterministic: tuple[DeterministicModule, ...]

    @property
    def unintended(self) -> tuple[DeterministicModule, ...]:
        """The deterministic modules that are not deliberate: what the warning names and ``strict=True`` refuses."""
        return tuple(d for d in self.deterministic if not d.deliberate)

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
            return text + "; nothing left deterministic"
        return text + (
            f"; {len(self.deterministic)} left deterministic ({self.num_deterministic_parameters:,} parameters): "
            + _by_type(self.deterministic)
        )

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
        return "\n".join(lines)


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


class _Walker:
    """Walks a model top-down: converts what has a converter (when ``context`` is given), records the rest."""

    def __init__(
        self,
        context: Callable[[str], ConversionContext] | None,
        excluded_names: frozenset[str] = frozenset(),
        excluded_types: tuple[type[nn.Module], ...] = (),
    ) -> None:
        self.context = context
        self.excluded_names = excluded_names
        self.excluded_types = excluded_types
        self.converted: list[ConvertedModule] = []
        self.deterministic: list[DeterministicModule] = []

    def report(self) -> ConversionReport:
        return ConversionReport(tuple(self.converted), tuple(self.deterministic))

    def _leave(self, module: nn.Module, name: str, reason: str, deliberate: bool) -> nn.Module:
        count = sum(p.numel() for p in module.parameters())
        if count:
            self.deterministic.append(DeterministicModule(name, type(module).__name__, count, reason, deliberate))
        return module

    def _record(self, name: str, new: nn.Module, source: nn.Module | None) -> nn.Module:
        variational = sum(p.numel() for p in new.parameters())
        if isinstance(new, BayesianModule):
            weights = sum(math.prod(q._require_built()) for _, q, _ in new.bayesian_tensors())
        else:
            weights = sum(p.numel() for p in (source if source is not None else new).parameters())
        source_type = type(source).__name__ if source is not None else None
        self.converted.append(ConvertedModule(name, type(new).__name__, source_type, weights, variational))
        return new

    def visit(self, module: nn.Module, name: str) -> nn.Module:
        """The module to put at ``name``: a converted one, or ``module`` itself (its children visited)."""
        if name in self.excluded_names or (self.excluded_types and isinstance(module, self.excluded_types)):
            return self._leave(module, name, EXCLUDED, True)
        if isinstance(module, BayesianModule):
            return self._record(name, module, None)
        converter = _lookup(_CONVERTERS, module)
        if converter is not None:
            if self.context is None:
                return self._leave(module, name, _NOT_CONVERTED, False)
            return self._record(name, converter(module, self.context(name)), module)
        left = _lookup(_LEFT, module)
        if left is not None:
            reason, warn = left
            return self._leave(module, name, reason, not warn)
        own = sum(p.numel() for p in module.parameters(recurse=False))
        if own:
            self.deterministic.append(DeterministicModule(name, type(module).__name__, own, NO_BAYESIAN_FORM, False))
        for child_name, child in list(module.named_children()):
            new = self.visit(child, f"{name}.{child_name}" if name else child_name)
            if new is not child:
                setattr(module, child_name, new)
        return module


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
) -> nn.Module | tuple[nn.Module, ConversionReport]:
    """A NEW model in which every registered layer is Bayesian; the input model is deep-copied, never modified.

    Converted: ``nn.Linear``, ``nn.Conv1d``/``Conv2d``/``Conv3d``, ``nn.Embedding``, ``nn.LSTM``, ``nn.GRU`` (and their
    subclasses; more with :func:`register_converter`). Left deterministic ON PURPOSE, without a warning: normalisation
    layers (``BatchNorm*``, ``SyncBatchNorm``, ``InstanceNorm*``, ``LayerNorm``, ``GroupNorm``, ``RMSNorm``) and what
    ``exclude`` names. Left
    deterministic and REPORTED: every other module that owns parameters (``nn.MultiheadAttention``, and
    ``nn.TransformerEncoderLayer``/``nn.TransformerEncoder`` as a whole, ``nn.Bilinear``, ``nn.EmbeddingBag``,
    transposed convolutions, custom modules with their own ``nn.Parameter`` ...): one :class:`ConversionWarning` lists
    their types, ``strict=True`` makes it a ``ValueError``. Whatever stays deterministic has no KL term and adds no
    predictive uncertainty.

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
    :param exclude: qualified module names (as in ``named_modules``) or module types to leave unchanged (deliberately:
        they are reported, not warned about).
    :param pretrained: copy the plain weights into the posterior means (default True: a trained network keeps what it
        learned, and an untrained one starts from torch's own initialisation; on fresh networks the
        defaults study (two seeds) found each layer's own initialisation the better start for 4 of 5 families,
        MeanField the exception -- see ``benchmarks/results/defaults/``). ``False``: each layer's own initialisation
        (He-normal means; torch's default for embeddings and recurrent layers), as the paper reproductions use.
    :param report: also return a :class:`ConversionReport` (``(model, report)``): every module converted and every
        parameter-owning module left deterministic, with the reason.
    :param strict: raise ``ValueError`` instead of warning when modules that own parameters are left deterministic
        without being excluded.
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
    names = {name for name, _ in model.named_modules() if name}
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

    walker = _Walker(
        context,
        frozenset(e for e in exclude if isinstance(e, str)),
        tuple(e for e in exclude if isinstance(e, type)),
    )
    new = walker.visit(copy.deepcopy(model), "")
    result = walker.report()
    unintended = result.unintended
    if unintended:
        count = sum(d.num_parameters for d in unintended)
        listing = _by_type(unintended, names=True)
        if strict:
            raise ValueError(
                f"bayesianize(strict=True): {len(unintended)} modules that own parameters ({count:,} in all) would be left "
                f"deterministic: {listing}. Pass exclude=[names or types] to keep them deterministic on purpose, or "
                f"register_converter a Bayesian form"
            )
        warnings.warn(
            f"bayesianize left {len(unintended)} modules with parameters ({count:,} in all) deterministic, types: "
            f"{_by_type(unintended)}. They get no posterior, no KL and no predictive uncertainty. Pass exclude=[...] "
            f"to keep them deterministic on purpose (no warning), report=True for the full list, strict=True to make "
            f"this an error.",
            ConversionWarning,
            stacklevel=2,
        )
    _warn_batch_norm_after_bayesian(new)
    return (new, result) if report else new


def _warn_batch_norm_after_bayesian(model: nn.Module) -> None:
    """One :class:`ConversionWarning` when a batch-norm layer with running statistics comes after a Bayesian module
    (in registration order, the order of ``named_modules``): its running statistics average over weight draws."""
    first_bayesian = None
    for name, module in model.named_modules():
        if isinstance(module, BayesianModule) and first_bayesian is None:
            first_bayesian = name or "(model)"
        if (
            first_bayesian is not None
            and isinstance(module, nn.modules.batchnorm._BatchNorm)
            and module.track_running_stats
        ):
            warnings.warn(
                f"bayesianize: {type(module).__name__} {name!r} comes after the Bayesian module {first_bayesian!r}. "
                "Its running statistics average over weight draws, so in eval() mode each sampled network is "
                "normalised with statistics that are not its own, and the sampled predictive can be much worse than "
                "the mean network's. Keep the layers before batch norms deterministic (exclude=[names]), use "
                "GroupNorm or LayerNorm (per-example statistics) instead, or compare predict(model, x) with the mean "
                "network (varbnn.sample_mode(model, 'mean')) before trusting it.",
                ConversionWarning,
                stacklevel=3,
            )
            return


def conversion_report(model: nn.Module) -> ConversionReport:
    """The :class:`ConversionReport` of a model as it is now: its Bayesian modules, and the modules that own
    parameters and are deterministic (a plain module of a convertible type is reported as not converted; the
    ``source_type`` of a Bayesian module is not known here and is ``None``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    walker = _Walker(None)
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
    ``"mode"``. A Bayesian module with no registered form raises ``NotImplementedError``.
    """
    if mode not in ("mean", "mode"):
        raise ValueError(f"mode must be 'mean' or 'mode', got {mode!r}")
    new = copy.deepcopy(model)
    root = _lookup(_DETERMINIZERS, new)
    if root is not None:
        return root(new, mode)  # type: ignore[no-any-return]

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
