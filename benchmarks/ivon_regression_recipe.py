"""Which IVON recipe for regression: the ``uci-learned`` IVON column's search, run per recipe, on validation data only.

The IVON column of ``uci-learned`` (the mean-field network trained by :class:`varbnn.optim.IVON` at its defaults)
diverged on 4 of 5 protein splits and scored far below the Adam-trained mean-field network on kin8nm, power and
naval; ``benchmarks/ivon_noise_trace.py`` traced the cause to IVON's unclipped mean step (the largest ``|m|`` went
from 2.19 to 528.6 in four epochs on protein). This study runs the column's search (``varbnn_lab.uci_learned``: 80% of
each standard split to train, standardised by its statistics, every prior scale of the protocol, the validation
log-likelihood at every candidate length) for each recipe below and keeps each search's best validation
log-likelihood. The test sets are never read.

Recipes: IVON's keyword arguments on top of the column's (``n_data`` and ``kl_weight`` 1), ``RECIPES``: no clip (the
defaults), and the mean step clipped element-wise at 0.1, 0.01 and 0.001 (the paper's fix for unstable steps).

Choice rule (stated before the runs): per dataset, the recipes are ranked by their best validation log-likelihood
averaged over the studied splits (a search with no finite validation score ranks last); the recipe with the best mean
rank over the datasets wins, ties going to the larger clip (the smaller change to IVON).

    .venv/bin/python benchmarks/ivon_regression_recipe.py [--splits 0] [--datasets yacht,...] [--quick]

Writes ``benchmarks/results/uci-learned/ivon-recipe.json`` and ``.md`` (``--quick``: ``ivon-recipe-quick.*``); resumable:
the searches already in the JSON are kept.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "lab"))

OUT = ROOT / "benchmarks" / "results" / "uci-learned"
RECIPES: dict[str, dict[str, Any]] = {
    "defaults (no clip)": {},
    "clip 0.1": {"clip": 0.1},
    "clip 0.01": {"clip": 0.01},
    "clip 0.001": {"clip": 0.001},
}


def search(dataset: str, split: int, options: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    """The IVON column's search on ``dataset``'s ``split`` with IVON ``options`` (``varbnn_lab.uci_learned._search``,
    the protocol's own): the validation log-likelihood at each (prior scale, length), the best of them, and the prior
    scales whose training stopped on a non-finite loss."""
    from varbnn_lab import uci_learned as U

    config = dataclasses.replace(U.quick_config() if quick else U.UCILearnedConfig(), datasets=(dataset,))
    variant = next(v for v in config.variants if v.family == U.IVON_FAMILY)
    data = U.load_uci(dataset, split, None, normalize=False)
    failed: list[float | None] = []
    start = time.perf_counter()
    scores = U._search(config, variant, dataset, split, data.x_train, data.y_train, torch.device("cpu"),
                       ivon_options=options, diverged=failed)  # fmt: skip
    finite = [s for s in scores if math.isfinite(s["val_ll"])]
    best = max(finite, key=lambda s: s["val_ll"]) if finite else None
    return {
        "dataset": dataset, "split": split, "options": options, "scores": scores, "failed_scales": failed,
        "best_val_ll": best["val_ll"] if best else None, "best": best, "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip


def choose(rows: list[dict[str, Any]], recipes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The choice rule (module docstring) applied to the searches ``rows`` (each with its ``recipe`` label): per dataset
    the recipes' mean best validation log-likelihood over the splits and their ranks (1 best), the mean rank per
    recipe, and the winner."""
    datasets = sorted({r["dataset"] for r in rows})
    per_dataset: dict[str, dict[str, float | None]] = {}
    ranks: dict[str, list[float]] = {label: [] for label in recipes}
    for dataset in datasets:
        means: dict[str, float | None] = {}
        for label in recipes:
            values = [r["best_val_ll"] for r in rows if r["dataset"] == dataset and r["recipe"] == label]
            means[label] = None if not values or any(v is None for v in values) else sum(values) / len(values)
        per_dataset[dataset] = means
        value = {lab: -math.inf if means[lab] is None else means[lab] for lab in recipes}
        for label in recipes:  # 1 best; tied recipes share the mean of their places
            better = sum(value[other] > value[label] for other in recipes)
            tied = sum(value[other] == value[label] for other in recipes)
            ranks[label].append(better + (tied + 1) / 2)
    mean_rank = {label: (sum(r) / len(r) if r else math.inf) for label, r in ranks.items()}
    clip = {label: recipes[label].get("clip") or math.inf for label in recipes}  # no clip: the largest
    winner = min(recipes, key=lambda lab: (mean_rank[lab], -clip[lab]))
    return {"per_dataset": per_dataset, "mean_rank": mean_rank, "winner": winner, "winner_options": recipes[winner]}


def render(result: dict[str, Any]) -> str:
    """The Markdown page of ``result``: per dataset the recipes' mean best validation log-likelihood, the mean rank, the
    winner, and the provenance."""
    labels = list(result["recipes"])
    choice = result["choice"]
    lines = [
        "# IVON for regression: which recipe, on the uci-learned validation splits", "",
        f"Command: `{result['command']}` · commit {result['commit']} · {result['device']} · "
        f"{result['seconds']:,.0f} s of searches.", "",
        "Each cell: the best validation log-likelihood (per point, original units) of the IVON column's search, mean over "
        f"splits {', '.join(map(str, result['splits']))}; `diverged`: no finite validation score. The test sets are not "
        "read.", "",
        "| dataset | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|",
    ]  # fmt: skip
    for dataset, means in choice["per_dataset"].items():
        cells = ["diverged" if means[lab] is None else f"{means[lab]:.3f}" for lab in labels]
        lines.append(f"| {dataset} | " + " | ".join(cells) + " |")
    lines.append("| **mean rank** | " + " | ".join(f"{choice['mean_rank'][lab]:.2f}" for lab in labels) + " |")
    lines += ["", f"Chosen by the rule (best mean rank; ties to the larger clip): **{choice['winner']}** "
              f"(`{json.dumps(choice['winner_options'])}`).", ""]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from varbnn_lab.regression import SMALLEST_FIRST

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, nargs="+", default=[0])
    parser.add_argument("--datasets", default=",".join(SMALLEST_FIRST), help="comma-separated UCI sets (default: all nine)")
    parser.add_argument("--quick", action="store_true", help="the protocol's --quick lengths (2 and 4 epochs)")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the JSON (default: the committed uci-learned one)")
    args = parser.parse_args(argv)
    datasets = [d for d in args.datasets.split(",") if d]
    unknown = sorted(set(datasets) - set(SMALLEST_FIRST))
    if unknown:
        parser.error(f"--datasets: unknown {unknown}; allowed: {list(SMALLEST_FIRST)}")
    torch.set_num_threads(1)
    name = "ivon-recipe-quick" if args.quick else "ivon-recipe"
    path = args.out / f"{name}.json"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "lab", "benchmarks/ivon_regression_recipe.py"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()  # fmt: skip
    commit += "+dirty" if dirty else ""
    previous = json.loads(path.read_text()) if path.exists() else {}
    rows = [r for r in previous.get("rows", []) if r.get("commit") == commit]  # resumable at the same code only
    done = {(r["dataset"], r["split"], r["recipe"]) for r in rows}
    for split in args.splits:
        for dataset in datasets:
            for label, options in RECIPES.items():
                if (dataset, split, label) in done:
                    continue
                row = {"recipe": label, "commit": commit, **search(dataset, split, options, quick=args.quick)}
                rows.append(row)
                print(f"{dataset} split {split} {label}: best val LL {row['best_val_ll']} ({row['seconds']} s)", flush=True)
                result = {
                    "command": "python benchmarks/ivon_regression_recipe.py " + " ".join(sys.argv[1:] if argv is None else argv),
                    "commit": commit, "device": "cpu, 1 thread", "splits": args.splits, "recipes": RECIPES,
                    "seconds": sum(r["seconds"] for r in rows), "rows": rows, "choice": choose(rows, RECIPES),
                }  # fmt: skip
                path.write_text(json.dumps(result, indent=1) + "\n")  # after every search: resumable
                path.with_suffix(".md").write_text(render(result))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
