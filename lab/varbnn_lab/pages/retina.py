"""The pages of ``varbnn reproduce retina-referral`` and ``retina-robustness`` (:mod:`varbnn_lab.retina`): the
saved runs summarised into rows (per family and referred fraction, or per family over the sampled configurations),
the figure, and the Markdown page."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from varbnn.metrics import mean_and_standard_error
from varbnn_lab.render import markdown_table, mean_se, provenance_lines

if TYPE_CHECKING:
    from varbnn_lab.retina import RetinaConfig

__all__ = ["good_threshold", "summarise_retina", "draw_retina_figure", "render_retina_markdown"]


def good_threshold(config: RetinaConfig, records: list[dict[str, Any]]) -> float:
    """The robustness page's 'good AUROC' threshold: the best finite test AUROC of any run minus ``good_margin``."""
    finite = [r["auroc"] for r in records if not math.isnan(r["auroc"])]
    return (max(finite) - config.good_margin) if finite else float("nan")


def summarise_retina(config: RetinaConfig, records: list[dict[str, Any]], fractions: Sequence[float]) -> list[dict[str, Any]]:
    """The rows of a ``retina-*`` result: for ``retina-referral``, per family and referred fraction (``fractions``, the
    records' referral points) the seed count and ``mean ± se`` of AUROC and accuracy; for ``retina-robustness``, per
    family the shares of configurations no better than chance and good, the median and best AUROC and the diverged
    runs."""
    rows = []
    if config.kind == "referral":
        for family in config.families:
            mine = [r for r in records if r["family"] == family and r["referral"]]
            for i, fraction in enumerate(fractions):
                rows.append({
                    "family": family, "referred": fraction, "seeds": len(mine),
                    "auroc": mean_and_standard_error([r["referral"][i]["auroc"] for r in mine]),
                    "accuracy": mean_and_standard_error([r["referral"][i]["accuracy"] for r in mine]),
                })  # fmt: skip
        return rows
    good = good_threshold(config, records)
    for family in config.families:
        mine = [r for r in records if r["family"] == family]
        aurocs = [r["auroc"] for r in mine]
        chance = sum(1 for a in aurocs if math.isnan(a) or a < config.chance_auroc)
        rows.append({
            "family": family, "configs": len(mine), "distinct": len({r["key"] for r in mine}),
            "no_better_than_chance": chance / max(len(mine), 1),
            "good": sum(1 for a in aurocs if not math.isnan(a) and a >= good) / max(len(mine), 1),
            "good_threshold": good,
            "median_auroc": sorted(a for a in aurocs if not math.isnan(a))[len([a for a in aurocs if not math.isnan(a)]) // 2]
            if any(not math.isnan(a) for a in aurocs) else float("nan"),
            "best_auroc": max((a for a in aurocs if not math.isnan(a)), default=float("nan")),
            "diverged": sum(1 for r in mine if r["diverged"]),
        })  # fmt: skip
    return rows


def draw_retina_figure(config: RetinaConfig, records: list[dict[str, Any]], path: Path, fractions: Sequence[float]) -> None:
    """The page's figure at ``path``: the referral curves (:func:`varbnn_lab.figures.referral_figure`) or the robustness
    histogram (:func:`varbnn_lab.figures.robustness_figure`)."""
    from varbnn_lab.figures import referral_figure, robustness_figure

    if config.kind == "referral":
        referral_figure(records, path, fractions)
    else:
        robustness_figure(records, path, config.chance_auroc, good_threshold(config, records))


def render_retina_markdown(result: dict[str, Any], figure: str) -> str:
    """The page of a saved ``retina-*`` result: the referral table (AUROC and accuracy per referred fraction, ``mean ±
    se`` over seeds) or the robustness table (shares of configurations per family)."""
    config = result["config"]
    lines = [
        f"# {result['name']}",
        "",
        (
            "Referral under uncertainty on the RetinaMNIST stand-in (binary: grade >= 2), radial vs mean-field: AUROC and "
            "accuracy on the test points kept after referring the most uncertain fraction (mutual information), mean ± "
            "standard error over seeds (Farquhar et al. 2020, Fig. 7 left)."
            if config["kind"] == "referral"
            else "Robustness to hyperparameters on the RetinaMNIST stand-in (Farquhar et al. 2020, Fig. 7 right): the same "
            f"{len(config['runs'])} random configurations for both families; 'no better than chance': test AUROC < "
            f"{config['chance_auroc']} (or diverged); 'good': test AUROC >= best of all runs - {config['good_margin']}. "
            "The paper: mean-field 82% / 11%, radial 39% / 44%."
        ),
        "",
        *provenance_lines(result, runs_note=True, run_commits=True, run_devices=True),
        f"- training time, all runs: {result['train_seconds']:.0f} s; epochs {config['epochs']}, VGG width {config['width']}",
        "",
    ]
    if config["kind"] == "referral":
        rows = [
            [row["family"], f"{row['referred']:.0%}", str(row["seeds"]), mean_se(row["auroc"], 4), mean_se(row["accuracy"], 4)]
            for row in result["rows"]
        ]
        lines += markdown_table(["family", "referred", "seeds", "AUROC", "accuracy"], rows)
    else:
        rows = [
            [row["family"], f"{row['configs']} ({row['distinct']})", f"{row['no_better_than_chance']:.0%}",
             f"{row['good']:.0%} (>= {row['good_threshold']:.3f})", f"{row['median_auroc']:.4f}", f"{row['best_auroc']:.4f}",
             str(row["diverged"])]
            for row in result["rows"]
        ]  # fmt: skip
        header = ["family", "configs (distinct)", "no better than chance", "good AUROC", "median AUROC", "best AUROC", "diverged"]
        lines += markdown_table(header, rows)
    lines += ["", f"![{figure}]({figure})"]
    return "\n".join(lines) + "\n"
