"""The tutorials in examples/ run in their quick form, write their outputs, and their key claims hold.

Each example is imported from its file and its ``main(["--quick", "--out", tmp])`` called in this process (no
interpreter start-up per example); ``main`` returns the numbers it printed. Only claims that hold robustly at the
quick size (a few epochs) are checked here; the full-size results are the committed outputs under
``docs/tutorials/outputs/``, and the pages' structure (they include the very files tested here) is checked last.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import varbnn
from varbnn.adapters import merge_adapters

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PAGES = ROOT / "docs" / "tutorials"
# example file stem -> tutorial page stem
TUTORIALS = {
    "classification": "classification",
    "regression": "regression",
    "pretrained_cnn": "pretrained-cnn",
    "continual": "continual",
    "pruning": "pruning",
    "calibrated_finetuning": "calibrated-finetuning",
}


@pytest.fixture(autouse=True)
def _one_thread():
    """The examples' models are tiny: a second intra-op thread only adds contention (on a busy 2-core machine the quick
    forms took 100 s with two threads and 16 s with one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"varbnn_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_quick(name: str, out: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    result = load_example(name).main(["--quick", "--out", str(out), "--seed", "0"])
    printed = capsys.readouterr().out
    transcript = out / f"{name}.txt"
    # the transcript is exactly what was printed, and it ends with the run time
    assert transcript.read_text() == printed
    assert re.search(r"finished in \d+\.\d s\n$", printed)
    return result


def assert_figure(path: Path) -> None:
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_classification(tmp_path, capsys):
    result = run_quick("classification", tmp_path, capsys)
    assert_figure(result["figure"])
    for name in ("plain", "bayesian"):
        assert result["metrics"][name]["accuracy"] > 0.85  # 5 epochs on the digits
    # a plain network's draws are all the same network: no epistemic part; the Bayesian one's draws disagree
    for split in ("test", "rotated"):
        assert result["uncertainty"]["plain"][split]["mutual_information"] == 0.0
        assert result["uncertainty"]["bayesian"][split]["mutual_information"] > 0.0
    assert all(0.0 <= value <= 1.0 for value in result["auroc"].values())


def test_regression(tmp_path, capsys):
    result = run_quick("regression", tmp_path, capsys)
    assert_figure(result["figure"])
    epistemic = result["epistemic"]
    assert epistemic["plain, heteroscedastic"] == {"inside": 0.0, "outside": 0.0}
    for name in ("Bayesian, learned constant noise", "Bayesian, heteroscedastic"):
        # the key claim: epistemic uncertainty grows away from the data
        assert epistemic[name]["outside"] > 1.5 * epistemic[name]["inside"] > 0.0
    # the heteroscedastic Bayesian model learned that the noise grows with x (0.1 at x = -2, 0.3 at x = 2)
    low, _, high = result["aleatoric"]["Bayesian, heteroscedastic"]
    assert high > 1.3 * low
    # the constant-noise model's aleatoric std is one number everywhere
    assert len({round(v, 6) for v in result["aleatoric"]["Bayesian, learned constant noise"]}) == 1
    # outside the data the plain network is confidently wrong: a far worse NLL than the Bayesian one
    scores = result["scores"]
    assert scores["plain, heteroscedastic"]["extrapolation"]["nll"] > scores["Bayesian, heteroscedastic"]["extrapolation"]["nll"]


def test_pretrained_cnn(tmp_path, capsys):
    result = run_quick("pretrained_cnn", tmp_path, capsys)
    assert_figure(result["figure"])
    report = result["report"]
    assert [c.source_type for c in report.converted] == ["Conv2d", "Conv2d", "Linear", "Linear"]
    assert report.deterministic == () and report.num_bayesian_weights == sum(
        p.numel() for p in load_example("pretrained_cnn").make_cnn().parameters()
    )
    before = result["before"]
    # the converted network keeps what the plain one learned; a fresh initialisation does not
    assert abs(before["converted, pretrained=True"]["accuracy"] - before["plain CNN"]["accuracy"]) < 0.03
    assert before["converted, pretrained=False"]["accuracy"] < 0.5
    # temperature scaling never changes the predicted class, and lowers (never raises) the NLL it was fitted on
    metrics = result["metrics"]
    assert metrics["plain + temperature"]["accuracy"] == metrics["plain CNN"]["accuracy"]
    assert result["validation_nll"]["plain + temperature"] <= result["validation_nll"]["plain CNN"] + 1e-6
    assert result["temperature"] > 0
    assert set(result["auroc"]) == {"plain CNN", "plain + temperature", "Bayesian CNN", "Bayesian CNN, MI"}


# 8 epochs per task are too few for the Bayesian learner whose prior stays at N(0, 1): fit warns that its posterior sits
# on the prior (the full form trains 100 epochs per task and does not warn)
@pytest.mark.filterwarnings("ignore::varbnn.train.TrainingWarning")
def test_continual(tmp_path, capsys):
    result = run_quick("continual", tmp_path, capsys)
    assert_figure(result["figure"])
    # after each task the prior IS the posterior: KL(q || p) = 0 up to rounding
    assert len(result["kl_after_update"]) == 5 and all(abs(v) < 1e-3 for v in result["kl_after_update"])
    for rows in result["accuracy"].values():
        assert [len(r) for r in rows] == [1, 2, 3, 4, 5]  # after task t, the heads of tasks 1..t
        assert rows[0][0] > 0.9  # 0 vs 1 is easy
    # the posterior-to-prior step is what stops the Bayesian network from forgetting
    final = result["final"]
    assert final["VCL (posterior becomes prior)"]["mean_drop"] < final["Bayesian, prior kept at N(0, 1)"]["mean_drop"]


