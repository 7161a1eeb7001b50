"""Converting a pretrained CNN: from a trained plain network to a Bayesian one, against temperature scaling.

You often have a trained network already. :func:`varbnn.bayesianize` converts it: every ``nn.Conv2d`` and
``nn.Linear`` becomes a Bayesian layer whose posterior means start at the trained weights (``pretrained=True``, the
default), so the converted network predicts like the original from the first step; a short fine-tuning with
:func:`varbnn.fit` then learns how uncertain each weight may be. ``report=True`` lists what was converted and what
was left deterministic.

The usual cheap alternative is temperature scaling (:class:`varbnn.calibration.TemperatureScaled`): one number ``T``
divides the logits, fitted on held-out data. It fixes over- or under-confidence without touching the accuracy, but
it cannot make the network more uncertain on some inputs than on others beyond what the logits already say.

Here a small CNN is trained on scikit-learn's 8x8 digits (as 1x8x8 images; offline), converted and fine-tuned, and
the three models -- plain, plain + temperature, Bayesian -- are compared on test-set calibration and on telling test
digits from four kinds of inputs they were never trained on.

Run ``python examples/pretrained_cnn.py --help`` for the options; ``--quick`` is the seconds-long form the test suite
runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
import varbnn.plots
from varbnn.calibration import TemperatureScaled
from varbnn.data import load_digits
from varbnn.metrics import auroc
from varbnn.predict import ClassificationSummary
from varbnn.training import resolve_device, seed_everything


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few epochs only (what the test suite runs)")
    parser.add_argument("--out", default="varbnn-results/tutorials", help="folder for the figure and the printed output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    return parser.parse_args(argv)


def make_cnn() -> nn.Sequential:
    """Two 3x3 convolutions (16 and 32 channels), 2x2 max-pooling, a dense layer of 64 units, 10 logits.

    No batch normalisation, on purpose: bayesianize would leave it deterministic, but after a Bayesian convolution its
    running statistics average over weight draws, so in eval mode each draw is normalised with statistics that are
    not its own (see the tutorial page)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str = "") -> None:  # print, and keep the line for pretrained_cnn.txt
        print(text, flush=True)
        lines.append(text)

    device = resolve_device(args.device)
    pretrain_epochs, finetune_epochs, samples = (4, 2, 4) if args.quick else (40, 150, 64)
    say(f"varbnn {varbnn.__version__}, torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s)")
    say(
        f"pretraining {pretrain_epochs} epochs, fine-tuning {finetune_epochs} epochs, Monte Carlo samples {samples}, "
        f"seed {args.seed}"
    )

    # --- Data -------------------------------------------------------------------------------------------------------
    # The digits as 1x8x8 images. 300 training images are held out as a validation set: temperature scaling must be
    # fitted on data the network was not trained on (never on the test set).
    seed_everything(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    x, y = load_digits("train")
    x_test, y_test = load_digits("test")
    x, x_test = x.view(-1, 1, 8, 8), x_test.view(-1, 1, 8, 8)
    order = torch.randperm(len(x), generator=generator)
    x_val, y_val = x[order[:300]], y[order[:300]]
    x_train, y_train = x[order[300:]], y[order[300:]]
    # Inputs of kinds never seen in training (out of distribution, OOD), all made from the test digits except noise.
    ood = {
        "rotated 90 degrees": torch.rot90(x_test, 1, dims=(2, 3)),
        "inverted (1 - x)": 1.0 - x_test,
        "pixels shuffled": x_test.flatten(1)[:, torch.randperm(64, generator=generator)].view(-1, 1, 8, 8),
        "uniform noise": torch.rand(len(x_test), 1, 8, 8, generator=generator),
    }
    say(f"train {len(x_train)}, validation {len(x_val)}, test {len(x_test)} images; OOD sets: {', '.join(ood)}")

    def loader() -> DataLoader:
        return DataLoader(
            TensorDataset(x_train, y_train), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(args.seed)
        )

    # --- 1. The "pretrained" plain CNN ------------------------------------------------------------------------------
    # Any training loop would do; fit with a plain network is ordinary cross-entropy training (no KL term).
    cnn = make_cnn()
    varbnn.fit(cnn, loader(), n_data=len(x_train), epochs=pretrain_epochs, lr=3e-3, device=device, progress=False)

    # --- 2. Temperature scaling -------------------------------------------------------------------------------------
    # TemperatureScaled(cnn) wraps the network (it is not copied or changed); .fit finds the T that minimises the
    # validation NLL. T > 1 means the network was overconfident, T < 1 underconfident.
    scaled = TemperatureScaled(cnn).fit(x_val.to(device), y_val.to(device))
    say(f"temperature fitted on the validation set: T = {float(scaled.temperature):.3f}")

    # --- 3. Conversion ----------------------------------------------------------------------------------------------
    # bayesianize deep-copies the CNN (cnn itself is untouched) and gives every weight a mean-field Gaussian posterior
    # N(mu, sigma^2) with mu = the trained weight and sigma = 0.01, under a Normal(0, 1) prior. The report says what
    # became Bayesian and what stayed deterministic: here nothing (ReLU, pooling and Flatten own no parameters). In
    # other networks it would list normalisation layers (left deterministic on purpose) and any module with parameters
    # that has no Bayesian form (also warned about; strict=True makes that an error).
    bayes, report = varbnn.bayesianize(cnn, report=True)
    say()
    say(str(report))

    # Right after conversion the Bayesian CNN predicts like the plain one: its means ARE the trained weights. For
    # contrast, pretrained=False starts each layer from a fresh initialisation (what you want for training from
    # scratch, not for converting a trained network).
    fresh = varbnn.bayesianize(cnn, pretrained=False)
    before = {
        "plain CNN": varbnn.evaluate(cnn, x_test, y_test, samples=1, device=device),
        "converted, pretrained=True": varbnn.evaluate(bayes, x_test, y_test, samples=samples, seed=args.seed, device=device),
        "converted, pretrained=False": varbnn.evaluate(fresh, x_test, y_test, samples=samples, seed=args.seed, device=device),
    }
    say()
    say("test accuracy right after conversion, before any fine-tuning")
    for name, m in before.items():
        say(f"  {name:<30}{m['accuracy']:.4f}")

    # --- 4. Fine-tuning ---------------------------------------------------------------------------------------------
    # The ELBO with MeanField's default KL weight (0.1). The posterior stds start at 0.01 and Adam moves their
    # parameters by about the learning rate per step, so they need a few thousand steps to reach their size.
    # fit's after-training check stays quiet here: the NLL of a converted trained network is far below that of
    # predicting the label frequencies from its first epoch, so a posterior near its prior is not a collapse.
    history = varbnn.fit(bayes, loader(), n_data=len(x_train), epochs=finetune_epochs, lr=3e-3, device=device, progress=False)
    say()
    say(
        f"fine-tuning: first epoch NLL {history[0]['nll']:.4f}, KL {history[0]['kl']:.0f} nats; "
        f"last epoch NLL {history[-1]['nll']:.4f}, KL {history[-1]['kl']:.0f} nats"
    )

    # --- 5. Comparison ----------------------------------------------------------------------------------------------
    models = {"plain CNN": (cnn, 1), "plain + temperature": (scaled, 1), "Bayesian CNN": (bayes, samples)}
    metrics = {name: varbnn.evaluate(model, x_test, y_test, samples=draws, seed=args.seed, device=device)
               for name, (model, draws) in models.items()}  # fmt: skip
    say()
    say("test metrics (NLL in nats; lower is better except accuracy)")
    say(f"{'model':<22}{'accuracy':>10}{'NLL':>9}{'ECE':>9}{'Brier':>9}")
    for name, m in metrics.items():
        say(f"{name:<22}{m['accuracy']:>10.4f}{m['nll']:>9.4f}{m['ece']:>9.4f}{m['brier']:>9.4f}")

    # OOD detection: score every input by its predictive entropy (for the Bayesian CNN also by the mutual information,
    # the epistemic part) and measure by the AUROC how well the score ranks OOD inputs above test digits.
    def summarise(model: nn.Module, inputs: torch.Tensor, draws: int) -> ClassificationSummary:
        model.eval()
        return varbnn.classification_summary(varbnn.predict(model, inputs.to(device), samples=draws, seed=args.seed))

    summaries = {name: {"test": summarise(model, x_test, draws), **{k: summarise(model, v, draws) for k, v in ood.items()}}
                 for name, (model, draws) in models.items()}  # fmt: skip
    is_ood = torch.cat([torch.zeros(len(x_test)), torch.ones(len(x_test))])
    detection: dict[str, dict[str, float]] = {}
    say()
    say("AUROC of telling OOD inputs from test digits by predictive entropy (0.5 = chance, 1 = perfect)")
    say(f"{'model':<22}" + "".join(f"{k:>20}" for k in ood))
    rows = [(name, "predictive_entropy") for name in models] + [("Bayesian CNN", "mutual_information")]
    for name, field in rows:
        label = name if field == "predictive_entropy" else "Bayesian CNN, MI"
        detection[label] = {
            k: auroc(torch.cat([getattr(summaries[name][s], field).cpu() for s in ("test", k)]), is_ood) for k in ood
        }
        say(f"{label:<22}" + "".join(f"{detection[label][k]:>20.4f}" for k in ood))

    # --- Figure -----------------------------------------------------------------------------------------------------
    # Reliability diagrams on the test set (top) and entropy histograms of test digits vs pixel-shuffled digits (bottom).
    shown = "pixels shuffled"
    figure = varbnn.plots.overview_figure(
        predictions={name: (summaries[name]["test"].probs.cpu(), y_test) for name in models},
        entropies={
            name: (summaries[name]["test"].predictive_entropy.cpu(), summaries[name][shown].predictive_entropy.cpu())
            for name in models
        },
        path=out / "pretrained_cnn.png",
        title=f"digits CNN: plain, temperature-scaled, converted to Bayesian (OOD: {shown})",
    )
    say()
    say(f"figure: {figure.name}")
    say(f"finished in {time.perf_counter() - started:.1f} s")
    (out / "pretrained_cnn.txt").write_text("\n".join(lines) + "\n")
    validation_nll = {
        "plain CNN": varbnn.evaluate(cnn, x_val, y_val, samples=1, device=device)["nll"],
        "plain + temperature": varbnn.evaluate(scaled, x_val, y_val, samples=1, device=device)["nll"],
    }
    return {
        "report": report,
        "before": before,
        "metrics": metrics,
        "auroc": detection,
        "validation_nll": validation_nll,
        "temperature": float(scaled.temperature),
        "figure": figure,
        "transcript": out / "pretrained_cnn.txt",
    }


if __name__ == "__main__":
    main()
