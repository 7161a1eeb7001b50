"""Graves' (2011, section 7) weight pruning by the relative density at zero: the ``|mu| / sigma >= lambda`` rule
(eq. 19, :data:`SAFE_LAMBDA` of eq. 20; see the :mod:`varbnn.prune` docstring) applied to every Gaussian tensor, and
the export of the pruned model as a plain model with sparse weights."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from varbnn.convert import to_deterministic
from varbnn.families.meanfield import MeanField
from varbnn.nn.base import BayesianModule

__all__ = [
    "SAFE_LAMBDA",
    "lambda_from_gamma",
    "relative_density_at_zero",
    "density_ratio_masks",
    "prune_by_density_ratio",
    "count_nonzero_weights",
    "export_sparse",
]

SAFE_LAMBDA = math.sqrt(math.log(2))
"""Graves' (2011, eq. 20) rule of thumb: prune up to the point where a pruned weight is less probable than an average
draw, ``lambda = sqrt(2 ln sqrt(2)) = sqrt(ln 2) ~= 0.8326`` (relative density 1/sqrt(2); see the module docstring)."""


def lambda_from_gamma(gamma: float) -> float:
    """``lambda = sqrt(-2 ln gamma)`` for a relative-density threshold ``gamma`` in (0, 1]."""
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    return math.sqrt(-2.0 * math.log(gamma))


def _gaussian_tensors(model: nn.Module) -> Iterator[tuple[str, MeanField]]:
    for prefix, module in model.named_modules():
        if isinstance(module, BayesianModule):
            for name, posterior, _ in module.bayesian_tensors():
                if isinstance(posterior, MeanField):
                    yield (f"{prefix}.{name}" if prefix else name), posterior


@torch.no_grad()
def relative_density_at_zero(family: MeanField) -> torch.Tensor:
    """``q_i(0) / q_i(mode) = exp(-mu_i^2 / (2 sigma_i^2))`` for every weight of a Gaussian family (pruned weights: 1)."""
    ratio = torch.exp(-0.5 * (family.loc / family.scale).square())
    return ratio if family.weight_mask is None else torch.where(family.weight_mask > 0, ratio, torch.ones_like(ratio))


@torch.no_grad()
def density_ratio_masks(model: nn.Module, lam: float) -> dict[str, torch.Tensor]:
    """``{tensor name: keep}`` with ``keep = |mu| / sigma >= lam`` (and not already pruned) for every Gaussian tensor."""
    if not (isinstance(lam, (int, float)) and math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lambda must be a finite number >= 0, got {lam!r}")
    masks = {}
    for name, family in _gaussian_tensors(model):
        keep = (family.loc.abs() / family.scale) >= lam
        if family.weight_mask is not None:
            keep &= family.weight_mask > 0
        masks[name] = keep
    if not masks:
        raise ValueError("the model has no Gaussian (MeanField / KTied) tensors to prune")
    return masks


@torch.no_grad()
def prune_by_density_ratio(model: nn.Module, lam: float, *, include_biases: bool = True) -> dict[str, Any]:
    """Fix at 0 every Gaussian weight with ``|mu| / sigma < lam`` (Graves 2011 eq. 19), in place; weights pruned before
    stay pruned. Returns ``{"lambda", "kept", "total", "fraction", "tensors": {name: [kept, total]}}``.
    ``include_biases=False`` leaves 1-d tensors (biases) unpruned."""
    masks = density_ratio_masks(model, lam)
    families = dict(_gaussian_tensors(model))
    tensors: dict[str, list[int]] = {}
    for name, keep in masks.items():
        family = families[name]
        if family.loc.dim() < 2 and not include_biases:
            keep = torch.ones_like(keep) if family.weight_mask is None else family.weight_mask > 0
        family.prune_(keep)
        tensors[name] = [int(keep.sum()), keep.numel()]
    kept, total = sum(k for k, _ in tensors.values()), sum(t for _, t in tensors.values())
    return {"lambda": float(lam), "kept": kept, "total": total, "fraction": kept / max(total, 1), "tensors": tensors}


def count_nonzero_weights(model: nn.Module) -> tuple[int, int]:
    """(nonzero, total) entries over the parameters of a plain model (e.g. from :func:`export_sparse`)."""
    nonzero = sum(int(torch.count_nonzero(p)) for p in model.parameters())
    return nonzero, sum(p.numel() for p in model.parameters())


def export_sparse(model: nn.Module, mode: str = "mode") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A plain PyTorch model at the posterior ``mode`` (or ``"mean"``) in which pruned weights are exactly 0, and its
    state dict with every weight matrix / kernel as a sparse COO tensor (what one would store or ship). Load the
    latter back with ``{k: v.to_dense() for k, v in sparse.items()}``."""
    plain = to_deterministic(model, mode)
    sparse = {k: (v.to_sparse() if v.dim() >= 2 else v.clone()) for k, v in plain.state_dict().items()}
    return plain, sparse
