"""Regression defaults (issue 63): which KL weight should ``fit(kl_weight=None)`` use with a Gaussian likelihood?

The classification defaults (``default_kl_weight``: MeanField 0.1, KTied 0.03, ...) were chosen on classification
validation data only (``benchmarks/results/defaults/``); an outside user found MeanField's 0.1 covering 78% of the
test points with nominal 95% intervals on diabetes (RMSE 68.4), against 98% and 56.5 at kl_weight 1 (issue 63). This
study chooses them on regression validation data, along
the user's path, and reports the test scores (interval coverage included) of every candidate beside the choice. Nothing
is tuned on the test split.

Tasks: scikit-learn's bundled diabetes set (5 random 90/10 train/test splits, split ``i`` seeded by ``i``) and the
UCI sets of Hernandez-Lobato & Adams (2015) via :func:`varbnn.data.load_uci` (their splits 0-4): boston, concrete,
energy, yacht, wine-red. Inputs and targets are standardised with the training split's statistics; the last 20% of a
permutation of the training split (seeded by the split index) is the validation set, the rest is trained on.

Model: an MLP in-50-ReLU-1 through ``varbnn.bayesianize(net, family)`` for MeanField() and KTied() at their defaults,
``likelihood=Gaussian()`` (noise std learned), Adam at fit's default learning rate, batch 32, ``validation=(x_val,
y_val), early_stopping=20`` (best epoch restored), at most ``--max-epochs`` (400) epochs. Grid: ``kl_weight`` in
(0.01, 0.03, 0.1, 0.3, 1). A least-squares linear regression (noise std from its training residuals) is scored on the
same splits as a reference (family ``linear``).

Scores per run: the validation NLL of the restored model (64 draws, nats per point, original units) and fit's own
``val_nll`` at the best epoch (fit's default validation predictive, the one-pass moment predictive for these
MeanField and KTied networks; standardised units); on the test split: NLL (per point, original units; the
exact Monte Carlo mixture ``log mean_s N(y; f_s, sigma^2)``), RMSE of the predictive mean, the coverage and mean width
of the central 95% predictive interval with EXACT quantiles of the 64-draw mixture ``mean_s N(f_s, sigma^2)`` (by
bisection; the coverage of the Gaussian approximation with the mixture's mean and variance is recorded too), the
learned noise std (original units), epochs, best epoch, whether early stopping ended the run, seconds. Draws:
``varbnn.predict(model, x, samples=64, seed=..., predictive="sample")``.

Each finished (task, split, family, kl_weight) is appended to ``OUT/runs.jsonl`` at once (a killed run resumes);
``--summarize`` writes ``OUT/summary.json`` / ``summary.md`` / ``coverage.png``.

    .venv/bin/python benchmarks/regression_defaults.py [--splits 0 1 2 3 4] [--quick]
    .venv/bin/python benchmarks/regression_defaults.py --summarize
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import commit_of, device_name, write_result  # noqa: E402

import varbnn  # noqa: E402
from varbnn import metrics  # noqa: E402
from varbnn.data import load_uci  # noqa: E402
from varbnn.likelihoods import Gaussian  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "regression-defaults"
UCI = {"boston": "bostonHousing", "concrete": "concrete", "energy": "energy", "yacht": "yacht", "wine-red": "wine-quality-red"}
TASKS = ("diabetes", *UCI)
FAMILIES = ("meanfield", "ktied")
KL_WEIGHTS = (0.01, 0.03, 0.1, 0.3, 1.0)
BATCH = 32
PATIENCE = 20
HIDDEN = 50
DRAWS = 64
VAL_FRACTION = 0.2
LEVEL = 0.95


def _commit() -> str:
    return commit_of(ROOT)


def _device_name() -> str:
    return device_name(torch.device("cpu"))


# -- data ------------------------------------------------------------------------------------------------------------


def load_task(task: str, split: int) -> dict[str, Any]:
    """Standardised train / validation / test tensors of ``task``'s split ``split`` and the target's scale."""
    if task == "diabetes":
        from sklearn.datasets import load_diabetes

        x_all, y_all = load_diabetes(return_X_y=True)
        perm = np.random.default_rng(split).permutation(len(y_all))
        n_test = round(0.1 * len(y_all))
        x_tr, y_tr = x_all[perm[n_test:]], y_all[perm[n_test:]]
        x_te, y_te = x_all[perm[:n_test]], y_all[perm[:n_test]]
    else:
        raw = load_uci(UCI[task], split, normalize=False, download=False)
        x_tr, y_tr = raw.x_train.double().numpy(), raw.y_train.double().numpy()
        x_te, y_te = raw.x_test.double().numpy(), raw.y_test.double().numpy()
    x_mean, x_std = x_tr.mean(0), x_tr.std(0)
    x_std[x_std == 0] = 1.0
    y_mean, y_std = float(y_tr.mean()), float(y_tr.std())
    order = torch.randperm(len(y_tr), generator=torch.Generator().manual_seed(split)).numpy()
    n_val = round(VAL_FRACTION * len(y_tr))
    fit_idx, val_idx = order[: len(y_tr) - n_val], order[len(y_tr) - n_val :]

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.float32)

    xs = lambda a: t((a - x_mean) / x_std)  # noqa: E731
    ys = lambda a: t((a - y_mean) / y_std)  # noqa: E731
    return {
        "x_train": xs(x_tr[fit_idx]), "y_train": ys(y_tr[fit_idx]),
        "x_val": xs(x_tr[val_idx]), "y_val": ys(y_tr[val_idx]),
        "x_test": xs(x_te), "y_test": ys(y_te), "y_test_raw": torch.as_tensor(y_te, dtype=torch.float64),
        "y_val_raw": torch.as_tensor(y_tr[val_idx], dtype=torch.float64),
        "y_mean": y_mean, "y_std": y_std,
    }  # fmt: skip


# -- scores ----------------------------------------------------------------------------------------------------------


def mixture_interval(means: torch.Tensor, noise: float, level: float = LEVEL) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact central ``level`` interval of the equal-weight mixture ``mean_s N(means[s, n], noise^2)`` per point
    ``n`` (``means [S, N]``, float64): both quantiles by 100 bisection steps on the mixture's CDF."""
    normal = torch.distributions.Normal(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64))

    def quantile(p: float) -> torch.Tensor:
        lo = means.min(0).values - 10 * noise
        hi = means.max(0).values + 10 * noise
        for _ in range(100):
            mid = (lo + hi) / 2
            below = normal.cdf((mid.unsqueeze(0) - means) / noise).mean(0) < p
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        return (lo + hi) / 2

    return quantile((1 - level) / 2), quantile((1 + level) / 2)


