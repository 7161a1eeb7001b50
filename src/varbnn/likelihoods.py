"""Likelihoods with their own variational parameters."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Gamma, kl_divergence

from varbnn.families.gaussian import inverse_softplus

__all__ = ["GammaPrecisionGaussian"]


class GammaPrecisionGaussian(nn.Module):
    """Gaussian likelihood ``y ~ N(f, 1/tau)`` whose noise precision has a Gamma prior and a Gamma variational
    posterior (Hernandez-Lobato & Adams 2015; Oh et al. 2020, section 5.1).

    Args:
        prior_shape, prior_rate: the prior Gamma(a0, b0) (default 6, 6 as in the papers; the published RDP code
            uses 1, 1).
        init_shape, init_rate: the initial posterior Gamma(a1, b1) (default: the prior).

    ``expected_log_likelihood(y, f) = E_q[log N(y | f, 1/tau)] = (psi(a1) - log b1)/2 - log(2 pi)/2 - a1/b1 (y-f)^2/2``
    is what the ELBO needs; :meth:`kl` is KL(q(tau) || p(tau)).

    Two ways to fit q(tau): by gradient (its parameters in the optimizer), or in closed form with
    :meth:`observe` and :meth:`update_posterior_`. Given q(w), the ELBO's optimum over q(tau) is conjugate:
    ``Gamma(a0 + N/2, b0 + E_q(w)[SSE]/2)`` (:meth:`optimal_posterior`). The gradient route is slow in practice:
    Adam moves each softplus-parameter by about ``lr`` per step, so the shape climbs from a0 = 6 to a0 + N/2
    (e.g. 144 for yacht) only over tens of thousands of steps, and the noise is overestimated meanwhile.
    """

    mean_square: torch.Tensor

    prior_shape: torch.Tensor
    prior_rate: torch.Tensor

    def __init__(
        self, prior_shape: float = 6.0, prior_rate: float = 6.0, init_shape: float | None = None, init_rate: float | None = None
    ) -> None:
        super().__init__()
        for name, value in (
            ("prior_shape", prior_shape),
            ("prior_rate", prior_rate),
            ("init_shape", init_shape),
            ("init_rate", init_rate),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"GammaPrecisionGaussian: {name} must be a finite number > 0, got {value!r}")
        self.register_buffer("prior_shape", torch.tensor(float(prior_shape)))
        self.register_buffer("prior_rate", torch.tensor(float(prior_rate)))
        self.shape_rho = nn.Parameter(torch.tensor(inverse_softplus(float(init_shape or prior_shape))))
        self.rate_rho = nn.Parameter(torch.tensor(inverse_softplus(float(init_rate or prior_rate))))
        self.register_buffer("mean_square", torch.tensor(float("nan")))  # running E_q[(y - f)^2] (closed form)

    @property
    def shape(self) -> torch.Tensor:
        return F.softplus(self.shape_rho)

    @property
    def rate(self) -> torch.Tensor:
        return F.softplus(self.rate_rho)

    def posterior(self) -> Gamma:
        return Gamma(self.shape, self.rate)

    def expected_log_likelihood(self, y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """Elementwise E_q(tau)[log N(y | f, 1/tau)] (nats)."""
        if y.shape != f.shape:
            raise ValueError(f"y and f must have the same shape, got {tuple(y.shape)} and {tuple(f.shape)}")
        a, b = self.shape, self.rate
        return 0.5 * (torch.digamma(a) - b.log()) - 0.5 * math.log(2 * math.pi) - 0.5 * (a / b) * (y - f).square()

    def kl(self) -> torch.Tensor:
        """KL(Gamma(a1, b1) || Gamma(a0, b0))."""
        return kl_divergence(self.posterior(), Gamma(self.prior_shape, self.prior_rate))

    def optimal_posterior(self, expected_sse: torch.Tensor | float, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The q(tau) = Gamma(a, b) that maximises the ELBO given ``expected_sse = E_q(w)[sum_n (y_n - f_n)^2]`` over
        ``n`` training points: ``a = a0 + n/2``, ``b = b0 + expected_sse/2``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer (the number of training points), got {n!r}")
        sse = torch.as_tensor(expected_sse, dtype=self.prior_rate.dtype, device=self.prior_rate.device)
        if not bool(torch.isfinite(sse)) or float(sse) < 0:
            raise ValueError(f"expected_sse must be finite and >= 0, got {float(sse)!r}")
        return self.prior_shape + n / 2, self.prior_rate + sse / 2

    @torch.no_grad()
    def set_posterior_(self, shape: torch.Tensor | float, rate: torch.Tensor | float) -> None:
        """Set q(tau) = Gamma(shape, rate) (both > 0)."""
        shape_t, rate_t = torch.as_tensor(shape, dtype=self.shape_rho.dtype), torch.as_tensor(rate, dtype=self.rate_rho.dtype)
        if not (bool(torch.isfinite(shape_t)) and bool(torch.isfinite(rate_t)) and shape_t > 0 and rate_t > 0):
            raise ValueError(f"shape and rate must be finite and > 0, got {float(shape_t)!r}, {float(rate_t)!r}")
        self.shape_rho.copy_(inverse_softplus(shape_t))
        self.rate_rho.copy_(inverse_softplus(rate_t))

    @torch.no_grad()
    def observe(self, y: torch.Tensor, f: torch.Tensor, decay: float) -> None:
        """Fold a batch's mean squared residual (f one draw of the network: unbiased for E_q(w)) into the running
        mean ``mean_square`` with ``mean <- decay * mean + (1 - decay) * batch`` (the first batch sets it)."""
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay!r}")
        if y.shape != f.shape:
            raise ValueError(f"y and f must have the same shape, got {tuple(y.shape)} and {tuple(f.shape)}")
        batch = (y - f).square().mean().to(self.mean_square.dtype)
        if torch.isnan(self.mean_square):
            self.mean_square.copy_(batch)
        else:
            self.mean_square.mul_(decay).add_((1 - decay) * batch)

    @torch.no_grad()
    def update_posterior_(self, n: int) -> None:
        """Set q(tau) to :meth:`optimal_posterior` with ``E[SSE] = n * mean_square`` (after :meth:`observe`)."""
        if torch.isnan(self.mean_square):
            raise RuntimeError("update_posterior_ needs observe() first: no residuals have been seen")
        shape, rate = self.optimal_posterior(n * self.mean_square, n)
        self.set_posterior_(shape, rate)

    def sample_precision(self, n: int) -> torch.Tensor:
        """``n`` draws of tau from the posterior (no gradient)."""
        with torch.no_grad():
            return self.posterior().sample((n,))

    def extra_repr(self) -> str:
        return f"prior=Gamma({float(self.prior_shape):g}, {float(self.prior_rate):g})"
