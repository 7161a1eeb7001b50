"""The page of ``varbnn reproduce graves-mnist`` and ``graves-mnist-lstm`` (:mod:`varbnn_lab.graves`): the
saved (variant, seed) runs summarised into one row per variant of Graves (2011) table 1, and the Markdown page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from varbnn.metrics import mean_and_standard_error
from varbnn_lab.render import markdown_table, mean_se, provenance_lines

if TYPE_CHECKING:
    from varbnn_lab.engine import RunKey
    from varbnn_lab.graves import GravesConfig

__all__ = ["summarise_graves", "render_graves_markdown"]


def summarise_graves(config: GravesConfig, done: Mapping[RunKey, dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a ``graves-mnist`` result, one per variant of ``config`` with saved runs in ``done`` (keyed by
    (variant label, seed)): its posterior, prior and early stopping, and ``mean ± se`` over seeds of the test errors,
    NLL, epoch, training time and MDL terms (None where a seed's complexity loss is not finite)."""
    rows = []
    for variant in config.variants:
        records = [done[(variant.label, s)] for s in config.seeds if (variant.label, s) in done]
        if not records:
            continue
        row: dict[str, Any] = {"variant": variant.label, "posterior": variant.posterior_text, "prior": variant.prior_text,
                               "early_stopping": variant.early_stopping, "seeds": len(records)}  # fmt: skip
        for key in ("test_error_mode", "test_error_mc", "test_nll_mc", "epochs", "train_seconds"):
            row[key] = mean_and_standard_error([float(r[key]) for r in records])
        for key in ("ratio", "error_bits", "complexity_bits", "bits_per_weight"):
            values = [r["mdl"][key] for r in records]
            row[key] = mean_and_standard_error([float(v) for v in values]) if None not in values else None
        rows.append(row)
    return rows


def render_graves_markdown(result: dict[str, Any], figure: str | None = None) -> str:
    """The page of a saved ``graves-mnist`` result: table 1's analogue, one row per variant (``mean ± se`` over seeds)."""
    config = result["config"]
    lines = [
        f"# {result['name']}",
        "",
        f"Graves (2011) table 1 analogue on MNIST: MLP 784-{'-'.join(map(str, config['hidden']))}-10, Adam lr {config['lr']}, "
        f"batch {config['batch_size']}, at most {config['epochs']} epochs; adaptive priors at their closed-form optimum "
        "after every update. Error = test classification error in % of the posterior mode ('remove weight noise') and of "
        f"the Monte Carlo predictive ({config['eval_samples']} draws). Epochs = the epoch evaluated (lowest validation "
        "error with early stopping, else lowest training error loss). Ratio = (L^E + L^C) on the training targets / "
        "their uniform code length (N log2 10 bits); defined only for Gaussian posteriors with a proper prior. "
        "Mean ± standard error over seeds.",
        "",
        *provenance_lines(result, runs_note=True, run_devices=True),
        "",
    ]
    header = ["name", "posterior", "prior", "early stop", "error (mode) %", "error (MC) %", "test NLL (MC)", "epochs", "ratio",
              "L^E bits", "L^C bits", "bits/weight", "train s"]  # fmt: skip
    rows = [
        [r["variant"], r["posterior"], r["prior"], "yes" if r["early_stopping"] else "no",
         mean_se(r["test_error_mode"], 2, 100.0), mean_se(r["test_error_mc"], 2, 100.0), mean_se(r["test_nll_mc"], 4),
         mean_se(r["epochs"], 0), mean_se(r["ratio"], 4), mean_se(r["error_bits"], 0), mean_se(r["complexity_bits"], 0),
         mean_se(r["bits_per_weight"], 3), mean_se(r["train_seconds"], 0)]
        for r in result["rows"]
    ]  # fmt: skip
    lines += markdown_table(header, rows)
    if figure:
        lines += ["", f"![{figure}]({figure})"]
    return "\n".join(lines) + "\n"
