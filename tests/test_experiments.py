"""Runner features of the k-tied experiments: per-step callbacks, per-weight-draw evaluation, traces (gradient SNR,
validation -ELBO), per-module families, post-hoc rank-k rows, and the models they use."""

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from varbnn import Delta, KTied, MeanField, bayesianize
from varbnn.divergence import kl as model_kl
from varbnn.models import lenet5, make_model, resnet18, row_lstm
from varbnn.nn.layers import BayesLSTM
from varbnn.training import evaluate_weight_samples, fit, read_checkpoint
from varbnn_lab import get_config, run_experiment
from varbnn_lab.config import ExperimentConfig, Variant
from varbnn_lab.hooks import BestOfLast as _BestOfLast
from varbnn_lab.hooks import std_parameters
from varbnn_lab.runner import _checkpoint_path, build_model, render_markdown


def toy(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] - x[:, 1] > 0).long()


def test_on_step_end_sees_every_step_with_its_gradients():
    x, y = toy()
    model = bayesianize(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)), MeanField())
    seen = []

    def hook(step, terms):
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert model.training  # the loop put the model back into training mode after the last call's eval()
        model.eval()
        seen.append((step, terms.beta))

    fit(
        model,
        DataLoader(TensorDataset(x, y), batch_size=32),
        n_data=96,
        epochs=2,
        kl_weight=lambda s: s / 10,
        progress=False,
        on_step_end=hook,
    )
    assert [s for s, _ in seen] == list(range(1, 7))
    assert [b for _, b in seen] == pytest.approx([s / 10 for s in range(6)])  # beta of the step that was taken
    assert not model.training  # fit returns the model in eval mode


def test_weight_sample_evaluation_shares_one_draw_across_batches():
    x, y = toy()
    model = bayesianize(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)), MeanField(init_std=0.3))
    state = torch.get_rng_state()
    whole = evaluate_weight_samples(model, x, y, n_train=500, samples=5, batch_size=96, seed=3)
    assert torch.equal(torch.get_rng_state(), state)  # the global stream is untouched
    batched = evaluate_weight_samples(model, x, y, n_train=500, samples=5, batch_size=7, seed=3)
    for key in ("nll", "accuracy", "nelbo"):
        torch.testing.assert_close(whole[key], batched[key])
    assert whole["nll"].std() > 0  # the draws differ from each other
    # each draw's nll is the cross-entropy of one forward pass with that draw's weights
    with torch.random.fork_rng():
        torch.manual_seed(3 * 1_000_003 + 2)
        expected = F.cross_entropy(model(x), y)
    assert float(whole["nll"][2]) == pytest.approx(float(expected), rel=1e-6)
    kl = float(model_kl(model))
    torch.testing.assert_close(whole["nelbo"], whole["nll"] + kl / 500)


def test_weight_sample_evaluation_of_delta_is_deterministic_and_validated():
    x, y = toy()
    model = bayesianize(nn.Sequential(nn.Linear(6, 2)), Delta())
    out = evaluate_weight_samples(model, x, y, n_train=10, samples=3)
    assert float(out["nll"].std()) == 0.0
    with pytest.raises(ValueError, match="n_train"):
        evaluate_weight_samples(model, x, y, n_train=0)
    with pytest.raises(ValueError, match="samples"):
        evaluate_weight_samples(model, x, y, n_train=10, samples=0)
    with pytest.raises(ValueError, match="same positive number"):
        evaluate_weight_samples(model, x, y[:5], n_train=10)


def test_module_families_put_a_different_family_on_named_modules():
    config = get_config("ktied-lstm")
    model = build_model(config, config.variants[2])  # 2-tied on the LSTM, mean-field head
    assert isinstance(model.lstm, BayesLSTM)
    assert type(model.lstm.posteriors["weight_ih_l0"]) is KTied and model.lstm.posteriors["weight_hh_l0"].tied
    assert type(model.head.posteriors["weight"]) is MeanField
    # one prior object shared by all layers
    priors = {id(p) for m in (model.lstm, model.head) for _, _, p in m.bayesian_tensors()}
    assert len(priors) == 1
    bad = dataclasses.replace(config.variants[0], module_families={"nope": {"family": "meanfield"}})
    with pytest.raises(ValueError, match="unknown modules"):
        build_model(config, bad)


def test_std_parameters_names_the_scale_parameters():
    config = get_config("ktied-mnist")
    mf = build_model(config, config.variants[0])
    tied = build_model(config, config.variants[2])
    assert [p.shape for p in std_parameters(mf, "3.weight")] == [torch.Size([400, 400])]
    assert [p.shape for p in std_parameters(tied, "3.weight")] == [torch.Size([400, 2]), torch.Size([400, 2])]
    with pytest.raises(ValueError, match="allowed"):
        std_parameters(mf, "3.kernel")
    with pytest.raises(ValueError, match="not a module"):
        std_parameters(mf, "9.weight")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"optimizer": "sgd"}, "optimizer"),
        ({"figures": ("nope",)}, "unknown figures"),
        ({"validation_size": 0, "snr_tensor": None}, "traces need"),
        ({"posthoc_ranks": (0,)}, "posthoc_ranks"),
        ({"kl_annealing_epochs": -1.0}, "kl_annealing_epochs"),
        ({"prune_stages": 2}, "prune_stages prunes to prune_budget"),
        ({"prune_stages": -1}, "prune_stages must be"),
        ({"prune_scratch_epochs": 3}, "prune_scratch_epochs retrains the staged rule"),
        ({"prune_scratch_epochs": -1}, "prune_scratch_epochs must be"),
        ({"prune_finetune_schedule": "step"}, "prune_finetune_schedule"),
    ],
)
def test_config_rejects_bad_fields(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(get_config("ktied-mnist"), **change)


def test_ktied_quick_run_logs_traces_and_counts_parameters(data_dir, tmp_path):
    result = run_experiment(get_config("ktied-mnist", quick=True), out_dir=tmp_path, data_dir=str(data_dir), progress=False)
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"mean-field", "1-tied", "2-tied", "3-tied"}
    assert rows["mean-field"]["parameters"] == 2 * (784 * 400 + 400 + 400 * 400 + 400 + 400 * 10 + 10)
    ties = (400 + 784) + (400 + 400) + (10 + 400)
    means_and_bias_stds = 784 * 400 + 400 * 400 + 400 * 10 + 2 * (400 + 400 + 10)
    assert rows["2-tied"]["parameters"] == means_and_bias_stds + 2 * ties
    for row in rows.values():
        assert {"snr@6", "snr@12", "val_nelbo@6", "val_nelbo@12", "nelbo", "sample_nll_wsem"} <= set(row)
        assert row["snr@12"] > 0 and row["nelbo"] > row["sample_nll"]
    traces = result["traces"]["2-tied"][0]
    assert [t["step"] for t in traces] == [6, 12]
    saved = json.loads((tmp_path / "ktied-mnist.json").read_text())
    assert saved["steps"] == 12 and saved["n_train"] == 1500
    markdown = (tmp_path / "ktied-mnist.md").read_text()
    assert "| variant | snr@6 |" in markdown and "956,820" in markdown
    assert (tmp_path / "ktied-mnist_traces.png").stat().st_size > 1000


def test_posthoc_quick_run_adds_rank_k_rows_and_figures(data_dir, tmp_path):
    result = run_experiment(get_config("ktied-posthoc", quick=True), out_dir=tmp_path, data_dir=str(data_dir), progress=False)
    labels = [r["variant"] for r in result["rows"]]
    assert labels == ["mean-field"] + [f"mean-field, stds -> rank-{k}" for k in (1, 2, 3)]
    assert list(result["variant_devices"].values()) == [["mean-field"]] and len(result["run_commits"]) == 1
    assert all(r["nelbo"] > 0 for r in result["rows"])
    for figure in ("variance_explained", "std_heatmaps"):
        assert (tmp_path / f"ktied-posthoc_{figure}.png").stat().st_size > 1000


