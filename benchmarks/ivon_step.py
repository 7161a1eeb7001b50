"""The cost of an IVON training step against Adam's (issue 63: "its step on the CPU MLP is within 1.3x of Adam's").

Three candidates on the MNIST MLP 784-400-400-10 (batch 128; random inputs: a step's cost does not depend on the
values), each a whole training step as ``varbnn.fit`` takes it (zero_grad, forward, loss, backward, optimizer step):

- ``plain + Adam``: the deterministic network with fit's default optimizer (Adam, fused);
- ``MeanField + Adam``: the network bayesianized (MeanField reparam), the ELBO with fit's default KL weight, Adam;
- ``MeanField + IVON``: the same model, the loss without the KL (the prior is in IVON's update; ``fit`` builds no KL
  for such an optimizer), :class:`IVON`.

The candidates take turns for ``--rounds`` rounds of ``--steps`` steps (in a shuffled order each round, so that all
see the same machine); the table gives each one's median step over the rounds and the median over rounds of its
ratio to the others' step in the same round.

    .venv/bin/python benchmarks/ivon_step.py [--rounds 20] [--steps 20] [--threads 2]

Writes ``benchmarks/results/ivon/ivon_step.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import commit_of, write_result  # noqa: E402

import varbnn  # noqa: E402
from varbnn.objectives import elbo_loss  # noqa: E402
from varbnn.optim import IVON  # noqa: E402
from varbnn.training import default_optimizer  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "ivon"
N_DATA = 60_000


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 400), nn.ReLU(), nn.Linear(400, 400), nn.ReLU(), nn.Linear(400, 10))


def _candidates(x: torch.Tensor, y: torch.Tensor) -> dict[str, Callable[[], None]]:
    torch.manual_seed(0)
    plain = _mlp()
    plain_opt = default_optimizer(plain.parameters())
    adam_model = varbnn.bayesianize(_mlp())
    adam_opt = default_optimizer(adam_model.parameters())
    weight = varbnn.objectives.default_kl_weight(adam_model)
    ivon_model = varbnn.bayesianize(_mlp())
    ivon_opt = IVON(ivon_model, n_data=N_DATA)

    def plain_step() -> None:
        plain_opt.zero_grad(set_to_none=True)
        F.cross_entropy(plain(x), y).backward()
        plain_opt.step()

    def adam_step() -> None:
        adam_opt.zero_grad(set_to_none=True)
        elbo_loss(F.cross_entropy(adam_model(x), y), adam_model, N_DATA, kl_weight=weight).loss.backward()
        adam_opt.step()

    def ivon_step() -> None:
        ivon_opt.zero_grad(set_to_none=True)
        F.cross_entropy(ivon_model(x), y).backward()
        ivon_opt.step()

    return {"plain + Adam": plain_step, "MeanField + Adam": adam_step, "MeanField + IVON": ivon_step}


def _cpu_name() -> str:
    """The CPU's model name (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def _load_average() -> float | None:
    """The system's 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _commit() -> str:
    """HEAD's hash, ``+dirty`` when tracked files outside ``benchmarks/results/`` differ (:func:`report.commit_of`)."""
    return commit_of(ROOT)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    if min(args.rounds, args.steps) < 1 or args.warmup < 0 or args.threads < 1:
        parser.error("--rounds, --steps and --threads must be >= 1, --warmup >= 0")
    torch.set_num_threads(args.threads)
    load_before = _load_average()
    began = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 784, generator=g), torch.randint(0, 10, (128,), generator=g)
    steps = _candidates(x, y)
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    rng = random.Random(0)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[name]()
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    median = {name: statistics.median(values) for name, values in times.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(p / q for p, q in zip(times[a], times[b]))

    rows = [{"candidate": name, "median_ms": median[name], "to_plain_adam": ratio(name, "plain + Adam"),
             "to_meanfield_adam": ratio(name, "MeanField + Adam")} for name in steps]  # fmt: skip
    command = "python benchmarks/ivon_step.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {
        "command": command.strip(), "commit": _commit(),
        "device": f"cpu: {_cpu_name()}, {args.threads} thread(s)", "rounds": args.rounds, "steps": args.steps,
        "seconds": time.perf_counter() - began, "load_average": [load_before, _load_average()],
        "layers": [784, 400, 400, 10], "batch_size": int(x.shape[0]), "n_data": N_DATA, "rows": rows,
        "times_ms": times,
    }  # fmt: skip
    table = ["| candidate | median step (ms) | to plain + Adam | to MeanField + Adam |", "|---|---:|---:|---:|"]
    table += [f"| {r['candidate']} | {r['median_ms']:.2f} | {r['to_plain_adam']:.2f}x | {r['to_meanfield_adam']:.2f}x |"
              for r in rows]  # fmt: skip
    notes = [
        f"wall time: {result['seconds']:.0f} s; {args.rounds} rounds of {args.steps} steps per candidate, taking "
        "turns in a shuffled order; ratios are medians over rounds of the two candidates' steps in the same round",
        "MLP 784-400-400-10, batch 128, MeanField reparam (bayesianize's default), n_data 60,000",
        "the target (issue 63): IVON's step within 1.3x of Adam's",
    ]
    if load_before is not None:
        notes.append(f"the machine's 1-minute load average: {load_before:.1f} at the start, {result['load_average'][1]:.1f} "
                     f"at the end ({os.cpu_count()} cores, shared with other processes: the absolute times grow with "
                     "the load, the interleaved ratios much less)")  # fmt: skip
    return write_result(args.out, "ivon_step", result, "IVON's training step against Adam's (CPU MLP)", notes, table)


if __name__ == "__main__":
    print(main())
