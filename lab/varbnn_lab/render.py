"""``varbnn render OUT/NAME/NAME.json``: one entry point that rewrites the page of ANY experiment from its saved JSON.

The numbers and the run's provenance (command, commit, device, seconds) are the JSON's; only the layout is today's.
Each experiment's page is drawn by the renderer its entry in :func:`varbnn_lab.catalog.experiment` names
(:func:`renderer_for`); the generic runner's configs by :func:`render_markdown`. Figures are linked when their files
lie beside the JSON (they are not redrawn).

Every page is drawn with the same helpers: :func:`markdown_table` (a table from flat rows of formatted cells),
:func:`mean_se` (a ``mean ± se`` cell) and :func:`provenance_lines` (the command, commit, device and wall-time bullets).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from varbnn_lab.engine import git_commit, read_result

__all__ = [
    "renderer_for", "render_result", "render_saved", "SPECIAL_PAGES", "markdown_table", "mean_se", "provenance_lines",
    "stale_lines", "MISSING", "RIGHT",
]  # fmt: skip

MISSING = "–"
"""The cell of a value a page does not have (a variant not run, a NaN)."""

RIGHT = "---:"
"""The separator of a right-aligned column of :func:`markdown_table` (``"---"``: the default, left as Markdown has it)."""


# -- the helpers every experiment's page is drawn with ---------------------------------------------------------------


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]], align: Sequence[str] | None = None) -> list[str]:
    """The lines of a Markdown table: ``header``, a separator line of ``align`` (one entry per column, e.g. ``"---"``, the
    default, or :data:`RIGHT`), and one line per row of ``rows``, each a flat sequence of already-formatted cells, one
    per column. Raises ``ValueError`` for a row or an ``align`` of another length than the header."""
    header = list(header)
    align = ["---"] * len(header) if align is None else list(align)
    if len(align) != len(header):
        raise ValueError(f"align has {len(align)} entries for {len(header)} columns")
    lines = ["| " + " | ".join(header) + " |", "|" + "".join(a + "|" for a in align)]
    for row in rows:
        cells = list(row)
        if len(cells) != len(header):
            raise ValueError(f"a row of {len(cells)} cells for {len(header)} columns: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def mean_se(
    entry: Sequence[float] | None, digits: int, scale: float = 1.0, count: int | None = None, missing: str = MISSING
) -> str:
    """``"mean ± se"`` of ``entry = (mean, standard error)`` (as :func:`varbnn.metrics.mean_and_standard_error` gives
    it), both times ``scale`` with ``digits`` decimals; the ``± se`` part left out when the standard error is NaN (one
    run); ``" [count]"`` appended when ``count`` is given. ``missing`` for ``entry=None``."""
    if entry is None:
        return missing
    mean, se = entry
    text = f"{mean * scale:.{digits}f}" + ("" if math.isnan(se) else f" ± {se * scale:.{digits}f}")
    return text if count is None else f"{text} [{count}]"


def provenance_lines(
    result: Mapping[str, Any],
    *,
    runs_note: bool = False,
    run_commits: bool = False,
    run_devices: bool = False,
    seconds_digits: int = 1,
) -> list[str]:
    """The provenance bullets of a page, the same on every page: the command, the commit, the device and the wall time
    of the invocation that wrote ``result`` (a saved result: ``command``, ``commit``, ``device``, ``seconds``, as
    :func:`varbnn_lab.engine.provenance` gives them; ``seconds`` with ``seconds_digits`` decimals).
    ``runs_note``: the commit's bullet says that each run's own commit and device are in the ``_runs.jsonl`` file;
    ``run_commits`` / ``run_devices``: a bullet listing the result's ``run_commits`` / ``run_devices`` (the commits and
    devices that trained its runs), left out when the result has none; the device bullet then says it is this
    invocation's. A result's ``provenance_note`` (a correction of
    its provenance written into the JSON by hand, e.g. a commit recorded wrongly) is its own bullet, and so are its
    ``stale_runs`` (runs made by code that has changed since: :func:`stale_lines`)."""
    note = " (each run's own commit and device are in the `_runs.jsonl` file)" if runs_note else ""
    lines = [f"- command: `{result['command']}`", f"- commit: `{result['commit']}`{note}"]
    if run_commits and result.get("run_commits"):
        lines.append("- commits that trained the runs: " + ", ".join(f"`{c}`" for c in result["run_commits"]))
    # where the result names the devices that trained its runs, this one is only the invocation's (e.g. the CPU that
    # rendered a page of GPU runs with --no-train)
    here = "device of this invocation" if result.get("run_devices") or result.get("variant_devices") else "device"
    lines.append(f"- {here}: {result['device']}")
    if run_devices and result.get("run_devices"):
        lines.append("- devices that trained the runs: " + ", ".join(result["run_devices"]))
    lines.append(f"- wall time of this invocation: {result['seconds']:.{seconds_digits}f} s")
    if result.get("provenance_note"):
        lines.append(f"- provenance: {result['provenance_note']}")
    lines.extend(stale_lines(result))
    return lines


def stale_lines(result: Mapping[str, Any]) -> list[str]:
    """The bullets of a result's ``stale_runs`` (:mod:`varbnn_lab.provenance`): none when it has none; else one
    saying how many runs shown were made by code that has changed since, then one per value of the runs' first key
    field (e.g. per variant) naming the rest of each run's key and the commits that made them."""
    stale = result.get("stale_runs")
    if not isinstance(stale, list) or not stale:
        return []
    groups: dict[str, tuple[list[str], set[str]]] = {}
    for entry in stale:
        if not isinstance(entry, Mapping):
            continue
        key = [(k, v) for k, v in entry.items() if k not in ("commit", "code_hash")]
        if len(key) == 1 and key[0][0] == "run" and isinstance(key[0][1], list) and key[0][1]:
            head, rest = str(key[0][1][0]), ", ".join(map(str, key[0][1][1:]))
        else:
            head = f"{key[0][0]} {key[0][1]}" if key else "run"
            rest = ", ".join(f"{k} {v}" for k, v in key[1:])
        runs, commits = groups.setdefault(head, ([], set()))
        if rest:
            runs.append(rest)
        commits.add(str(entry.get("commit") or "unknown"))
    lines = [
        f"- **stale runs**: {len(stale)} run(s) on this page were made by code that has changed since (another or no "
        "code hash: reused with `--reuse-stale` or rendered with `--no-train`); rerun without those options to retrain "
        "them"
    ]
    for head, (runs, commits) in groups.items():
        which = f" ({'; '.join(runs)})" if runs else ""
        lines.append(f"  - {head}{which}: stale, from commit {', '.join(f'`{c}`' for c in sorted(commits))}, code changed since")
    return lines


