"""What a user calls: :func:`add_adapters`, :func:`merge_adapters`, :func:`adapter_parameters`,
:func:`adapter_state_dict` and :func:`load_adapter_state_dict` (see :mod:`varbnn.adapters`)."""

from __future__ import annotations

import copy
import fnmatch
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch import nn

from varbnn._checks import as_float_in, as_int
from varbnn.adapters.layers import (
    _ADAPTERS,
    BAYESIAN_CHOICES,
    INIT_CHOICES,
    LoRALayer,
    _transformer_fast_path_off,
    check_std_scale,
)
from varbnn.families.base import VariationalFamily
from varbnn.nn.base import BayesianModule
from varbnn.priors import PriorSpec

__all__ = ["add_adapters", "merge_adapters", "adapter_parameters", "adapter_state_dict", "load_adapter_state_dict"]


def _as_patterns(value: Any, name: str) -> tuple[tuple[str, ...], tuple[type[nn.Module], ...]]:
    """``include`` / ``exclude`` as (name patterns, module types)."""
    try:
        entries = (value,) if isinstance(value, (str, type)) else tuple(value)
    except TypeError:
        raise TypeError(f"{name} must hold name patterns (str, fnmatch) or nn.Module types, got {value!r}") from None
    for entry in entries:
        if not (isinstance(entry, str) or (isinstance(entry, type) and issubclass(entry, nn.Module))):
            raise TypeError(f"{name} must hold name patterns (str, fnmatch) or nn.Module types, got {entry!r}")
    return tuple(e for e in entries if isinstance(e, str)), tuple(e for e in entries if isinstance(e, type))


def _prefixed(prior: PriorSpec | None, name: str) -> PriorSpec | None:
    """A prior callable called with the qualified tensor name (``"encoder.0.lora_A"``), as :func:`varbnn.bayesianize` does."""
    if prior is None or isinstance(prior, nn.Module) or not callable(prior):
        return prior
    return lambda tensor: prior(f"{name}.{tensor}")  # type: ignore[operator]


