"""Pruning: structured pruning by the radius of radial-and-directional posteriors (Oh et al. 2020, section 3.3), and
Graves' (2011, section 7) weight pruning by the relative density at zero.

Weight pruning: a Gaussian weight ``N(mu, sigma^2)`` whose density at zero, relative to its density at the mode,
``exp(-mu^2 / (2 sigma^2))``, exceeds ``gamma`` is removed, i.e. kept only if ``|mu| / sigma >= lambda`` with
``lambda = sqrt(-2 ln gamma)`` (eq. 19); ``lambda = 0`` removes nothing and ``sqrt(2 ln 2) ~= 0.83`` (eq. 20) is the
"safe" rule of thumb. Removed weights are fixed at 0 (not sampled, no complexity cost); retraining continues with the
mask (:meth:`varbnn.families.MeanField.prune_`).

Note on eq. 20: the paper prints the safe threshold as ``sqrt(2 ln 2) ~= 0.83``, but ``sqrt(2 ln 2) = 1.18``; the 0.83 it
uses (text and table 2) is ``sqrt(ln 2)``. That is also what the stated rule gives: an average draw from ``N(mu,
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
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from varbnn.families.gaussian import MeanField
from varbnn.families.rdp import RadialDirectional
from varbnn.nn.base import BayesianModule

__all__ = [
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
    "SelectFeatures",
    "SAFE_LAMBDA",
    "lambda_from_gamma",
    "relative_density_at_zero",
    "density_ratio_masks",
    "prune_by_density_ratio",
    "export_sparse",
    "count_nonzero_weights",
]

SAFE_LAMBDA = math.sqrt(math.log(2))
"""Graves' (2011, eq. 20) rule of thumb: prune up to the point where a pruned weight is less probable than an average
draw, ``lambda = sqrt(ln 2) ~= 0.8326`` (relative density 1/sqrt(2); the paper's printed ``sqrt(2 ln 2)`` is a typo for
the value 0.83 it uses, see the module docstring)."""

GroupKey = tuple[str, str]
LR_SCHEDULES = ("constant", "cosine")
ThresholdSpec = float | str | Mapping[GroupKey, float]


@torch.no_grad()
def unit_scores(model: nn.Module) -> dict[GroupKey, torch.Tensor]:
    """``{(layer name, "row" | "column"): log radius mode of each group}`` for every RadialDirectional weight."""
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
        return {key: float(threshold[key]) for key in scores}
    return {key: float(threshold) for key in scores}


def select_units(model: nn.Module, threshold: ThresholdSpec = "gap", min_gap: float = 1.0) -> dict[GroupKey, torch.Tensor]:
    """Boolean masks of the groups to KEEP, ``{(layer, grouping): mask}`` (score >= threshold)."""
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
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- export -------------------------------------------------------------------------------------------------------------


class SelectFeatures(nn.Module):
    """Keeps the features (``dim=1``: channels of an image batch, or units of a flat batch) listed in ``index``."""

    index: torch.Tensor

    def __init__(self, index: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("index", index.to(torch.long).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(1, self.index)

    def extra_repr(self) -> str:
        return f"{self.index.numel()} features"


_PASS_THROUGH = (
    nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.ELU, nn.LeakyReLU,
    nn.MaxPool2d, nn.AvgPool2d, nn.Dropout, nn.Identity, SelectFeatures,
)  # fmt: skip


def _chain(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The leaf modules of a (nested) ``nn.Sequential`` in execution order, checked to be exportable."""
    if not isinstance(model, nn.Sequential):
        raise NotImplementedError(f"export supports nn.Sequential chains, got {type(model).__name__}")
    leaves: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        if isinstance(child, nn.Sequential):
            leaves += [(f"{name}.{n}", m) for n, m in _chain(child)]
        elif isinstance(child, (nn.Linear, nn.Conv2d, nn.Flatten, *_PASS_THROUGH)):
            if isinstance(child, nn.Conv2d) and child.groups != 1:
                raise NotImplementedError(f"export: grouped convolution {name!r} is not supported")
            leaves.append((name, child))
        else:
            raise NotImplementedError(
                f"export: module {name!r} ({type(child).__name__}) is not supported; allowed: Linear, Conv2d, Flatten, "
                "element-wise activations, pooling, Dropout, nested Sequential"
            )
    return leaves


