import math

import pytest
import torch
from torch import nn

import varbnn
from varbnn import BayesConv1d, BayesConv2d, BayesConv3d, BayesLinear, BayesLSTM, Delta, MeanField
from varbnn.convert import register_converter
from varbnn.nn import BayesianModule
from varbnn.priors import Laplace, Normal


def plain_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, groups=2),
        nn.Flatten(),
        nn.Linear(4 * 3 * 3, 8),
        nn.Tanh(),
        nn.Linear(8, 3),
    )


def test_delta_layers_reproduce_plain_layers_exactly():
    torch.manual_seed(0)
    lin, conv = nn.Linear(7, 5), nn.Conv2d(3, 6, 3, stride=2, padding=1, dilation=1)
    blin = BayesLinear(7, 5, family=Delta(), init_weight=lin.weight, init_bias=lin.bias)
    bconv = BayesConv2d(3, 6, 3, 2, 1, family=Delta(), init_weight=conv.weight, init_bias=conv.bias)
    x, img = torch.randn(11, 7), torch.randn(2, 3, 9, 9)
    assert torch.equal(blin(x), lin(x))
    assert torch.equal(bconv(img), conv(img))


def test_bayesianize_delta_reproduces_the_plain_model_exactly():
    model = plain_cnn()
    bayes = varbnn.bayesianize(model, family=Delta(), pretrained=True)
    x = torch.randn(5, 2, 8, 8)
    assert torch.equal(bayes(x), model(x))
    assert not any(isinstance(m, BayesianModule) for m in model.modules()), "input model must not be modified"
    assert sum(isinstance(m, BayesianModule) for m in bayes.modules()) == 4


def test_bayes_lstm_delta_matches_nn_lstm():
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 6, num_layers=2, batch_first=True)
    bayes = varbnn.bayesianize(lstm, Delta(), pretrained=True)
    x = torch.randn(4, 9, 3)
    out, (h, c) = lstm(x)
    bout, (bh, bc) = bayes(x)
    # nn.LSTM runs a fused kernel; the hand-written cell agrees to float32 rounding, not bit for bit
    torch.testing.assert_close(bout, out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bh, h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bc, c, rtol=1e-5, atol=1e-6)


def test_bayes_lstm_time_major_and_initial_state():
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4, num_layers=1, batch_first=False)
    bayes = varbnn.bayesianize(lstm, Delta(), pretrained=True)
    assert bayes.batch_first is False
    x, h0, c0 = torch.randn(5, 2, 3), torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    torch.testing.assert_close(bayes(x, (h0, c0))[0], lstm(x, (h0, c0))[0], rtol=1e-5, atol=1e-6)


def test_bayes_lstm_shares_one_weight_draw_across_time():
    torch.manual_seed(0)
    layer = BayesLSTM(2, 3, family=MeanField(init_std=0.5))
    calls = []
    original = layer.posteriors["weight_hh_l0"].rsample
    layer.posteriors["weight_hh_l0"].rsample = lambda *a: calls.append(1) or original(*a)
    layer(torch.randn(2, 7, 2))
    assert len(calls) == 1


def exact_moments(layer, x):
    w, b = layer.posteriors["weight"], layer.posteriors["bias"]
    op = layer._op
    mean = op(x, w.loc, b.loc)
    var = op(x * x, w.scale**2, b.scale**2)
    return mean.detach(), var.detach()


@pytest.mark.parametrize("estimator", ["reparam", "local", "flipout"])
@pytest.mark.parametrize("kind", ["linear", "conv1d", "conv2d", "conv3d"])
def test_estimators_have_the_exact_output_mean_and_variance(estimator, kind):
    torch.manual_seed(0)
    family = MeanField(init_std=0.4, estimator=estimator)
    if kind == "linear":
        layer, x = BayesLinear(5, 3, family=family), torch.randn(4, 5)
    elif kind == "conv1d":
        layer, x = BayesConv1d(2, 3, 3, padding=1, family=family), torch.randn(2, 2, 5)
    elif kind == "conv2d":
        layer, x = BayesConv2d(2, 3, 3, family=family), torch.randn(2, 2, 5, 5)
    else:
        layer, x = BayesConv3d(2, 3, 2, family=family), torch.randn(2, 2, 3, 3, 3)
    with torch.no_grad():
        for q in layer.posteriors.values():
            q.rho.add_(torch.randn_like(q.rho) * 0.3)
    n = 20000
    out = varbnn.predict(layer, x, samples=n, vectorize=True)
    mean, var = exact_moments(layer, x)
    # Monte Carlo tolerance: 5 standard errors of the mean and of the (Gaussian) sample variance
    assert ((out.mean(0) - mean).abs() <= 5 * (var / n).sqrt()).all()
    assert ((out.var(0) - var).abs() <= 5 * var * math.sqrt(2 / n)).all()


