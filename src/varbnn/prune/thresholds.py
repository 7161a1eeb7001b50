"""Thresholds chosen on held-out data: the validation rule (:func:`validation_thresholds`) and the size-budget rule
(:func:`budget_units`), both searching over the numbers of lowest-scored groups removed from the gap rule's start
(see the :mod:`varbnn.prune` docstring), and the classification error they are judged by."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from varbnn.convert import to_deterministic
from varbnn.prune.export import _chain, _export_plain, _trace_shapes
from varbnn.prune.scores import GroupKey, ThresholdSpec, _thresholds, unit_scores

__all__ = ["classification_error", "validation_thresholds", "budget_units"]

@torch.no_grad()
def classification_error(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> float:
    """Fraction of ``x`` that a plain classifier ``model`` labels wrongly (argmax of its outputs), in ``batch_size``
    chunks on the model's device."""
    _check_xy(x, y)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    wrong = 0
    for start in range(0, x.shape[0], batch_size):
        logits = model(x[start : start + batch_size].to(device))
        wrong += int((logits.argmax(-1).cpu() != y[start : start + batch_size].cpu()).sum())
    model.train(was_training)
    return wrong / x.shape[0]


class _RankedGroups:
    """The groups of every RDP weight ranked by score, the start counts of a threshold rule, and the exported model's
    (validation error, parameters, FLOPs) for given numbers of lowest-scored groups removed (cached)."""

    def __init__(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, start: ThresholdSpec, min_gap: float, mode: str,
        batch_size: int,
    ) -> None:  # fmt: skip

        self.x, self.y, self.batch_size = x, y, batch_size
        self.scores = unit_scores(model)
        cut = _thresholds(self.scores, start, min_gap)
        self.order = {key: value.double().argsort(stable=True) for key, value in self.scores.items()}
        self.sizes = {key: value.numel() for key, value in self.scores.items()}
        self.start = {key: min(int((v < cut[key]).sum()), self.sizes[key] - 1) for key, v in self.scores.items()}
        self.dense = to_deterministic(model, mode)
        chain = _chain(self.dense)
        self.shapes = _trace_shapes(chain, x[:1])
        last = [name for name, m in chain if isinstance(m, (nn.Linear, nn.Conv2d))][-1]
        # the groups a search may remove: not the last layer's rows (export keeps the model's outputs), at least one
        # group left of each
        self.searchable = [k for k in self.scores if self.sizes[k] > 1 and k != (last, "row")]
        self.start = {k: (n if k in self.searchable else 0) for k, n in self.start.items()}
        self.errors: dict[tuple[int, ...], float] = {}
        self.sizes_cache: dict[tuple[int, ...], tuple[int, int]] = {}

    def masks(self, counts: Mapping[GroupKey, int]) -> dict[GroupKey, torch.Tensor]:
        out = {}
        for key, n in counts.items():
            keep = torch.ones(self.sizes[key], dtype=torch.bool)
            keep[self.order[key][:n]] = False
            out[key] = keep
        return out

    def _export(self, counts: Mapping[GroupKey, int]) -> tuple[nn.Module, tuple[int, ...]]:
        signature = tuple(counts[key] for key in self.scores)
        exported, report = _export_plain(self.dense, self.x[:2], self.masks(counts), self.shapes)
        self.sizes_cache[signature] = (int(report["parameters"]), int(report["flops"]))  # type: ignore[call-overload]
        return exported, signature

    def size(self, counts: Mapping[GroupKey, int]) -> tuple[int, int]:
        """(parameters, FLOPs) of the exported model."""
        signature = tuple(counts[key] for key in self.scores)
        if signature not in self.sizes_cache:
            self._export(counts)
        return self.sizes_cache[signature]

    def error(self, counts: Mapping[GroupKey, int]) -> float:
        signature = tuple(counts[key] for key in self.scores)
        if signature not in self.errors:
            exported, _ = self._export(counts)
            self.errors[signature] = classification_error(exported, self.x, self.y, self.batch_size)
        return self.errors[signature]

    def evaluate(self, counts: Mapping[GroupKey, int]) -> tuple[float, int, int]:
        error = self.error(counts)
        return (error, *self.size(counts))

    @torch.no_grad()
    def load_exported(self, exported: nn.Sequential, report: Mapping[str, Any]) -> None:
        """Write the weights of ``exported`` (an :func:`_export_plain` of ``self.dense`` with ``report``, retrained)
        back into the kept rows and columns of ``self.dense``, so that later exports start from them; clears the
        cached errors (the sizes stay valid)."""
        weighted = [m for _, m in _chain(self.dense) if isinstance(m, (nn.Linear, nn.Conv2d))]
        new = [m for m in exported if isinstance(m, (nn.Linear, nn.Conv2d))]
        for module, small, rows, cols in zip(weighted, new, report["keep_out"], report["keep_in"]):
            r = torch.tensor(rows, dtype=torch.bool).nonzero().flatten().to(module.weight.device)
            c = torch.tensor(cols, dtype=torch.bool).nonzero().flatten().to(module.weight.device)
            module.weight[r[:, None], c[None, :]] = small.weight.to(module.weight.dtype)
            if module.bias is not None and small.bias is not None:
                module.bias[r] = small.bias.to(module.bias.dtype)
        self.errors.clear()

    def report(self, counts: Mapping[GroupKey, int]) -> dict[str, Any]:
        thresholds = {}
        for key, n in counts.items():
            ordered = self.scores[key].double()[self.order[key]]
            thresholds[key] = float("-inf") if n == 0 else float((ordered[n - 1] + ordered[n]) / 2)
        error, params, flops = self.evaluate(counts)
        return {
            "base_error": self.error(dict.fromkeys(self.scores, 0)),
            "start_error": self.error(self.start),
            "error": error,
            "parameters": params,
            "flops": flops,
            "removed": {f"{k[0]}/{k[1]}": n for k, n in counts.items()},
            "thresholds": thresholds,
            "evaluations": len(self.errors),
        }


