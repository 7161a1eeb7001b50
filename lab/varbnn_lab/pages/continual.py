"""The pages of ``varbnn reproduce vcl-split-fmnist`` and its ``-search`` / ``-selected`` forms
(:mod:`varbnn_lab.continual`): the saved (variant, seed) runs summarised into one row per variant and task,
the search's choice per family, and the Markdown page."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from varbnn.metrics import mean_and_standard_error
from varbnn_lab.render import markdown_table, mean_se, provenance_lines

if TYPE_CHECKING:
    from varbnn_lab.continual import VCLConfig
    from varbnn_lab.engine import RunKey

__all__ = ["selection", "summarise_vcl", "render_vcl_markdown"]


def selection(result: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """Per family (the label's first word), the variant with the highest validation mean accuracy after the last task
    and that accuracy: the search's choice."""
    n_tasks = len(result["config"]["tasks"])
    best: dict[str, tuple[str, float]] = {}
    for row in result["rows"]:
        if row["after_task"] != n_tasks or not row["seeds"]:
            continue
        family = row["variant"].split(",")[0]
        if family not in best or row["val_mean"][0] > best[family][1]:
            best[family] = (row["variant"], row["val_mean"][0])
    return best


def summarise_vcl(config: VCLConfig, done: Mapping[RunKey, dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a ``vcl-split-fmnist*`` result, one per variant of ``config`` and task: after that task, ``mean ±
    se`` over the seeds saved in ``done`` (keyed by (variant label, seed)) of each seen head's test accuracy, of their
    mean and of the same mean on the validation set."""
    rows = []
    for variant in config.variants:
        records = [done[(variant.label, s)] for s in config.seeds if (variant.label, s) in done]
        for t in range(len(config.tasks)):
            row: dict[str, Any] = {"variant": variant.label, "after_task": t + 1, "seeds": len(records)}
            for j in range(t + 1):
                row[f"head{j + 1}"] = mean_and_standard_error([r["accuracy"][t][j] for r in records])
            row["mean"] = mean_and_standard_error([sum(r["accuracy"][t]) / (t + 1) for r in records])
            row["val_mean"] = mean_and_standard_error([sum(r["val_accuracy"][t]) / (t + 1) for r in records])
            rows.append(row)
    return rows


def render_vcl_markdown(result: dict[str, Any], figures: str | Sequence[str] | None = None) -> str:
    """The page of a saved ``vcl-split-fmnist*`` result: the accuracy of every head after every task per variant
    (``mean ± se`` over seeds), the final mean accuracies and, for the search, each family's choice; ``figures``: the
    file names of the figures to link (:func:`varbnn.plots.continual_figure`, then
    :func:`varbnn.plots.continual_heads_figure`'s)."""
    n_tasks = len(result["config"]["tasks"])
    lines = [
        f"# {result['name']}",
        "",
        "Variational continual learning on Split Fashion-MNIST (Farquhar et al. 2020, Fig. 5 and Appendix C.1-C.2): test "
        "accuracy of each head after each task (Monte Carlo predictive), mean ± standard error over seeds; `mean` is the "
        "average over the heads seen so far, `val mean` the same on the held-out 10% of the training set.",
        "",
        *provenance_lines(result, runs_note=True, run_devices=True),
        "- training seconds per run: "
        + "; ".join(f"{k}: {sum(v) / max(len(v), 1):.0f}" for k, v in result["train_seconds"].items()),
        "",
    ]
    header = ["variant", "after task", "seeds", *(f"head {j + 1}" for j in range(n_tasks)), "mean", "val mean"]
    rows = [
        [row["variant"], str(row["after_task"]), str(row["seeds"]),
         *(mean_se(row.get(f"head{j + 1}"), 4, missing="") for j in range(n_tasks)),
         mean_se(row["mean"], 4), mean_se(row["val_mean"], 4)]
        for row in result["rows"]
    ]  # fmt: skip
    lines += markdown_table(header, rows)
    final = [r for r in result["rows"] if r["after_task"] == n_tasks]
    if final:
        lines += ["", "Mean accuracy over the 5 heads after the last task: "
                  + "; ".join(f"{r['variant']} {mean_se(r['mean'], 4)}" for r in final) + "."]  # fmt: skip
    if str(result["name"]).startswith("vcl-split-fmnist-search"):
        lines += ["", "Selected by the validation mean accuracy after the last task (the test columns play no part): "
                  + "; ".join(f"{family}: {label} ({value:.4f})" for family, (label, value) in selection(result).items())
                  + "."]  # fmt: skip
    for name in [figures] if isinstance(figures, str) else figures or ():
        caption = ("Per variant (Farquhar et al.'s Fig. 5 layout): each head's accuracy as tasks are added, and the mean."
                   if name.endswith("_heads.png") else "Per head: the variants side by side.")  # fmt: skip
        lines += ["", caption, "", f"![{name}]({name})"]
    return "\n".join(lines) + "\n"
