"""Variational low-rank adapters (LoRA) for fine-tuning a pretrained network with a posterior over the update.

:func:`add_adapters` wraps chosen ``nn.Linear`` (and ``nn.Conv2d``, and the packed input projection of
``nn.MultiheadAttention``) layers of any ``nn.Module``; every pretrained
parameter is frozen and each adapted layer computes (Hu et al. 2022, "LoRA", eq. 3)

    y = base(x) + (alpha / rank) * B (A x),        A: (rank, in),  B: (out, rank),

with ``A`` initialised small and random and ``B`` at exactly zero, so the adapted model IS the pretrained one at
initialisation. A varbnn family (``MeanField()`` by default, or started relative to ``A``'s own scale with ``std_scale``;
``KTied()``, ``Radial()``, ``Delta()`` ...) is the posterior of ``A``
(BLoB's parameterisation: Wang et al. 2024, "BLoB: Bayesian Low-Rank Adaptation by Backpropagation for Large Language
Models", NeurIPS), of ``B`` or of both (``bayesian``); the matrices without a posterior are point estimates with no
prior. The adapted layers are :class:`~varbnn.nn.BayesianModule` s whose
``bayesian_tensors()`` are the adapter's, so :func:`varbnn.kl`, :func:`varbnn.fit`, :func:`varbnn.predict`,
:func:`varbnn.evaluate`, :class:`varbnn.calibration.TemperatureScaled`, ``sample_mode`` and
:class:`varbnn.optim.IVON` work on an adapted model unchanged.

For deployment :func:`merge_adapters` (or :func:`varbnn.to_deterministic`, for which the adapted layers register
their plain form) folds each adapter's posterior mean into the base weight, ``W + (alpha / rank) E[B] E[A]``
(``E[BA] = E[B] E[A]``: the two posteriors are independent). :func:`adapter_state_dict` and
:func:`load_adapter_state_dict` save and load only what was trained.
"""

from varbnn.adapters.adapt import (
    adapter_parameters,
    adapter_state_dict,
    add_adapters,
    load_adapter_state_dict,
    merge_adapters,
)
from varbnn.adapters.layers import (
    BAYESIAN_CHOICES,
    INIT_CHOICES,
    LoRAConv2d,
    LoRALayer,
    LoRALinear,
    LoRAMultiheadAttention,
)

__all__ = [
    "add_adapters",
    "merge_adapters",
    "adapter_parameters",
    "adapter_state_dict",
    "load_adapter_state_dict",
    "LoRALayer",
    "LoRALinear",
    "LoRAConv2d",
    "LoRAMultiheadAttention",
    "BAYESIAN_CHOICES",
    "INIT_CHOICES",
]
