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
synchronisations per step. A second table puts each compiled and CUDA-graph step over the deterministic network's step
compiled the same way in the same table (like for like; empty where that table has no such deterministic row), and a
third the first compiled step's seconds (cold and warm compile cache) of the ``compile_time*.json`` files of
``--results`` (``benchmarks/compile_time.py``). Nothing is measured here.
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


Cells = dict[str, dict[str, float]]


def summarise(files: list[Path]) -> tuple[list[str], list[str], Cells, Cells]:
    """(group labels, row names in order, {row: {group label + " " + kind: ratio}}, {row: {group label + " " + kind:
    same-mode ratio}}) from step-time JSON files. A same-mode ratio is a compiled or CUDA-graph row's median step over
    the deterministic network's median step compiled the same way, in the same table (the file that gives the row's
    ratio); there is none where that table has no such deterministic row."""
    groups: list[str] = []
    rows: dict[str, int] = {}
    cells: Cells = {}
    same: Cells = {}
    for path in files:
        data = json.loads(path.read_text())
        if data.get("name") != "step_time":
            continue
        label = group_label(data)
        if label not in groups:
            groups.append(label)
        table = [(candidate(row["model"]), row) for row in data.get("rows", []) if ", S=" not in row["model"]]
        # the several-draws rows (", S="): a different step, not a family's default
        plain = {kind: float(row["median_ms"]) for (name, kind), row in table if name == "deterministic"}
        for (name, kind), row in table:
            rows.setdefault(name, len(rows))
            key = f"{label} {kind}"
            if key in cells.setdefault(name, {}):
                continue  # an earlier file of the group gives it
            cells[name][key] = float(row["ratio"])
            if kind != "eager" and kind in plain and "median_ms" in row:
                same.setdefault(name, {})[key] = round(float(row["median_ms"]) / plain[kind], 3)
    ordered = sorted(rows, key=lambda n: _order(n, rows[n]))
    return groups, ordered, {name: cells[name] for name in ordered}, {name: same[name] for name in ordered if name in same}


def compile_seconds(files: list[Path]) -> dict[str, dict[str, dict[str, float]]]:
    """{row name: {group label: {"cold_first_s": s, "warm_first_s": s}}} from ``benchmarks/compile_time.py``'s JSON
    files (the first compiled step with a cold and a warm compile cache; default compile mode unless the label says)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for path in files:
        data = json.loads(path.read_text())
        if data.get("name") != "compile_time":
            continue
        # compile_time.py steps with step_time.py's default optimizer (fit's): its config does not name it
        config = {"optimizer": "Adam, fused", **data.get("config", {})}
        label = group_label({**data, "config": config})
        mode = config.get("compile_mode", "default")
        label += "" if mode == "default" else f" ({mode})"
        for row in data.get("rows", []):
            name = str(row["family"]).removeprefix("varbnn ")
            seconds = {k: float(row[k]) for k in ("cold_first_s", "warm_first_s") if row.get(k) is not None}
            out.setdefault(name, {}).setdefault(label, seconds)
    return out


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
    groups, names, cells, same = summarise(files)
    compile_files = sorted(folder.glob("compile_time*.json"))
    seconds = compile_seconds(compile_files)
    columns = [(g, kind) for g in groups for kind in KINDS if any(f"{g} {kind}" in c for c in cells.values())]

    def like_for_like(name: str, g: str, kind: str) -> str:
        """The main table's cell: eager over eager; compiled (CUDA graphs) over the deterministic network compiled
        the same way in the same table, with the first compiled step's seconds (cold cache) where they were timed."""
        if kind == KINDS[0]:
            value = cells[name].get(f"{g} {kind}")
            return "" if value is None else f"{value:.2f}x"
        value = same.get(name, {}).get(f"{g} {kind}")
        if value is None:
            return ""
        first = seconds.get(name, {}).get(g, {}).get("cold_first_s") if kind == KINDS[1] else None
        return f"{value:.2f}x" + ("" if first is None else f" ({first:.0f} s)")

    header = "| candidate | " + " | ".join(f"{g}: {kind}" for g, kind in columns) + " |"
    table = [
        "Like for like: eager steps over the deterministic network's eager step, compiled (CUDA-graph) steps over the "
        "deterministic network compiled the same way in the same table; in brackets the first compiled step's seconds "
        "with a cold compile cache (`compile_time*.json`, CPU) where they were timed. An empty compiled cell: not "
        "compiled, or its table timed no deterministic step compiled that way (see the second table). The peers have "
        "compiled cells only in the tables taken since `benchmarks/step_time.py --compile` compiles them too (their "
        "loss through torch.compile with the same settings); elsewhere compare them with the eager columns.",
        "",
        header,
        "|---|" + "---:|" * len(columns),
    ]
    for name in names:
        table.append(f"| {name} | " + " | ".join(like_for_like(name, g, kind) for g, kind in columns) + " |")
    mixed = [(g, kind) for g, kind in columns if kind != KINDS[0]]
    if mixed:
        table += [
            "",
            "Against the eager deterministic step (issue 29's measure, in which its targets are stated; not like for "
            "like: a compiled step over an eager one): compiled and CUDA-graph columns only",
            "",
            "| candidate | " + " | ".join(f"{g}: {kind}" for g, kind in mixed) + " |",
            "|---|" + "---:|" * len(mixed),
        ]
        for name in names:
            values = [cells[name].get(f"{g} {kind}") for g, kind in mixed]
            if any(v is not None for v in values):
                table.append(f"| {name} | " + " | ".join("" if v is None else f"{v:.2f}x" for v in values) + " |")
    if seconds:
        labels = list(dict.fromkeys(label for by in seconds.values() for label in by))
        table += [
            "",
            "What compiling costs first (`benchmarks/compile_time.py`: "
            + ", ".join(f"`{p.name}`" for p in compile_files)
            + "; other runs than the tables above): the first compiled step in seconds, cold / warm compile cache",
            "",
            "| candidate | " + " | ".join(labels) + " |",
            "|---|" + "---:|" * len(labels),
        ]
        for name in seconds:
            firsts = [seconds[name].get(label, {}) for label in labels]
            table.append(f"| {name} | " + " | ".join(
                f"{v['cold_first_s']:.1f} / {v['warm_first_s']:.1f}" if len(v) == 2 else "" for v in firsts) + " |")  # fmt: skip
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
        "same_mode_ratios": same,
        "compile_sources": [p.name for p in compile_files],
        "compile_seconds": seconds,
        "profiles": profiles,
    }
    notes = [
        "sources: " + ", ".join(f"`{p.name}`" for p in files) + " (each names its command, commit and device)",
        "each ratio: the candidate's median step over the deterministic network's median step in the same table (the "
        "same process), run the same way in the first table (eager / eager, compiled / compiled) and eager in the "
        "second; eager, compiled (torch.compile's default mode: `fit(compile=True)` on the CPU, and on a "
        "GPU until 2026-11-27) and CUDA graphs (`fit(compile='reduce-overhead')`, what `fit(compile=True)` now does on "
        "a GPU when the batches have one shape) side by side per network and device; the floor rows are the work "
        "every estimator of a kind must do (see `benchmarks/step_time.py`); JSON: `ratios` (over the eager step), "
        "`same_mode_ratios` (like for like), `compile_seconds`",
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
