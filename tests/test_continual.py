"""Variational continual learning: posterior -> prior, multi-head views, the Split Fashion-MNIST runner."""

import math
import os
from pathlib import Path

import pytest
import torch

import varbnn
from varbnn.continual import MultiHeadNet, posterior_as_prior, set_posterior_as_prior
from varbnn.priors import Normal, RadialPrior


def _net(family):
    torch.manual_seed(0)
    return varbnn.bayesianize(
        torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)), family, Normal(0, 1)
    )


def test_meanfield_posterior_as_prior_gives_zero_kl_exactly():
    net = _net(varbnn.MeanField(init_std=0.2))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    assert float(varbnn.kl(net)) > 1.0
    assert set_posterior_as_prior(net) == 4
    assert abs(float(varbnn.kl(net))) < 1e-4
    # the prior is a frozen copy: moving the posterior makes the KL positive again
    with torch.no_grad():
        net[0].posteriors["weight"].loc.add_(0.1)
    assert float(varbnn.kl(net)) > 0.01
    assert not any(p.requires_grad for m in net.modules() if isinstance(m, varbnn.priors.Prior) for p in m.buffers())


def test_radial_posterior_becomes_a_radial_prior_with_zero_kl_in_expectation():
    net = _net(varbnn.Radial(init_std=0.3))
    set_posterior_as_prior(net)
    assert isinstance(net[0].priors["weight"], RadialPrior)
    torch.manual_seed(1)
    with torch.no_grad():
        estimates = torch.stack([varbnn.kl(net) for _ in range(3000)]).double()
    se = float(estimates.std()) / math.sqrt(estimates.numel())
    assert abs(float(estimates.mean())) < 5 * se


def test_families_without_a_prior_form_are_refused_by_name():
    family = varbnn.Delta().build((2, 2))
    with pytest.raises(ValueError, match="supported posteriors: MeanField, KTied, Radial"):
        posterior_as_prior(family)


def test_multi_head_task_model_shares_modules_and_counts_trunk_and_one_head():
    torch.manual_seed(2)
    family, prior = varbnn.MeanField(init_std=0.1), Normal(0, 1)
    trunk = varbnn.bayesianize(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()), family, prior)
    heads = [varbnn.bayesianize(torch.nn.Linear(3, 2), family, prior) for _ in range(3)]
    model = MultiHeadNet(trunk, heads)
    view = model.task_model(1)
    assert view[0] is trunk and view[1] is heads[1]
    torch.testing.assert_close(varbnn.kl(view), varbnn.kl(trunk) + varbnn.kl(heads[1]))
    with varbnn.sample_mode(model, "mean"):
        x = torch.randn(5, 4)
        torch.testing.assert_close(model(x, 1), view(x))
    with pytest.raises(ValueError, match="task must be in"):
        model(x, 3)


def test_tensor_batches_cover_every_example_once_and_drop_last():
    from varbnn_lab.continual import TensorBatches

    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    seen = torch.cat([b for _, b in TensorBatches(x, y, 3)])
    assert sorted(seen.tolist()) == list(range(10))
    assert len(TensorBatches(x, y, 3, drop_last=True)) == 3 and len(list(TensorBatches(x, y, 3, drop_last=True))) == 3


def test_vcl_quick_run_writes_results_and_resumes(tmp_path):
    if not (Path(os.environ.get("VARBNN_DATA", "../shared/data")) / "fashion-mnist").exists():
        pytest.skip("Fashion-MNIST not available")
    from varbnn_lab.continual import run_vcl, vcl_config

    config = vcl_config(quick=True)
    result = run_vcl(config, out_dir=tmp_path, progress=False, command="test")
    rows = result["rows"]
    assert len(rows) == len(config.variants) * 5
    last = [r for r in rows if r["after_task"] == 5]
    assert all(0.0 <= r["mean"][0] <= 1.0 for r in last)
    assert all(f"head{j}" in last[0] for j in range(1, 6))
    for suffix in (".json", ".md", ".png", "_heads.png", "_runs.jsonl"):
        assert (tmp_path / f"{config.name}{suffix}").exists()
    page = (tmp_path / f"{config.name}.md").read_text()
    assert f"]({config.name}.png)" in page and f"]({config.name}_heads.png)" in page
    # a rerun trains nothing new: the cached runs are reused
    lines = (tmp_path / f"{config.name}_runs.jsonl").read_text().splitlines()
    again = run_vcl(config, out_dir=tmp_path, progress=False, command="test")
    assert (tmp_path / f"{config.name}_runs.jsonl").read_text().splitlines() == lines
    assert [r["mean"][0] for r in again["rows"]] == [r["mean"][0] for r in rows]