def renderer_for(name: str) -> Callable[[dict[str, Any], Path | None], str] | None:
    """The page renderer of experiment ``name`` (its ``-quick`` form too) as ``render(result, folder)`` (``folder``:
    where the JSON lies, to find the figures): the catalog's (:func:`varbnn_lab.catalog.experiment`), or
    ``None`` for a config of the generic runner or a name the catalog does not know."""
    from varbnn_lab.catalog import experiment

    try:
        return experiment(name).render
    except ValueError:
        return None


def _special_pages() -> tuple[str, ...]:
    from varbnn_lab.catalog import SPECIAL

    return tuple(n for n, e in SPECIAL.items() if not n.endswith("-lstm"))


SPECIAL_PAGES = _special_pages()
"""The experiments whose pages are not the generic runner's (their ``-lstm`` forms share their renderers)."""


def render_result(result: dict[str, Any], folder: Path | None = None, rendered_at: str | None = None) -> str:
    """The Markdown page of a saved result of ``varbnn reproduce NAME`` (any NAME of ``varbnn list``). ``rendered_at``:
    the commit named as the re-rendering one on generic runner pages."""
    if not isinstance(result, dict) or not isinstance(result.get("name"), str):
        raise ValueError("a saved result is a JSON object with a 'name' (the experiment's)")
    render = renderer_for(result["name"])
    if render is not None:
        return render(result, folder)
    return render_markdown(result, rendered_at=rendered_at)


def render_saved(path: str | Path, rendered_at: str | None = None) -> Path:
    """Rewrite the page ``NAME.md`` beside a saved result ``NAME.json`` of ``varbnn reproduce NAME`` (any experiment)
    and return its path; the generic runner's pages name the commit that re-rendered them (``rendered_at``, default
    :func:`varbnn_lab.runner.git_commit` now)."""
    path = Path(path)
    result = read_result(path)
    name = result.get("name")
    if not isinstance(name, str) or renderer_for(name) is None:
        return _render_generic_saved(path, rendered_at)
    page = path.with_suffix(".md")
    page.write_text(render_result(result, path.parent))
    return page