def test_render_markdown_puts_traces_in_their_own_table():
    result = {
        "name": "x",
        "command": "c",
        "commit": "h",
        "device": "cpu",
        "seconds": 1.0,
        "config": {"description": "d"},
        "rows": [{"variant": "a", "accuracy": 0.5, "accuracy_sem": 0.1, "snr@10": 3.0, "snr@10_sem": float("nan")}],
    }
    text = render_markdown(result)
    assert "| variant | accuracy |" in text and "0.5 ± 0.1" in text
    assert "| variant | snr@10 |" in text


def test_a_page_names_the_devices_and_commits_that_trained_its_runs():
    from varbnn_lab.runner import _run_provenance

    records = [
        {"variant": "plain", "seed": 0, "commit": "c2", "device": "cuda: H200"},
        {"variant": "plain", "seed": 1, "commit": "c1", "device": "cuda: H200"},
        {"variant": "ensemble, 5", "seed": 0, "commit": "c2", "device": "cpu: EPYC"},
    ]
    provenance = _run_provenance(records)
    assert provenance == {
        "run_commits": ["c1", "c2"],
        "run_devices": ["cpu: EPYC", "cuda: H200"],
        "variant_devices": {"cuda: H200": ["plain"], "cpu: EPYC": ["ensemble, 5"]},
    }
    result = {"name": "x", "command": "c", "commit": "h", "device": "cpu", "seconds": 1.0, "config": {}, "rows": []}
    lines = render_markdown({**result, **provenance}).splitlines()
    assert "- commits that trained the runs: `c1`, `c2`" in lines
    assert (
        "- devices that trained the runs: cuda: H200 (plain); cpu: EPYC (ensemble, 5). Times (`train_seconds`, "
        "`predict_seconds`) compare only between runs of one device"
    ) in lines
    one = render_markdown({**result, **_run_provenance(records[:2])}).splitlines()
    assert "- device that trained the runs: cuda: H200" in one and not any("compare only" in line for line in one)
    assert "- device of this invocation: cpu" in lines and "- device of this invocation: cpu" in one
    older = render_markdown(result).splitlines()  # a result saved before runs recorded their devices
    assert not any("trained the runs" in line for line in older) and "- device: cpu" in older


def _pruned_result() -> dict:
    row = {
        "variant": "rdp",
        "accuracy": 0.99,
        "pruned_architecture": "20-32-423-250",
        "pruned_parameters": 125062.0,
        "pruned_flops": 1434078.0,
        "pruned_test_error": 0.009,
        "val_pruned_architecture": "18-25-186-55",
        "val_pruned_parameters": 22588.0,
        "val_pruned_flops": 1002013.0,
        "val_pruned_validation_error": 0.0097,
        "val_pruned_test_error": 0.0112,
        "val_pruned_finetuned_epoch": 8.0,
        "val_pruned_finetuned_test_error": 0.0093,
        "iter_pruned_stages": "12-25-274-196 > 3-13-136-63",
        "iter_pruned_architecture": "3-13-136-63",
        "iter_pruned_parameters": 10337.0,
        "iter_pruned_flops": 117431.0,
        "iter_pruned_validation_error": 0.0126,
        "iter_pruned_test_error": 0.0123,
        "scratch_pruned_architecture": "3-13-136-63",
        "scratch_pruned_parameters": 10337.0,
        "scratch_pruned_flops": 117431.0,
        "scratch_pruned_validation_error": 0.011,
        "scratch_pruned_finetuned_epoch": 54.0,
        "scratch_pruned_finetuned_test_error": 0.0101,
    }
    config = {"variants": []}
    return {"name": "p", "command": "c", "commit": "h", "device": "cpu", "seconds": 1.0, "config": config, "rows": [row]}


def test_render_markdown_puts_each_pruning_rule_in_a_row_of_its_own():
    text = render_markdown(_pruned_result())
    lines = text.splitlines()
    main_header = next(line for line in lines if line.startswith("| variant | accuracy"))
    assert "pruned" not in main_header  # the rules' columns left the main table
    cells = [line.split(" | ") for line in lines if line.startswith("| rdp | ")]
    assert cells[0] == ["| rdp", "0.99 |"]  # the main table: variant and accuracy only
    rows = {row[1]: row for row in cells[1:]}
    assert set(rows) == {"gap", "validation", "budget, staged", "staged, random init"}  # no budget_pruned_*: no one-step row
    assert rows["gap"][2:8] == ["20-32-423-250", "125,062", "1,434,078", "–", "0.90%", "–"]
    assert rows["validation"][5:] == ["0.97%", "1.12%", "8", "0.93% |"]
    # the staged rule's model is retrained in every stage: its test error sits in the retrained column
    assert rows["budget, staged"][2:] == ["3-13-136-63", "10,337", "117,431", "1.26%", "–", "2 stages", "1.23% |"]
    assert "- rdp, staged rule: 12-25-274-196 > 3-13-136-63" in lines
    # the random-initialisation control: its retraining's validation error, epoch kept and test error
    assert rows["staged, random init"][2:] == ["3-13-136-63", "10,337", "117,431", "1.10%", "–", "54", "1.01% |"]


def test_render_saved_rewrites_the_page_from_the_json(tmp_path, monkeypatch):
    import json

    from varbnn.cli import main
    from varbnn_lab import engine
    from varbnn_lab.render import render_saved

    monkeypatch.setattr(engine, "git_commit", lambda: "newcommit")
    saved = tmp_path / "p.json"
    saved.write_text(json.dumps(_pruned_result()))
    assert main(["render", str(saved)]) == 0
    text = (tmp_path / "p.md").read_text()
    assert text == render_markdown(_pruned_result(), rendered_at="newcommit")
    assert "- commit: `h`" in text and "re-rendered from the saved JSON at commit `newcommit`" in text
    bad = tmp_path / "uci.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit):
        main(["render", str(bad)])
    with pytest.raises(ValueError, match="missing"):
        render_saved(bad)
    with pytest.raises(FileNotFoundError, match="no such file"):
        render_saved(tmp_path / "absent.json")


def test_kl_annealing_reaches_one_at_the_configured_epoch(tmp_path):
    config = ExperimentConfig(
        name="anneal",
        description="",
        dataset="digits",
        model="mlp",
        model_options={"in_features": 64, "hidden": (8,), "out_features": 10},
        variants=(Variant("mf", family_options={"init_std": 1e-2}),),
        epochs=2,
        batch_size=512,
        seeds=(0,),
        eval_samples=2,
        kl_annealing_epochs=2,
        log_steps=(1, 2, 3, 4),
        snr_tensor="1.weight",
        snr_window=2,
        figures=(),
    )
    result = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    # 1,347 training digits at batch 512: 3 steps per epoch, so beta rises over 6 steps; step s used beta (s-1)/6
    assert result["steps"] == 6
    assert [t["beta"] for t in result["traces"]["mf"][0]] == pytest.approx([0.0, 1 / 6, 2 / 6, 3 / 6])


