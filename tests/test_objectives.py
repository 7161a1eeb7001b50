import math

import pytest
import torch
from torch import nn

import varbnn
from varbnn import Delta, MeanField
from varbnn.objectives import linear_kl_annealing
from varbnn.priors import Normal


def model():
    torch.manual_seed(0)
    return varbnn.bayesianize(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), MeanField(init_std=0.1))


def test_loss_is_mean_nll_plus_beta_kl_over_n():
    m = model()
    nll = torch.tensor(0.7, requires_grad=True)
    terms = varbnn.elbo_loss(nll, m, n_data=1000, kl_weight=0.5)
    kl = float(varbnn.kl(m))
    assert float(terms.loss) == pytest.approx(0.7 + 0.5 * kl / 1000, rel=1e-6)
    assert float(terms.kl) == pytest.approx(kl, rel=1e-6)
    assert terms.nll_bits == pytest.approx(0.7 / math.log(2))
    assert terms.kl_bits == pytest.approx(kl / math.log(2), rel=1e-6)
    assert terms.negative_elbo == pytest.approx(0.7 + kl / 1000, rel=1e-6)
    assert set(terms.as_dict()) == {"loss", "nll", "kl", "nll_bits", "kl_bits", "beta"}


def test_kl_gradient_is_scaled_by_one_over_n_not_the_batch():
    m = model()
    terms = varbnn.elbo_loss(torch.tensor(0.0), m, n_data=500)
    terms.loss.backward()
    g_loss = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    (varbnn.kl(m) / 500).backward()
    for a, p in zip(g_loss, m.parameters()):
        torch.testing.assert_close(a, p.grad)


def test_delta_with_normal_prior_is_l2_regularisation():
    torch.manual_seed(0)
    m = varbnn.bayesianize(nn.Linear(3, 2), Delta(), Normal(0.0, 2.0))
    w = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    expected = (w**2).sum() / (2 * 4.0) + w.numel() * math.log(2.0 * math.sqrt(2 * math.pi))
    assert float(varbnn.kl(m)) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"nll": torch.ones(4), "n_data": 10}, "nll must be a scalar"),
        ({"nll": torch.tensor(1.0), "n_data": 0}, "n_data must be a positive integer"),
        ({"nll": torch.tensor(1.0), "n_data": 10, "kl_weight": -1.0}, "elbo_loss: kl_weight must be"),
        ({"nll": torch.tensor(1.0), "n_data": 10, "kl_weight": True}, "elbo_loss: kl_weight must be .* got a bool"),
        ({"nll": torch.tensor(1.0), "n_data": 10, "kl_weight": 0.5, "beta": 0.5}, "kl_weight= only .* not both"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        varbnn.elbo_loss(model=model(), **kwargs)


def test_beta_is_the_kl_weights_earlier_name():
    nll = torch.tensor(0.5)
    torch.manual_seed(0)
    m = model()
    with pytest.warns(FutureWarning, match=r"elbo_loss\(beta=...\) is now elbo_loss\(kl_weight=...\)"):
        old = varbnn.elbo_loss(nll, m, n_data=10, beta=0.3)
    new = varbnn.elbo_loss(nll, m, n_data=10, kl_weight=0.3)
    assert old.kl_weight == new.kl_weight == new.beta == 0.3 and torch.equal(old.loss, new.loss)


def test_linear_annealing():
    assert [linear_kl_annealing(s, 4) for s in (0, 2, 4, 9)] == [0.0, 0.5, 1.0, 1.0]
    assert linear_kl_annealing(3, 0) == 1.0