def predictive_scores(means: torch.Tensor, noise: float, y: torch.Tensor) -> dict[str, float]:
    """Test scores (original units) of the mixture ``mean_s N(means[s], noise^2)``, ``means [S, N]`` float64."""
    lo, hi = mixture_interval(means, noise)
    mean = means.mean(0)
    std = (means.var(0, unbiased=False) + noise**2).sqrt()
    z = statistics.NormalDist().inv_cdf((1 + LEVEL) / 2)
    return {
        "nll": -metrics.gaussian_log_likelihood(means, y, noise),
        "rmse": metrics.rmse(mean, y),
        "coverage": float(((y >= lo) & (y <= hi)).double().mean()),
        "width": float((hi - lo).mean()),
        "coverage_gaussian": float(((y - mean).abs() <= z * std).double().mean()),
        "width_gaussian": float((2 * z * std).mean()),
        "predictive_std": float(std.mean()),
    }


# -- runs ------------------------------------------------------------------------------------------------------------


def _family(name: str) -> varbnn.families.VariationalFamily:
    return {"meanfield": varbnn.MeanField, "ktied": varbnn.KTied}[name]()


def train_and_score(
    data: dict[str, Any], family: str, kl_weight: float, split: int, max_epochs: int, patience: int | None = PATIENCE
) -> dict[str, Any]:
    """One fit of ``family`` at ``kl_weight`` (early-stopped with ``patience``; ``None``: all ``max_epochs``, the
    validation NLL still recorded every epoch); its validation and test scores (original units)."""
    torch.manual_seed(1000 + split)  # the same initial network for every kl_weight of a split (common random numbers)
    d_in = data["x_train"].shape[1]
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(d_in, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)), _family(family))
    likelihood = Gaussian()
    loader = DataLoader(TensorDataset(data["x_train"], data["y_train"]), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(split))  # fmt: skip
    t0 = time.perf_counter()
    history = varbnn.fit(model, loader, n_data=len(data["x_train"]), epochs=max_epochs, likelihood=likelihood,
                         kl_weight=kl_weight, validation=(data["x_val"], data["y_val"]), early_stopping=patience,
                         progress=False)  # fmt: skip
    fit_seconds = time.perf_counter() - t0
    best_epoch = int(history[-1].get("best_epoch", len(history)))
    y_mean, y_std = data["y_mean"], data["y_std"]
    noise = float(likelihood.noise_std.detach()) * y_std
    model.eval()
    with torch.no_grad():
        val = varbnn.predict(model, data["x_val"], samples=DRAWS, seed=3, predictive="sample")
        test = varbnn.predict(model, data["x_test"], samples=DRAWS, seed=1, predictive="sample")
    val_means = val.double().squeeze(-1) * y_std + y_mean
    test_means = test.double().squeeze(-1) * y_std + y_mean
    scores = predictive_scores(test_means, noise, data["y_test_raw"])
    return {
        "val_nll": -metrics.gaussian_log_likelihood(val_means, data["y_val_raw"], noise),
        "val_nll_fit": float(history[best_epoch - 1]["val_nll"]),
        **{f"test_{k}": v for k, v in scores.items()},
        "noise_std": noise,
        "epochs": len(history), "best_epoch": best_epoch,
        "stopped_early": bool(history[-1].get("stopped_early", 0.0)),
        "fit_seconds": fit_seconds,
    }  # fmt: skip