def test_flipout_decorrelates_examples_in_a_batch():
    torch.manual_seed(0)
    layer = BayesLinear(4, 1, bias=False, family=MeanField(init_std=1.0, estimator="flipout"))
    x = torch.ones(2, 4)
    out = varbnn.predict(layer, x, samples=20000, vectorize=True)[..., 0]
    reparam = BayesLinear(4, 1, bias=False, family=MeanField(init_std=1.0))
    reparam.load_state_dict(layer.state_dict())
    out_r = varbnn.predict(reparam, x, samples=20000, vectorize=True)[..., 0]
    corr = lambda o: float(torch.corrcoef(o.T)[0, 1])  # noqa: E731
    assert abs(corr(out)) < 0.05  # flipout: pairwise uncorrelated examples
    assert corr(out_r) > 0.99  # reparam: one weight draw per batch


def test_local_and_flipout_refused_in_lstm():
    with pytest.raises(ValueError, match="not supported in lstm layers.*allowed there: \\['reparam', 'graves'\\]"):
        BayesLSTM(3, 4, family=MeanField(estimator="local"))
    with pytest.raises(ValueError, match="flipout"):
        varbnn.bayesianize(nn.LSTM(3, 4), MeanField(estimator="flipout"))


def test_sample_mode_mean_is_deterministic_and_equals_to_deterministic():
    model = varbnn.bayesianize(plain_cnn(), MeanField(init_std=0.1, estimator="local"))
    x = torch.randn(3, 2, 8, 8)
    assert not torch.equal(model(x), model(x))
    with varbnn.sample_mode(model, "mean"):
        a, b = model(x), model(x)
    assert torch.equal(a, b)
    assert all(m.sample_mode == "sample" for m in model.modules() if isinstance(m, BayesianModule))
    plain = varbnn.to_deterministic(model, "mean")
    assert not any(isinstance(m, BayesianModule) for m in plain.modules())
    torch.testing.assert_close(plain(x), a)


def test_to_deterministic_lstm_roundtrip():
    lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)
    bayes = varbnn.bayesianize(lstm, MeanField(), pretrained=True)
    back = varbnn.to_deterministic(bayes, "mode")
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(back(x)[0], lstm(x)[0])


def test_bayesianize_exclude_by_name_and_type():
    model = plain_cnn()
    bayes = varbnn.bayesianize(model, MeanField(), exclude=["6"])
    assert isinstance(bayes[6], nn.Linear) and isinstance(bayes[4], BayesLinear)
    bayes = varbnn.bayesianize(model, MeanField(), exclude=[nn.Conv2d])
    assert isinstance(bayes[0], nn.Conv2d) and isinstance(bayes[4], BayesLinear)


def test_bayesianize_shares_one_prior_or_calls_a_factory():
    shared = Normal(0.0, 0.5)
    bayes = varbnn.bayesianize(plain_cnn(), MeanField(), shared)
    priors = [p for m in bayes.modules() if isinstance(m, BayesianModule) for _, _, p in m.bayesian_tensors()]
    assert len(priors) == 8 and all(p is shared for p in priors)
    names = []
    varbnn.bayesianize(plain_cnn(), MeanField(), lambda name: names.append(name) or Laplace(0.0, 0.1))
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias", "6.weight", "6.bias"]


def test_bias_may_use_its_own_family_and_prior():
    layer = BayesLinear(3, 2, family=MeanField(), prior=Normal(0, 1), bias_family=Delta(), bias_prior=Laplace(0, 1))
    assert isinstance(layer.posteriors["bias"], Delta) and isinstance(layer.priors["bias"], Laplace)
    layer(torch.randn(4, 3))