def test_row_lstm_and_resnet18():
    lstm = row_lstm()
    assert lstm(torch.rand(3, 1, 28, 28)).shape == (3, 10)
    with pytest.raises(ValueError, match="28 rows of 28 features"):
        lstm(torch.rand(3, 1, 27, 28))
    net = resnet18()
    assert sum(p.numel() for p in net.parameters()) == 11_173_962  # He et al.'s CIFAR ResNet-18
    assert net(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    assert make_model("resnet18", num_classes=100).fc.out_features == 100
    bayes = bayesianize(net, KTied(rank=2))
    assert bayes(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="4 positive counts"):
        make_model("resnet18").__class__((2, 2))


def test_lenet5_prune_quick_run_exports_and_resumes(data_dir, tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = get_config("lenet5-prune", quick=True)
        first = run_experiment(config, out_dir=tmp_path, data_dir=str(data_dir), progress=False)
        checkpoints = list((tmp_path / ".checkpoints").glob("lenet5-prune-*/RDP-double-seed0.pt"))
        assert len(checkpoints) == 1
        # a changed evaluation (no validation or budget rule) resumes the same checkpoint: nothing to train
        evaluation_only = dataclasses.replace(
            config,
            prune_validation_tolerance=0.0,
            prune_budget=None,
            prune_finetune_epochs=0,
            prune_stages=0,
            prune_scratch_epochs=0,
        )
        assert _checkpoint_path(evaluation_only, tmp_path, config.variants[0], 0) == checkpoints[0]
        assert _checkpoint_path(dataclasses.replace(config, lr=2e-3), tmp_path, config.variants[0], 0) != checkpoints[0]
        again = run_experiment(evaluation_only, out_dir=tmp_path, data_dir=str(data_dir), progress=False)
    row, row_again = first["rows"][0], again["rows"][0]
    assert row["pruned_architecture"].count("-") == 3 and row["pruned_parameters"] <= row["dense_parameters"] == 431080
    assert row["budget_pruned_flops"] <= config.prune_budget[0] and row["budget_pruned_parameters"] <= config.prune_budget[1]
    for prefix in ("val", "budget"):
        assert 0 <= row[f"{prefix}_pruned_finetuned_test_error"] <= 1 and row[f"{prefix}_pruned_architecture"].count("-") == 3
    assert row["iter_pruned_flops"] <= config.prune_budget[0] and row["iter_pruned_parameters"] <= config.prune_budget[1]
    assert row["iter_pruned_stages"].count(" > ") == config.prune_stages - 1
    assert row["iter_pruned_stages"].endswith(row["iter_pruned_architecture"]) and 0 <= row["iter_pruned_test_error"] <= 1
    # the random-initialisation control trains the staged rule's architecture
    for key in ("architecture", "parameters", "flops"):
        assert row[f"scratch_pruned_{key}"] == row[f"iter_pruned_{key}"]
    assert 0 <= row["scratch_pruned_finetuned_test_error"] <= 1 and row["scratch_pruned_finetuned_epoch"] in (0.0, 1.0)
    assert "val_pruned_architecture" not in row_again and "iter_pruned_architecture" not in row_again
    assert "scratch_pruned_architecture" not in row_again
    for key in ("accuracy", "nll", "pruned_test_error", "final_train_loss"):
        assert row[key] == row_again[key]
    assert row["selected_epoch"] == row_again["selected_epoch"] in (1.0, 2.0)
    assert (tmp_path / "lenet5-prune_prune_histograms.png").stat().st_size > 1000
    markdown = (tmp_path / "lenet5-prune.md").read_text()
    assert "| RDP (paper) | 4-7-110-66 | 125K | 20K | 1.0% |" in markdown and "| BC-GHS | 5-10-76-16 |" in markdown


def test_lenet5_front_quick_run_prunes_to_each_budget_and_draws_the_front(data_dir, tmp_path):
    """prune_front: the staged rule to each FLOPs budget (sizes recomputable from the architecture by lenet5_sizes,
    within the budget where it was reached), its random-init control, one table row per budget and the figure."""
    import warnings

    from varbnn.prune import lenet5_sizes

    config = get_config("lenet5-front", quick=True)
    assert config.prune_budget is None and len(config.prune_front) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_experiment(config, out_dir=tmp_path, data_dir=str(data_dir), progress=False, command="test")
    (row,) = result["rows"]
    for budget in config.prune_front:
        p = f"front{budget}"
        assert lenet5_sizes(row[f"{p}_architecture"]) == (row[f"{p}_parameters"], row[f"{p}_flops"])
        assert row[f"{p}_reached"] in (0.0, 1.0) and (row[f"{p}_flops"] <= budget or not row[f"{p}_reached"])
        for key in ("validation_error", "test_error", "scratch_validation_error", "scratch_test_error"):
            assert 0 <= row[f"{p}_{key}"] <= 1
    assert "iter_pruned_architecture" not in row and "budget_pruned_architecture" not in row
    markdown = (tmp_path / "lenet5-front.md").read_text()
    front_rows = [line for line in markdown.splitlines() if line.startswith(("| 600K |", "| 1.5M |"))]
    assert len(front_rows) == 2 and "Chosen on validation" in markdown
    assert "| RDP (paper) | 4-7-110-66 | 125K | 113,148 | 20K | 8,807 | 1.0% |" in markdown
    header = markdown.split("\n| variant |")[1].split("\n")[0]
    assert header.count("|") > 3 and not any(cell.strip().startswith("front") for cell in header.split("|"))
    assert (tmp_path / "lenet5-front_front.png").stat().st_size > 1000


def test_front_points_in_worker_processes_equal_the_points_in_this_process():
    """front_points(workers=2) spawns processes for the points; each point draws from its own seeded generators, so
    with one thread in this process too the scores are equal to the last bit and come back in budget order. Oracle:
    the same call with workers=1; a bad count is refused by name."""
    from varbnn_lab.evaluation import front_points

    config = get_config("lenet5-front", quick=True)
    torch.manual_seed(0)
    model = build_model(config, config.variants[0])
    g = torch.Generator().manual_seed(1)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)

    train, validation, test = split(200), split(100), split(100)
    soft = torch.softmax(torch.randn(200, 10, generator=g), dim=-1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here = front_points(config, model, train, validation, test, 0, False, soft, workers=1)
        spawned = front_points(config, model, train, validation, test, 0, False, soft, workers=2)
    finally:
        torch.set_num_threads(threads)
    assert list(spawned) == list(here) and spawned == here
    assert {f"front{b}_test_error" for b in config.prune_front} <= set(here)
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        front_points(config, model, train, validation, test, 0, False, soft, workers=0)


def test_prune_front_is_checked_and_leaves_the_older_protocols_alone():
    base = get_config("lenet5-prune")
    assert "prune_front" not in base.to_dict() and "prune_front" not in base.training_dict()
    front = get_config("lenet5-front")
    same = lambda c: {k: v for k, v in c.training_dict().items() if k not in ("name", "seeds")}  # noqa: E731
    assert same(front) == same(base) and front.seeds == (0, 1, 2)  # lenet5-prune's training, three seeds
    for bad in ((120_000, 60_000), (0,), [60_000], (60_000, 60_000), (True,)):
        with pytest.raises(ValueError, match="prune_front"):
            dataclasses.replace(front, prune_front=bad)
    for changes in ({"prune_stages": 0, "prune_scratch_epochs": 0}, {"prune": False}, {"validation_size": 0}):
        with pytest.raises(ValueError, match="prune_front"):
            dataclasses.replace(front, **changes)
    with pytest.raises(ValueError, match="'prune_front' figure"):
        dataclasses.replace(front, prune_front=(), prune_budget=(120_000, 15_000))


def test_the_front_table_formats_seed_means_names_unreached_budgets_and_skips_nan_in_the_choice():
    from varbnn_lab.render import _front_table, _thousands

    assert [_thousands(v) for v in (125_000, 60_400, 1_000_000, 1_500_000)] == ["125K", "60.4K", "1M", "1.5M"]
    rows = [
        {"variant": "a", "front60000_architecture": "3-8-90-40 / 3-9-96-41", "front60000_parameters": 5000.5,
         "front60000_flops": 59871.33, "front60000_reached": 0.5, "front60000_validation_error": float("nan"),
         "front60000_test_error": 0.012},
        {"variant": "b", "front60000_architecture": "2-8-90-40", "front60000_parameters": 4000.0,
         "front60000_flops": 50000.0, "front60000_reached": 1.0, "front60000_validation_error": 0.02,
         "front60000_test_error": 0.015, "front60000_test_error_sem": 0.001},
    ]  # fmt: skip
    lines = _front_table(rows)
    assert "| 60K | a | 3-8-90-40 / 3-9-96-41 | 5,000 | 59,871 | 50% of seeds |" in "\n".join(lines)
    assert any(line.startswith("| 60K | b |") and "1.50% ± 0.10%" in line for line in lines)
    assert lines[-1].startswith("- 60K FLOPs: b ")  # a's NaN validation error is not chosen


def test_the_front_goals_and_table_2_verdicts_follow_the_points_chosen_on_validation():
    """Issue 30's verdicts on the LeNet-5 front: each goal on the largest budget within its FLOPs limit (met only with
    the budget reached and the error within the limit), each Table 2 row against the best point at most its smaller
    size, with the random-initialisation control named when it misses the row too."""
    from varbnn_lab.render import front_goal_lines

    def point(budget, flops, test, scratch, reached=1.0, validation=0.01, variant="RDP", scratch_validation=0.02):
        p = f"front{budget}"
        return {f"{p}_architecture": f"arch{budget}", f"{p}_flops": flops, f"{p}_test_error": test,
                f"{p}_scratch_test_error": scratch, f"{p}_reached": reached, f"{p}_validation_error": validation,
                f"{p}_scratch_validation_error": scratch_validation, f"{p}_parameters": 1.0, "variant": variant}  # fmt: skip

    row = {**point(60_000, 59_000, 0.0125, 0.013), **point(120_000, 118_000, 0.0105, 0.012),
           **point(160_000, 150_000, 0.0101, 0.0099), **point(310_000, 300_000, 0.0080, 0.0085),
           **point(1_000_000, 900_000, 0.0070, 0.0072)}  # fmt: skip
    text = "\n".join(front_goal_lines([row]))
    assert "<= 1.0% test error at <= 160K FLOPs: **not met** (the 160K point: arch160000, 150,000 FLOPs, test error 1.01%" in text
    assert "<= 1.1% test error at <= 120K FLOPs: **met** (the 120K point: arch120000, 118,000 FLOPs" in text
    # the control as a second candidate: here the posterior's validation error is the lower one at every point
    assert text.count("the posterior weights, test error") == 2 and "1.01%: not met by that pipeline" in text
    # where the control's validation error is lower, its test error decides: 0.99% meets the 160K goal
    chooses_control = {**row, **point(160_000, 150_000, 0.0101, 0.0099, scratch_validation=0.005)}
    assert "the random-init weights, test error 0.99%: met by that pipeline" in "\n".join(front_goal_lines([chooses_control]))
    lines = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    # RDP (paper): 113,148 FLOPs at 1.0%: only the 60K point fits, 1.25% (its random init 1.30% misses it too)
    missed = "not matched (random init at the front point's architecture misses it too) |"
    assert lines["RDP (paper)"].endswith(f"| 60K | 59,000 | 1.25% | 1.30% | {missed}")
    # FDOO(100K): 111,604 at 1.1%: the 60K point again, but its control 1.30% > 1.1% as well
    assert "not matched (random init" in lines["FDOO(100K)"]
    # BC-GHS: 156,922 at 1.0%: the 160K point (150,000 FLOPs) at 1.01%, whose control reaches 0.99%: not matched
    assert lines["BC-GHS"].endswith("| 160K | 150,000 | 1.01% | 0.99% | not matched |")
    # GL: 204,806 at 1.0%: the best point within it is still 160K; SBP: 215,975 at 0.9% likewise; BC-GNJ 288,337 too
    assert "not matched" in lines["GL"] and "not matched" in lines["SBP"]
    # GD: 254,778 at 1.1%: the 160K point (1.01%) matches it
    assert lines["GD"].endswith("| matched or beaten |")
    # a budget not reached by every seed does not meet a goal even within the error
    unreached = {**point(120_000, 118_000, 0.0100, 0.012, reached=2 / 3)}
    assert "at <= 120K FLOPs: **not met**" in "\n".join(front_goal_lines([unreached]))
    assert front_goal_lines([{"variant": "RDP"}]) == []


def test_lenet5_prune_published_differs_from_lenet5_prune_only_in_the_published_choices():
    base, published = get_config("lenet5-prune"), get_config("lenet5-prune-published")
    assert published.variants[0].family_options == {**base.variants[0].family_options, "radius_init": "even"}
    assert published.kl_annealing_epochs == 100 != base.kl_annealing_epochs
    for field in dataclasses.fields(base):
        if field.name not in ("name", "description", "variants", "kl_annealing_epochs"):
            assert getattr(published, field.name) == getattr(base, field.name), field.name
    assert _checkpoint_path(published, "out", published.variants[0], 0) != _checkpoint_path(base, "out", base.variants[0], 0)


def test_lenet5_radius_prior_changes_one_thing_per_variant_from_lenet5_prune():
    """Issue 30's radius-prior search: each posterior differs from lenet5-prune's in one prior scale or in the radius
    split, and everything else but the run length and the pruning rules (gap and validation only) is lenet5-prune's."""
    base, search = get_config("lenet5-prune"), get_config("lenet5-radius-prior")
    reference = base.variants[0]
    changes = []
    for variant in search.variants:
        assert variant.family == reference.family and variant.prior == reference.prior
        family = {k: v for k, v in variant.family_options.items() if reference.family_options.get(k) != v}
        prior = {k: v for k, v in variant.prior_options.items() if reference.prior_options.get(k) != v}
        assert set(variant.family_options) == set(reference.family_options)
        assert set(variant.prior_options) == set(reference.prior_options)
        changes.append({**family, **prior})
    assert changes == [{}, {"local_scale": 1e-3}, {"local_scale": 2e-4}, {"global_scale": 1e-5}, {"radius_init": "even"}]
    assert search.epochs == 60 and search.prune_budget is None and not search.prune_front
    assert search.prune_stages == search.prune_finetune_epochs == search.prune_scratch_epochs == 0
    changed = ("name", "description", "variants", "epochs", "prune_budget", "prune_finetune_epochs", "prune_stages",
               "prune_scratch_epochs", "figures", "quick")  # fmt: skip
    for field in dataclasses.fields(base):
        if field.name not in changed:
            assert getattr(search, field.name) == getattr(base, field.name), field.name
    assert len({_checkpoint_path(search, "out", v, 0) for v in search.variants}) == 5


def test_lenet5_radius_init_quick_run_shows_the_even_splits_huge_kl(data_dir, tmp_path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = get_config("lenet5-radius-init", quick=True)
        result = run_experiment(config, out_dir=tmp_path, data_dir=str(data_dir), progress=False)
    rows = {row["variant"]: row for row in result["rows"]}
    even, prior = rows["RDP double, radius_init=even"], rows["RDP double, radius_init=prior"]
    assert even["final_train_loss"] > 100 * prior["final_train_loss"]  # KL / N of ~1e8-1e9 nats vs ~1e5


def test_best_of_last_keeps_the_lowest_training_nll_of_the_last_epochs_and_survives_a_restart(tmp_path):
    checkpoint = tmp_path / "run.pt"
    checkpoint.write_bytes(b"")  # only its existence matters to the selector
    model = nn.Linear(2, 1)
    selector = _BestOfLast(model, epochs=5, last=3, checkpoint=checkpoint)
    states = {}
    for epoch, nll in enumerate([0.1, 0.5, 0.4, 0.3, 0.35], start=1):  # epoch 1 is best overall but not in the last 3
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        states[epoch] = model.weight.detach().clone()
        selector(epoch, {"nll": nll})
        if epoch == 4:  # a killed run: a new selector reads the saved best back
            selector = _BestOfLast(model, epochs=5, last=3, checkpoint=checkpoint)
    assert selector.restore() == 4
    torch.testing.assert_close(model.weight, states[4])


def test_select_best_of_last_is_validated_and_only_changes_the_hash_when_set():
    base = get_config("mnist-mlp")
    assert "select_best_of_last" not in base.to_dict()  # saved checkpoints of configs without it keep their hashes
    assert dataclasses.replace(base, select_best_of_last=2).to_dict()["select_best_of_last"] == 2
    with pytest.raises(ValueError, match=r"select_best_of_last must be an integer in \[0, epochs="):
        dataclasses.replace(base, select_best_of_last=base.epochs + 1)
    ensemble = Variant("ens", family="ensemble", family_options={"members": 2})
    with pytest.raises(ValueError, match=r"not to a deep ensemble's members .* run \['ens'\] in a config of their own"):
        dataclasses.replace(base, variants=(*base.variants, ensemble), select_best_of_last=2)
    dataclasses.replace(base, variants=(*base.variants, ensemble))  # without the selection: fine


def test_resumable_runs_keep_their_traces_across_invocations(tmp_path):
    config = ExperimentConfig(
        name="resume-traces",
        description="",
        dataset="digits",
        model="mlp",
        model_options={"in_features": 64, "hidden": (8,), "out_features": 10},
        variants=(Variant("mf", family_options={"init_std": 1e-2}),),
        epochs=2,
        batch_size=512,
        seeds=(0,),
        eval_samples=2,
        log_steps=(2, 5),
        snr_tensor="1.weight",
        snr_window=2,
        resumable=True,
        figures=("traces",),
    )
    first = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    sidecars = list((tmp_path / ".checkpoints").glob("resume-traces-*/mf-seed0.traces.json"))
    assert len(sidecars) == 1 and json.loads(sidecars[0].read_text())["epoch"] == 2
    again = run_experiment(config, out_dir=tmp_path, progress=False, command="test")  # finished: only re-evaluated
    assert again["traces"] == first["traces"] and [r["step"] for r in again["traces"]["mf"][0]] == [2, 5]
    for key in ("snr@2", "snr@5", "accuracy"):
        assert again["rows"][0][key] == first["rows"][0][key]
    assert again["rows"][0]["train_seconds"] == pytest.approx(first["rows"][0]["train_seconds"], rel=0.5)


def test_git_commit_marks_code_changes_dirty_but_not_results(tmp_path, monkeypatch):
    import shutil
    import subprocess

    from varbnn_lab import engine

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    source = repo / "lab" / "varbnn_lab"
    source.mkdir(parents=True)
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (source / "engine.py").write_text("code\n")
    (repo / "benchmarks" / "results" / "runs.jsonl").write_text("{}\n")

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    monkeypatch.delenv("VARBNN_COMMIT", raising=False)
    monkeypatch.setattr(engine, "__file__", str(source / "engine.py"))
    assert engine.git_commit() == head
    (repo / "benchmarks" / "results" / "runs.jsonl").write_text("{}\n{}\n")  # a run appending its records
    assert engine.git_commit() == head
    (source / "engine.py").write_text("changed\n")
    assert engine.git_commit() == head + "+dirty"
    monkeypatch.setenv("VARBNN_COMMIT", "abc")
    assert engine.git_commit() == "abc"


def test_lenet5_widths_sizes_match_the_paper_formulas():
    from varbnn.prune import count_parameters_and_flops

    x = torch.zeros(2, 1, 28, 28)
    # default: the original 20-50-500; (5*5*1+1)*20 + (5*5*20+1)*50 + (800+1)*500 + (500+1)*10
    assert count_parameters_and_flops(lenet5(), x)[0] == 520 + 25050 + 400500 + 5010
    # 4-7-66: conv (Kw*Kh*Cin+1)(H-Kh+1)(W-Kw+1)*Cout, fc (In+1)*Out
    params, flops = count_parameters_and_flops(lenet5(widths=(4, 7, 66)), x)
    assert params == 104 + 707 + 113 * 66 + 67 * 10
    assert flops == 26 * 24 * 24 * 4 + 101 * 8 * 8 * 7 + 113 * 66 + 67 * 10
    assert lenet5(widths=(4, 7, 66))(x).shape == (2, 10)
    with pytest.raises(ValueError, match="widths"):
        lenet5(widths=(4, 0, 66))


def test_ood_dataset_adds_aurocs_and_a_figure(tmp_path):
    config = ExperimentConfig(
        name="ood",
        description="",
        dataset="digits",
        model="mlp",
        model_options={"in_features": 64, "hidden": (16,), "out_features": 10},
        variants=(Variant("plain", family="plain"), Variant("mf", family_options={"init_std": 1e-2})),
        epochs=3,
        batch_size=128,
        seeds=(0,),
        eval_samples=4,
        ood_dataset="digits-noise",
        figures=("ood",),
    )
    result = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    rows = {r["variant"]: r for r in result["rows"]}
    for row in rows.values():
        assert 0.0 <= row["ood_auroc_entropy"] <= 1.0
    assert rows["plain"]["ood_auroc_mi"] == pytest.approx(0.5)  # no epistemic term: every score ties
    assert rows["mf"]["ood_auroc_mi"] != pytest.approx(0.5)
    assert (tmp_path / "ood_ood.png").exists() and result["figures"] == ["ood_ood.png"]
    # evaluation-only: the checkpoint hash ignores it, and the default leaves existing hashes alone
    assert "ood_dataset" not in config.training_dict()
    assert "ood_dataset" not in dataclasses.replace(config, ood_dataset="", figures=()).to_dict()


def test_rotated_digits_are_the_test_digits_turned():
    from varbnn_lab.runner import load_classification

    x, y = load_classification("digits", "test")
    turned, labels = load_classification("digits-rotated", "test")
    assert torch.equal(labels, y)
    assert torch.equal(turned.view(-1, 8, 8)[0], torch.rot90(x.view(-1, 8, 8)[0], 1))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"figures": ("ood",), "ood_dataset": ""}, "need an ood_dataset"),
        ({"figures": ("overview",), "ood_dataset": ""}, "need an ood_dataset"),
        ({"kl_weight": -1.0}, "kl_weight must be a finite number >= 0"),
    ],
)
def test_ood_and_kl_weight_fields_are_validated(change, message):
    base = get_config("demo")
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(base, **change)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Variant("x", early_stopping=-1), "early_stopping must be an integer >= 0"),
        (lambda: Variant("x", early_stopping=True), "early_stopping must be an integer >= 0"),
        (lambda: Variant("x", temperature=1), "temperature must be True or False"),
        (lambda: Variant("x", family="temperature", temperature=True), "not to the post-hoc baseline 'temperature'"),
        (lambda: Variant("x", family="laplace", early_stopping=3), "not to the post-hoc baseline 'laplace'"),
        (lambda: Variant("x", early_stopping=3, convert_epochs=2), "early_stopping and convert_epochs cannot be combined"),
        (lambda: dataclasses.replace(get_config("demo"), validation_size=0), "need a validation_size"),
        (lambda: dataclasses.replace(get_config("demo"), select_best_of_last=2), "select_best_of_last and a variant's"),
        (lambda: Variant("x", optimizer="sgd"), r"optimizer must be one of \['', 'adam', 'amsgrad', 'ivon'\]"),
        (lambda: Variant("x", optimizer_options={"lr": 0.1}), "optimizer_options apply to optimizer='ivon'"),
        (lambda: Variant("x", family="plain", optimizer="ivon"), "optimizer='ivon' trains MeanField posteriors"),
        (lambda: build_model(get_config("demo"), Variant("x", family="ensemble", family_options={"member": "nope"})),
         "member must be 'plain' or a family name"),
    ],
)
def test_recipe_variant_fields_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_recipe_fields_keep_the_hashes_of_configs_that_do_not_use_them():
    from varbnn_lab.registry import CONFIGS

    for name, config in CONFIGS.items():
        for variant, entry in zip(config.variants, config.to_dict()["variants"]):
            assert ("early_stopping" in entry) == bool(getattr(variant, "early_stopping", 0)), name
            assert ("temperature" in entry) == bool(getattr(variant, "temperature", False)), name
            assert ("optimizer" in entry) == bool(getattr(variant, "optimizer", "")), name
    demo = get_config("demo").to_dict()["variants"]
    assert [v.get("early_stopping", 0) for v in demo] == [0, 5, 0, 5]


