"""matplotlib figures (written to files; the Agg backend needs no screen)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from varbnn.metrics import calibration_bins, expected_calibration_error  # noqa: E402

__all__ = ["reliability_diagram", "variance_explained_figure", "std_heatmaps", "trace_figure", "continual_figure"]


def reliability_diagram(
    predictions: Mapping[str, tuple[torch.Tensor, torch.Tensor]], path: str | os.PathLike[str], n_bins: int = 15, title: str = ""
) -> Path:
    """One panel per model: accuracy vs confidence over ``n_bins`` equal-width bins, with the ECE.

    ``predictions``: ``{label: (probs [N, C], labels [N])}``.
    """
    n = len(predictions)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.6), squeeze=False)
    for ax, (label, (probs, labels)) in zip(axes[0], predictions.items()):
        bins = calibration_bins(probs, labels, n_bins)
        centers = ((bins.edges[:-1] + bins.edges[1:]) / 2).numpy()
        width = 1.0 / n_bins
        used = (bins.counts > 0).numpy()
        ax.bar(centers[used], bins.accuracy.numpy()[used], width=width, edgecolor="black", color="tab:blue", label="accuracy")
        ax.bar(
            centers[used],
            (bins.confidence - bins.accuracy).numpy()[used],
            bottom=bins.accuracy.numpy()[used],
            width=width,
            edgecolor="tab:red",
            color="tab:red",
            alpha=0.3,
            label="gap",
        )
        ax.plot([0, 1], [0, 1], "k--", linewidth=1)
        ax.set(
            xlim=(0, 1),
            ylim=(0, 1),
            xlabel="confidence",
            title=f"{label}\nECE = {expected_calibration_error(probs, labels, n_bins):.3f}",
        )
        ax.legend(loc="upper left", fontsize=8)
    axes[0][0].set_ylabel("accuracy")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
    from varbnn.analysis import low_rank

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


def continual_figure(result: Mapping[str, object], path: str | os.PathLike[str]) -> Path:
    """Continual learning (Farquhar et al. 2020, Fig. 5): one panel per task head, its test accuracy against the
    number of tasks trained so far, one line per variant (mean over seeds, band: mean ± standard error); a last
    panel with the mean over the heads seen so far. ``result``: what :func:`varbnn.experiments.continual.run_vcl`
    writes (rows ``{"variant", "after_task", "head<j>": (mean, se), "mean": (mean, se)}``)."""
    rows = list(result["rows"])  # type: ignore[call-overload]
    n_tasks = max(int(r["after_task"]) for r in rows)
    variants = list(dict.fromkeys(str(r["variant"]) for r in rows))
    fig, axes = plt.subplots(1, n_tasks + 1, figsize=(2.6 * (n_tasks + 1), 3.0), sharey=True)
    for panel, ax in enumerate(axes):
        key = f"head{panel + 1}" if panel < n_tasks else "mean"
        for variant in variants:
            points = [(int(r["after_task"]), r[key]) for r in rows if r["variant"] == variant and r.get(key) is not None]
            if not points:
                continue
            x = [p[0] for p in points]
            mean = torch.tensor([float(p[1][0]) for p in points])
            se = torch.tensor([float(p[1][1]) for p in points]).nan_to_num(0.0)
            ax.plot(x, mean.numpy(), marker="o", markersize=3, label=variant)
            ax.fill_between(x, (mean - se).numpy(), (mean + se).numpy(), alpha=0.2)
        ax.set_title(f"task {panel + 1} head" if panel < n_tasks else "mean over heads seen", fontsize=9)
        ax.set_xlabel("tasks trained")
        ax.set_xticks(range(1, n_tasks + 1))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy")
    axes[-1].legend(fontsize=7)
    fig.suptitle(str(result.get("name", "")))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
