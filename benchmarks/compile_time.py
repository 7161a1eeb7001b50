"""What ``fit(compile=True)`` costs before it pays: the first compiled step (compilation) per family, with a cold and a
warm compile cache, beside the eager and compiled step times, and the number of steps after which compiling has paid.

Usage: python benchmarks/compile_time.py [--model mlp] [--device cpu] [--threads 2] [--steps 10] [--rounds 5]
       [--only SUBSTRING,...] [--skip SUBSTRING] [--compile-mode default] [--out benchmarks/results/step-time]

Per family (the candidates of ``step_time.py`` that compile), two processes, one at a time:

- cold: a fresh ``TORCHINDUCTOR_CACHE_DIR``; the first compiled step's wall time (tracing, inductor's code generation,
  the C++ or Triton compilation of its kernels, and the step itself), then the eager step of the same family built in
  the same process (its first step), and both steps' medians over ``--rounds`` alternating turns of ``--steps`` steps
  after 20 warm-up steps each;
- warm: a new process on the cold run's cache directory (what a second run of the same script finds on disk: torch
  keeps its caches in ``/tmp/torchinductor_<user>`` unless ``TORCHINDUCTOR_CACHE_DIR`` says otherwise): its first
  compiled step, which still traces the step in Python and reads the compiled kernels back.

Pays after: (first compiled step - compiled step) / (eager step - compiled step), in steps and in epochs of a
60,000-example training set at the model's batch.
Writes OUT/compile_time[_MODEL][_DEVICE].json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from report import write_result  # type: ignore[import-not-found]
from step_time import COMPILE, MODELS, N_TRAIN, candidates, compiled_suffix  # type: ignore[import-not-found]
from tqdm.auto import tqdm

from varbnn.training import resolve_device
from varbnn_lab.runner import describe_device, git_commit

WARMUP = 20  # steps of each kind between the first one and the timed ones (as step_time.py)


def pairs(model: str, device: torch.device) -> list[tuple[str, str]]:
    """(eager name, compiled name) for every candidate that ``fit(compile=True)`` compiles, in step_time's order."""
    names = list(candidates(model, device, compiled=True))
    tag = compiled_suffix(device)
    out = []
    for name in names:
        if name == "deterministic":
            compiled = "deterministic, compiled" + ("" if COMPILE["mode"] == "default" else f" ({COMPILE['mode']})")
        else:
            compiled = name + tag
        if compiled in names and compiled != name:
            out.append((name, compiled))
    return out


def child(eager_name: str, compiled_name: str, model: str, device: torch.device, steps: int, rounds: int) -> dict[str, Any]:
    """Build the compiled step and time its first step; with ``steps`` > 0 also build the eager step, time its first
    step, warm both up (:data:`WARMUP` steps each) and time them in ``rounds`` alternating turns of ``steps`` steps."""
    table = candidates(model, device, compiled=True)
    _, shape, batch, _ = MODELS[model]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, *shape, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(step: Callable[[torch.Tensor, torch.Tensor], None]) -> float:
        sync()
        t0 = time.perf_counter()
        step(x, y)
        sync()
        return time.perf_counter() - t0

    compiled = table[compiled_name]()
    result: dict[str, Any] = {"first_s": timed(compiled), "phases_s": phases()}
    if steps == 0:
        return result
    eager = table[eager_name]()
    result["eager_first_s"] = timed(eager)
    for step in (eager, compiled):
        for _ in range(WARMUP):
            step(x, y)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(rounds):
        for kind, step in (("eager", eager), ("compiled", compiled)):
            times[kind] += [timed(step) for _ in range(steps)]
    result.update({f"{kind}_ms": 1000 * statistics.median(t) for kind, t in times.items()})
    return result


PHASES = {  # torch's own compile timers (torch._dynamo.utils.compilation_time_metrics): what the first step spent where
    "dynamo": "bytecode_tracing",  # tracing the step's Python
    "aot_autograd": "create_aot_dispatcher_function",  # the joint forward and backward graph, and (within) inductor
    "inductor": "compile_fx_inner",  # inductor's lowering and code generation, and the kernels' compilation
    "cxx": "compile_file",  # the C++ compiler (CPU kernels), summed over the compile threads
}


def phases() -> dict[str, float]:
    """Seconds per phase of the compilations so far in this process (:data:`PHASES`; ``aot_autograd`` without the
    forward graph's inductor time it holds); empty where this torch keeps no such timers."""
    import torch._dynamo.utils

    metrics = getattr(torch._dynamo.utils, "compilation_time_metrics", None)
    if not isinstance(metrics, dict):
        return {}
    total = {name: float(sum(metrics.get(key, ()))) for name, key in PHASES.items()}
    # inductor compiles the forward graph within autograd's timer, the backward lazily at the first backward pass
    forward = float(sum(metrics.get("compile_fx.<locals>.fw_compiler_base", ())))
    total["aot_autograd"] = max(0.0, total["aot_autograd"] - forward)
    return {name: round(value, 2) for name, value in total.items()}


