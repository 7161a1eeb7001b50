"""The single-pass moment predictive (``varbnn.moments.MomentPredictive``) against Monte Carlo prediction (issue 63,
goal (d): the default predictive at <= 10x one plain forward pass; the fewest draws within 1% of 64 draws' validation
NLL; a single-pass predictive by moment propagation, Wu et al. 2019, where it is accurate).

The task and the training are ``benchmarks/uncertainty_cpu.py``'s (10,000 training images, 5,000 validation, the
test set, OOD = the other dataset; MLP 784-200-200-10 or LeNet-5; every method early-stopped on the validation split;
IVON's (lr, hess_init) read from that benchmark's validation choice in ``benchmarks/results/uncertainty-cpu``). For
each trained posterior (MeanField, KTied, IVON's MeanField) it scores two predictives of the same network:

* ``mc``: ``varbnn.predict(net, x, samples=--draws)``: ``--draws`` (32) network passes;
* ``moments``: ``varbnn.predict(MomentPredictive(net), x, samples=--draws)``: one moment-propagation pass, then
  ``--draws`` draws of the logits from the propagated Gaussian;

each also with a temperature fitted on the validation split to that predictive (``TemperatureScaled``). Recorded per
(dataset, model, method, seed): test accuracy / NLL / ECE / OOD AUROC (entropy) of both, validation NLL of the
moment predictive against the 64-draw Monte Carlo NLL (the issue's reference), and predict seconds of the test + OOD
sets as multiples of one plain forward pass over them. Runs append to ``OUT/runs.jsonl`` (resumable);
``--summarize`` writes ``OUT/summary.json`` / ``summary.md``.

    .venv/bin/python benchmarks/moment_predictive.py --dataset fashion-mnist --model mlp [--seeds 0 1 2] [--quick]
    .venv/bin/python benchmarks/moment_predictive.py --summarize
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import uncertainty_cpu as ucpu  # noqa: E402
from report import write_result  # noqa: E402

import varbnn  # noqa: E402
from varbnn import metrics  # noqa: E402
from varbnn.calibration import TemperatureScaled  # noqa: E402
from varbnn.moments import MomentPredictive  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "moment-predictive"
METHODS = ("meanfield-es", "ktied-es", "ivon-es")
REFERENCE_DRAWS = 64


def _timed(model: nn.Module, x: torch.Tensor, samples: int, seed: int) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    out = varbnn.predict(model, x, samples=samples, seed=seed, batch_size=2000).float()
    return out, time.perf_counter() - t0


def _scores(test: torch.Tensor, ood: torch.Tensor, y_test: torch.Tensor) -> dict[str, float]:
    probs, ood_probs = test.softmax(-1).mean(0).double(), ood.softmax(-1).mean(0).double()
    entropy = lambda p: -(p * p.clamp_min(1e-300).log()).sum(-1)  # noqa: E731
    labels = torch.cat([torch.zeros(len(probs)), torch.ones(len(ood_probs))])
    return {
        "accuracy": metrics.accuracy(probs, y_test),
        "nll": metrics.negative_log_likelihood(probs, y_test),
        "ece": metrics.expected_calibration_error(probs, y_test),
        "ood_auroc_entropy": metrics.auroc(torch.cat([entropy(probs), entropy(ood_probs)]), labels),
    }


def evaluate_pair(net: nn.Module, data: dict[str, torch.Tensor], draws: int, device: torch.device) -> dict[str, Any]:
    """Both predictives of ``net`` (and each with its own validation temperature): scores, seconds, validation NLL."""
    net.eval()
    x_test, y_test, x_ood = data["x_test"].to(device), data["y_test"], data["x_ood"].to(device)
    x_val, y_val = data["x_val"].to(device), data["y_val"]
    out: dict[str, Any] = {}
    for name, model in (("mc", net), ("moments", MomentPredictive(net))):
        test, t_test = _timed(model, x_test, draws, seed=1)
        ood, t_ood = _timed(model, x_ood, draws, seed=2)
        val, _ = _timed(model, x_val, REFERENCE_DRAWS, seed=3)
        val_probs = val.softmax(-1).double()
        record = {**_scores(test, ood, y_test), "predict_seconds": t_test + t_ood}
        record["val_nll"] = metrics.negative_log_likelihood(val_probs[:draws].mean(0), y_val)
        record["val_nll_64"] = metrics.negative_log_likelihood(val_probs.mean(0), y_val)
        scaled = TemperatureScaled(model).fit(x_val, y_val.to(device), samples=draws)
        ts_test, _ = _timed(scaled, x_test, draws, seed=1)
        ts_ood, _ = _timed(scaled, x_ood, draws, seed=2)
        record["ts"] = {**_scores(ts_test, ts_ood, y_test), "temperature": float(scaled.temperature)}
        out[name] = record
    return out


def run(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    done = set()
    if runs_path.exists():
        for line in runs_path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["dataset"], r["model"], r["method"], r["seed"], r["quick"]))
    data = ucpu.load(args.dataset, args.train_size, args.val_size, 500 if args.quick else None)
    chosen = Path(ucpu.OUT) / f"ivon-{args.dataset}-{args.model}{'-quick' if args.quick else ''}.json"
    if chosen.exists():
        record = json.loads(chosen.read_text())
        ivon = (float(record["lr"]), record["hess_init"])
    else:
        ivon = ucpu.IVON_GRID[0]
        print(f"no IVON choice at {chosen}: using {ivon}", file=sys.stderr)
    train_args = argparse.Namespace(model=args.model, epochs=args.max_epochs, max_epochs=args.max_epochs, methods=[])
    runner = ucpu.Run(train_args, data, device, ivon)
    unit = ucpu.plain_forward_seconds(data, args.model, device)
    for seed in args.seeds:
        for method in args.methods:
            if (args.dataset, args.model, method, seed, bool(args.quick)) in done:
                continue
            t0 = time.perf_counter()
            net, train_seconds, epochs = runner.train_one(method, seed)
            pair = evaluate_pair(net, data, args.draws, device)
            record = {
                "dataset": args.dataset, "model": args.model, "method": method, "seed": seed, "draws": args.draws,
                "train_seconds": train_seconds, "epochs": epochs, **pair, "plain_forward_seconds": unit,
                "ivon": list(ivon) if method.startswith("ivon") else None, "load_average": os.getloadavg()[0],
                "commit": ucpu._commit(), "device": ucpu._device_name(device),
                "seconds": time.perf_counter() - t0, "quick": bool(args.quick),
            }  # fmt: skip
            with runs_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            mc, mo = pair["mc"], pair["moments"]
            print(
                f"{args.dataset} {args.model} {method} seed {seed}: val NLL mc64 {mc['val_nll_64']:.4f} moments "
                f"{mo['val_nll']:.4f}; test NLL mc {mc['nll']:.4f} moments {mo['nll']:.4f}; seconds mc "
                f"{mc['predict_seconds']:.2f} moments {mo['predict_seconds']:.2f} (plain {unit:.3f})",
                file=sys.stderr, flush=True,
            )  # fmt: skip


def timing(args: argparse.Namespace) -> None:
    """Predict seconds of the test + OOD sets (20,000 images) as multiples of one plain forward pass, measured in
    ``--rounds`` interleaved rounds (the median of the per-round ratios: robust to a shared machine's drifting
    load). The cost does not depend on the trained values, so untrained networks of each architecture are timed."""
    device = torch.device(args.device)
    started = time.perf_counter()
    torch.manual_seed(0)
    x = torch.rand(20_000, 1, 28, 28, device=device)
    rows = []
    for model_name in args.timing_models:
        plain = ucpu._net(model_name).to(device).eval()
        bayes = varbnn.bayesianize(ucpu._net(model_name)).to(device).eval()
        cases = _cases(plain, bayes, x)
        for case in cases.values():  # warm-up
            case()
        ratios: dict[str, list[float]] = {name: [] for name in cases if name != "plain"}
        seconds: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            measured = {}
            for name, case in cases.items():
                t0 = time.perf_counter()
                case()
                measured[name] = time.perf_counter() - t0
                seconds[name].append(measured[name])
            for name in ratios:
                ratios[name].append(measured[name] / measured["plain"])
        row = {
            "model": model_name,
            "plain_seconds": statistics.median(seconds["plain"]),
            **{f"{name}_ratio": statistics.median(values) for name, values in ratios.items()},
            **{f"{name}_seconds": statistics.median(values) for name, values in seconds.items()},
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"rows": rows, "rounds": args.rounds, "images": 20_000, "commit": ucpu._commit(),
              "device": ucpu._device_name(device), "load_average": os.getloadavg()[0], "torch_threads": torch.get_num_threads(),
              "command": f"benchmarks/moment_predictive.py --timing --rounds {args.rounds} --timing-models "
                         f"{' '.join(args.timing_models)}",
              "seconds": time.perf_counter() - started}  # fmt: skip
    table = [
        "| model | plain pass (s) | MC 8 | MC 16 | MC 32 | moments, 16 output draws | moments, 32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        table.append(
            f"| {row['model']} | {row['plain_seconds']:.3f} | "
            + " | ".join(f"{row[f'{name}_ratio']:.1f}x" for name in ("mc-8", "mc-16", "mc-32", "moments-16", "moments-32"))
            + " |"
        )
    notes = [f"median of {args.rounds} interleaved rounds of the ratio to one plain forward pass over 20,000 images "
             f"(batches of 2,000); load average {result['load_average']:.1f}; torch threads "
             f"{result['torch_threads']}"]  # fmt: skip
    write_result(out, "timing", result, "Predict cost: moments vs weight draws (untrained networks)", notes, table)


def _cases(plain: nn.Module, bayes: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """The timed predictions: one plain pass, Monte Carlo at 8, 16 and 32 draws, moments with 16 and 32 output draws."""

    def sampled(s: int) -> Any:
        return lambda: varbnn.predict(bayes, x, samples=s, batch_size=2000, predictive="sample")

    def moments(s: int) -> Any:
        return lambda: varbnn.predict(bayes, x, samples=s, batch_size=2000, predictive="moments")

    return {
        "plain": lambda: _plain_pass(plain, x),
        **{f"mc-{s}": sampled(s) for s in (8, 16, 32)},
        **{f"moments-{s}": moments(s) for s in (16, 32)},
    }


def _plain_pass(net: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        for chunk in x.split(2000):
            net(chunk)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def summarize(args: argparse.Namespace) -> None:
    out = Path(args.out)
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    runs = [r for r in runs if not r["quick"]]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["dataset"], r["model"], r["method"]), []).append(r)
    rows = []
    for (dataset, model, method), rs in sorted(groups.items()):
        row: dict[str, Any] = {"dataset": dataset, "model": model, "method": method, "seeds": sorted(r["seed"] for r in rs)}
        for kind in ("mc", "moments"):
            for key in ("nll", "ece", "accuracy", "ood_auroc_entropy", "val_nll", "val_nll_64"):
                row[f"{kind}_{key}"] = _mean([r[kind][key] for r in rs])
            row[f"{kind}_ts_nll"] = _mean([r[kind]["ts"]["nll"] for r in rs])
            row[f"{kind}_ts_ece"] = _mean([r[kind]["ts"]["ece"] for r in rs])
            row[f"{kind}_cost"] = statistics.median([r[kind]["predict_seconds"] / r["plain_forward_seconds"] for r in rs])
        # the criterion: the predictive's validation NLL within 1% of the 64-draw Monte Carlo NLL, per seed
        gaps = [r["moments"]["val_nll"] / r["mc"]["val_nll_64"] - 1.0 for r in rs]
        row["val_gap_per_seed"] = gaps
        row["within_1pct_seeds"] = sum(g <= 0.01 for g in gaps)
        row["moments_beats_mc_test_nll_seeds"] = sum(r["moments"]["nll"] < r["mc"]["nll"] for r in rs)
        rows.append(row)
    lines = [
        "| dataset | model | method | seeds | val NLL: MC 64 / moments (gap) | test NLL: MC 32 / moments | + TS: MC / "
        "moments | ECE: MC / moments | OOD AUROC: MC / moments | predict cost (x plain pass, median of seeds): MC / moments |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['model']} | {r['method']} | {len(r['seeds'])} | {r['mc_val_nll_64']:.4f} / "
            f"{r['moments_val_nll']:.4f} ({100 * _mean(r['val_gap_per_seed']):+.1f}%, within 1% on "
            f"{r['within_1pct_seeds']}/{len(r['seeds'])}) | {r['mc_nll']:.4f} / {r['moments_nll']:.4f} | "
            f"{r['mc_ts_nll']:.4f} / {r['moments_ts_nll']:.4f} | {r['mc_ece']:.4f} / {r['moments_ece']:.4f} | "
            f"{r['mc_ood_auroc_entropy']:.4f} / {r['moments_ood_auroc_entropy']:.4f} | {r['mc_cost']:.0f}x / "
            f"{r['moments_cost']:.1f}x |"
        )
    lines += [
        "",
        "Per seed (validation NLL: 64 weight draws / moments; test NLL with a temperature fitted to each predictive):",
        "",
        "| dataset | model | method | seed | val NLL MC 64 | val NLL moments | gap | test NLL + TS: MC | moments |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r["dataset"], r["model"], r["method"], r["seed"])):
        gap = r["moments"]["val_nll"] / r["mc"]["val_nll_64"] - 1.0
        lines.append(
            f"| {r['dataset']} | {r['model']} | {r['method']} | {r['seed']} | {r['mc']['val_nll_64']:.4f} | "
            f"{r['moments']['val_nll']:.4f} | {100 * gap:+.1f}% | {r['mc']['ts']['nll']:.4f} | {r['moments']['ts']['nll']:.4f} |"
        )
    by_dataset = {}
    for dataset, model in sorted({(r["dataset"], r["model"]) for r in runs}):
        rs = [r for r in runs if (r["dataset"], r["model"]) == (dataset, model)]
        val_gaps = [100 * (r["moments"]["val_nll"] / r["mc"]["val_nll_64"] - 1.0) for r in rs]
        ts_gaps = [100 * (r["moments"]["ts"]["nll"] / r["mc"]["ts"]["nll"] - 1.0) for r in rs]
        auroc = [100 * (r["moments"]["ood_auroc_entropy"] - r["mc"]["ood_auroc_entropy"]) for r in rs]
        by_dataset[f"{dataset}-{model}"] = {
            "runs": len(rs),
            "val_gap_percent_min": min(val_gaps), "val_gap_percent_max": max(val_gaps),
            "within_1pct_runs": sum(g <= 1.0 for g in val_gaps),
            "ts_test_gap_percent_min": min(ts_gaps), "ts_test_gap_percent_max": max(ts_gaps),
            "ts_moments_lower_runs": sum(g < 0 for g in ts_gaps),
            "auroc_points_min": min(auroc), "auroc_points_max": max(auroc),
        }  # fmt: skip
    commits = sorted({r["commit"] for r in runs})
    devices = sorted({r["device"] for r in runs})
    seconds = sum(r["seconds"] for r in runs)
    result = {
        "by_dataset": by_dataset,
        "command": "benchmarks/moment_predictive.py --dataset D --model M (runs); --summarize (this file)",
        "commit": ", ".join(commits),
        "summary_commit": ucpu._commit(),
        "device": ", ".join(devices),
        "seconds": seconds,
        "draws": runs[0]["draws"] if runs else None,
        "load_average_max": max(r["load_average"] for r in runs) if runs else None,
        "rows": rows,
    }
    notes = [
        f"summary written at {result['summary_commit']}; {seconds / 60:.0f} minutes of runs (training and scoring); "
        f"1-minute load average at most {result['load_average_max']:.1f} on 2 shared cores: compare costs within a row",
        f"test scores at {result['draws']} draws (weight draws for MC, output draws for moments); validation NLL of the "
        f"moment predictive at {result['draws']} draws against 64 weight draws (the issue's reference)",
        "TS: a temperature fitted on the validation split to each predictive (TemperatureScaled.fit(..., predictive=...))",
    ]
    write_result(out, "summary", result, "Moment predictive vs Monte Carlo (CPU form)", notes, lines)
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(ucpu.LOADERS), default="fashion-mnist")
    parser.add_argument("--model", choices=("mlp", "lenet5"), default="mlp")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--draws", type=int, default=32)
    parser.add_argument("--max-epochs", type=int, default=40)
    parser.add_argument("--train-size", type=int, default=10_000)
    parser.add_argument("--val-size", type=int, default=5_000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--quick", action="store_true", help="2 epochs, 1,000 training images, 500 test images")
    parser.add_argument("--summarize", action="store_true")
    parser.add_argument("--timing", action="store_true", help="interleaved predict-cost rounds, untrained networks")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--timing-models", nargs="+", choices=("mlp", "lenet5"), default=["mlp"])
    args = parser.parse_args(argv)
    if args.quick:
        args.max_epochs, args.train_size, args.val_size = 2, 1000, 500
    if args.timing:
        timing(args)
    elif args.summarize:
        summarize(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
