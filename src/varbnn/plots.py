"""matplotlib figures (written to files; the Agg backend needs no screen)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from varbnn.metrics import calibration_bins, expected_calibration_error  # noqa: E402

__all__ = ["reliability_diagram"]


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
