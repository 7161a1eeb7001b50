"""What ktied-mnist's gradient SNR measures: the per-element mean, the median, and the likelihood-only gradient.

ktied-mnist and ktied-snr-anneal found mean-field's std-parameter SNR at step 1000 far above k-tied's (5,362 vs 265;
4,516 vs 1,247), the paper's opposite, with mean-field ~1,000x the paper's value (4.13). Issue 64 names the suspect: the
statistic, ``E[g]^2 / Var[g]`` over the last 10 minibatch gradients, averaged over the elements of the std tensor
(:class:`varbnn.analysis.GradientSNR`), and the gradient it reads (the whole loss's, whose KL part is deterministic).
This script retrains the same network the same way to step 1000 and reads, over the same 10-step window, four
numbers per family: the per-element mean and the median of the ratio, each for the gradient of the whole loss and
for the gradient of the likelihood term alone (same draws, same batch: ``torch.autograd.grad`` of each term).

Protocol (ktied-mnist's): MNIST, the first 50,000 training images (the last 10,000 are ktied-mnist's validation
split), MLP 784-400-400-10, mean-field (``init_std`` 1e-2) or 2-tied (``KTied(rank=2, init_std=1e-2)``), reparameterised
draws, Adam 1e-3, batch 128, loss ``mean NLL + beta KL / 50,000`` with beta annealed linearly from 0 to 1 over 25
epochs (``--anneal-epochs 300``: ktied-snr-anneal's schedule); the std parameters of the second dense layer
(``3.weight``: ``rho`` for mean-field, ``log_u``/``log_v`` for k-tied); window steps 991-1000. The data order and the
draws are this script's own (seeded), not the lab runs'. A diagnostic: nothing in the library changes with it.

    .venv/bin/python benchmarks/ktied_snr_measure.py [--seeds 0 1 2] [--anneal-epochs 25] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import commit_of, device_name, write_result  # noqa: E402

import varbnn  # noqa: E402
from varbnn.data import load_mnist  # noqa: E402
from varbnn.models import mlp  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "ktied-snr-anneal" / "studies"
N_TRAIN = 50_000
BATCH = 128
TENSOR = ("3", "weight")
FAMILIES = {
    "mean-field": lambda: varbnn.MeanField(init_std=1e-2, estimator="reparam"),
    "2-tied": lambda: varbnn.KTied(rank=2, init_std=1e-2, estimator="reparam"),
}


def _ratios(window: list[torch.Tensor]) -> torch.Tensor:
    g = torch.stack(window)
    var = g.var(0)
    keep = var > 0
    return g.mean(0)[keep].square() / var[keep]


def run_one(family: str, seed: int, args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = varbnn.bayesianize(mlp(784, (400, 400), 10), FAMILIES[family]())
    posterior = model.get_submodule(TENSOR[0]).posteriors[TENSOR[1]]
    params = [p for name, p in posterior.named_parameters() if name != "loc"]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps_per_epoch = -(-len(x) // BATCH)
    anneal_steps = args.anneal_epochs * steps_per_epoch
    g = torch.Generator().manual_seed(seed)
    window: dict[str, list[torch.Tensor]] = {"whole": [], "likelihood": []}
    step, t0 = 0, time.perf_counter()
    while step < args.step:
        order = torch.randperm(len(x), generator=g)
        for start in range(0, len(x), BATCH):
            if step >= args.step:
                break
            idx = order[start : start + BATCH]
            step += 1
            beta = min(1.0, step / anneal_steps)  # the weight of this step (linear from 0 to 1)
            nll = F.cross_entropy(model(x[idx]), y[idx])
            loss = nll + beta * varbnn.kl(model) / N_TRAIN
            optimizer.zero_grad(set_to_none=True)
            if step > args.step - args.window:
                lik = torch.autograd.grad(nll, params, retain_graph=True)
                window["likelihood"].append(torch.cat([t.reshape(-1) for t in lik]).double())
                loss.backward()
                window["whole"].append(torch.cat([p.grad.reshape(-1) for p in params]).double().clone())
            else:
                loss.backward()
            optimizer.step()
    out: dict[str, Any] = {"family": family, "seed": seed, "step": step, "beta": beta}
    for kind, grads in window.items():
        ratios = _ratios(grads)
        out[f"elements_{kind}"] = int(ratios.numel())  # those whose gradient varied over the window
        out[f"snr_mean_{kind}"] = float(ratios.mean())
        out[f"snr_median_{kind}"] = float(ratios.median())
        out[f"share_above_100_{kind}"] = float((ratios > 100).double().mean())
        out[f"mean_abs_grad_{kind}"] = float(torch.stack(grads).mean(0).abs().mean())
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--anneal-epochs", type=int, default=25, help="25: ktied-mnist's schedule; 300: ktied-snr-anneal's")
    parser.add_argument("--step", type=int, default=1000, help="the logged step (the window ends there)")
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--quick", action="store_true", help="a smoke run: 30 steps, one seed, 2,000 images")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    x, y = load_mnist("train")
    x, y = x[:N_TRAIN], y[:N_TRAIN]
    if args.quick:
        args.seeds, args.step, x, y = args.seeds[:1], 30, x[:2000], y[:2000]
    start = time.perf_counter()
    records = []
    for seed in args.seeds:
        for family in FAMILIES:
            record = run_one(family, seed, args, x, y)
            records.append(record)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}), flush=True)
    table = [
        "| family | seeds | SNR, per-element mean (whole loss) | median (whole loss) | mean (likelihood only) | "
        "median (likelihood only) | elements above 100 (whole / likelihood) |",
        "|---|---|---|---|---|---|---|",
    ]
    summary: dict[str, dict[str, float]] = {}
    for family in FAMILIES:
        rows = [r for r in records if r["family"] == family]
        keys = [f"snr_{s}_{k}" for k in ("whole", "likelihood") for s in ("mean", "median")]
        summary[family] = {k: statistics.mean(r[k] for r in rows) for k in keys}
        for k in ("share_above_100_whole", "share_above_100_likelihood"):
            summary[family][k] = statistics.mean(r[k] for r in rows)
        s = summary[family]
        table.append(
            f"| {family} | {len(rows)} | {s['snr_mean_whole']:,.1f} | {s['snr_median_whole']:,.3f} | "
            f"{s['snr_mean_likelihood']:,.3f} | {s['snr_median_likelihood']:,.4f} | "
            f"{s['share_above_100_whole']:.1%} / {s['share_above_100_likelihood']:.1%} |"
        )
    suffix = "-quick" if args.quick else ""
    result = {
        "name": f"snr-statistic-anneal{args.anneal_epochs}{suffix}",
        "command": f"python benchmarks/ktied_snr_measure.py --seeds {' '.join(map(str, args.seeds))} "
        f"--anneal-epochs {args.anneal_epochs}" + (" --quick" if args.quick else ""),
        "commit": commit_of(ROOT),
        "device": device_name(torch.device("cpu")),
        "seconds": round(time.perf_counter() - start, 1),
        "step": args.step,
        "window": args.window,
        "anneal_epochs": args.anneal_epochs,
        "records": records,
        "summary": summary,
    }
    notes = [
        f"MNIST MLP 784-400-400-10, the std parameters of `3.weight`, window steps {args.step - args.window + 1}-"
        f"{args.step}, KL annealed over {args.anneal_epochs} epochs (beta {records[0]['beta']:.4f} at step {args.step})",
        "SNR per element: mean over the window's gradients squared over their unbiased variance; 'whole loss': the "
        "gradient the optimizer steps on (NLL + beta KL / N), as ktied-mnist's trace reads it; 'likelihood only': the "
        "gradient of the NLL term on the same draw and batch",
    ]
    path = write_result(Path(args.out), result["name"], result,
                        "Gradient SNR of the std parameters: which statistic, which gradient", notes, table)  # fmt: skip
    print(f"wrote {path}.json and .md")


if __name__ == "__main__":
    main()
