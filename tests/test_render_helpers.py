"""The page-building helpers of varbnn_lab.render (markdown_table, mean_se, provenance_lines): exact output."""

from __future__ import annotations

import math

import pytest

from varbnn_lab.render import MISSING, RIGHT, markdown_table, mean_se, provenance_lines


def test_markdown_table_from_flat_rows_with_alignment():
    lines = markdown_table(["name", "n", "error"], [["a", "1", "0.5%"], ["b", "20", "1.0%"]], ["---", RIGHT, RIGHT])
    assert lines == [
        "| name | n | error |",
        "|---|---:|---:|",
        "| a | 1 | 0.5% |",
        "| b | 20 | 1.0% |",
    ]
    assert markdown_table(["x", "y"], iter([("1", "2")])) == ["| x | y |", "|---|---|", "| 1 | 2 |"]
    assert markdown_table(["x"], []) == ["| x |", "|---|"]


def test_markdown_table_refuses_ragged_rows_and_alignment():
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        markdown_table(["a", "b", "c"], [["1", "2"]])
    with pytest.raises(ValueError, match="align has 1 entries for 2 columns"):
        markdown_table(["a", "b"], [], ["---"])


def test_mean_se():
    assert mean_se((0.12345, 0.0067), 3) == "0.123 ± 0.007"
    assert mean_se((0.12345, math.nan), 3) == "0.123"  # one run: no standard error
    assert mean_se((-2.4567, 0.031), 2, count=20) == "-2.46 ± 0.03 [20]"
    assert mean_se((-2.4567, math.nan), 2, count=1) == "-2.46 [1]"
    assert mean_se((0.01234, 0.00056), 2, scale=100.0) == "1.23 ± 0.06"
    assert mean_se((12.0, 3.4), 0) == "12 ± 3"
    assert mean_se(None, 4) == MISSING == "–" and mean_se(None, 4, missing="") == ""


def test_provenance_lines():
    result = {"command": "varbnn reproduce x", "commit": "abc123", "device": "cpu: 2 threads", "seconds": 12.34}
    assert provenance_lines(result) == [
        "- command: `varbnn reproduce x`",
        "- commit: `abc123`",
        "- device: cpu: 2 threads",
        "- wall time of this invocation: 12.3 s",
    ]
    runs = {**result, "run_devices": ["cpu: 1 thread", "cuda: H100"], "run_commits": ["c1", "c2"]}
    assert provenance_lines(runs, runs_note=True, run_commits=True, run_devices=True, seconds_digits=0) == [
        "- command: `varbnn reproduce x`",
        "- commit: `abc123` (each run's own commit and device are in the `_runs.jsonl` file)",
        "- commits that trained the runs: `c1`, `c2`",
        "- device of this invocation: cpu: 2 threads",
        "- devices that trained the runs: cpu: 1 thread, cuda: H100",
        "- wall time of this invocation: 12 s",
    ]
    assert provenance_lines(result, run_commits=True, run_devices=True) == provenance_lines(result)  # none saved: no bullet


def test_render_refuses_a_benchmark_scripts_json(tmp_path):
    """A benchmark script's JSON (name, rows, config without variants, like step_time.json) is not re-rendered as a
    generic-runner page (which would overwrite its page with a different one)."""
    import json

    from varbnn_lab.render import render_saved

    path = tmp_path / "step_time.json"
    path.write_text(json.dumps({"name": "step_time", "command": "x", "commit": "c", "device": "cpu", "seconds": 1.0,
                                "config": {"model": "mlp"}, "rows": []}))  # fmt: skip
    with pytest.raises(ValueError, match=r"not a result of `varbnn reproduce` \(missing \['config.variants'\]\)"):
        render_saved(path)
    assert not (tmp_path / "step_time.md").exists()
