"""benchmarks/step_time.py --processes: every candidate in processes of its own, taking turns; the table keeps each
process's median and how far a candidate's processes differ."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'lab'}"}  # the library and the lab under test
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_time.py"), "--model", "host",
                           "--mc-samples", "", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)  # fmt: skip


@pytest.mark.slow  # a benchmark tool (several processes, ~60 s on 2 cores); the refusals below run by default
def test_each_candidate_in_processes_of_its_own(tmp_path):
    done = _run("--only", "MeanField-reparam,draw per weight", "--processes", "2", "--repeats", "3", "--steps", "2",
                "--warmup", "1", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (tmp_path / "step_time_host.json").exists()
    result = json.loads((tmp_path / "step_time_host_processes.json").read_text())
    assert result["config"]["processes"] == 2
    rows = {r["model"]: r for r in result["rows"]}
    floor = "floor: deterministic + one N(0, 1) draw per weight + Adam on 2x parameters"
    assert set(rows) == {"deterministic", "varbnn MeanField-reparam", floor}
    for row in rows.values():
        assert row["steps"] == 2 * 3 * 2  # processes x rounds x steps
        assert len(row["process_median_ms"]) == 2 and all(m > 0 for m in row["process_median_ms"])
        assert [len(turns) for turns in row["turn_median_ms"]] == [3, 3]  # per process, per round
        # the pooled median lies between its processes' medians
        assert min(row["process_median_ms"]) - 1e-3 <= row["median_ms"] <= max(row["process_median_ms"]) + 1e-3
    base = rows["deterministic"]["median_ms"]
    assert math.isclose(rows["varbnn MeanField-reparam"]["ratio"], rows["varbnn MeanField-reparam"]["median_ms"] / base,
                        rel_tol=2e-3, abs_tol=5e-3)  # fmt: skip (both sides rounded: ms to 3 places, ratio to 2)
    assert "ratio_to_fastest_peer" not in rows["deterministic"]  # no peer among the candidates
    # per round: the median over rounds of the ratio of the two candidates' process medians in that round
    family = rows["varbnn MeanField-reparam"]
    assert family["floor"] == floor and "floor" not in rows[floor] and "floor" not in rows["deterministic"]
    per_round = [statistics.median(a) / statistics.median(b)
                 for a, b in zip(zip(*family["turn_median_ms"]), zip(*rows[floor]["turn_median_ms"]))]  # fmt: skip
    assert math.isclose(family["round_ratio_to_floor"], statistics.median(per_round), abs_tol=6e-4)
    assert rows["deterministic"]["round_ratio"] == 1.0
    page = (tmp_path / "step_time_host_processes.md").read_text()
    assert "processes' medians (ms)" in page and "every candidate in 2 processes of its own" in page


def test_negative_processes_and_unknown_child_are_refused(tmp_path):
    done = _run("--processes", "-1", "--out", str(tmp_path))
    assert done.returncode == 2 and "--processes" in done.stderr, done.stderr[-2000:]
    done = _run("--child", "no such candidate", "--out", str(tmp_path))
    assert done.returncode == 2 and "--child" in done.stderr, done.stderr[-2000:]
    assert not list(tmp_path.iterdir())


def test_processes_that_would_not_fit_in_memory_are_refused_before_any_starts(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import step_time  # type: ignore[import-not-found]

    started = []
    monkeypatch.setattr(step_time, "_available_gib", lambda: 1.0)
    monkeypatch.setattr(step_time.subprocess, "Popen", lambda *a, **k: started.append(a))
    try:
        step_time.candidate_turns(["deterministic", "torchbnn"], 3, 1, [])
    except SystemExit as refusal:
        message = str(refusal)
    else:
        raise AssertionError("6 processes of 0.6 GiB in 1 GiB were not refused")
    assert "--processes 3" in message and "--only" in message and "1 GiB is available" in message
    assert not started
