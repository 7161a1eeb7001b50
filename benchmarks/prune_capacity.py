"""Is the LeNet-5 goal's budget (<= 120K FLOPs, <= 15K parameters, <= 1.0% error) a matter of retraining or of the
posterior? lenet5-prune's staged pruning to the budget with a longer last retraining, beside the SAME pruned
architecture trained from a random initialisation (the control of Liu et al. 2019, "Rethinking the value of network
pruning"): with and without distilling the Bayesian model's Monte Carlo predictive.

Needs the finished checkpoint of ``varbnn reproduce lenet5-prune`` (under ``CHECKPOINTS/.checkpoints/``, by default
lenet5-prune's folder ``benchmarks/results/lenet5-prune/``; the pruned models this script saves go beside it). Rows:

- ``posterior init``: ``varbnn.prune.iterative_budget`` with lenet5-prune's settings (4 stages of 5 epochs, cosine,
  distillation 0.7) but ``--final-epochs`` epochs of retraining after the last stage;
- ``random init, distilled`` / ``random init, labels only``: the posterior row's final architecture (same units, same
  kept fc1 inputs), every weight re-drawn by PyTorch's default initialisation (seeded), trained by
  ``varbnn.prune.finetune`` for as many epochs as the posterior row's retraining in all (stages x epochs + final), Adam
  1e-3 on a cosine, distillation weight 0.7 or 0.

Every retraining keeps its epoch with the lowest VALIDATION error (the last 10,000 training images); the test error is
reported, not used. ``--seeds N`` trains the distilled random-init row from N initialisations (seeds s, s + 1, ...;
the same seed also orders the batches) and adds their mean test error and the test error of the one with the lowest
validation error (choosing a seed on validation is part of the rule; the test error is only read). ``--widths C1-C2-H``
adds the same distilled random-init rows for a LeNet-5-Caffe of the given widths (conv1 and conv2 channels, fc1
outputs; every fc1 input kept) instead of the pruned architecture, e.g. the paper's RDP shape ``4-7-66``: is the budget
reachable with another allocation of the units? Rows are appended to OUT/prune_capacity_rows.jsonl as they finish; a
rerun skips the rows there.

Usage: python benchmarks/prune_capacity.py [--final-epochs 100] [--seeds 1] [--widths C1-C2-H] [--out DIR]
       [--checkpoints DIR] [--device cpu] [--threads 2]
OUT defaults to benchmarks/results/prune-capacity, CHECKPOINTS to benchmarks/results/lenet5-prune.
Writes OUT/prune_capacity.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lenet5_checkpoint import load_trained  # type: ignore[import-not-found]
from report import write_result  # type: ignore[import-not-found]

from varbnn.metrics import mean_and_standard_error
from varbnn.models import lenet5
from varbnn.prune import (
    SelectFeatures,
    classification_error,
    count_parameters_and_flops,
    finetune,
    iterative_budget,
    predictive_targets,
    reinitialize,
)
from varbnn.training import CheckpointError, read_checkpoint, resolve_device, save_checkpoint
from varbnn_lab.config import results_dir
from varbnn_lab.runner import describe_device, git_commit

STEM = "prune_capacity"


def _key(row: dict[str, Any]) -> tuple[str, int]:
    """A row's identity: its initialisation and seed offset (rows written before ``--seeds`` have offset 0)."""
    return row["init"], int(row.get("seed_offset", 0))


def _parse_widths(text: str) -> tuple[int, int, int]:
    parts = text.split("-")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        sys.exit(f"--widths must be C1-C2-H with three positive integers (e.g. 4-7-66), got {text!r}")
    c1, c2, hidden = map(int, parts)
    return c1, c2, hidden