def _check_xy(x: torch.Tensor, y: torch.Tensor) -> None:
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y need the same, non-zero number of rows, got {x.shape[0]} and {y.shape[0]}")


def validation_thresholds(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    tolerance: float = 1e-3,
    start: ThresholdSpec = "gap",
    min_gap: float = 1.0,
    rounds: int = 4,
    mode: str = "mode",
    batch_size: int = 1000,
    progress: bool = False,
) -> tuple[dict[GroupKey, torch.Tensor], dict[str, Any]]:
    """Keep masks ``{(layer, grouping): mask}`` chosen on held-out data ``(x, y)`` (see the module docstring): from
    the ``start`` rule, remove the lowest-scored groups while the exported model's classification error on ``(x, y)``
    stays <= the unpruned point model's + ``tolerance`` (a fraction: 1e-3 is 0.1 percentage points). At least one
    group of every (layer, grouping) is kept. Pass the masks to :func:`export` as ``keep``.

    Report: ``base_error`` (nothing pruned), ``start_error``, ``error``, ``parameters`` and ``flops`` of the selection,
    ``removed`` (groups removed per ``"layer/grouping"``), ``thresholds`` (midpoints between the last removed and first
    kept score, for plots) and the number of ``evaluations``."""
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and 0 <= tolerance < 1):
        raise ValueError(f"tolerance must be a fraction in [0, 1), got {tolerance!r}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    _check_xy(x, y)
    groups = _RankedGroups(model, x, y, start, min_gap, mode, batch_size)
    sizes, removed = groups.sizes, dict(groups.start)
    base = groups.error(dict.fromkeys(sizes, 0))
    steps = [(r, key) for r in range(rounds) for key in groups.searchable]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(steps), desc="validation thresholds", leave=False)
    for r, key in steps:
        budget = base + tolerance * (r + 1) / rounds + 1e-12
        lo, hi = removed[key], sizes[key] - 1  # lo: feasible (or the start), hi: the most that may go
        if groups.error(removed) <= budget:
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if groups.error({**removed, key: mid}) <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            removed[key] = lo
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    budget = base + tolerance + 1e-12
    if groups.error(removed) <= budget:  # finally: no single further removal fits the whole budget
        changed = True
        while changed:
            changed = False
            for key in groups.searchable:
                while removed[key] < sizes[key] - 1 and groups.error({**removed, key: removed[key] + 1}) <= budget:
                    removed[key] += 1
                    changed = True
    return groups.masks(removed), {**groups.report(removed), "tolerance": float(tolerance)}