def _trace_shapes(chain: list[tuple[str, nn.Module]], example: torch.Tensor) -> dict[str, tuple[torch.Size, torch.Size]]:
    shapes: dict[str, tuple[torch.Size, torch.Size]] = {}
    x = example
    with torch.no_grad():
        for name, module in chain:
            y = module(x)
            shapes[name] = (x.shape[1:], y.shape[1:])
            x = y
    return shapes


def count_parameters_and_flops(model: nn.Module, example: torch.Tensor) -> tuple[int, int]:
    """Weights + biases of the Linear/Conv2d layers, and FLOPs by the paper's formulas: convolution
    ``(Kw Kh Cin + 1) Hout Wout Cout`` (= ``(Kw Kh Cin + 1)(H - Kh + 1 + P)(W - Kw + 1 + P) Cout`` at stride 1),
    dense ``(In + 1) Out``."""
    chain = _chain(model)
    shapes = _trace_shapes(chain, example[:1])
    params = flops = 0
    for name, module in chain:
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            params += sum(p.numel() for p in module.parameters())
            flops += _flops(module, shapes[name][1])
    return params, flops


def _flops(module: nn.Linear | nn.Conv2d, out_shape: torch.Size) -> int:
    """Oh et al.'s FLOPs of one layer; ``out_shape``: its output's shape without the batch (only H, W are read)."""
    if isinstance(module, nn.Linear):
        return (module.in_features + 1) * module.out_features
    kh, kw = module.kernel_size
    return (kh * kw * module.in_channels + 1) * out_shape[1] * out_shape[2] * module.out_channels


def export(
    model: nn.Module,
    example: torch.Tensor,
    keep: Mapping[GroupKey, torch.Tensor] | None = None,
    threshold: ThresholdSpec = "gap",
    min_gap: float = 1.0,
    mode: str = "mode",
) -> tuple[nn.Sequential, dict[str, object]]:
    """A smaller PLAIN model with the pruned units physically removed, and a report.

    ``model`` is a Bayesian ``nn.Sequential`` chain (Linear / Conv2d / Flatten / activations / pooling); its point
    weights are the posterior ``mode`` (or ``"mean"``). Units are pruned by ``keep`` masks (default:
    :func:`select_units` with ``threshold``): an output unit survives if its row group is kept AND the next layer
    still reads it through a kept column group; the last layer's outputs are never removed. Removed units are
    dropped with their biases, so the exported model equals :func:`masked_model` (the same point weights with those
    rows, biases and columns set to zero) on every input. ``example``: one input batch, for shapes and FLOPs.

    Report: ``architecture`` (kept units per layer, e.g. ``"4-7-110-66"``: conv output channels, then the first
    dense layer's input features and the dense output units except the last), per-layer ``layers``, and the
    ``parameters`` / ``flops`` of the dense and the exported model.
    """
    from varbnn.convert import to_deterministic

    keep = dict(keep) if keep is not None else select_units(model, threshold, min_gap)
    return _export_plain(to_deterministic(model, mode), example, keep)


