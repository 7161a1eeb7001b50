"""benchmarks/conversion_study.py resumes only from runs of the same commit: a rerun at a new commit does not silently
re-render the old runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "conversion_study.py"


def test_runs_of_another_commit_are_refused_before_any_training(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("conversion_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path)
    runs = tmp_path / "conversion-defaults_runs.jsonl"
    runs.write_text(json.dumps({"key": "plain|-|0", "family": "plain", "seed": 0, "commit": "0123abc" * 5}) + "\n")
    monkeypatch.setattr(module, "run_seed", lambda *a, **k: pytest.fail("trained despite the older runs"))
    with pytest.raises(SystemExit):
        module.main(["--seeds", "0"])
    err = capsys.readouterr().err
    assert "0123abc" in err and "--reuse-older" in err and "move it aside" in err
    assert runs.read_text().count("\n") == 1  # nothing lost
