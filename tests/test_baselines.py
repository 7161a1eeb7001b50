"""Temperature scaling, MC dropout and deep ensembles: the baselines users pick instead, on the predict path."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from varbnn import metrics
from varbnn.baselines import DeepEnsemble, MCDropout, add_dropout, train_ensemble
from varbnn.calibration import TemperatureScaled, fit_temperature
from varbnn.predict import predict


def _calibrated_problem(n: int, classes: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits z and labels drawn from softmax(z): temperature 1 is the truth."""
    g = torch.Generator().manual_seed(seed)
    z = 2.0 * torch.randn(n, classes, generator=g)
    y = torch.multinomial(torch.softmax(z, -1), 1, generator=g).squeeze(1)
    return z, y


def test_fit_temperature_recovers_the_true_temperature() -> None:
    """Logits scaled by 3 (over-confident) need T = 3. With 20,000 examples the ML estimate of log T has a standard
    error of a few 1e-3 (Fisher information of one scalar over 20,000 points), so 3% is > 5 standard errors."""
    z, y = _calibrated_problem(20_000)
    assert fit_temperature(3.0 * z, y) == pytest.approx(3.0, rel=0.03)
    assert fit_temperature(0.5 * z, y) == pytest.approx(0.5, rel=0.03)


def test_fit_temperature_is_the_minimum_of_a_grid_search() -> None:
    z, y = _calibrated_problem(500, seed=1)
    t = fit_temperature(2.0 * z, y)
    nll = lambda temp: float(nn.functional.cross_entropy(2.0 * z.double() / temp, y))  # noqa: E731
    grid = [math.exp(v / 100) for v in range(-300, 300)]
    assert nll(t) <= min(nll(g) for g in grid) + 1e-9


def test_monte_carlo_logits_use_the_nll_of_the_mean_softmax() -> None:
    z, y = _calibrated_problem(2000, seed=2)
    draws = torch.stack([z, z])  # identical draws: the same answer as the single-logit form
    assert fit_temperature(draws, y) == pytest.approx(fit_temperature(z, y), rel=1e-6)


@pytest.mark.parametrize("scale", [1.0, 60.0])  # 60: logits far apart, where a naive softmax underflows to 0
def test_the_search_objective_is_the_nll_of_the_mean_softmax(scale: float) -> None:
    """The search's objective (label gaps precomputed once) against the NLL written out: the log of the mean over
    draws of each draw's softmax probability of the label, in float64 through torch.log_softmax, and cross-entropy for
    [N, C] logits."""
    from varbnn.calibration import _tempered_nll

    g = torch.Generator().manual_seed(3)
    draws = scale * torch.randn(7, 300, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 6, (300,), generator=g)
    mc, single = _tempered_nll(draws, y), _tempered_nll(draws[0], y)
    for log_t in (-2.5, -0.3, 0.0, 0.8, 2.9):
        t = math.exp(log_t)
        label = torch.log_softmax(draws / t, -1).gather(2, y.view(1, -1, 1).expand(7, -1, 1)).squeeze(2)
        oracle = -float((torch.logsumexp(label, 0) - math.log(7)).mean())
        assert mc(log_t) == pytest.approx(oracle, rel=1e-12, abs=1e-12)
        assert single(log_t) == pytest.approx(float(nn.functional.cross_entropy(draws[0] / t, y)), rel=1e-12, abs=1e-12)


def test_temperature_scaled_keeps_accuracy_and_lowers_validation_nll() -> None:
    torch.manual_seed(0)
    net = nn.Linear(5, 5)
    with torch.no_grad():
        net.weight.copy_(4.0 * torch.eye(5))
        net.bias.zero_()
    z, y = _calibrated_problem(3000, seed=3)
    scaled = TemperatureScaled(net).fit(z, y)
    assert float(scaled.temperature) == pytest.approx(4.0, rel=0.05)
    before, after = torch.softmax(net(z), -1).detach(), torch.softmax(scaled(z), -1).detach()
    assert metrics.accuracy(before, y) == metrics.accuracy(after, y)
    assert metrics.negative_log_likelihood(after, y) < metrics.negative_log_likelihood(before, y)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: fit_temperature(torch.randn(4, 3), torch.zeros(5, dtype=torch.long)), "logits must be"),
        (lambda: fit_temperature(torch.full((4, 3), float("nan")), torch.zeros(4, dtype=torch.long)), "NaN"),
        (lambda: fit_temperature(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), bounds=(0.0, 1.0)), "bounds"),
        (lambda: TemperatureScaled(nn.Identity(), temperature=-1.0), "temperature"),
    ],
)
def test_temperature_bad_inputs(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def test_add_dropout_skips_the_first_layer_and_copies() -> None:
    net = _mlp()
    dropped = add_dropout(net, 0.2)
    assert not any(isinstance(m, nn.Dropout) for m in net.modules())  # input untouched
    assert isinstance(dropped[0], nn.Linear)
    assert isinstance(dropped[2], nn.Sequential) and isinstance(dropped[2][0], nn.Dropout)
    assert isinstance(dropped[4], nn.Sequential) and dropped[4][0].p == 0.2
    with pytest.raises(ValueError, match=r"p must be a finite number in \(0, 1\)"):
        add_dropout(net, 1.0)


def test_mc_dropout_samples_in_eval_mode_through_predict() -> None:
    model = MCDropout(add_dropout(_mlp(), 0.5)).eval()
    x = torch.randn(8, 4)
    assert not torch.equal(model(x), model(x))
    draws = predict(model, x, samples=6)
    assert draws.shape == (6, 8, 3)
    assert (draws.std(0) > 0).any()
    draws_again = predict(model, x, samples=6, seed=3)
    torch.testing.assert_close(draws_again, predict(model, x, samples=6, seed=3))
    with pytest.raises(ValueError, match="no dropout layer"):
        MCDropout(_mlp())


def test_deep_ensemble_members_are_the_draws() -> None:
    members = [_mlp() for _ in range(3)]
    ensemble = DeepEnsemble(members).eval()
    x = torch.randn(5, 4)
    draws = predict(ensemble, x, samples=64)
    assert draws.shape == (3, 5, 3)
    for m, member in enumerate(members):
        torch.testing.assert_close(draws[m], member(x).detach())
    torch.testing.assert_close(ensemble(x), draws.mean(0))
    with pytest.raises(ValueError, match="at least two"):
        DeepEnsemble([_mlp()])


def test_train_ensemble_trains_distinct_members() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=g)
    ensemble = train_ensemble(_mlp, loader, members=2, n_data=64, epochs=2, lr=1e-2, seed=5)
    from varbnn.training import seed_everything

    for m, member in enumerate(ensemble.members):
        seed_everything(5 + m)  # member m's initialisation, redrawn
        start = _mlp()
        assert not torch.equal(start[0].weight, member[0].weight)  # trained
        if m:
            seed_everything(5)
            assert not torch.equal(start[0].weight, _mlp()[0].weight)  # and started from its own draw
    with pytest.raises(ValueError, match="members must be an int >= 2"):
        train_ensemble(_mlp, loader, members=1, n_data=64, epochs=1)


def test_temperature_scaling_of_an_ensemble_keeps_the_members_as_draws() -> None:
    ensemble = DeepEnsemble([_mlp() for _ in range(3)]).eval()
    x = torch.randn(4, 4)
    scaled = TemperatureScaled(ensemble, temperature=2.0)
    torch.testing.assert_close(predict(scaled, x), predict(ensemble, x) / 2.0)
