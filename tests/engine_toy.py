"""A toy experiment for the engine's tests: ``toy_run`` is picklable (module level) for worker processes, and
``python tests/engine_toy.py OUT CALLS SLEEP [WORKERS]`` runs the toy experiment in a process that a test can kill."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from varbnn_lab.engine import RunKey, RunStore, execute, expand

PROTOCOL = "toyhash001"


def toy_run(calls: str | None, sleep: float, key: RunKey) -> dict[str, Any]:
    """One run: logs its start to ``calls`` (and the process's id to ``calls.pids``), sleeps, and returns a number drawn
    from a generator seeded by the key."""
    variant, seed = key
    if calls is not None:
        with open(calls, "a") as handle:
            handle.write(json.dumps([variant, seed]) + "\n")
        with open(f"{calls}.pids", "a") as handle:
            handle.write(f"{os.getpid()}\n")
    time.sleep(sleep)
    generator = torch.Generator().manual_seed(1000 * seed + len(variant))
    return {"variant": variant, "seed": seed, "value": float(torch.randn(3, generator=generator).sum())}


def toy_store(out: Path, shard: tuple[int, int] | None = None) -> RunStore:
    return RunStore(Path(out), "toy", key=lambda r: (r["variant"], r["seed"]), protocol=lambda key: PROTOCOL, shard=shard)


def toy_runs() -> list[RunKey]:
    return expand(variant=("a", "bb", "ccc"), seed=(0, 1))


if __name__ == "__main__":
    out, calls, sleep = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    execute(toy_runs(), functools.partial(toy_run, calls, sleep), toy_store(out), device=torch.device("cpu"), commit="c",
            workers=workers)  # fmt: skip
