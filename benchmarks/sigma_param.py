"""What the softplus parameterisation of a Gaussian posterior's std costs per training step on the CPU (issue 29).

MeanField keeps ``sigma = softplus(rho)``: its KL needs ``sum log sigma``, so a step evaluates exp, log1p and log per
weight forward and recomputes exp and log1p backward (the compiled step's kernels, see ``profile_step.py``). Here the
per-weight work of one step of the MNIST MLP's weights (784x400, 400x400, 400x10 and the biases) is timed alone,
compiled by inductor as ``fit(compile=True)`` compiles it: the draw ``w = mu + sigma * eps``, the KL's sums
(``sum log sigma``, ``sum sigma^2``, ``sum (mu - m)^2``) and the backward from a fixed upstream gradient, for

* ``softplus``: ``sigma = softplus(rho)`` (MeanField's; Blundell et al. 2015);
* ``exp``: ``sigma = exp(rho)``, so that ``log sigma = rho`` (one transcendental forward, none new backward);

beside the floor's own per-weight work, one ``torch.randn`` per weight tensor. Not a family: a measurement of the
lever a parameterisation change would pull. Median of ``--repeats`` x ``--steps`` calls after a warm-up.

    .venv/bin/python benchmarks/sigma_param.py [--threads 2] [--steps 200] [--repeats 3]

Writes ``benchmarks/results/step-time/studies/sigma_param.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

OUT = ROOT / "benchmarks" / "results" / "step-time" / "studies"
SHAPES = ((400, 784), (400,), (400, 400), (400,), (10, 400), (10,))  # the MNIST MLP 784-400-400-10


def _step(param: str) -> Callable[..., None]:
    sigma_of = {"softplus": F.softplus, "exp": torch.exp}[param]

    def step(rhos: list[torch.Tensor], mus: list[torch.Tensor], eps: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        loss = torch.zeros(())
        for rho, mu, e, g in zip(rhos, mus, eps, grads):
            sigma = sigma_of(rho)
            log_sigma = rho if param == "exp" else sigma.log()
            w = mu + sigma * e
            kl = 0.5 * (sigma.square().sum() + mu.square().sum()) - log_sigma.sum()
            loss = loss + (w * g).sum() + kl / 60_000
        loss.backward()

    return torch.compile(step)


def _time(fn: Callable[[], None], steps: int, repeats: int) -> float:
    """Median milliseconds per call over ``repeats`` rounds of ``steps`` calls."""
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        rounds.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(rounds)


def timing_args(doc: str | None, argv: list[str] | None, repeats: int) -> argparse.Namespace:
    """``--threads`` / ``--steps`` / ``--repeats`` of a CPU micro-benchmark, parsed, with torch's threads set."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=repeats)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return args


def provenance(script: str, argv: list[str] | None) -> dict[str, Any]:
    """The command, commit, device and torch version a result file records."""
    from varbnn_lab.engine import describe_device, git_commit

    command = " ".join([f"python benchmarks/{script}", shlex.join(argv or sys.argv[1:])])  # quoted as a shell takes it
    device = describe_device(torch.device("cpu"))
    return {"command": command, "commit": git_commit(), "device": device, "torch": torch.__version__}


def header_lines(title: str, result: dict[str, Any], setting: str) -> list[str]:
    """A result page's title and its command, commit, device and ``setting`` lines."""
    return [
        f"# {title}", "", f"- command: `{result['command']}`", f"- commit: `{result['commit']}`",
        f"- device: {result['device']}", f"- torch {result['torch']}; {setting}; wall time {result['seconds']:.0f} s", "",
    ]  # fmt: skip


def write_result(out: Path, name: str, result: dict[str, Any], lines: list[str]) -> None:
    """``out/name.json`` (the result) and ``out/name.md`` (its page, also printed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    args = timing_args(__doc__, argv, repeats=3)
    start = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    mus = [(0.05 * torch.randn(s, generator=g)).requires_grad_() for s in SHAPES]
    eps = [torch.randn(s, generator=g) for s in SHAPES]
    grads = [torch.randn(s, generator=g) for s in SHAPES]
    rows: dict[str, float] = {}
    for param in ("softplus", "exp"):
        rhos = [torch.full(s, -4.6).requires_grad_() for s in SHAPES]  # sigma ~ 0.01 either way
        step = _step(param)

        def call(step: Callable[..., None] = step, rhos: list[torch.Tensor] = rhos) -> None:
            for t in (*rhos, *mus):
                t.grad = None
            step(rhos, mus, eps, grads)

        for _ in range(20):
            call()
        rows[f"sigma = {param}(rho): draw, KL sums, backward"] = _time(call, args.steps, args.repeats)
    draw = "torch.randn per weight tensor (the floor's draw)"
    rows[draw] = _time(
        lambda: [torch.randn(s) for s in SHAPES], args.steps, args.repeats
    )
    weights = sum(torch.Size(s).numel() for s in SHAPES)
    result: dict[str, Any] = {
        "name": "sigma_param", **provenance("sigma_param.py", argv), "weights": weights, "steps": args.steps,
        "repeats": args.repeats,
        "ms": rows, "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    softplus, exp = (rows[f"sigma = {p}(rho): draw, KL sums, backward"] for p in ("softplus", "exp"))
    lines = [
        *header_lines("sigma_param: the per-weight work of a Gaussian posterior step, softplus against exp", result,
                      f"{weights:,} weights (the MNIST MLP's); median of {args.repeats} x {args.steps} calls"),
        "| work per step (compiled by inductor) | ms |", "|---|---:|",
        *(f"| {name} | {ms:.3f} |" for name, ms in rows.items()), "",
        f"The softplus parameterisation's per-weight work costs {softplus / exp:.1f}x the exp parameterisation's "
        f"({softplus - exp:.2f} ms per step more), against {rows[draw]:.2f} ms "
        "for the floor's draw. A diagnostic for issue 29's 1.3x-of-floor target: MeanField keeps softplus.", "",
    ]  # fmt: skip
    write_result(OUT, "sigma_param", result, lines)


if __name__ == "__main__":
    main()