def _layer_spec(layer: torch.nn.Module) -> dict[str, Any]:
    """A plain-data description of one layer of an exported (pruned) chain, enough to rebuild it."""
    if isinstance(layer, torch.nn.Linear):
        return {"type": "Linear", "in": layer.in_features, "out": layer.out_features, "bias": layer.bias is not None}
    if isinstance(layer, torch.nn.Conv2d):
        return {
            "type": "Conv2d", "in": layer.in_channels, "out": layer.out_channels, "kernel_size": list(layer.kernel_size),
            "stride": list(layer.stride), "padding": layer.padding if isinstance(layer.padding, str) else list(layer.padding),
            "dilation": list(layer.dilation), "groups": layer.groups, "bias": layer.bias is not None,
        }  # fmt: skip
    if isinstance(layer, torch.nn.MaxPool2d):
        return {
            "type": "MaxPool2d", "kernel_size": layer.kernel_size, "stride": layer.stride, "padding": layer.padding,
            "dilation": layer.dilation, "ceil_mode": layer.ceil_mode,
        }  # fmt: skip
    if isinstance(layer, torch.nn.Flatten):
        return {"type": "Flatten", "start_dim": layer.start_dim, "end_dim": layer.end_dim}
    if isinstance(layer, torch.nn.ReLU):
        return {"type": "ReLU"}
    if isinstance(layer, SelectFeatures):
        return {"type": "SelectFeatures", "size": layer.index.numel()}
    raise TypeError(f"cannot describe a {type(layer).__name__} layer of the pruned model as plain data")


def _build_layer(spec: dict[str, Any]) -> torch.nn.Module:
    kind = spec["type"]
    if kind == "Linear":
        return torch.nn.Linear(spec["in"], spec["out"], bias=spec["bias"])
    if kind == "Conv2d":
        padding = spec["padding"] if isinstance(spec["padding"], str) else tuple(spec["padding"])
        return torch.nn.Conv2d(
            spec["in"], spec["out"], tuple(spec["kernel_size"]), tuple(spec["stride"]), padding, tuple(spec["dilation"]),
            spec["groups"], spec["bias"],
        )  # fmt: skip
    if kind == "MaxPool2d":
        return torch.nn.MaxPool2d(
            spec["kernel_size"], spec["stride"], spec["padding"], spec["dilation"], ceil_mode=spec["ceil_mode"]
        )
    if kind == "Flatten":
        return torch.nn.Flatten(spec["start_dim"], spec["end_dim"])
    if kind == "ReLU":
        return torch.nn.ReLU()
    if kind == "SelectFeatures":
        return SelectFeatures(torch.zeros(spec["size"], dtype=torch.long))
    raise ValueError(f"unknown layer type {kind!r} in the saved pruned model")


def _save_pruned(model: torch.nn.Module, path: Path) -> None:
    """The pruned chain as plain data (layer descriptions + state dict, with a checksum): it loads with
    ``torch.load(weights_only=True)``, unlike a pickled module."""
    save_checkpoint(path, model, layers=[_layer_spec(layer) for layer in model])


