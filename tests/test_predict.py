import pytest
import torch
from torch import nn

import varbnn
from varbnn import MeanField
from varbnn.predict import classification_summary, regression_summary


def test_predict_shape_and_vectorised_equals_loop_in_distribution():
    torch.manual_seed(0)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4)), MeanField(init_std=0.3))
    x = torch.randn(5, 3)
    vec = varbnn.predict(model, x, samples=4000, vectorize=True)
    loop = varbnn.predict(model, x, samples=4000, vectorize=False)
    assert vec.shape == loop.shape == (4000, 5, 4)
    se = (vec.var(0) / 4000 + loop.var(0) / 4000).sqrt()
    assert ((vec.mean(0) - loop.mean(0)).abs() < 5 * se).all()
    assert vec.std(0).min() > 0  # draws differ


def test_predict_chunked_and_deterministic_models():
    plain = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    out = varbnn.predict(plain, x, samples=3, chunk_size=2, vectorize=True)
    assert out.shape == (3, 4, 2) and torch.equal(out[0], out[2])
    with pytest.raises(ValueError, match="samples must be a positive integer"):
        varbnn.predict(plain, x, samples=0)
    with pytest.raises(ValueError, match="x contains NaN"):
        varbnn.predict(plain, torch.full((2, 3), float("nan")))


def test_lstm_prediction_falls_back_or_vectorises():
    model = varbnn.bayesianize(nn.LSTM(2, 3, batch_first=True), MeanField(init_std=0.2))
    seqs = torch.randn(2, 5, 2)
    wrapped = _FirstOutput(model)
    assert varbnn.predict(wrapped, seqs, samples=6, vectorize=True).shape == (6, 2, 5, 3)


class _FirstOutput(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)[0]


def test_classification_summary_decomposes_entropy():
    logits = torch.randn(50, 7, 3) * 3
    s = classification_summary(logits)
    p = torch.softmax(logits, -1)
    total = -(p.mean(0) * p.mean(0).log()).sum(-1)
    expected = -(p * p.log()).sum(-1).mean(0)
    torch.testing.assert_close(s.predictive_entropy, total)
    torch.testing.assert_close(s.expected_entropy, expected)
    torch.testing.assert_close(s.mutual_information, total - expected)
    assert (s.mutual_information >= 0).all()
    same = classification_summary(logits[:1].expand(10, 7, 3))
    assert same.mutual_information.abs().max() < 1e-6  # identical draws: no epistemic uncertainty


def test_regression_summary():
    means = torch.tensor([[1.0, 2.0], [3.0, 2.0]])
    s = regression_summary(means, 0.25)
    torch.testing.assert_close(s.mean, torch.tensor([2.0, 2.0]))
    torch.testing.assert_close(s.epistemic_variance, torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(s.variance, torch.tensor([1.25, 0.25]))


@pytest.mark.parametrize("vectorize", [True, False], ids=["vmap", "loop"])
def test_predict_batches_and_seed_reproduce_exactly(vectorize):
    model = varbnn.bayesianize(
        nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4)), MeanField(init_std=0.3, estimator="reparam")
    )
    x = torch.randn(10, 3)
    a = varbnn.predict(model, x, samples=6, chunk_size=2, batch_size=4, seed=3, vectorize=vectorize)
    state = torch.get_rng_state()
    b = varbnn.predict(model, x, samples=6, chunk_size=2, batch_size=4, seed=3, vectorize=vectorize)
    assert torch.equal(torch.get_rng_state(), state)  # the global stream is untouched
    assert a.shape == (6, 10, 4) and torch.equal(a, b)
    # whole-weight draws: draw s is the same network on every example batch, so batching changes nothing
    whole = varbnn.predict(model, x, samples=6, chunk_size=2, seed=3, vectorize=vectorize)
    torch.testing.assert_close(a, whole)
    # without a seed the draws differ between calls
    assert not torch.equal(
        varbnn.predict(model, x, samples=6, vectorize=vectorize), varbnn.predict(model, x, samples=6, vectorize=vectorize)
    )
    for name in ("chunk_size", "batch_size"):
        with pytest.raises(ValueError, match=name):
            varbnn.predict(model, x, samples=2, **{name: 0})


def test_default_loops_only_for_bayesian_convolutions_on_the_cpu(monkeypatch):
    """vectorize=None (the default) loops over draws for CPU inputs to a model with a Bayesian convolution (where the
    batched pass measured slower) and calls vmap otherwise; anything but a bool or None is refused, naming the
    argument."""
    import importlib

    predict_module = importlib.import_module("varbnn.predict")  # the attribute varbnn.predict is the function
    calls = []
    real = predict_module.vmap

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(predict_module, "vmap", counting)
    dense = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 4)), MeanField(init_std=0.3))
    conv = varbnn.bayesianize(nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten()), MeanField(init_std=0.3))
    x, seqs = torch.randn(5, 3), torch.randn(5, 2, 6)
    assert varbnn.predict(dense, x, samples=3, predictive="sample").shape == (3, 5, 4)  # weight draws
    assert calls == [1]
    assert varbnn.predict(conv, seqs, samples=3, predictive="sample").shape == (3, 5, 12)
    assert calls == [1]  # looped
    varbnn.predict(conv, seqs, samples=3, vectorize=True)
    assert calls == [1, 1]
    # off the CPU every model is batched (a meta tensor stands in for a device here)
    assert predict_module.vectorized_by_default(conv, torch.empty(5, 2, 6, device="meta"))
    assert not predict_module.vectorized_by_default(conv, seqs)
    assert predict_module.vectorized_by_default(nn.Sequential(nn.Conv1d(2, 3, 3)), seqs)  # plain convolutions: batched
    with pytest.raises(ValueError, match="vectorize must be True, False or None"):
        varbnn.predict(dense, x, samples=3, vectorize="yes")


def test_point_mass_layers_are_deterministic_and_attention_loops_on_the_cpu() -> None:
    import importlib

    from varbnn.baselines import DeepEnsemble
    from varbnn.families import Delta

    predict_module = importlib.import_module("varbnn.predict")
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    delta = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2)), Delta())
    assert not predict_module._is_stochastic(delta)  # a plain LoRA (Delta adapters) passes once, as a plain net
    mixed = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2)), MeanField(init_std=0.3), bias_family=Delta())
    assert predict_module._is_stochastic(mixed)
    with varbnn.sample_mode(mixed, "mean"):
        assert not predict_module._is_stochastic(mixed)
    ensemble = DeepEnsemble([delta, varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2)), Delta())])
    assert varbnn.predict(ensemble, x, samples=8).shape == (2, 4, 2)  # one draw per deterministic member
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0)
    tokens = torch.randn(2, 3, 8)
    for model in (varbnn.bayesianize(layer), nn.Sequential(nn.MultiheadAttention(8, 2))):
        assert not predict_module.vectorized_by_default(model, tokens)  # vmap's fallback for fused attention is slow
        assert predict_module.vectorized_by_default(model, torch.empty(2, 3, 8, device="meta"))