def add_adapters(
    model: nn.Module,
    *,
    rank: int = 8,
    alpha: float | None = None,
    include: str | type[nn.Module] | Iterable[str | type[nn.Module]] | None = None,
    exclude: str | type[nn.Module] | Iterable[str | type[nn.Module]] = (),
    family: VariationalFamily | None = None,
    prior: PriorSpec | None = None,
    bayesian: str = "A",
    init: str = "lora",
    inplace: bool = False,
    std_scale: float | None = None,
) -> nn.Module:
    """The model with a variational LoRA adapter on each chosen layer and every pretrained parameter frozen.

    Each chosen ``nn.Linear`` becomes a :class:`LoRALinear` and each chosen ``nn.Conv2d`` a :class:`LoRAConv2d`,
    computing ``base(x) + (alpha / rank) * B (A x)`` (Hu et al. 2022, eq. 3); each chosen ``nn.MultiheadAttention`` (by
    name, or ``include=nn.MultiheadAttention``: the default adapts ``nn.Linear`` layers only) a
    :class:`LoRAMultiheadAttention`, the update on its packed query / key / value projection. ``A`` starts small and
    random (``init``), ``B`` at zero, so the adapted model equals the pretrained one exactly at initialisation. Every
    parameter that was in the model gets ``requires_grad=False`` (set it back on a part you want to train too, e.g. a
    new head); only the adapters train, so :func:`varbnn.fit`'s gradients, :func:`varbnn.kl` and
    :class:`varbnn.optim.IVON` see the adapters alone (fit's default Adam also holds the frozen tensors, which never get
    a gradient and are never stepped).

    ``bayesian="A"`` (the default) is BLoB's parameterisation (Wang et al. 2024): the family is the posterior of ``A``
    and ``B`` is a point estimate. With ``B = 0`` at the start, every draw of ``A`` gives the pretrained function (the
    output noise ``(alpha / rank) B eps_A x`` grows only as ``B`` learns), and there are half as many variational
    parameters to fit. ``"B"`` and ``"both"`` put the family on ``B`` (too): its mean starts at 0 but a draw adds
    ``init_std``-sized noise (``MeanField``'s default ``1e-2``) times ``(alpha / rank) A x`` to the output from the
    first step, so the model starts as the pretrained one only at its mean (``sample_mode(model, "mean")``); choose a
    small ``init_std`` there. ``family=Delta()`` gives plain LoRA (a point estimate; with the default ``Normal(0, 1)``
    prior its KL term is an L2 penalty on ``A``, with ``prior=varbnn.priors.Uniform()`` none: maximum likelihood).

    Not adapted (refused with a ``ValueError`` when a name pattern selects them, else left alone): a layer that is
    already Bayesian, a layer that already has an adapter, and ``nn.MultiheadAttention``'s ``out_proj``, whose
    weight ``F.multi_head_attention_forward`` reads directly (an adapter there would be ignored; a warning names it
    when the default or a type selects it). The ``linear1`` / ``linear2`` of an ``nn.TransformerEncoderLayer`` are
    adapted; the layer then takes torch's slow path in eval mode (its fused kernel would skip the adapters).

    :param model: any ``nn.Module``; deep-copied unless ``inplace``.
    :param rank: the adapters' rank, an int >= 1 and at most ``min(in, out)`` of each chosen layer (default 8).
    :param alpha: the scale numerator, a number > 0: the update is ``alpha / rank`` times ``B A`` (default None:
        ``alpha = rank``).
    :param include: what to adapt: qualified-name patterns (``fnmatch``, e.g. ``"encoder.*.q_proj"``; a name of a
        module used at several places matches at any of them) and/or module types (``nn.Linear``, ``nn.Conv2d``; a
        type selects its subclasses; ``nn.MultiheadAttention`` for attention). Default None: every ``nn.Linear``.
    :param exclude: name patterns or types not to adapt, with everything inside them (default none); a pattern that
        matches no module is refused (a typo would otherwise adapt what it meant to exclude).
    :param family: the posterior spec of the Bayesian matrices, built once per tensor (default None: ``MeanField()``,
        or with ``std_scale`` ``A`` started at ``std_scale / sqrt(fan_in)``).
    :param prior: their prior: one ``Prior`` shared by all, or a callable ``qualified_tensor_name -> Prior`` (e.g.
        ``"encoder.0.lora_A"``); default ``Normal(0, 1)`` per tensor.
    :param bayesian: ``"A"`` (default), ``"B"`` or ``"both"`` (:data:`BAYESIAN_CHOICES`).
    :param init: ``"lora"`` (default) or ``"gaussian"`` (:data:`INIT_CHOICES`).
    :param inplace: modify ``model`` itself instead of a deep copy (default False; True spares a copy of a large
        model).
    :param std_scale: with the default family (``family=None``), the initial posterior std of each ``A`` relative to
        its initial scale ``1 / sqrt(fan_in)``: ``MeanField(init_std=std_scale / sqrt(fan_in))``, a number > 0 (default
        None: ``MeanField()``'s ``1e-2`` for every matrix). Not a default, because the evidence is split: on the
        finetune-cpu benchmark's ViT (1,000 labels) ``std_scale=1.0`` had a validation NLL of 0.622 against 0.674 for
        ``1e-2`` (its adapter-std study), but on the 100-label digits tutorial it was worse. ``B``'s posterior
        (``bayesian="B"`` / ``"both"``) starts at ``1e-2``. Refused together with ``family``.
    :returns: the adapted model (``model`` itself with ``inplace=True``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"add_adapters: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"add_adapters: inplace must be True or False, got {inplace!r}")
    rank = as_int(rank, "rank", 1, None, owner="add_adapters")
    if alpha is not None:
        alpha = as_float_in(alpha, "alpha", 0.0, None, low_open=True, owner="add_adapters")
    if bayesian not in BAYESIAN_CHOICES:
        raise ValueError(f"add_adapters: bayesian must be one of {BAYESIAN_CHOICES}, got {bayesian!r}")
    if init not in INIT_CHOICES:
        raise ValueError(f"add_adapters: init must be one of {INIT_CHOICES}, got {init!r}")
    std_scale = check_std_scale(std_scale, family, "add_adapters")  # before anything changes (inplace=True)
    if family is not None and not isinstance(family, VariationalFamily):
        raise TypeError(
            f"add_adapters: family must be a varbnn VariationalFamily (e.g. MeanField()), got {type(family).__name__}"
        )
    patterns, types = _as_patterns(nn.Linear if include is None else include, "include")
    if include is not None and not patterns and not types:
        raise ValueError("add_adapters: include is empty; pass name patterns or types, or None for every nn.Linear")
    for t in types:
        if not issubclass(t, tuple(_ADAPTERS)) and not any(issubclass(a, t) for a in _ADAPTERS):
            raise ValueError(
                f"add_adapters: include type {t.__name__} cannot be adapted; adaptable: nn.Linear, nn.Conv2d, "
                "nn.MultiheadAttention"
            )
    skip_patterns, skip_types = _as_patterns(exclude, "exclude")
    model = model if inplace else copy.deepcopy(model)

    names: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names.setdefault(id(module), []).append(name)
    for pattern in skip_patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for ns in names.values() for n in ns):
            raise ValueError(f"add_adapters: exclude pattern {pattern!r} matches no module of the model")

    def by_name(module: nn.Module, which: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatchcase(n, p) for n in names[id(module)] for p in which)

    def selected(module: nn.Module) -> bool:
        if by_name(module, patterns):
            return True
        inner = module.base if isinstance(module, LoRALayer) else module
        return bool(types) and isinstance(inner, types)

    places: list[tuple[nn.Module | None, str, nn.Module]] = []  # (parent or None for the model, attribute, layer)
    problems: list[str] = []
    skipped_attention: list[str] = []

    def walk(parent: nn.Module) -> None:
        for attribute, child in parent._modules.items():
            if child is None or by_name(child, skip_patterns) or (skip_types and isinstance(child, skip_types)):
                continue
            where = names[id(child)][0]
            if isinstance(child, LoRALayer):
                if selected(child):
                    problems.append(
                        f"{where!r} already has an adapter ({type(child).__name__}; exclude it, or merge_adapters first)"
                    )
                continue
            if isinstance(child, BayesianModule):
                if by_name(child, patterns):
                    problems.append(f"{where!r} is already Bayesian ({type(child).__name__}); adapters go on plain layers")
                continue
            adaptable = isinstance(child, tuple(_ADAPTERS))
            if adaptable and selected(child):
                if isinstance(parent, nn.MultiheadAttention):
                    if by_name(child, patterns):
                        problems.append(
                            f"{where!r} is nn.MultiheadAttention's out_proj, whose weight F.multi_head_attention_forward "
                            "reads directly: an adapter there would be ignored"
                        )
                    else:
                        skipped_attention.append(where)
                    continue
                places.append((parent, attribute, child))
                continue
            walk(child)

    root_excluded = by_name(model, skip_patterns) or (bool(skip_types) and isinstance(model, skip_types))
    if isinstance(model, LoRALayer):  # the model is one adapted layer
        if selected(model):
            problems.append(f"the model already has an adapter ({type(model).__name__}; merge_adapters first)")
    elif isinstance(model, tuple(_ADAPTERS)) and (selected(model) or root_excluded):  # the model is one plain layer
        if not root_excluded:
            places.append((None, "", model))
    elif not isinstance(model, BayesianModule):  # (an attention not chosen itself: its out_proj is reported)
        walk(model)
    if problems:
        raise ValueError("add_adapters cannot adapt: " + "; ".join(problems))
    if skipped_attention:
        warnings.warn(
            f"add_adapters left {skipped_attention} without adapters: nn.MultiheadAttention reads out_proj.weight "
            "directly (F.multi_head_attention_forward), so an adapter there would be ignored",
            UserWarning,
            stacklevel=2,
        )
    if not places:
        plain = [n for n, m in model.named_modules() if isinstance(m, tuple(_ADAPTERS)) and n]
        listing = ", ".join(plain[:8]) + (", ..." if len(plain) > 8 else "") if plain else "none"
        wanted = list(patterns) + [t.__name__ for t in types]
        unwanted = list(skip_patterns) + [t.__name__ for t in skip_types]
        raise ValueError(
            f"add_adapters: no layer matches include={wanted} (exclude={unwanted}); "
            f"the model's nn.Linear / nn.Conv2d / nn.MultiheadAttention layers are: {listing}"
        )
    for _, _, layer in places:  # every refusal before anything changes (inplace=True)
        where = names[id(layer)][0] or "the model"
        if isinstance(layer, nn.MultiheadAttention):
            if not layer._qkv_same_embed_dim:
                raise ValueError(f"add_adapters: {where!r} is an nn.MultiheadAttention with kdim / vdim of its own "
                                 "(three separate input projections); only the packed projection is adapted (exclude "
                                 "it)")  # fmt: skip
            limit = int(layer.embed_dim)
        else:
            weight_shape = layer.weight.shape  # type: ignore[union-attr]
            limit = min(math.prod(weight_shape[1:]), int(weight_shape[0]))  # type: ignore[index]
        if rank > limit:
            raise ValueError(f"add_adapters: rank must be an int in [1, {limit}] for {where!r} (the smaller of its input "
                             f"and output sizes), got {rank}: lower rank, or exclude it")  # fmt: skip
        if isinstance(layer, nn.Conv2d) and (layer.groups != 1 or layer.padding_mode != "zeros"):
            raise ValueError(f"add_adapters: {where!r} is an nn.Conv2d with groups={layer.groups}, padding_mode="
                             f"{layer.padding_mode!r}; only groups=1 with zero padding is adapted (exclude it)")  # fmt: skip
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    done: dict[int, LoRALayer] = {}
    for parent, attribute, layer in places:
        if id(layer) not in done:
            cls: Any = next(adapter for kind, adapter in _ADAPTERS.items() if isinstance(layer, kind))
            layer_prior = _prefixed(prior, names[id(layer)][0])
            options: dict[str, Any] = {"family": family, "prior": layer_prior, "bayesian": bayesian, "init": init}
            done[id(layer)] = cls(layer, rank, alpha, std_scale=std_scale, **options)
        adapter = done[id(layer)]
        if parent is None:
            return adapter
        setattr(parent, attribute, adapter)
        if (
            isinstance(parent, nn.TransformerEncoderLayer)
            and _transformer_fast_path_off not in adapter._forward_pre_hooks.values()
        ):
            adapter.register_forward_pre_hook(_transformer_fast_path_off)
    return model


def _adapter_layers(model: nn.Module) -> Iterator[tuple[str, LoRALayer]]:
    for name, module in model.named_modules():
        if isinstance(module, LoRALayer):
            yield name, module


def adapter_parameters(model: nn.Module) -> Iterator[nn.Parameter]:
    """The adapters' parameters (each once): the variational parameters of the Bayesian matrices and the point
    estimates; what an optimizer built by hand should hold (``torch.optim.AdamW(adapter_parameters(model))``)."""
    seen: set[int] = set()
    for _, layer in _adapter_layers(model):
        for name, parameter in layer.named_parameters():
            if not name.startswith("base.") and id(parameter) not in seen:
                seen.add(id(parameter))
                yield parameter


def merge_adapters(model: nn.Module, mode: str = "mean") -> nn.Module:
    """A NEW plain model: every adapted layer replaced by its base layer with the posterior ``"mean"`` (or ``"mode"``)
    update merged in, ``W + (alpha / rank) E[B] E[A]``; the deployment path (no adapter left, the speed of the
    pretrained network). Other modules (a Bayesian head included) are copied as they are, and every parameter keeps the
    ``requires_grad`` it had (the merged layers are frozen like their base layers: ``requires_grad_(True)`` to train
    the result further). The user's forward hooks on an adapted layer move to its merged form. ``"mode"`` uses each
    matrix's posterior mode (the layer's ``sample_mode="mode"``). :func:`varbnn.to_deterministic` merges the adapters
    the same way and also makes every other Bayesian layer plain.
    """
    if mode not in ("mean", "mode"):
        raise ValueError(f"merge_adapters: mode must be 'mean' or 'mode', got {mode!r}")
    if not any(True for _ in _adapter_layers(model)):
        raise ValueError("merge_adapters: the model has no adapters (add them with varbnn.adapters.add_adapters)")
    new = copy.deepcopy(model)
    if isinstance(new, LoRALayer):
        return new.merged(mode)
    done: dict[int, nn.Module] = {}

    def replace(parent: nn.Module) -> None:
        for attribute, child in list(parent._modules.items()):
            if isinstance(child, LoRALayer):
                if id(child) not in done:
                    done[id(child)] = child.merged(mode)
                    for hooks in ("_forward_pre_hooks", "_forward_hooks"):  # the user's hooks, not ours
                        kept = {k: h for k, h in getattr(child, hooks).items() if h is not _transformer_fast_path_off}
                        getattr(done[id(child)], hooks).update(kept)
                setattr(parent, attribute, done[id(child)])
            elif child is not None:
                replace(child)

    replace(new)
    return new


def _adapter_keys(model: nn.Module) -> list[str]:
    prefixes = [f"{name}." if name else "" for name, _ in _adapter_layers(model)]
    keys = []
    for key in model.state_dict():
        for prefix in prefixes:
            if key.startswith(prefix) and not key[len(prefix) :].startswith("base."):
                keys.append(key)
                break
    return keys


def adapter_state_dict(model: nn.Module) -> dict[str, Any]:
    """Only the adapters' entries of ``model.state_dict()`` (their variational parameters, point estimates, priors'
    buffers and family records; not the frozen base weights), under the model's own keys: a checkpoint of what
    fine-tuning trained, to load with :func:`load_adapter_state_dict` into the same pretrained model adapted the same
    way."""
    full = model.state_dict()
    keys = _adapter_keys(model)
    if not keys:
        raise ValueError("adapter_state_dict: the model has no adapters (add them with varbnn.adapters.add_adapters)")
    return {key: full[key] for key in keys}


def load_adapter_state_dict(model: nn.Module, state: dict[str, Any]) -> nn.Module:
    """Load :func:`adapter_state_dict`'s entries into an adapted ``model`` (the base weights are left alone), strictly:
    a key the model's adapters lack or an adapter key the state lacks raises a ``ValueError`` naming them, before
    anything is loaded. Returns ``model``."""
    if not isinstance(state, dict):
        raise TypeError(f"load_adapter_state_dict: state must be a dict (from adapter_state_dict), got {type(state).__name__}")
    expected = _adapter_keys(model)
    if not expected:
        raise ValueError("load_adapter_state_dict: the model has no adapters; adapt it as it was when saved (add_adapters)")
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in set(expected)]
    if missing or unexpected:
        raise ValueError(
            f"load_adapter_state_dict: the state does not fit the model's adapters: missing keys {_few(missing)}, "
            f"unexpected keys {_few(unexpected)} (adapt the model with the same include, rank, family and bayesian as "
            "when it was saved)"
        )
    result = model.load_state_dict(state, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    return model


def _few(keys: Sequence[str], count: int = 6) -> str:
    return str(list(keys[:count]))[:-1] + (f", ... ({len(keys)} in all)]" if len(keys) > count else "]")
