"""What one N(0, 1) draw per weight costs on the CPU: torch's generator against varbnn.philox compiled (issue 29).

The MNIST MLP's weight tensors (784x400, 400x400, 400x10 and the biases: 478,410 numbers), drawn per call

* by ``torch.randn`` per tensor: torch's CPU generator (a Mersenne twister) fills each tensor on one thread; this is
  the floor rows' draw and what ``fit(compile=True)`` drew on the CPU until 2026-11-28;
* by :func:`varbnn.philox.standard_normal` per tensor (one stream each), the whole set through one
  :func:`torch.compile` (inductor): what ``fit(compile=True)`` draws on the CPU now, here written out to memory (in a
  training step the draw is fused with its first use);
* by the same Philox draw run eagerly (its ~150 integer operations one by one: why the eager step keeps torch's).

Median of ``--repeats`` x ``--steps`` calls after a warm-up.

    .venv/bin/python benchmarks/philox_draw.py [--threads 2] [--steps 200] [--repeats 5]

Writes ``benchmarks/results/step-time/studies/philox_draw.json`` / ``.md``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sigma_param import OUT, SHAPES, _time, header_lines, provenance, timing_args, write_result  # type: ignore[import-not-found]  # noqa: E402

from varbnn import philox  # noqa: E402


def _philox_draws(key: torch.Tensor) -> list[torch.Tensor]:
    return [philox.standard_normal(s, key, stream) for stream, s in enumerate(SHAPES)]


def main(argv: list[str] | None = None) -> None:
    args = timing_args(__doc__, argv, repeats=5)
    start = time.perf_counter()
    compiled = torch.compile(_philox_draws)
    key = philox.new_key()
    for _ in range(20):
        compiled(key)
    eager_steps = max(1, args.steps // 10)
    rows = {
        "torch.randn per weight tensor (torch's CPU generator; the floor rows' draw)": _time(
            lambda: [torch.randn(s) for s in SHAPES], args.steps, args.repeats
        ),
        "varbnn.philox.standard_normal per tensor, compiled (fit(compile=True)'s CPU draw)": _time(
            lambda: compiled(key), args.steps, args.repeats
        ),
        f"varbnn.philox.standard_normal per tensor, eager ({eager_steps} calls per round)": _time(
            lambda: _philox_draws(key), eager_steps, args.repeats
        ),
    }
    weights = sum(torch.Size(s).numel() for s in SHAPES)
    result: dict[str, Any] = {
        "name": "philox_draw", **provenance("philox_draw.py", argv), "weights": weights, "steps": args.steps,
        "repeats": args.repeats, "threads": args.threads, "ms": rows, "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    torch_ms, compiled_ms = list(rows.values())[:2]
    lines = [
        *header_lines("philox_draw: one N(0, 1) draw per weight, torch's CPU generator against varbnn.philox", result,
                      f"{args.threads} threads; {weights:,} numbers per call (the MNIST MLP's weights); median of "
                      f"{args.repeats} rounds of {args.steps} calls"),
        "| draw per call | ms |", "|---|---:|",
        *(f"| {name} | {ms:.3f} |" for name, ms in rows.items()), "",
        f"Compiled, the Philox draw takes {compiled_ms / torch_ms:.2f}x the time of torch's generator "
        f"({torch_ms - compiled_ms:.2f} ms less per call).", "",
    ]  # fmt: skip
    write_result(OUT, "philox_draw", result, lines)


if __name__ == "__main__":
    main()