def _check_budget(caller: str, max_flops: int | None, max_parameters: int | None, step: float) -> None:
    if max_flops is None and max_parameters is None:
        raise ValueError(f"{caller} needs max_flops and / or max_parameters")
    for name, value in (("max_flops", max_flops), ("max_parameters", max_parameters)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    if not 0 < step <= 1:
        raise ValueError(f"step must be a fraction in (0, 1], got {step!r}")


def _budget_search(
    groups: _RankedGroups,
    removed: dict[GroupKey, int],
    max_flops: int | None,
    max_parameters: int | None,
    step: float,
    progress: bool,
) -> tuple[dict[GroupKey, int], bool]:
    """The greedy loop of :func:`budget_units` from the counts ``removed``: the counts it ends with and whether the
    budget was reached."""
    sizes, n_val = groups.sizes, groups.x.shape[0]

    def excess(params: int, flops: int) -> float:
        over = 0.0
        if max_flops is not None:
            over += max(0.0, math.log(flops / max_flops))
        if max_parameters is not None:
            over += max(0.0, math.log(params / max_parameters))
        return over

    error, params, flops = groups.evaluate(removed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="budget pruning", leave=False)
    reached = excess(params, flops) == 0.0
    while not reached:
        best: tuple[float, dict[GroupKey, int]] | None = None
        for key in groups.searchable:
            kept = sizes[key] - removed[key]
            if kept <= 1:
                continue
            # a step of this grouping; more if its lowest groups are already gone from the export (another
            # grouping removed their units), until the size drops or nothing is left to remove
            n = removed[key] + min(kept - 1, max(1, int(step * kept)))
            gain = 0.0
            while True:
                candidate = {**removed, key: n}
                gain = excess(params, flops) - excess(*groups.size(candidate))
                if gain > 0 or n == sizes[key] - 1:
                    break
                n += 1
            if gain <= 0:
                continue
            c_error = groups.error(candidate)
            cost = (c_error - error + 1.0 / n_val) / gain
            if best is None or cost < best[0]:
                best = (cost, candidate)
        if best is None:
            break
        removed = best[1]
        error, params, flops = groups.evaluate(removed)
        reached = excess(params, flops) == 0.0
        if bar is not None:
            bar.update()
            bar.set_postfix(error=f"{error:.4f}", params=params, flops=flops)
    if bar is not None:
        bar.close()
    return removed, reached


def budget_units(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    max_flops: int | None = None,
    max_parameters: int | None = None,
    start: ThresholdSpec = "gap",
    min_gap: float = 1.0,
    step: float = 0.05,
    mode: str = "mode",
    batch_size: int = 1000,
    progress: bool = False,
) -> tuple[dict[GroupKey, torch.Tensor], dict[str, Any]]:
    """Keep masks that bring the exported model within a size budget (FLOPs and / or parameters, Oh et al.'s
    counts), choosing on held-out data ``(x, y)`` which layers give way.

    Rule: from the ``start`` rule, repeatedly remove a further ``step`` fraction (at least one) of the kept groups of
    one (layer, grouping), always its lowest-scored ones; the (layer, grouping) is the one whose removal costs the
    least validation error per unit of budget excess removed, ``(error increase + 1/len(x)) / (excess before - excess
    after)`` with excess ``max(0, log(flops / max_flops)) + max(0, log(parameters / max_parameters))``; stop when
    the excess is 0. At least one group of every (layer, grouping) stays; if no removal lowers the excess any more
    the report says ``reached: False``. The scores decide which units of a layer go, the validation set only how
    many. Report as :func:`validation_thresholds`', plus ``reached`` and the budget."""
    _check_budget("budget_units", max_flops, max_parameters, step)
    _check_xy(x, y)
    groups = _RankedGroups(model, x, y, start, min_gap, mode, batch_size)
    removed, reached = _budget_search(groups, dict(groups.start), max_flops, max_parameters, step, progress)
    report = groups.report(removed)
    report.update(reached=reached, max_flops=max_flops, max_parameters=max_parameters)
    return groups.masks(removed), report

