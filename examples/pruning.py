"""Structured pruning and export: a Bayesian network tells you which units it does not need.

A posterior says how sure the network is of each weight; weights (or whole units) it could do without can be
removed. Two ways are shown, both on scikit-learn's 8x8 digits (offline):

**Part 1 -- structured pruning with radial-directional posteriors** (Oh, Adamczewski & Park 2020). Every row group
(the weights into one unit) and column group (the weights out of one input) of a
:class:`~varbnn.RadialDirectional` weight matrix has a direction (von Mises-Fisher) and a radius (log-normal) under a
horseshoe-like prior (:class:`~varbnn.RadialDirectionalPrior`: half-Cauchy scales) that pushes unneeded groups'
radii towards zero. :mod:`varbnn.prune` scores each group by the log of its radius' mode
(:func:`~varbnn.prune.unit_scores`), picks which to keep -- by the widest gap between the scores
(:func:`~varbnn.prune.select_units`) or by held-out data (:func:`~varbnn.prune.validation_thresholds`) -- and
:func:`~varbnn.prune.export` writes a smaller PLAIN ``nn.Sequential`` with the pruned units physically removed, so
the saving in parameters and FLOPs is real and the result needs neither varbnn nor sampling to run.

**Part 2 -- weight pruning by relative density at zero** (Graves 2011). A mean-field weight ``N(mu, sigma^2)`` whose
``|mu| / sigma`` is small is as likely to be zero as anything else: :func:`~varbnn.prune.prune_by_density_ratio`
fixes every weight with ``|mu| / sigma < lambda`` at zero. This removes single weights (a sparse model), not units.

Run ``python examples/pruning.py --help`` for the options; ``--quick`` is the seconds-long form the test suite runs.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # write files, no window
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import varbnn  # noqa: E402
from varbnn import prune  # noqa: E402
from varbnn.data import load_digits  # noqa: E402
from varbnn.training import resolve_device, seed_everything


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few epochs only (what the test suite runs)")
    parser.add_argument("--out", default="varbnn-results/tutorials", help="folder for the figures and the printed output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    return parser.parse_args(argv)


def make_mlp() -> nn.Sequential:
    """64 pixels -> 100 -> 100 -> 10 logits. export needs a plain nn.Sequential chain like this one."""
    return nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(), nn.Linear(100, 10))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Test accuracy of a plain (deterministic) model."""
    return 1.0 - prune.classification_error(model, x, y)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str = "") -> None:  # print, and keep the line for pruning.txt
        print(text, flush=True)
        lines.append(text)

    device = resolve_device(args.device)
    rdp_epochs, mf_epochs, retrain_epochs, samples = (3, 3, 2, 8) if args.quick else (100, 60, 30, 32)
    say(f"varbnn {varbnn.__version__}, torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s)")
    say(
        f"RDP epochs {rdp_epochs}, MeanField epochs {mf_epochs}, retraining epochs {retrain_epochs}, "
        f"Monte Carlo samples {samples}, seed {args.seed}"
    )

    # --- Data -------------------------------------------------------------------------------------------------------
    # 300 training digits are held out as a validation set: the validation threshold rule and the retraining choose
    # on it, never on the test set.
    seed_everything(args.seed)
    x, y = load_digits("train")
    x_test, y_test = load_digits("test")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    x_val, y_val, x_train, y_train = x[order[:300]], y[order[:300]], x[order[300:]], y[order[300:]]
    x_val, y_val, x_test, y_test = x_val.to(device), y_val.to(device), x_test.to(device), y_test.to(device)
    say(f"train {len(x_train)}, validation {len(x_val)}, test {len(x_test)} digits")

    def loader() -> DataLoader:
        return DataLoader(
            TensorDataset(x_train, y_train), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(args.seed)
        )

    # ================================================================================================================
    # Part 1: radial-directional posteriors, structured pruning, export
    # ================================================================================================================
    # The prior's half-Cauchy scales (global 1e-4, local 5e-3: the paper's LeNet-5 setting) are small, so every
    # group's radius is pulled towards zero unless the data need it. pretrained=False: each layer starts from its own
    # He initialisation (the network is untrained anyway). kl_weight=1.0 trains the exact ELBO, as the paper does: the
    # sparsity comes from the prior, and down-weighting the KL (the RDP default is 0.03) weakens it.
    say()
    say("== Part 1: radial-directional posterior, structured pruning ==")
    rdp = varbnn.bayesianize(
        make_mlp(),
        varbnn.RadialDirectional(),
        varbnn.RadialDirectionalPrior(global_scale=1e-4, local_scale=5e-3),
        pretrained=False,
    )
    history = varbnn.fit(rdp, loader(), n_data=len(x_train), epochs=rdp_epochs, lr=3e-3, kl_weight=1.0, device=device,
                         progress=False)
    say(f"trained: last epoch NLL {history[-1]['nll']:.4f}, KL {history[-1]['kl']:.0f} nats")
    bayes_metrics = varbnn.evaluate(rdp, x_test, y_test, samples=samples, seed=args.seed, device=device)

    # The point model every export starts from: the posterior mode of each weight, as a plain network.
    example = x_test[:2]
    dense = varbnn.to_deterministic(rdp, "mode")
    dense_params, dense_flops = prune.count_parameters_and_flops(dense, example)

    # Scores: one per group, the log mode of its radius. The gap rule cuts each (layer, grouping) at the widest gap
    # between its sorted scores if that gap is at least 1 nat, and keeps everything otherwise: it removes only what is
    # clearly separated from the rest.
    scores = prune.unit_scores(rdp)
    say()
    say("group scores (log radius mode) per layer and grouping, and what the gap rule keeps")
    gap_keep = prune.select_units(rdp, threshold="gap")
    for (layer, grouping), value in scores.items():
        say(
            f"  layer {layer} {grouping + 's':<8} scores {float(value.min()):7.2f} .. {float(value.max()):6.2f}, "
            f"gap rule keeps {int(gap_keep[(layer, grouping)].sum())}/{value.numel()}"
        )
    gap_model, gap_report = prune.export(rdp, example, keep=gap_keep)
    # The first layer's column groups are the 64 input pixels. Which ones did the prior switch off?
    pixels = gap_keep[("0", "column")].cpu()
    if not pixels.all():
        removed, kept = float(x_train[:, ~pixels].mean()), float(x_train[:, pixels].mean())
        say(
            f"the {int((~pixels).sum())} input pixels the gap rule removes have mean intensity {removed:.4f} on the "
            f"training digits; the kept ones {kept:.4f}"
        )

    # The validation rule starts from the gap rule and removes more of the lowest-scored groups while the exported
    # model's validation error stays within `tolerance` (here 1 percentage point) of the unpruned point model's.
    val_keep, val_search = prune.validation_thresholds(rdp, x_val, y_val, tolerance=0.01)
    val_model, val_report = prune.export(rdp, example, keep=val_keep)
    say(
        f"validation rule: validation error {val_search['base_error']:.3f} unpruned -> {val_search['error']:.3f} "
        f"pruned ({val_search['evaluations']} exported models tried)"
    )

    # export's promise: the small model computes exactly what the dense point model computes with the removed units
    # zeroed out (masked_model). Check it on the test inputs.
    with torch.no_grad():
        export_gap = float((val_model(x_test) - prune.masked_model(rdp, val_report)(x_test)).abs().max())
    say(f"largest |exported - masked dense| output difference on the test set: {export_gap:.2e}")

    # The exported model is an ordinary nn.Sequential: retrain it briefly (prune.finetune keeps the epoch with the
    # lowest validation error, so it never ends worse on the validation set than it started).
    retrained, retrain_log = prune.finetune(
        copy.deepcopy(val_model),
        (x_train.to(device), y_train.to(device)),
        (x_val, y_val),
        epochs=retrain_epochs,
        lr=1e-3,
        seed=args.seed,
    )
    say(f"retraining kept epoch {retrain_log['epoch']} (validation error {retrain_log['validation_error']:.3f})")

    say()
    say("architecture = inputs-hidden1-hidden2 kept; FLOPs by Oh et al.'s count ((inputs + 1) * outputs per layer)")
    say(f"{'model':<40}{'architecture':>14}{'parameters':>12}{'FLOPs':>9}{'test acc':>10}")
    rows = [
        ("Bayesian predictive (dense, sampled)", "64-100-100", dense_params, dense_flops, bayes_metrics["accuracy"]),
        ("point model (posterior mode, dense)", "64-100-100", dense_params, dense_flops, accuracy(dense, x_test, y_test)),
        ("exported, gap rule", gap_report["architecture"], gap_report["parameters"], gap_report["flops"],
         accuracy(gap_model, x_test, y_test)),
        ("exported, validation rule", val_report["architecture"], val_report["parameters"], val_report["flops"],
         accuracy(val_model, x_test, y_test)),
        ("exported, validation rule, retrained", val_report["architecture"], val_report["parameters"],
         val_report["flops"], accuracy(retrained, x_test, y_test)),
    ]  # fmt: skip
    for name, arch, params, flops, acc in rows:
        say(f"{name:<40}{arch:>14}{params:>12,}{flops:>9,}{acc:>10.4f}")
    counted = prune.count_parameters_and_flops(val_model, example)
    say(f"count_parameters_and_flops of the exported model: {counted[0]:,} parameters, {counted[1]:,} FLOPs")
    say(f"the exported model: {val_model}")

    # Figure 1: the score histograms (paper Fig. 7), gap-rule threshold dashed red, validation-rule threshold dotted.
    histograms = prune.score_histograms(
        rdp,
        out / "pruning.png",
        second=val_search["thresholds"],
        title="RDP group scores: gap rule (red dashed), validation rule (green dotted)",
    )

    # ================================================================================================================
    # Part 2: Graves' weight pruning of a mean-field network
    # ================================================================================================================
    # A MeanField network at the library's defaults (KL weight 0.1). prune_by_density_ratio(model, lambda) fixes every
    # weight with |mu| / sigma < lambda at zero, in place -- so prune a copy for each lambda. SAFE_LAMBDA = sqrt(ln 2)
    # ~= 0.83 is Graves' rule of thumb (a pruned weight is less probable than an average draw).
    say()
    say("== Part 2: mean-field posterior, Graves' density-ratio pruning ==")
    seed_everything(args.seed)
    meanfield = varbnn.bayesianize(make_mlp())
    history = varbnn.fit(meanfield, loader(), n_data=len(x_train), epochs=mf_epochs, lr=3e-3, device=device, progress=False)
    say(f"trained: last epoch NLL {history[-1]['nll']:.4f}, KL {history[-1]['kl']:.0f} nats")
    say(f"{'lambda':>8}{'weights kept':>14}{'fraction':>10}{'test acc':>10}{'test NLL':>10}")
    sweep = []
    for lam in (0.0, 0.5, prune.SAFE_LAMBDA, 1.0, 1.5, 2.0, 3.0):
        pruned = copy.deepcopy(meanfield)
        result = prune.prune_by_density_ratio(pruned, lam)
        m = varbnn.evaluate(pruned, x_test, y_test, samples=samples, seed=args.seed, device=device)
        sweep.append({"lambda": lam, "fraction": result["fraction"], "kept": result["kept"], **m})
        say(f"{lam:>8.3f}{result['kept']:>14,}{result['fraction']:>10.3f}{m['accuracy']:>10.4f}{m['nll']:>10.4f}")

    # To ship it: export_sparse gives a plain model at the posterior mode with the pruned weights exactly zero, and
    # its state dict with the weight matrices as sparse tensors.
    safe = copy.deepcopy(meanfield)
    prune.prune_by_density_ratio(safe, prune.SAFE_LAMBDA)
    sparse_model, sparse_state = prune.export_sparse(safe)
    nonzero, total = prune.count_nonzero_weights(sparse_model)
    say(
        f"export_sparse at lambda = SAFE_LAMBDA: {nonzero:,} of {total:,} parameters nonzero; "
        f"plain model test accuracy {accuracy(sparse_model, x_test, y_test):.4f}; "
        f"sparse tensors in its state dict: {sum(v.is_sparse for v in sparse_state.values())}"
    )

    # Figure 2: accuracy against the fraction of weights kept.
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot([s["fraction"] for s in sweep], [s["accuracy"] for s in sweep], marker="o")
    for s in sweep:
        ax.annotate(f"{s['lambda']:.2g}", (s["fraction"], s["accuracy"]), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set(
        xscale="log",
        xlabel="fraction of weights kept (log scale)",
        ylabel="test accuracy",
        title="Graves: keep |mu| / sigma >= lambda (points labelled by lambda)",
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    density_figure = out / "pruning_density.png"
    fig.savefig(density_figure, dpi=110)
    plt.close(fig)

    say()
    say(f"figures: {histograms.name}, {density_figure.name}")
    say(f"finished in {time.perf_counter() - started:.1f} s")
    (out / "pruning.txt").write_text("\n".join(lines) + "\n")
    return {
        "dense": {"parameters": dense_params, "flops": dense_flops},
        "gap": gap_report, "validation": val_report, "validation_search": val_search,
        "table": [dict(zip(("model", "architecture", "parameters", "flops", "accuracy"), row)) for row in rows],
        "export_difference": export_gap, "counted": counted, "sweep": sweep,
        "sparse": {"nonzero": nonzero, "total": total},
        "figures": [histograms, density_figure], "transcript": out / "pruning.txt",
    }  # fmt: skip


if __name__ == "__main__":
    main()
