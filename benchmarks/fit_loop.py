"""Per-step time of ``varbnn.fit``'s whole loop against the bare training step it runs, in one process.

``benchmarks/step_time.py`` times the step alone (zero_grad, the loss and its backward, the optimizer). ``fit`` also
moves each batch to the device, checks the data, the loss and the gradients for NaN/inf, sums the epoch's loss, NLL
and KL, and calls its callbacks. On a GPU a check that reads a value makes the host wait for the device every step,
so that the next step's host work cannot overlap this step's kernels; fit's deferred checks (``_DeferredChecks``,
used on CUDA with the fused Adam) read them every 50 steps instead. Rows per family (LeNet-5-Caffe on random
MNIST-shaped data, batch 100): the bare step, ``fit`` as it runs, and ``fit`` with the per-step checks (the deferred
ones turned off), each the median over epochs after the first (which includes compilation) of the time per step.

Usage: python benchmarks/fit_loop.py [--device cuda] [--compile] [--epochs 4] [--steps 60] [--families
       MeanField,RadialDirectional] [--out benchmarks/results/step-time/studies]
Writes OUT/fit_loop_<device>[_compiled].json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from report import write_result  # type: ignore[import-not-found]
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn.training import default_optimizer, resolve_device
from varbnn.training.checks import _DeferredChecks
from varbnn.training.compiled import _compiled_elbo_step, _fit_compile_mode
from varbnn_lab.config import results_dir
from varbnn_lab.runner import describe_device, git_commit

FAMILIES = {
    "MeanField": (lambda: varbnn.MeanField(), None),
    "Radial": (lambda: varbnn.Radial(), None),
    "RadialDirectional": (lambda: varbnn.RadialDirectional(grouping="double"), lambda: varbnn.RadialDirectionalPrior()),
}
BATCH = 100


def _model(name: str, device: torch.device) -> torch.nn.Module:
    family, prior = FAMILIES[name]
    torch.manual_seed(0)
    return varbnn.bayesianize(varbnn.models.lenet5(), family(), prior() if prior else None).to(device)


def _fit_times(name: str, loader: DataLoader, n: int, device: torch.device, epochs: int, compile: bool,
               deferred: bool) -> list[float]:  # fmt: skip
    """Seconds per step of each epoch after the first, of ``fit`` with or without the deferred checks."""
    devices = _DeferredChecks.DEVICES
    _DeferredChecks.DEVICES = devices if deferred else ()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    stamps: list[float] = []

    def on_epoch_end(_epoch: int, _record: dict[str, float]) -> None:
        sync()
        stamps.append(time.perf_counter())

    try:
        varbnn.fit(_model(name, device), loader, n_data=n, epochs=epochs, device=device, progress=False, diagnose=False,
                   compile=compile, on_epoch_end=on_epoch_end)  # fmt: skip
    finally:
        _DeferredChecks.DEVICES = devices
    steps = len(loader)
    return [(b - a) / steps for a, b in zip(stamps, stamps[1:])]


def _bare_times(name: str, loader: DataLoader, n: int, device: torch.device, epochs: int, compile: bool) -> list[float]:
    """Seconds per step of the bare step (what step_time.py times) over the same batches, per epoch after the first."""
    model = _model(name, device)
    optimizer = default_optimizer(model.parameters(), 1e-3)
    if compile:
        step = _compiled_elbo_step(model, F.cross_entropy, n, device, _fit_compile_mode(True, device, loader))
    else:
        from varbnn.training.loop import _accumulated_elbo_gradient

        def step(x: torch.Tensor, y: torch.Tensor, beta: float, samples: int) -> Any:
            return _accumulated_elbo_gradient(model, model, x, y, F.cross_entropy, n, beta, samples)

    batches = [(x.to(device), y.to(device)) for x, y in loader]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(epochs):
        sync()
        start = time.perf_counter()
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            step(x, y, 1.0, 1)
            optimizer.step()
        sync()
        times.append((time.perf_counter() - start) / len(batches))
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="fit(compile=True) (CUDA graphs on a GPU) and its step")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per candidate; the first is not timed")
    parser.add_argument("--steps", type=int, default=60, help="steps per epoch (batches of 100)")
    parser.add_argument("--families", default="MeanField,RadialDirectional")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(results_dir("step-time") / "studies"))
    args = parser.parse_args()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"--families: unknown {unknown}; allowed: {sorted(FAMILIES)}")
    if args.epochs < 2 or args.steps < 1:
        parser.error("--epochs must be >= 2 (the first is not timed) and --steps >= 1")
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    n = args.steps * BATCH
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(1))
    rows = []
    for name in families:
        bare = statistics.median(_bare_times(name, loader, n, device, args.epochs, args.compile))
        fit = statistics.median(_fit_times(name, loader, n, device, args.epochs, args.compile, deferred=True))
        per_step = statistics.median(_fit_times(name, loader, n, device, args.epochs, args.compile, deferred=False))
        rows.append({"family": name, "bare_ms": round(1000 * bare, 3), "fit_ms": round(1000 * fit, 3),
                     "fit_per_step_checks_ms": round(1000 * per_step, 3)})  # fmt: skip
        print(f"{name:20s} bare {1000 * bare:7.2f} ms  fit {1000 * fit:7.2f} ms  fit, per-step checks {1000 * per_step:7.2f} ms")
    deferred_used = device.type in _DeferredChecks.DEVICES
    result = {
        "name": "fit_loop",
        "command": " ".join(["python benchmarks/fit_loop.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": describe_device(device),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {"model": "LeNet-5-Caffe", "batch": BATCH, "steps": args.steps, "epochs": args.epochs,
                   "compile": args.compile, "deferred_checks_on_this_device": deferred_used},  # fmt: skip
        "rows": rows,
    }
    stem = f"fit_loop_{device.type}" + ("_compiled" if args.compile else "")
    notes = [
        f"wall time: {result['seconds']} s; per candidate {args.epochs} epochs of {args.steps} steps (random "
        "MNIST-shaped data), the median time per step over the epochs after the first",
        "bare: the step alone (zero_grad, loss and backward, optimizer step) over batches already on the device; fit: "
        "varbnn.fit's loop as it runs; fit, per-step checks: the same with the deferred checks turned off"
        + ("" if deferred_used else " (on this device fit does not defer them: the two fit columns run the same code)"),
    ]
    table = ["| family | bare step (ms) | fit (ms) | fit, per-step checks (ms) |", "|---|---:|---:|---:|"]
    table += [f"| {r['family']} | {r['bare_ms']:.2f} | {r['fit_ms']:.2f} | {r['fit_per_step_checks_ms']:.2f} |" for r in rows]
    path = write_result(args.out, stem, result, "fit's loop against its bare step, LeNet-5, batch 100", notes, table)
    print(f"wrote {path}.json and .md")


if __name__ == "__main__":
    main()
