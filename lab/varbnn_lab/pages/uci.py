"""The page of ``varbnn reproduce uci`` (:mod:`varbnn_lab.uci`): the saved (dataset, variant, split) records
summarised into one row per dataset, and the Markdown page of those rows (test LL against the reference and the
protocol's LL ceiling, then RMSE)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from varbnn.metrics import mean_and_standard_error
from varbnn_lab.render import MISSING, markdown_table, mean_se, provenance_lines

if TYPE_CHECKING:
    from varbnn_lab.engine import RunKey
    from varbnn_lab.uci import UCIConfig

__all__ = ["REFERENCE_LL", "NOISE_UPDATE_TEXT", "summarise_uci", "render_uci_markdown"]

# Best test log-likelihood of VI / PBP / Dropout / VMG per dataset (as listed in the issue; the comparison Oh et al.
# make in their Table 1).
REFERENCE_LL = {
    "bostonHousing": -2.46,
    "concrete": -3.01,
    "energy": -1.06,
    "kin8nm": 1.10,
    "naval-propulsion-plant": 3.80,
    "power-plant": -2.80,
    "protein-tertiary-structure": -2.84,
    "wine-quality-red": -0.93,
    "yacht": -1.30,
}
NOISE_UPDATE_TEXT = {"closed_form": "in closed form after every step", "gradient": "by Adam with the network"}


def summarise_uci(
    config: UCIConfig, done: Mapping[RunKey, dict[str, Any]], ceiling: Callable[[str, list[int]], float | None]
) -> list[dict[str, Any]]:
    """The rows of a ``uci`` result, one per dataset of ``config``: the reference LL, ``ceiling(dataset, splits)`` over
    the splits run (the mean LL ceiling, or None), and per variant run the split count, ``mean ± se`` of RMSE and LL
    and the training seconds, from the saved records ``done`` (keyed by (dataset, variant label, split))."""
    rows = []
    for dataset in config.datasets:
        row: dict[str, Any] = {"dataset": dataset, "reference_ll": REFERENCE_LL[dataset]}
        splits = sorted({k for (d, _, k) in done if d == dataset})
        row["ll_ceiling"] = ceiling(dataset, splits)
        for variant in config.active_variants:
            records = [r for (d, v, _), r in sorted(done.items()) if d == dataset and v == variant.label]
            if not records:
                continue
            row[variant.label] = {
                "splits": len(records),
                "rmse": mean_and_standard_error([r["rmse"] for r in records]),
                "ll": mean_and_standard_error([r["ll"] for r in records]),
                "seconds": sum(r["seconds"] for r in records),
            }
        rows.append(row)
    return rows


def render_uci_markdown(result: dict[str, Any]) -> str:
    """The page of a saved ``uci`` result: test LL per dataset and variant against the reference (and the protocol's LL
    ceiling where saved), then RMSE, each ``mean ± se [splits]`` over the splits run."""
    config = result["config"]
    only = config.get("only")
    labels = [v["label"] for v in config["variants"] if only is None or v["label"] in only]
    has_ceiling = any("ll_ceiling" in row for row in result["rows"])  # results saved before the ceiling: no column
    lines = [
        f"# {result['name']}",
        "",
        "UCI regression, test log-likelihood (nats per point, original units) and RMSE, mean ± standard error over the "
        "splits run (count in brackets). Reference: best of VI / PBP / Dropout / VMG as listed by Oh et al.",
        "",
        *provenance_lines(result, runs_note=True),
        f"- noise precision: Gamma({config['prior_shape']:g}, {config['prior_rate']:g}) prior, Gamma posterior fitted "
        f"{NOISE_UPDATE_TEXT[config.get('noise_update', 'gradient')]}; protocol hash `{result['protocol']}`",
        f"- training: {config.get('epochs', 40)} epochs per split, at least {config.get('min_steps', 5000)} optimizer "
        f"steps, batch {config.get('batch_size', 32)}, Adam {config.get('lr', 1e-3):g}",
        "",
    ]
    ll_rows: list[list[str]] = []
    rmse_rows: list[list[str]] = []
    wins = compared = 0
    unreachable: list[str] = []
    for row in result["rows"]:
        entries = [row.get(label) for label in labels]
        best = max([-math.inf, *(e["ll"][0] for e in entries if e is not None)])  # NaN: not counted
        verdict = MISSING
        if best > -math.inf:
            compared += 1
            wins += best > row["reference_ll"]
            verdict = "yes" if best > row["reference_ll"] else "no"
        ceiling = row.get("ll_ceiling")
        if ceiling is not None and row["reference_ll"] > ceiling:
            unreachable.append(row["dataset"])
        ceiling_cells = [MISSING if ceiling is None else f"{ceiling:.2f}"] if has_ceiling else []
        ll_cells = [mean_se(e["ll"], 2, count=e["splits"]) if e else MISSING for e in entries]
        ll_rows.append([row["dataset"], f"{row['reference_ll']:.2f}", *ceiling_cells, *ll_cells, verdict])
        rmse_rows.append([row["dataset"], *(mean_se(e["rmse"], 3) if e else MISSING for e in entries)])
    ll_header = ["dataset", "reference LL", *(["LL ceiling"] if has_ceiling else []), *(f"{label} LL" for label in labels)]
    lines += markdown_table([*ll_header, "best varbnn beats reference"], ll_rows)
    lines += ["", f"Best varbnn family above the reference on {wins} of {compared} datasets run."]
    if any(row.get("ll_ceiling") is not None for row in result["rows"]):
        lines += [
            "",
            "LL ceiling: the highest expected test log-likelihood any network can reach under this protocol (closed-form "
            "Gamma posterior of the noise precision: shape a0 + n/2, rate >= b0; `varbnn_lab.uci."
            "log_likelihood_ceiling`), averaged over the splits run. "
            + (
                f"The reference lies above it on {len(unreachable)} set(s) ({', '.join(unreachable)}): no family can beat "
                "it there with this noise prior."
                if unreachable
                else "Every reference lies below it."
            ),
        ]
    lines += ["", *markdown_table(["dataset", *(f"{label} RMSE" for label in labels)], rmse_rows)]
    return "\n".join(lines) + "\n"
