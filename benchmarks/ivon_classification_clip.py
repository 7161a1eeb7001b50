"""Is IVON's regression recipe (the mean step clipped at 0.001) harmless for classification? Validation data only.

``benchmarks/ivon_regression_recipe.py`` chose ``clip=0.001`` for IVON on the UCI protocol's validation splits; IVON's
default stayed ``clip=None`` because a default clip would also change the classification runs of
``benchmarks/uncertainty_cpu.py``, whose IVON rows were chosen on validation without a clip. This study runs that
benchmark's IVON choice (``select_ivon``: every (lr, hess_init) of ``IVON_GRID``, seed 0, early-stopped on the
validation split, the validation NLL at ``--draws`` weight draws) once per recipe below, for each of the benchmark's
three configurations, and keeps each recipe's best validation NLL. The test sets are never read.

Recipes: ``clip=None`` (no clip) and ``clip=0.001``, each passed explicitly (the study means the same whatever IVON's
default is).

Decision rule (stated before the runs): ``clip=0.001`` becomes IVON's default if, on every configuration, its best
validation NLL is at most 1% above the unclipped recipe's ("harmless"); otherwise the default stays ``None`` and the
regression recipe stays a documented option.

    .venv/bin/python benchmarks/ivon_classification_clip.py --config fashion-mnist-mlp [--quick]

Writes ``benchmarks/results/uncertainty-cpu/studies/ivon-clip-<config>.json`` per configuration (resumable: the grid
points already there at the same commit are kept) and ``ivon-clip.md`` / ``ivon-clip.json`` (the decision) over the
configurations present.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import uncertainty_cpu as bench  # noqa: E402  (puts src/ on the path)

OUT = bench.OUT / "studies"
CONFIGS = {"fashion-mnist-mlp": ("fashion-mnist", "mlp"), "mnist-mlp": ("mnist", "mlp"),
           "fashion-mnist-lenet5": ("fashion-mnist", "lenet5")}  # fmt: skip
RECIPES: dict[str, dict[str, Any]] = {"no clip": {"clip": None}, "clip 0.001": {"clip": 0.001}}
HARMLESS = 0.01
"""The largest relative increase of the best validation NLL that counts as harmless (the decision rule)."""


def _args(dataset: str, model: str, quick: bool, draws: int) -> argparse.Namespace:
    """The benchmark's settings (its defaults; ``--quick``: 2 epochs)."""
    epochs = 2 if quick else 20
    return argparse.Namespace(dataset=dataset, model=model, epochs=epochs, max_epochs=2 if quick else 40, draws=draws,
                              quick=quick)  # fmt: skip