def _export_plain(
    dense: nn.Module,
    example: torch.Tensor,
    keep: Mapping[GroupKey, torch.Tensor],
    shapes: Mapping[str, tuple[torch.Size, torch.Size]] | None = None,
) -> tuple[nn.Sequential, dict[str, object]]:
    """:func:`export` of an already plain (point-weight) copy ``dense`` of the model: ``dense`` is only read.
    ``shapes``: :func:`_trace_shapes` of ``dense`` (traced here if not given; pruning channels leaves every spatial
    size as it is, so the exported model's FLOPs follow from them)."""
    chain = _chain(dense)
    if shapes is None:
        shapes = _trace_shapes(chain, example[:1])
    weighted = [(n, m) for n, m in chain if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not weighted:
        raise ValueError("export: the model has no Linear or Conv2d layer")
    device = next(dense.parameters()).device
    out_keep: list[torch.Tensor] = []
    in_keep: list[torch.Tensor] = []  # over the layer's inputs: features (dense) or channels (conv)
    for i, (name, module) in enumerate(weighted):
        n_out = module.out_features if isinstance(module, nn.Linear) else module.out_channels
        n_in = module.in_features if isinstance(module, nn.Linear) else module.in_channels
        row = keep.get((name, "row"), torch.ones(n_out, dtype=torch.bool)).to(torch.bool).cpu()
        col = keep.get((name, "column"), torch.ones(n_in, dtype=torch.bool)).to(torch.bool).cpu()
        out_keep.append(row if i < len(weighted) - 1 else torch.ones(n_out, dtype=torch.bool))
        in_keep.append(col)
    # reconcile each consecutive pair: a unit lives if its row is kept and the next layer reads one of its features
    for i in range(len(weighted) - 1):
        n_out = out_keep[i].numel()
        n_next = in_keep[i + 1].numel()
        if n_next % n_out:
            raise ValueError(
                f"export: cannot map {n_out} outputs of {weighted[i][0]!r} onto {n_next} inputs of {weighted[i + 1][0]!r}"
            )
        per_unit = n_next // n_out  # spatial positions per channel after a Flatten, else 1
        reads = in_keep[i + 1].reshape(n_out, per_unit)
        alive = out_keep[i] & reads.any(dim=1)
        out_keep[i] = alive
        in_keep[i + 1] = (reads & alive[:, None]).reshape(-1)
    # build the exported chain
    layers: list[nn.Module] = []
    report_layers = []
    produced: torch.Tensor | None = None  # original indices of the units the previous weighted layer kept
    produced_units = 0
    index = 0
    for name, leaf in chain:
        if not isinstance(leaf, (nn.Linear, nn.Conv2d)):
            layers.append(leaf)
            continue
        wanted = in_keep[index].nonzero().flatten()
        n_in = in_keep[index].numel()
        if produced is None:
            arriving = torch.arange(n_in)
        else:
            per_unit = n_in // produced_units
            arriving = (produced[:, None] * per_unit + torch.arange(per_unit)).reshape(-1)
        if not torch.equal(arriving, wanted):
            position = {int(f): p for p, f in enumerate(arriving.tolist())}
            layers.append(SelectFeatures(torch.tensor([position[int(f)] for f in wanted.tolist()], device=device)))
        rows = out_keep[index].nonzero().flatten().to(device)
        cols = wanted.to(device)
        weight = leaf.weight.detach().index_select(0, rows).index_select(1, cols)
        bias = leaf.bias.detach().index_select(0, rows) if leaf.bias is not None else None
        if isinstance(leaf, nn.Linear):
            new: nn.Module = nn.Linear(cols.numel(), rows.numel(), bias is not None)
        else:
            new = nn.Conv2d(
                cols.numel(), rows.numel(), leaf.kernel_size, leaf.stride, leaf.padding,  # type: ignore[arg-type]
                leaf.dilation, 1, bias is not None,  # type: ignore[arg-type]
            )  # fmt: skip
        new = new.to(device=device, dtype=weight.dtype)
        with torch.no_grad():
            new.weight.copy_(weight)  # type: ignore[operator]
            if bias is not None:
                new.bias.copy_(bias)  # type: ignore[operator]
        layers.append(new)
        report_layers.append(
            {"layer": name, "inputs": f"{cols.numel()}/{n_in}", "outputs": f"{rows.numel()}/{out_keep[index].numel()}"}
        )
        produced, produced_units = rows.cpu(), out_keep[index].numel()
        index += 1
    exported = nn.Sequential(*layers)
    units: list[int] = []
    for i, (_, module) in enumerate(weighted):
        if isinstance(module, nn.Linear) and (i == 0 or isinstance(weighted[i - 1][1], nn.Conv2d)):
            units.append(int(in_keep[i].sum()))
        if i < len(weighted) - 1:
            units.append(int(out_keep[i].sum()))
    dense_params = dense_flops = params = flops = 0
    for name, module in weighted:
        dense_params += sum(p.numel() for p in module.parameters())
        dense_flops += _flops(module, shapes[name][1])
    for layer in exported:
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            params += sum(p.numel() for p in layer.parameters())
    flops = sum(
        _flops(new_module, shapes[name][1])
        for (name, _), new_module in zip(weighted, [m for m in exported if isinstance(m, (nn.Linear, nn.Conv2d))])
    )
    report: dict[str, object] = {
        "architecture": "-".join(map(str, units)),
        "layers": report_layers,
        "parameters": params,
        "flops": flops,
        "dense_parameters": dense_params,
        "dense_flops": dense_flops,
        "keep_out": [m.tolist() for m in out_keep],
        "keep_in": [m.tolist() for m in in_keep],
    }
    return exported, report


def masked_model(model: nn.Module, report: Mapping[str, object], mode: str = "mode") -> nn.Sequential:
    """The dense plain model (posterior ``mode``/``mean`` weights) with the units that :func:`export` removed set to
    zero (weight rows and biases of dropped outputs, weight columns of dropped inputs): the reference the
    exported model must match exactly."""
    from varbnn.convert import to_deterministic

    dense = to_deterministic(model, mode)
    weighted = [m for _, m in _chain(dense) if isinstance(m, (nn.Linear, nn.Conv2d))]
    keep_out, keep_in = report["keep_out"], report["keep_in"]
    with torch.no_grad():
        for module, rows, cols in zip(weighted, keep_out, keep_in):  # type: ignore[call-overload]
            r = torch.tensor(rows, device=module.weight.device)
            c = torch.tensor(cols, device=module.weight.device)
            module.weight[~r] = 0
            module.weight[:, ~c] = 0
            if module.bias is not None:
                module.bias[~r] = 0
    return dense  # type: ignore[return-value]


# -- thresholds chosen on held-out data, and retraining ------------------------------------------------------------------


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
        from varbnn.convert import to_deterministic

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


def _check_retraining(
    train: tuple[torch.Tensor, torch.Tensor],
    lr: float,
    schedule: str,
    soft_targets: torch.Tensor | None,
    distill_weight: float,
) -> None:
    """The arguments :func:`finetune` and :func:`iterative_budget` share, checked before any work."""
    x, y = train
    _check_xy(x, y)
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be positive, got {lr!r}")
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    if not (isinstance(distill_weight, (int, float)) and 0.0 <= distill_weight <= 1.0):
        raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight!r}")
    if distill_weight > 0:
        if soft_targets is None:
            raise ValueError("distill_weight > 0 needs soft_targets (class probabilities for every training example)")
        if soft_targets.dim() != 2 or soft_targets.shape[0] != x.shape[0]:
            raise ValueError(f"soft_targets must be [len(x), classes] = [{x.shape[0]}, C], got {tuple(soft_targets.shape)}")
        if not torch.isfinite(soft_targets).all() or bool((soft_targets < 0).any()):
            raise ValueError("soft_targets must be finite, non-negative class probabilities")


