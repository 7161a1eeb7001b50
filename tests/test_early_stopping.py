"""fit(validation=..., early_stopping=...): the validation NLL in every record, early stopping that restores the best
epoch's state exactly, a resumed run that stops and restores as the uninterrupted one, and bad input named."""

from __future__ import annotations

import math

import pytest
import torch
from bad_input_table import BadInput, check, params
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn.likelihoods import Gaussian
from varbnn.optim import IVON
from varbnn.training import read_checkpoint
from varbnn.training.early_stopping import VALIDATION_SEED, validation_watch
from varbnn.training.setup import seed_everything


def _noisy(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-class problem whose labels are 30% flipped: a wide MLP fits the flips and its validation NLL rises."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long()
    flip = torch.rand(n, generator=g) < 0.3
    return x, torch.where(flip, 1 - y, y)


TRAIN, VALID = _noisy(32, 0), _noisy(100, 1)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(*TRAIN), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _fit(model: nn.Module, **kwargs):
    options = dict(n_data=len(TRAIN[0]), progress=False, diagnose=False)
    return varbnn.fit(model, _loader(), **{**options, **kwargs})


def test_early_stopping_stops_and_restores_the_best_epoch_exactly():
    seed_everything(0)
    model, states = _mlp(), {}
    history = _fit(model, epochs=60, lr=1e-2, validation=VALID, early_stopping=2,
                   on_epoch_end=lambda epoch, record: states.update({epoch: _state(model)}))  # fmt: skip
    values = [r["val_nll"] for r in history]
    best = min(range(len(values)), key=values.__getitem__) + 1
    assert len(history) < 60 and history[-1]["stopped_early"] == 1.0  # the validation NLL rose: stopped early
    assert len(history) == best + 2 and all(v >= values[best - 1] for v in values[best:])  # patience 2 after the best
    assert history[-1]["best_epoch"] == best and all("stopped_early" not in r for r in history[:-1])
    assert all(0 <= r["val_accuracy"] <= 1 for r in history)
    assert _equal(_state(model), states[best]) and not _equal(_state(model), states[len(history)])
    assert not model.training  # fit returns the model in eval mode, as without early stopping
    # a plain network does not sample: one pass, the same number evaluate gives
    assert varbnn.evaluate(model, *VALID, samples=1, seed=VALIDATION_SEED)["nll"] == values[best - 1]


def test_validation_alone_adds_val_nll_and_changes_nothing_else():
    runs = []
    for validation in (None, VALID):
        seed_everything(0)  # a shuffling loader on the global generator, a sampling model: the global state matters
        model = varbnn.bayesianize(_mlp(), varbnn.MeanField())
        loader = DataLoader(TensorDataset(*TRAIN), batch_size=8, shuffle=True)
        history = varbnn.fit(model, loader, n_data=32, epochs=3, progress=False, diagnose=False, validation=validation)
        runs.append((history, _state(model), torch.rand(())))
    (plain, plain_state, plain_next), (watched, watched_state, watched_next) = runs
    assert _equal(plain_state, watched_state) and torch.equal(plain_next, watched_next)
    for a, b in zip(plain, watched):
        assert {k: v for k, v in b.items() if k not in ("val_nll", "val_accuracy")} == a
        assert math.isfinite(b["val_nll"]) and "best_epoch" not in b


def test_a_killed_run_resumes_to_the_same_stop_and_state(tmp_path):
    def run(epochs=60, kill_at=None, checkpoint=None, resume=False):
        seed_everything(0)
        model = varbnn.bayesianize(_mlp(), varbnn.MeanField())

        def kill(epoch, record):
            if epoch == kill_at:
                raise KeyboardInterrupt

        history = _fit(model, epochs=epochs, lr=1e-2, validation=VALID, validation_samples=4, early_stopping=2,
                       on_epoch_end=kill, checkpoint=checkpoint, resume=resume)  # fmt: skip
        return model, history

    straight, history = run()
    stop, best = len(history), history[-1]["best_epoch"]
    assert stop < 60 and best == stop - 2
    path = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):
        run(kill_at=stop, checkpoint=path)  # the checkpoint holds epoch stop - 1: after the best, one bad epoch
    entry = read_checkpoint(path)["early_stopping"]
    assert (entry["best_epoch"], entry["bad_epochs"], entry["stopped"]) == (best, 1, False)
    resumed, again = run(checkpoint=path, resume=True)
    assert again == history and _equal(_state(resumed), _state(straight))
    finished, returned = run(checkpoint=path, resume=True)  # a checkpoint that stopped early: no epoch trained
    assert returned == history and _equal(_state(finished), _state(straight))


