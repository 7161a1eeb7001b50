"""The paper figures of the experiments (matplotlib, written to files; the Agg backend needs no screen): the cost and
front figures of the generic runner's pages, the UCI cost panels, the retina referral and robustness figures, the soap
bubble figures and the Graves curves and complexity heatmaps. Moved out of :mod:`varbnn.plots`, which keeps the generic
figures (reliability diagram, OOD histograms, overview, traces, std heatmaps, continual learning).

Every function writes one figure to ``path`` (format from the extension, e.g. ``.png``) and returns that path as a
``Path``, except :func:`soap_bubble_figures`, which writes several into ``out_dir`` and returns their file names.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from varbnn.plots import save_figure  # noqa: E402

__all__ = [
    "cost_figure",
    "regression_cost_figure",
    "front_figure",
    "referral_figure",
    "robustness_figure",
    "soap_bubble_figures",
    "graves_curves",
    "complexity_heatmaps",
]


_save = save_figure  # the library's: title, lay out, write, close


def cost_figure(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], title: str = "", note: str = "") -> Path:
    """Test NLL (mean +- standard error over seeds) against training time relative to the plain network's (the row
    whose ``family`` is ``"plain"``; absolute seconds if there is none), one labelled point per row; ``note`` is
    printed under the axes (e.g. which rows were left out)."""
    plain = [r for r in rows if r.get("family") == "plain"]
    unit = float(plain[0]["train_seconds"]) if plain else 1.0
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for row in rows:
        x, y = float(row["train_seconds"]) / unit, float(row["nll"])
        error = row.get("nll_sem")
        ax.errorbar(x, y, yerr=None if error is None or error != error else float(error), fmt="o", capsize=3)
        ax.annotate(str(row["variant"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.LogFormatter())  # "1.25", not "1.25 x 10^0"
    ax.xaxis.set_minor_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False))
    ax.set(xlabel="training time / plain network's" if plain else "training time (s)", ylabel="test NLL (nats)")
    lines = textwrap.wrap(note, 100)
    if lines:
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, va="bottom")
    return _save(fig, path, title, dpi=120, bottom=0.035 * len(lines))


def regression_cost_figure(
    rows: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    reference: str,
    path: str | os.PathLike[str],
    title: str = "",
    lines: Sequence[tuple[str, str, str]] = (),
) -> Path:
    """One panel per dataset (a row of ``rows``): each label's test log-likelihood (``row[label]["ll"]``, mean and
    standard error) against its training seconds per split relative to ``reference``'s (``row[label]["seconds"] /
    row[label]["splits"]``), log scale; ``lines``: ``(row key, legend label, line style)`` of horizontal reference
    values (e.g. published numbers). One colour per label in every panel, one legend for the figure."""
    shown = [row for row in rows if reference in row]
    if not shown:
        raise ValueError(f"no row holds the reference {reference!r}: nothing to plot relative to it")
    columns = min(3, len(shown))
    grid = (len(shown) + columns - 1) // columns
    fig, axes = plt.subplots(grid, columns, figsize=(4.0 * columns, 3.1 * grid + 0.6), squeeze=False)
    colours = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    handles: dict[str, Any] = {}
    for ax, row in zip(axes.flat, shown):
        unit = float(row[reference]["seconds"]) / int(row[reference]["splits"])
        for label in labels:
            entry = row.get(label)
            if not entry:
                continue
            x = float(entry["seconds"]) / int(entry["splits"]) / unit
            mean, error = (float(v) for v in entry["ll"])
            handles[label] = ax.errorbar(x, mean, yerr=None if error != error else error, fmt="o", capsize=3,
                                         color=colours[label], markersize=5)  # fmt: skip
        for key, name, style in lines:
            if key in row:
                handles[name] = ax.axhline(float(row[key]), color="0.3", linestyle=style, linewidth=1)
        ax.set_xscale("log")
        low, high = ax.get_xlim()
        ax.set_xticks([t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20) if low <= t <= high] or [1])
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(str(row["dataset"]), fontsize=9)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(f"seconds per split / {reference}'s", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("test log-likelihood (nats)", fontsize=8)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(5, len(handles)), fontsize=8)
    return _save(fig, path, title, dpi=110, bottom=0.06 if grid > 1 else 0.16)


def front_figure(
    rows: Sequence[Mapping[str, Any]],
    budgets: Sequence[int],
    published: Sequence[tuple[str, int, int, int, int, float]],
    path: str | os.PathLike[str],
    title: str = "",
) -> Path:
    """Test error against FLOPs (left) and parameters (right), log scale: each row's ``front{B}_*`` points over the
    ``budgets`` (mean +- standard error over seeds; filled, joined by a line) and its random-initialisation control
    (hollow, dashed), beside ``published`` rows ``(method, FLOPs as counted, FLOPs recomputed, parameters as counted,
    parameters recomputed, error)``: one marker shape per method (named in a legend below the panels; at most
    ``len(_MARKERS)`` rows), black at the paper's counts, grey at the recomputed sizes."""
    if len(published) > len(_MARKERS):
        raise ValueError(f"published: at most {len(_MARKERS)} rows (one marker shape each), got {len(published)}")
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.0), sharey=True)
    for axis, size in zip(axes, ("flops", "parameters"), strict=True):
        for row in rows:
            points = [(f"front{b}", b) for b in budgets if f"front{b}_{size}" in row]
            if not points:
                continue
            x = [float(row[f"{p}_{size}"]) for p, _ in points]
            for key, style in (("test_error", "-o"), ("scratch_test_error", "--o")):
                if not all(f"{p}_{key}" in row for p, _ in points):
                    continue
                y = [100 * float(row[f"{p}_{key}"]) for p, _ in points]
                err = [100 * float(row.get(f"{p}_{key}_sem", float("nan"))) for p, _ in points]
                err = [0.0 if e != e else e for e in err]
                label = f"{row['variant']}" + (", random init" if key.startswith("scratch") else "")
                axis.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=label, markersize=5,
                              mfc="none" if key.startswith("scratch") else None)  # fmt: skip
        for (_, flops, flops_again, params, params_again, error), marker in zip(published, _MARKERS):
            counted, again = (flops, flops_again) if size == "flops" else (params, params_again)
            axis.plot([counted, again], [100 * error] * 2, color="0.6", linewidth=0.8)
            axis.plot(counted, 100 * error, marker, color="black", markersize=6)
            axis.plot(again, 100 * error, marker, color="0.6", markersize=6)
        axis.set_xscale("log")
        axis.set_xlabel("FLOPs (Oh et al.'s formulas)" if size == "flops" else "parameters")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("test error (%)")
    axes[0].legend(fontsize=7)
    # the published errors are all 0.9-1.1%, too close for text labels: one marker shape per method, named below
    # the panels; black at the paper's count, grey at the recomputed size, joined by a line
    handles: list[Any] = [
        Line2D([], [], marker=marker, color="black", linestyle="none", markersize=6, label=method)
        for (method, *_), marker in zip(published, _MARKERS)
    ]
    handles += [
        Patch(color="black", label="published, as counted"),
        Patch(color="0.6", label="published, recomputed"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(5, len(handles)), fontsize=7, frameon=False)
    rows_of_legend = -(-len(handles) // 5)
    return _save(fig, path, title, dpi=120, bottom=0.01 + 0.04 * rows_of_legend)


# marker shapes for the published rows of a front figure (one per method; more rows than shapes is an error)
_MARKERS = ("s", "D", "^", "v", "<", ">", "P", "X", "*", "h")


def referral_figure(records: Sequence[Mapping[str, object]], path: str | os.PathLike[str], fractions: Sequence[float]) -> Path:
    """AUROC and accuracy on the retained test points against the fraction referred (ranked by mutual information),
    one line per family: mean over seeds, band mean ± standard error (Farquhar et al. 2020, Fig. 7 left)."""
    families = list(dict.fromkeys(str(r["family"]) for r in records))
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    for ax, metric in zip(axes, ("auroc", "accuracy")):
        for family in families:
            runs = [r["referral"] for r in records if r["family"] == family and r["referral"]]
            if not runs:
                continue
            values = torch.tensor([[float(row[metric]) for row in run] for run in runs], dtype=torch.float64)  # type: ignore[index, attr-defined]
            mean = values.nanmean(0)
            se = values.std(0) / max(len(runs), 1) ** 0.5 if len(runs) > 1 else torch.zeros_like(mean)
            x = [100 * f for f in fractions]
            ax.plot(x, mean.numpy(), marker="o", markersize=3, label=f"{family} ({len(runs)} seeds)")
            ax.fill_between(x, (mean - se).numpy(), (mean + se).numpy(), alpha=0.25)
        ax.set_xlabel("test points referred (%)")
        ax.set_ylabel("AUROC" if metric == "auroc" else "accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def robustness_figure(records: Sequence[Mapping[str, object]], path: str | os.PathLike[str], chance: float, good: float) -> Path:
    """Histogram of test AUROC over hyperparameter configurations, one per family, with the 'chance' and 'good'
    thresholds (Farquhar et al. 2020, Fig. 7 right); diverged runs are counted at AUROC 0.5."""
    families = list(dict.fromkeys(str(r["family"]) for r in records))
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    bins = torch.linspace(0.3, 1.0, 29).tolist()
    for family in families:
        values = [float(r["auroc"]) for r in records if r["family"] == family]  # type: ignore[arg-type]
        values = [0.5 if v != v else v for v in values]
        ax.hist(values, bins=bins, alpha=0.5, label=f"{family} ({len(values)} configs)")
    ax.axvline(chance, color="grey", linestyle="--", label=f"chance threshold {chance:g}")
    if good == good:
        ax.axvline(good, color="black", linestyle=":", label=f"good threshold {good:.3f}")
    ax.set_xlabel("test AUROC")
    ax.set_ylabel("configurations")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def soap_bubble_figures(
    kernel: Mapping[str, object], training: Sequence[Mapping[str, object]], out_dir: str | os.PathLike[str], name: str
) -> list[str]:
    """Farquhar et al. (2020) Fig. 3 (distance-from-mode histograms vs analytic densities, per sigma), Fig. 8 (distance
    during training) and Fig. 1 (training accuracy vs loss). Returns the file names written into ``out_dir``."""
    import math

    out = Path(out_dir)
    dim = int(kernel["dim"])  # type: ignore[call-overload]
    sigmas = list(kernel["sigmas"])  # type: ignore[call-overload]
    samples = kernel["samples"]
    fig, axes = plt.subplots(1, len(sigmas), figsize=(3.6 * len(sigmas), 3.2))
    for ax, sigma in zip(axes if len(sigmas) > 1 else [axes], sigmas):
        for family, color in (("meanfield", "C0"), ("radial", "C1")):
            values = torch.tensor(samples[f"{family}@{sigma:g}"], dtype=torch.float64)  # type: ignore[index]
            edges = torch.logspace(math.log10(sigma * 1e-3), math.log10(sigma * math.sqrt(dim) * 2), 80, dtype=torch.float64)
            ax.hist(values.numpy(), bins=edges.numpy(), density=True, alpha=0.4, color=color, label=f"{family} samples")
            grid = edges
            if family == "meanfield":
                from varbnn.distributions.radial import chi_log_density

                density = (chi_log_density(grid / sigma, dim) - math.log(sigma)).exp()
            else:
                density = 2 * torch.exp(-0.5 * (grid / sigma) ** 2) / math.sqrt(2 * math.pi) / sigma
            ax.plot(grid.numpy(), density.numpy(), color=color, label=f"{family} analytic")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(bottom=1e-4 / sigma)
        ax.set_xlabel("||w - mu||")
        ax.set_title(f"sigma = {sigma:g}, D = {dim:,}", fontsize=9)
    (axes[0] if len(sigmas) > 1 else axes).set_ylabel("density")
    (axes[-1] if len(sigmas) > 1 else axes).legend(fontsize=7)
    fig.tight_layout()
    files = [f"{name}_kernel.png"]
    fig.savefig(out / files[0], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    for run in training:
        history = list(run["history"])  # type: ignore[call-overload]
        label = str(run["family"])
        axes[0].plot([h["epoch"] for h in history], [h["distance"] for h in history], marker="o", markersize=2, label=label)
        trained = [h for h in history if "train_loss" in h]
        axes[1].plot([h["train_loss"] for h in trained], [h["train_accuracy"] for h in trained], marker="o", markersize=2,
                     label=label)  # fmt: skip
        if trained:
            axes[1].annotate("start", (trained[0]["train_loss"], trained[0]["train_accuracy"]), fontsize=7)
    axes[0].set_xlabel("epoch")
    axes[0].set_ylabel("mean distance of samples from mode")
    axes[0].set_yscale("log")
    axes[1].set_xlabel("training loss (-ELBO / N)")
    axes[1].set_xscale("log")
    axes[1].set_ylabel("training accuracy (one draw)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    files.append(f"{name}_training.png")
    fig.savefig(out / files[1], dpi=110)
    plt.close(fig)
    return files


def graves_curves(records: Sequence[Mapping[str, object]], path: str | os.PathLike[str]) -> Path:
    """Test error of the mode per epoch for every Graves variant (left), and the training error loss L^E in bits per
    target (right; Graves 2011 figure 2 analogue). One line per run."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for record in records:
        log = record["log"]
        assert isinstance(log, list)
        epochs = [e["epoch"] for e in log]
        label = f"{record['variant']} (seed {record['seed']})"
        left.plot(epochs, [100 * e["test_error"] for e in log], label=label)
        n = float(record["n_train"])  # type: ignore[arg-type]
        right.plot(epochs, [e["train_error_loss_bits"] / n for e in log], label=label)
    left.set_xlabel("epoch")
    left.set_ylabel("test error of the mode (%)")
    left.set_yscale("log")
    right.set_xlabel("epoch")
    right.set_ylabel("training L^E (bits per target)")
    right.set_yscale("log")
    left.legend(fontsize=6)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def complexity_heatmaps(
    costs_bits: torch.Tensor, kept: Mapping[float, torch.Tensor], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Per-weight complexity cost of one weight matrix in bits (Graves 2011 figure 3; lighter = costlier) and, for each
    lambda in ``kept``, the weights that survive pruning (figure 4; white = kept, black = pruned)."""
    panels = 1 + len(kept)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 4.0), squeeze=False)
    image = axes[0][0].imshow(costs_bits.numpy(), aspect="auto", cmap="gray", interpolation="nearest")
    axes[0][0].set_title("complexity cost (bits)")
    fig.colorbar(image, ax=axes[0][0], shrink=0.8)
    for ax, (lam, mask) in zip(axes[0][1:], kept.items()):
        ax.imshow(mask.float().numpy(), aspect="auto", cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"kept at lambda = {lam} ({100 * float(mask.float().mean()):.0f}%)")
    for ax in axes[0]:
        ax.set_xlabel("input unit")
        ax.set_ylabel("output unit")
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