def finetune(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    epochs: int = 10,
    lr: float = 1e-4,
    batch_size: int = 100,
    seed: int = 0,
    schedule: str = "constant",
    soft_targets: torch.Tensor | None = None,
    distill_weight: float = 0.0,
    progress: bool = False,
) -> tuple[nn.Module, dict[str, Any]]:
    """Retrain a plain classifier (e.g. the model :func:`export` returns) with cross-entropy and Adam for ``epochs``
    epochs, in place, and restore the epoch with the lowest validation error (epoch 0: as given, so retraining never
    makes the validation error worse). ``schedule``: the learning rate stays ``lr`` (``"constant"``, default) or
    decays from ``lr`` to 0 along a half cosine over the steps (``"cosine"``). ``soft_targets`` (``[len(x), classes]``
    class probabilities, e.g. a Bayesian model's predictive from :func:`predictive_targets`) with ``distill_weight``
    = w > 0: the loss is ``(1 - w) CE(labels) + w CE(soft_targets)`` (distillation of the predictive into the small
    model; Hinton et al. 2015 at temperature 1, Korattikara et al. 2015's Bayesian dark knowledge). Returns the model
    and ``{"epoch", "validation_error", "history"}``."""
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative integer, got {epochs!r}")
    x, y = train
    _check_retraining(train, lr, schedule, soft_targets, distill_weight)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = None
    if schedule == "cosine" and epochs:
        steps = epochs * math.ceil(x.shape[0] / batch_size)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    best_error = classification_error(model, *validation)
    best_epoch, best_state = 0, {k: v.detach().clone() for k, v in model.state_dict().items()}
    history = [{"epoch": 0, "validation_error": best_error}]
    epochs_range: Any = range(1, epochs + 1)
    if progress:
        from tqdm.auto import tqdm

        epochs_range = tqdm(epochs_range, desc="finetune", leave=False)
    for epoch in epochs_range:
        model.train()
        for index in torch.randperm(x.shape[0], generator=generator).split(batch_size):
            optimizer.zero_grad(set_to_none=True)
            logits = model(x[index].to(device))
            loss = nn.functional.cross_entropy(logits, y[index].to(device))
            if distill_weight > 0:
                assert soft_targets is not None
                soft = nn.functional.cross_entropy(logits, soft_targets[index].to(device, logits.dtype))
                loss = (1 - distill_weight) * loss + distill_weight * soft
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        err = classification_error(model, *validation)
        lr_now = optimizer.param_groups[0]["lr"]
        history.append({"epoch": epoch, "validation_error": err, "train_loss": float(loss.detach()), "lr": lr_now})
        if err < best_error:
            best_error, best_epoch = err, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    model.eval()
    return model, {"epoch": best_epoch, "validation_error": best_error, "history": history}


