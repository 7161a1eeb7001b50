"""How wide should a variational adapter's posterior start? ``add_adapters(std_scale=...)`` chosen on validation data.

The finetune-cpu benchmark's setting (``benchmarks/finetune_cpu.py``: its MNIST-pretrained ViT, rank-8 adapters on
the same layers, a fresh head, 1,000 Fashion-MNIST training images per seed and 1,000 others for validation, Adam at
the benchmark's chosen lr 1e-3, batch 64, early stopping with patience 5 on the validation NLL, at most 60 epochs)
with the default family (MeanField over ``A``, BLoB's parameterisation) started at each ``--scales`` entry:
``std_scale = s`` gives ``A`` the initial std ``s / sqrt(fan_in)`` (``A`` itself starts uniform in
``+-1 / sqrt(fan_in)``); ``none`` is ``family=MeanField()``, its ``1e-2`` for every matrix (add_adapters' default).
Each run also takes fit's validation predictive at ``--validation-samples`` weight draws (fit's default 8, and 2), to
see whether fewer draws stop at the same epoch.

Scored on the validation split only (never the test set): the NLL of the 32-draw predictive after training (the
benchmark's selection criterion), the epoch restored, the seconds. Each run is appended to
``OUT/adapter-std_runs.jsonl`` at once (a killed study resumes); ``--summarize`` writes ``OUT/adapter-std.json`` /
``adapter-std.md``: per scale the mean ± standard error over seeds and the per-seed values at fit's default 8
validation draws, the scale with the lowest mean, and for each (scale, seed) whether 2 draws restored the same epoch.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/adapter_std_study.py [--seeds 0 1 2] [--summarize]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import finetune_cpu as bench  # noqa: E402
from report import write_result  # noqa: E402

import varbnn  # noqa: E402
from varbnn import metrics  # noqa: E402
from varbnn.adapters import add_adapters  # noqa: E402

OUT = bench.OUT / "studies"
STEM = "adapter-std"
LR = 1e-3


def _scale(text: str) -> float | None:
    return None if text == "none" else float(text)


def one(args: argparse.Namespace, base: Any, data: dict[str, torch.Tensor], scale: float | None, seed: int,
        samples: int) -> dict[str, Any]:  # fmt: skip
    split = bench.split(data, seed, args.train_size, args.val_size)
    net = bench.new_head(base, seed)
    torch.manual_seed(seed)
    width = {"family": varbnn.MeanField()} if scale is None else {"std_scale": scale}  # none: 1e-2 everywhere
    model = add_adapters(net, rank=args.rank, include=bench.ADAPTED, **width)
    model.head.requires_grad_(True)  # type: ignore[union-attr]
    loader = DataLoader(TensorDataset(split["x_train"], split["y_train"]), batch_size=bench.BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))  # fmt: skip
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "There is a performance drop", UserWarning)
        history = varbnn.fit(model, loader, n_data=len(split["x_train"]), epochs=args.max_epochs, lr=LR,
                             validation=(split["x_val"], split["y_val"]), early_stopping=args.patience,
                             validation_samples=samples, progress=False)  # fmt: skip
    seconds = time.perf_counter() - t0
    return {
        "scale": scale, "seed": seed, "validation_samples": samples,
        "val_nll": bench.val_nll(model, "vlora", split, args.draws), "epochs": len(history),
        "best_epoch": int(history[-1]["best_epoch"]), "seconds": seconds, "commit": bench._commit(),
        "device": bench._device_name(torch.device("cpu")), "load_average": os.getloadavg()[0],
    }  # fmt: skip


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{STEM}_runs.jsonl"
    done = {(r["scale"], r["seed"], r["validation_samples"]) for r in map(json.loads, path.read_text().splitlines())} \
        if path.exists() else set()  # fmt: skip
    base, _ = bench.pretrained(argparse.Namespace(quick=False, pretrain_epochs=args.pretrain_epochs), bench.OUT)
    data = bench.load(argparse.Namespace(quick=False))
    for seed in args.seeds:
        for scale in args.scales:
            for samples in args.validation_samples:
                if (scale, seed, samples) in done:
                    continue
                record = one(args, base, data, scale, seed, samples)
                with path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                print(json.dumps(record), file=sys.stderr, flush=True)


def summarize(args: argparse.Namespace) -> None:
    out = Path(args.out)
    records = [json.loads(line) for line in (out / f"{STEM}_runs.jsonl").read_text().splitlines()]
    by = {(r["scale"], r["seed"], r["validation_samples"]): r for r in records}
    scales = list(dict.fromkeys(r["scale"] for r in records))
    seeds = sorted({r["seed"] for r in records})
    label = lambda s: "none: MeanField() (1e-2)" if s is None else f"{s:g}"  # noqa: E731
    rows = []
    for scale in scales:
        values = [by[(scale, s, 8)]["val_nll"] for s in seeds if (scale, s, 8) in by]
        mean, se = metrics.mean_and_standard_error(values)
        same = [by[(scale, s, 2)]["best_epoch"] == by[(scale, s, 8)]["best_epoch"] for s in seeds
                if (scale, s, 2) in by and (scale, s, 8) in by]  # fmt: skip
        rows.append({
            "scale": scale, "val_nll": mean, "val_nll_se": se, "per_seed": values,
            "val_nll_2_draws": [by[(scale, s, 2)]["val_nll"] for s in seeds if (scale, s, 2) in by],
            "best_epoch_8": [by[(scale, s, 8)]["best_epoch"] for s in seeds if (scale, s, 8) in by],
            "best_epoch_2": [by[(scale, s, 2)]["best_epoch"] for s in seeds if (scale, s, 2) in by],
            "same_epoch_with_2_draws": same,
            "seconds_8": statistics.mean(by[(scale, s, 8)]["seconds"] for s in seeds if (scale, s, 8) in by),
            "seconds_2": statistics.mean(by[(scale, s, 2)]["seconds"] for s in seeds if (scale, s, 2) in by),
        })  # fmt: skip
    best = min(rows, key=lambda r: r["val_nll"])
    result = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/adapter_std_study.py --seeds " + " ".join(map(str, seeds)),
        "commit": ", ".join(sorted({r["commit"] for r in records})),
        "device": ", ".join(sorted({r["device"] for r in records})),
        "seconds": sum(r["seconds"] for r in records), "seeds": seeds, "rows": rows, "chosen": best["scale"],
        "load_average_max": max(r["load_average"] for r in records),
    }  # fmt: skip
    table = ["| std_scale | validation NLL (8 draws to stop), mean ± SE | per seed | per seed with 2 validation "
             "draws | epoch restored, 8 / 2 draws | seconds, 8 / 2 draws |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cells = ", ".join(f"{v:.4f}" for v in r["per_seed"])
        cells2 = ", ".join(f"{v:.4f}" for v in r["val_nll_2_draws"])
        epochs = ", ".join(f"{a} / {b}" for a, b in zip(r["best_epoch_8"], r["best_epoch_2"]))
        table.append(f"| {label(r['scale'])} | {r['val_nll']:.4f} ± {r['val_nll_se']:.4f} | {cells} | {cells2} | "
                     f"{epochs} | {r['seconds_8']:.1f} / {r['seconds_2']:.1f} |")  # fmt: skip
    same = sum(sum(r["same_epoch_with_2_draws"]) for r in rows)
    total = sum(len(r["same_epoch_with_2_draws"]) for r in rows)
    table += ["", f"Lowest mean validation NLL: **std_scale {label(best['scale'])}**. With 2 validation draws instead "
              f"of 8, fit restored the same epoch in {same} of {total} (scale, seed) pairs."]  # fmt: skip
    notes = [
        f"the finetune-cpu setting: rank {args.rank} adapters on {', '.join(bench.ADAPTED)}, MeanField over A started "
        f"at std_scale / sqrt(fan_in) (none: family=MeanField(), 1e-2 everywhere), Adam lr {LR:g}, batch "
        f"{bench.BATCH}, early stopping patience {args.patience}, at most "
        f"{args.max_epochs} epochs; validation NLL of the {args.draws}-draw predictive on each seed's validation split",
        f"1-minute load average at the end of each run: at most {result['load_average_max']:.1f} (2 shared cores)",
        f"seconds of the runs: {result['seconds']:.0f}",
    ]
    write_result(out, STEM, result, "Adapters' initial posterior std (std_scale), chosen on validation", notes,
                 table)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scales", type=_scale, nargs="+", default=[None, 0.25, 0.5, 1.0])
    parser.add_argument("--validation-samples", type=int, nargs="+", default=[8, 2])
    parser.add_argument("--pretrain-epochs", type=int, default=5)
    parser.add_argument("--train-size", type=int, default=1000)
    parser.add_argument("--val-size", type=int, default=1000)
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--patience", type=int, default=5)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--draws", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--summarize", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("VARBNN_DATA", str(ROOT.parent / "shared" / "data"))
    if args.summarize:
        summarize(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
