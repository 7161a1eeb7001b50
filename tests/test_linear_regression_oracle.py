"""Mean-field VI on Bayesian linear regression must reach the known optimum of the mean-field ELBO.

For y = X w + noise, noise ~ N(0, s_n^2), prior w ~ N(0, s_p^2 I), the exact posterior is N(m, L^-1) with
L = I / s_p^2 + X^T X / s_n^2 and m = L^-1 X^T y / s_n^2. The mean-field Gaussian that maximises the ELBO
has means m and variances 1 / diag(L) (e.g. Bishop 2006, section 10.1.2).
"""

import math

import torch

import varbnn
from varbnn import BayesLinear, MeanField
from varbnn.priors import Normal


def test_meanfield_vi_recovers_the_exact_mean_field_optimum():
    torch.manual_seed(0)
    n, d, noise, prior_std = 40, 3, 0.5, 1.0
    x = torch.randn(n, d) @ torch.tensor([[1.0, 0.6, 0.0], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])  # correlated inputs
    w_true = torch.tensor([1.0, -2.0, 0.5])
    y = x @ w_true + noise * torch.randn(n)
    precision = torch.eye(d) / prior_std**2 + x.T @ x / noise**2
    mean = torch.linalg.solve(precision, x.T @ y / noise**2)
    mf_var = 1.0 / torch.diagonal(precision)

    layer = BayesLinear(d, 1, bias=False, family=MeanField(init_std=0.1, estimator="local"), prior=Normal(0.0, prior_std))
    opt = torch.optim.Adam(layer.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1500, 0.2)
    xs = x.repeat(16, 1)  # 16 independent local-reparameterised draws per example per step
    ys = y.repeat(16)
    avg_loc, avg_var, count = torch.zeros(d), torch.zeros(d), 0
    for step in range(4500):
        pred = layer(xs).squeeze(-1)
        nll = 0.5 * ((ys - pred) / noise) ** 2 + math.log(noise * math.sqrt(2 * math.pi))
        loss = varbnn.elbo_loss(nll.mean(), layer, n_data=n).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step >= 3500:  # Polyak averaging over the last 1000 steps
            q = layer.posteriors["weight"]
            avg_loc += q.loc.detach()[0]
            avg_var += q.scale.detach()[0] ** 2
            count += 1
    avg_loc, avg_var = avg_loc / count, avg_var / count
    # tolerance: 2% of a posterior std for the means, 3% relative for the variances
    assert ((avg_loc - mean).abs() < 0.02 * mf_var.sqrt()).all(), (avg_loc, mean)
    assert ((avg_var / mf_var - 1).abs() < 0.03).all(), (avg_var, mf_var)