def linear_reference(data: dict[str, Any]) -> dict[str, Any]:
    """Least squares on the training part (the validation part held out, as for the networks), its noise std the
    training residuals' (``/ (n - p - 1)``); the predictive ``N(x b, sigma^2)`` scored like a one-draw mixture."""

    def design(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)

    a, y = design(data["x_train"]), data["y_train"].double()
    coef = torch.linalg.lstsq(a, y.unsqueeze(1)).solution.squeeze(1)
    dof = max(len(y) - a.shape[1], 1)
    noise = float(((a @ coef - y).square().sum() / dof).sqrt()) * data["y_std"]
    scale = lambda x: (design(x) @ coef * data["y_std"] + data["y_mean"]).unsqueeze(0)  # noqa: E731
    scores = predictive_scores(scale(data["x_test"]), noise, data["y_test_raw"])
    return {"val_nll": -metrics.gaussian_log_likelihood(scale(data["x_val"]), data["y_val_raw"], noise),
            **{f"test_{k}": v for k, v in scores.items()}, "noise_std": noise}  # fmt: skip


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    done = set()
    if runs_path.exists():
        for line in runs_path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["task"], r["split"], r["family"], r["kl_weight"], r["quick"], r.get("patience", PATIENCE)))
    device = _device_name()
    for split in args.splits:  # splits outermost: a cut-short study still has whole splits of every task
        for task in args.tasks:
            data = None
            for family, kl_weight in [("linear", None)] + [(f, b) for f in args.families for b in args.kl_weights]:
                key = (task, split, family, kl_weight, bool(args.quick), args.patience)
                if key in done:
                    continue
                if data is None:
                    data = load_task(task, split)
                t0 = time.perf_counter()
                if family == "linear":
                    scores = linear_reference(data)
                else:
                    scores = train_and_score(data, family, kl_weight, split, args.max_epochs, args.patience)
                record = {
                    "task": task, "split": split, "family": family, "kl_weight": kl_weight,
                    "n_train": len(data["x_train"]), "n_val": len(data["x_val"]), "n_test": len(data["x_test"]),
                    "max_epochs": args.max_epochs, "patience": args.patience, **scores,
                    "load_average": os.getloadavg()[0], "commit": _commit(), "device": device,
                    "seconds": time.perf_counter() - t0, "quick": bool(args.quick),
                }  # fmt: skip
                with runs_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"{task} split {split} {family} beta {kl_weight}: val NLL {scores['val_nll']:.3f} test NLL "
                      f"{scores['test_nll']:.3f} RMSE {scores['test_rmse']:.3f} coverage {scores['test_coverage']:.3f} "
                      f"epochs {scores.get('epochs', '-')} {record['seconds']:.1f}s", file=sys.stderr, flush=True)  # fmt: skip


