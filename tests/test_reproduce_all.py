"""``varbnn reproduce NAME --quick`` works for every NAME in ``varbnn list`` (issue 27's proof).

Most quick forms are already run, and their outputs checked in detail, by a test of their own (listed in ``COVERED``);
running them again through the command line would double their cost. The others run here through
:func:`varbnn.cli.main`, in this process (``RUN_HERE``: about 45 s together on 2 idle cores, 2 to 13 s each; several
times that while other jobs share the cores). A name in ``varbnn list`` that is in neither fails
:func:`test_every_listed_experiment_has_a_quick_form_test`, so a new experiment cannot go untested."""

from __future__ import annotations

import ast
import importlib
import json
import warnings
from pathlib import Path

import pytest

from varbnn.cli import main

TESTS = Path(__file__).resolve().parent

# name -> the test that runs its quick form and checks what it wrote ("file::function")
COVERED = {
    "demo": "test_train.py::test_runner_writes_json_markdown_and_figure",
    "mnist-mlp": "test_train.py::test_mnist_quick_config_runs",
    "ktied-mnist": "test_experiments.py::test_ktied_quick_run_logs_traces_and_counts_parameters",
    "ktied-posthoc": "test_experiments.py::test_posthoc_quick_run_adds_rank_k_rows_and_figures",
    "lenet5-prune": "test_experiments.py::test_lenet5_prune_quick_run_exports_and_resumes",
    "lenet5-front": "test_experiments.py::test_lenet5_front_quick_run_prunes_to_each_budget_and_draws_the_front",
    "lenet5-radius-init": "test_experiments.py::test_lenet5_radius_init_quick_run_shows_the_even_splits_huge_kl",
    "uncertainty-mnist": "test_experiments.py::test_uncertainty_benchmark_quick_run",
    "uci": "test_uci.py::test_uci_quick_run_writes_results_and_resumes",
    "uci-learned": "test_uci_learned.py::test_uci_learned_quick_run_selects_on_validation_resumes_and_renders",
    "retina-referral": "test_continual.py::test_retina_quick_runs_shards_and_renders",
    "retina-robustness": "test_continual.py::test_retina_quick_runs_shards_and_renders",
    "soap-bubble": "test_continual.py::test_soap_bubble_quick_run",
    "vcl-split-fmnist": "test_continual.py::test_vcl_quick_run_writes_results_and_resumes",
    "vcl-split-fmnist-search": "test_continual.py::test_vcl_search_gives_both_families_the_same_grid_and_selects_on_validation",
    "graves-mnist": "test_graves.py::test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network",
    "graves-prune": "test_graves.py::test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network",
}

# name -> the files its quick form must write besides STEM.json and STEM.md (STEM: NAME, or NAME-quick for the
# experiments whose quick form has a name of its own)
RUN_HERE = {
    "ktied-lstm": ("_traces.png",),
    "ktied-snr-anneal": ("_traces.png",),
    "lenet5-prune-published": ("_prune_histograms.png",),
    "lenet5-radius-prior": ("_prune_histograms.png",),
    "uncertainty-fmnist": (".png", "_cost.png"),
    "uncertainty-mnist-converted": (".png", "_cost.png"),
    "uncertainty-fmnist-converted": (".png", "_cost.png"),
    "graves-mnist-lstm": ("_runs.jsonl", ".png"),
    "graves-prune-lstm": (".png",),
    "vcl-split-fmnist-selected": (".png", "_runs.jsonl"),
}