# -- the generic runner's page ---------------------------------------------------------------------------------------


def _format(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return MISSING
        if value.is_integer() and abs(value) >= 1000:
            return f"{int(value):,}"
        return f"{value:.4g}"
    return str(value)


_LEGEND = {
    "accuracy": "accuracy of the Monte Carlo predictive (mean of the draws' probabilities)",
    "nll": "NLL of that predictive, nats per example",
    "nelbo": "test -ELBO per training example, nats: expected NLL of one weight draw + KL / N_train",
    "sample_nll": "expected NLL of one weight draw, nats",
    "sample_accuracy": "accuracy of one weight draw",
    "parameters": "number of trained parameters (variational parameters for Bayesian models)",
    "snr": "mean gradient SNR E[g]^2/Var[g] of the named layer's std parameters over the last steps",
    "val_nelbo": "validation -ELBO per training example (beta = 1), nats",
    "selected_epoch": "the epoch evaluated: lowest mean training NLL among the last select_best_of_last epochs",
}


def _cell(row: Mapping[str, Any], key: str) -> str:
    """``row[key]`` formatted, with ``± row[key_sem]`` where the row has a finite SEM (not for ``*_wsem`` columns)."""
    cell = _format(row.get(key, float("nan")))
    sem = row.get(f"{key}_sem")
    if not key.endswith("_wsem") and isinstance(sem, float) and not math.isnan(sem):
        cell += f" ± {_format(sem)}"
    return cell


def _table(rows: list[dict[str, Any]], keys: list[str]) -> list[str]:
    return markdown_table(keys, ([_cell(row, key) for key in keys] for row in rows))


# Oh, Adamczewski, Park (2020), Table 2 (both versions): (method, architecture, FLOPs, parameters, test error) as
# published; the sizes are the paper's own counts (lenet5_sizes recomputes them by the paper's formulas).
LENET5_PUBLISHED: tuple[tuple[str, str, int, int, float], ...] = (
    ("RDP (paper)", "4-7-110-66", 125_000, 20_000, 0.010),
    ("BC-GNJ", "8-13-88-13", 307_000, 22_000, 0.010),
    ("BC-GHS", "5-10-76-16", 169_000, 15_000, 0.010),
    ("FDOO(100K)", "2-7-112-478", 119_000, 66_000, 0.011),
    ("FDOO(200K)", "3-8-128-499", 163_000, 81_000, 0.010),
    ("GL", "3-12-192-500", 236_000, 134_000, 0.010),
    ("GD", "7-13-208-16", 298_000, 49_000, 0.011),
    ("SBP", "3-18-284-283", 295_000, 164_000, 0.009),
)


def _thousands(value: int) -> str:
    """A size in K or M, e.g. 125K, 60.4K, 1.5M (the paper's style, without dropping significant digits)."""
    return f"{value / 1e6:g}M" if value >= 1_000_000 else f"{value / 1e3:g}K"


# Published numbers shown beside a config's own results (kept out of ExperimentConfig, whose hash names the
# checkpoints of running experiments).
PAPER_TABLES: dict[str, list[str]] = {
    "lenet5-prune": [
        "Oh, Adamczewski, Park (2020), Table 2 (both versions): structured pruning of LeNet-5-Caffe 20-50-800-500 on "
        "MNIST; architecture = units kept per layer. Goal of this reproduction: <= 1.0% error with <= 15K parameters "
        "and <= 120K FLOPs.",
        "",
        *markdown_table(
            ["method", "architecture", "FLOPs", "parameters", "error"],
            [[m, a, _thousands(f), _thousands(p), f"{100 * e:.1f}%"] for m, a, f, p, e in LENET5_PUBLISHED],
            ["---", "---", RIGHT, RIGHT, RIGHT],
        ),
    ],
}
PAPER_TABLES["lenet5-prune-published"] = PAPER_TABLES["lenet5-prune"]


def published_lenet5_sizes() -> list[tuple[str, str, int, int, int, int, float]]:
    """:data:`LENET5_PUBLISHED` with the recomputed sizes: ``(method, architecture, FLOPs as counted, FLOPs
    recomputed, parameters as counted, parameters recomputed, error)`` (:func:`varbnn.prune.lenet5_sizes`)."""
    from varbnn.prune import lenet5_sizes

    rows = []
    for method, arch, flops, params, error in LENET5_PUBLISHED:
        params_again, flops_again = lenet5_sizes(arch)
        rows.append((method, arch, flops, flops_again, params, params_again, error))
    return rows


def _published_front_table() -> list[str]:
    rows = [
        [method, arch, _thousands(flops), f"{flops_again:,}", _thousands(params), f"{params_again:,}", f"{100 * error:.1f}%"]
        for method, arch, flops, flops_again, params, params_again, error in published_lenet5_sizes()
    ]
    return [
        "Oh, Adamczewski, Park (2020), Table 2: the published architectures with their sizes as counted there and as "
        "varbnn.prune.lenet5_sizes recomputes them by the paper's formulas (fc1 reads the listed number of inputs). "
        "Goals (issue 30): <= 1.0% test error at <= 160K FLOPs and <= 1.1% at <= 120K FLOPs, selected on validation.",
        "",
        *markdown_table(
            ["method", "architecture", "FLOPs (paper)", "FLOPs (recomputed)", "parameters (paper)",
             "parameters (recomputed)", "error"],  # fmt: skip
            rows,
            ["---", "---", RIGHT, RIGHT, RIGHT, RIGHT, RIGHT],
        ),
    ]


PAPER_TABLES["lenet5-front"] = _published_front_table()


# The pruning rules of a prune config, one row each in the rules table: (label, key prefix, how the rule chooses).
_PRUNE_RULES = (
    ("gap", "pruned", "largest gap in each layer's score histogram (no data)"),
    ("validation", "val_pruned", "thresholds chosen on the validation set (varbnn.prune.validation_thresholds)"),
    ("budget, one step", "budget_pruned", "the config's FLOPs / parameter budget (varbnn.prune.budget_units)"),
    ("budget, staged", "iter_pruned", "the budget in prune-and-retrain stages (varbnn.prune.iterative_budget)"),
    (
        "staged, random init",
        "scratch_pruned",
        "the staged rule's architecture with every weight re-drawn (varbnn.prune.reinitialize) and trained by the same "
        "retraining for prune_scratch_epochs epochs: does the posterior give more than the architecture? (Liu et al. 2019)",
    ),
)
_PRUNE_COLUMNS = (  # (header, key suffix after the rule's prefix; for the staged rule, its retrained model's)
    ("architecture", "architecture"),
    ("parameters", "parameters"),
    ("FLOPs", "flops"),
    ("validation error", "validation_error"),
    ("test error", "test_error"),
    ("retrained: epoch kept", "finetuned_epoch"),
    ("retrained: test error", "finetuned_test_error"),
)


def _percent(value: Any) -> str:
    return MISSING if isinstance(value, float) and math.isnan(value) else f"{100 * float(value):.2f}%"


def _prune_keys(keys: list[str]) -> list[str]:
    prefixes = tuple(prefix + "_" for _, prefix, _ in _PRUNE_RULES)
    return [k for k in keys if k.startswith(prefixes)]


def _prune_table(rows: list[dict[str, Any]]) -> list[str]:
    """One row per (variant, pruning rule): the exported model's architecture, size, errors and retraining. The staged
    rule's model is retrained inside each stage, so its errors go in the retrained columns."""
    header = ["variant", "rule", *(h for h, _ in _PRUNE_COLUMNS)]
    table: list[list[str]] = []
    stages: list[str] = []
    for row in rows:
        for label, prefix, _ in _PRUNE_RULES:
            if f"{prefix}_architecture" not in row:
                continue
            values = {suffix: row.get(f"{prefix}_{suffix}", float("nan")) for _, suffix in _PRUNE_COLUMNS}
            if prefix == "iter_pruned":
                values["finetuned_test_error"], values["test_error"] = values["test_error"], float("nan")
                values["finetuned_epoch"] = f"{len(str(row.get('iter_pruned_stages', '')).split(' > '))} stages"
                stages.append(f"- {row['variant']}, staged rule: {row.get('iter_pruned_stages', MISSING)}")
            cells = [_percent(v) if suffix.endswith("error") else _format(v) for suffix, v in values.items()]
            table.append([str(row["variant"]), label, *cells])
    lines = markdown_table(header, table, ["---"] * 3 + [RIGHT] * (len(header) - 3))
    rules = [f"- {label}: {text}" for label, _, text in _PRUNE_RULES]
    notes = [
        "Pruning rules (architecture = units kept per layer; parameters and FLOPs of the exported plain model, Oh et "
        "al.'s formulas; errors of that model with its posterior-mode weights; validation error: what the rule saw; "
        "retrained: plain Adam on the training set (varbnn.prune.finetune), the epoch with the lowest validation error, "
        "0 = none helped; the staged rule retrains in every stage: its validation error is that of its last stage's "
        "retrained model, whose test error is in the retrained column; likewise the random-initialisation control's):",
        "",
        *rules,
    ]
    return [*notes, "", *lines, *([""] + stages if stages else [])]


_FRONT_KEY = re.compile(r"^front(\d+)_")


def front_budgets(rows: list[dict[str, Any]]) -> list[int]:
    """The FLOPs budgets of the ``prune_front`` points in ``rows`` (score keys ``front{B}_*``), increasing."""
    return sorted({int(m.group(1)) for row in rows for key in row if (m := _FRONT_KEY.match(key))})


def _percent_sem(value: Any, sem: Any) -> str:
    spread = isinstance(sem, float) and not math.isnan(sem)
    return _percent(value) + (f" ± {_percent(sem)}" if spread else "")


def _front_table(rows: list[dict[str, Any]]) -> list[str]:
    """One row per (FLOPs budget, variant): the staged rule's exported model at that budget and its random-init
    control; under it, per budget, the variant with the lowest mean validation error (the front's point)."""
    header = ["FLOPs budget", "variant", "architecture (per seed)", "parameters", "FLOPs", "budget reached",
              "validation error", "test error", "random init: validation error", "random init: test error"]  # fmt: skip
    table: list[list[str]] = []
    for budget in front_budgets(rows):
        p = f"front{budget}"
        have = [row for row in rows if f"{p}_architecture" in row]
        for row in have:
            errors = [
                _percent_sem(row.get(f"{p}_{k}", float("nan")), row.get(f"{p}_{k}_sem"))
                for k in ("validation_error", "test_error", "scratch_validation_error", "scratch_test_error")
            ]
            reached = float(row.get(f"{p}_reached", float("nan")))
            table.append([_thousands(budget), str(row["variant"]), str(row[f"{p}_architecture"]),
                          f"{row[f'{p}_parameters']:,.0f}", f"{row[f'{p}_flops']:,.0f}",
                          MISSING if math.isnan(reached) else f"{reached:.0%} of seeds", *errors])  # fmt: skip
    chosen = [f"- {_thousands(pt['budget'])} FLOPs: {pt['variant']} (validation {_percent(pt['validation_error'])}, "
              f"test {_percent(pt['test_error'])})" for pt in _front_points(rows)]  # fmt: skip
    notes = [
        "Error-FLOPs front (`prune_front`): at each FLOPs budget the staged rule (varbnn.prune.iterative_budget, no "
        "parameter cap) exports and retrains the model; the random-initialisation control trains the same architecture "
        "from a fresh draw with the same retraining. Parameters, FLOPs and errors: means (± standard errors) over the "
        "seeds of the posterior; budget reached: the share of seeds whose rule met the budget.",
        "",
    ]
    lines = markdown_table(header, table, ["---"] * 3 + [RIGHT] * (len(header) - 3))
    return [*notes, *lines, "", "Chosen on validation (the variant with the lowest mean validation error at each budget):",
            "", *chosen]  # fmt: skip


FRONT_GOALS: tuple[tuple[int, float], ...] = ((160_000, 0.010), (120_000, 0.011))
"""Issue 30's goals for the LeNet-5 front: (FLOPs limit, test error limit), each for the model chosen on validation."""


def _front_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The front's points: per budget, the row with the lowest mean validation error (NaN never chosen) with its mean
    FLOPs, errors and share of seeds that reached the budget; increasing budgets. :func:`_front_table` lists them as
    the choice on validation, :func:`front_goal_lines` judges them."""
    points = []
    for budget in front_budgets(rows):
        p = f"front{budget}"
        valid = [r for r in rows if f"{p}_architecture" in r and not math.isnan(float(r[f"{p}_validation_error"]))]
        if not valid:
            continue
        best = min(valid, key=lambda r: r[f"{p}_validation_error"])
        points.append({
            "budget": budget, "variant": best["variant"], "architecture": best[f"{p}_architecture"],
            "flops": float(best[f"{p}_flops"]), "test_error": float(best[f"{p}_test_error"]),
            "validation_error": float(best[f"{p}_validation_error"]),
            "scratch_test_error": float(best.get(f"{p}_scratch_test_error", float("nan"))),
            "scratch_validation_error": float(best.get(f"{p}_scratch_validation_error", float("nan"))),
            "reached": float(best.get(f"{p}_reached", float("nan"))),
        })  # fmt: skip
    return points


def front_goal_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 30's verdicts for the LeNet-5 front: its two goals (:data:`FRONT_GOALS`, each judged on the point of the
    largest budget within the FLOPs limit, chosen on validation) and, per row of Table 2, whether a point of the front
    matches or beats it (mean FLOPs at most the row's, the smaller of its counted and recomputed sizes, and mean test
    error at most its error as printed), with the random-initialisation control at that point's architecture. Each
    goal also says what a pipeline would reach that takes the control as a second candidate at the goal's point (the
    posterior's architecture, weights trained anew) and keeps the one of lower mean validation error."""
    points = _front_points(rows)
    if not points:
        return []
    lines = ["Goals and Table 2 against the front (means over the seeds of the posterior; the point of each budget "
             "chosen on validation):", ""]  # fmt: skip
    for limit, error in FRONT_GOALS:
        within = [pt for pt in points if pt["budget"] <= limit]
        if not within:
            lines.append(f"- <= {100 * error:.1f}% test error at <= {_thousands(limit)} FLOPs: no budget of the front "
                         "within the limit")  # fmt: skip
            continue
        pt = within[-1]
        met = pt["flops"] <= limit and pt["test_error"] <= error and pt["reached"] == 1.0
        lines.append(
            f"- <= {100 * error:.1f}% test error at <= {_thousands(limit)} FLOPs: **{'met' if met else 'not met'}** "
            f"(the {_thousands(pt['budget'])} point: {pt['architecture']}, {pt['flops']:,.0f} FLOPs, test error "
            f"{_percent(pt['test_error'])}; random init at that architecture {_percent(pt['scratch_test_error'])})"
        )
        if not math.isnan(pt["scratch_validation_error"]):  # the pruned architecture, retrained from a fresh draw
            scratch = pt["scratch_validation_error"] < pt["validation_error"]
            test = pt["scratch_test_error"] if scratch else pt["test_error"]
            met = pt["flops"] <= limit and test <= error and pt["reached"] == 1.0
            lines.append(
                f"  - with the random-init control as a second candidate at that architecture, chosen by the lower mean "
                f"validation error ({_percent(pt['scratch_validation_error'])} random init, "
                f"{_percent(pt['validation_error'])} posterior): the {'random-init' if scratch else 'posterior'} "
                f"weights, test error {_percent(test)}: {'met' if met else 'not met'} by that pipeline (the posterior "
                "chooses the architecture, the weights are trained anew)"
            )
    table = []
    for method, arch, flops, flops_again, _, _, error in published_lenet5_sizes():
        limit = min(flops, flops_again)
        fits = [pt for pt in points if pt["flops"] <= limit]
        if not fits:
            table.append([method, arch, f"{limit:,}", f"{100 * error:.1f}%", MISSING, MISSING, MISSING, MISSING,
                          "no point of the front this small"])  # fmt: skip
            continue
        best = min(fits, key=lambda pt: pt["test_error"])
        verdict = "matched or beaten" if best["test_error"] <= error else "not matched"
        if verdict == "not matched" and best["scratch_test_error"] > error:
            verdict += " (random init at the front point's architecture misses it too)"
        table.append([method, arch, f"{limit:,}", f"{100 * error:.1f}%", _thousands(best["budget"]),
                      f"{best['flops']:,.0f}", _percent(best["test_error"]), _percent(best["scratch_test_error"]),
                      verdict])  # fmt: skip
    header = ["method", "architecture", "FLOPs (the smaller size)", "error", "front point", "its FLOPs",
              "its test error", "random init", "verdict"]  # fmt: skip
    lines += ["", *markdown_table(header, table, ["---", "---", RIGHT, RIGHT, RIGHT, RIGHT, RIGHT, RIGHT, "---"])]
    return lines


def render_markdown(result: dict[str, Any], rendered_at: str | None = None) -> str:
    """The results tables (metrics as ``mean ± sem`` over seeds; ``*_wsem``: SEM over weight draws within a seed,
    averaged over seeds) with their provenance; traces (``name@step``) in a second table; a prune config's rules in a
    table of their own, one row per rule. ``rendered_at``: the commit that re-rendered a saved result (``varbnn render``),
    named under the run's own provenance."""
    rows = result["rows"]
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if not k.endswith("_sem") and k not in keys]
    prune = _prune_keys(keys)
    front = [k for k in keys if _FRONT_KEY.match(k)]
    main = [k for k in keys if "@" not in k and k not in prune and k not in front]
    trace = [k for k in keys if "@" in k]
    lines = [
        f"# {result['name']}",
        "",
        result["config"].get("description", ""),
        "",
        *provenance_lines(result, runs_note="variant_devices" in result, run_commits=True),
        *_device_lines(result),
    ]
    if "n_train" in result:
        lines.append(f"- training examples: {result['n_train']}, optimizer steps per run: {result['steps']}")
    if rendered_at:
        lines.append(f"- page re-rendered from the saved JSON at commit `{rendered_at}` (`varbnn render`): layout only")
    lines += ["", *_table(rows, main)]
    if prune:
        lines += ["", *_prune_table(rows)]
    if front:
        lines += ["", *_front_table(rows)]
    if trace:
        lines += ["", "Traces during training (value at the given optimizer step):", "", *_table(rows, ["variant", *trace])]
    legend = [f"- `{k}`: {text}" for k, text in _LEGEND.items() if k in main or any(t.startswith(k + "@") for t in trace)]
    if legend:
        lines += ["", *legend]
    paper = PAPER_TABLES.get(str(result["name"]).removesuffix("-quick"))
    if paper:
        lines += ["", *paper]
    if front and str(result["name"]).removesuffix("-quick") == "lenet5-front":
        lines += ["", *front_goal_lines(rows)]
    if str(result["name"]).startswith("uncertainty-"):
        from varbnn_lab.uncertainty import goal_lines

        lines += ["", *goal_lines(result)]
    for figure in result.get("figures", []):
        lines += ["", f"![{figure}]({figure})"]
    return "\n".join(lines) + "\n"