# -- the summary -----------------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float:
    return float(statistics.mean(values)) if values else math.nan


def _rank(values: list[float]) -> list[float]:
    """Ranks (1 = lowest), ties sharing the mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def summarize(args: argparse.Namespace) -> None:
    out = Path(args.out)
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    records = [r for r in records if r["quick"] == bool(args.quick) and r.get("patience", PATIENCE) == args.patience]
    if not records:
        raise SystemExit(f"no runs in {out / 'runs.jsonl'}")
    tasks = [t for t in TASKS if any(r["task"] == t for r in records)]
    families = [f for f in FAMILIES if any(r["family"] == f for r in records)]
    betas = sorted({r["kl_weight"] for r in records if r["kl_weight"] is not None})
    cell: dict[tuple[str, int, str, float | None], dict[str, Any]] = {
        (r["task"], r["split"], r["family"], r["kl_weight"]): r for r in records
    }
    # complete (task, split) groups only: every family x kl_weight present
    splits = {t: sorted({r["split"] for r in records if r["task"] == t
                         and all((t, r["split"], f, b) in cell for f in families for b in betas)}) for t in tasks}  # fmt: skip
    n_train = {t: _mean([cell[(t, s, families[0], betas[0])]["n_train"] for s in splits[t]]) for t in tasks}

    # per (task, split, family): validation regret and rank of each kl_weight (and test NLL regret, for reading only)
    regret: dict[tuple[str, str, float], list[float]] = {}
    rank: dict[tuple[str, str, float], list[float]] = {}
    test_regret: dict[tuple[str, str, float], list[float]] = {}
    for t in tasks:
        for s in splits[t]:
            for f in families:
                vals = [cell[(t, s, f, b)]["val_nll"] for b in betas]
                tests = [cell[(t, s, f, b)]["test_nll"] for b in betas]
                for b, v, r, te in zip(betas, vals, _rank(vals), tests, strict=True):
                    regret.setdefault((t, f, b), []).append(v - min(vals))
                    rank.setdefault((t, f, b), []).append(r)
                    test_regret.setdefault((t, f, b), []).append(te - min(tests))

    def stat(t: str, f: str, b: float | None, key: str) -> float:
        return _mean([cell[(t, s, f, b)][key] for s in splits[t]])

    rows = []
    choice: dict[str, float] = {}
    choice_per_task: dict[str, dict[str, float]] = {}
    for f in families:
        for b in betas:
            row = {
                "family": f, "kl_weight": b,
                "val_regret": _mean([_mean(regret[(t, f, b)]) for t in tasks]),
                "val_rank": _mean([_mean(rank[(t, f, b)]) for t in tasks]),
                "test_regret": _mean([_mean(test_regret[(t, f, b)]) for t in tasks]),
                "test_coverage": _mean([stat(t, f, b, "test_coverage") for t in tasks]),
                "test_coverage_gaussian": _mean([stat(t, f, b, "test_coverage_gaussian") for t in tasks]),
                "rmse_vs_linear": _mean([stat(t, f, b, "test_rmse") / stat(t, "linear", None, "test_rmse") for t in tasks]),
                "noise_vs_rmse": _mean([stat(t, f, b, "noise_std") / stat(t, f, b, "test_rmse") for t in tasks]),
                "epochs": _mean([stat(t, f, b, "epochs") for t in tasks]),
                "stopped_early": _mean([stat(t, f, b, "stopped_early") for t in tasks]),
            }  # fmt: skip
            rows.append(row)
        mine = [r for r in rows if r["family"] == f]
        choice[f] = min(mine, key=lambda r: (r["val_regret"], r["val_rank"]))["kl_weight"]
        choice_per_task[f] = {t: min(betas, key=lambda b, t=t: (_mean(regret[(t, f, b)]), _mean(rank[(t, f, b)])))
                              for t in tasks}  # fmt: skip

    per_task = {}
    for t in tasks:
        linear = {k: stat(t, "linear", None, k) for k in ("test_nll", "test_rmse", "test_coverage")}
        entry: dict[str, Any] = {"n_train": n_train[t], "splits": splits[t], "linear": linear}
        for f in families:
            entry[f] = {
                "chosen": choice_per_task[f][t],
                "by_kl_weight": {str(b): {k: stat(t, f, b, k) for k in (
                    "val_nll", "test_nll", "test_rmse", "test_coverage", "test_width", "test_coverage_gaussian",
                    "noise_std", "epochs", "best_epoch", "stopped_early")} for b in betas},
            }  # fmt: skip
        per_task[t] = entry

    # does the per-task choice follow the data size?  Spearman correlation of n_train and the chosen kl_weight
    def spearman(xs: list[float], ys: list[float]) -> float:
        rx, ry = _rank(xs), _rank(ys)
        if len(set(rx)) < 2 or len(set(ry)) < 2:
            return math.nan
        return float(np.corrcoef(rx, ry)[0, 1])

    n_dependence = {f: spearman([n_train[t] for t in tasks], [choice_per_task[f][t] for t in tasks]) for f in families}

    # the choice against each other kl_weight, paired on (task, split): mean validation NLL difference, its standard
    # error over the pairs, and the pairs where the choice is lower
    paired: dict[str, dict[str, dict[str, float]]] = {}
    for f in families:
        paired[f] = {}
        for b in betas:
            if b == choice[f]:
                continue
            diffs = [cell[(t, s, f, choice[f])]["val_nll"] - cell[(t, s, f, b)]["val_nll"] for t in tasks for s in splits[t]]
            mean, se = metrics.mean_and_standard_error(diffs)
            paired[f][str(b)] = {"mean": mean, "se": se, "lower": sum(d < 0 for d in diffs), "pairs": len(diffs)}

    # a data-size rule, beta = min(1, n_train / c), read at the log-nearest grid value: its mean validation regret
    def nearest(x: float) -> float:
        return min(betas, key=lambda b: abs(math.log(b) - math.log(x)))

    n_rules = {
        f: {str(c): _mean([_mean([cell[(t, s, f, nearest(min(1.0, cell[(t, s, f, betas[0])]["n_train"] / c)))]["val_nll"]
                                  - min(cell[(t, s, f, b)]["val_nll"] for b in betas) for s in splits[t]]) for t in tasks])
            for c in (1_000, 3_000, 10_000, 30_000)}
        for f in families
    }  # fmt: skip
    runs = [r for r in records if r["family"] != "linear"]
    stopped = sum(bool(r["stopped_early"]) for r in runs)
    commits = sorted({r["commit"] for r in records})
    devices = sorted({r["device"] for r in records})
    all_splits = sorted({s for t in tasks for s in splits[t]})
    max_epochs = sorted({r["max_epochs"] for r in records})
    result = {
        "command": f"python benchmarks/regression_defaults.py --splits {' '.join(map(str, all_splits))}"
        + (" --quick" if args.quick else "")
        + ("" if args.patience else " --no-early-stopping")
        + ("" if set(families) == set(FAMILIES) else f" --families {' '.join(families)}"),
        "commit": ", ".join(commits),
        "summary_commit": _commit(),
        "device": ", ".join(devices),
        "seconds": sum(r["seconds"] for r in records),
        "load_average_max": max(r["load_average"] for r in records),
        "tasks": tasks, "families": families, "kl_weights": betas, "max_epochs": max_epochs,
        "selection_rule": "per family, the kl_weight with the lowest validation-NLL regret (nats per point: its "
        "validation NLL minus the lowest of the grid on the same task, split and family), averaged over splits, then "
        "over tasks (each task weighs the same); ties broken by the mean rank",
        "choice": choice, "choice_per_task": choice_per_task, "n_train": n_train,
        "spearman_n_train_vs_choice": n_dependence,
        "early_stopped_runs": stopped, "runs": len(runs),
        "rows": rows, "per_task": per_task, "paired_validation": paired, "n_rule_validation_regret": n_rules,
    }  # fmt: skip
    table = [
        "## Selection (validation only) and what it gives on the test splits (means over tasks)",
        "",
        "| family | kl_weight | val NLL regret (nats) | val rank | test NLL regret (nats) | 95% coverage (exact) | "
        "coverage (Gaussian approx.) | RMSE / linear's | noise std / test RMSE | epochs | early-stopped |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        bold = "**" if r["kl_weight"] == choice[r["family"]] else ""
        table.append(
            f"| {r['family']} | {bold}{r['kl_weight']:g}{bold} | {r['val_regret']:.3f} | {r['val_rank']:.2f} | "
            f"{r['test_regret']:.3f} | {r['test_coverage']:.3f} | {r['test_coverage_gaussian']:.3f} | "
            f"{r['rmse_vs_linear']:.3f} | {r['noise_vs_rmse']:.3f} | {r['epochs']:.0f} | {r['stopped_early']:.2f} |"
        )
    table += ["", "## Choice per task against the training-set size (n_train: the part trained on)", "",
              "| task | n_train | " + " | ".join(f"{f} choice" for f in families) + " |",
              "|---|---|" + "---|" * len(families)]  # fmt: skip
    for t in sorted(tasks, key=lambda t: n_train[t]):
        table.append(f"| {t} | {n_train[t]:.0f} | " + " | ".join(f"{choice_per_task[f][t]:g}" for f in families) + " |")
    table += ["", "Spearman correlation of n_train and the chosen kl_weight: "
              + ", ".join(f"{f} {v:.2f}" for f, v in n_dependence.items()), ""]  # fmt: skip
    table += ["Validation NLL regret (nats) per task, mean over splits:", "",
              "| task | n_train | family | " + " | ".join(f"{b:g}" for b in betas) + " |",
              "|---|---|---|" + "---|" * len(betas)]  # fmt: skip
    for t in sorted(tasks, key=lambda t: n_train[t]):
        for f in families:
            table.append(
                f"| {t} | {n_train[t]:.0f} | {f} | " + " | ".join(f"{_mean(regret[(t, f, b)]):.3f}" for b in betas) + " |"
            )
    table += ["", "A data-size rule beta = min(1, n_train / c) at the log-nearest grid value, its mean validation regret "
              "(the constant choice's is in the first table): "
              + "; ".join(f"{f}: " + ", ".join(f"c={int(c):,} {v:.3f}" for c, v in n_rules[f].items())
                          for f in families), ""]  # fmt: skip
    table += [
        "The choice against each other kl_weight, paired on (task, split): validation NLL of the choice minus the "
        "other's (nats per point, mean ± standard error) and the pairs where the choice is lower:",
        "",
    ]
    for f in families:
        table.append(f"- {f} {choice[f]:g} vs " + ", ".join(
            f"{b}: {v['mean']:+.4f} ± {v['se']:.4f} ({v['lower']}/{v['pairs']})" for b, v in paired[f].items()))  # fmt: skip
    table.append("")
    table += ["## Per task: the classification default against the validation choice (test split, original units)", ""]
    table += ["| task | family | kl_weight | test RMSE | test NLL | 95% coverage | interval width | noise std |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in tasks:
        lin = per_task[t]["linear"]
        table.append(f"| {t} | linear regression | - | {lin['test_rmse']:.3f} | {lin['test_nll']:.3f} | "
                     f"{lin['test_coverage']:.3f} | - | - |")  # fmt: skip
        for f in families:
            default = float(type(_family(f)).default_kl_weight)
            for label, b in ((f"{default:g} (classification default)", default), (f"{choice_per_task[f][t]:g} (chosen)",
                                                                              choice_per_task[f][t])):  # fmt: skip
                if str(b) not in per_task[t][f]["by_kl_weight"]:
                    continue
                s = per_task[t][f]["by_kl_weight"][str(b)]
                table.append(f"| {t} | {f} | {label} | {s['test_rmse']:.3f} | {s['test_nll']:.3f} | "
                             f"{s['test_coverage']:.3f} | {s['test_width']:.3f} | {s['noise_std']:.3f} |")  # fmt: skip
    table += ["", "## Every cell (means over splits)", "",
              "| task | family | kl_weight | val NLL | test NLL | test RMSE | coverage | width | noise std | epochs | "
              "best epoch | early-stopped |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in tasks:
        for f in families:
            for b in betas:
                s = per_task[t][f]["by_kl_weight"][str(b)]
                table.append(f"| {t} | {f} | {b:g} | {s['val_nll']:.3f} | {s['test_nll']:.3f} | {s['test_rmse']:.3f} | "
                             f"{s['test_coverage']:.3f} | {s['test_width']:.3f} | {s['noise_std']:.3f} | "
                             f"{s['epochs']:.0f} | {s['best_epoch']:.0f} | {s['stopped_early']:.2f} |")  # fmt: skip
    notes = [
        f"tasks {', '.join(f'{t} (splits {splits[t]})' for t in tasks)}; {len(runs)} network runs, "
        f"max epochs {max_epochs}, "
        + (f"early stopping (patience {args.patience}) ended {stopped} of them" if args.patience else "no early stopping"),
        f"selection rule: {result['selection_rule']}",
        "choice: " + ", ".join(f"{f} kl_weight {choice[f]:g}" for f in families),
        f"intervals: the central {LEVEL:.0%} interval of the {DRAWS}-draw predictive mixture mean_s N(f_s, sigma^2), "
        "exact quantiles (bisection); 'Gaussian approx.' uses the mixture's mean and variance",
        f"1-minute load average at the end of each run: at most {result['load_average_max']:.1f} (2 shared cores)",
        f"seconds (all runs): {result['seconds']:.0f}",
    ]
    suffix = ("-quick" if args.quick else "") + ("" if args.patience else "-no-early-stopping")
    stem = f"summary{suffix}"
    write_result(out, stem, result, "Regression defaults: the KL weight chosen on regression validation data",
                 notes, table)  # fmt: skip
    _figure(out / f"coverage{suffix}.png", tasks, families, betas, per_task)


def _figure(path: Path, tasks: list[str], families: list[str], betas: list[float], per_task: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 4), sharey=True, squeeze=False)
    for ax, f in zip(axes[0], families, strict=True):
        for t in tasks:
            ax.plot(betas, [per_task[t][f]["by_kl_weight"][str(b)]["test_coverage"] for b in betas], marker="o",
                    label=f"{t} (n={per_task[t]['n_train']:.0f})")  # fmt: skip
        ax.axhline(LEVEL, color="k", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("kl_weight")
        ax.set_title(f"{f}: test coverage of the {LEVEL:.0%} interval")
    axes[0][0].set_ylabel("coverage")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--kl-weights", type=float, nargs="+", default=list(KL_WEIGHTS))
    parser.add_argument("--max-epochs", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument(
        "--no-early-stopping",
        dest="patience",
        action="store_const",
        const=None,
        default=PATIENCE,
        help="train all --max-epochs epochs (the validation NLL is still recorded; results 'patience None')",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: split 0, 3 epochs (records marked quick)")
    parser.add_argument("--summarize", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.splits, args.max_epochs = [0], 3
    if args.summarize:
        summarize(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