def reinitialize(model: nn.Module, seed: int = 0) -> nn.Module:
    """A copy of a plain model (e.g. :func:`export`'s) with every layer's parameters re-drawn by the layer's own
    ``reset_parameters`` (PyTorch's default initialisation), seeded by ``seed`` without touching the global random
    state. Buffers (the kept-feature indices of :class:`SelectFeatures`) are kept, so the architecture is the same:
    retraining it with :func:`finetune` is the random-initialisation control of Liu et al. (2019), "Rethinking the
    value of network pruning" (is it the pruned weights or only the pruned architecture that matters?)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if any(isinstance(module, BayesianModule) for module in model.modules()):
        raise ValueError("reinitialize takes a plain model (e.g. prune.export's); this one has Bayesian layers")
    fresh = copy.deepcopy(model)
    devices = list({p.device for p in fresh.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for module in fresh.modules():
            reset = getattr(module, "reset_parameters", None)
            if module is not fresh and callable(reset) and any(True for _ in module.parameters(recurse=False)):
                reset()
    return fresh


@torch.no_grad()
def predictive_targets(
    model: nn.Module, x: torch.Tensor, samples: int = 16, *, batch_size: int = 1000, seed: int = 0
) -> torch.Tensor:
    """Class probabilities of a Bayesian classifier's Monte Carlo predictive, ``mean_s softmax(f_s(x))`` over
    ``samples`` weight draws (:func:`varbnn.predict`, seeded), ``[len(x), classes]``: the soft targets for
    :func:`finetune`'s distillation."""
    from varbnn.predict import classification_summary, predict

    was_training = model.training
    model.eval()
    out = []
    for start in range(0, x.shape[0], batch_size):
        chunk = x[start : start + batch_size].to(next(model.parameters()).device)
        logits = predict(model, chunk, samples, chunk_size=min(samples, 4), seed=seed + start)
        out.append(classification_summary(logits).probs.cpu())
    model.train(was_training)
    return torch.cat(out)


