"""Classification with uncertainty: a plain network against the same network made Bayesian.

We train a small multilayer perceptron on scikit-learn's 8x8 handwritten digits (bundled with scikit-learn, so this
runs offline), then train the *same* architecture with a mean-field Gaussian posterior over every weight:
:func:`varbnn.bayesianize` turns the plain ``nn.Module`` into a Bayesian one, :func:`varbnn.fit` maximises the
evidence lower bound, :func:`varbnn.predict` draws Monte Carlo predictions and :func:`varbnn.evaluate` scores them.

Three questions are asked of both networks:

1. **Are the predictions good and honest?** Accuracy, negative log-likelihood (NLL), expected calibration error (ECE)
   and Brier score on the test set. NLL, ECE and Brier reward a model whose confidence matches how often it is right.
2. **What kind of uncertainty is it?** The predictive entropy of the Bayesian network splits into the expected
   entropy of the individual weight draws (*aleatoric*: the digit itself is ambiguous) and the mutual information
   between the prediction and the weights (*epistemic*: the draws disagree, the model has not seen such inputs).
3. **Does it know what it does not know?** The test digits turned by 90 degrees are inputs of a kind the networks
   never saw. A useful uncertainty is higher on them than on ordinary test digits; we measure how well it tells the
   two apart by the AUROC (0.5: not at all, 1: perfectly).

Run ``python examples/classification.py --help`` for the options; ``--quick`` is the seconds-long form the test
suite runs.
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
from varbnn.data import load_digits
from varbnn.metrics import auroc
from varbnn.training import resolve_device, seed_everything


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few epochs only (what the test suite runs)")
    parser.add_argument("--out", default="varbnn-results/tutorials", help="folder for the figure and the printed output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    return parser.parse_args(argv)


def make_net() -> nn.Sequential:
    """64 pixels -> two hidden layers of 128 ReLU units -> 10 logits."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def rotate(images: torch.Tensor) -> torch.Tensor:
    """The flat 8x8 digits turned by 90 degrees: the out-of-distribution inputs."""
    return torch.rot90(images.view(-1, 8, 8), 1, dims=(1, 2)).reshape(-1, 64)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str = "") -> None:  # print, and keep the line for classification.txt
        print(text, flush=True)
        lines.append(text)

    device = resolve_device(args.device)
    epochs, samples = (5, 8) if args.quick else (150, 64)
    say(f"varbnn {varbnn.__version__}, torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s)")
    say(f"epochs {epochs}, Monte Carlo samples {samples}, seed {args.seed}")

    # --- Data -------------------------------------------------------------------------------------------------------
    # 1,347 training and 450 test digits, pixels scaled to [0, 1]. The split is fixed (stratified, seed 0).
    x_train, y_train = load_digits("train")
    x_test, y_test = load_digits("test")
    x_ood = rotate(x_test)
    say(f"train {tuple(x_train.shape)}, test {tuple(x_test.shape)}, rotated test {tuple(x_ood.shape)}")

    # --- Two networks from the same starting point ------------------------------------------------------------------
    # bayesianize deep-copies the network and replaces every nn.Linear by a BayesLinear whose weights have a
    # mean-field Gaussian posterior N(mu, sigma^2) and a Normal(0, 1) prior. With pretrained=True (the default) the
    # plain network's weights become the posterior means, so both networks start from the same initial weights.
    seed_everything(args.seed)
    plain = make_net()
    bayes = varbnn.bayesianize(plain)
    say(
        f"plain parameters {sum(p.numel() for p in plain.parameters()):,}; "
        f"Bayesian parameters {sum(p.numel() for p in bayes.parameters()):,} (a mean and a std per weight)"
    )

    # --- Training ---------------------------------------------------------------------------------------------------
    # fit minimises  mean NLL of the batch + beta * KL(q || prior) / N_train.  For the plain network the KL is zero
    # and this is ordinary cross-entropy training; for the Bayesian one beta is the family's default KL weight
    # (0.1 for MeanField; kl_weight=1.0 would be the exact ELBO). Both see the same batches in the same order.
    def loader() -> DataLoader:
        generator = torch.Generator().manual_seed(args.seed)
        return DataLoader(TensorDataset(x_train, y_train), batch_size=64, shuffle=True, generator=generator)

    for name, model in (("plain", plain), ("Bayesian", bayes)):
        history = varbnn.fit(model, loader(), n_data=len(x_train), epochs=epochs, lr=3e-3, device=device, progress=False)
        last = history[-1]
        say(
            f"{name:>8} last epoch: loss {last['loss']:.4f}, NLL {last['nll']:.4f}, KL {last['kl']:.0f} nats, "
            f"beta {last['beta']:g}"
        )

    # --- 1. Predictive performance ----------------------------------------------------------------------------------
    # evaluate averages the softmax over `samples` weight draws (the Monte Carlo predictive) before scoring it. A
    # plain network gives the same output every time, so one draw is all it has.
    results = {
        "plain": varbnn.evaluate(plain, x_test, y_test, samples=1, device=device),
        "bayesian": varbnn.evaluate(bayes, x_test, y_test, samples=samples, seed=args.seed, device=device),
    }
    say()
    say("test metrics (NLL in nats; lower is better except accuracy)")
    say(f"{'model':<10}{'accuracy':>10}{'NLL':>9}{'ECE':>9}{'Brier':>9}")
    for name, m in results.items():
        say(f"{name:<10}{m['accuracy']:>10.4f}{m['nll']:>9.4f}{m['ece']:>9.4f}{m['brier']:>9.4f}")

    # --- 2. Predictive entropy = aleatoric + epistemic --------------------------------------------------------------
    # predict returns the logits of every draw, [samples, N, 10]; classification_summary averages the softmax and
    # decomposes the predictive entropy H[p] into the mean entropy of the draws E_w H[p_w] (aleatoric) and the mutual
    # information I = H[p] - E_w H[p_w] (epistemic), all in nats.
    x_test_d, x_ood_d = x_test.to(device), x_ood.to(device)
    summaries = {}
    for name, model, draws in (("plain", plain, 1), ("bayesian", bayes, samples)):
        model.eval()  # eval() switches off dropout / batch-norm updates only: Bayesian layers keep sampling
        summaries[name] = {
            split: varbnn.classification_summary(varbnn.predict(model, inputs, samples=draws, seed=args.seed))
            for split, inputs in (("test", x_test_d), ("rotated", x_ood_d))
        }
    say()
    say("mean uncertainty per input, nats (entropy = aleatoric + epistemic)")
    say(f"{'model':<10}{'inputs':<10}{'entropy':>9}{'aleatoric':>11}{'epistemic':>11}")
    for name, by_split in summaries.items():
        for split, s in by_split.items():
            say(
                f"{name:<10}{split:<10}{float(s.predictive_entropy.mean()):>9.4f}"
                f"{float(s.expected_entropy.mean()):>11.4f}{float(s.mutual_information.mean()):>11.4f}"
            )

    # --- 3. Out-of-distribution detection ---------------------------------------------------------------------------
    # Score each input by its uncertainty and ask how well the score ranks rotated digits above ordinary ones.
    is_ood = torch.cat([torch.zeros(len(x_test)), torch.ones(len(x_ood))])

    def ood_auroc(name: str, field: str) -> float:
        scores = torch.cat([getattr(summaries[name][split], field).cpu() for split in ("test", "rotated")])
        return auroc(scores, is_ood)

    detection = {
        "plain, predictive entropy": ood_auroc("plain", "predictive_entropy"),
        "bayesian, predictive entropy": ood_auroc("bayesian", "predictive_entropy"),
        "bayesian, mutual information": ood_auroc("bayesian", "mutual_information"),
    }
    say()
    say("AUROC of telling rotated from ordinary test digits (0.5 = chance)")
    for label, value in detection.items():
        say(f"  {label:<30}{value:.4f}")

    # --- Figure -----------------------------------------------------------------------------------------------------
    # Top row: reliability diagrams (accuracy against confidence; the diagonal is perfect calibration).
    # Bottom row: histograms of the predictive entropy on test and rotated digits, with the AUROC.
    figure = varbnn.plots.overview_figure(
        predictions={
            "plain": (summaries["plain"]["test"].probs.cpu(), y_test),
            "Bayesian (mean-field)": (summaries["bayesian"]["test"].probs.cpu(), y_test),
        },
        entropies={
            "plain": tuple(summaries["plain"][s].predictive_entropy.cpu() for s in ("test", "rotated")),
            "Bayesian (mean-field)": tuple(summaries["bayesian"][s].predictive_entropy.cpu() for s in ("test", "rotated")),
        },
        path=out / "classification.png",
        title="digits: plain MLP vs the same MLP made Bayesian",
    )
    say()
    say(f"figure: {figure.name}")
    say(f"finished in {time.perf_counter() - started:.1f} s")
    (out / "classification.txt").write_text("\n".join(lines) + "\n")
    uncertainty = {
        name: {
            split: {"entropy": float(s.predictive_entropy.mean()), "mutual_information": float(s.mutual_information.mean())}
            for split, s in by_split.items()
        }
        for name, by_split in summaries.items()
    }
    return {
        "metrics": results,
        "uncertainty": uncertainty,
        "auroc": detection,
        "figure": figure,
        "transcript": out / "classification.txt",
    }


if __name__ == "__main__":
    main()
