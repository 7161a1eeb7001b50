"""Calibrated fine-tuning of a pretrained network: plain LoRA, LoRA + temperature scaling, variational adapters.

Most networks are fine-tuned, not trained from scratch, and a network fine-tuned on a few labelled examples is
typically over-confident. :func:`varbnn.adapters.add_adapters` fine-tunes through low-rank adapters (LoRA: each
chosen ``nn.Linear`` computes ``W x + B A x`` with the pretrained ``W`` frozen) and, by default, puts a variational
posterior on ``A`` (MeanField, BLoB's parameterisation); ``family=varbnn.Delta()`` gives plain LoRA. The adapted
model is an ordinary varbnn model: :func:`varbnn.fit` trains it (here early-stopped on a validation split),
:func:`varbnn.predict` averages its weight draws, and
:class:`varbnn.calibration.TemperatureScaled` rescales it.

Here a small MLP is pretrained on scikit-learn's 8x8 digits 0-4 (offline), then fine-tuned to tell the digits 5-9
apart from only 100 labelled images (20 per class), with a fresh 5-way head. Four fine-tuned models are compared on
the test digits 5-9: plain LoRA, plain LoRA with a temperature fitted on the validation split, variational adapters,
and variational adapters with a temperature. A fifth kind of input, the test digits 0-4 (classes the new head does
not have), measures how well each model's predictive entropy flags inputs from outside its task.

Run ``python examples/calibrated_finetuning.py --help`` for the options; ``--quick`` is the seconds-long form the test
suite runs.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
import varbnn.plots
from varbnn.adapters import add_adapters, merge_adapters
from varbnn.calibration import TemperatureScaled
from varbnn.data import load_digits
from varbnn.metrics import auroc
from varbnn.predict import ClassificationSummary
from varbnn.priors import Uniform
from varbnn.training import resolve_device, seed_everything


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few epochs only (what the test suite runs)")
    parser.add_argument("--out", default="varbnn-results/tutorials", help="folder for the figure and the printed output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    return parser.parse_args(argv)


def make_mlp(classes: int = 5) -> nn.Sequential:
    """The pretrained network: 64 pixels -> 128 -> 128 units (ReLU) -> ``classes`` logits; ``"4"`` is the head."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, classes))


