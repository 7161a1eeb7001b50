"""benchmarks/compile_time.py: the first compiled step with a cold and a warm compile cache, beside the eager and
compiled steps, and the steps after which compiling pays."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from compile_time import pays_after  # type: ignore[import-not-found]  # noqa: E402


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'lab'}"}  # the library and the lab under test
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_time.py"), "--model", "host", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=400)  # fmt: skip


def test_pays_after_is_the_compile_overhead_over_the_saving_per_step():
    # 10 s of compiling in a first step of a 2 ms step saves 3 ms per step against a 5 ms eager step
    assert math.isclose(pays_after(10.0, 5.0, 2.0), (10_000 - 2) / 3)
    assert pays_after(10.0, 2.0, 2.0) is None and pays_after(10.0, 2.0, 3.0) is None  # never pays


@pytest.mark.slow  # a benchmark tool (two cold inductor compiles, ~60 s on 2 cores); arguments tested by default
def test_a_warm_cache_compiles_faster_than_a_cold_one(tmp_path):
    done = _run("--only", "deterministic", "--steps", "2", "--rounds", "2", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "compile_time_host.json").read_text())
    (row,) = result["rows"]
    assert row["family"] == "deterministic"
    assert row["eager_ms"] > 0 and row["compiled_ms"] > 0
    # the cold first step generates and compiles the kernels; the warm one reads them back from the cache
    assert row["cold_first_s"] > row["compiled_ms"] / 1000 and row["warm_first_s"] < row["cold_first_s"]
    expected = pays_after(row["cold_first_s"], row["eager_ms"], row["compiled_ms"])
    assert row["cold_pays_after_steps"] == (None if expected is None else math.ceil(expected))
    # torch's own timers: every phase reported; the cold run generated and compiled kernels, the warm one read them back
    cold, warm = row["cold_phases_s"], row["warm_phases_s"]
    assert set(cold) == set(warm) == {"dynamo", "aot_autograd", "inductor", "cxx"}
    assert cold["cxx"] > 0 and cold["inductor"] > warm["inductor"] and all(v >= 0 for v in (*cold.values(), *warm.values()))
    assert cold["dynamo"] > 0 and warm["dynamo"] > 0  # the step's Python is traced in both
    page = (tmp_path / "compile_time_host.md").read_text()
    assert "first compiled step, cold cache (s)" in page and result["commit"] in page


def test_bad_arguments_are_refused_before_anything_runs(tmp_path):
    done = _run("--steps", "0", "--out", str(tmp_path))
    assert done.returncode == 2 and "--steps" in done.stderr, done.stderr[-2000:]
    done = _run("--only", "no such family", "--out", str(tmp_path))
    assert done.returncode == 2 and "--only/--skip left no family" in done.stderr and "MeanField" in done.stderr
    assert not list(tmp_path.iterdir())
