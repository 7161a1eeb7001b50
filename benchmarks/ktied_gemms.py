"""What KTied's thin matrix products cost per training step, and what the same numbers cost computed other ways
(issue 29: on an H100, ResNet-18 at batch 128, a KTied-reparam step took 12-13 ms more than a MeanField-reparam step
both eager and compiled, while on the CPU it took no longer; the matrix products are what eager and compiled steps
share, as both call the BLAS for them).

Per tied weight (W viewed as (m, n), rank k = 2), a KTied step computes

* forward: ``sigma = U V^T`` (m x n from a product over k), the Gram matrices ``U^T U`` and ``V^T V`` (k x k, products
  over m and over n) for the KL's ``sum(sigma^2)``;
* backward: ``G V`` (m x k, a product over n) and ``G^T U`` (n x k, over m) for the gradient ``G`` of sigma.

The variants compute the same numbers:

* ``blas``: as KTied does (``varbnn.families.ktied``: ``torch.mm`` with the thin operand laid out for the CPU BLAS);
* ``gemv``: the products over m or n as k matrix-vector products each (``torch.mv``), the Gram matrices as k x k dots;
* ``reduce``: the products over m or n as an elementwise product and a sum over that axis (the Gram matrices too).

Times are the median over ``--repeats`` of the sum over every tied weight of the network (ResNet-18 by default, or
the MNIST MLP), per step, with the device synchronised around each variant's pass. Every variant is checked against
``blas`` before it is timed (float64 reference on the CPU).

    python benchmarks/ktied_gemms.py [--model resnet18] [--device cpu] [--threads 2] [--repeats 20]

Writes OUT/ktied_gemms[_MODEL][_DEVICE].json and .md (``--out``, default benchmarks/results/step-time/studies).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from report import write_result  # type: ignore[import-not-found]

from varbnn.families.ktied import KTied, _times_v, _u_times
from varbnn.models import mlp, resnet18
from varbnn.training import resolve_device
from varbnn_lab.runner import describe_device, git_commit

RANK = 2
MODELS: dict[str, Callable[[], torch.nn.Module]] = {"resnet18": resnet18, "mlp": lambda: mlp(784, (400, 400), 10)}
Products = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (u, v, g) -> one of the products


def _columns(a: Callable[..., torch.Tensor], b: Callable[..., torch.Tensor]) -> Product:
    """``A @ B`` for a thin ``B`` as one matrix-vector product per column of ``B``."""
    return lambda u, v, g: torch.stack([torch.mv(a(u, v, g), b(u, v, g)[:, j]) for j in range(u.shape[1])], 1)


def _outer(u: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return u @ v.T


VARIANTS: dict[str, tuple[Product, Product, Product, Product, Product]] = {  # sigma, U^T U, V^T V, G V, G^T U
    "blas": (  # KTied's own
        _outer,
        lambda u, v, g: u.T @ u,
        lambda u, v, g: v.T @ v,
        lambda u, v, g: _times_v(g, v),
        lambda u, v, g: _u_times(u, g),
    ),
    "gemv": (
        _outer,
        _columns(lambda u, v, g: u.T, lambda u, v, g: u),
        _columns(lambda u, v, g: v.T, lambda u, v, g: v),
        _columns(lambda u, v, g: g, lambda u, v, g: v),
        _columns(lambda u, v, g: g.T, lambda u, v, g: u),
    ),
    "reduce": (
        _outer,
        lambda u, v, g: (u.unsqueeze(2) * u.unsqueeze(1)).sum(0),
        lambda u, v, g: (v.unsqueeze(2) * v.unsqueeze(1)).sum(0),
        lambda u, v, g: (g.unsqueeze(2) * v.unsqueeze(0)).sum(1),
        lambda u, v, g: (g.unsqueeze(2) * u.unsqueeze(1)).sum(0),
    ),
}


def products(name: str, u: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> Products:
    """Every product of one variant (:data:`VARIANTS`), in :data:`PARTS`' order."""
    return tuple(part(u, v, g) for part in VARIANTS[name])  # type: ignore[return-value]


PARTS = ("sigma = U V^T", "U^T U", "V^T V", "G V", "G^T U")


