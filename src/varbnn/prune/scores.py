"""Structured scores of radial-and-directional weights (Oh et al. 2020, section 3.3): the log mode of each group's
local radius, the per-layer gap rule and fixed thresholds on those scores, the kept-group masks they give, and the
histograms of the scores (paper Fig. 7)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from varbnn.families.rdp import RadialDirectional
from varbnn.nn.base import BayesianModule

__all__ = ["GroupKey", "ThresholdSpec", "unit_scores", "gap_threshold", "select_units", "score_histograms"]

GroupKey = tuple[str, str]
"""A group of scores: ``(qualified layer name, "row" | "column")``."""
ThresholdSpec = float | str | Mapping[GroupKey, float]
"""A pruning threshold on the scores: ``"gap"`` (the per-layer gap rule), one number for every layer and grouping, or
``{(layer, grouping): number}`` one by one."""


@torch.no_grad()
def unit_scores(model: nn.Module) -> dict[GroupKey, torch.Tensor]:
    """``{(layer name, "row" | "column"): score of each group}`` for every RadialDirectional weight: the log of the mode
    of the group's LOCAL radius log-normal, ``log mode(z_g) = m - v`` with ``log z_g ~ N(m, v)`` (Oh et al. 2020, section
    3.3; :meth:`~varbnn.families.RadialDirectional.log_radius_mode`). Raises ``ValueError`` when there is none."""
    scores: dict[GroupKey, torch.Tensor] = {}
    for name, module in model.named_modules():
        if not isinstance(module, BayesianModule) or "weight" not in module.posteriors:
            continue
        family = module.posteriors["weight"]
        if isinstance(family, RadialDirectional):
            for grouping in family.groupings:
                scores[(name, grouping)] = family.log_radius_mode(grouping).detach().cpu()
    if not scores:
        raise ValueError("unit_scores: the model has no RadialDirectional weight to score")
    return scores


def gap_threshold(scores: torch.Tensor, min_gap: float = 1.0) -> float:
    """Midpoint of the widest gap between consecutive sorted ``scores`` if it is >= ``min_gap``, else ``-inf``
    (prune nothing)."""
    if scores.dim() != 1 or scores.numel() == 0:
        raise ValueError(f"gap_threshold needs a non-empty 1-d tensor, got shape {tuple(scores.shape)}")
    if not torch.isfinite(scores).all():
        raise ValueError("gap_threshold: scores contain NaN or inf")
    if scores.numel() < 2:
        return float("-inf")
    ordered = scores.double().sort().values
    gaps = ordered[1:] - ordered[:-1]
    widest = int(gaps.argmax())
    if float(gaps[widest]) < min_gap:
        return float("-inf")
    return float((ordered[widest] + ordered[widest + 1]) / 2)


def _thresholds(scores: Mapping[GroupKey, torch.Tensor], threshold: ThresholdSpec, min_gap: float) -> dict[GroupKey, float]:
    if isinstance(threshold, str):
        if threshold != "gap":
            raise ValueError(f"threshold must be a number, a mapping or 'gap', got {threshold!r}")
        return {key: gap_threshold(value, min_gap) for key, value in scores.items()}
    if isinstance(threshold, Mapping):
        missing = sorted(set(scores) - set(threshold))
        if missing:
            raise ValueError(f"threshold mapping lacks {missing}")
        cuts = {key: float(threshold[key]) for key in scores}
    else:
        cuts = {key: float(threshold) for key in scores}
    bad = {key: cut for key, cut in cuts.items() if math.isnan(cut) or cut == math.inf}
    if bad:
        raise ValueError(
            f"threshold must be a number < inf (or -inf: keep every unit), not NaN or inf, got {bad}: such a threshold "
            "keeps no unit"
        )
    return cuts


def select_units(model: nn.Module, threshold: ThresholdSpec = "gap", min_gap: float = 1.0) -> dict[GroupKey, torch.Tensor]:
    """Boolean masks of the groups to KEEP, ``{(layer, grouping): mask}`` (score >= threshold), for the
    :func:`unit_scores` of ``model``. ``threshold``: a :data:`ThresholdSpec` (default ``"gap"``, the per-layer
    :func:`gap_threshold` with ``min_gap`` nats)."""
    scores = unit_scores(model)
    cut = _thresholds(scores, threshold, min_gap)
    return {key: value >= cut[key] for key, value in scores.items()}


def score_histograms(
    model: nn.Module,
    path: str | os.PathLike[str],
    threshold: ThresholdSpec = "gap",
    min_gap: float = 1.0,
    bins: int = 40,
    title: str = "",
    second: Mapping[GroupKey, float] | None = None,
    second_label: str = "validation",
) -> Path:
    """One histogram of group scores per layer and grouping, with the threshold as a vertical line (paper Fig. 7);
    ``second``: a second set of thresholds (e.g. :func:`validation_thresholds`'), drawn dotted and counted in the
    titles as ``second_label``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = unit_scores(model)
    cut = _thresholds(scores, threshold, min_gap)
    n = len(scores)
    fig, axes = plt.subplots(1, n, figsize=(3.4 * n, 3.0), squeeze=False)
    for ax, (key, values) in zip(axes[0], scores.items()):
        ax.hist(values.numpy(), bins=bins, color="tab:blue", alpha=0.8)
        kept = int((values >= cut[key]).sum())
        if cut[key] != float("-inf"):
            ax.axvline(cut[key], color="tab:red", linestyle="--")
        label = f"{key[0]} {key[1]}s: keep {kept}/{values.numel()}"
        if second is not None:
            if second[key] != float("-inf"):
                ax.axvline(second[key], color="tab:green", linestyle=":")
            label += f" ({second_label}: {int((values >= second[key]).sum())})"
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("log mode of local radius")
    axes[0][0].set_ylabel("groups")
    from varbnn.plots import save_figure as _save

    return _save(fig, path, title, dpi=110)

