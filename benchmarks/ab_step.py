"""Interleaved A/B timing of one step_time candidate under two code variants (issue 29).

The 2-core CPU's speed moves by 20-40% within minutes, more than most single changes to a step are worth, so tables
taken one after the other cannot tell such a change from the machine. Here each variant runs in its own long-lived
process (a variant patches the library before the step is built and traced, which one process could not undo: dynamo
guards on the patched globals and would recompile); the parent lets them take turns, ``--steps`` steps each, for
``--rounds`` rounds (in a shuffled order each round), so that both see the same machine, and reports the median of the
per-round ratios.

Two processes of the same code can differ for a whole run: in A/A runs (``--variants current,current-again``, three
processes each, ``studies/ab_meanfield_a_a.md``) the compiled MeanField-reparam step's six processes had median steps of
6.63-7.60 ms under glibc's default allocator, and 7.45-7.77 ms with ``+glibc-keep-heap`` (``_glibc_keep_heap.md``).
``--processes K`` runs K processes per variant (pairs taking turns) and reports how far each
variant's own processes differ; read a ratio inside that spread as no difference.

    .venv/bin/python benchmarks/ab_step.py --candidate "KTied(rank=2)-reparam, fit(compile=True)" \\
        --variants current,ktied-plain-outer [--rounds 20] [--steps 30] [--processes 3] [--name ktied_outer] \\
        [--model host]

Variants (``VARIANTS``): ``current`` (the code as it is) and the alternatives this file names, each the earlier or an
alternative form of one change; ``a+b`` applies both (e.g. ``current+glibc-keep-heap``: glibc's default allocator
decides per process, from the sizes it has freed so far, which buffers get their own mappings, so a change that
alters a step's allocations can meet a different allocator state in each process). Writes
``benchmarks/results/step-time/studies/ab_<name>.json`` / ``.md`` (the step-time studies, indexed by that
folder's README.md).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "benchmarks" / "results" / "step-time" / "studies"


def _plain_outer() -> None:
    import varbnn.families.ktied as ktied

    ktied._outer = lambda u, v: u @ v.T


def _plain_thin_gemms() -> None:
    import varbnn.families.ktied as ktied

    def times_v(grad: torch.Tensor, v: torch.Tensor, base: torch.Tensor | None = None, alpha: float = 1.0) -> torch.Tensor:
        return grad @ v * alpha if base is None else torch.addmm(base, grad, v, alpha=alpha)

    def u_times(u: torch.Tensor, grad: torch.Tensor, base: torch.Tensor | None = None, alpha: float = 1.0) -> torch.Tensor:
        return grad.T @ u * alpha if base is None else torch.addmm(base, grad.T, u, alpha=alpha)

    ktied._times_v, ktied._u_times = times_v, u_times


def _unshared_sigma() -> None:
    import varbnn.families.ktied as ktied

    ktied.KTied.share_sigma_in_trace = False  # type: ignore[assignment,misc]


def _shared_softplus() -> None:
    from varbnn.families.meanfield import MeanField

    MeanField.share_sigma_in_trace = True  # type: ignore[attr-defined]


def _realize_8() -> None:
    import torch._inductor.config

    torch._inductor.config.realize_opcount_threshold = 8


def _no_inductor_asserts() -> None:
    import torch._inductor.config

    torch._inductor.config.size_asserts = False
    torch._inductor.config.scalar_asserts = False
    torch._inductor.config.alignment_asserts = False


def _cpp_wrapper() -> None:
    import torch._inductor.config

    torch._inductor.config.cpp_wrapper = True


def _glibc_keep_heap() -> None:
    from varbnn.training import keep_freed_memory

    if not keep_freed_memory():  # trim threshold 1 GiB, mmap threshold 32 MiB
        raise RuntimeError("glibc's mallopt refused the thresholds (or this is not glibc)")


def _no_family_options() -> None:
    import varbnn.train

    varbnn.train._family_inductor_options = lambda model: {}


def _plain_softplus() -> None:
    import torch.nn.functional as F

    import varbnn._fast.softplus as fast_softplus
    import varbnn.families.meanfield as meanfield

    fast_softplus.softplus = meanfield.softplus = F.softplus


def _generator_draws() -> None:
    import varbnn.train

    varbnn.train._compiled_elbo_step = functools.partial(varbnn.train._compiled_elbo_step, draws="generator")


def _generator_row_tangents() -> None:
    import types

    import varbnn.distributions.vmf_sampling as vmf_sampling

    def randn(shape: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.randn(shape, dtype=dtype, device=device)

    vmf_sampling.philox = types.SimpleNamespace(randn=randn)  # type: ignore[assignment]


def _no_softplus_group() -> None:
    import varbnn._fast.softplus as fast_softplus

    fast_softplus.join_softplus_groups = lambda families: None


VARIANTS: dict[str, tuple[str, Callable[[], None]]] = {
    "current": ("the code as it is", lambda: None),
    "current-again": ("the code as it is, in the other process (an A/A run: how far two processes of the same code "
                      "differ)", lambda: None),
    "ktied-plain-outer": ("KTied's compiled sigma as a plain `u @ v.T` (autograd's mm backward: `G @ v`, `G^T @ u`)",
                          _plain_outer),
    "ktied-plain-thin-gemms": ("KTied's eager node with `G @ v` and `G^T @ u` as they are (and as addmm)",
                               _plain_thin_gemms),
    "ktied-unshared-sigma": ("KTied's tied sigma computed twice in a compiled step (forward pass and KL)", _unshared_sigma),
    "meanfield-shared-sigma": ("MeanField's softplus sigma shared by the forward pass and the KL in a compiled step",
                               _shared_softplus),
    "inductor-realize-8": ("inductor's realize_opcount_threshold 8 (default 30)", _realize_8),
    "no-inductor-asserts": ("inductor's size, scalar and alignment asserts off (its generated code checks every input's "
                            "sizes and strides on every call by default)", _no_inductor_asserts),
    "cpp-wrapper": ("inductor's cpp_wrapper (the compiled graphs' calling code in C++ instead of Python)", _cpp_wrapper),
    "glibc-keep-heap": ("glibc keeps freed memory in its heap (mallopt: trim threshold 1 GiB, mmap threshold 32 MiB) "
                        "instead of returning the heap's top to the system after each step", _glibc_keep_heap),
    "no-family-inductor-options": ("fit(compile=True) without the families' inductor options (inductor's defaults)",
                                   _no_family_options),
    "plain-softplus": ("F.softplus in a compiled step (its backward formula's own exp(rho) beside sigma's)",
                       _plain_softplus),
    "generator-draws": ("a compiled step's weight noise from torch's generator, called as the eager step calls it "
                        "(fit(compile=True)'s CPU draws until 2026-11-28)", _generator_draws),
    "generator-row-tangents": ("the vMF draw's normal tangent noise of RDP's row grouping from torch's generator in a "
                               "compiled CPU step (one eager call per tensor, outside the fused kernels; until "
                               "2026-11-29)", _generator_row_tangents),
    "no-softplus-group": ("each MeanField and Radial tensor's draw and sigma statistics through a node of its own "
                          "(no SoftplusGroup: the eager step until 2026-11-29)", _no_softplus_group),
}  # fmt: skip


def _describe(variant: str) -> str:
    """A variant's description; a '+'-joined set's descriptions joined by '; and '."""
    return "; and ".join(VARIANTS[part][0] for part in variant.split("+"))


MODEL_THREADS = {"mlp": 2, "host": 1}
"""The networks of ``--model`` (step_time's MLP at batch 128, and its host-time network: 11 layers of 8 units at batch
4) and the threads each runs on (as step_time's tables: ``step_time.md`` 2, ``step_time_host.md`` 1)."""


def _child(candidate: str, variant: str, steps: int, model: str = "mlp") -> None:
    """A contestant: patch, build and warm the step, then on each line of stdin time ``steps`` steps."""
    torch.set_num_threads(MODEL_THREADS[model])
    for part in variant.split("+"):
        VARIANTS[part][1]()
    from step_time import MODELS, candidates  # type: ignore[import-not-found]

    table = candidates(model, torch.device("cpu"), compiled="compile" in candidate)
    step = table[candidate]()
    _, shape, batch, _ = MODELS[model]
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(batch, *shape, generator=g), torch.randint(0, 10, (batch,), generator=g)
    for _ in range(20):
        step(x, y)
    print("ready", flush=True)
    for _ in sys.stdin:
        start = time.perf_counter()
        for _ in range(steps):
            step(x, y)
        print((time.perf_counter() - start) / steps * 1e3, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", required=True, help="a step_time candidate name (CPU), exactly")
    parser.add_argument("--model", default="mlp", choices=sorted(MODEL_THREADS),
                        help="mlp (default: MLP 784-400-400-10, batch 128, 2 threads) or host (11 layers of 8 units, "
                             "batch 4, 1 thread: a step's host time)")
    parser.add_argument("--variants", default="current", help=f"two of {sorted(VARIANTS)}, comma-separated")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--processes", type=int, default=1,
                        help="processes per variant (default 1): two processes of the same code can differ by several "
                             "percent for the whole run (e.g. glibc's allocator state), which more processes average out")
    parser.add_argument("--name", default=None, help="the result file's name: ab_NAME (default: from the variants)")
    parser.add_argument("--out", default=str(OUT), help="the results folder (default: benchmarks/results/step-time/studies)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.candidate, args.child, args.steps, args.model)
        return
    if args.processes < 1:
        parser.error(f"--processes must be an int >= 1, got {args.processes}")
    variants = [v.strip() for v in args.variants.split(",")]
    if len(variants) != 2 or variants[0] == variants[1] or any(part not in VARIANTS for v in variants for part in v.split("+")):
        parser.error(f"--variants must name two different ones of {sorted(VARIANTS)} (or '+'-joined sets of them; "
                     f"current-again for an A/A run), got {args.variants!r}")
    from step_time import MODELS, candidates, take_turns  # type: ignore[import-not-found]

    if args.candidate not in candidates(args.model, torch.device("cpu"), compiled=True):
        parser.error(f"--candidate must be a step_time candidate name, got {args.candidate!r}")
    from sigma_param import provenance, write_result  # type: ignore[import-not-found]

    torch.set_num_threads(MODEL_THREADS[args.model])  # as the contestants run: the page's device line names it

    start = time.perf_counter()
    k = args.processes
    order = [v for _ in range(k) for v in variants]  # A1, B1, A2, B2, ...: every process takes its turn each round
    commands = [[sys.executable, __file__, "--candidate", args.candidate, "--child", v, "--steps", str(args.steps),
                 "--model", args.model] for v in order]  # fmt: skip
    times: list[list[float]] = take_turns(commands, args.rounds, order)
    by_process = {v: [times[i] for i in range(len(order)) if order[i] == v] for v in variants}
    ratios = [a / b for pair in range(k) for a, b in zip(times[2 * pair], times[2 * pair + 1])]
    process_medians = {v: [statistics.median(t) for t in by_process[v]] for v in variants}
    name = args.name or "_".join(v.replace("-", "_") for v in variants)
    result: dict[str, Any] = {
        "name": f"ab_{name}", **provenance("ab_step.py", argv), "candidate": args.candidate, "model": args.model,
        "threads": MODEL_THREADS[args.model], "variants": variants,
        "rounds": args.rounds, "steps": args.steps, "processes": k,
        "ms": {v: [x for t in by_process[v] for x in t] for v in variants}, "ms_by_process": by_process,
        "median_ms": {v: statistics.median(x for t in by_process[v] for x in t) for v in variants},
        "process_median_ms": process_medians,
        "median_ratio": statistics.median(ratios), "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    a, b = variants
    spread = [
        f"Each variant's {k} processes (the median step of each): "
        + "; ".join(f"{v} {', '.join(f'{m:.2f}' for m in process_medians[v])} ms" for v in variants)
        + ". Processes of the same code differ by up to "
        + ", ".join(f"{max(process_medians[v]) / min(process_medians[v]):.3f}x" for v in variants)
        + " (read a ratio inside that spread as no difference).", "",
    ] if k > 1 else []  # fmt: skip
    lines = [
        f"# A/B: {args.candidate}, {a} against {b}" + (" (host-time network)" if args.model == "host" else ""), "",
        f"- network: {MODELS[args.model][3]}, batch {MODELS[args.model][2]}, {MODEL_THREADS[args.model]} "
        f"thread{'s' if MODEL_THREADS[args.model] > 1 else ''}",
        f"- command: `{result['command']}`", f"- commit: `{result['commit']}`", f"- device: {result['device']}",
        f"- torch {result['torch']}; {2 * k} processes ({k} per variant) taking turns, {args.rounds} rounds of "
        f"{args.steps} steps each; wall time {result['seconds']:.0f} s", "",
        "| variant | what it is | median step (ms) |", "|---|---|---:|",
        *(f"| {v} | {_describe(v)} | {result['median_ms'][v]:.2f} |" for v in variants), "",
        f"Median of the per-round ratios {a} / {b}"
        + (f" (each of the {k} pairs of processes, every round)" if k > 1 else "")
        + f": **{result['median_ratio']:.3f}** (range {min(ratios):.3f}-{max(ratios):.3f}).", "",
        *spread,
    ]  # fmt: skip
    write_result(Path(args.out), f"ab_{name}", result, lines)


if __name__ == "__main__":
    main()
