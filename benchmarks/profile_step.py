"""Profile training steps of one step_time candidate with torch.profiler: where the time goes, how many kernels
are launched and how many times the host waits for the device.

Usage: python benchmarks/profile_step.py --model mlp --device cuda --candidate "RadialDirectional(row)" [--steps 5] [--compile]
Prints the operators sorted by self CPU time (and self CUDA time on a GPU), the kernel launches and the
synchronising calls per step; with --out, writes the tables to OUT/profile_<model>_<device>_<candidate>.txt.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
from step_time import MODELS, candidates  # type: ignore[import-not-found]
from torch.profiler import ProfilerActivity, profile

from varbnn.training import resolve_device

SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "aten::_local_scalar_dense", "aten::item")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--candidate", required=True, help="a step_time candidate name, or a substring matching only one")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--out", default=None)
    parser.add_argument("--compile", action="store_true", help="also offer the fit(compile=True) candidates")
    args = parser.parse_args()
    device = resolve_device(args.device)
    table = candidates(args.model, device, compiled=args.compile)
    matches = [args.candidate] if args.candidate in table else [k for k in table if args.candidate in k]
    if len(matches) != 1:
        parser.error(f"--candidate must match exactly one of {sorted(table)}, matched {matches}")
    name = matches[0]
    step = table[name]()
    _, shape, batch, _ = MODELS[args.model]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, *shape, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    for _ in range(args.warmup):
        step(x, y)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize()
    averages = prof.key_averages()
    lines = [f"# {name}, {args.model}, {device}, {args.steps} steps"]
    counts = {e.key: e.count for e in averages}
    launches = sum(c for k, c in counts.items() if k in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    lines.append(f"kernel launches per step: {launches / args.steps:.0f}")
    for key in SYNC_EVENTS:
        if key in counts:
            lines.append(f"{key} per step: {counts[key] / args.steps:.1f}")
    ops = sum(c for k, c in counts.items() if k.startswith("aten::"))
    lines.append(f"aten ops per step: {ops / args.steps:.0f}")
    lines.append(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if device.type == "cuda":
        lines.append(averages.table(sort_by="self_cuda_time_total", row_limit=args.rows))
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
        (out / f"profile_{args.model}_{device.type}_{slug}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
