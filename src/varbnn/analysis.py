"""Post-hoc analysis of trained posteriors (Swiatkowski et al. 2020): low-rank structure of mean-field standard
deviations, rank-k replacement, and the gradient signal-to-noise ratio.

* :func:`std_matrix` -- a Gaussian posterior's standard deviations as the (out, rest) matrix.
* :func:`variance_explained` -- fraction of the matrix's squared Frobenius norm carried by each singular value,
  ``s_i^2 / sum_j s_j^2`` (the paper's Figure 3).
* :func:`low_rank` -- the best rank-k approximation (truncated SVD), clamped to stay positive.
* :func:`replace_stds_with_rank_k` -- a copy of a model whose every mean-field std matrix is replaced by its rank-k
  approximation (the paper's Table 2, evaluated with the usual metrics).
* :class:`GradientSNR` -- ``E[g]^2 / Var[g]`` per parameter over a window of the last batches (paper footnote 3),
  averaged over a parameter group.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from varbnn.families.ktied import KTied
from varbnn.families.meanfield import MeanField, inverse_softplus
from varbnn.nn.base import BayesianModule

__all__ = ["std_matrix", "variance_explained", "low_rank", "replace_stds_with_rank_k", "GradientSNR"]


def std_matrix(family: MeanField) -> torch.Tensor:
    """The posterior standard deviations of a built :class:`MeanField` (or :class:`KTied`) posterior as the
    (shape[0], prod(shape[1:])) matrix, detached."""
    if not isinstance(family, MeanField):
        raise TypeError(f"std_matrix needs a MeanField or KTied posterior, got {type(family).__name__}")
    shape = family._require_built()
    if len(shape) < 2:
        raise ValueError(f"std_matrix needs a weight tensor with >= 2 dimensions, got shape {tuple(shape)}")
    return family.scale.detach().reshape(KTied.matrix_shape(shape))


def variance_explained(matrix: torch.Tensor) -> torch.Tensor:
    """``s_i^2 / sum_j s_j^2`` for the singular values s of ``matrix`` (descending; sums to 1)."""
    if matrix.dim() != 2:
        raise ValueError(f"variance_explained needs a 2-d matrix, got shape {tuple(matrix.shape)}")
    s = torch.linalg.svdvals(matrix.double())
    energy = s.square()
    return (energy / energy.sum()).to(matrix.dtype)


def low_rank(matrix: torch.Tensor, rank: int, min_value: float | None = None) -> torch.Tensor:
    """Best rank-``rank`` approximation of ``matrix`` in Frobenius norm (truncated SVD).

    Standard deviations must stay positive: entries are clamped below at ``min_value`` (default: 1e-3 times
    the matrix's smallest positive entry), which only bites where the approximation undershoots to ~0 or below.
    """
    if not (isinstance(rank, int) and rank >= 1):
        raise ValueError(f"low_rank: rank must be an int >= 1, got {rank!r}")
    if matrix.dim() != 2:
        raise ValueError(f"low_rank needs a 2-d matrix, got shape {tuple(matrix.shape)}")
    u, s, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    approx = (u[:, :rank] * s[:rank]) @ vh[:rank]
    if min_value is None:
        positive = matrix[matrix > 0]
        min_value = 1e-3 * float(positive.min()) if positive.numel() else 1e-12
    return approx.clamp_min(min_value).to(matrix.dtype)


def replace_stds_with_rank_k(model: nn.Module, rank: int) -> nn.Module:
    """A deep copy of ``model`` in which every mean-field posterior of a >= 2-d weight has its standard deviations
    replaced by their rank-``rank`` approximation (means untouched; biases and other families untouched)."""
    clone = copy.deepcopy(model)
    replaced = 0
    for module in clone.modules():
        if not isinstance(module, BayesianModule):
            continue
        for family in module.posteriors.values():
            if type(family) is not MeanField or family.shape is None or len(family.shape) < 2:
                continue
            approx = low_rank(std_matrix(family), rank).reshape(family.shape)
            with torch.no_grad():
                family.rho.copy_(inverse_softplus(approx))
            replaced += 1
    if replaced == 0:
        raise ValueError("replace_stds_with_rank_k: the model has no MeanField posterior of a >= 2-d weight")
    return clone


class GradientSNR:
    """Gradient signal-to-noise ratio ``E[g]^2 / Var[g]`` per parameter element over the last ``window`` batches.

    Call :meth:`update` after each ``backward()`` (it reads ``.grad``); :meth:`snr` returns, per group, the mean
    over the group's elements. Var is the unbiased sample variance over the window.

    :param groups: ``{name: parameters}`` (a parameter or an iterable of them per group).
    :param window: number of most recent gradients kept (paper: 10).
    """

    def __init__(self, groups: Mapping[str, torch.Tensor | Iterable[torch.Tensor]], window: int = 10) -> None:
        if window < 2:
            raise ValueError(f"GradientSNR: window must be >= 2, got {window}")
        if not groups:
            raise ValueError("GradientSNR: give at least one parameter group")
        self.window = window
        self.groups: dict[str, list[torch.Tensor]] = {
            name: [params] if isinstance(params, torch.Tensor) else list(params) for name, params in groups.items()
        }
        self._history: dict[str, deque[torch.Tensor]] = {name: deque(maxlen=window) for name in self.groups}

    def update(self) -> None:
        """Append every group's current ``.grad`` (zeros for a parameter without one) to its window, dropping the
        oldest beyond ``window``."""
        for name, params in self.groups.items():
            grads = [p.grad.detach().reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1) for p in params]
            self._history[name].append(torch.cat(grads).double().clone())

    @property
    def ready(self) -> bool:
        """True once every group has a full window."""
        return all(len(h) == self.window for h in self._history.values())

    def snr(self) -> dict[str, float]:
        """Mean over each group's elements of E[g]^2 / Var[g] over the window (NaN before two updates)."""
        out = {}
        for name, history in self._history.items():
            if len(history) < 2:
                out[name] = float("nan")
                continue
            g = torch.stack(list(history))
            var = g.var(0)
            ratio = g.mean(0).square() / var.clamp_min(torch.finfo(var.dtype).tiny)
            out[name] = float(ratio[var > 0].mean()) if bool((var > 0).any()) else float("inf")
        return out