def test_ivon_variants_and_mixtures_of_posteriors():
    """optimizer='ivon' gives each trained network (each member of a mixture) its own IVON; a mixture's members are
    posteriors of the named family, evaluated with a multiple of their number of draws."""
    from varbnn import BayesLinear
    from varbnn.baselines import DeepEnsemble
    from varbnn.optim import IVON
    from varbnn_lab.evaluation import draws
    from varbnn_lab.runner import _variant_optimizer

    config = dataclasses.replace(get_config("demo"), eval_samples=7)
    ivon = Variant("ivon", optimizer="ivon", optimizer_options={"lr": 0.05, "hess_init": 0.2})
    model = build_model(config, ivon)
    optimizer = _variant_optimizer(config, ivon, model, 100)
    assert isinstance(optimizer, IVON) and optimizer.defaults["lr"] == 0.05 and optimizer.ess == 100
    mixture = Variant("mix", family="ensemble", family_options={"members": 3, "member": "meanfield"}, optimizer="ivon")
    ensemble = build_model(config, mixture)
    assert isinstance(ensemble, DeepEnsemble) and all(isinstance(m[1], BayesLinear) for m in ensemble.members)
    assert draws(config, mixture, ensemble) == 9 and draws(config, Variant("plain", family="plain"), model) == 1
    plain_mixture = Variant("ens", family="ensemble", family_options={"members": 3})
    assert draws(config, plain_mixture, build_model(config, plain_mixture)) == 7