def _listed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["list"]) == 0
    return [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_every_listed_experiment_has_a_quick_form_test(capsys):
    names = _listed(capsys)
    assert len(names) == len(set(names)) >= 20
    assert not set(COVERED) & set(RUN_HERE), "a name both in COVERED and in RUN_HERE"
    tested = set(COVERED) | set(RUN_HERE)
    assert set(names) == tested, f"not tested: {sorted(set(names) - tested)}; not listed: {sorted(tested - set(names))}"
    for name, where in COVERED.items():
        file, function = where.split("::")
        tree = ast.parse((TESTS / file).read_text())
        functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert function in functions, f"{name}: {where} is gone"
        source = ast.unparse(functions[function])
        assert "quick=True" in source or "'--quick'" in source, f"{name}: {where} does not run a quick form"


@pytest.mark.parametrize("name", sorted(RUN_HERE))
def test_reproduce_quick_writes_the_results(name, data_dir, tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["reproduce", name, "--quick", "--out", str(tmp_path), "--data-dir", str(data_dir), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    stem = f"{name}-quick" if f"{name}-quick.json" in written else name
    for suffix in (".json", ".md", *RUN_HERE[name]):
        assert f"{stem}{suffix}" in written, f"{stem}{suffix} not written (wrote {sorted(written)})"
    saved = json.loads(next(tmp_path.rglob(f"{stem}.json")).read_text())
    assert saved["rows"] and saved["command"].startswith("varbnn reproduce")
    assert f"{stem}.json" in printed


def test_compile_alone_is_fit_compile_true_and_a_named_mode_is_passed_as_it_is(data_dir, tmp_path, fit_compile_spy):
    """``--compile`` alone reaches ``fit`` as ``compile=True`` (CUDA graphs on a GPU when the batches have one shape);
    ``--compile default`` as the mode string (no CUDA graphs)."""
    from varbnn_lab import runner

    seen = fit_compile_spy(runner)
    args = ["reproduce", "uncertainty-fmnist", "--quick", "--data-dir", str(data_dir), "--no-progress",
            "--variants", "MeanField"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, "--out", str(tmp_path / "a"), "--compile"]) == 0
        assert main([*args, "--out", str(tmp_path / "b"), "--compile", "default"]) == 0
    assert seen == [True, "default"]


def test_set_overrides_typed_fields_and_variants_picks_the_runs(data_dir, tmp_path, capsys):
    """``--set FIELD=VALUE`` changes the config (checked against the field's type, any experiment); ``--variants``
    runs only the named variants' runs of a generic-runner config."""
    args = ["reproduce", "uncertainty-fmnist", "--quick", "--out", str(tmp_path), "--data-dir", str(data_dir), "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main([*args, "--set", "eval_samples=3", "--set", "seeds=(4,)", "--variants", "plain,MeanField"]) == 0
    saved = json.loads((tmp_path / "uncertainty-fmnist.json").read_text())
    assert saved["config"]["eval_samples"] == 3 and saved["config"]["seeds"] == [4]
    assert {r["variant"] for r in saved["rows"]} == {"plain", "MeanField"}
    capsys.readouterr()
    for bad, message in (
        (["--set", "epochs=two"], "--set epochs=two: expected int, got 'two'"),
        (["--set", "nope=1"], "--set nope: not a settable field of ExperimentConfig; allowed: ["),
        (["--set", "epochs"], "--set expects FIELD=VALUE"),
        (["--variants", "plain,Nope"], "unknown variants ['Nope']"),
        (["--compile", "fast"], "compile must be True, False or one of the modes ['default', 'reduce-overhead'"),
    ):
        with pytest.raises(SystemExit):
            main([*args, *bad])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reproduce", "soap-bubble", "--quick", "--set", "nope=1"])
    assert "not a settable field of SoapBubbleConfig" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reproduce", "soap-bubble", "--quick", "--compile"])
    assert "--compile: supported by the generic runner's configs and uci-learned, not by 'soap-bubble'" in capsys.readouterr().err


ENGINE_OPTIONS = ("device", "out_dir", "data_dir", "progress", "command", "shard", "train", "workers", "distributed")


def test_every_experiment_is_one_catalog_entry_with_the_same_signatures(capsys):
    """The catalog is the one table the CLI dispatches through: every listed name resolves to an entry whose config
    builds from (name, quick), whose run takes the engine's options, and whose saved pages have a renderer."""
    import inspect

    from varbnn_lab.catalog import SPECIAL, experiment, experiments

    assert sorted(experiments()) == sorted(_listed(capsys))
    for name, spec in experiments().items():
        assert spec.name == name and spec.description
        config = spec.config(name, True)
        assert config.name.removesuffix("-quick") == name, (name, config.name)
        assert experiment(config.name) is not None  # a quick result's name finds its experiment
        assert (spec.render is None) == spec.generic == (name not in SPECIAL)
    for module, function in (("uci", "run_uci"), ("uci_learned", "run_uci_learned"), ("retina", "run_retina"),
                             ("soap_bubble", "run_soap_bubble"), ("continual", "run_vcl"), ("graves", "run_graves_mnist"),
                             ("graves_prune", "run_graves_prune"), ("runner", "run_experiment")):  # fmt: skip
        parameters = inspect.signature(getattr(importlib.import_module(f"varbnn_lab.{module}"), function)).parameters
        assert set(ENGINE_OPTIONS) <= set(parameters), f"{function} lacks {sorted(set(ENGINE_OPTIONS) - set(parameters))}"
    with pytest.raises(ValueError, match="unknown experiment 'nope'; allowed: \\['demo'"):
        experiment("nope")


def test_a_registered_config_is_listed_and_runs_through_the_catalog(capsys):
    import dataclasses

    from varbnn_lab.catalog import experiment
    from varbnn_lab.registry import CONFIGS, get_config, register_config

    config = dataclasses.replace(get_config("mnist-mlp", quick=True), name="my-experiment", description="mine")
    register_config(config)
    try:
        assert experiment("my-experiment").generic
        assert "my-experiment" in _listed(capsys)
    finally:
        CONFIGS.pop("my-experiment")


def test_uci_options_are_refused_for_other_experiments(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "mnist-mlp", "--quick", "--datasets", "yacht"])
    assert "--datasets: options of uci only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reproduce", "uci-learned", "--quick", "--noise-update", "gradient"])
    assert "--noise-update: options of uci only" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["uci-quick", "soap-bubble-quick", "mnist-mlp-quick"])
def test_a_quick_forms_name_is_refused_with_the_way_to_run_it(name, capsys):
    """A '-quick' name once ran the full experiment into the committed folder: it is refused, naming --quick."""
    with pytest.raises(SystemExit):
        main(["reproduce", name])
    assert f"({name.removesuffix('-quick')} --quick)" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["graves-prune", "soap-bubble"])
def test_no_train_without_saved_runs_is_an_error_and_writes_nothing(name, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", name, "--quick", "--no-train", "--out", str(tmp_path), "--no-progress"])
    assert "nothing to render" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.md")) and not list(tmp_path.glob("*.json"))
