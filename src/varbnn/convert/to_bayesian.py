""":func:`bayesianize`: checks its arguments, deep-copies the model, resolves the families and priors of each
module, walks the copy (twice when a module sits at several places: a dry walk first finds the modules to keep as they
are) and warns about what it left deterministic (:class:`ConversionWarning`; ``strict=True`` raises instead).
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import Iterable, Sequence
from typing import Literal, overload

from torch import nn
from torch.distributions import Distribution

from varbnn.convert.batchnorm import _warn_batch_norm_after_bayesian
from varbnn.convert.converters import register_optional_converters
from varbnn.convert.fastpath import disable_fast_paths
from varbnn.convert.registry import ConversionContext
from varbnn.convert.report import ConversionReport, ConversionWarning, DeterministicModule, _by_type
from varbnn.convert.structure import _Pin, _places, _tied_parameters, _warn_split_by_converters
from varbnn.convert.walker import _Walker
from varbnn.families.base import VariationalFamily
from varbnn.families.gaussian import MeanField
from varbnn.priors import Normal, Prior, PriorSpec, as_prior


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

    Converted: ``nn.Linear``, ``nn.Conv1d``/``Conv2d``/``Conv3d``, ``nn.Embedding``, ``nn.LSTM``, ``nn.GRU``,
    ``nn.MultiheadAttention`` (to :class:`~varbnn.nn.BayesMultiheadAttention`, every projection random) and their
    subclasses; more with :func:`register_converter`. The transformer layers are walked into (their attention and
    ``Linear`` layers converted); torch's fused eval-mode fast path of ``nn.TransformerEncoderLayer`` and
    ``nn.TransformerEncoder``, which reads plain weights, is switched off where they hold a Bayesian module, so that
    every pass draws (their regular path computes the same function; padded positions of a key padding mask then get
    outputs, where the nested-tensor path gave zeros). Left deterministic ON PURPOSE, without a warning: normalisation
    layers (``BatchNorm*``, ``SyncBatchNorm``, ``InstanceNorm*``, ``LayerNorm``, ``GroupNorm``, ``RMSNorm``) and what
    ``exclude`` names. Left
    deterministic and REPORTED: every other module that owns parameters (``nn.Bilinear``, ``nn.EmbeddingBag``,
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
    (an excluded parent, a frozen module; its row says so). Frozen modules (all parameters
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
    register_optional_converters()  # e.g. transformers' Conv1D, once the user has imported transformers
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
    disable_fast_paths(new)  # torch's fused transformer fast path reads plain weights a Bayesian layer does not have
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