def _have(folder):
    return (Path(os.environ.get("VARBNN_DATA", "../shared/data")) / folder).exists()


def test_retina_quick_runs_shards_and_renders(tmp_path):
    if not _have("retinamnist"):
        pytest.skip("RetinaMNIST not available")
    from varbnn_lab.retina import REFERRAL_FRACTIONS, retina_config, run_retina

    config = retina_config("retina-referral", quick=True)
    run_retina(config, out_dir=tmp_path, progress=False, command="test", shard=(0, 2))
    run_retina(config, out_dir=tmp_path, progress=False, command="test", shard=(1, 2))
    assert len(list(tmp_path.glob("*_runs.shard*.jsonl"))) == 2
    result = run_retina(config, out_dir=tmp_path, progress=False, command="test", train=False)
    assert len(result["rows"]) == len(config.families) * len(REFERRAL_FRACTIONS)
    assert all(0.0 <= r["accuracy"][0] <= 1.0 for r in result["rows"])
    robust = retina_config("retina-robustness", quick=True)
    out = run_retina(robust, out_dir=tmp_path, progress=False, command="test")
    assert {r["family"] for r in out["rows"]} == {"radial", "meanfield"}
    assert (tmp_path / f"{robust.name}.png").exists() and (tmp_path / f"{robust.name}.md").exists()


def test_hyperparameter_draws_cover_the_paper_ranges():
    from varbnn_lab.retina import sample_hyperparameters

    runs = sample_hyperparameters(200, seed=1)
    assert {r.optimizer for r in runs} == {"sgd", "amsgrad"}
    assert {r.samples for r in runs} == {1, 2, 4} and {r.init_rho for r in runs} == {-6.0, -4.0, -2.0, 0.0}
    assert all(r.decay == 1.0 for r in runs if r.optimizer == "amsgrad")
    assert sample_hyperparameters(5, seed=3) == sample_hyperparameters(5, seed=3)


def test_soap_bubble_quick_and_chi_density():
    import scipy.stats

    from varbnn_lab.soap_bubble import chi_log_density

    x = torch.tensor([0.5, 3.0, 30.0], dtype=torch.float64)
    torch.testing.assert_close(chi_log_density(x, 900), torch.as_tensor(scipy.stats.chi(900).logpdf(x.numpy())))


def test_soap_bubble_quick_run(tmp_path):
    if not _have("mnist"):
        pytest.skip("MNIST not available")
    from varbnn_lab.soap_bubble import run_soap_bubble, soap_bubble_config

    config = soap_bubble_config(quick=True)
    result = run_soap_bubble(config, out_dir=tmp_path, progress=False, command="test")
    distances = result["kernel"]["mean_distance"]
    # the soap bubble: a Gaussian sample is ~sqrt(D) sigma from the mode, a radial one ~0.8 sigma
    for sigma in config.sigmas:
        assert distances[f"meanfield@{sigma:g}"] > 10 * distances[f"radial@{sigma:g}"]
    assert len(result["training"]) == 2 and (tmp_path / f"{config.name}_training.png").exists()


