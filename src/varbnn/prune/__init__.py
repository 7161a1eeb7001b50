"""Pruning: structured pruning by the radius of radial-and-directional posteriors (Oh et al. 2020, section 3.3), and
Graves' (2011, section 7) weight pruning by the relative density at zero.

Weight pruning: a Gaussian weight ``N(mu, sigma^2)`` whose density at zero, relative to its density at the mode,
``exp(-mu^2 / (2 sigma^2))``, exceeds ``gamma`` is removed, i.e. kept only if ``|mu| / sigma >= lambda`` with
``lambda = sqrt(-2 ln gamma)`` (eq. 19); ``lambda = 0`` removes nothing and ``sqrt(2 ln sqrt(2)) = sqrt(ln 2) ~= 0.83``
(eq. 20) is the "safe" rule of thumb. Removed weights are fixed at 0 (not sampled, no complexity cost); retraining
continues with the mask (:meth:`varbnn.families.MeanField.prune_`).

Eq. 20 follows from the stated rule: an average draw from ``N(mu,
sigma^2)`` has density ``E_q[q(w)] = q(mode) / sqrt(2)``, and ``exp(-lambda^2 / 2) = 1 / sqrt(2)`` at ``lambda =
sqrt(ln 2)``. :data:`SAFE_LAMBDA` is therefore ``sqrt(ln 2)``.

Structured pruning:
Each group (an output unit / channel for row grouping, an input unit / channel for column grouping) of a
:class:`~varbnn.families.RadialDirectional` weight is scored by the log of the mode of its LOCAL radius log-normal,
``m - v`` (the global factor scales every group of a layer alike). A group whose score falls below the threshold
is pruned.

Threshold rule (``"gap"``): per layer and grouping, sort the scores and cut at the midpoint of the widest gap
between consecutive scores, provided that gap is at least ``min_gap`` nats (a factor e^min_gap between the radius
modes on its two sides); otherwise nothing is pruned there. A number is used as the threshold for every layer, and
a mapping ``{(layer, grouping): number}`` sets them one by one.

Threshold rule on held-out data (:func:`validation_thresholds`): start from the gap rule, then remove more of the
lowest-scored groups of each layer and grouping as long as the exported model's error on a validation set stays
within ``tolerance`` of the unpruned point model's. The tolerance is spent in ``rounds`` equal steps; in each round
every (layer, grouping), in the model's order, removes the most groups (found by bisection on their number) that keep
the error within that round's budget; a last pass removes one group at a time wherever that still fits the whole
budget, so that no single further removal does. This is what Oh et al.'s published code leaves to a person (per-layer
thresholds set by hand while looking at the accuracies), made a rule that never sees the test set.
Size budget (:func:`budget_units`): from the gap rule, remove a further few of the lowest-scored groups of whichever
(layer, grouping) costs the least validation error per unit of budget excess removed, until the exported model's FLOPs
and / or parameters are within the budget (how a target such as "<= 120K FLOPs" is met; the scores still decide
which units of a layer go). :func:`finetune` then optionally retrains the exported plain model (Graves 2011's
"prune and retrain"); :func:`iterative_budget` reaches the budget in several such prune-and-retrain stages, each
stage pruning the previous stage's retrained model.

Modules (lower ones never import higher ones): :mod:`~varbnn.prune.density` (Graves' rule and sparse export),
:mod:`~varbnn.prune.scores` (radius scores, the gap rule and fixed thresholds, histograms), :mod:`~varbnn.prune.export`
(the smaller plain model, parameter and FLOPs counts), :mod:`~varbnn.prune.thresholds` (validation and budget rules)
and :mod:`~varbnn.prune.retrain` (fine-tuning, distillation, re-initialisation, staged pruning). Every name is
importable from :mod:`varbnn.prune` itself.
"""

from __future__ import annotations

from varbnn.prune.density import (
    SAFE_LAMBDA,
    count_nonzero_weights,
    density_ratio_masks,
    export_sparse,
    lambda_from_gamma,
    prune_by_density_ratio,
    relative_density_at_zero,
)
from varbnn.prune.export import (
    SelectFeatures,
    count_parameters_and_flops,
    export,
    lenet5_sizes,
    masked_model,
)
from varbnn.prune.export import _export_plain as _export_plain
from varbnn.prune.retrain import LR_SCHEDULES as LR_SCHEDULES
from varbnn.prune.retrain import (
    finetune,
    iterative_budget,
    predictive_targets,
    reinitialize,
)
from varbnn.prune.scores import GroupKey as GroupKey
from varbnn.prune.scores import ThresholdSpec as ThresholdSpec
from varbnn.prune.scores import (
    gap_threshold,
    score_histograms,
    select_units,
    unit_scores,
)
from varbnn.prune.thresholds import _budget_search as _budget_search
from varbnn.prune.thresholds import _RankedGroups as _RankedGroups
from varbnn.prune.thresholds import (
    budget_units,
    classification_error,
    validation_thresholds,
)

__all__ = [
    "GroupKey",
    "ThresholdSpec",
    "LR_SCHEDULES",
    "unit_scores",
    "gap_threshold",
    "select_units",
    "validation_thresholds",
    "budget_units",
    "iterative_budget",
    "predictive_targets",
    "classification_error",
    "finetune",
    "reinitialize",
    "score_histograms",
    "export",
    "masked_model",
    "count_parameters_and_flops",
    "lenet5_sizes",
    "SelectFeatures",
    "SAFE_LAMBDA",
    "lambda_from_gamma",
    "relative_density_at_zero",
    "density_ratio_masks",
    "prune_by_density_ratio",
    "export_sparse",
    "count_nonzero_weights",
]
