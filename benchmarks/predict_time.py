"""Vectorised Monte Carlo prediction vs sequential passes: 64 draws of a Bayesian LeNet-5 on 10,000 images.

Usage: python benchmarks/predict_time.py [--model lenet5|mlp|uci] [--device cpu] [--samples 64] [--images 10000]
       [--repeats 3] [--threads 2] [--out benchmarks/results/predict-time]
``--model``: LeNet-5-Caffe (default), the MNIST MLP 784-400-400-10, or a UCI-sized MLP 8-50-1 (random 8-feature
inputs): where the batched pass pays depends on the network and the device (``varbnn.predict``'s default).
For each family/estimator: the time of ``samples`` sequential forward passes over the images (in batches of 1000)
and of ``varbnn.predict(model, x, samples, chunk_size=C, batch_size=B)`` for several (C, B), the ratio, the peak
memory (CUDA: ``torch.cuda.max_memory_allocated``; CPU: peak RSS growth of the process, coarse) and whether two
calls with the same ``seed`` agree exactly. Writes OUT/predict_time[_MODEL][_cuda].json and .md (no _MODEL for
LeNet-5).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable

import torch
from report import write_result  # type: ignore[import-not-found]

import varbnn
from varbnn.models import lenet5, mlp
from varbnn.training import resolve_device
from varbnn_lab.config import results_dir
from varbnn_lab.runner import describe_device, git_commit

SETTINGS = ((64, 1000), (16, 1000), (8, 2500))  # (chunk_size, batch_size)
NETWORKS = {  # name: (builder, input shape without batch, description)
    "lenet5": (lenet5, (1, 28, 28), "LeNet-5"),
    "mlp": (lambda: mlp(784, (400, 400), 10), (1, 28, 28), "MLP 784-400-400-10"),
    "uci": (lambda: mlp(8, (50,), 1), (8,), "MLP 8-50-1 (UCI-sized)"),
}


def _timed(fn: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> tuple[float, float, torch.Tensor]:
    """Median seconds over ``repeats`` calls (after one warm-up), peak memory in MiB of one call, and its output."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        sync()
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = fn()
        peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, 0) / 1024  # KiB -> MiB (Linux)
    return statistics.median(times), peak, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="lenet5", choices=sorted(NETWORKS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--images", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(results_dir("predict-time")))
    args = parser.parse_args()
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    build, in_shape, description = NETWORKS[args.model]
    x = torch.rand(args.images, *in_shape, generator=torch.Generator().manual_seed(0)).to(device)
    families = {
        "MeanField-reparam": lambda: varbnn.MeanField(estimator="reparam"),
        "MeanField-local": lambda: varbnn.MeanField(estimator="local"),
        "Radial": lambda: varbnn.Radial(),
        "KTied(rank=2)": lambda: varbnn.KTied(rank=2),
        "RadialDirectional(row)": lambda: varbnn.RadialDirectional(grouping="row"),
    }
    rows = []
    for name, spec in families.items():
        prior = varbnn.RadialDirectionalPrior() if name.startswith("RadialDirectional") else None
        model = varbnn.bayesianize(build(), spec(), prior).to(device).eval()

        def sequential(model: torch.nn.Module = model) -> torch.Tensor:
            with torch.no_grad():
                return torch.stack(
                    [torch.cat([model(x[i : i + 1000]) for i in range(0, len(x), 1000)]) for _ in range(args.samples)]
                )

        seq_s, seq_mb, _ = _timed(sequential, device, args.repeats)
        rows.append({"family": name, "method": "sequential (batches of 1000)", "seconds": round(seq_s, 4),
                     "ratio": 1.0, "peak_mib": round(seq_mb, 1), "same_seed_identical": None})  # fmt: skip
        print(f"{name:20s} sequential                 {seq_s:8.3f} s  peak {seq_mb:8.1f} MiB", flush=True)
        for chunk, batch in SETTINGS:

            def vectorised(model: torch.nn.Module = model, chunk: int = chunk, batch: int = batch) -> torch.Tensor:
                return varbnn.predict(model, x, samples=args.samples, chunk_size=chunk, batch_size=batch, seed=0, vectorize=True)

            vec_s, vec_mb, out = _timed(vectorised, device, args.repeats)
            same = bool(torch.equal(out, vectorised()))
            rows.append({"family": name, "method": f"predict(chunk_size={chunk}, batch_size={batch})",
                         "seconds": round(vec_s, 4), "ratio": round(vec_s / seq_s, 3), "peak_mib": round(vec_mb, 1),
                         "same_seed_identical": same})  # fmt: skip
            print(f"{name:20s} chunk {chunk:3d} batch {batch:5d}  {vec_s:8.3f} s  {vec_s / seq_s:5.2f}x  "
                  f"peak {vec_mb:8.1f} MiB  same seed identical: {same}", flush=True)  # fmt: skip
    result = {
        "name": "predict_time",
        "command": " ".join(["python benchmarks/predict_time.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": describe_device(device),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {
            "model": description,
            "samples": args.samples,
            "images": args.images,
            "repeats": args.repeats,
            "threads": args.threads,
            "torch": torch.__version__,
        },  # fmt: skip
        "rows": rows,
    }
    stem = "predict_time" + ("" if args.model == "lenet5" else f"_{args.model}")
    stem += "" if device.type == "cpu" else f"_{device.type}"
    notes = [
        f"wall time: {result['seconds']} s; median of {args.repeats} calls after one warm-up",
        "peak memory: CUDA allocator peak above the resident model; on the CPU the growth of the process's peak RSS "
        "(coarse: 0 once an earlier call reached a higher peak)",
    ]
    table = [
        "| family | method | seconds | ratio to sequential | peak MiB | same seed, identical |",
        "|---|---|---:|---:|---:|---|",
        *[
            f"| {r['family']} | {r['method']} | {r['seconds']:.3f} | {r['ratio']:.2f}x | {r['peak_mib']:,.0f} | "
            f"{'' if r['same_seed_identical'] is None else r['same_seed_identical']} |"
            for r in rows
        ],  # fmt: skip
    ]
    title = f"Monte Carlo prediction: {args.samples} draws of a Bayesian {description} on {args.images:,} inputs"
    path = write_result(args.out, stem, result, title, notes, table)
    print(f"wrote {path}.json and .md")


if __name__ == "__main__":
    main()
