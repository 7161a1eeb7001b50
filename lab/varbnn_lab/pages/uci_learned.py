"""The page of ``varbnn reproduce uci-learned`` (:mod:`varbnn_lab.uci_learned`): the saved (dataset, variant,
split) records summarised into one row per dataset with the two published references, and the Markdown page with
issue 30's three goals."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from varbnn.metrics import mean_and_standard_error
from varbnn_lab.pages.uci import REFERENCE_LL
from varbnn_lab.render import MISSING, markdown_table, mean_se, provenance_lines

if TYPE_CHECKING:
    from varbnn_lab.engine import RunKey
    from varbnn_lab.uci_learned import UCILearnedConfig

__all__ = [
    "DEEP_ENSEMBLE_LL", "BASELINE_FAMILIES", "LONGEST_FRACTION", "TIME_REFERENCE", "PAIRED", "chose_longest",
    "summarise_uci_learned", "render_uci_learned_markdown", "uci_learned_figures",
]  # fmt: skip

DEEP_ENSEMBLE_LL = {  # Lakshminarayanan et al. 2017, Table 1 (5 networks), as listed in issue 30
    "bostonHousing": -2.41, "concrete": -3.06, "energy": -1.38, "kin8nm": 1.20, "naval-propulsion-plant": 5.63,
    "power-plant": -2.79, "protein-tertiary-structure": -2.83, "wine-quality-red": -0.94, "yacht": -1.18,
}  # fmt: skip
BASELINE_FAMILIES = ("mc-dropout", "ensemble")  # the baselines' "families": not varbnn families, not in the goals


PAIRED = (("IVON (mean-field)", "mean-field"),)
"""(column, its reference): columns compared split by split with a reference on the splits both ran (the page's
paired table): IVON against the same mean-field network trained by Adam, the optimizer the only difference. A column
added later may have run fewer splits than the others; its set means are then over other splits than theirs."""

LONGEST_FRACTION = 0.9
"""A choice of at least this fraction of the longest length searched counts as the longest (:func:`chose_longest`):
where the step cap makes the last two lengths nearly equal (concrete: 400 and 417 epochs), either is the budget."""


def chose_longest(record: Mapping[str, Any]) -> bool:
    """Whether a run's validation choice was the longest training length its search tried (the last of ``epochs``, or
    the ``max_steps`` cap), or at least :data:`LONGEST_FRACTION` of it: the search's budget, not the validation score,
    ended its training. The choice is the search's argmax of the finite validation scores, as the run made it (the
    first of equal scores)."""
    search = record.get("search") or []
    if not search:
        return False
    finite = [s for s in search if math.isfinite(s["val_ll"])] or search
    chosen = max(finite, key=lambda s: s["val_ll"])["epochs"]
    return chosen >= LONGEST_FRACTION * max(s["epochs"] for s in search)


def summarise_uci_learned(config: UCILearnedConfig, done: Mapping[RunKey, dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a ``uci-learned`` result, one per dataset of ``config``: the two reference LLs and per variant run
    the split count, ``mean ± se`` of LL and RMSE and the seconds, from the saved records ``done`` (keyed by (dataset,
    variant label, split))."""
    rows = []
    for dataset in config.datasets:
        row: dict[str, Any] = {"dataset": dataset, "reference_ll": REFERENCE_LL[dataset]}
        row["ensemble_ll"] = DEEP_ENSEMBLE_LL[dataset]
        for variant in config.active_variants:
            records = [r for (d, v, _), r in sorted(done.items()) if d == dataset and v == variant.label]
            if records:
                row[variant.label] = {
                    "splits": len(records), "ll": mean_and_standard_error([r["ll"] for r in records]),
                    "rmse": mean_and_standard_error([r["rmse"] for r in records]),
                    "seconds": sum(r["seconds"] for r in records),
                    "compiled": sum(1 for r in records if r.get("compile")),
                    "at_longest": sum(1 for r in records if chose_longest(r)),
                }  # fmt: skip
                if any("ivon_options" in r for r in records):  # the IVON column: the recipe(s) its runs used
                    row[variant.label]["ivon_options"] = sorted({json.dumps(r.get("ivon_options"), sort_keys=True)
                                                                 for r in records})  # fmt: skip
        labels = {v.label for v in config.active_variants}
        for label, reference in PAIRED:
            if label in labels and reference in labels:
                ours = {s: r for (d, v, s), r in done.items() if d == dataset and v == label}
                theirs = {s: r for (d, v, s), r in done.items() if d == dataset and v == reference}
                splits = sorted(set(ours) & set(theirs))
                if splits:
                    diffs = [ours[s]["ll"] - theirs[s]["ll"] for s in splits]
                    row.setdefault("paired", {})[label] = {
                        "reference": reference, "splits": splits, "ll_difference": mean_and_standard_error(diffs),
                        "above": sum(1 for d in diffs if d > 0),
                        "reference_ll": mean_and_standard_error([theirs[s]["ll"] for s in splits]),
                        "ll": mean_and_standard_error([ours[s]["ll"] for s in splits]),
                    }  # fmt: skip
        rows.append(row)
    return rows


