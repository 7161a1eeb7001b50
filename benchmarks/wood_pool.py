"""What Wood's rejection sampler costs per RadialDirectional training step on the CPU, with a layer's shared
concentration drawn from one pool of proposals against the per-element rounds (issue 29).

A double-grouped RDP layer draws one vMF direction per row and one per column every step; on the CPU each needs
accepted Beta proposals from Wood's sampler (``varbnn.distributions.vmf.wood_accepted_proposals``), and each proposal
costs a Gamma draw. The six samplers of the MNIST MLP 784-400-400-10 (rows and columns of its three weights) are
timed at RDP's initial concentration (``init_resultant`` 0.95):

* ``pool``: the concentration shared by the layer's groups, as RDP passes it (``kappa.expand(groups)``): the accepted
  ones of one sequence of about 1.6 proposals per group, in order (``_wood_pool``);
* ``rounds``: the same value once per group (a materialised tensor): rounds of 8 proposals per group, then 4 per
  pending group, the path of a concentration per group (``shared_concentration=False``) and, before the pool, of every
  compiled CPU step (inductor passed the expanded concentration materialised).

Both give i.i.d. draws of the same distribution (tests/test_vmf.py). Median of ``--repeats`` interleaved rounds of
``--steps`` calls after a warm-up.

    .venv/bin/python benchmarks/wood_pool.py [--threads 2] [--steps 200] [--repeats 5]

Writes ``benchmarks/results/step-time/studies/wood_pool.json`` / ``.md``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from sigma_param import provenance, timing_args, write_result  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
OUT = ROOT / "benchmarks" / "results" / "step-time" / "studies"
# (groups, dim) of the MNIST MLP's weights: rows (out, in), then columns (in, out)
SAMPLERS = ((400, 784), (400, 400), (10, 400), (784, 400), (400, 400), (400, 10))


def main(argv: list[str] | None = None) -> None:
    args = timing_args(__doc__, argv, repeats=5)
    from varbnn.distributions.vmf import wood_accepted_proposals
    from varbnn.families.rdp import INIT_RESULTANT
    from varbnn.priors import banerjee_concentration

    start = time.perf_counter()
    kappas = [torch.tensor(banerjee_concentration(d, INIT_RESULTANT), dtype=torch.float64) for _, d in SAMPLERS]

    def step(shared: bool) -> Callable[[], None]:
        def call() -> None:
            for (groups, dim), kappa in zip(SAMPLERS, kappas):
                expanded = kappa.expand(groups)
                wood_accepted_proposals(dim, expanded if shared else expanded.contiguous())

        return call

    calls = {"pool": step(True), "rounds": step(False)}
    for call in calls.values():
        for _ in range(20):
            call()
    rounds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, call in calls.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                call()
            rounds[name].append((time.perf_counter() - t0) / args.steps * 1e3)
    ms = {name: statistics.median(values) for name, values in rounds.items()}
    result: dict[str, Any] = {
        "name": "wood_pool", **provenance("wood_pool.py", argv),
        "samplers": [list(s) for s in SAMPLERS], "init_resultant": INIT_RESULTANT, "steps": args.steps,
        "repeats": args.repeats, "ms_per_step": ms, "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    lines = [
        "# wood_pool: Wood's sampler per RDP (double) step of the MNIST MLP, shared pool against per-element rounds", "",
        f"- command: `{result['command']}`", f"- commit: `{result['commit']}`", f"- device: {result['device']}",
        f"- torch {result['torch']}; the six samplers (groups, dim) {', '.join(f'{g}x{d}' for g, d in SAMPLERS)} at "
        f"init_resultant {INIT_RESULTANT}; median of {args.repeats} interleaved rounds of {args.steps} calls; wall "
        f"time {result['seconds']:.0f} s", "",
        "| sampler | ms per step |", "|---|---:|",
        f"| pool: one concentration shared by the groups (RDP's default) | {ms['pool']:.3f} |",
        f"| rounds: one concentration per group, 8 proposals per group first | {ms['rounds']:.3f} |", "",
        f"The pool takes {ms['pool'] / ms['rounds']:.2f}x the rounds' time ({ms['rounds'] - ms['pool']:.2f} ms per "
        "step less).", "",
    ]  # fmt: skip
    write_result(OUT, "wood_pool", result, lines)


if __name__ == "__main__":
    main()
