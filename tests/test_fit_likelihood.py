"""fit(likelihood=...), evaluate(), the default KL weight and fit's diagnostics."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn.families import MeanField
from varbnn.likelihoods import Gaussian, HeteroscedasticGaussian
from varbnn.objectives import default_kl_weight
from varbnn.training import TrainingWarning, evaluate, fit


def _regression(n: int = 512, noise: float = 0.3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.7 + noise * torch.randn(n, generator=g)
    return x, y


def test_gaussian_likelihood_learns_the_noise_level_of_a_linear_model() -> None:
    """A linear model with a learned Gaussian noise: the ML noise std of 512 points with true std 0.3 has a standard
    error of 0.3 / sqrt(2 * 512) ~ 0.0094, so 0.3 +- 0.04 is > 4 standard errors (plus the fit's own error)."""
    x, y = _regression()
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    likelihood = Gaussian()
    with pytest.raises(ValueError, match="create it"):
        fit(model, [(x, y)], n_data=512, epochs=1, likelihood="gaussian", progress=False)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    fit(model, loader, n_data=512, epochs=150, lr=3e-2, likelihood=likelihood, progress=False)
    assert float(likelihood.noise_std) == pytest.approx(0.3, abs=0.04)
    scores = evaluate(model, x, y, likelihood=likelihood)
    assert scores["rmse"] == pytest.approx(0.3, abs=0.04)
    assert scores["nll"] == pytest.approx(0.5 * math.log(2 * math.pi * 0.09) + 0.5, abs=0.15)


def test_likelihood_state_is_checkpointed_and_resumed(tmp_path) -> None:
    x, y = _regression(128)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    path = tmp_path / "run.pt"
    torch.manual_seed(0)
    first, first_lik = nn.Linear(3, 1), Gaussian()
    fit(first, loader, n_data=128, epochs=4, lr=1e-2, likelihood=first_lik, checkpoint=path, progress=False)
    torch.manual_seed(0)
    second, second_lik = nn.Linear(3, 1), Gaussian()
    fit(second, loader, n_data=128, epochs=2, lr=1e-2, likelihood=second_lik, checkpoint=tmp_path / "half.pt", progress=False)
    fit(second, loader, n_data=128, epochs=4, lr=1e-2, likelihood=second_lik, checkpoint=tmp_path / "half.pt",
        resume=True, progress=False)  # fmt: skip
    assert torch.equal(first_lik.log_noise_std, second_lik.log_noise_std)
    assert torch.equal(first.weight, second.weight)


def test_likelihood_by_name_and_heteroscedastic_outputs() -> None:
    x, y = _regression(64)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)), MeanField())
    history = fit(model, DataLoader(TensorDataset(x, y), batch_size=32), n_data=64, epochs=2, likelihood="heteroscedastic",
                  progress=False)  # fmt: skip
    assert len(history) == 2 and all(math.isfinite(r["loss"]) for r in history)
    scores = evaluate(model, x, y, likelihood=HeteroscedasticGaussian(), samples=4)
    assert set(scores) == {"rmse", "nll", "mean_predictive_std"}


def test_fit_refuses_nll_and_likelihood_together_and_an_optimizer_without_the_noise() -> None:
    x, y = _regression(64)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    model = nn.Linear(3, 1)
    with pytest.raises(ValueError, match="either nll= .* or likelihood="):
        fit(model, loader, n_data=64, epochs=1, nll=nn.functional.mse_loss, likelihood="gaussian", progress=False)
    with pytest.raises(ValueError, match="learnable parameters that the given optimizer does not hold"):
        fit(model, loader, n_data=64, epochs=1, likelihood=Gaussian(), optimizer=torch.optim.SGD(model.parameters(), 0.1),
            progress=False)  # fmt: skip
    sgd = torch.optim.SGD(model.parameters(), 0.1)
    fit(model, loader, n_data=64, epochs=1, likelihood=Gaussian(noise_std=0.5), optimizer=sgd, progress=False)  # fixed noise


def test_beta_none_is_the_families_default_kl_weight(monkeypatch) -> None:
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), MeanField())
    monkeypatch.setattr(MeanField, "default_kl_weight", 0.25)
    assert default_kl_weight(model) == 0.25
    assert default_kl_weight(nn.Linear(2, 2)) == 1.0
    history = fit(model, DataLoader(TensorDataset(x, y), batch_size=32), n_data=64, epochs=1, progress=False)
    assert history[0]["beta"] == 0.25
    history = fit(model, DataLoader(TensorDataset(x, y), batch_size=32), n_data=64, epochs=1, kl_weight=1.0, progress=False)
    assert history[0]["beta"] == 1.0


def test_fit_warns_when_the_posterior_sits_on_the_prior() -> None:
    """16 random labels, the full KL, 300 steps: the KL pulls every weight back to N(0, 1) and the NLL never falls."""
    torch.manual_seed(1234)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2)), MeanField())
    with pytest.warns(TrainingWarning, match="posterior sits on the prior .* did not fall by 10% of its first-epoch value"):
        fit(model, DataLoader(TensorDataset(x, y), batch_size=16), n_data=16, epochs=300, lr=3e-2, kl_weight=1.0, progress=False)


def test_fit_warns_about_a_practically_deterministic_posterior_and_is_quiet_otherwise() -> None:
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    frozen = varbnn.bayesianize(net, MeanField(init_std=1e-6, learn_std=False))
    with pytest.warns(TrainingWarning, match="practically deterministic"):
        fit(frozen, loader, n_data=64, epochs=1, progress=False)
    healthy = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), MeanField(init_std=0.05))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        fit(healthy, loader, n_data=64, epochs=1, kl_weight=0.1, progress=False)
        fit(healthy, loader, n_data=64, epochs=1, kl_weight=0.1, progress=False, diagnose=False)