def decide(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per configuration each recipe's best validation NLL and the relative change; the rule's verdict over the
    configurations present (``complete``: all three studied)."""
    per: dict[str, Any] = {}
    for config, result in results.items():
        best = {}
        for label in RECIPES:
            rows = [r for r in result["rows"] if r["recipe"] == label]
            if len(rows) == len(bench.IVON_GRID):
                best[label] = min(rows, key=lambda r: r["val_nll"])
        if len(best) == len(RECIPES):
            base, clipped = best["no clip"]["val_nll"], best["clip 0.001"]["val_nll"]
            per[config] = {"best": best, "relative_change": clipped / base - 1.0,
                           "harmless": clipped <= base * (1.0 + HARMLESS)}  # fmt: skip
    complete = set(per) == set(CONFIGS)
    harmful = sorted(config for config, p in per.items() if not p["harmless"])
    adopt = complete and not harmful
    # decided: every configuration studied, or one already harmful (the rule cannot adopt the clip any more)
    return {"per_config": per, "complete": complete, "harmful": harmful, "decided": complete or bool(harmful),
            "adopt_clip_default": adopt}  # fmt: skip


def render(results: dict[str, dict[str, Any]], choice: dict[str, Any]) -> str:
    lines = [
        "# IVON's regression recipe (clip 0.001) on classification validation data", "",
        "Each configuration: `benchmarks/uncertainty_cpu.py`'s IVON choice (every (lr, hess_init) of its grid, seed 0, "
        "early-stopped on the 5,000-image validation split), once per recipe; the cell is the best validation NLL over "
        f"the grid (its (lr, hess_init)). Rule: clip 0.001 becomes the default if it is at most {HARMLESS:.0%} above "
        "no clip on every configuration. The test sets are not read.", "",
        "| configuration | no clip | clip 0.001 | change | harmless | command | commit | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for config, p in choice["per_config"].items():
        r = results[config]
        cells = [f"{p['best'][lab]['val_nll']:.4f} ({p['best'][lab]['lr']}, {p['best'][lab]['hess_init']})" for lab in RECIPES]
        lines.append(f"| {config} | " + " | ".join(cells) + f" | {p['relative_change']:+.2%} | "
                     f"{'yes' if p['harmless'] else 'no'} | `{r['command']}` | {r['commit']} | "
                     f"{sum(row['seconds'] for row in r['rows']):,.0f} |")  # fmt: skip
    lines.append("")
    missing = [config for config in CONFIGS if config not in choice["per_config"]]
    if not choice["decided"]:
        lines.append("Not every configuration studied yet: no decision.")
    elif choice["adopt_clip_default"]:
        lines.append("Decision: **clip 0.001 becomes IVON's default** (harmless on every configuration).")
    else:
        lines.append(f"Decision: **the default stays clip=None**: clip 0.001 is not harmless on {', '.join(choice['harmful'])}"
                     + (f" (so {', '.join(missing)} was not needed for the decision and was stopped)" if missing else "")
                     + ".")  # fmt: skip
    for config, r in results.items():
        lines += ["", f"{config}, every grid point (validation NLL, epochs, training seconds):", "",
                  "| recipe | lr | hess_init | validation NLL | epochs | seconds |", "|---|---|---|---|---|---|"]
        lines += [f"| {row['recipe']} | {row['lr']} | {row['hess_init']} | {row['val_nll']:.4f} | {row['epochs']} | "
                  f"{row['seconds']:.1f} |" for row in r["rows"]]  # fmt: skip
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--draws", type=int, default=32, help="validation draws (the benchmark's --draws)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="2 epochs, for smoke tests")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--render", action="store_true", help="only rewrite the page and the decision from the JSONs")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("VARBNN_DATA", str(ROOT.parent / "shared" / "data"))
    dataset, model = CONFIGS[args.config]
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "-quick" if args.quick else ""
    path = args.out / f"ivon-clip-{args.config}{suffix}.json"
    commit = bench._commit()
    previous = json.loads(path.read_text()) if path.exists() else {}
    rows = [r for r in previous.get("rows", []) if r.get("commit") == commit]  # resumable at the same code only
    done = {(r["recipe"], r["lr"], r["hess_init"]) for r in rows}
    device = torch.device("cpu")
    settings = _args(dataset, model, args.quick, args.draws)
    data = {} if args.render else bench.load(dataset, 10_000, 5_000, 500 if args.quick else None)
    data = {k: v for k, v in data.items() if k not in ("x_test", "y_test", "x_ood")}  # never read here
    for label, options in RECIPES.items() if not args.render else ():
        runner = bench.Run(settings, data, device, bench.IVON_GRID[0], ivon_options=options)
        for lr, hess_init in bench.IVON_GRID:
            if (label, lr, hess_init) in done:
                continue
            t0 = time.perf_counter()
            row = {"recipe": label, "options": options, **bench.ivon_grid_point(runner, data, device, lr, hess_init, args.draws),
                   "commit": commit, "device": bench._device_name(device), "wall_seconds": time.perf_counter() - t0}  # fmt: skip
            rows.append(row)
            print(f"{args.config} {label} lr {lr} hess_init {hess_init}: val NLL {row['val_nll']:.4f} "
                  f"({row['epochs']} epochs, {row['seconds']:.1f} s)", flush=True)  # fmt: skip
            result = {"command": "python benchmarks/ivon_classification_clip.py " +
                      " ".join(sys.argv[1:] if argv is None else argv), "commit": commit, "config": args.config,
                      "recipes": RECIPES, "grid": [list(g) for g in bench.IVON_GRID], "rows": rows}  # fmt: skip
            path.write_text(json.dumps(result, indent=1) + "\n")
    results = {}
    for config in CONFIGS:
        p = args.out / f"ivon-clip-{config}{suffix}.json"
        if p.exists():
            results[config] = json.loads(p.read_text())
    choice = decide(results)
    (args.out / f"ivon-clip{suffix}.md").write_text(render(results, choice))
    page = {
        "command": "; ".join(r["command"] for r in results.values()),
        "commit": ", ".join(sorted({r["commit"] for r in results.values()})),
        "device": ", ".join(sorted({row["device"] for r in results.values() for row in r["rows"]})),
        "seconds": sum(row["seconds"] for r in results.values() for row in r["rows"]),
        **choice,
    }
    (args.out / f"ivon-clip{suffix}.json").write_text(json.dumps(page, indent=1) + "\n")
    verdict = {k: v for k, v in choice.items() if k != "per_config"}
    print(f"wrote {args.out / ('ivon-clip' + suffix + '.md')}; decision so far: {json.dumps(verdict)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