def test_converter_registry_is_extensible():
    class Scaled(nn.Linear):
        pass

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2, 2))

        def forward(self, x):
            return x @ self.weight

    @register_converter(Custom)
    def _convert(module, ctx):
        return BayesLinear(2, 2, bias=False, family=ctx.family, prior=ctx.prior, init_weight=module.weight.T.detach())

    model = nn.Sequential(Custom(), Scaled(2, 2))
    bayes = varbnn.bayesianize(model, Delta(), pretrained=True)
    assert isinstance(bayes[0], BayesLinear) and isinstance(bayes[1], BayesLinear)  # subclass via the MRO
    x = torch.randn(3, 2)
    assert torch.equal(bayes(x), model(x))


def test_kl_of_model_is_the_sum_over_tensors():
    model = varbnn.bayesianize(plain_cnn(), MeanField(init_std=0.1), Normal(0, 1))
    total = sum(float(q.kl(p)) for m in model.modules() if isinstance(m, BayesianModule) for _, q, p in m.bayesian_tensors())
    assert float(varbnn.kl(model)) == pytest.approx(total, rel=1e-6)
    assert float(varbnn.kl(nn.Linear(2, 2))) == 0.0


def test_layers_work_in_sequential_and_on_shapes():
    model = nn.Sequential(BayesLinear(4, 8), nn.ReLU(), BayesLinear(8, 2))
    assert model(torch.randn(3, 4)).shape == (3, 2)
    assert model(torch.randn(5, 3, 4)).shape == (5, 3, 2)
    with pytest.raises(ValueError, match="input has 5 features.*expected 4"):
        model(torch.randn(3, 5))
    with pytest.raises(ValueError, match="BayesConv2d: input must be"):
        BayesConv2d(3, 2, 3)(torch.randn(2, 4, 5, 5))
    with pytest.raises(ValueError, match="in_features must be a positive integer"):
        BayesLinear(0, 2)
    with pytest.raises(ValueError, match="divisible by groups"):
        BayesConv2d(3, 4, 3, groups=2)


def test_unsupported_modules_are_refused_clearly():
    with pytest.raises(NotImplementedError, match="bidirectional"):
        varbnn.bayesianize(nn.LSTM(2, 3, bidirectional=True))
    with pytest.raises(NotImplementedError, match="padding_mode"):
        varbnn.bayesianize(nn.Conv2d(2, 3, 3, padding_mode="reflect"))


def test_state_dict_roundtrip():
    model = varbnn.bayesianize(plain_cnn(), MeanField(), Normal(0.0, 1.0, adaptive=True))
    clone = varbnn.bayesianize(plain_cnn(), MeanField(), Normal(0.0, 1.0, adaptive=True))
    clone.load_state_dict(model.state_dict())
    x = torch.randn(2, 2, 8, 8)
    with varbnn.sample_mode(model, "mean"), varbnn.sample_mode(clone, "mean"):
        assert torch.equal(model(x), clone(x))


def test_estimators_give_the_same_expected_loss_and_gradient_in_a_deep_network():
    """Local reparameterization and flipout are unbiased for the NLL of a multi-layer network and for its
    gradient (they only lower the variance): compare each with reparam at identical parameters."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    reference = varbnn.bayesianize(net, MeanField(init_std=0.3))
    draws = 3000

    def moments(model):
        values, grads = [], []
        for _ in range(draws):
            loss = nn.functional.cross_entropy(model(x), y)
            grads.append(torch.autograd.grad(loss, [model[2].posteriors["weight"].rho])[0].reshape(-1))
            values.append(loss.detach())
        return torch.stack(values), torch.stack(grads)

    ref_values, ref_grads = moments(reference)
    for estimator in ("local", "flipout"):
        model = varbnn.bayesianize(net, MeanField(init_std=0.3, estimator=estimator))
        model.load_state_dict(reference.state_dict())
        values, grads = moments(model)
        se = (values.var() / draws + ref_values.var() / draws).sqrt()
        assert abs(float(values.mean() - ref_values.mean())) < 5 * float(se), estimator
        se_g = (grads.var(0) / draws + ref_grads.var(0) / draws).sqrt()
        assert ((grads.mean(0) - ref_grads.mean(0)).abs() < 5 * se_g + 1e-7).all(), estimator