def tied_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(m, n) of every weight KTied(rank=2) ties (biases and BatchNorm vectors are per-element)."""
    shapes = []
    for p in model.parameters():
        if p.dim() >= 2:
            m, n = KTied.matrix_shape(p.shape)
            if RANK < min(m, n):
                shapes.append((m, n))
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results/step-time/studies")
    args = parser.parse_args()
    if args.repeats < 1 or args.threads < 1:
        parser.error(f"--repeats and --threads must be >= 1, got {args.repeats} and {args.threads}")
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    shapes = tied_shapes(MODELS[args.model]())
    g = torch.Generator().manual_seed(0)
    tensors = []
    for m, n in shapes:
        u = torch.rand(m, RANK, generator=g) * 0.1 + 0.01
        v = torch.rand(n, RANK, generator=g) * 0.1 + 0.01
        grad = torch.randn(m, n, generator=g)
        reference = [t.to(torch.float32) for t in products("blas", u.double(), v.double(), grad.double())]
        tensors.append((u.to(device), v.to(device), grad.to(device), reference))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # the same numbers, float32 against a float64 reference (looser on a GPU, whose products may round inputs to TF32;
    # a wrong layout or axis is off by far more)
    tol = 1e-4 if device.type == "cpu" else 1e-2
    for name in VARIANTS:
        for u, v, grad, reference in tensors:
            for got, want, label in zip(products(name, u, v, grad), reference, PARTS):
                torch.testing.assert_close(got.cpu(), want, rtol=tol, atol=tol, msg=f"{name}: {label} differs from KTied's")

    def timed(parts: Sequence[Product]) -> float:
        """The products ``parts`` for every tied weight, the device synchronised around them."""
        sync()
        t0 = time.perf_counter()
        for u, v, grad, _ in tensors:
            for part in parts:
                part(u, v, grad)
        sync()
        return time.perf_counter() - t0

    for parts in VARIANTS.values():  # warm-up (cuBLAS handles, kernel selection)
        for _ in range(3):
            timed(parts)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):  # interleaved
        for name, parts in VARIANTS.items():
            times[name].append(timed(parts))
    per_part = {}  # each product alone, summed over the layers: where the time goes
    for name, parts in VARIANTS.items():
        for part, label in zip(parts, PARTS):
            per_part[(name, label)] = statistics.median(timed((part,)) for _ in range(max(3, args.repeats // 4)))
    rows = []
    for name in VARIANTS:
        row: dict[str, Any] = {"variant": name, "ms_per_step": round(1000 * statistics.median(times[name]), 3)}
        row["parts_ms"] = {label: round(1000 * per_part[(name, label)], 3) for label in PARTS}
        rows.append(row)
        print(f"{name:8s} {row['ms_per_step']:9.3f} ms per step  " + "  ".join(f"{p}: {t}" for p, t in row["parts_ms"].items()))
    result = {
        "name": "ktied_gemms",
        "command": " ".join(["python benchmarks/ktied_gemms.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": describe_device(device),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {"model": args.model, "rank": RANK, "tied_weights": len(shapes), "shapes": shapes,
                   "repeats": args.repeats, "threads": args.threads, "torch": torch.__version__},
        "rows": rows,
    }  # fmt: skip
    notes = [
        f"wall time: {result['seconds']} s; {len(shapes)} tied weights of {args.model} at rank {RANK} (largest "
        f"{max(shapes, key=lambda s: s[0] * s[1])}); per step: the sum over them, median of {args.repeats} interleaved "
        "repeats; each part: that product alone for every weight (the sigma and Gram products of the forward pass, "
        "the G V and G^T U of the backward)",
        "every variant gives the same numbers (checked against a float64 evaluation of KTied's own before timing)",
    ]
    table = [
        "| variant | per step (ms) | " + " | ".join(f"{p} (ms)" for p in PARTS) + " |",
        "|---|---:|" + "---:|" * len(PARTS),
        *[f"| {r['variant']} | {r['ms_per_step']:.3f} | " + " | ".join(f"{r['parts_ms'][p]:.3f}" for p in PARTS) + " |"
          for r in rows],
    ]  # fmt: skip
    stem = "ktied_gemms" + ("" if args.model == "resnet18" else f"_{args.model}")
    stem += "" if device.type == "cpu" else f"_{device.type}"
    title = f"KTied's thin matrix products per training step, {args.model}, rank {RANK}"
    path = write_result(args.out, stem, result, title, notes, table)
    print(f"wrote {path}.json and .md")



if __name__ == "__main__":
    main()
