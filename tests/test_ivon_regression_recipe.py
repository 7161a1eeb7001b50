"""benchmarks/ivon_regression_recipe.py: the IVON column's search per recipe on validation data, and the choice rule."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ivon_regression_recipe.py"


def _module():
    spec = importlib.util.spec_from_file_location("ivon_regression_recipe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_choice_rule_ranks_by_dataset_and_breaks_ties_towards_the_larger_clip():
    module = _module()
    recipes = {"none": {}, "0.1": {"clip": 0.1}, "0.01": {"clip": 0.01}}

    def row(dataset, recipe, value, split=0):
        return {"dataset": dataset, "recipe": recipe, "split": split, "best_val_ll": value}

    rows = [row("a", "none", -1.0), row("a", "0.1", -2.0), row("a", "0.01", -3.0),
            row("b", "none", None), row("b", "0.1", -5.0), row("b", "0.01", -4.0)]  # fmt: skip
    choice = module.choose(rows, recipes)
    assert choice["per_dataset"]["b"]["none"] is None  # diverged: ranked last on b
    assert choice["mean_rank"] == {"none": 2.0, "0.1": 2.0, "0.01": 2.0}
    assert choice["winner"] == "none"  # a three-way tie goes to the largest clip (none)
    rows.append(row("a", "0.01", 10.0, split=1))  # the splits' mean: (-3 + 10) / 2 = 3.5, best on a
    choice = module.choose(rows, recipes)
    assert choice["per_dataset"]["a"]["0.01"] == pytest.approx(3.5)
    assert choice["winner"] == "0.01" and choice["winner_options"] == {"clip": 0.01}
    tie = module.choose([row("a", "none", -1.0), row("a", "0.1", -1.0), row("a", "0.01", -2.0)], recipes)
    assert tie["mean_rank"] == {"none": 1.5, "0.1": 1.5, "0.01": 3.0} and tie["winner"] == "none"


def test_the_quick_study_runs_every_recipe_and_resumes(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("VARBNN_DATA", str(data_dir))
    module = _module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert module.main(["--quick", "--datasets", "yacht", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "ivon-recipe-quick.json").read_text())
    assert [r["recipe"] for r in result["rows"]] == list(module.RECIPES)
    for r in result["rows"]:
        assert r["options"] == module.RECIPES[r["recipe"]] and r["dataset"] == "yacht" and r["split"] == 0
        assert {s["epochs"] for s in r["scores"]} == {2, 4} and r["best_val_ll"] is not None
    assert result["choice"]["winner"] in module.RECIPES
    assert "| yacht |" in (tmp_path / "ivon-recipe-quick.md").read_text()
    before = (tmp_path / "ivon-recipe-quick.json").read_text()
    assert module.main(["--quick", "--datasets", "yacht", "--out", str(tmp_path)]) == 0  # nothing left to run
    assert (tmp_path / "ivon-recipe-quick.json").read_text() == before
    with pytest.raises(SystemExit):
        module.main(["--datasets", "nope"])