def with_adapters(pretrained: nn.Sequential, variational: bool, seed: int) -> nn.Module:
    """A copy of ``pretrained`` with a fresh 5-way head and rank-4 adapters on its two hidden layers (frozen base).

    ``variational=False``: plain LoRA (``Delta()``, a point estimate; the ``Uniform()`` prior adds no penalty, as LoRA
    trains). ``True``: the default MeanField posterior over each adapter's ``A`` under a ``Normal(0, 1)`` prior."""
    net = copy.deepcopy(pretrained)
    torch.manual_seed(seed)
    net[4] = nn.Linear(128, 5)  # the new task's head, trained in full
    if variational:
        model = add_adapters(net, rank=4, include=["0", "2"])
    else:
        model = add_adapters(net, rank=4, include=["0", "2"], family=varbnn.Delta(), prior=Uniform())
        varbnn.set_sample_mode(model, "mode")  # a point mass: one pass per prediction, not draws that all agree
    model[4].requires_grad_(True)  # add_adapters froze every parameter the model had, the new head too
    return model


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str = "") -> None:  # print, and keep the line for calibrated_finetuning.txt
        print(text, flush=True)
        lines.append(text)

    device = resolve_device(args.device)
    pretrain_epochs, max_epochs, patience, samples = (10, 6, 3, 4) if args.quick else (100, 600, 60, 64)
    say(f"varbnn {varbnn.__version__}, torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s)")
    say(
        f"pretraining {pretrain_epochs} epochs; fine-tuning at most {max_epochs} epochs, early stopping patience "
        f"{patience}; Monte Carlo samples {samples}; seed {args.seed}"
    )

    # --- Data -------------------------------------------------------------------------------------------------------
    # Pretraining task: the digits 0-4. New task: the digits 5-9 (labels 0-4 of the new head), with 100 labelled
    # training images, 150 others as the validation split (early stopping and temperatures are fitted there, never on
    # the test set), and the test digits 5-9 for the scores. The test digits 0-4 are out of the new task.
    seed_everything(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    x, y = load_digits("train")
    x_test, y_test = load_digits("test")
    old, new = y < 5, y >= 5
    x_old, y_old = x[old], y[old]
    order = torch.randperm(int(new.sum()), generator=generator)
    x_new, y_new = x[new][order], y[new][order] - 5
    per_class = [torch.nonzero(y_new == c).flatten()[:20] for c in range(5)]  # 20 labelled images of each digit
    labelled = torch.cat(per_class)
    taken = set(labelled.tolist())
    rest = torch.tensor([i for i in range(len(x_new)) if i not in taken])
    x_train, y_train = x_new[labelled], y_new[labelled]
    x_val, y_val = x_new[rest[:150]], y_new[rest[:150]]
    x_task, y_task = x_test[y_test >= 5], y_test[y_test >= 5] - 5
    x_other = x_test[y_test < 5]
    say(
        f"pretraining on {len(x_old)} images of 0-4; fine-tuning on {len(x_train)} labelled images of 5-9, validation "
        f"{len(x_val)}, test {len(x_task)}; out of the task: {len(x_other)} test images of 0-4"
    )

    # --- 1. The pretrained network ----------------------------------------------------------------------------------
    torch.manual_seed(args.seed)
    pretrained = make_mlp()
    loader = DataLoader(TensorDataset(x_old, y_old), batch_size=64, shuffle=True, generator=generator)
    varbnn.fit(pretrained, loader, n_data=len(x_old), epochs=pretrain_epochs, lr=1e-3, device=device, progress=False)
    old_test = varbnn.evaluate(pretrained, x_test[y_test < 5], y_test[y_test < 5], samples=1, device=device)
    say(f"pretrained MLP, test accuracy on the digits 0-4: {old_test['accuracy']:.4f}")

    # --- 2. Fine-tuning through adapters ----------------------------------------------------------------------------
    # Both models train the same parts: rank-4 adapters on the two hidden layers plus the new head. fit's
    # validation= and early_stopping= keep the epoch with the lowest validation NLL (of the 8-draw predictive for the
    # variational adapters) and stop when it has not improved for `patience` epochs.
    models: dict[str, nn.Module] = {}
    for name, variational in (("LoRA", False), ("variational adapters", True)):
        model = with_adapters(pretrained, variational, args.seed).to(device)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        data = DataLoader(TensorDataset(x_train, y_train), batch_size=50, shuffle=True,
                          generator=torch.Generator().manual_seed(args.seed))  # fmt: skip
        t0 = time.perf_counter()
        with warnings.catch_warnings():  # plain LoRA in sample_mode "mode" is what we want: Delta has nothing to draw
            warnings.filterwarnings("ignore", "fit: the model's Bayesian layers are in sample_mode")
            history = varbnn.fit(model, data, n_data=len(x_train), epochs=max_epochs, lr=3e-3, device=device,
                                 validation=(x_val, y_val), early_stopping=patience, progress=False)  # fmt: skip
        best = min(history, key=lambda record: record["val_nll"])
        say(
            f"{name}: {trainable:,} trainable parameters; best validation NLL {best['val_nll']:.4f} at epoch "
            f"{history.index(best) + 1} of {len(history)}; {time.perf_counter() - t0:.1f} s"
        )
        models[name] = model

    # --- 3. Temperature scaling -------------------------------------------------------------------------------------
    # One number T divides the logits, chosen by the validation NLL of the model's own predictive (the mean of its
    # draws for the variational adapters). T > 1: the model was over-confident on the validation split.
    for name in ("LoRA", "variational adapters"):
        scaled = TemperatureScaled(models[name]).fit(x_val.to(device), y_val.to(device), samples=samples)
        models[f"{name} + temperature"] = scaled
        say(f"temperature of {name}: T = {float(scaled.temperature):.3f}")
    order = ("LoRA", "LoRA + temperature", "variational adapters", "variational adapters + temperature")
    models = {name: models[name] for name in order}

    # --- 4. Comparison ----------------------------------------------------------------------------------------------
    draws = {name: samples if name.startswith("variational") else 1 for name in models}
    metrics = {name: varbnn.evaluate(model, x_task, y_task, samples=draws[name], seed=args.seed, device=device)
               for name, model in models.items()}  # fmt: skip
    say()
    say("test metrics on the digits 5-9 (NLL in nats; lower is better except accuracy)")
    say(f"{'model':<36}{'accuracy':>10}{'NLL':>9}{'ECE':>9}{'Brier':>9}")
    for name, m in metrics.items():
        say(f"{name:<36}{m['accuracy']:>10.4f}{m['nll']:>9.4f}{m['ece']:>9.4f}{m['brier']:>9.4f}")

    # Out of the task: score every input by its predictive entropy; the AUROC says how well it ranks the digits 0-4
    # (which the new head has no class for) above the test digits 5-9.
    def summary(model: nn.Module, inputs: torch.Tensor, name: str) -> ClassificationSummary:
        model.eval()
        draws_ = varbnn.predict(model, inputs.to(device), samples=draws[name], seed=args.seed)
        return varbnn.classification_summary(draws_)

    summaries = {name: (summary(model, x_task, name), summary(model, x_other, name)) for name, model in models.items()}
    is_other = torch.cat([torch.zeros(len(x_task)), torch.ones(len(x_other))])
    detection = {name: auroc(torch.cat([s.predictive_entropy.cpu() for s in pair]), is_other) for name, pair in summaries.items()}
    say()
    say("AUROC of telling the digits 0-4 from the test digits 5-9 by predictive entropy (0.5 = chance, 1 = perfect)")
    for name, value in detection.items():
        say(f"  {name:<36}{value:.4f}")

    # --- 5. Deploying -----------------------------------------------------------------------------------------------
    # merge_adapters folds each adapter's posterior mean into its base weight: a plain MLP of the pretrained size. It
    # is the mean network, not the averaged predictive, so it keeps the accuracy but not the calibration of the draws.
    merged = merge_adapters(models["variational adapters"])
    merged_metrics = varbnn.evaluate(merged, x_task, y_task, samples=1, device=device)
    say()
    say(
        f"variational adapters merged into a plain MLP ({sum(p.numel() for p in merged.parameters()):,} parameters): "
        f"accuracy {merged_metrics['accuracy']:.4f}, NLL {merged_metrics['nll']:.4f}, ECE {merged_metrics['ece']:.4f}"
    )

    # --- Figure -----------------------------------------------------------------------------------------------------
    figure = varbnn.plots.overview_figure(
        predictions={name: (pair[0].probs.cpu(), y_task) for name, pair in summaries.items()},
        entropies={
            name: (pair[0].predictive_entropy.cpu(), pair[1].predictive_entropy.cpu()) for name, pair in summaries.items()
        },
        path=out / "calibrated_finetuning.png",
        title="MLP pretrained on digits 0-4, fine-tuned on 100 labels of 5-9 (OOD: test digits 0-4)",
    )
    say()
    say(f"figure: {figure.name}")
    say(f"finished in {time.perf_counter() - started:.1f} s")
    (out / "calibrated_finetuning.txt").write_text("\n".join(lines) + "\n")
    validation_nll = {name: varbnn.evaluate(model, x_val, y_val, samples=draws[name], seed=args.seed, device=device)["nll"]
                      for name, model in models.items()}  # fmt: skip
    return {
        "pretrained_accuracy": old_test["accuracy"],
        "metrics": metrics,
        "auroc": detection,
        "validation_nll": validation_nll,
        "merged": merged_metrics,
        "temperatures": {
            name: float(model.temperature) for name, model in models.items() if isinstance(model, TemperatureScaled)
        },
        "models": models,
        "pretrained": pretrained,
        "figure": figure,
        "transcript": out / "calibrated_finetuning.txt",
    }


if __name__ == "__main__":
    main()