def test_the_library_does_not_import_its_experiments():
    """varbnn.plots and the library's other modules import nothing from varbnn_lab (no cycle)."""
    import subprocess
    import sys

    code = (
        "import sys, varbnn, varbnn.plots, varbnn.continual, varbnn.prune, varbnn.train, varbnn.baselines, varbnn.laplace;"
        "print(sorted(m for m in sys.modules if m.startswith('varbnn_lab')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out


def test_vcl_search_gives_both_families_the_same_grid_and_selects_on_validation(tmp_path):
    from varbnn_lab.continual import SEARCH_VARIANTS, VCL_VARIANTS, VCLConfig, run_vcl, selection, vcl_config

    grids = {}
    for v in SEARCH_VARIANTS:
        grids.setdefault(v.family, set()).add((v.lr, v.epochs, tuple(sorted(v.family_options.items()))))
    assert len(SEARCH_VARIANTS) == 16 and grids["radial"] == grids["meanfield"] and len(grids["radial"]) == 8
    # the variants saved before lr existed keep their protocol hashes (those of the committed runs)
    import json
    from pathlib import Path

    runs = Path(__file__).parents[1] / "benchmarks/results/vcl-split-fmnist/vcl-split-fmnist_runs.jsonl"
    saved = {json.loads(line)["variant"]: json.loads(line)["protocol"] for line in runs.read_text().splitlines()}
    for variant in VCL_VARIANTS:
        assert VCLConfig().protocol_hash(variant) == saved[variant.label], variant.label
    config = vcl_config(quick=True, name="vcl-split-fmnist-search")
    assert config.name == "vcl-split-fmnist-search-quick" and {v.family for v in config.variants} == {"radial", "meanfield"}
    result = run_vcl(config, out_dir=tmp_path, progress=False, command="test")
    chosen = selection(result)
    last = {r["variant"]: r["val_mean"][0] for r in result["rows"] if r["after_task"] == len(config.tasks)}
    for family, (label, value) in chosen.items():
        assert label.startswith(family) and value == max(v for k, v in last.items() if k.startswith(family))
    assert "Selected by the validation mean accuracy" in (tmp_path / "vcl-split-fmnist-search-quick.md").read_text()
    with pytest.raises(ValueError, match="unknown VCL experiment"):
        vcl_config(name="vcl-nope")


def test_vcl_selected_holds_one_setting_per_family_from_the_search_grid():
    from varbnn_lab.continual import SEARCH_VARIANTS, SELECTED_VARIANTS, vcl_config

    assert sorted(v.family for v in SELECTED_VARIANTS) == ["meanfield", "radial"]
    assert all(v in SEARCH_VARIANTS for v in SELECTED_VARIANTS)
    assert vcl_config(name="vcl-split-fmnist-selected").seeds == (0, 1, 2, 3, 4)


def test_set_posterior_as_prior_on_a_multihead_net_updates_the_trunk_and_the_named_head_only():
    family = varbnn.MeanField(init_std=0.2)
    trunk = varbnn.bayesianize(torch.nn.Linear(3, 4), family)
    heads = [varbnn.bayesianize(torch.nn.Linear(4, 2), family) for _ in range(3)]
    net = MultiHeadNet(trunk, heads)
    before = [h.priors["weight"] for h in net.heads]
    with pytest.raises(ValueError, match="needs task, the head just trained"):
        set_posterior_as_prior(net)
    with pytest.raises(ValueError, match=r"an int in \[0, 3\)"):
        set_posterior_as_prior(net, task=3)
    with pytest.raises(ValueError, match="task is for a MultiHeadNet"):
        set_posterior_as_prior(trunk, task=0)
    assert set_posterior_as_prior(net, task=1) == 4  # trunk weight + bias, head 1 weight + bias
    assert net.heads[0].priors["weight"] is before[0] and net.heads[2].priors["weight"] is before[2]
    assert net.heads[1].priors["weight"] is not before[1] and abs(float(varbnn.kl(net.task_model(1)))) < 1e-4


def test_the_per_variant_figure_draws_each_head_and_refuses_more_variants_than_panels(tmp_path):
    from varbnn.plots import continual_heads_figure

    rows = [{"variant": f"v{k}", "after_task": t, **{f"head{j}": (0.9, 0.01) for j in range(1, t + 1)}, "mean": (0.9, 0.01)}
            for k in range(2) for t in (1, 2)]  # fmt: skip
    assert continual_heads_figure({"name": "x", "rows": rows}, tmp_path / "x.png").exists()
    with pytest.raises(ValueError, match="2 variants, more than max_panels=1"):
        continual_heads_figure({"name": "x", "rows": rows}, tmp_path / "y.png", max_panels=1)
    with pytest.raises(ValueError, match="no rows"):
        continual_heads_figure({"name": "x", "rows": []}, tmp_path / "z.png")


def test_rendering_without_saved_runs_is_refused_not_a_page_of_nans(tmp_path):
    from varbnn_lab.continual import run_vcl, vcl_config

    with pytest.raises(ValueError, match=r"--no-train\): none of this experiment's \d+ runs is saved in"):
        run_vcl(vcl_config(quick=True), out_dir=tmp_path, progress=False, train=False)
    assert not list(tmp_path.glob("*.md"))