def test_a_checkpoint_without_the_entry_resumes_with_a_fresh_count(tmp_path):
    path = tmp_path / "old.pt"
    seed_everything(0)
    _fit(_mlp(), epochs=2, checkpoint=path, validation=VALID)
    assert "early_stopping" not in read_checkpoint(path)
    seed_everything(0)
    model = _mlp()
    history = _fit(model, epochs=4, checkpoint=path, resume=True, validation=VALID, early_stopping=5)
    assert len(history) == 4 and history[-1]["best_epoch"] in (3, 4)  # only the epochs trained now can be restored


def test_val_nll_is_evaluates_nll_of_a_sampling_model():
    seed_everything(0)
    model, seen = varbnn.bayesianize(_mlp(), varbnn.MeanField()), []

    def compare(epoch, record):
        seen.append(abs(record["val_nll"] - varbnn.evaluate(model, *VALID, samples=5, seed=VALIDATION_SEED)["nll"]))

    _fit(model, epochs=2, validation=VALID, validation_samples=5, on_epoch_end=compare, mc_samples=2,
         validation_predictive="sample")
    assert len(seen) == 2 and max(seen) <= 1e-6


@pytest.mark.parametrize("family", ["meanfield", "ktied", "radial"])
def test_the_default_validation_predictive_is_moments_where_they_follow_the_network_else_draws(family):
    """fit's default ``validation_predictive="auto"``: the moment predictive's NLL for MeanField and KTied networks,
    the weight draws' for a Radial one (no moment propagation), each equal to evaluate's with that predictive."""
    seed_everything(0)
    posterior = {"meanfield": varbnn.MeanField(), "ktied": varbnn.KTied(), "radial": varbnn.Radial()}[family]
    model, seen = varbnn.bayesianize(_mlp(), posterior), []
    expected = "sample" if family == "radial" else "moments"

    def compare(epoch, record):
        for predictive in ("moments", "sample"):
            if predictive == "moments" and family == "radial":
                continue
            nll = varbnn.evaluate(model, *VALID, samples=5, seed=VALIDATION_SEED, predictive=predictive)["nll"]
            seen.append((predictive, abs(record["val_nll"] - nll) <= 1e-6))

    _fit(model, epochs=2, validation=VALID, validation_samples=5, on_epoch_end=compare)
    matched = {predictive for predictive, same in seen if same}
    assert matched == {expected}, seen


def test_a_custom_nll_is_averaged_over_the_draws_and_a_learned_likelihood_is_restored():
    x, y = TRAIN[0], TRAIN[0][:, 0] + 0.1 * TRAIN[0][:, 1]
    xv = VALID[0]
    yv = xv[:, 0] + 0.1 * xv[:, 1]
    squared = lambda output, target: (output.squeeze(-1) - target).square().mean()  # noqa: E731
    seed_everything(0)
    model, values = nn.Linear(4, 1), []
    history = varbnn.fit(model, [(x, y)], n_data=32, epochs=2, nll=squared, validation=(xv, yv), progress=False,
                         on_epoch_end=lambda e, r: values.append(float(squared(model(xv), yv))))  # fmt: skip
    assert [r["val_nll"] for r in history] == pytest.approx(values, rel=1e-6) and "val_accuracy" not in history[0]
    seed_everything(0)  # validation targets shifted by 0.3: the noise level learned on the training set gets too small
    likelihood, noise, model = Gaussian(), {}, nn.Linear(4, 1)
    history = varbnn.fit(model, [(x, x[:, 0])], n_data=32, epochs=100, lr=0.1, likelihood=likelihood, progress=False,
                         validation=(xv, xv[:, 0] + 0.3), early_stopping=1, diagnose=False,
                         on_epoch_end=lambda e, r: noise.update({e: _state(likelihood)}))  # fmt: skip
    best = history[-1]["best_epoch"]
    assert len(history) < 100 and best == len(history) - 1 and list(noise[best]) == ["log_noise_std"]
    assert _equal(_state(likelihood), noise[best]) and not _equal(noise[best], noise[len(history)])