def _device_lines(result: Mapping[str, Any]) -> list[str]:
    """The bullet naming the devices that trained a generic runner page's runs (``variant_devices``: each device's
    variant labels), with a warning that times compare only within a device when there are several; nothing for a
    result saved before runs recorded it."""
    by_device = result.get("variant_devices")
    if not by_device:
        return []
    if len(by_device) == 1:
        return [f"- device that trained the runs: {next(iter(by_device))}"]
    parts = "; ".join(f"{device} ({', '.join(labels)})" for device, labels in by_device.items())
    return [
        f"- devices that trained the runs: {parts}. Times (`train_seconds`, `predict_seconds`) compare only between "
        "runs of one device"
    ]


_RESULT_KEYS = ("name", "rows", "config", "command", "commit", "device", "seconds")


def _render_generic_saved(path: str | Path, rendered_at: str | None = None) -> Path:
    """Rewrite the Markdown page of a saved result ``NAME.json`` of the generic runner (``varbnn reproduce NAME``) with
    the current layout, beside it as ``NAME.md``; the numbers and the run's provenance are the JSON's, and the page names
    the commit that re-rendered it (``rendered_at``, default :func:`git_commit` now). Returns the page's path."""
    path = Path(path)
    result = read_result(path)
    missing = [k for k in _RESULT_KEYS if k not in result]
    if not missing and not (isinstance(result["config"], Mapping) and "variants" in result["config"]):
        missing = ["config.variants"]
    if missing:
        raise ValueError(
            f"{path} is not a result of `varbnn reproduce` (missing {missing}): the benchmark scripts under benchmarks/ "
            "write their own pages"
        )
    page = path.with_suffix(".md")
    page.write_text(render_markdown(result, rendered_at=rendered_at or git_commit()))
    return page
