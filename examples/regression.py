"""Regression with aleatoric and epistemic uncertainty on a one-dimensional toy problem.

The data are ``y = sin(1.2 x) + 0.2 x + noise`` for ``x`` drawn uniformly from [-3, 3], where the noise is Gaussian
with a standard deviation that grows from 0.05 at the left end to 0.35 at the right end. Two kinds of uncertainty
matter here:

* **aleatoric** -- the noise in the data. More data does not remove it; a good model learns its size, and where it
  varies with ``x`` (heteroscedastic noise) a good model learns that too.
* **epistemic** -- the model's uncertainty about the function itself. It is small where there is data and should
  grow away from it, where many functions fit the training set equally well.

Three models are fitted, all with :func:`varbnn.fit` and a likelihood object from :mod:`varbnn.likelihoods`:

1. a plain network with :class:`~varbnn.likelihoods.HeteroscedasticGaussian` (it outputs a mean and a log-variance):
   aleatoric uncertainty only;
2. a Bayesian network with :class:`~varbnn.likelihoods.Gaussian` with a learned noise level (one number for all
   ``x``): epistemic uncertainty plus a constant aleatoric one;
3. a Bayesian network with :class:`~varbnn.likelihoods.HeteroscedasticGaussian`: both kinds, the aleatoric one
   depending on ``x``.

:func:`varbnn.predict` draws the networks' outputs under many weight samples; the likelihood's
:meth:`~varbnn.likelihoods.Likelihood.summary` (or :func:`varbnn.regression_summary`) turns them into a predictive
mean, an aleatoric variance and an epistemic variance (the variance of the mean over weight draws). We score the
models on fresh data from the training range and on data from outside it (extrapolation), and plot the bands.

Run ``python examples/regression.py --help`` for the options; ``--quick`` is the seconds-long form the test suite
runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # write files, no window
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import varbnn  # noqa: E402
from varbnn.likelihoods import Gaussian, HeteroscedasticGaussian  # noqa: E402
from varbnn.training import resolve_device, seed_everything

TRAIN_RANGE = (-3.0, 3.0)
PLOT_RANGE = (-6.0, 6.0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few epochs only (what the test suite runs)")
    parser.add_argument("--out", default="varbnn-results/tutorials", help="folder for the figure and the printed output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    return parser.parse_args(argv)


def true_function(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(1.2 * x) + 0.2 * x


def noise_std(x: torch.Tensor) -> torch.Tensor:
    """The data's noise level: 0.05 at x = -3, rising linearly to 0.35 at x = 3 (kept at >= 0.05 beyond)."""
    return (0.05 + 0.05 * (x - TRAIN_RANGE[0])).clamp_min(0.05)