def test_ivon_trains_with_early_stopping_and_restores_its_posterior():
    seed_everything(0)
    model, states = varbnn.bayesianize(_mlp(), varbnn.MeanField()), {}
    optimizer = IVON(model, n_data=32, lr=0.1, hess_init=1.0)
    history = _fit(model, epochs=20, optimizer=optimizer, validation=VALID, early_stopping=1,
                   on_epoch_end=lambda e, r: states.update({e: _state(model)}))  # fmt: skip
    best = history[-1]["best_epoch"]
    assert len(history) < 20 and best == len(history) - 1 and all(math.isfinite(r["val_nll"]) for r in history)
    assert _equal(_state(model), states[best]) and not _equal(states[best], states[len(history)])  # loc and rho


def _bad(**kwargs):
    return lambda: _fit(_mlp(), epochs=1, **kwargs)


NAN_X = VALID[0].clone()
NAN_X[3, 1] = math.nan

CASES = [
    BadInput("early-stopping-without-validation", _bad(early_stopping=2), ValueError, r"early_stopping=2 needs validation"),
    BadInput("early-stopping-0", _bad(validation=VALID, early_stopping=0), ValueError, r"early_stopping .*int >= 1, got 0"),
    BadInput("early-stopping-negative", _bad(validation=VALID, early_stopping=-1), ValueError, r"early_stopping .*>= 1"),
    BadInput("early-stopping-bool", _bad(validation=VALID, early_stopping=True), TypeError, r"early_stopping .*bool"),
    BadInput("early-stopping-float", _bad(validation=VALID, early_stopping=1.5), TypeError, r"early_stopping .*int"),
    BadInput("validation-samples-0", _bad(validation=VALID, validation_samples=0), ValueError, r"validation_samples .*>= 1"),
    BadInput("validation-lengths", _bad(validation=(VALID[0], VALID[1][:-1])), ValueError,
             r"validation=\(x, y\) must hold the same positive number of examples.*\(100, 4\) and \(99,\)"),
    BadInput("validation-empty", _bad(validation=(VALID[0][:0], VALID[1][:0])), ValueError, r"validation=.*positive"),
    BadInput("validation-nan-x", _bad(validation=(NAN_X, VALID[1])), ValueError, r"validation x contains NaN.*1 NaN"),
    BadInput("validation-not-a-pair", _bad(validation=VALID[0]), TypeError, r"validation must be a tuple \(x, y\)"),
    BadInput("validation-not-tensors", _bad(validation=(VALID[0].numpy(), VALID[1])), TypeError,
             r"validation must be a tuple \(x, y\) of tensors, got a ndarray"),
    BadInput("validation-labels-out-of-range", _bad(validation=(VALID[0], VALID[1] + 5)), ValueError,
             r"fit\(validation=\(x, y\)\): the validation set does not fit the model"),
    BadInput("validation-distributed", lambda: validation_watch(VALID, 8, None, nll=nn.functional.cross_entropy,
                                                                likelihood=None, distributed=True),
             ValueError, r"validation= is not available with distributed training"),
]  # fmt: skip


@pytest.mark.parametrize("case", params(CASES))
def test_bad_validation_and_early_stopping_arguments_are_named(case):
    check(case)


def test_the_validation_predictive_can_be_the_moment_predictive():
    seed_everything(0)
    model = varbnn.bayesianize(_mlp(), varbnn.MeanField(init_std=0.1))
    history = _fit(model, epochs=2, validation=VALID, validation_predictive="moments")
    moments = varbnn.evaluate(model, *VALID, samples=8, seed=VALIDATION_SEED, predictive="moments")["nll"]
    sampled = varbnn.evaluate(model, *VALID, samples=8, seed=VALIDATION_SEED, predictive="sample")["nll"]
    assert history[-1]["val_nll"] == pytest.approx(moments, rel=1e-6)
    assert moments != pytest.approx(sampled, rel=1e-6)  # the option reaches the validation pass
    with pytest.raises(ValueError, match=r"validation_predictive must be one of \('sample', 'moments', 'auto'\)"):
        _fit(model, epochs=1, validation=VALID, validation_predictive="mean")
