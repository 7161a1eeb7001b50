"""benchmarks/ivon_noise_trace.py, the diagnostic of the uci-learned IVON column: it traces the protocol's search run
with the column's optimizer, both variants, and writes what the journal cites."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ivon_noise_trace.py"


def test_the_trace_runs_both_variants_on_a_small_set(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("VARBNN_DATA", str(data_dir))
    spec = importlib.util.spec_from_file_location("ivon_noise_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert module.main(["--dataset", "yacht", "--split", "1", "--epochs", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "ivon-noise-trace-yacht-1.json").read_text())
    assert set(result["variants"]) == {"defaults", "plain_hess 100"}
    for label, entry in result["variants"].items():
        assert entry["plain_hess"] == dict(module.VARIANTS)[label] and entry["failure"] is None
        assert [row["epoch"] for row in entry["epochs"]] == [1, 2]
        assert all(row["min_curvature"] > 0 and row["max_abs_mean"] > 0 for row in entry["epochs"])
    slow, fast = (result["variants"][k]["epochs"][0]["log_noise_std"] for k in ("plain_hess 100", "defaults"))
    assert abs(slow) < abs(fast)  # a 100 times smaller plain step moves the log noise std less from its start, 0
    with pytest.raises(SystemExit):
        module.main(["--epochs", "x"])
