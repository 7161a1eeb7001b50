"""benchmarks/ab_step.py: two contestant processes take turns and the result records every round of both."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'lab'}"}  # the library and the lab under test
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab_step.py"), *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)  # fmt: skip


def test_two_contestants_take_turns_and_every_round_is_recorded(tmp_path):
    done = _run("--candidate", "deterministic", "--variants", "current,inductor-realize-8", "--rounds", "3",
                "--steps", "2", "--name", "t", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "ab_t.json").read_text())
    assert result["variants"] == ["current", "inductor-realize-8"]
    assert [len(result["ms"][v]) for v in result["variants"]] == [3, 3]
    assert all(math.isfinite(t) and t > 0 for v in result["variants"] for t in result["ms"][v])
    ratios = sorted(a / b for a, b in zip(*result["ms"].values()))
    assert math.isclose(result["median_ratio"], ratios[1])
    page = (tmp_path / "ab_t.md").read_text()
    assert "| current |" in page and "| inductor-realize-8 |" in page and "Median of the per-round ratios" in page


def test_the_host_network_and_the_softplus_group_variant(tmp_path):
    """--model host: the 11-layer network of 8 units at batch 4 on one thread, against the step without SoftplusGroup."""
    done = _run("--model", "host", "--candidate", "varbnn MeanField-reparam", "--variants", "current,no-softplus-group",
                "--rounds", "2", "--steps", "3", "--name", "t", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "ab_t.json").read_text())
    assert (result["model"], result["threads"]) == ("host", 1)
    assert [len(result["ms"][v]) for v in result["variants"]] == [2, 2]
    page = (tmp_path / "ab_t.md").read_text()
    assert "- network: MLP 8-(8x10)-10 (host time per step), batch 4, 1 thread" in page
    assert result["device"].endswith(", 1 thread")
    assert "--candidate 'varbnn MeanField-reparam'" in result["command"]  # quoted: the command runs as it reads
    assert "no SoftplusGroup" in page


def test_bad_variants_and_candidates_are_refused_naming_the_argument(tmp_path):
    for args, flag in ((("--variants", "current,nope"), "--variants"), (("--variants", "current"), "--variants"),
                       (("--variants", "current,current"), "--variants"),
                       (("--variants", "current,inductor-realize-8+nope"), "--variants"),
                       (("--variants", "current,current-again", "--processes", "0"), "--processes"),
                       (("--candidate", "no such step", "--variants", "current,current-again"), "--candidate")):  # fmt: skip
        done = _run("--candidate", "deterministic", *args, "--out", str(tmp_path))
        assert done.returncode == 2 and flag in done.stderr, done.stderr[-2000:]
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # a benchmark tool (processes per variant, ~45 s on 2 cores); two contestants are tested by default
def test_several_processes_per_variant_and_joined_variants(tmp_path):
    """--processes 2: four processes take turns (two per variant); the result keeps each process's rounds, the page
    says how far each variant's own processes differ; a '+'-joined variant applies both parts."""
    done = _run("--candidate", "deterministic", "--variants", "current,current-again+inductor-realize-8", "--rounds", "3",
                "--steps", "2", "--processes", "2", "--name", "t", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "ab_t.json").read_text())
    a, b = result["variants"]
    assert result["processes"] == 2
    assert [[len(t) for t in result["ms_by_process"][v]] for v in (a, b)] == [[3, 3], [3, 3]]
    assert [len(result["ms"][v]) for v in (a, b)] == [6, 6]
    pairs = zip(result["ms_by_process"][a], result["ms_by_process"][b])
    ratios = sorted(x / y for ta, tb in pairs for x, y in zip(ta, tb))
    assert math.isclose(result["median_ratio"], (ratios[2] + ratios[3]) / 2)
    page = (tmp_path / "ab_t.md").read_text()
    assert "4 processes (2 per variant)" in page and "Processes of the same code differ by up to" in page
    assert "an A/A run" in page and "; and inductor's realize_opcount_threshold 8" in page
