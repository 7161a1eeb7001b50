"""``varbnn reproduce NAME --quick`` works for every NAME in ``varbnn list`` (issue 27's proof).

Most quick forms are already run, and their outputs checked in detail, by a test of their own (listed in ``COVERED``);
running them again through the command line would double their cost. The others run here through
:func:`varbnn.cli.main`, in this process (``RUN_HERE``, about 45 s on 2 shared cores), except the few whose quick form
takes a minute or more on 2 cores (``TOO_SLOW``, each with the reason and the tests that cover its code and config).
A name in ``varbnn list`` that is in none of the three fails :func:`test_every_listed_experiment_has_a_quick_form_test`,
so a new experiment cannot go untested."""

from __future__ import annotations

import ast
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
    "lenet5-radius-init": "test_experiments.py::test_lenet5_radius_init_quick_run_shows_the_even_splits_huge_kl",
    "uncertainty-mnist": "test_experiments.py::test_uncertainty_benchmark_quick_run",
    "uci": "test_uci.py::test_uci_quick_run_writes_results_and_resumes",
    "retina-referral": "test_continual.py::test_retina_quick_runs_shards_and_renders",
    "retina-robustness": "test_continual.py::test_retina_quick_runs_shards_and_renders",
    "soap-bubble": "test_continual.py::test_soap_bubble_quick_run",
    "vcl-split-fmnist": "test_continual.py::test_vcl_quick_run_writes_results_and_resumes",
    "graves-mnist": "test_graves.py::test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network",
    "graves-prune": "test_graves.py::test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network",
}

# name -> why its quick form is not run by any test, and the tests that cover every part of it instead
TOO_SLOW = {
    "lenet5-prune-published": (
        "its quick form takes about 100 s on 2 shared cores (LeNet-5 RDP training, then pruning by the gap rule, the "
        "validation thresholds and the budget in one step and in stages, each retrained): lenet5-prune's quick form, "
        "the same code with the same quick fields, runs in test_lenet5_prune_quick_run_exports_and_resumes; its two "
        "published choices are checked to be its only differences, and radius_init='even' runs in lenet5-radius-init's "
        "quick form",
        (
            "test_experiments.py::test_lenet5_prune_quick_run_exports_and_resumes",
            "test_experiments.py::test_lenet5_prune_published_differs_from_lenet5_prune_only_in_the_published_choices",
            "test_experiments.py::test_lenet5_radius_init_quick_run_shows_the_even_splits_huge_kl",
        ),
    ),
    "uncertainty-fmnist": (
        "its quick form takes about 70 s on 2 shared cores (every family, temperature scaling, MC dropout, a 5-member "
        "ensemble and Laplace on LeNet-5): uncertainty-mnist's quick form, the same code, runs in "
        "test_uncertainty_benchmark_quick_run, and its quick config is that one with the two datasets swapped",
        (
            "test_experiments.py::test_uncertainty_benchmark_quick_run",
            "test_reproduce_all.py::test_uncertainty_fmnist_quick_is_uncertainty_mnist_quick_with_the_datasets_swapped",
        ),
    ),
    "graves-mnist-lstm": (
        "its quick form takes over 2 minutes on 2 shared cores: its adaptive-weight-noise run alone about 55 s, Graves' "
        "estimator taking per-example gradients through the LSTM, for which torch's vmap falls back to a loop "
        "(mkldnn_rnn_layer has no batching rule); graves-mnist's quick form, the same code on the MLP, runs in "
        "test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network, the estimator's LSTM case in "
        "test_graves_estimator_covers_the_recurrent_case, and its quick config is graves-mnist's with the row LSTM "
        "(and its heat-map tensor) in place of the MLP",
        (
            "test_graves.py::test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network",
            "test_graves.py::test_graves_estimator_covers_the_recurrent_case",
            "test_reproduce_all.py::test_graves_lstm_quick_configs_are_the_mlp_ones_with_the_row_lstm",
        ),
    ),
    "graves-prune-lstm": (
        "it trains graves-mnist-lstm's adaptive-weight-noise network first (about 55 s, see graves-mnist-lstm), then "
        "prunes and retrains it; graves-prune's quick form, the same code on the MLP, runs in "
        "test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network",
        (
            "test_graves.py::test_graves_quick_runs_table_1_then_prunes_its_adaptive_weight_noise_network",
            "test_reproduce_all.py::test_graves_lstm_quick_configs_are_the_mlp_ones_with_the_row_lstm",
        ),
    ),
}

# name -> the files its quick form must write besides STEM.json and STEM.md (STEM: NAME, or NAME-quick for the
# experiments whose quick form has a name of its own)
RUN_HERE = {
    "ktied-lstm": ("_traces.png",),
    "ktied-snr-anneal": ("_traces.png",),
}


def _listed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["list"]) == 0
    return [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_every_listed_experiment_has_a_quick_form_test(capsys):
    names = _listed(capsys)
    assert len(names) == len(set(names)) >= 20
    groups = (set(COVERED), set(RUN_HERE), set(TOO_SLOW))
    assert sum(map(len, groups)) == len(set().union(*groups)), "a name in two of COVERED, RUN_HERE, TOO_SLOW"
    tested = set().union(*groups)
    assert set(names) == tested, f"not tested: {sorted(set(names) - tested)}; not listed: {sorted(tested - set(names))}"
    checks = [(name, where, True) for name, where in COVERED.items()]
    checks += [(name, where, False) for name, (_, wheres) in TOO_SLOW.items() for where in wheres]
    for name, where, quick in checks:
        file, function = where.split("::")
        tree = ast.parse((TESTS / file).read_text())
        functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert function in functions, f"{name}: {where} is gone"
        if quick:
            assert "quick=True" in ast.unparse(functions[function]), f"{name}: {where} does not run a quick form"


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


def test_uncertainty_fmnist_quick_is_uncertainty_mnist_quick_with_the_datasets_swapped():
    import dataclasses

    from varbnn.experiments.registry import get_config

    mnist, fmnist = get_config("uncertainty-mnist", quick=True), get_config("uncertainty-fmnist", quick=True)
    assert (fmnist.dataset, fmnist.ood_dataset) == (mnist.ood_dataset, mnist.dataset) == ("fashion-mnist", "mnist")
    differ = {f.name for f in dataclasses.fields(mnist) if getattr(mnist, f.name) != getattr(fmnist, f.name)}
    assert differ == {"name", "description", "dataset", "ood_dataset"}


def test_graves_lstm_quick_configs_are_the_mlp_ones_with_the_row_lstm():
    import dataclasses

    from varbnn.experiments.graves import graves_config

    for mlp_name in ("graves-mnist", "graves-prune"):
        mlp, lstm = graves_config(mlp_name, True), graves_config(f"{mlp_name}-lstm", True)
        assert (mlp.model, lstm.model) == ("mlp", "row_lstm")
        differ = {f.name for f in dataclasses.fields(mlp) if getattr(mlp, f.name) != getattr(lstm, f.name)}
        assert differ == {"name", "model", "heatmap_tensor"}