def test_kl_weight_scales_the_annealed_beta_and_keeps_old_hashes():
    from varbnn_lab.runner import _kl_weight

    config = get_config("mnist-mlp")
    assert "kl_weight" not in config.to_dict()  # the default 1.0 keeps existing checkpoint hashes
    model = build_model(config, config.variants[-1])
    assert _kl_weight(config, 0, model) == {"kl_weight": 1.0}
    tempered = dataclasses.replace(config, kl_weight=0.1)
    assert "kl_weight" in tempered.training_dict()
    schedule = _kl_weight(tempered, 10, model)["kl_weight"]
    assert schedule(5) == pytest.approx(0.05) and schedule(20) == pytest.approx(0.1)
    assert _kl_weight(dataclasses.replace(config, kl_weight=None), 0, model) == {}  # fit's own default
    annealed = _kl_weight(dataclasses.replace(config, kl_weight=None), 10, model)["kl_weight"]  # to the model's default
    assert annealed(20) == pytest.approx(MeanField.default_kl_weight) and annealed(5) == pytest.approx(0.5 * 0.1)


def _baselines_config() -> ExperimentConfig:
    """A digits MLP with every baseline as a variant, 2 epochs, resumable, with a validation split."""
    return ExperimentConfig(
        name="baselines",
        description="",
        dataset="digits",
        model="mlp",
        model_options={"in_features": 64, "hidden": (16,), "out_features": 10},
        variants=(
            Variant("plain", family="plain"),
            Variant("temperature", family="temperature"),
            Variant("mc dropout", family="mc-dropout", family_options={"p": 0.2}),
            Variant("ensemble", family="ensemble", family_options={"members": 2}),
            Variant("laplace", family="laplace"),
        ),
        epochs=2,
        batch_size=128,
        seeds=(0,),
        eval_samples=4,
        validation_size=200,
        resumable=True,
        figures=(),
    )


