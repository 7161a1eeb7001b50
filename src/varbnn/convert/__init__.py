"""Turn a plain model into a Bayesian one and back, by a registry of module types.

``bayesianize`` dispatches on the module's type (walking its MRO), never on class-name strings, and
returns a NEW model; the input is not modified. Register your own layer types with
:func:`register_converter` and :func:`register_deterministic`, and types to leave alone on purpose with
:func:`register_left_deterministic`.

What happens to each module type:

* converted: ``nn.Linear``, ``nn.Conv1d``/``Conv2d``/``Conv3d`` (zero padding), ``nn.Embedding`` (no ``max_norm``, no
  ``sparse``), ``nn.LSTM`` and ``nn.GRU`` (unidirectional, no projections), ``nn.MultiheadAttention`` (to
  :class:`~varbnn.nn.BayesMultiheadAttention`: every projection tensor random, its ``out_proj`` included). An
  unsupported option of these types is refused with a ``NotImplementedError`` that names the module (``exclude`` it to
  keep it deterministic). The transformer layers (``nn.TransformerEncoderLayer``, ``nn.TransformerEncoder``,
  ``nn.TransformerDecoderLayer`` ...) are containers: their attention and ``Linear`` layers are converted, and torch's
  fused eval-mode fast path of the encoder layer and stack, which reads plain weights, is switched off where they hold
  a Bayesian module (:mod:`~varbnn.convert.fastpath`; :func:`to_deterministic` switches it back on).
* left deterministic by design, silently: normalisation layers (``BatchNorm*``, ``SyncBatchNorm``, ``InstanceNorm*``,
  ``LayerNorm``, ``GroupNorm``, ``RMSNorm``): their affine parameters are few, act on normalised activations, and
  batch norm's running statistics are not weights one can put a posterior on; and whatever the user excludes. (A
  batch norm with running statistics AFTER a Bayesian layer gets one :class:`ConversionWarning`: its statistics
  average over weight draws, so each sampled network is normalised with statistics that are not its own.)
* left deterministic and reported with a :class:`ConversionWarning` (an error under ``strict=True``):
  any module that owns parameters and has no registered Bayesian form (e.g. ``nn.Bilinear``,
  ``nn.EmbeddingBag``, ``nn.ConvTranspose2d``, ``nn.RNN``, ``nn.PReLU``, a custom module's own ``nn.Parameter``).
  The children of the last kind are still converted. Also left deterministic and reported, because converting them
  would silently change what they compute: a subclass of a convertible type that overrides ``forward`` (or
  ``_conv_forward``), an ``nn.MultiheadAttention`` whose ``out_proj`` is parametrized or carries more than a weight and a
  bias, a convertible module with parametrizations (``torch.nn.utils.parametrize``, e.g.
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
  sits inside a subtree left as it is (excluded, frozen, a module that is Bayesian already) at one place stays as it
  is at all its places, one plain object; its report row names the subtree (deliberate when that subtree is excluded
  or frozen, warned otherwise). A module inside a module that a registered converter replaces as a whole (e.g. the
  ``out_proj`` of an ``nn.MultiheadAttention``) cannot stay one object with its other places: that gets a
  :class:`ConversionWarning`.
* a converted layer is put on the plain module's device, its posteriors in its floating dtype (``float16``,
  ``bfloat16`` ...; the priors keep theirs), with the plain module's forward and backward hooks. A module on the meta
  device gives a meta Bayesian layer (``to_empty`` then a state dict fills it). A lazy module (``nn.LazyLinear``)
  must have run once first: its shapes are unknown, and it is refused with a ``ValueError`` saying so.

One module per idea: :mod:`~varbnn.convert.registry` (the registries and their lookup, the reasons),
:mod:`~varbnn.convert.converters` (the built-in converters), :mod:`~varbnn.convert.structure` (shared modules, tied
parameters, what a Bayesian layer would not reproduce), :mod:`~varbnn.convert.placement` (device, dtype and hooks of a
replacement), :mod:`~varbnn.convert.walker` (the walk), :mod:`~varbnn.convert.report` (the report and the warning
category), :mod:`~varbnn.convert.batchnorm` (batch norm after Bayesian layers), :mod:`~varbnn.convert.fastpath`
(torch's transformer fast paths), :mod:`~varbnn.convert.to_bayesian`
(``bayesianize``) and :mod:`~varbnn.convert.to_plain` (``to_deterministic``).
"""

from __future__ import annotations

from varbnn.convert import converters  # noqa: F401  (registers the built-in converters)
from varbnn.convert.batchnorm import recalibrate_batchnorm
from varbnn.convert.registry import (  # noqa: F401  (the registries and reasons, as varbnn.convert.<name> before the split)
    _CONVERTERS,
    _DETERMINIZERS,
    _LEFT,
    EXCLUDED,
    FROZEN,
    NO_BAYESIAN_FORM,
    NORMALISATION,
    ConversionContext,
    Converter,
    Determinizer,
    register_converter,
    register_deterministic,
    register_left_deterministic,
)
from varbnn.convert.report import ConversionReport, ConversionWarning, ConvertedModule, DeterministicModule
from varbnn.convert.to_bayesian import bayesianize
from varbnn.convert.to_plain import to_deterministic
from varbnn.convert.walker import conversion_report

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
