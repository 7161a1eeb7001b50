"""Median training-step time of MLP 784-400-400-10 (batch 128, Adam) per family/estimator vs deterministic.

Usage: python benchmarks/step_time.py [--steps 100] [--warmup 20] [--threads 2] [--out benchmarks/results]
Writes OUT/step_time.json and OUT/step_time.md and prints the ratios. Peers (bayesian-torch, torchbnn) are
included when importable (``pip install -e .[peers]``), in the same process and on the same model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import varbnn
from varbnn.experiments.runner import describe_device, git_commit
from varbnn.models import mlp

N_TRAIN = 60000


def make_step(
    model: nn.Module, kl_fn: Callable[[], torch.Tensor] | None, elbo: bool = False
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One Adam step on ``nll + kl / N``: varbnn models through ``varbnn.elbo_loss`` (``elbo``; it also adds the
    RDP rejection-score term), peers with their own KL function."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        nll = F.cross_entropy(model(x), y)
        if elbo:
            loss = varbnn.elbo_loss(nll, model, N_TRAIN).loss
        else:
            loss = nll + kl_fn() / N_TRAIN if kl_fn is not None else nll
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def time_steps(step: Callable[[torch.Tensor, torch.Tensor], None], steps: int, warmup: int) -> list[float]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(128, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (128,), generator=g)
    for _ in range(warmup):
        step(x, y)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t0)
    return times


def candidates() -> dict[str, Callable[[], Callable[[torch.Tensor, torch.Tensor], None]]]:
    def plain() -> Callable[[torch.Tensor, torch.Tensor], None]:
        return make_step(mlp(784, (400, 400), 10), None)

    def family(
        spec: Callable[[], varbnn.VariationalFamily], prior: Callable[[], varbnn.priors.Prior] | None = None
    ) -> Callable[[], Callable[[torch.Tensor, torch.Tensor], None]]:
        def build() -> Callable[[torch.Tensor, torch.Tensor], None]:
            model = varbnn.bayesianize(mlp(784, (400, 400), 10), spec(), prior() if prior else None)
            return make_step(model, None, elbo=True)

        return build

    table: dict[str, Callable[[], Callable[[torch.Tensor, torch.Tensor], None]]] = {
        "deterministic": plain,
        "varbnn Delta (MAP, Normal prior)": family(lambda: varbnn.Delta()),
    }
    for estimator in ("reparam", "local", "flipout"):
        table[f"varbnn MeanField-{estimator}"] = family(lambda e=estimator: varbnn.MeanField(estimator=e))
    for estimator in ("reparam", "local"):
        table[f"varbnn KTied(rank=2)-{estimator}"] = family(lambda e=estimator: varbnn.KTied(rank=2, estimator=e))
    table["varbnn Radial-reparam (MC cross-entropy)"] = family(lambda: varbnn.Radial())
    table["varbnn Radial-reparam (closed-form cross-entropy)"] = family(lambda: varbnn.Radial(cross_entropy="closed_form"))
    table["varbnn Radial-flipout (MC cross-entropy)"] = family(lambda: varbnn.Radial(estimator="flipout"))
    for grouping in ("row", "double"):
        table[f"varbnn RadialDirectional({grouping})"] = family(
            lambda g=grouping: varbnn.RadialDirectional(grouping=g), varbnn.RadialDirectionalPrior
        )
    try:  # optional peers
        from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss

        for kind in ("Reparameterization", "Flipout"):

            def bt(kind: str = kind) -> Callable[[torch.Tensor, torch.Tensor], None]:
                model = mlp(784, (400, 400), 10)
                dnn_to_bnn(
                    model,
                    {
                        "prior_mu": 0.0,
                        "prior_sigma": 1.0,
                        "posterior_mu_init": 0.0,
                        "posterior_rho_init": -3.0,
                        "type": kind,
                        "moped_enable": False,
                    },
                )
                return make_step(model, lambda: get_kl_loss(model))

            table[f"bayesian-torch {kind}"] = bt
    except ImportError:
        pass
    try:
        import torchbnn

        def tb() -> Callable[[torch.Tensor, torch.Tensor], None]:
            model = nn.Sequential(
                nn.Flatten(),
                torchbnn.BayesLinear(0.0, 1.0, 784, 400),
                nn.ReLU(),
                torchbnn.BayesLinear(0.0, 1.0, 400, 400),
                nn.ReLU(),
                torchbnn.BayesLinear(0.0, 1.0, 400, 10),
            )
            kl = torchbnn.BKLLoss(reduction="sum", last_layer_only=False)
            return make_step(model, lambda: kl(model))

        table["torchbnn"] = tb
    except ImportError:
        pass
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the median over all steps is reported")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    builders = candidates()
    steps = {name: build() for name, build in builders.items()}
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):  # interleave so that machine noise hits every candidate alike
        for name, step in steps.items():
            samples[name] += time_steps(step, args.steps, args.warmup)
    base = statistics.median(samples["deterministic"])
    rows = []
    for name, times in samples.items():
        median = statistics.median(times)
        rows.append({"model": name, "median_ms": round(1000 * median, 3), "ratio": round(median / base, 2), "steps": len(times)})
        print(f"{name:40s} {1000 * median:8.2f} ms  {median / base:5.2f}x")
    result = {
        "name": "step_time",
        "command": " ".join(["python benchmarks/step_time.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": describe_device(torch.device("cpu")),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {
            "model": "MLP 784-400-400-10",
            "batch": 128,
            "optimizer": "Adam",
            "threads": args.threads,
            "steps": args.steps,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "torch": torch.__version__,
        },
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_time.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Training-step time, MLP 784-400-400-10, batch 128, Adam",
        "",
        f"- command: `{result['command']}`",
        f"- commit: `{result['commit']}`",
        f"- device: {result['device']}; torch {torch.__version__}",
        f"- wall time: {result['seconds']} s; median over {args.repeats} x {args.steps} steps after {args.warmup} warm-up steps",
        "",
        "| model | median step (ms) | ratio to deterministic |",
        "|---|---:|---:|",
        *[f"| {r['model']} | {r['median_ms']:.2f} | {r['ratio']:.2f}x |" for r in rows],
    ]
    (out / "step_time.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
