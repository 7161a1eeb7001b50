"""matplotlib figures (written to files; the Agg backend needs no screen).

The generic figures: calibration, OOD entropies, an overview of several models, traces, posterior-std heatmaps and
variance explained, continual learning. Every function writes one figure to ``path`` (format from the extension,
e.g. ``.png``) and returns that path as a ``Path``. The paper figures of the experiments live in the lab
(``varbnn_lab.figures``, outside the installed package). This module imports matplotlib, so ``import varbnn`` does
not import it: it is loaded on first use of ``varbnn.plots``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from varbnn.analysis import low_rank  # noqa: E402
from varbnn.metrics import auroc, calibration_bins, expected_calibration_error  # noqa: E402

__all__ = [
    "save_figure",
    "reliability_diagram",
    "ood_histograms",
    "overview_figure",
    "variance_explained_figure",
    "std_heatmaps",
    "trace_figure",
    "continual_figure",
    "continual_heads_figure",
]


def _reliability_panel(ax: plt.Axes, label: str, probs: torch.Tensor, labels: torch.Tensor, n_bins: int) -> None:
    """Accuracy against confidence over ``n_bins`` equal-width bins, the gap to the diagonal shaded, the ECE in the title."""
    bins = calibration_bins(probs, labels, n_bins)
    centers = ((bins.edges[:-1] + bins.edges[1:]) / 2).numpy()
    used = (bins.counts > 0).numpy()
    accuracy = bins.accuracy.numpy()[used]
    ax.bar(centers[used], accuracy, width=1.0 / n_bins, edgecolor="black", color="tab:blue", label="accuracy")
    ax.bar(centers[used], (bins.confidence - bins.accuracy).numpy()[used], bottom=accuracy, width=1.0 / n_bins,
           edgecolor="tab:red", color="tab:red", alpha=0.3, label="gap")  # fmt: skip
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ece = expected_calibration_error(probs, labels, n_bins)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", title=f"{label}\nECE = {ece:.3f}")
    ax.legend(loc="upper left", fontsize=8)


def _entropy_edges(entropies: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> Any:
    top = max((float(torch.cat(pair).max()) for pair in entropies.values()), default=1.0)
    return torch.linspace(0.0, max(top, 1e-3), 31).numpy()


def _entropy_panel(ax: plt.Axes, title: str, inside: torch.Tensor, outside: torch.Tensor, edges: Any) -> None:
    """Predictive-entropy histograms of in- and out-of-distribution inputs, the AUROC of telling them apart in the title."""
    score = auroc(torch.cat([inside, outside]), torch.cat([torch.zeros(len(inside)), torch.ones(len(outside))]))
    ax.hist(inside.numpy(), bins=edges, alpha=0.6, density=True, label="test set (in distribution)")
    ax.hist(outside.numpy(), bins=edges, alpha=0.6, density=True, label="out of distribution")
    ax.set(xlabel="predictive entropy (nats)", ylabel="density", title=f"{title}AUROC = {score:.3f}")
    ax.legend(fontsize=8)


def save_figure(fig: Any, path: str | os.PathLike[str], title: str = "", dpi: int = 110, bottom: float = 0.0) -> Path:
    """Title ``fig`` (when ``title``), lay it out (leaving the ``bottom`` fraction free, e.g. for a note), write it to
    ``path`` (its folder created) at ``dpi`` and close it; returns the path. Every figure of this module ends so."""
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


_save = save_figure


def reliability_diagram(
    predictions: Mapping[str, tuple[torch.Tensor, torch.Tensor]], path: str | os.PathLike[str], n_bins: int = 15, title: str = ""
) -> Path:
    """One panel per model: accuracy vs confidence over ``n_bins`` equal-width bins, with the ECE.

    ``predictions``: ``{label: (probs [N, C], labels [N])}``.
    """
    n = len(predictions)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.6), squeeze=False)
    for ax, (label, (probs, labels)) in zip(axes[0], predictions.items()):
        _reliability_panel(ax, label, probs, labels, n_bins)
    axes[0][0].set_ylabel("accuracy")
    return _save(fig, path, title, dpi=120)


def ood_histograms(
    entropies: Mapping[str, tuple[torch.Tensor, torch.Tensor]], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """One panel per model: histograms of the predictive entropy (nats) of in-distribution test inputs and of
    out-of-distribution inputs, with the AUROC of telling them apart by it. ``entropies``: ``{label: (in, out)}``."""
    n = len(entropies)
    fig, axes = plt.subplots(1, n, figsize=(3.8 * n, 3.2), squeeze=False, sharey=True)
    edges = _entropy_edges(entropies)
    for ax, (label, (inside, outside)) in zip(axes[0], entropies.items()):
        _entropy_panel(ax, f"{label}\n", inside, outside, edges)
    return _save(fig, path, title, dpi=110)


def overview_figure(
    predictions: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    entropies: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    path: str | os.PathLike[str],
    n_bins: int = 15,
    title: str = "",
) -> Path:
    """One figure, one column per model: its reliability diagram (top; accuracy against confidence, with the ECE) and
    its predictive-entropy histograms on in- and out-of-distribution inputs (bottom; with the AUROC)."""
    labels = list(predictions)
    fig, axes = plt.subplots(2, len(labels), figsize=(3.8 * len(labels), 6.6), squeeze=False)
    edges = _entropy_edges(entropies)
    for column, label in enumerate(labels):
        _reliability_panel(axes[0][column], label, *predictions[label], n_bins)
        axes[0][column].set_ylabel("accuracy")
        if label in entropies:
            _entropy_panel(axes[1][column], "OOD ", *entropies[label], edges)
        else:
            axes[1][column].axis("off")
    return _save(fig, path, title, dpi=110)


def variance_explained_figure(
    spectra: Mapping[str, torch.Tensor], path: str | os.PathLike[str], top: int = 10, title: str = ""
) -> Path:
    """Bar chart of the fraction of variance explained by each of the ``top`` largest singular values, one group
    of bars per label (Swiatkowski et al. 2020, Figure 3). ``spectra``: ``{label: fractions}`` from
    :func:`varbnn.analysis.variance_explained`."""
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * top, 3.4))
    width = 0.8 / max(1, len(spectra))
    for i, (label, fractions) in enumerate(spectra.items()):
        values = fractions[:top].detach().cpu().numpy()
        ax.bar([j + i * width for j in range(len(values))], values, width=width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(top)], [str(j + 1) for j in range(top)])
    ax.set_xlabel("singular value")
    ax.set_ylabel("fraction of variance explained")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def std_heatmaps(matrix: torch.Tensor, path: str | os.PathLike[str], ranks: tuple[int, ...] = (1, 2), title: str = "") -> Path:
    """Heat maps of a posterior std matrix and its rank-k approximations on one colour scale (paper Figure 4)."""
    panels = [("no approximation", matrix)] + [(f"rank-{k} approximation", low_rank(matrix, k)) for k in ranks]
    vmin, vmax = float(matrix.min()), float(matrix.max())
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.6), squeeze=False)
    image = None
    for ax, (label, values) in zip(axes[0], panels):
        image = ax.imshow(values.detach().cpu().numpy(), aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax)
        ax.set_title(label)
        ax.set_xlabel("input")
        ax.set_ylabel("output")
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="posterior std")
    fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def trace_figure(
    traces: Mapping[str, Sequence[Sequence[Mapping[str, float]]]], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Validation -ELBO and gradient SNR against the optimizer step, one line per label (mean over seeds, band:
    min to max over seeds) (Swiatkowski et al. 2020, Figs. 6-7). ``traces``: ``{label: [records of each seed]}``
    with records ``{"step", "val_nelbo"?, "snr"?}``."""
    metrics_present = [m for m in ("val_nelbo", "snr") if any(m in r for runs in traces.values() for run in runs for r in run)]
    if not metrics_present:
        raise ValueError("trace_figure: the traces hold neither 'val_nelbo' nor 'snr'")
    names = {"val_nelbo": "validation -ELBO (nats / example)", "snr": "gradient SNR of std parameters"}
    fig, axes = plt.subplots(1, len(metrics_present), figsize=(5.0 * len(metrics_present), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics_present):
        for label, runs in traces.items():
            steps = sorted({int(r["step"]) for run in runs for r in run if metric in r})
            if not steps:
                continue
            table = [
                [next((r[metric] for r in run if int(r["step"]) == s and metric in r), float("nan")) for s in steps]
                for run in runs
            ]
            values = torch.tensor(table, dtype=torch.float64)
            ax.plot(steps, values.nanmean(0).numpy(), label=label)
            if len(runs) > 1:
                ax.fill_between(steps, values.min(0).values.numpy(), values.max(0).values.numpy(), alpha=0.2)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(names[metric])
        if metric == "snr":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _continual_series(
    rows: Sequence[Mapping[str, Any]], variant: str, key: str
) -> tuple[list[int], torch.Tensor, torch.Tensor] | None:
    """One variant's ``key`` (a head, or the mean) against the tasks trained: (tasks, means, standard errors; NaN as
    0), or None where it has no such entry."""
    points = [(int(r["after_task"]), r[key]) for r in rows if r["variant"] == variant and r.get(key) is not None]
    if not points:
        return None
    mean = torch.tensor([float(p[1][0]) for p in points])
    return [p[0] for p in points], mean, torch.tensor([float(p[1][1]) for p in points]).nan_to_num(0.0)


def continual_figure(result: Mapping[str, object], path: str | os.PathLike[str]) -> Path:
    """Continual learning (Farquhar et al. 2020, Fig. 5): one panel per task head, its test accuracy against the
    number of tasks trained so far, one line per variant (mean over seeds, band: mean ± standard error); a last
    panel with the mean over the heads seen so far. ``result``: what the lab's ``varbnn_lab.continual.run_vcl``
    writes (rows ``{"variant", "after_task", "head<j>": (mean, se), "mean": (mean, se)}``)."""
    rows = list(result["rows"])  # type: ignore[call-overload]
    n_tasks = max(int(r["after_task"]) for r in rows)
    variants = list(dict.fromkeys(str(r["variant"]) for r in rows))
    columns = min(4, max(1, len(variants)))  # of the legend below the panels, where it hides no line
    rows_of_legend = -(-len(variants) // columns)
    fig, axes = plt.subplots(1, n_tasks + 1, figsize=(2.6 * (n_tasks + 1), 3.0 + 0.22 * rows_of_legend), sharey=True)
    colors = plt.get_cmap("tab10")
    for panel, ax in enumerate(axes):
        key = f"head{panel + 1}" if panel < n_tasks else "mean"
        for variant in variants:
            series = _continual_series(rows, variant, key)
            if series is None:
                continue
            x, mean, se = series
            index = variants.index(variant)  # more variants than colours (a search): the line style tells them apart
            line = ax.plot(x, mean.numpy(), marker="o", markersize=3, label=variant, color=colors(index % 10),
                           linestyle=("-", "--", ":", "-.")[index // 10 % 4])  # fmt: skip
            ax.fill_between(x, (mean - se).numpy(), (mean + se).numpy(), alpha=0.2, color=line[0].get_color())
        ax.set_title(f"task {panel + 1} head" if panel < n_tasks else "mean over heads seen", fontsize=9)
        ax.set_xlabel("tasks trained")
        ax.set_xticks(range(1, n_tasks + 1))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    fig.legend(*axes[-1].get_legend_handles_labels(), loc="lower center", ncol=columns, fontsize=7, frameon=False)
    return _save(fig, path, str(result.get("name", "")), dpi=110, bottom=min(0.6, 0.03 + 0.05 * rows_of_legend))


def continual_heads_figure(result: Mapping[str, object], path: str | os.PathLike[str], max_panels: int = 6) -> Path:
    """Continual learning laid out as Farquhar et al. 2020's Fig. 5: one panel per variant, one line per task head (its
    test accuracy against the number of tasks trained so far; mean over seeds, band: mean ± standard error) and the
    mean over the heads seen so far (dashed). ``result`` as for :func:`continual_figure`; at most ``max_panels``
    variants (a search's many settings belong in :func:`continual_figure`)."""
    rows = list(result["rows"])  # type: ignore[call-overload]
    variants = list(dict.fromkeys(str(r["variant"]) for r in rows))
    if not variants:
        raise ValueError("result: no rows to draw")
    if len(variants) > max_panels:
        raise ValueError(f"result: {len(variants)} variants, more than max_panels={max_panels} panels")
    n_tasks = max(int(r["after_task"]) for r in rows)
    fig, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.3), sharey=True, squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, variant in zip(axes[0], variants):
        for j, key in enumerate([*(f"head{j + 1}" for j in range(n_tasks)), "mean"]):
            series = _continual_series(rows, variant, key)
            if series is None:
                continue
            x, mean, se = series
            style = dict(color="black", linestyle="--", label="mean over heads seen") if key == "mean" else dict(
                color=colors(j % 10), label=f"task {j + 1} head")
            ax.plot(x, mean.numpy(), marker="o", markersize=3, **style)  # type: ignore[arg-type]
            ax.fill_between(x, (mean - se).numpy(), (mean + se).numpy(), alpha=0.15, color=style["color"])
        ax.set_title(variant, fontsize=9)
        ax.set_xlabel("tasks trained")
        ax.set_xticks(range(1, n_tasks + 1))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("test accuracy")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    return _save(fig, path, str(result.get("name", "")), dpi=110)


