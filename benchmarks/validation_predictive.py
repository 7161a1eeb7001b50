"""Which predictive should ``fit``'s early stopping read? Weight draws (``validation_predictive="sample"``, 8 draws per
epoch) against the one-pass moment predictive (``"moments"``), judged on data neither of them saw (issue 63).

Task: the CPU form of the uncertainty benchmark (``benchmarks/uncertainty_cpu.py``): the MLP 784-200-200-10 on the
first 10,000 training images of MNIST or Fashion-MNIST, early stopping (patience 5, at most 40 epochs) on the next
5,000 (the validation split, which also fits the temperature), and a **selection split** of the 5,000 after those,
which only this study reads: the test set is not used. Families: MeanField and KTied (``bayesianize`` at their
defaults, Adam) and IVON (its (lr, hess_init) as ``uncertainty_cpu.py`` chose them on the validation split,
``benchmarks/results/uncertainty-cpu/ivon-<dataset>-mlp.json``). Each (family, seed) is trained twice, once per
validation predictive, from the same initial weights and batches.

Scores on the selection split, with the predictive a user predicts with by default (32 weight draws): NLL without and
with a temperature fitted on the validation split (``TemperatureScaled.fit(samples=32)``); and ``fit``'s seconds (the
validation passes included) and epochs.

The rule, fixed before the runs: ``"moments"`` is the better default where its mean NLL over the seeds, with and
without the temperature, is within 1% of the weight draws' for every (dataset, family), at fewer training seconds.

    .venv/bin/python benchmarks/validation_predictive.py --dataset fashion-mnist [--seeds 0 1 2] [--quick]
    .venv/bin/python benchmarks/validation_predictive.py --summarize
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import commit_of, device_name, write_result  # noqa: E402

import varbnn  # noqa: E402
from varbnn import metrics  # noqa: E402
from varbnn.calibration import TemperatureScaled  # noqa: E402
from varbnn.data import load_fashion_mnist, load_mnist  # noqa: E402
from varbnn.optim import IVON  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "validation-predictive"
LOADERS = {"mnist": load_mnist, "fashion-mnist": load_fashion_mnist}
FAMILIES = ("meanfield", "ktied", "ivon")
PREDICTIVES = ("sample", "moments")
TRAIN, VAL, SELECT = 10_000, 5_000, 5_000
PATIENCE, MAX_EPOCHS, DRAWS = 5, 40, 32
TOLERANCE = 0.01


def _net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))


def _ivon_setting(dataset: str) -> tuple[float, float | None]:
    chosen = json.loads((ROOT / "benchmarks" / "results" / "uncertainty-cpu" / f"ivon-{dataset}-mlp.json").read_text())
    return float(chosen["lr"]), chosen["hess_init"]


def _train(family: str, predictive: str, seed: int, data: dict[str, torch.Tensor], dataset: str, max_epochs: int
           ) -> tuple[nn.Module, float, list[dict[str, Any]]]:  # fmt: skip
    torch.manual_seed(seed)
    if family == "ktied":
        net = varbnn.bayesianize(_net(), varbnn.KTied())
    else:
        net = varbnn.bayesianize(_net())
    n = len(data["x_train"])
    optimizer = None
    if family == "ivon":
        lr, hess_init = _ivon_setting(dataset)
        optimizer = IVON(net, n_data=n, lr=lr, hess_init=hess_init)
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(TensorDataset(data["x_train"], data["y_train"]), batch_size=128, shuffle=True, generator=g)
    t0 = time.perf_counter()
    history = varbnn.fit(net, loader, n_data=n, epochs=max_epochs, optimizer=optimizer, progress=False,
                         validation=(data["x_val"], data["y_val"]), early_stopping=PATIENCE,
                         validation_predictive=predictive)  # fmt: skip
    return net, time.perf_counter() - t0, history


def _nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        probs = varbnn.predict(model, x, samples=DRAWS, seed=3, batch_size=2000).float().softmax(-1).mean(0).double()
    return metrics.negative_log_likelihood(probs, y)


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    done = set()
    if runs_path.exists():
        done = {(r["dataset"], r["family"], r["predictive"], r["seed"])
                for r in map(json.loads, runs_path.read_text().splitlines())}  # fmt: skip
    x, y = LOADERS[args.dataset]("train")
    limit = 1000 if args.quick else None
    cut = lambda a, b: slice(a, a + (min(b, limit) if limit else b))  # noqa: E731
    data = {
        "x_train": x[cut(0, TRAIN)], "y_train": y[cut(0, TRAIN)],
        "x_val": x[cut(TRAIN, VAL)], "y_val": y[cut(TRAIN, VAL)],
        "x_sel": x[cut(TRAIN + VAL, SELECT)], "y_sel": y[cut(TRAIN + VAL, SELECT)],
    }  # fmt: skip
    max_epochs = 2 if args.quick else MAX_EPOCHS
    for seed in args.seeds:
        for family in args.families:
            for predictive in PREDICTIVES:
                key = (args.dataset, family, predictive, seed)
                if key in done:
                    continue
                began = time.perf_counter()
                model, seconds, history = _train(family, predictive, seed, data, args.dataset, max_epochs)
                model.eval()
                calibrated = TemperatureScaled(model).fit(data["x_val"], data["y_val"], samples=DRAWS)
                record = {
                    "dataset": args.dataset, "family": family, "predictive": predictive, "seed": seed,
                    "train_seconds": seconds, "epochs": len(history), "best_epoch": history[-1].get("best_epoch"),
                    "selection_nll": _nll(model, data["x_sel"], data["y_sel"]),
                    "selection_nll_ts": _nll(calibrated, data["x_sel"], data["y_sel"]),
                    "temperature": float(calibrated.temperature),
                    "ivon": list(_ivon_setting(args.dataset)) if family == "ivon" else None,
                    "load_average": os.getloadavg()[0], "commit": commit_of(ROOT),
                    "device": device_name(torch.device("cpu")), "seconds": time.perf_counter() - began,
                    "quick": bool(args.quick),
                }  # fmt: skip
                with runs_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"{args.dataset} {family} {predictive} seed {seed}: NLL {record['selection_nll']:.4f} / TS "
                      f"{record['selection_nll_ts']:.4f}, {seconds:.1f} s, {len(history)} epochs", file=sys.stderr,
                      flush=True)  # fmt: skip


def summarize(args: argparse.Namespace) -> None:
    out = Path(args.out)
    records = [r for r in map(json.loads, (out / "runs.jsonl").read_text().splitlines()) if not r["quick"]]
    by: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["dataset"], r["family"], r["predictive"]), {})[r["seed"]] = r
    rows, verdicts = [], []
    for dataset in sorted({r["dataset"] for r in records}):
        for family in FAMILIES:
            if not all((dataset, family, p) in by for p in PREDICTIVES):
                continue
            seeds = sorted(set(by[(dataset, family, "sample")]) & set(by[(dataset, family, "moments")]))
            row: dict[str, Any] = {"dataset": dataset, "family": family, "seeds": seeds}
            for p in PREDICTIVES:
                runs = [by[(dataset, family, p)][s] for s in seeds]
                for key in ("selection_nll", "selection_nll_ts", "train_seconds", "epochs"):
                    row[f"{key}_{p}"] = statistics.mean(r[key] for r in runs)
                row[f"per_seed_nll_ts_{p}"] = [r["selection_nll_ts"] for r in runs]
            ratio = {k: row[f"{k}_moments"] / row[f"{k}_sample"] - 1 for k in ("selection_nll", "selection_nll_ts")}
            row["relative_nll"], row["relative_nll_ts"] = ratio["selection_nll"], ratio["selection_nll_ts"]
            row["time_ratio"] = row["train_seconds_moments"] / row["train_seconds_sample"]
            row["within"] = all(v <= TOLERANCE for v in ratio.values()) and row["time_ratio"] < 1
            rows.append(row)
            verdicts.append(row["within"])
    result = {
        "command": "python benchmarks/validation_predictive.py --dataset DATASET (each) && --summarize",
        "commit": ", ".join(sorted({r["commit"] for r in records})),
        "device": ", ".join(sorted({r["device"] for r in records})),
        "seconds": sum(r["seconds"] for r in records),
        "rule": f"moments within {TOLERANCE:.0%} of sample on the mean selection NLL (with and without TS) for every "
        "(dataset, family), at fewer training seconds",
        "moments_meets_rule": bool(verdicts) and all(verdicts),
        "load_average_max": max(r["load_average"] for r in records),
        "rows": rows,
    }  # fmt: skip
    table = [
        "| dataset | family | NLL sample / moments | with TS: sample / moments | change (with TS) | fit seconds "
        "sample / moments | epochs sample / moments | within the rule |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['dataset']} | {r['family']} | {r['selection_nll_sample']:.4f} / {r['selection_nll_moments']:.4f} | "
            f"{r['selection_nll_ts_sample']:.4f} / {r['selection_nll_ts_moments']:.4f} | {r['relative_nll']:+.2%} "
            f"({r['relative_nll_ts']:+.2%}) | {r['train_seconds_sample']:.1f} / {r['train_seconds_moments']:.1f} "
            f"({r['time_ratio']:.2f}x) | {r['epochs_sample']:.1f} / {r['epochs_moments']:.1f} | "
            f"{'yes' if r['within'] else 'no'} |"
        )
    notes = [
        f"{len(records)} runs; MLP 784-200-200-10, {TRAIN} training images, early stopping (patience {PATIENCE}, at most "
        f"{MAX_EPOCHS} epochs) on the next {VAL}, scores on the {SELECT} after those (the selection split; the test "
        f"set is not read); predictions with {DRAWS} weight draws",
        f"the rule, fixed before the runs: {result['rule']}; met: {'yes' if result['moments_meets_rule'] else 'no'}",
        f"1-minute load average at the end of each run: at most {result['load_average_max']:.1f} (2 cores)",
        f"seconds (all runs): {result['seconds']:.0f}",
    ]
    write_result(out, "validation-predictive", result, "Early stopping on weight draws or on the moment predictive",
                 notes, table)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(LOADERS), default="fashion-mnist")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1,000 images per split, 2 epochs")
    parser.add_argument("--summarize", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    summarize(args) if args.summarize else run(args)


if __name__ == "__main__":
    main()
