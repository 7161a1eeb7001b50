"""Every family's step-time ratio side by side on each device: one table built from the step-time result files.

Usage: python benchmarks/step_time_summary.py [--results benchmarks/results/step-time] [--profiles
       benchmarks/results/profiles] [--out benchmarks/results/step-time]

Reads the current ``step_time*.json`` files of ``--results`` (not ``history/``, not ``*_keep_heap``, not
``*_processes``: other allocator settings, or one process per candidate), which
``benchmarks/step_time.py`` and ``scripts/gpu_speed.sh`` wrote, groups them by network, batch, optimizer and device,
and writes OUT/step_time_summary.md and .json: one row per candidate (the deterministic network, each family and
estimator, the floor rows, the peers) and, per group, its eager and its compiled (``fit(compile=True)``) ratio to the
deterministic eager step. Each ratio is read from its own table, against the deterministic step measured in the same
process; where a candidate is in several tables of a group, the first file (sorted by name) gives it. Below it, the
profile summary of ``--profiles``' files (``benchmarks/profile_step.py``): aten operations, kernel launches and host
synchronisations per step. Nothing is measured here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from report import write_result  # type: ignore[import-not-found]

from varbnn_lab.config import results_dir
from varbnn_lab.runner import git_commit

PEERS = ("bayesian-torch", "torchbnn")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")


KINDS = ("eager", "compiled", "CUDA graphs")


def candidate(name: str) -> tuple[str, str]:
    """(row name, "eager", "compiled" or "CUDA graphs") of a step-time row's name (``step_time.py --compile
    [--compile-mode reduce-overhead]``)."""
    plain = re.fullmatch(r"deterministic, compiled(?: \((.+)\))?", name)
    if plain:
        return "deterministic", "CUDA graphs" if plain.group(1) == "reduce-overhead" else "compiled"
    match = re.fullmatch(r"(.+), fit\(compile=(True|'[^']+')\)", name)
    if not match:
        return name.removeprefix("varbnn "), "eager"
    kind = "CUDA graphs" if match.group(2) == repr("reduce-overhead") else "compiled"  # any other mode: compiled
    return match.group(1).removeprefix("varbnn "), kind


def _order(name: str, first_seen: int) -> tuple[int, int]:
    if name == "deterministic":
        group = 0
    elif name.startswith("floor"):
        group = 2
    elif name.startswith(PEERS):
        group = 3
    else:
        group = 1
    return group, first_seen


SHORT = {  # step_time.py's model descriptions, shortened for the column headers
    "MLP 784-400-400-10": "MLP",
    "LeNet-5-Caffe": "LeNet-5",
    "ResNet-18 (32x32 inputs)": "ResNet-18",
    "MLP 8-(8x10)-10 (host time per step)": "host",
}


def group_label(data: dict[str, Any]) -> str:
    """A column group's header: network, batch, optimizer if not fit's, device (e.g. ``LeNet-5 b100, H200``)."""
    config = data.get("config", {})
    device = str(data.get("device", "?")).split(";")[0]
    if device.startswith("cuda: "):
        device = device.removeprefix("cuda: ").removeprefix("NVIDIA ").split()[0]
    else:
        match = re.match(r"cpu: (AMD EPYC|Intel\(R\) Xeon\(R\)|[^,]*).*?(\d+) threads?", device)
        device = f"CPU {match.group(1).replace('(R)', '')} {match.group(2)}t" if match else device
    optimizer = "" if str(config.get("optimizer", "")).startswith("Adam, fused") else " torch Adam"
    model = str(config.get("model", "?"))
    return f"{SHORT.get(model, model)} b{config.get('batch', '?')}{optimizer}, {device}"


def summarise(files: list[Path]) -> tuple[list[str], list[str], dict[str, dict[str, dict[str, float]]]]:
    """(group labels, row names in order, {row: {group label + " " + kind: ratio}}) from step-time JSON files."""
    groups: list[str] = []
    rows: dict[str, int] = {}
    cells: dict[str, dict[str, float]] = {}
    for path in files:
        data = json.loads(path.read_text())
        if data.get("name") != "step_time":
            continue
        label = group_label(data)
        if label not in groups:
            groups.append(label)
        for row in data.get("rows", []):
            if ", S=" in row["model"]:  # the several-draws rows: a different step, not a family's default
                continue
            name, kind = candidate(row["model"])
            rows.setdefault(name, len(rows))
            cells.setdefault(name, {}).setdefault(f"{label} {kind}", float(row["ratio"]))
    ordered = sorted(rows, key=lambda n: _order(n, rows[n]))
    return groups, ordered, {name: cells[name] for name in ordered}


def profile_rows(folder: Path) -> list[dict[str, Any]]:
    """One dict per profile file: candidate, model, device, aten ops, kernel launches and host syncs per step."""
    out = []
    for path in sorted(folder.glob("profile_*.txt")):
        lines = path.read_text().splitlines()
        if not lines or not lines[0].startswith("# "):
            continue
        head = lines[0][2:].rsplit(", ", 3)
        values: dict[str, float] = {}
        for line in lines[1:12]:
            match = re.match(r"(.+) per step: ([0-9.]+)$", line)
            if match:
                values[match.group(1)] = float(match.group(2))
        device = head[2] if len(head) > 2 else "?"
        out.append({
            "file": path.name, "candidate": head[0], "model": head[1] if len(head) > 1 else "?", "device": device,
            "aten_ops": values.get("aten ops"),
            "kernel_launches": values.get("kernel launches") if device.startswith("cuda") else None,
            "host_syncs": sum(values.get(k, 0.0) for k in SYNCS) if device.startswith("cuda") else None,
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(results_dir("step-time")))
    parser.add_argument("--profiles", default=str(results_dir("profiles")))
    parser.add_argument("--out", default=None, help="default: --results")
    args = parser.parse_args()
    start = time.perf_counter()
    folder = Path(args.results)
    # a table taken with another allocator setting (step_time.py --keep-freed-memory), or with a process per candidate
    # (--processes), is not one of the group's
    files = sorted(p for p in folder.glob("step_time*.json")
                   if p.stem != "step_time_summary" and "_keep_heap" not in p.stem and "_processes" not in p.stem)  # fmt: skip
    if not files:
        parser.error(f"--results {folder} holds no step_time*.json files")
    groups, names, cells = summarise(files)
    columns = [(g, kind) for g in groups for kind in KINDS if any(f"{g} {kind}" in c for c in cells.values())]
    header = "| candidate | " + " | ".join(f"{g}: {kind}" for g, kind in columns) + " |"
    table = [header, "|---|" + "---:|" * len(columns)]
    for name in names:
        values = [cells[name].get(f"{g} {kind}") for g, kind in columns]
        table.append(f"| {name} | " + " | ".join("" if v is None else f"{v:.2f}x" for v in values) + " |")
    profiles = profile_rows(Path(args.profiles))
    if profiles:

        def cell(value: float | None) -> str:
            return "" if value is None else f"{value:,.0f}" if value >= 10 else f"{value:g}"

        table += [
            "",
            "Profiles (`benchmarks/profile_step.py`; commits and machines in the profiles folder's README): per training step",
            "",
            "| candidate | model | device | aten ops | kernel launches | host syncs | file |",
            "|---|---|---|---:|---:|---:|---|",
            *[f"| {p['candidate']} | {p['model']} | {p['device']} | {cell(p['aten_ops'])} | {cell(p['kernel_launches'])} | "
              f"{cell(p['host_syncs'])} | {p['file']} |" for p in profiles],
        ]  # fmt: skip
    result = {
        "name": "step_time_summary",
        "command": " ".join(["python benchmarks/step_time_summary.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": "none (reads result files)",
        "seconds": round(time.perf_counter() - start, 1),
        "sources": [p.name for p in files],
        "groups": groups,
        "ratios": cells,
        "profiles": profiles,
    }
    notes = [
        "sources: " + ", ".join(f"`{p.name}`" for p in files) + " (each names its command, commit and device)",
        "each ratio: the candidate's median step over the deterministic network's eager median step in the same table "
        "(the same process); eager, compiled (torch.compile's default mode: `fit(compile=True)` on the CPU, and on a "
        "GPU until 2026-11-27) and CUDA graphs (`fit(compile='reduce-overhead')`, what `fit(compile=True)` now does on "
        "a GPU when the batches have one shape) side by side per network and device; the floor rows are the work "
        "every estimator of a kind must do (see `benchmarks/step_time.py`)",
        "columns: network (" + ", ".join(f"{v} = {k}" for k, v in SHORT.items()) + "), bN = batch N, device "
        "(CPU with its thread count, or the GPU); ratios from different columns come from different processes and "
        "machines: compare within a column",
        "host syncs: cudaStreamSynchronize and cudaDeviceSynchronize calls per profiled step, the profiled window's "
        "closing synchronisation included",
    ]
    title = "Step time side by side: every family, each device"
    path = write_result(args.out or folder, "step_time_summary", result, title, notes, table)
    print(f"wrote {path}.json and .md")


if __name__ == "__main__":
    main()