def test_reproduce_compile_is_a_runtime_choice_recorded_per_run(tmp_path, fit_compile_spy):
    """``compile`` reaches every ``fit`` of the runs (plain, a family, the plain network a post-hoc run starts from),
    each record says it, the page counts the compiled step as a device of its own, and it is not part of the protocol:
    an eager invocation finds the compiled runs done. (fit(compile=True) itself is tested in test_compile.py; here
    ``fit`` is spied on and runs eagerly.)"""
    from varbnn_lab import runner

    seen = fit_compile_spy(runner)
    config = dataclasses.replace(
        _baselines_config(),
        variants=(Variant("plain", family="plain"), Variant("mf", family="meanfield"), Variant("T", family="temperature")),
        epochs=1,
    )
    result = run_experiment(config, out_dir=tmp_path, progress=False, compile="max-autotune")
    assert seen == ["max-autotune"] * 3
    records = [json.loads(line) for line in (tmp_path / "baselines_runs.jsonl").read_text().splitlines()]
    assert [r["compile"] for r in records] == ["max-autotune"] * 3
    assert all(d.endswith(", compiled step (max-autotune)") for d in result["variant_devices"])
    seen.clear()
    run_experiment(config, out_dir=tmp_path, progress=False)
    assert seen == []  # the same protocol: nothing to train again
    with pytest.raises(ValueError, match=r"compile must be True, False or one of the modes \['default'"):
        run_experiment(config, out_dir=tmp_path, progress=False, compile="fast")
    with pytest.raises(ValueError, match="compile is not available with distributed training"):
        run_experiment(config, out_dir=tmp_path / "d", progress=False, compile=True, distributed=True)
    graves = dataclasses.replace(config, variants=(Variant("g", family_options={"estimator": "graves"}),))
    with pytest.raises(ValueError, match=r"compile is not available for \['g'\].*--variants"):
        run_experiment(graves, out_dir=tmp_path / "g", progress=False, compile=True)
    seen.clear()  # compile=True (the CLI's --compile alone) reaches fit as True; on the CPU the record says "default"
    run_experiment(dataclasses.replace(config, variants=config.variants[1:2]), out_dir=tmp_path / "t", progress=False,
                   compile=True)  # fmt: skip
    assert seen == [True]
    (record,) = [json.loads(line) for line in (tmp_path / "t" / "baselines_runs.jsonl").read_text().splitlines()]
    assert record["compile"] == "default"


def test_a_figure_that_cannot_be_redrawn_is_named_not_dropped_silently(tmp_path, capsys):
    config = dataclasses.replace(_baselines_config(), variants=(Variant("plain", family="plain"),), epochs=1)
    (tmp_path / "baselines_reliability.png").write_bytes(b"an earlier figure")
    (tmp_path / "baselines-other.png").write_bytes(b"another experiment's")
    result = run_experiment(config, out_dir=tmp_path, progress=False)
    assert result["figures"] == []
    err = capsys.readouterr().err
    assert "[baselines] not redrawn, so left off the page" in err and err.rstrip().endswith(": baselines_reliability.png")
    assert (tmp_path / "baselines_reliability.png").read_bytes() == b"an earlier figure"


def test_baselines_run_through_the_same_runner(tmp_path):
    """Temperature scaling, MC dropout, a deep ensemble and last-layer Laplace as variants of one config: trained and
    evaluated by the generic loop, resumable, with their own checkpoint per ensemble member."""
    config = _baselines_config()
    result = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"plain", "temperature", "mc dropout", "ensemble", "laplace"}
    # temperature scaling never changes the predicted class
    assert rows["temperature"]["accuracy"] == pytest.approx(rows["plain"]["accuracy"])
    assert rows["ensemble"]["parameters"] == pytest.approx(2 * rows["plain"]["parameters"])
    members = sorted(p.name for p in (tmp_path / ".checkpoints").rglob("ensemble-seed0*.pt"))
    assert members == ["ensemble-seed0-member0.pt", "ensemble-seed0-member1.pt"]
    again = run_experiment(config, out_dir=tmp_path, progress=False, command="test")  # resumes every finished run
    assert {r["variant"]: r["accuracy"] for r in again["rows"]} == {v: r["accuracy"] for v, r in rows.items()}