TIME_REFERENCE = "MAP (Delta)"
"""The variant the page's training times are relative to: the plain network (weight decay as a Normal prior)."""


def _seconds_cell(entry: Mapping[str, Any] | None, reference: Mapping[str, Any] | None) -> str:
    """``mean seconds per split (ratio to the reference's)``, or the missing mark."""
    if not entry:
        return MISSING
    seconds = entry["seconds"] / entry["splits"]
    if not reference or reference["seconds"] <= 0:
        return f"{seconds:.0f} s"
    return f"{seconds:.0f} s ({seconds / (reference['seconds'] / reference['splits']):.1f}x)"


def _list(values: Any) -> str:
    return ", ".join(f"{v:g}" for v in values)


def _compiled_line(rows: list[dict[str, Any]], labels: list[str]) -> str:
    """The bullet that says which runs trained with ``fit(compile=...)`` (a runtime choice, not the protocol)."""
    counts = {label: [0, 0] for label in labels}
    for row in rows:
        for label in labels:
            if label in row:
                counts[label][0] += row[label].get("compiled", 0)
                counts[label][1] += row[label]["splits"]
    compiled = sum(c for c, _ in counts.values())
    if compiled == 0:
        return "- training steps: eager (`fit(compile=False)`) in every run"
    total = sum(n for _, n in counts.values())
    parts = ", ".join(f"{label} {c} of {n}" for label, (c, n) in counts.items() if n)
    where = "every run" if compiled == total else f"{compiled} of {total} runs ({parts}), eager in the rest"
    return (
        f"- training steps: `fit(compile=...)` in {where}: a runtime choice, not the protocol (each record names "
        "it); on the CPU the compiled step "
        "drew the eager step's random numbers until 2026-11-28 (RDP's Wood proposals too since commit 7128299; before "
        "it, in one fixed batch), its weight noise from varbnn.philox since: the same distribution, another random "
        "stream"
    )


def uci_learned_figures(result: dict[str, Any], out: Path) -> list[str]:
    """Write ``OUT/<name>_cost.png`` (:func:`varbnn_lab.figures.regression_cost_figure`: test log-likelihood against the
    seconds per split relative to :data:`TIME_REFERENCE`, one panel per set, the published references as lines) when
    a row holds the reference variant; returns the file names written."""
    if not any(TIME_REFERENCE in row for row in result["rows"]):
        return []
    from varbnn_lab.figures import regression_cost_figure

    config = result["config"]
    labels = [v["label"] for v in config["variants"] if config.get("only") is None or v["label"] in config["only"]]
    path = out / f"{result['name']}_cost.png"
    title = f"{result['name']}: test log-likelihood against training cost"
    references = (("reference_ll", "best of VI/PBP/Dropout/VMG", "--"), ("ensemble_ll", "deep ensembles (paper)", ":"))
    regression_cost_figure(result["rows"], labels, TIME_REFERENCE, path, title=title, lines=references)
    return [path.name]