def run_child(argv: list[str], eager: str, compiled: str, cache: str, steps: int) -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    command = [sys.executable, __file__, *argv, "--child", eager, "--child-compiled", compiled, "--child-steps", str(steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the process of {compiled!r} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def pays_after(first_s: float, eager_ms: float, compiled_ms: float) -> float | None:
    """Steps after which compiling has paid (None: the compiled step is not faster)."""
    saving = eager_ms - compiled_ms
    return None if saving <= 0 else 1000 * first_s / saving - compiled_ms / saving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per turn (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating turns of the eager and compiled step (default 5)")
    parser.add_argument("--only", default="", help="comma-separated substrings: keep the families whose name has one")
    parser.add_argument("--skip", action="append", default=[], help="leave out families whose name has this substring")
    parser.add_argument("--compile-mode", default="default", help="torch.compile's mode for the compiled runs")
    parser.add_argument("--out", default="benchmarks/results/step-time")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-compiled", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.steps, args.threads, args.rounds) < 1:
        parser.error(f"--steps, --rounds and --threads must be >= 1, got {args.steps}, {args.rounds} and {args.threads}")
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    COMPILE["mode"] = args.compile_mode
    torch.manual_seed(0)
    if args.child is not None:
        timing = child(args.child, args.child_compiled, args.model, device, args.child_steps, args.rounds)
        print(json.dumps(timing), flush=True)
        return
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    chosen = [(e, c) for e, c in pairs(args.model, device)
              if (not wanted or any(w in e for w in wanted)) and not any(s in e for s in args.skip)]  # fmt: skip
    if not chosen:
        parser.error(f"--only/--skip left no family; the families: {[e for e, _ in pairs(args.model, device)]}")
    argv = ["--model", args.model, "--device", args.device, "--threads", str(args.threads), "--rounds", str(args.rounds),
            "--compile-mode", args.compile_mode]  # fmt: skip
    _, _, batch, description = MODELS[args.model]
    start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="compile_time_") as root:
        for eager_name, compiled_name in tqdm(chosen, desc="families", disable=None):
            cache = tempfile.mkdtemp(dir=root)
            cold = run_child(argv, eager_name, compiled_name, cache, args.steps)
            warm = run_child(argv, eager_name, compiled_name, cache, 0)
            row: dict[str, Any] = {
                "family": eager_name,
                "eager_first_s": round(cold["eager_first_s"], 3),
                "eager_ms": round(cold["eager_ms"], 3),
                "compiled_ms": round(cold["compiled_ms"], 3),
                "cold_first_s": round(cold["first_s"], 2),
                "warm_first_s": round(warm["first_s"], 2),
                "cold_phases_s": cold.get("phases_s", {}),
                "warm_phases_s": warm.get("phases_s", {}),
            }
            for kind in ("cold", "warm"):
                steps = pays_after(row[f"{kind}_first_s"], row["eager_ms"], row["compiled_ms"])
                row[f"{kind}_pays_after_steps"] = None if steps is None else math.ceil(steps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    steps_per_epoch = math.ceil(N_TRAIN / batch)

    def pays(steps: int | None) -> str:
        return "never" if steps is None else f"{steps:,} ({steps / steps_per_epoch:.1f})"

    result = {
        "name": "compile_time",
        "command": " ".join(["python benchmarks/compile_time.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": describe_device(device) + (f"; host {describe_device(torch.device('cpu'))}" if device.type == "cuda" else ""),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {"model": description, "batch": batch, "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
                   "compile_mode": args.compile_mode, "torch": torch.__version__, "steps_per_epoch": steps_per_epoch},
        "rows": rows,
    }  # fmt: skip
    notes = [
        f"wall time: {result['seconds']} s; {description}, batch {batch}; two processes per family, one at a time; "
        f"the eager and compiled steps of a family timed in one process, in {args.rounds} alternating turns of "
        f"{args.steps} steps after {WARMUP} warm-up steps each (medians)",
        "cold: a fresh compile cache (TORCHINDUCTOR_CACHE_DIR); warm: a new process on that cache (a second run of the "
        "same script)",
        f"pays after: (first compiled step - compiled step) / (eager step - compiled step), in steps and (in brackets) "
        f"epochs of 60,000 examples ({steps_per_epoch} steps); the step-time tables (every candidate in one "
        "process, interleaved) are the ones to read for the ratios between families",
    ]
    def where(spent: dict[str, float]) -> str:
        return " / ".join(f"{spent[name]:.1f}" for name in PHASES) if set(PHASES) <= set(spent) else ""

    notes.append(
        "where the first step's time went, by torch's own compile timers: dynamo (tracing the step's Python) / "
        "aot_autograd (the joint forward-backward graph and its partition) / inductor (lowering, code generation and "
        "the kernels' compilation) / cxx (the C++ compiler, within inductor's time on the CPU, summed over the compile "
        "threads, so it can exceed the wall time it took)"
    )
    table = [
        "| family | eager step (ms) | compiled step (ms) | first compiled step, cold cache (s) | pays after, cold (epochs) "
        "| first compiled step, warm cache (s) | pays after, warm (epochs) | cold: dynamo / aot_autograd / inductor / "
        "cxx (s) | warm: the same (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
        *[f"| {r['family']} | {r['eager_ms']:.2f} | {r['compiled_ms']:.2f} | {r['cold_first_s']:.1f} | "
          f"{pays(r['cold_pays_after_steps'])} | {r['warm_first_s']:.1f} | {pays(r['warm_pays_after_steps'])} | "
          f"{where(r['cold_phases_s'])} | {where(r['warm_phases_s'])} |" for r in rows],
    ]  # fmt: skip
    stem = "compile_time" + ("" if args.model == "mlp" else f"_{args.model}")
    stem += "" if device.type == "cpu" else f"_{device.type}"
    stem += "" if args.compile_mode == "default" else "_" + args.compile_mode.replace("-", "_")
    title = f"Compilation time of fit(compile=True)'s step, {description}, batch {batch}"
    path = write_result(args.out, stem, result, title, notes, table)
    print(f"wrote {path}.json and .md")


if __name__ == "__main__":
    main()