def make_data(n: int, low: float, high: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points: inputs ``[n, 1]`` uniform on [low, high], targets ``[n]``."""
    x = low + (high - low) * torch.rand(n, 1, generator=generator)
    y = true_function(x) + noise_std(x) * torch.randn(n, 1, generator=generator)
    return x, y.squeeze(-1)


def make_net(outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, outputs))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str = "") -> None:  # print, and keep the line for regression.txt
        print(text, flush=True)
        lines.append(text)

    device = resolve_device(args.device)
    epochs, samples = (60, 32) if args.quick else (600, 200)
    say(f"varbnn {varbnn.__version__}, torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s)")
    say(f"epochs {epochs}, Monte Carlo samples {samples}, seed {args.seed}")

    # --- Data -------------------------------------------------------------------------------------------------------
    # 300 training points on [-3, 3]; 1,000 fresh test points from the same range, and 1,000 from 3 < |x| < 5, where
    # no training point lies (half on each side).
    generator = torch.Generator().manual_seed(args.seed)
    x_train, y_train = make_data(300, *TRAIN_RANGE, generator)
    x_test, y_test = make_data(1000, *TRAIN_RANGE, generator)
    left, right = make_data(500, -5.0, -3.0, generator), make_data(500, 3.0, 5.0, generator)
    x_far, y_far = torch.cat([left[0], right[0]]), torch.cat([left[1], right[1]])
    say(f"train {len(x_train)} points on [-3, 3]; test {len(x_test)} on [-3, 3]; extrapolation {len(x_far)} on 3 < |x| < 5")

    # --- Three models -----------------------------------------------------------------------------------------------
    # A likelihood is an object: fit trains its parameters (Gaussian's learned log noise std) along with the network's,
    # and the same object then scores and summarises the predictions. HeteroscedasticGaussian has no parameters of its
    # own: the network's second output is the log-variance.
    seed_everything(args.seed)
    models = {
        "plain, heteroscedastic": (make_net(2), HeteroscedasticGaussian()),
        "Bayesian, learned constant noise": (varbnn.bayesianize(make_net(1)), Gaussian()),
        "Bayesian, heteroscedastic": (varbnn.bayesianize(make_net(2)), HeteroscedasticGaussian()),
    }

    # --- Training ---------------------------------------------------------------------------------------------------
    # Loss = mean NLL of the batch + beta * KL / 300 (beta: MeanField's default KL weight, 0.1; the plain network has
    # no KL). A small learning rate keeps the heteroscedastic fits stable: when the log-variance output runs ahead of
    # the mean, the model can explain everything as noise.
    for name, (model, likelihood) in models.items():
        loader = DataLoader(
            TensorDataset(x_train, y_train), batch_size=50, shuffle=True, generator=torch.Generator().manual_seed(args.seed)
        )
        history = varbnn.fit(
            model, loader, n_data=len(x_train), epochs=epochs, lr=3e-3, likelihood=likelihood, device=device, progress=False
        )
        learned = f", learned noise std {likelihood.noise_std.item():.3f}" if isinstance(likelihood, Gaussian) else ""
        say(f"{name:<34} last epoch: NLL {history[-1]['nll']:.4f}, KL {history[-1]['kl']:.0f} nats{learned}")

    # --- Scores -----------------------------------------------------------------------------------------------------
    # evaluate(likelihood=...) gives the RMSE of the predictive mean, the NLL of the Monte Carlo predictive
    # -mean_n log (1/S) sum_s p(y_n | f_s(x_n)) and the mean predictive std. The NLL is the one that rewards honest
    # uncertainty: far from the data a confident wrong mean costs a lot.
    say()
    say(f"{'model':<34}{'inputs':<15}{'RMSE':>8}{'NLL':>9}{'mean std':>10}")
    scores: dict[str, dict[str, dict[str, float]]] = {}
    for name, (model, likelihood) in models.items():
        draws = 1 if name.startswith("plain") else samples
        scores[name] = {}
        for split, (x, y) in (("train range", (x_test, y_test)), ("extrapolation", (x_far, y_far))):
            m = varbnn.evaluate(model, x, y, likelihood=likelihood, samples=draws, seed=args.seed, device=device)
            scores[name][split] = m
            say(f"{name:<34}{split:<15}{m['rmse']:>8.4f}{m['nll']:>9.3f}{m['mean_predictive_std']:>10.4f}")

    # --- The predictive on a grid -----------------------------------------------------------------------------------
    # predict stacks the outputs of `samples` weight draws: [samples, 481, outputs]. For the constant-noise model the
    # predictive is regression_summary(means, sigma^2): mean over draws, aleatoric variance sigma^2, epistemic variance
    # = variance of the means over draws. HeteroscedasticGaussian.summary does the same with the aleatoric variance
    # averaged over the draws' own variances exp(f_1).
    grid = torch.linspace(*PLOT_RANGE, 481).unsqueeze(-1)
    summaries = {}
    for name, (model, likelihood) in models.items():
        model.eval()
        draws = varbnn.predict(model, grid.to(device), samples=1 if name.startswith("plain") else samples, seed=args.seed)
        if isinstance(likelihood, Gaussian):
            summary = varbnn.regression_summary(draws.squeeze(-1), likelihood.noise_std.item() ** 2)
        else:
            summary = likelihood.summary(draws)
        summaries[name] = summary

    # Where the data are, the epistemic std should be small; beyond them, larger.
    g = grid.squeeze(-1)
    inside, outside = g.abs() <= 3.0, g.abs() >= 4.5
    say()
    say("mean std over the grid: epistemic where the data are (|x| <= 3) and far from them (|x| >= 4.5)")
    say(f"{'model':<34}{'epistemic in':>14}{'epistemic out':>15}{'ratio':>8}")
    epistemic = {}
    for name, s in summaries.items():
        std = s.epistemic_variance.sqrt().cpu()
        epistemic[name] = {"inside": float(std[inside].mean()), "outside": float(std[outside].mean())}
        e = epistemic[name]
        ratio = e["outside"] / e["inside"] if e["inside"] > 0 else float("nan")
        say(f"{name:<34}{e['inside']:>14.4f}{e['outside']:>15.4f}{ratio:>8.1f}")

    # The heteroscedastic models should recover the noise level that the data were made with.
    say()
    say("aleatoric std against the true noise std")
    points = (-2.0, 0.0, 2.0)
    say(f"{'model':<34}" + "".join(f"{f'x = {p:g}':>10}" for p in points))
    say(f"{'true noise':<34}" + "".join(f"{float(noise_std(torch.tensor(p))):>10.3f}" for p in points))
    aleatoric = {}
    for name, s in summaries.items():
        std = s.aleatoric_variance.sqrt().cpu()
        aleatoric[name] = [float(std[(g - p).abs().argmin()]) for p in points]
        say(f"{name:<34}" + "".join(f"{v:>10.3f}" for v in aleatoric[name]))

    # --- Figure -----------------------------------------------------------------------------------------------------
    # One panel per model: data, true function, predictive mean, a +-2 std band of the epistemic part (dark) and of the
    # total (light); and a last panel with the stds against x.
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    gx = g.numpy()
    for ax, (name, s) in zip(axes.flat, summaries.items()):
        mean = s.mean.cpu().numpy()
        epi, total = s.epistemic_variance.sqrt().cpu().numpy(), s.variance.sqrt().cpu().numpy()
        ax.fill_between(gx, mean - 2 * total, mean + 2 * total, color="tab:blue", alpha=0.2, label="total, +-2 std")
        ax.fill_between(gx, mean - 2 * epi, mean + 2 * epi, color="tab:blue", alpha=0.45, label="epistemic, +-2 std")
        ax.scatter(x_train.squeeze(-1).numpy(), y_train.numpy(), s=4, color="black", alpha=0.5, label="training data")
        ax.plot(gx, true_function(g).numpy(), color="tab:green", linewidth=1, label="true function")
        ax.plot(gx, mean, color="tab:blue", linewidth=1.5, label="predictive mean")
        ax.axvspan(PLOT_RANGE[0], TRAIN_RANGE[0], color="grey", alpha=0.08)
        ax.axvspan(TRAIN_RANGE[1], PLOT_RANGE[1], color="grey", alpha=0.08)
        ax.set(title=name, ylim=(-4, 4))
    axes[0][0].legend(fontsize=7, loc="upper left")
    ax = axes[1][1]
    ax.plot(gx, noise_std(g).numpy(), color="black", linestyle="--", label="true noise std")
    ax.plot(
        gx,
        summaries["Bayesian, heteroscedastic"].aleatoric_variance.sqrt().cpu().numpy(),
        color="tab:orange",
        label="aleatoric std (Bayesian, heteroscedastic)",
    )
    ax.plot(
        gx,
        summaries["plain, heteroscedastic"].aleatoric_variance.sqrt().cpu().numpy(),
        color="tab:orange",
        linestyle=":",
        label="aleatoric std (plain, heteroscedastic)",
    )
    for name, colour in (("Bayesian, heteroscedastic", "tab:blue"), ("Bayesian, learned constant noise", "tab:purple")):
        ax.plot(gx, summaries[name].epistemic_variance.sqrt().cpu().numpy(), color=colour, label=f"epistemic std ({name})")
    ax.axvspan(PLOT_RANGE[0], TRAIN_RANGE[0], color="grey", alpha=0.08)
    ax.axvspan(TRAIN_RANGE[1], PLOT_RANGE[1], color="grey", alpha=0.08)
    ax.set(title="standard deviations (grey: no training data)", yscale="log", xlabel="x")
    ax.legend(fontsize=7, loc="upper left")
    axes[1][0].set_xlabel("x")
    fig.tight_layout()
    figure = out / "regression.png"
    fig.savefig(figure, dpi=110)
    plt.close(fig)

    say()
    say(f"figure: {figure.name}")
    say(f"finished in {time.perf_counter() - started:.1f} s")
    (out / "regression.txt").write_text("\n".join(lines) + "\n")
    return {
        "scores": scores,
        "epistemic": epistemic,
        "aleatoric": aleatoric,
        "points": points,
        "figure": figure,
        "transcript": out / "regression.txt",
    }


if __name__ == "__main__":
    main()
