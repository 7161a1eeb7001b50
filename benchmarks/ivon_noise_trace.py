"""Why IVON at its defaults fails on the larger ``uci-learned`` sets: one search run traced, epoch by epoch.

The ``uci-learned`` IVON column (``varbnn_lab.uci_learned``: the mean-field network trained by
:class:`varbnn.optim.IVON` at its defaults, the likelihood's learned ``log_noise_std`` among IVON's plain parameters)
diverged on 4 of 5 protein splits and scored far below the Adam-trained mean-field network on kin8nm, power and naval.
This traces one search run of the protocol (80% of a standard split, standardised by its statistics, the prior scale
``--scale``, ``seed_everything(split)``, the column's own optimizer) for

* ``defaults``: the column as it runs (``plain_hess`` 1: the noise steps at ``lr`` 0.1 along its debiased gradient
  momentum);
* ``plain_hess 100``: the same with the plain parameters' steps 100 times smaller (the noise at 1e-3, the other
  columns' Adam rate), to tell the noise's update from the weights' own.

At the end of each epoch: the training loss, the learned noise std's log, the largest ``|m|`` and the smallest
curvature ``h`` over the MeanField tensors; a non-finite loss ends the variant (``fit`` raises) and is recorded. A
diagnostic: the validation and test sets are not read.

    .venv/bin/python benchmarks/ivon_noise_trace.py [--dataset protein-tertiary-structure] [--split 0] [--epochs 6]

Writes ``benchmarks/results/uci-learned/ivon-noise-trace.json`` (another set or split:
``ivon-noise-trace-<dataset>-<split>.json``).
"""

from __future__ import annotations

import argparse
import json
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
VARIANTS = (("defaults", 1.0), ("plain_hess 100", 100.0))


def trace(dataset: str, split: int, scale: float, epochs: int, plain_hess: float) -> dict[str, Any]:
    """One search run of the IVON column on ``dataset``'s ``split`` at prior scale ``scale`` with IVON's
    ``plain_hess``, traced per epoch (module docstring)."""
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from varbnn.data import load_uci
    from varbnn.optim import IVON
    from varbnn.training import fit, seed_everything
    from varbnn.training.checks import NonFiniteError
    from varbnn_lab import uci_learned as U

    config = U.UCILearnedConfig(datasets=(dataset,))
    variant = next(v for v in config.variants if v.family == U.IVON_FAMILY)
    data = load_uci(dataset, split, None, normalize=False)
    order = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(split))  # as the protocol's
    fit_idx = order[max(1, round(config.validation_fraction * len(data.x_train))) :]
    (xm, xs), (ym, ys) = U._standardise(data.x_train[fit_idx], data.y_train[fit_idx])
    x, y = (data.x_train[fit_idx] - xm) / xs, (data.y_train[fit_idx] - ym) / ys
    seed_everything(split)
    model, likelihood = U._build(variant, scale, x.shape[1], dataset, 1)
    optimizer = IVON(nn.ModuleList([model, likelihood]), n_data=len(x), kl_weight=config.kl_weight, plain_hess=plain_hess)
    groups = [g for g in optimizer.param_groups if g["kind"] == "meanfield"]
    rows: list[dict[str, Any]] = []

    def at_epoch(epoch: int, record: dict[str, float]) -> None:
        with torch.no_grad():
            rows.append({
                "epoch": epoch, "loss": float(record["loss"]), "log_noise_std": float(likelihood.log_noise_std),
                "max_abs_mean": max(float(g["family"].loc.abs().max()) for g in groups),
                "min_curvature": min(float(optimizer.state[g["family"].loc]["hess"].min()) for g in groups),
            })  # fmt: skip

    loader = DataLoader(TensorDataset(x, y), batch_size=config.batch_size, shuffle=True)
    start = time.perf_counter()
    failure = None
    try:
        fit(model, loader, n_data=len(x), epochs=epochs, optimizer=optimizer, likelihood=likelihood, progress=False,
            on_epoch_end=at_epoch)  # fmt: skip
    except NonFiniteError as error:
        failure = str(error).split(":")[0]
    return {"plain_hess": plain_hess, "epochs": rows, "failure": failure, "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="protein-tertiary-structure")
    parser.add_argument("--split", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="the prior scale (the search's knob; default 1.0)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the JSON (default: the committed uci-learned one)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result = {
        "command": "python benchmarks/ivon_noise_trace.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": commit, "device": "cpu, 1 thread", "dataset": args.dataset, "split": args.split, "scale": args.scale,
        "variants": {label: trace(args.dataset, args.split, args.scale, args.epochs, hess) for label, hess in VARIANTS},
    }  # fmt: skip
    default = args.dataset == "protein-tertiary-structure" and args.split == 0
    name = "ivon-noise-trace.json" if default else f"ivon-noise-trace-{args.dataset}-{args.split}.json"
    (args.out / name).write_text(json.dumps(result, indent=1) + "\n")
    for label, entry in result["variants"].items():
        print(label, entry["failure"] or "finite", [(r["epoch"], round(r["log_noise_std"], 2)) for r in entry["epochs"]])
    print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
