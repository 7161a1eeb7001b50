"""How lenet5-prune's retraining was chosen: ``varbnn.prune.iterative_budget`` on the trained lenet5-prune checkpoint
with different retraining settings, to the goal's budget (120K FLOPs, 15K parameters), side by side.

Needs the finished checkpoint of ``varbnn reproduce lenet5-prune`` (under ``CHECKPOINTS/.checkpoints/``, by default
lenet5-prune's folder ``benchmarks/results/lenet5-prune/``; the run is resumable, so the reproduce command makes it).
Rows: the number of prune-and-retrain stages, epochs per stage (the last stage: 30), the learning-rate schedule
(Adam 1e-3, constant or cosine) and the distillation weight of the model's Monte Carlo predictive (16 draws). The
config takes the row with the lowest VALIDATION error; the test error is reported, not used.

Usage: python benchmarks/prune_retraining.py [--out benchmarks/results/prune-retraining]
       [--checkpoints benchmarks/results/lenet5-prune] [--data-dir ../shared/data] [--device cpu]
Writes OUT/prune_retraining.json and .md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from lenet5_checkpoint import load_trained  # type: ignore[import-not-found]
from report import write_result  # type: ignore[import-not-found]

from varbnn.prune import classification_error, iterative_budget, predictive_targets
from varbnn.training import resolve_device
from varbnn_lab.config import results_dir
from varbnn_lab.runner import describe_device, git_commit

# (stages, epochs per stage, schedule, distillation weight), in the order they were first tried
SETTINGS = [(4, 5, "constant", 0.0), (4, 5, "cosine", 0.0), (8, 3, "cosine", 0.0), (4, 5, "cosine", 0.7)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(results_dir("prune-retraining")), help="folder of the page and JSON")
    parser.add_argument("--checkpoints", default=str(results_dir("lenet5-prune")), help="lenet5-prune's folder")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    start = time.perf_counter()
    trained = load_trained(args.checkpoints, args.data_dir, device)
    config, model, best_epoch = trained.config, trained.model, trained.epoch
    train, validation, (x_test, y_test) = trained.train, trained.validation, trained.test
    t0 = time.perf_counter()
    soft = predictive_targets(model, train[0], config.prune_distill_samples, seed=config.seeds[0])
    teacher_seconds = time.perf_counter() - t0
    max_flops, max_parameters = config.prune_budget  # type: ignore[misc]
    rows = []
    for stages, epochs, schedule, weight in SETTINGS:
        t0 = time.perf_counter()
        pruned, report = iterative_budget(
            model, train, validation, max_flops=max_flops, max_parameters=max_parameters, stages=stages, epochs=epochs,
            final_epochs=config.prune_finetune_epochs, lr=config.prune_finetune_lr, batch_size=config.batch_size,
            seed=config.seeds[0], schedule=schedule, soft_targets=soft if weight else None, distill_weight=weight,
            start=config.prune_threshold, min_gap=config.prune_min_gap,
        )  # fmt: skip
        row = {
            "stages": stages, "epochs_per_stage": epochs, "schedule": schedule, "distill_weight": weight,
            "architecture": report["architecture"], "parameters": report["parameters"], "flops": report["flops"],
            "validation_error": report["validation_error"], "test_error": classification_error(pruned, x_test, y_test),
            "stage_architectures": [s["architecture"] for s in report["stages"]],
            "stage_validation_errors": [s["validation_error"] for s in report["stages"]],
            "seconds": time.perf_counter() - t0,
        }  # fmt: skip
        rows.append(row)
        print({k: v for k, v in row.items() if not k.startswith("stage_")}, flush=True)
    chosen = min(range(len(rows)), key=lambda i: rows[i]["validation_error"])
    in_config = (config.prune_stages, config.prune_stage_epochs, config.prune_finetune_schedule, config.prune_distill_weight)
    result = {
        "command": " ".join(["python benchmarks/prune_retraining.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": describe_device(device),
        "seconds": time.perf_counter() - start,
        "teacher_seconds": teacher_seconds,
        "checkpoint_epoch": best_epoch,
        "config": config.name,
        "rows": rows,
        "chosen": chosen,
    }
    table = [
        "| stages | epochs per stage | schedule | distillation weight | architecture | parameters | FLOPs "
        "| validation error | test error | architectures after each stage | seconds |",
        "|---:|---:|---|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for i, r in enumerate(rows):
        mark = " (lowest validation error)" if i == chosen else ""
        table.append(
            f"| {r['stages']} | {r['epochs_per_stage']} | {r['schedule']} | {r['distill_weight']} | {r['architecture']}{mark} "
            f"| {r['parameters']:,} | {r['flops']:,} | {100 * r['validation_error']:.2f}% | {100 * r['test_error']:.2f}% "
            f"| {' > '.join(r['stage_architectures'])} | {r['seconds']:.0f} |"
        )
    notes = [
        f"wall time: {result['seconds']:.0f} s (the predictive on the 50,000 training images: {teacher_seconds:.0f} s)",
        f"model: lenet5-prune's checkpoint (epoch {result['checkpoint_epoch']}), pruned from the gap rule's model to "
        f"{max_flops:,} FLOPs and {max_parameters:,} parameters by varbnn.prune.iterative_budget; Adam "
        f"{config.prune_finetune_lr}, batch {config.batch_size}, {config.prune_finetune_epochs} epochs after the last stage; "
        "each retraining keeps its epoch with the lowest validation error",
        f"lenet5-prune's config uses stages={in_config[0]}, epochs per stage={in_config[1]}, schedule={in_config[2]}, "
        f"distillation weight={in_config[3]}",
    ]
    write_result(Path(args.out), "prune_retraining", result, "Retraining settings of lenet5-prune's staged pruning", notes, table)
    print(f"wrote {Path(args.out) / 'prune_retraining'}.json and .md")


if __name__ == "__main__":
    main()