def _paired_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The paired tables (:data:`PAIRED`): per set, the splits both columns ran, both test LLs on them and their
    difference (mean ± se over the splits) with the count of splits where the column is above its reference."""
    lines: list[str] = []
    for label, reference in PAIRED:
        table = []
        for row in rows:
            entry = row.get("paired", {}).get(label)
            if entry:
                n = len(entry["splits"])
                table.append([row["dataset"], str(n), mean_se(entry["ll"], 3), mean_se(entry["reference_ll"], 3),
                              mean_se(entry["ll_difference"], 3), f"{entry['above']} of {n}"])  # fmt: skip
        if table:
            lines += [
                "", f"{label} against {reference} on the same splits (the runs of both; a column run on fewer splits "
                "than the others is compared only where both ran): test log-likelihood of each and the difference, mean "
                "± standard error over the splits.", "",
                *markdown_table(["dataset", "splits", label, reference, "difference", f"{label} above"], table),
            ]  # fmt: skip
    return lines


def render_uci_learned_markdown(result: dict[str, Any]) -> str:
    """The page: LL and RMSE per dataset and variant, the two references, and issue 30's three goals."""
    config = result["config"]
    labels = [v["label"] for v in config["variants"] if config.get("only") is None or v["label"] in config["only"]]
    families = [v["label"] for v in config["variants"] if v["label"] in labels and v["family"] not in BASELINE_FAMILIES]
    lines = [
        f"# {result['name']}", "",
        "UCI regression under the learned-noise protocol (`varbnn_lab.uci_learned`): test log-likelihood (nats "
        "per point, original units) and RMSE, mean ± standard error over the splits run [count].", "",
        *provenance_lines(result, runs_note=True),
        f"- search: prior scales {_list(config['prior_scales'])} (MC dropout: rates {_list(config['dropout_rates'])}) x "
        f"epochs {_list(config['epochs'])} (each at most {config['max_steps']} steps) by the log-likelihood of "
        f"{config['validation_fraction']:g} of each training split; protocol hash `{result['protocol']}`",
        "- protocol: the noise std is a point estimate learned with the network (maximising the ELBO; with n >= 300 "
        "points a Gamma posterior on one precision would be concentrated near it, and the Gamma(6, 6) page shows how "
        "a prior on it can cap the test log-likelihood); inputs and targets standardised by the statistics of the data "
        "each run trains on; the chosen setting retrained on the whole training split and tested once: per-point "
        "log-likelihood by log-sum-exp over the draws (an ensemble's members are its draws), in original units",
        _compiled_line(result["rows"], labels), "",
    ]  # fmt: skip
    ll_rows: list[list[str]] = []
    rmse_rows: list[list[str]] = []
    longest_rows: list[list[str]] = []
    time_rows: list[list[str]] = []
    wins_ref = wins_ens = rdp_ahead = compared = rdp_compared = 0
    for row in result["rows"]:
        entries = [row.get(label) for label in labels]
        ll_rows.append([row["dataset"], f"{row['reference_ll']:.2f}", f"{row['ensemble_ll']:.2f}",
                        *(mean_se(e["ll"], 2, count=e["splits"]) if e else MISSING for e in entries)])  # fmt: skip
        rmse_rows.append([row["dataset"], *(mean_se(e["rmse"], 3) if e else MISSING for e in entries)])
        longest_rows.append([row["dataset"], *(f"{e['at_longest']} of {e['splits']}" if e and "at_longest" in e
                                               else MISSING for e in entries)])  # fmt: skip
        time_rows.append([row["dataset"], *(_seconds_cell(e, row.get(TIME_REFERENCE)) for e in entries)])
        best = max((row[f]["ll"][0] for f in families if f in row), default=None)
        if best is not None:
            compared += 1
            wins_ref += best > row["reference_ll"]
            wins_ens += best > row["ensemble_ll"]
        if "RDP (double)" in row and "mean-field" in row:
            rdp_compared += 1
            rdp_ahead += row["RDP (double)"]["ll"][0] >= row["mean-field"]["ll"][0]
    lines += markdown_table(["dataset", "best of VI/PBP/Dropout/VMG", "deep ensembles (paper)", *labels], ll_rows)
    lines += [
        "", f"- best varbnn family above the best of VI/PBP/Dropout/VMG on {wins_ref} of {compared} sets run (goal: >= 6 of 9)",
        f"- above the deep-ensemble paper's numbers on {wins_ens} of {compared} (goal: >= 4 of 9)",
        f"- RDP at or above mean-field on {rdp_ahead} of {rdp_compared} (goal: >= 5 of 9)", "",
        *markdown_table(["dataset", *(f"{label} RMSE" for label in labels)], rmse_rows), "",
        "Splits whose validation choice was the longest training length searched (the last length, or the cap of "
        f"{config['max_steps']} steps; a choice of at least {LONGEST_FRACTION:.0%} of it counts): there the search's "
        "budget, not the validation score, ended training.", "",
        *markdown_table(["dataset", *labels], longest_rows), "",
        f"Seconds per split (the search and the final run, one worker), and relative to {TIME_REFERENCE} (the plain "
        "network with weight decay) on the same set; within a set every variant ran in the same lanes, compiled or "
        "eager alike, but the machine's load varied and a few runs include pauses (the journal names them), so the ratios "
        "are rough.", "",
        *markdown_table(["dataset", *labels], time_rows),
    ]  # fmt: skip
    for name in result.get("figures", ()):
        lines += [
            "", f"![test log-likelihood against training seconds per split relative to {TIME_REFERENCE}]({name})", "",
            f"The figure ({name}): per set, each variant's test log-likelihood (mean ± standard error) against its "
            f"seconds per split relative to {TIME_REFERENCE}'s (log scale; rough, as above); dashed: the best of "
            "VI/PBP/Dropout/VMG, dotted: the deep-ensemble paper.",
        ]  # fmt: skip
    lines += _paired_lines(result["rows"])
    recipes = sorted(
        {o for row in result["rows"] for v in row.values() if isinstance(v, dict) for o in v.get("ivon_options", ())}
    )
    if recipes:
        lines += ["", "The IVON column's optimizer options on top of `n_data` and `kl_weight` (from its run records; `null`: "
                  "IVON's defaults, before the records named them): " + ", ".join(f"`{o}`" for o in recipes) + "."]  # fmt: skip
    lines += ["", "YearPredictionMSD (the workshop version's tenth set) is not in the shared data and is not run."]
    if result["name"] == "uci-learned":  # the committed page's folder holds the trace
        lines += [
            "", "RDP against mean-field: [rdp-trace.md](rdp-trace.md) traces RDP's concentration, radii and validation "
            "log-likelihood over energy split 0's search run (`benchmarks/rdp_trace.py`).",
        ]  # fmt: skip
    return "\n".join(lines) + "\n"
