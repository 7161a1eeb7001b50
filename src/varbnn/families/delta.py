"""Delta (point-estimate) family: maximum likelihood or MAP training (Graves 2011, section 5.1)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributions import Distribution

from varbnn.distributions import Delta as DeltaDistribution
from varbnn.divergence import register_family_kl, scalar_normal_nll, scalar_normal_nll_applies
from varbnn.families.base import VariationalFamily, register_family
from varbnn.priors import Normal as NormalPrior

__all__ = ["Delta"]


@register_family("delta")
class Delta(VariationalFamily):
    """q(w) = delta(w - value). Its KL against a prior is ``-log p(value)``; against ``Uniform()`` it is 0.

    With ``Uniform()`` this is maximum likelihood, with ``Normal(0, s)`` L2 regularisation, with
    ``Laplace(0, b)`` L1, and with ``adaptive=True`` priors Graves' adaptive L1/L2.
    """

    value: nn.Parameter

    def __init__(self) -> None:
        super().__init__()

    def _materialize(self, shape: torch.Size, init: torch.Tensor) -> None:
        self.value = nn.Parameter(init)

    def distribution(self) -> Distribution:
        return DeltaDistribution(self.value)

    @property
    def mean(self) -> torch.Tensor:
        return self.value

    @property
    def mode(self) -> torch.Tensor:
        return self.value

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.value, torch.zeros_like(self.value)

    def rsample(self, sample_shape: torch.Size | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        return self.value.expand(torch.Size(sample_shape) + self.value.shape)


@register_family_kl(Delta, NormalPrior)
def _delta_normal_kl(family: Delta, prior: NormalPrior) -> torch.Tensor:
    """-log N(w | m, s^2) summed over the tensor, (w - m)^2 / (2 s^2) + log(s sqrt(2 pi)), without building
    distribution objects (scalar or elementwise m, s; a scalar prior that is not learned takes a one-pass path)."""
    loc, scale = prior.loc, prior.scale
    if scalar_normal_nll_applies(prior):
        return scalar_normal_nll(family.value, loc, scale)
    diff = family.value - loc
    log_norm = (scale.log() + 0.5 * math.log(2 * math.pi)).expand_as(family.value).sum()
    return 0.5 * (diff.square() / scale.square()).sum() + log_norm