def test_pruning(tmp_path, capsys):
    result = run_quick("pruning", tmp_path, capsys)
    for figure in result["figures"]:
        assert_figure(figure)
    dense, exported = result["dense"], result["validation"]
    assert dense == {"parameters": 64 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10, "flops": 17_610}
    # the exported model is smaller, computes exactly what the masked dense model computes, and counts as reported
    assert exported["parameters"] < dense["parameters"] and exported["flops"] < dense["flops"]
    assert result["export_difference"] < 1e-5
    assert result["counted"] == (exported["parameters"], exported["flops"])
    search = result["validation_search"]
    assert search["error"] <= search["base_error"] + 0.01 + 1e-9  # within the tolerance, on the validation set
    # Graves: a larger lambda never keeps more weights; lambda = 0 keeps them all
    fractions = [row["fraction"] for row in result["sweep"]]
    assert fractions[0] == 1.0 and all(a >= b for a, b in zip(fractions, fractions[1:])) and fractions[-1] < 1.0
    sparse = result["sparse"]
    assert sparse["nonzero"] < sparse["total"] == dense["parameters"]


def test_calibrated_finetuning(tmp_path, capsys):
    result = run_quick("calibrated_finetuning", tmp_path, capsys)
    assert_figure(result["figure"])
    assert result["pretrained_accuracy"] > 0.9  # digits 0-4, 10 epochs
    models = result["models"]
    assert list(models) == ["LoRA", "LoRA + temperature", "variational adapters", "variational adapters + temperature"]
    # both train the same parts: rank-4 adapters on the two hidden layers (A 4 x in, B 128 x 4) and the new 5-way head;
    # the variational adapters have a mean and a scale for each entry of A
    adapters = 4 * 64 + 128 * 4 + 4 * 128 + 128 * 4
    trainable = {
        name: sum(p.numel() for p in models[name].parameters() if p.requires_grad) for name in ("LoRA", "variational adapters")
    }
    assert trainable == {"LoRA": adapters + 128 * 5 + 5, "variational adapters": adapters + 4 * 64 + 4 * 128 + 128 * 5 + 5}
    # the pretrained network is untouched (the adapters' base layers are frozen copies of it)
    example = load_example("calibrated_finetuning")
    for name in ("LoRA", "variational adapters"):
        assert torch.equal(models[name][2].base.weight, result["pretrained"][2].weight)
        assert all(not p.requires_grad for p in models[name][2].base.parameters())
    # plain LoRA is a point estimate: no draws to average; the variational adapters' draws disagree
    x = torch.rand(20, 64)
    assert torch.equal(varbnn.predict(models["LoRA"], x, samples=3)[0], varbnn.predict(models["LoRA"], x, samples=3)[2])
    draws = varbnn.predict(models["variational adapters"], x, samples=3, seed=0)
    assert not torch.equal(draws[0], draws[1])
    # temperature scaling never changes the predicted class, and lowers (never raises) LoRA's validation NLL
    metrics = result["metrics"]
    for name in ("LoRA", "variational adapters"):
        assert metrics[f"{name} + temperature"]["accuracy"] == metrics[name]["accuracy"]
        assert result["temperatures"][f"{name} + temperature"] > 0
    assert result["validation_nll"]["LoRA + temperature"] <= result["validation_nll"]["LoRA"] + 1e-6
    assert set(result["auroc"]) == set(models) and all(0.0 <= v <= 1.0 for v in result["auroc"].values())
    # merge_adapters gives a plain MLP of the pretrained size that computes the adapters' posterior mean
    merged = merge_adapters(models["variational adapters"])
    assert sum(p.numel() for p in merged.parameters()) == sum(p.numel() for p in example.make_mlp().parameters())
    with varbnn.sample_mode(models["variational adapters"], "mean"):
        assert torch.allclose(merged(x), models["variational adapters"](x), atol=1e-5)


@pytest.mark.parametrize("name", sorted(TUTORIALS))
def test_tutorial_page_shows_the_tested_file_and_its_committed_output(name):
    page = (PAGES / f"{TUTORIALS[name]}.md").read_text()
    assert f'--8<-- "examples/{name}.py"' in page
    assert f'--8<-- "docs/tutorials/outputs/{name}.txt"' in page
    transcript = PAGES / "outputs" / f"{name}.txt"
    assert transcript.exists() and "finished in" in transcript.read_text()
    for figure in re.findall(r"\]\((outputs/[^)]+\.png)\)", page):
        assert_figure(PAGES / figure)
    assert re.findall(r"\]\((outputs/[^)]+\.png)\)", page), "the page shows no figure"
    # the page states the command, the commit and the device of the committed run
    assert f"examples/{name}.py --out docs/tutorials/outputs" in page
    assert re.search(r"commit `[0-9a-f]{7,}`", page) and "CPU" in page


def test_examples_are_listed_on_the_index():
    index = (PAGES / "index.md").read_text()
    for name, page in TUTORIALS.items():
        assert f"{page}.md" in index and f"examples/{name}.py" in index


@pytest.mark.parametrize("name", sorted(TUTORIALS))
def test_every_example_takes_the_same_options(name):
    module = load_example(name)
    defaults = module.parse_args([])
    assert (defaults.quick, defaults.seed, defaults.device) == (False, 0, "cpu")
    assert defaults.out == "varbnn-results/tutorials"  # git-ignored
    given = module.parse_args(["--quick", "--out", "x", "--seed", "3", "--device", "cuda"])
    assert (given.quick, given.out, given.seed, given.device) == (True, "x", 3, "cuda")
    assert module.__doc__ and len(module.__doc__) > 500  # the tutorial's prose introduction