def test_an_ensemble_resumed_in_a_later_member_counts_the_members_trained_before(tmp_path, monkeypatch):
    """Each member commits the run's training time into its own checkpoint; a run cut off after member 0 and resumed
    reads it back from there (it used to look for the run's own checkpoint, which an ensemble never writes, and
    counted only the invocation that finished it). Member 0's committed time is set to 1,000 s to tell them apart."""
    from varbnn_lab import hooks

    config = dataclasses.replace(
        _baselines_config(), variants=(Variant("ensemble", family="ensemble", family_options={"members": 2}),), epochs=1
    )
    run_experiment(config, out_dir=tmp_path, progress=False)
    runs = tmp_path / "baselines_runs.jsonl"
    first = json.loads(runs.read_text())["scores"][0][1]["train_seconds"]
    assert 0 < first < 1000
    runs.unlink()  # cut off after member 0: member 1's checkpoint and the run's record are not there
    (member1,) = (tmp_path / ".checkpoints").rglob("ensemble-seed0-member1.pt")
    member1.unlink()
    real = hooks.committed_state

    def member0_took_1000_seconds(checkpoint):
        state = real(checkpoint)
        if state is not None and checkpoint.name.endswith("member0.pt"):
            state["extra"]["traces"]["train_seconds"] = 1000.0
        return state

    monkeypatch.setattr(hooks, "committed_state", member0_took_1000_seconds)
    run_experiment(config, out_dir=tmp_path, progress=False)
    resumed = json.loads(runs.read_text())["scores"][0][1]["train_seconds"]
    assert 1000.0 < resumed < 1000.0 + 10 * first


@pytest.mark.parametrize(
    "variant, message",
    [
        (Variant("x", family="mc-dropout", family_options={"q": 1}), "unknown family_options"),
        (Variant("x", family="ensemble", family_options={"members": 1}), "members must be an int >= 2"),
    ],
)
def test_baseline_options_are_validated(variant, message):
    config = dataclasses.replace(get_config("demo"), variants=(variant,))
    with pytest.raises(ValueError, match=message):
        build_model(config, variant)


def test_uncertainty_benchmark_quick_run(data_dir, tmp_path):
    """The --quick form of the issue-26 benchmark: every family at the library's defaults and every baseline, one
    table with OOD AUROCs (MNIST -> Fashion-MNIST)."""
    config = get_config("uncertainty-mnist", quick=True)
    result = run_experiment(config, out_dir=tmp_path, data_dir=str(data_dir), progress=False, command="test")
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {v.label for v in config.variants}
    for row in rows.values():
        assert 0 <= row["accuracy"] <= 1 and row["nll"] > 0 and 0 <= row["ood_auroc_entropy"] <= 1
    assert result["figures"] == ["uncertainty-mnist_cost.png", "uncertainty-mnist.png"]
    assert all(row["predict_seconds"] > 0 for row in rows.values())


def test_post_hoc_baselines_reuse_the_plain_runs_training(tmp_path):
    """Temperature scaling and Laplace start from the plain variant's finished checkpoint (the same network for the
    same seed) instead of training it again: the same weights, the plain run's training seconds counted, and they run
    after the plain runs whatever their place in the variants."""
    config = dataclasses.replace(
        _baselines_config(), name="reuse", eval_samples=2,
        variants=(Variant("temperature", family="temperature"), Variant("plain", family="plain")),
    )  # fmt: skip
    result = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    rows = {r["variant"]: r for r in result["rows"]}
    checkpoints = {p.stem: p for p in (tmp_path / ".checkpoints").rglob("*.pt")}
    plain_state = read_checkpoint(checkpoints["plain-seed0"])
    scaled_state = read_checkpoint(checkpoints["temperature-seed0"])
    assert scaled_state["epoch"] == plain_state["epoch"] == 2
    for name, tensor in plain_state["model"].items():
        assert torch.equal(tensor, scaled_state["model"][name])
    saved = scaled_state["extra"]["traces"]["train_seconds"]  # the plain run's training time, carried by the copy
    assert saved > 0 and rows["temperature"]["train_seconds"] >= saved
    assert rows["temperature"]["accuracy"] == rows["plain"]["accuracy"]
    # and the copy is exactly what training it again gives (deterministic on CPU)
    fresh = tmp_path / "fresh"
    alone = run_experiment(dataclasses.replace(config, variants=config.variants[:1]), out_dir=fresh, progress=False)
    assert alone["rows"][0]["nll"] == pytest.approx(rows["temperature"]["nll"], rel=1e-6)


def test_a_converted_variant_starts_from_the_plain_runs_network_and_counts_both_phases(tmp_path):
    """convert_epochs: the plain network is the plain run's (reused from its finished checkpoint, or trained again
    from the same seed: the same weights either way), converted with its weights as the posterior means, then trained
    N epochs; the record's training time counts the plain phase too."""
    from varbnn_lab.runner import _train_plain

    base = _baselines_config()
    config = dataclasses.replace(
        base, name="convert", eval_samples=2,
        variants=(Variant("MeanField, converted", family="meanfield", convert_epochs=1), Variant("plain", family="plain"),
                  Variant("plain, 1 more epoch", family="plain", convert_epochs=1)),
    )  # fmt: skip
    assert config.plain_variant.label == "plain"  # not the control
    result = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    rows = {r["variant"]: r for r in result["rows"]}
    checkpoints = {p.stem: p for p in (tmp_path / ".checkpoints").rglob("*.pt")}
    plain = read_checkpoint(checkpoints["plain-seed0"])
    reused = read_checkpoint(checkpoints["plain-seed0-for-conversion"])  # copied, resumed at its last epoch
    converted = read_checkpoint(checkpoints["MeanField--converted-seed0"])
    assert reused["epoch"] == plain["epoch"] == 2 and converted["epoch"] == 1
    for name, tensor in plain["model"].items():
        assert torch.equal(tensor, reused["model"][name])
    assert rows["MeanField, converted"]["train_seconds"] >= plain["extra"]["traces"]["train_seconds"] > 0
    # the control: the same plain network trained one more epoch, not converted
    control = read_checkpoint(checkpoints["plain--1-more-epoch-seed0"])
    assert control["epoch"] == 1 and set(control["model"]) == set(plain["model"])
    assert any(not torch.equal(t, control["model"][n]) for n, t in plain["model"].items())
    assert rows["plain, 1 more epoch"]["train_seconds"] >= plain["extra"]["traces"]["train_seconds"]
    # without the plain run's checkpoint the plain phase trains the same network again
    from varbnn_lab.runner import _data

    d = _data(config, None)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(d["x_train"], d["y_train"]), batch_size=128,
                                         shuffle=True)  # fmt: skip
    again, seconds = _train_plain(config, str(tmp_path / "fresh"), 0, loader, d["n_train"], d["warmup"],
                                  torch.device("cpu"), False, False)  # fmt: skip
    assert seconds > 0
    for name, tensor in plain["model"].items():
        assert torch.equal(tensor, again.state_dict()[name]), name
    # the posterior means of the converted model start at those weights (bayesianize(pretrained=True))
    from varbnn_lab.runner import build_model

    model = build_model(config, config.variants[0], trained=again)
    means = {n.removesuffix(".loc"): p for n, p in model.named_parameters() if n.endswith(".loc")}
    assert means and all(torch.equal(p, again.state_dict()[n.replace(".posteriors", "")]) for n, p in means.items())


def test_convert_epochs_is_checked_and_leaves_old_hashes_alone():
    with pytest.raises(ValueError, match="convert_epochs applies to the varbnn families"):
        Variant("x", family="temperature", convert_epochs=2)
    with pytest.raises(ValueError, match="convert_epochs must be an integer >= 0"):
        Variant("x", convert_epochs=-1)
    with pytest.raises(ValueError, match="add a variant with family='plain'"):
        dataclasses.replace(_baselines_config(), variants=(Variant("x", convert_epochs=1),))
    assert all("convert_epochs" not in v for v in get_config("mnist-mlp").to_dict()["variants"])


