"""What :func:`varbnn.training.fit` tells a user about a run that went wrong in a way the library can see
(:class:`TrainingWarning`)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from varbnn.families.base import VariationalFamily
from varbnn.families.delta import Delta
from varbnn.nn.base import BayesianModule


class TrainingWarning(UserWarning):
    """Something in a finished :func:`fit` run that a user should act on (see :func:`fit`'s ``diagnose``)."""


def _warn_if_not_sampling(model: nn.Module) -> None:
    """Warn (:class:`TrainingWarning`) when Bayesian layers are set to a deterministic ``sample_mode``: their forward
    passes use the posterior's mean or mode, so the NLL gives the posterior's widths no gradient."""
    modes = sorted({m.sample_mode for m in model.modules() if isinstance(m, BayesianModule) and m.sample_mode != "sample"})
    if modes:
        warnings.warn(
            f"fit: the model's Bayesian layers are in sample_mode {modes} (set_sample_mode, or fit inside a "
            "`with sample_mode(...)` block), so training draws no weights and the NLL trains only the means: call "
            "varbnn.set_sample_mode(model, 'sample') first, unless that is what you want",
            TrainingWarning,
            stacklevel=3,
        )


_DETERMINISTIC_RATIO = 1e-3


_PRIOR_KL_PER_WEIGHT = 0.25


_DIAGNOSE_LABEL_BATCHES = 20


def _class_labels(y: Any) -> bool:
    """Whether a batch's targets look like class labels (integer, non-negative is checked later): the case in which
    the NLL of always predicting the label frequencies (their entropy) is known."""
    return isinstance(y, torch.Tensor) and not (y.is_floating_point() or y.is_complex() or y.dtype == torch.bool)


def _label_entropy(labels: list[torch.Tensor]) -> float | None:
    """Entropy (nats) of the class frequencies in ``labels``: the training NLL of a classifier that ignores its input.
    ``None`` without labels (regression, or a run resumed past its first batches)."""
    if not labels:
        return None
    flat = torch.cat(labels)
    if flat.numel() == 0 or int(flat.min()) < 0:
        return None
    p = torch.bincount(flat).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log()).sum())


@torch.no_grad()
def _diagnose(model: nn.Module, history: list[dict[str, float]], n_data: int, label_entropy: float | None = None) -> None:
    """One :class:`TrainingWarning` naming what went wrong, in words a user can act on (see :func:`fit`).

    ``label_entropy`` (classification): the NLL of predicting the label frequencies. A posterior near its prior is
    a problem only while the NLL stays near that marginal NLL; a network that fits from its first epoch (e.g. one
    converted with its trained weights) and keeps fitting is not warned about, however close to the prior its
    unused weights went."""
    import warnings

    first, recent = history[0]["nll"], sum(r["nll"] for r in history[-3:]) / len(history[-3:])
    problems = []
    weights = sum(m.mean.numel() for m in model.modules() if isinstance(m, VariationalFamily) and m.is_built)
    kl_per_weight = history[-1]["kl"] / max(weights, 1)
    near_marginal = label_entropy is None or recent > 0.5 * label_entropy
    barely_fell = recent > first - 0.1 * abs(first)  # fell by less than 10% of its first value, whatever its sign
    if len(history) >= 3 and weights and kl_per_weight < _PRIOR_KL_PER_WEIGHT and barely_fell and near_marginal:
        problems.append(
            f"the posterior sits on the prior (KL {kl_per_weight:.3g} nats per weight) and the training NLL did not fall "
            f"by 10% of its first-epoch value ({first:.4g} -> {recent:.4g} over the last epochs): the data barely "
            "moved the weights. Unless the targets carry that little signal, lower the KL weight (fit(beta=...)), train "
            "longer or at a larger learning rate, or use more data"
        )
    ratios = []
    for module in model.modules():
        if isinstance(module, VariationalFamily) and not isinstance(module, Delta) and module.is_built:
            try:
                mean, variance = module.moments()
            except NotImplementedError:
                continue
            ratios.append(float(variance.clamp_min(0).sqrt().mean() / mean.abs().mean().clamp_min(1e-12)))
    if ratios and max(ratios) < _DETERMINISTIC_RATIO:
        problems.append(
            f"the posterior is practically deterministic: its standard deviations are below {_DETERMINISTIC_RATIO:g} of "
            f"its means' magnitude in every tensor (largest ratio {max(ratios):.2g}), so predictive draws barely differ "
            "and the uncertainty is that of a plain network. Raise the family's init_std or the KL weight (beta)"
        )
    if problems:
        warnings.warn("fit: " + "; and ".join(problems) + ".", TrainingWarning, stacklevel=3)
