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
    """

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

    def sample_precision(self, n: int) -> torch.Tensor:
        """``n`` draws of tau from the posterior (no gradient)."""
        with torch.no_grad():
            return self.posterior().sample((n,))

    def extra_repr(self) -> str:
        return f"prior=Gamma({float(self.prior_shape):g}, {float(self.prior_rate):g})"