def test_uncertainty_goals_are_judged_from_the_rows():
    from varbnn_lab.uncertainty import comparable_times, goal_lines, goals

    def row(variant, family, nll, ece, auroc, seconds):
        return dict(variant=variant, family=family, nll=nll, ece=ece, ood_auroc_entropy=auroc, ood_auroc_mi=0.5,
                    train_seconds=seconds, predict_seconds=1.0)  # fmt: skip

    rows = [
        row("plain", "plain", 0.05, 0.010, 0.90, 100.0),
        row("T", "temperature", 0.045, 0.008, 0.91, 101.0),
        row("MCD", "mc-dropout", 0.044, 0.009, 0.92, 100.0),
        row("ens", "ensemble", 0.035, 0.006, 0.95, 500.0),
        row("MF", "meanfield", 0.038, 0.007, 0.96, 120.0),
        row("R", "radial", 0.049, 0.011, 0.93, 110.0),  # ECE above plain's: (a) fails on it alone
    ]
    (a, met_a, why_a), (b, met_b, _), (c, met_c, why_c) = goals(rows)
    assert met_a is False and "R (NLL 0.0490, ECE 0.0110)" in why_a and "MF" not in why_a.split("not below")[1]
    assert met_b is True
    assert met_c is True and "1.09 x" in why_c and "0.24 x" in why_c  # 0.038 / 0.035, 120 / 500
    rows[4]["train_seconds"] = 300.0
    assert goals(rows)[2][1] is False
    assert goals(rows[:1])[1][1] is None  # rows missing: not measured, not "not met"
    page = "\n".join(goal_lines({"rows": rows}))
    assert "| ens | 0.0350 | 0.0060 | 0.9500 | 0.5000 | 5.00 | 1.00 |" in page and "**not met**" in page
    # a partial result: a family of the config without runs leaves (a) unjudged and is named under (b) and (c)
    rows[5]["ece"] = 0.009  # now every family present is below plain on both
    variants = [{"label": r["variant"], "family": r["family"]} for r in rows] + [{"label": "KT", "family": "ktied"}]
    partial = "\n".join(goal_lines({"rows": rows, "config": {"variants": variants}}))
    assert "- (a) every family's NLL and ECE below the plain network's: not measured (no runs yet for KT)" in partial
    assert partial.count("judged without KT") == 2
    assert "not measured" not in "\n".join(goal_lines({"rows": rows, "config": {"variants": variants[:-1]}}))
    # runs from two devices: times are not compared across them
    on_two = {"cuda: H200": ["plain", "T", "MCD", "MF", "R"], "cpu: EPYC": ["ens"]}
    page = "\n".join(goal_lines({"rows": rows, "variant_devices": on_two}))
    assert "| ens | 0.0350 | 0.0060 | 0.9500 | 0.5000 | – | 1.00 |" in page and "| MF | 0.0380 |" in page
    assert "| R | 0.0490 | 0.0090 | 0.9300 | 0.5000 | 1.10 |" in page
    c = goals(rows, devices={"MF": frozenset({"cuda: H200"}), "ens": frozenset({"cpu: EPYC"})})[2]
    assert c[1] is None and "not compared" in c[2] and "1.09 x" in c[2]  # NLL within 10%: the cost decides, unmeasured
    rows[4]["nll"] = 0.04
    assert goals(rows, devices={"MF": frozenset({"cuda: H200"}), "ens": frozenset({"cpu: EPYC"})})[2][1] is False
    # the cost figure's rows: only those trained on the plain network's device
    shown, other = comparable_times(rows, on_two)
    assert [r["variant"] for r in shown] == ["plain", "T", "MCD", "MF", "R"] and other == ["ens"]
    assert "the cost figure leaves these rows out" in page
    assert comparable_times(rows, None) == (rows, []) and comparable_times(rows[1:], on_two) == (rows[1:], [])
    mixed = {**on_two, "cpu: EPYC": ["ens", "MF"]}  # MF trained on both: its mean time mixes devices
    assert comparable_times(rows, mixed)[1] == ["ens", "MF"]


def test_a_variant_added_to_the_table_leaves_the_other_records_and_checkpoints_standing(tmp_path):
    """Records and checkpoints are keyed by each variant's own protocol: adding a row trains that row only; changing
    a training field retrains every row."""
    base = dataclasses.replace(_baselines_config(), variants=(Variant("plain", family="plain"),))
    run_experiment(base, out_dir=tmp_path, progress=False, command="one")
    runs = tmp_path / "baselines_runs.jsonl"
    first = runs.read_text().splitlines()
    wider = dataclasses.replace(base, variants=(*base.variants, Variant("mean-field", family="meanfield")))
    assert _checkpoint_path(wider, tmp_path, wider.variants[0], 0) == _checkpoint_path(base, tmp_path, base.variants[0], 0)
    result = run_experiment(wider, out_dir=tmp_path, progress=False, command="two")
    lines = runs.read_text().splitlines()
    assert lines[0] == first[0] and len(lines) == 2  # the plain record stands, only the new row was trained
    assert [r["variant"] for r in result["rows"]] == ["plain", "mean-field"]
    slower = dataclasses.replace(wider, lr=2e-3)
    assert _checkpoint_path(slower, tmp_path, slower.variants[0], 0) != _checkpoint_path(wider, tmp_path, wider.variants[0], 0)
    run_experiment(slower, out_dir=tmp_path, progress=False, command="three")
    assert len(runs.read_text().splitlines()) == 4  # both rows again under the new protocol


def test_runs_are_batched_seed_by_seed_with_post_hoc_runs_after_their_plain_run():
    """One process: every run in one batch, seed-major, post-hoc runs after their seed's trainings. Workers: a seed's
    post-hoc runs move to the front of the next seed's batch (never beside the plain run they reuse); without
    post-hoc runs everything is one batch."""
    from varbnn_lab.runner import _batches

    labels = ("temperature", "plain", "meanfield", "laplace")
    pending = [(label, seed) for label in labels for seed in (2, 0, 1)]
    post_hoc = {"temperature", "laplace"}
    (alone,) = _batches(pending, (0, 1, 2), post_hoc, workers=1)
    assert [k[1] for k in alone] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(k[0] in post_hoc for k in alone[2:4]) and not any(k[0] in post_hoc for k in alone[:2])
    batches = _batches(pending, (0, 1, 2), post_hoc, workers=2)
    assert [sorted(b) for b in batches] == [
        [("meanfield", 0), ("plain", 0)],
        [("laplace", 0), ("meanfield", 1), ("plain", 1), ("temperature", 0)],
        [("laplace", 1), ("meanfield", 2), ("plain", 2), ("temperature", 1)],
        [("laplace", 2), ("temperature", 2)],
    ]
    assert all(k[0] in post_hoc for k in batches[1][:2])  # the carried runs first
    for i, batch in enumerate(batches):  # no post-hoc run shares a batch with its own seed's plain run
        assert not {k[1] for k in batch if k[0] in post_hoc} & {k[1] for k in batch if k[0] == "plain"}, i
    # a resumed invocation: seed 0 done but its Laplace run; seed 1 pending
    resumed = _batches([("laplace", 0), ("plain", 1), ("temperature", 1)], (0, 1), post_hoc, workers=2)
    assert resumed == [[("laplace", 0), ("plain", 1)], [("temperature", 1)]]
    assert _batches([], (0,), post_hoc, workers=2) == []
    # nothing post-hoc (e.g. lenet5-front: one variant, three seeds): one batch, so the workers train seeds in parallel
    trains = [("rdp", 2), ("rdp", 0), ("rdp", 1)]
    assert _batches(trains, (0, 1, 2), post_hoc, workers=3) == [[("rdp", 0), ("rdp", 1), ("rdp", 2)]]
