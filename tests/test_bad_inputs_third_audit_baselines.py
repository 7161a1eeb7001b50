"""Issue 61, third audit: the baselines (MC dropout, deep ensembles, temperature scaling) and predict fed inputs that
gave a silent wrong result or an unclear crash. Each test holds one input the audit (or the probe of baselines
wrapping baselines) fed, and asserts the clear error or the right result."""

from __future__ import annotations

import copy
import pickle
import sys
import warnings

import numpy as np
import pytest
import torch
from bad_input_table import BadInput, check, params
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn.baselines import DeepEnsemble, MCDropout, member_checkpoint, train_ensemble
from varbnn.calibration import TemperatureScaled, fit_temperature
from varbnn.predict import predict, regression_summary
from varbnn.train import read_checkpoint

PREDICT_MODULE = sys.modules["varbnn.predict"]


def _mlp(outputs: int = 3) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, outputs))


def _bnn() -> nn.Module:
    return varbnn.bayesianize(_mlp(), varbnn.MeanField(init_std=0.3))


def _dropout_net(bias: float = 0.0) -> nn.Module:
    net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    with torch.no_grad():
        net[2].bias.fill_(bias)
    return net


def _labelled(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long()


# ----------------------------------------------------------------------------------------------- 1. train_ensemble


def test_train_ensemble_resume_continues_each_member_from_its_own_file(tmp_path):
    x, y = _labelled()
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    path = tmp_path / "ens.pt"
    kwargs = dict(members=2, n_data=64, lr=1e-2, seed=3)
    first = train_ensemble(_mlp, loader, epochs=1, checkpoint=path, **kwargs)
    files = [member_checkpoint(path, m) for m in range(2)]
    assert [f.name for f in files] == ["ens.member0.pt", "ens.member1.pt"]
    assert all(f.is_file() for f in files) and not path.exists()
    resumed = train_ensemble(_mlp, loader, epochs=1, checkpoint=path, resume=True, **kwargs)  # finished: loaded
    for m, (member, again) in enumerate(zip(first.members, resumed.members)):
        saved = read_checkpoint(files[m])["model"]
        for name, tensor in again.state_dict().items():
            torch.testing.assert_close(tensor, saved[name])
            torch.testing.assert_close(tensor, member.state_dict()[name])
    assert predict(resumed, x[:8]).std(0).max() > 0  # two different networks, not one twice
    longer = train_ensemble(_mlp, loader, epochs=2, checkpoint=path, resume=True, **kwargs)
    assert predict(longer, x[:8]).std(0).max() > 0
    assert read_checkpoint(files[1])["epoch"] == 2


def test_train_ensemble_warns_that_an_old_shared_checkpoint_is_not_resumed(tmp_path):
    x, y = _labelled(16)
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    path = tmp_path / "old.pt"
    varbnn.fit(_mlp(), loader, n_data=16, epochs=1, checkpoint=path, progress=False)  # the old shared file
    with pytest.warns(UserWarning, match=r"old\.pt exists but each member now has its own checkpoint"):
        train_ensemble(_mlp, loader, members=2, n_data=16, epochs=1, checkpoint=path, resume=True)


# ----------------------------------------------------------------------------------------------- 2. temperature


def _disagreeing_ensemble() -> tuple[DeepEnsemble, torch.Tensor, torch.Tensor]:
    """Three over-confident linear members that disagree: member 0 alone needs a large T, their mixture much less."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 4, generator=g)
    y = torch.multinomial(torch.softmax(z[:, :3], -1), 1, generator=g).squeeze(1)
    members = []
    for _ in range(3):
        net = nn.Linear(4, 3)
        with torch.no_grad():
            net.weight.copy_(4.0 * torch.eye(3, 4) + 3.0 * torch.randn(3, 4, generator=g))
            net.bias.zero_()
        members.append(net)
    return DeepEnsemble(members), z, y


def test_temperature_of_an_ensemble_is_fitted_to_all_members():
    ensemble, z, y = _disagreeing_ensemble()
    scaled = TemperatureScaled(ensemble).fit(z, y)  # default samples
    all_members = fit_temperature(predict(ensemble, z), y)
    member_0 = fit_temperature(ensemble.members[0](z).detach(), y)
    assert float(scaled.temperature) == pytest.approx(all_members, rel=1e-6)
    assert abs(member_0 - all_members) > 0.2  # the old fit (member 0 alone) is far from it


def test_temperature_fit_draws_the_predictive_of_a_stochastic_model(monkeypatch):
    asked: list[int] = []
    real = PREDICT_MODULE.predict

    def spy(model, x, samples=16, **kwargs):
        asked.append(samples)
        return real(model, x, samples, **kwargs)

    monkeypatch.setattr(varbnn.calibration, "predict", spy)  # calibration imports predict at its top (issue 62)
    x, y = _labelled(32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an untrained model's T may end at a bound
        TemperatureScaled(_mlp()).fit(x, y)
        TemperatureScaled(MCDropout(_dropout_net())).fit(x, y)
        TemperatureScaled(_bnn()).fit(x, y)
        TemperatureScaled(DeepEnsemble([_bnn() for _ in range(3)])).fit(x, y)
        TemperatureScaled(DeepEnsemble([_mlp(), _mlp()])).fit(x, y)
        TemperatureScaled(MCDropout(_dropout_net())).fit(x, y, samples=5)
    assert asked == [1, 32, 32, 33, 1, 5]


def test_a_copy_of_temperature_scaled_predicts_with_its_own_temperature():
    x = torch.randn(5, 4)
    for inner in (DeepEnsemble([_mlp(), _mlp()]), _mlp()):
        scaled = TemperatureScaled(inner, temperature=2.0)
        clone = copy.deepcopy(scaled)
        clone.temperature.fill_(5.0)
        reference = predict(inner, x)
        torch.testing.assert_close(predict(clone, x), reference / 5.0)
        torch.testing.assert_close(predict(scaled, x), reference / 2.0)
        unpickled = pickle.loads(pickle.dumps(scaled))
        torch.testing.assert_close(predict(unpickled, x), reference / 2.0)
        fresh = TemperatureScaled(copy.deepcopy(inner))
        fresh.load_state_dict(clone.state_dict())
        torch.testing.assert_close(predict(fresh, x), reference / 5.0)


def test_fit_temperature_warns_when_the_optimum_is_at_a_bound():
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(2000, 3, generator=g)
    labels = torch.randint(0, 3, (2000,), generator=g)  # independent of the logits: T -> inf
    with pytest.warns(UserWarning, match=r"upper bound T = 20 of bounds=\(0\.05, 20\.0\).*belong together"):
        assert fit_temperature(noise, labels) == 20.0
    for margin in (1.0, 5.0):  # never wrong: the NLL falls as T -> 0 (with 5, to 0 in float64 well above T = 0.05)
        separable = margin * nn.functional.one_hot(labels, 3).float()
        with pytest.warns(UserWarning, match=r"lower bound T = 0\.05 .*classifies every validation example correctly"):
            assert fit_temperature(separable, labels) == 0.05
    with pytest.warns(UserWarning, match=r"the same for every T .*T = 1 is kept"):
        assert fit_temperature(torch.zeros(2000, 3), labels) == 1.0
    with pytest.warns(UserWarning, match=r"TemperatureScaled\.fit: the validation NLL is lowest at the upper bound"):
        TemperatureScaled(nn.Identity()).fit(noise, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fit_temperature(noise + 3.0 * nn.functional.one_hot(labels, 3), labels) < 20.0


# ----------------------------------------------------------------------------------------------- 3. MC dropout


def test_mc_dropout_of_a_network_in_eval_mode_samples():
    net = _dropout_net().eval()
    model = MCDropout(net)
    x = torch.randn(6, 4)
    assert predict(model, x, samples=4).std(0).max() > 0
    net.eval()  # switched off behind the wrapper's back: forward turns dropout on again
    with torch.no_grad():
        assert not torch.equal(model(x), model(x))  # a direct call, which predict's eval() switch does not cover
    assert predict(model, x, samples=4).std(0).max() > 0


# ----------------------------------------------------------------------------------------------- 4. ensembles, x


def test_predict_of_an_ensemble_of_stochastic_members_gives_the_draws_asked_for():
    x = torch.randn(5, 4)
    assert predict(DeepEnsemble([_bnn(), _bnn()]), x, samples=64).shape == (64, 5, 3)
    ensemble = DeepEnsemble([MCDropout(_dropout_net(bias=100.0 * m)) for m in range(3)])
    draws = predict(ensemble, x, samples=8)  # 3, 3, 2 draws, grouped by member
    assert draws.shape == (8, 5, 3)
    member = (draws.mean((1, 2)) / 100.0).round().long().tolist()
    assert member == [0, 0, 0, 1, 1, 1, 2, 2]
    mixed = predict(DeepEnsemble([_mlp(), _bnn()]), x, samples=4)  # the plain member's output repeated
    assert mixed.shape == (4, 5, 3) and torch.equal(mixed[0], mixed[1])
    assert predict(DeepEnsemble([_mlp(), _mlp(), _mlp()]), x, samples=64).shape == (3, 5, 3)  # plain: M draws


ROWS = [
    BadInput(
        "ensemble of Bayesian networks, fewer samples than members",
        lambda: predict(DeepEnsemble([_bnn(), _bnn(), _bnn()]), torch.randn(2, 4), samples=2),
        raises=ValueError,
        match=r"samples must be an int >= 3 \(the ensemble's members\)",
    ),
    BadInput(
        "ensemble members with different output sizes",
        lambda: predict(DeepEnsemble([_mlp(3), _mlp(3), _mlp(2)]), torch.randn(2, 4)),
        raises=ValueError,
        match=r"member 2 returns outputs of shape \(2, 2\) but member 0 returns \(2, 3\)",
    ),
    BadInput(
        "ensemble of ensembles",
        lambda: DeepEnsemble([DeepEnsemble([_mlp(), _mlp()]), _mlp()]),
        raises=ValueError,
        match=r"member 0 is \(or holds\) a DeepEnsemble.*pass the inner members flat",
    ),
    BadInput(
        "ensemble holding a temperature-scaled ensemble",
        lambda: DeepEnsemble([_mlp(), TemperatureScaled(DeepEnsemble([_mlp(), _mlp()]))]),
        raises=ValueError,
        match=r"member 1 is \(or holds\) a DeepEnsemble",
    ),
    BadInput(
        "MC dropout around an ensemble",
        lambda: MCDropout(DeepEnsemble([_dropout_net(), _dropout_net()])),
        raises=ValueError,
        match=r"MCDropout: model holds a DeepEnsemble.*DeepEnsemble\(\[MCDropout\(m\) for m in members\]\)",
    ),
    BadInput(
        "predict of a list",
        lambda: predict(_mlp(), [[0.0] * 4]),
        raises=TypeError,
        match=r"x must be a torch\.Tensor or a numpy\.ndarray .*got builtins\.list",
    ),
    BadInput(
        "predict of a NumPy float64 array",
        lambda: predict(_mlp(), np.ones((2, 4)), samples=2),
        expect=lambda out: (out.shape, out.dtype) == ((2, 2, 3), torch.float32) or pytest.fail(f"{out.shape} {out.dtype}"),
    ),
    BadInput(
        "float32 inputs to a float16 model",
        lambda: predict(_mlp().half(), torch.randn(2, 4)),
        raises=TypeError,
        match=r"x has dtype torch\.float32 but the model's parameters are torch\.float16.*x\.to\(torch\.float16\)",
    ),
    BadInput(
        "NumPy array to a bfloat16 model",
        lambda: predict(_mlp().bfloat16(), np.ones((2, 4)), samples=2),
        expect=lambda out: out.dtype == torch.bfloat16 or pytest.fail(str(out.dtype)),
    ),
    BadInput(
        "MCDropout without dropout",
        lambda: MCDropout(_mlp()),
        raises=ValueError,
        match="no dropout layer",
    ),
    BadInput(
        "TemperatureScaled on 0 validation examples",
        lambda: TemperatureScaled(_mlp()).fit(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)),
        raises=ValueError,
        match=r"x holds no validation examples.*N >= 1",
    ),
    BadInput(
        "TemperatureScaled with fewer labels than inputs",
        lambda: TemperatureScaled(_mlp()).fit(torch.zeros(4, 4), torch.zeros(3, dtype=torch.long)),
        raises=ValueError,
        match=r"y must be \[N\] class labels with N = x\.shape\[0\] = 4",
    ),
    BadInput(
        "TemperatureScaled of a list",
        lambda: TemperatureScaled(_mlp()).fit([[0.0] * 4], torch.zeros(1, dtype=torch.long)),
        raises=TypeError,
        match=r"x must be a torch\.Tensor or a numpy\.ndarray",
    ),
    BadInput(
        "regression_summary: per-example [N, 1] noise with means [S, N] and N == S",
        lambda: regression_summary(torch.randn(4, 4), torch.arange(1.0, 5.0).unsqueeze(1)),
        raises=ValueError,
        match=r"noise_variance of shape \(4, 1\) fits neither reading.*per-example tensor \[N\] = \[4\]",
    ),
    BadInput(
        "regression_summary: per-example [N, 1] noise with means [S, N, 1] and N == S",
        lambda: regression_summary(torch.randn(4, 4, 1), torch.arange(1.0, 5.0).unsqueeze(1)).aleatoric_variance,
        expect=lambda v: torch.testing.assert_close(v, torch.arange(1.0, 5.0).unsqueeze(1)),
    ),
    BadInput(
        "regression_summary: per-example [N] noise with means [S, N] and N == S",
        lambda: regression_summary(torch.randn(4, 4), torch.arange(1.0, 5.0)).aleatoric_variance,
        expect=lambda v: torch.testing.assert_close(v, torch.arange(1.0, 5.0)),
    ),
    BadInput(
        "regression_summary: per-draw [S, N] noise, averaged over the draws",
        lambda: regression_summary(torch.randn(4, 4), torch.arange(1.0, 5.0).unsqueeze(1).expand(4, 4)).aleatoric_variance,
        expect=lambda v: torch.testing.assert_close(v, torch.full((4,), 2.5)),
    ),
    BadInput(
        "regression_summary: per-output [D] noise",
        lambda: regression_summary(torch.randn(3, 4, 2), torch.tensor([1.0, 2.0])).aleatoric_variance,
        expect=lambda v: torch.testing.assert_close(v, torch.tensor([1.0, 2.0]).expand(4, 2)),
    ),
]


@pytest.mark.parametrize("case", params(ROWS))
def test_bad_input(case: BadInput) -> None:
    check(case)


# ----------------------------------------------------------------------------------------------- 6. eval mode


def _batch_norm_net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3))


@pytest.mark.parametrize("wrap", ["plain", "bayesian", "mc dropout", "temperature fit"])
def test_predict_leaves_batch_norm_statistics_and_modes_alone(wrap):
    net = _batch_norm_net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bayesianize's note on batch norm after a Bayesian layer
        model: nn.Module = {
            "plain": lambda: net,
            "bayesian": lambda: varbnn.bayesianize(net),
            "mc dropout": lambda: MCDropout(net),
            "temperature fit": lambda: TemperatureScaled(net),
        }[wrap]()
    model.train()
    next(m for m in model.modules() if isinstance(m, nn.ReLU)).eval()  # a mix of modes comes back as it was
    modes = {name: module.training for name, module in model.named_modules()}
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    x = 3.0 + torch.randn(16, 4)
    if wrap == "temperature fit":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(x, torch.zeros(16, dtype=torch.long), samples=4)
    else:
        draws = predict(model, x, samples=4)
        if wrap == "plain":
            assert torch.equal(draws[0], draws[1])  # eval mode: plain dropout off
        else:
            assert draws.std(0).max() > 0  # Bayesian layers and MC dropout still sample
    assert {name: module.training for name, module in model.named_modules()} == modes
    for key, value in stats.items():
        assert torch.equal(model.state_dict()[key], value), key