def test_fit_logs_every_epoch_through_python_logging(caplog) -> None:
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    with caplog.at_level("INFO", logger="varbnn.train"):
        fit(nn.Linear(4, 2), DataLoader(TensorDataset(x, y), batch_size=16), n_data=32, epochs=2, progress=False)
    messages = [r.getMessage() for r in caplog.records if r.name == "varbnn.train"]
    assert len(messages) == 2 and messages[0].startswith("epoch 1/2: loss")


def test_regression_targets_of_shape_n_by_1_evaluate() -> None:
    x, y = _regression(64)
    model = nn.Linear(3, 1)
    scores = evaluate(model, x, y[:, None], likelihood=Gaussian(noise_std=0.5), samples=1)
    assert scores["rmse"] == pytest.approx(float((model(x).detach() - y[:, None]).square().mean().sqrt()), rel=1e-5)


def test_fit_refuses_what_it_would_train_wrongly(tmp_path) -> None:
    from varbnn.baselines import DeepEnsemble
    from varbnn.laplace import LastLayerLaplace
    from varbnn.training import CheckpointError

    x, y = _regression(64)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    cls = DataLoader(TensorDataset(x, (y > 0).long()), batch_size=32)
    with pytest.raises(ValueError, match="train_ensemble"):
        fit(DeepEnsemble([nn.Linear(3, 2), nn.Linear(3, 2)]), cls, n_data=64, epochs=1, progress=False)
    with pytest.raises(ValueError, match="stale"):
        fit(LastLayerLaplace(nn.Linear(3, 2)), cls, n_data=64, epochs=1, progress=False)
    with pytest.raises(ValueError, match="kl_weight must be a finite number"):
        fit(nn.Linear(3, 2), cls, n_data=64, epochs=1, kl_weight="0.1", progress=False)
    graves = varbnn.bayesianize(nn.Linear(3, 1), MeanField(estimator="graves"))
    with pytest.raises(ValueError, match="does not train"):
        fit(graves, loader, n_data=64, epochs=1, likelihood=Gaussian(), progress=False)
    path = tmp_path / "plain.pt"
    fit(nn.Linear(3, 1), loader, n_data=64, epochs=1, nll=nn.functional.mse_loss, checkpoint=path, progress=False)
    with pytest.raises(CheckpointError, match="no 'likelihood' entry"):
        fit(nn.Linear(3, 1), loader, n_data=64, epochs=2, likelihood=Gaussian(), checkpoint=path, resume=True, progress=False)


def test_the_prior_diagnosis_needs_an_nll_near_the_label_marginal(monkeypatch) -> None:
    """A converted trained network fits from its first epoch: a low, flat NLL with a posterior near the prior is no
    collapse (the examples' pretrained CNN was flagged before). The same flat history at the marginal NLL is."""
    import math

    from varbnn.training.diagnose import _diagnose, _label_entropy

    model = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), MeanField(init_std=0.5))
    fitting = [{"loss": 0.05, "nll": 0.05, "kl": 1.0, "beta": 1.0}] * 5
    collapsed = [{"loss": 0.69, "nll": 0.69, "kl": 1.0, "beta": 1.0}] * 5
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingWarning)
        _diagnose(model, fitting, 64, label_entropy=math.log(2))
    with pytest.warns(TrainingWarning, match="posterior sits on the prior"):
        _diagnose(model, collapsed, 64, label_entropy=math.log(2))
    with pytest.warns(TrainingWarning, match="posterior sits on the prior"):  # no labels seen: the old rule
        _diagnose(model, fitting, 64, label_entropy=None)
    assert _label_entropy([torch.tensor([0, 1]), torch.tensor([1, 0])]) == pytest.approx(math.log(2))
    assert _label_entropy([torch.tensor([3, 3, 3])]) == pytest.approx(0.0)
    assert _label_entropy([]) is None and _label_entropy([torch.tensor([-1, 0])]) is None

    seen = {}
    monkeypatch.setattr("varbnn.training.loop._diagnose", lambda m, h, n, entropy: seen.setdefault("entropy", entropy))
    x, y = torch.randn(64, 4), torch.tensor([0, 1, 2, 3] * 16)
    fit(nn.Linear(4, 4), DataLoader(TensorDataset(x, y), batch_size=16), n_data=64, epochs=1, progress=False)
    assert seen["entropy"] == pytest.approx(math.log(4))


@pytest.mark.parametrize("first, recent, warns", [(-0.5, -0.52, True), (-0.5, -0.8, False), (1.3, 1.2, True), (1.3, 1.0, False)])
def test_the_prior_warning_judges_a_negative_nll_by_its_fall_like_a_positive_one(first, recent, warns) -> None:
    """A Gaussian likelihood's NLL can be negative: the warning asks whether it fell by 10% of its first value."""
    import warnings

    from varbnn.training.diagnose import _diagnose

    model = varbnn.bayesianize(nn.Linear(4, 2), MeanField())
    weights = sum(p.numel() for n, p in model.named_parameters() if n.endswith("loc") or n.endswith("mean"))
    history = [{"nll": first, "kl": 0.01}, {"nll": recent, "kl": 0.01}, {"nll": recent, "kl": 0.01}, {"nll": recent, "kl": 0.01}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _diagnose(model, history, n_data=100)
    on_prior = [w for w in caught if issubclass(w.category, TrainingWarning) and "sits on the prior" in str(w.message)]
    assert bool(on_prior) == warns, (weights, [str(w.message) for w in caught])