def iterative_budget(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    max_flops: int | None = None,
    max_parameters: int | None = None,
    stages: int = 4,
    epochs: int = 5,
    final_epochs: int | None = None,
    lr: float = 1e-3,
    batch_size: int = 100,
    seed: int = 0,
    schedule: str = "constant",
    soft_targets: torch.Tensor | None = None,
    distill_weight: float = 0.0,
    start: ThresholdSpec = "gap",
    min_gap: float = 1.0,
    step: float = 0.05,
    mode: str = "mode",
    eval_batch_size: int = 1000,
    progress: bool = False,
) -> tuple[nn.Sequential, dict[str, Any]]:
    """:func:`budget_units` in ``stages`` steps with retraining in between: prune-and-retrain towards a size budget.

    From the ``start`` rule's model (size ``F0`` FLOPs, ``P0`` parameters), stage ``s`` of ``S`` runs the budget rule
    to ``max(max_flops, F0^(1 - s/S) max_flops^(s/S))`` FLOPs (likewise parameters: equal steps in log size), exports
    the plain model and retrains it with :func:`finetune` (``epochs`` epochs, ``final_epochs`` in the last stage, at
    ``lr`` with ``schedule``, distilling ``soft_targets`` with ``distill_weight``; the epoch with the lowest validation
    error is kept); the retrained weights replace the point weights of the kept units for the next stage. The
    posterior's scores still decide which units of a layer go, in every stage; the validation set decides how many,
    and what the retraining keeps. With ``stages=1`` this is :func:`budget_units` followed by :func:`finetune`.

    Returns the last stage's retrained plain model and a report: :func:`export`'s ``architecture``, ``parameters``,
    ``flops``, the ``validation_error`` of the returned model, ``reached`` (the final budget), and per stage its
    budget, architecture, sizes, validation error before and after retraining and the retraining epoch kept."""
    _check_budget("iterative_budget", max_flops, max_parameters, step)
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a positive integer, got {stages!r}")
    final_epochs = epochs if final_epochs is None else final_epochs
    for name, value in (("epochs", epochs), ("final_epochs", final_epochs)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    _check_xy(*validation)
    _check_retraining(train, lr, schedule, soft_targets, distill_weight)
    groups = _RankedGroups(model, *validation, start, min_gap, mode, eval_batch_size)
    removed = dict(groups.start)
    params0, flops0 = groups.size(removed)

    def towards(target: int | None, first: int, fraction: float) -> int | None:
        if target is None:
            return None
        return max(target, round(math.exp((1 - fraction) * math.log(first) + fraction * math.log(target))))

    history: list[dict[str, Any]] = []
    exported: nn.Sequential | None = None
    report: dict[str, Any] = {}
    reached = False
    stage_range: Any = range(1, stages + 1)
    if progress:
        from tqdm.auto import tqdm

        stage_range = tqdm(stage_range, desc="prune and retrain", leave=False)
    for stage in stage_range:
        fraction = stage / stages
        stage_flops, stage_params = towards(max_flops, flops0, fraction), towards(max_parameters, params0, fraction)
        removed, reached = _budget_search(groups, removed, stage_flops, stage_params, step, progress)
        before = groups.error(removed)
        exported, report = _export_plain(groups.dense, groups.x[:2], groups.masks(removed), groups.shapes)
        _, tuned = finetune(
            exported, train, validation, epochs=final_epochs if stage == stages else epochs, lr=lr,
            batch_size=batch_size, seed=seed + stage, schedule=schedule, soft_targets=soft_targets,
            distill_weight=distill_weight, progress=progress,
        )  # fmt: skip
        groups.load_exported(exported, report)
        history.append({
            "stage": stage, "max_flops": stage_flops, "max_parameters": stage_params, "reached": reached,
            "architecture": report["architecture"], "parameters": report["parameters"], "flops": report["flops"],
            "validation_error_before": before, "validation_error": tuned["validation_error"], "epoch": tuned["epoch"],
        })  # fmt: skip
    assert exported is not None
    return exported, {
        "architecture": report["architecture"],
        "parameters": report["parameters"],
        "flops": report["flops"],
        "validation_error": history[-1]["validation_error"],
        "epoch": history[-1]["epoch"],
        "reached": reached,
        "max_flops": max_flops,
        "max_parameters": max_parameters,
        "stages": history,
        "keep_out": report["keep_out"],
        "keep_in": report["keep_in"],
    }


# ---------------------------------------------------------------------------------------------------------
# Graves (2011) section 7: weight pruning by the relative density at zero
# ---------------------------------------------------------------------------------------------------------


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
    from varbnn.convert import to_deterministic

    plain = to_deterministic(model, mode)
    sparse = {k: (v.to_sparse() if v.dim() >= 2 else v.clone()) for k, v in plain.state_dict().items()}
    return plain, sparse
