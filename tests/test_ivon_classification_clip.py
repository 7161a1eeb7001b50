"""benchmarks/ivon_classification_clip.py: the uncertainty benchmark's IVON choice per clip recipe, validation only."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ivon_classification_clip.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("ivon_classification_clip", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(module, values):
    """A study result with one validation NLL per (recipe, grid point)."""
    rows = []
    for label, nlls in values.items():
        for (lr, hess_init), nll in zip(module.bench.IVON_GRID, nlls, strict=True):
            rows.append({"recipe": label, "lr": lr, "hess_init": hess_init, "val_nll": nll, "seconds": 1.0, "epochs": 3,
                         "device": "cpu"})
    return {"rows": rows, "command": "c", "commit": "abc1234"}


def test_the_rule_adopts_the_clip_only_when_harmless_on_every_configuration():
    module = _module()
    harmless = _result(module, {"no clip": [0.40, 0.50, 0.45], "clip 0.001": [0.42, 0.403, 0.60]})  # +0.75%
    harmful = _result(module, {"no clip": [0.40, 0.50, 0.45], "clip 0.001": [0.42, 0.405, 0.60]})  # +1.25%
    choice = module.decide({"fashion-mnist-mlp": harmless})
    assert choice["per_config"]["fashion-mnist-mlp"]["relative_change"] == pytest.approx(0.0075)
    assert choice["per_config"]["fashion-mnist-mlp"]["best"]["clip 0.001"]["lr"] == module.bench.IVON_GRID[1][0]
    assert not choice["complete"] and not choice["adopt_clip_default"]  # two configurations missing: no decision
    every = {config: harmless for config in module.CONFIGS}
    assert module.decide(every)["adopt_clip_default"]
    assert not module.decide({**every, "mnist-mlp": harmful})["adopt_clip_default"]
    partial = {**every, "mnist-mlp": {**harmless, "rows": harmless["rows"][:4]}}  # a recipe's grid unfinished
    assert not module.decide(partial)["complete"]


def test_the_study_passes_each_recipe_to_ivon_and_never_reads_the_test_set(tmp_path, monkeypatch):
    module = _module()
    bench = module.bench
    g = torch.Generator().manual_seed(0)
    fake = {"x_train": torch.rand(200, 1, 28, 28, generator=g), "y_train": torch.randint(0, 10, (200,), generator=g),
            "x_val": torch.rand(100, 1, 28, 28, generator=g), "y_val": torch.randint(0, 10, (100,), generator=g),
            "x_test": None, "y_test": None, "x_ood": None}  # fmt: skip
    monkeypatch.setattr(bench, "load", lambda *a, **k: dict(fake))
    clips = []
    real = bench.IVON

    def spy(*args, **kwargs):
        clips.append(kwargs.get("clip", "missing"))
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "IVON", spy)
    assert module.main(["--config", "mnist-mlp", "--quick", "--draws", "2", "--out", str(tmp_path)]) == 0
    assert clips == [None] * 3 + [0.001] * 3  # the recipes passed explicitly, every grid point
    result = json.loads((tmp_path / "ivon-clip-mnist-mlp-quick.json").read_text())
    assert [(r["recipe"], r["lr"]) for r in result["rows"]] == [
        (label, lr) for label in module.RECIPES for lr, _ in bench.IVON_GRID
    ]
    assert all(r["epochs"] <= 2 and r["val_nll"] > 0 for r in result["rows"])
    assert "| mnist-mlp |" in (tmp_path / "ivon-clip-quick.md").read_text()
    clips.clear()
    assert module.main(["--config", "mnist-mlp", "--quick", "--draws", "2", "--out", str(tmp_path)]) == 0
    assert clips == []  # resumed: nothing left to run


def test_one_harmful_configuration_decides_against_the_clip_before_the_others_are_studied(tmp_path):
    module = _module()
    harmful = _result(module, {"no clip": [0.40, 0.50, 0.45], "clip 0.001": [0.42, 0.45, 0.60]})  # +5%
    choice = module.decide({"mnist-mlp": harmful})
    assert choice["decided"] and not choice["complete"] and not choice["adopt_clip_default"]
    assert choice["harmful"] == ["mnist-mlp"]
    (tmp_path / "ivon-clip-mnist-mlp.json").write_text(json.dumps(harmful))
    assert module.main(["--config", "mnist-mlp", "--render", "--out", str(tmp_path)]) == 0  # reads no data
    page = (tmp_path / "ivon-clip.md").read_text()
    assert "the default stays clip=None**: clip 0.001 is not harmless on mnist-mlp" in page
    assert json.loads((tmp_path / "ivon-clip-mnist-mlp.json").read_text()) == harmful  # --render leaves the runs
    page_json = json.loads((tmp_path / "ivon-clip.json").read_text())  # the page's provenance and the decision
    assert page_json["commit"] == "abc1234" and page_json["seconds"] == 6.0 and page_json["harmful"] == ["mnist-mlp"]
