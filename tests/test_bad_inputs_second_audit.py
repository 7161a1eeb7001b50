"""Bad inputs a second audit (2026-11-27) found answered by a silent wrong result or a misleading error: each test
feeds one and asserts the clear error, or that nothing already computed was lost."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn.baselines import DeepEnsemble
from varbnn.likelihoods import Categorical, GammaPrecisionGaussian
from varbnn.priors import Normal
from varbnn_lab import get_config


def _regression(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x.sum(1) + 0.1 * torch.randn(n, generator=g)


class _Squeeze(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1)


@pytest.mark.parametrize("squeeze", [False, True], ids=["outputs [N, 1]", "outputs [N]"])
def test_fit_default_cross_entropy_refuses_regression_targets(squeeze):
    x, y = _regression()
    layers = [nn.Linear(3, 1), *([_Squeeze()] if squeeze else [])]
    model = varbnn.bayesianize(nn.Sequential(*layers))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    with pytest.raises(ValueError, match=r"likelihood=varbnn.likelihoods.Gaussian\(\)"):
        varbnn.fit(model, loader, n_data=len(x), epochs=1, progress=False)


def test_fit_default_cross_entropy_still_takes_soft_labels():
    x = torch.randn(16, 3)
    soft = torch.softmax(torch.randn(16, 4), dim=1)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 4)))
    history = varbnn.fit(model, DataLoader(TensorDataset(x, soft), batch_size=8), n_data=16, epochs=1, progress=False)
    assert torch.isfinite(torch.tensor(history[-1]["nll"]))


def test_evaluate_categorical_refuses_float_and_out_of_range_labels():
    model = nn.Linear(3, 4)
    x = torch.randn(8, 3)
    with pytest.raises(ValueError, match="integer class indices"):
        varbnn.evaluate(model, x, torch.rand(8), samples=2)
    with pytest.raises(ValueError, match=r"class indices in \[0, 4\)"):
        varbnn.evaluate(model, x, torch.tensor([0, 1, 2, 3, 4, 0, 1, 2]), samples=2)
    with pytest.raises(ValueError, match=r"class indices in \[0, 4\)"):
        Categorical().metrics(torch.randn(2, 8, 4), torch.full((8,), -100))


def test_fit_refuses_an_optimizer_over_another_model():
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    model, other = varbnn.bayesianize(nn.Linear(3, 2)), varbnn.bayesianize(nn.Linear(3, 2))
    optimizer = torch.optim.Adam(other.parameters())
    with pytest.raises(ValueError, match="holds none of the model's trainable parameters"):
        varbnn.fit(model, DataLoader(TensorDataset(x, y), batch_size=8), n_data=16, epochs=1, optimizer=optimizer,
                   progress=False)  # fmt: skip


def test_deep_ensemble_refuses_members_that_share_parameters():
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    with pytest.raises(ValueError, match="members 0 and 1 share parameters"):
        DeepEnsemble([a, a])
    with pytest.raises(ValueError, match="members 1 and 2 share parameters"):
        DeepEnsemble([a, b, nn.Sequential(b)])
    assert len(DeepEnsemble([a, b]).members) == 2


def test_bayesianize_refuses_unknown_exclude_names_and_prior_classes():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"exclude names no module of the model: \['3'\]; its modules are: 0, 1, 2"):
        varbnn.bayesianize(net, exclude=["3"])
    with pytest.raises(TypeError, match="got the class Normal itself"):
        varbnn.bayesianize(net, prior=Normal)
    with pytest.raises(TypeError, match="got the class Normal itself"):
        varbnn.bayesianize(net, prior=torch.distributions.Normal)
    converted = varbnn.bayesianize(net, exclude=["2"])
    assert type(converted[2]) is nn.Linear


def test_gamma_noise_observe_refuses_nan_and_keeps_its_running_mean():
    lik = GammaPrecisionGaussian()
    lik.observe(torch.ones(4), torch.zeros(4), decay=0.5)
    with pytest.raises(ValueError, match="not finite"):
        lik.observe(torch.tensor([1.0, float("nan"), 0.0, 0.0]), torch.zeros(4), decay=0.5)
    assert float(lik.mean_square) == 1.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("eval_samples", 0, "eval_samples must be a positive integer"),
        ("lr", -1.0, "lr must be a finite number > 0"),
        ("lr", float("inf"), "lr must be a finite number > 0"),
        ("seeds", (), "seeds must be a non-empty tuple of integers"),
        ("train_limit", -59990, "train_limit must be None"),
        ("batch_size", 0, "batch_size must be a positive integer, got 0"),
    ],
)
def test_experiment_config_refuses_bad_values(field, value, message):
    config = get_config("mnist-mlp")
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(config, **{field: value})


def test_fit_warns_when_the_model_draws_no_weights():
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    model = varbnn.bayesianize(nn.Linear(3, 2))
    varbnn.set_sample_mode(model, "mean")
    with pytest.warns(varbnn.train.TrainingWarning, match=r"sample_mode \['mean'\]"):
        varbnn.fit(model, DataLoader(TensorDataset(x, y), batch_size=8), n_data=16, epochs=1, progress=False,
                   diagnose=False)  # fmt: skip


def test_prune_thresholds_that_keep_no_unit_are_refused():
    from varbnn.prune.scores import _thresholds

    scores = {("fc", "row"): torch.tensor([1.0, 2.0])}
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="not NaN or inf"):
            _thresholds(scores, bad, 1.0)
    assert _thresholds(scores, float("-inf"), 1.0) == {("fc", "row"): float("-inf")}


def test_temperature_labels_must_be_class_indices():
    from varbnn.calibration import fit_temperature

    logits = torch.randn(8, 3)
    with pytest.raises(ValueError, match="integer class indices"):
        fit_temperature(logits, torch.rand(8))
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\)"):
        fit_temperature(logits, torch.full((8,), 3))


def test_read_checkpoint_names_a_bad_map_location(tmp_path):
    from varbnn.training import read_checkpoint, save_checkpoint

    path = tmp_path / "c.pt"
    save_checkpoint(path, nn.Linear(2, 2))
    with pytest.raises(ValueError, match="device must be 'model', 'auto', None"):
        read_checkpoint(path, map_location="gpu")
    assert "model" in read_checkpoint(path, map_location="cpu")


def test_set_posterior_as_prior_changes_nothing_when_a_layer_has_no_prior_form():
    from varbnn import Delta, MeanField
    from varbnn.continual import set_posterior_as_prior

    net = nn.Sequential(varbnn.bayesianize(nn.Linear(3, 4), MeanField()), varbnn.bayesianize(nn.Linear(4, 2), Delta()))
    before = [repr(p) for p in net[0].priors.values()]
    locs = [getattr(p, "loc", None) for p in net[0].priors.values()]
    with pytest.raises(ValueError, match="no prior form for continual learning"):
        set_posterior_as_prior(net)
    assert [repr(p) for p in net[0].priors.values()] == before
    assert all(a is b for a, b in zip(locs, (getattr(p, "loc", None) for p in net[0].priors.values())))


def test_variants_option_keeps_labels_that_hold_commas():
    from varbnn_lab.cli import _split_variants

    labels = ["plain", "RDP double, radius_init=even, KL annealed over 100 epochs", "MeanField"]
    assert _split_variants("plain,MeanField", labels) == ["plain", "MeanField"]
    assert _split_variants(f"{labels[1]},plain", labels) == [labels[1], "plain"]
    assert _split_variants(f"plain,{labels[1]}", labels) == ["plain", labels[1]]
    assert _split_variants("RDP double,bogus", labels) == ["RDP double", "bogus"]  # the runner names what is allowed


def test_load_uci_split_bool_is_refused_and_numpy_integers_pass(data_dir):
    import numpy as np

    from varbnn.data import load_uci

    with pytest.raises(ValueError, match=r"split must be an integer in \[0, 19\] for yacht, got True"):
        load_uci("yacht", True, data_dir)
    assert load_uci("yacht", np.int64(3), data_dir).x_train.shape == load_uci("yacht", 3, data_dir).x_train.shape


def test_fit_counts_a_list_loaders_examples_against_n_data(tmp_path):
    x, y = torch.randn(32, 3), torch.randint(0, 2, (32,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
    model = varbnn.bayesianize(nn.Linear(3, 2))
    path = tmp_path / "c.pt"
    with pytest.raises(ValueError, match="n_data=10 is smaller than the 32 distinct examples the loader yielded in epoch 1"):
        varbnn.fit(model, batches, n_data=10, epochs=1, progress=False, checkpoint=path)
    assert not path.exists()  # refused before the first checkpoint
    varbnn.fit(model, batches, n_data=32, epochs=1, progress=False)


def test_resume_warns_that_the_checkpoint_keeps_its_learning_rate(tmp_path):
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    path = tmp_path / "c.pt"
    varbnn.fit(varbnn.bayesianize(nn.Linear(3, 2)), loader, n_data=16, epochs=1, lr=1e-3, progress=False, checkpoint=path)
    model = varbnn.bayesianize(nn.Linear(3, 2))
    with pytest.warns(varbnn.train.TrainingWarning, match=r"keeps its learning rate \[0.001\]"):
        varbnn.fit(model, loader, n_data=16, epochs=2, lr=0.5, progress=False, checkpoint=path, resume=True,
                   diagnose=False)  # fmt: skip


def test_fit_refuses_to_replace_an_existing_checkpoint_without_resume(tmp_path):
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    path = tmp_path / "run.pt"
    varbnn.fit(varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2))), loader, n_data=16, epochs=1, progress=False,
               checkpoint=path)  # fmt: skip
    with pytest.raises(ValueError, match=r"the file exists .* overwrite=True to replace it"):  # (a warning until 0.2)
        varbnn.fit(varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2))), loader, n_data=16, epochs=1, progress=False,
                   checkpoint=path)  # fmt: skip
    with warnings.catch_warnings():  # resuming it, or a new file, is silent
        warnings.simplefilter("error", varbnn.train.TrainingWarning)
        varbnn.fit(varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2))), loader, n_data=16, epochs=1, progress=False,
                   checkpoint=path, resume=True)  # fmt: skip
        varbnn.fit(varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2))), loader, n_data=16, epochs=1, progress=False,
                   checkpoint=tmp_path / "new.pt")  # fmt: skip


def test_summaries_refuse_non_finite_outputs_and_name_the_draws():
    logits = torch.randn(4, 3, 5)
    logits[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"logits hold NaN or inf in 1 of 4 draws \(draw 1\)"):
        varbnn.classification_summary(logits)
    masked = torch.randn(4, 3, 5)
    masked[..., 0] = -float("inf")  # a masked class: allowed, probability 0
    probs = varbnn.classification_summary(masked).probs
    assert torch.all(probs[:, 0] == 0) and torch.allclose(probs.sum(-1), torch.ones(3))
    means = torch.randn(4, 3)
    means[2, 1] = float("inf")
    with pytest.raises(ValueError, match=r"means hold NaN or inf in 1 of 4 draws \(draw 2\)"):
        varbnn.regression_summary(means, 1.0)


def test_last_layer_laplace_names_non_finite_inputs_not_the_model_structure():
    from varbnn.laplace import LastLayerLaplace

    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(32, 3), torch.randint(0, 2, (32,))
    x[3, 1] = float("nan")
    with pytest.raises(ValueError, match="the inputs x hold NaN or inf"):
        LastLayerLaplace(net).fit(DataLoader(TensorDataset(x, y), batch_size=8))
    with torch.no_grad():
        net[2].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"logits contain NaN .*\(the inputs are finite"):
        LastLayerLaplace(net).fit(DataLoader(TensorDataset(torch.randn(32, 3), y), batch_size=8))


def test_fit_compile_true_records_cuda_graphs_only_on_cuda_with_batches_of_one_shape():
    from varbnn.training.compiled import _fit_compile_mode

    data = TensorDataset(torch.randn(40, 3), torch.randint(0, 2, (40,)))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert _fit_compile_mode(True, cuda, DataLoader(data, batch_size=8)) == "reduce-overhead"  # 8 divides 40
    assert _fit_compile_mode(True, cuda, DataLoader(data, batch_size=16, drop_last=True)) == "reduce-overhead"
    assert _fit_compile_mode(True, cuda, DataLoader(data, batch_size=16)) == "default"  # a last batch of 8
    assert _fit_compile_mode(True, cuda, [(torch.randn(4, 3), torch.zeros(4))]) == "default"  # shapes not known
    assert _fit_compile_mode(True, cpu, DataLoader(data, batch_size=8)) == "default"
    assert _fit_compile_mode("default", cuda, DataLoader(data, batch_size=8)) == "default"  # a mode as given
    assert _fit_compile_mode("max-autotune", cpu, DataLoader(data, batch_size=16)) == "max-autotune"
    with pytest.raises(ValueError, match="compile must be True, False or one of the modes"):
        _fit_compile_mode("fast", cpu, DataLoader(data, batch_size=8))


def test_static_batches_follow_the_sampler_not_the_dataset():
    from torch.utils.data import IterableDataset, RandomSampler, SubsetRandomSampler

    from varbnn.training.compiled import _static_batches

    data = TensorDataset(torch.randn(100, 3), torch.zeros(100))
    assert _static_batches(DataLoader(data, batch_size=10))
    assert not _static_batches(DataLoader(data, batch_size=10, sampler=SubsetRandomSampler(range(95))))
    assert not _static_batches(DataLoader(data, batch_size=10, sampler=RandomSampler(data, replacement=True,
                                                                                       num_samples=55)))  # fmt: skip
    assert _static_batches(DataLoader(data, batch_size=10, sampler=SubsetRandomSampler(range(90))))

    class Stream(IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([(torch.zeros(3), torch.zeros(()))] * 20)

        def __len__(self) -> int:
            return 20

    assert not _static_batches(DataLoader(Stream(), batch_size=10))
    assert _static_batches(DataLoader(Stream(), batch_size=10, drop_last=True))