def _load_pruned(path: Path, device: torch.device) -> torch.nn.Module | None:
    """The pruned chain saved by :func:`_save_pruned`, or None (it is then recomputed) when there is none or it
    cannot be used (e.g. a pickled module written by an earlier version of this script)."""
    if not path.exists():
        return None
    try:
        state = read_checkpoint(path, map_location=device)
        model = torch.nn.Sequential(*[_build_layer(spec) for spec in state["layers"]]).to(device)
        model.load_state_dict(state["model"])
    except (CheckpointError, ValueError, KeyError, TypeError, RuntimeError) as error:
        print(f"[prune_capacity] not reusing {path} ({error}); pruning again", file=sys.stderr)
        return None
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--final-epochs", type=int, default=100, help="retraining epochs after the last stage")
    parser.add_argument("--out", default=str(results_dir("prune-capacity")), help="folder of the page, JSON and rows")
    parser.add_argument("--checkpoints", default=str(results_dir("lenet5-prune")), help="lenet5-prune's folder")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1, help="initialisations of the distilled random-init row")
    parser.add_argument("--widths", default=None, help="C1-C2-H: also train a LeNet-5 of these widths from scratch")
    args = parser.parse_args()
    if args.final_epochs < 1:
        sys.exit(f"--final-epochs must be a positive integer, got {args.final_epochs}")
    if args.seeds < 1:
        sys.exit(f"--seeds must be a positive integer, got {args.seeds}")
    widths = _parse_widths(args.widths) if args.widths else None
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    start = time.perf_counter()
    commit, device_text = git_commit(), describe_device(device)  # the code that runs: HEAD at the start
    trained = load_trained(args.checkpoints, args.data_dir, device)
    config, model, best_path = trained.config, trained.model, trained.path
    train, validation, (x_test, y_test) = trained.train, trained.validation, trained.test
    seed = config.seeds[0]
    out = Path(args.out)
    rows_path = out / f"{STEM}_rows.jsonl"
    done = {}
    if rows_path.exists():
        for line in rows_path.read_text().splitlines():
            row = json.loads(line)
            if row["final_epochs"] == args.final_epochs:
                done[_key(row)] = row
    # (init, seed offset): the distilled random-init row once per seed, the others once
    keys = [("posterior", 0), *(("random, distilled", k) for k in range(args.seeds)), ("random, labels only", 0)]
    if widths:
        keys += [(f"random, distilled, widths {args.widths}", k) for k in range(args.seeds)]
    model_path = best_path.with_name(f"{STEM}-final{args.final_epochs}.pt")
    saved_pruned = _load_pruned(model_path, device) if ("posterior", 0) in done else None
    t0 = time.perf_counter()
    finished = all(key in done for key in keys) and saved_pruned is not None
    soft = None if finished else predictive_targets(model, train[0], config.prune_distill_samples, seed=seed)
    teacher_seconds = time.perf_counter() - t0
    max_flops, max_parameters = config.prune_budget  # type: ignore[misc]
    stages, stage_epochs = config.prune_stages, config.prune_stage_epochs
    total_epochs = stages * stage_epochs + args.final_epochs
    common = {"lr": config.prune_finetune_lr, "batch_size": config.batch_size, "schedule": config.prune_finetune_schedule}

    def record(row: dict[str, Any]) -> None:
        row.update(final_epochs=args.final_epochs, commit=commit, device=device_text)
        with rows_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done[_key(row)] = row
        print({k: v for k, v in row.items() if k != "history"}, flush=True)

    # the posterior row's pruned model is the architecture the controls train: kept beside the checkpoint
    if saved_pruned is not None:
        pruned, report = saved_pruned, done[("posterior", 0)]
    else:
        t0 = time.perf_counter()
        pruned, report = iterative_budget(
            model, train, validation, max_flops=max_flops, max_parameters=max_parameters, stages=stages,
            epochs=stage_epochs, final_epochs=args.final_epochs, seed=seed, soft_targets=soft,
            distill_weight=config.prune_distill_weight, start=config.prune_threshold, min_gap=config.prune_min_gap,
            **common,
        )  # fmt: skip
        _save_pruned(pruned, model_path)
        done.pop(("posterior", 0), None)
        record({
            "init": "posterior", "distill_weight": config.prune_distill_weight, "epochs": total_epochs,
            "architecture": report["architecture"], "parameters": report["parameters"], "flops": report["flops"],
            "validation_error": report["validation_error"], "test_error": classification_error(pruned, x_test, y_test),
            "epoch_kept": report["epoch"], "seconds": time.perf_counter() - t0,
        })  # fmt: skip
    for label, offset in keys[1:]:
        if (label, offset) in done:
            continue
        weight = config.prune_distill_weight if label.startswith("random, distilled") else 0.0
        base, sizes = pruned, report
        if widths and label.endswith(args.widths):
            base = lenet5(widths=widths).to(device)
            parameters, flops = count_parameters_and_flops(base, x_test[:1].to(device))
            sizes = {
                "architecture": f"{widths[0]}-{widths[1]}-{16 * widths[1]}-{widths[2]}",
                "parameters": parameters,
                "flops": flops,
            }
        t0 = time.perf_counter()
        fresh = reinitialize(base, seed + offset)
        fresh, tuned = finetune(
            fresh, train, validation, epochs=total_epochs, seed=seed + offset, soft_targets=soft if weight else None,
            distill_weight=weight, **common,
        )  # fmt: skip
        record({
            "init": label, "seed_offset": offset, "distill_weight": weight, "epochs": total_epochs,
            "architecture": sizes["architecture"],
            "parameters": sizes["parameters"], "flops": sizes["flops"], "validation_error": tuned["validation_error"],
            "test_error": classification_error(fresh, x_test, y_test), "epoch_kept": tuned["epoch"],
            "seconds": time.perf_counter() - t0,
        })  # fmt: skip
    rows = [done[k] for k in keys]
    summaries = {}  # per distilled random-init label: its seeds' mean and the validation-chosen seed
    for label in dict.fromkeys(k[0] for k in keys if k[0].startswith("random, distilled")):
        seeded = [done[k] for k in keys if k[0] == label]
        mean, error = mean_and_standard_error([r["test_error"] for r in seeded])
        chosen = min(seeded, key=lambda r: (r["validation_error"], r.get("seed_offset", 0)))
        summaries[label] = {
            "seeds": len(seeded), "architecture": seeded[0]["architecture"], "mean_test_error": mean,
            "standard_error": error, "chosen_seed_offset": chosen.get("seed_offset", 0),
            "chosen_validation_error": chosen["validation_error"], "chosen_test_error": chosen["test_error"],
        }  # fmt: skip
    result = {
        "command": " ".join(["python benchmarks/prune_capacity.py", *sys.argv[1:]]),
        "commit": commit,
        "device": device_text,
        "seconds": time.perf_counter() - start,
        "teacher_seconds": teacher_seconds,
        "checkpoint_epoch": trained.epoch,
        "config": config.name,
        "final_epochs": args.final_epochs,
        "seed_summaries": summaries,
        "rows": rows,
    }
    table = [
        "| initialisation | seed | distillation weight | epochs | architecture | parameters | FLOPs | epoch kept "
        "| validation error | test error | seconds | commit | device |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['init']} | {seed + r.get('seed_offset', 0)} | {r['distill_weight']} | {r['epochs']} "
            f"| {r['architecture']} | {r['parameters']:,} "
            f"| {r['flops']:,} | {r['epoch_kept']} | {100 * r['validation_error']:.2f}% | {100 * r['test_error']:.2f}% "
            f"| {r['seconds']:.0f} | `{r['commit'][:7]}` | {r['device']} |"
        )
    notes = [
        f"wall time of this invocation: {result['seconds']:.0f} s (the predictive on the 50,000 training images: "
        f"{teacher_seconds:.0f} s); rows from earlier invocations keep their own seconds, commit and device (columns)",
        f"model: lenet5-prune's checkpoint (epoch {result['checkpoint_epoch']}); budget {max_flops:,} FLOPs and "
        f"{max_parameters:,} parameters; posterior init: varbnn.prune.iterative_budget, {stages} stages of {stage_epochs} "
        f"epochs then {args.final_epochs}; random init: the same architecture re-initialised, {total_epochs} epochs of "
        f"varbnn.prune.finetune; Adam {config.prune_finetune_lr} on a {config.prune_finetune_schedule} schedule, batch "
        f"{config.batch_size}; epoch kept: lowest validation error (last 10,000 training images)",
        "goal of lenet5-prune: <= 1.0% test error with <= 15K parameters and <= 120K FLOPs",
    ]
    for label, summary in summaries.items():
        if summary["seeds"] > 1:
            notes.append(
                f"{label} ({summary['architecture']}), over {summary['seeds']} seeds: test error "
                f"{100 * summary['mean_test_error']:.2f}% +- {100 * summary['standard_error']:.2f}% (mean +- standard "
                f"error); the seed with the lowest validation error ({seed + summary['chosen_seed_offset']}, "
                f"{100 * summary['chosen_validation_error']:.2f}%) has test error {100 * summary['chosen_test_error']:.2f}%"
            )
    write_result(out, STEM, result, "LeNet-5 at the goal's budget: posterior vs random initialisation", notes, table)
    print(f"wrote {out / STEM}.json and .md")


if __name__ == "__main__":
    main()
