"""Delta (point-estimate) family: maximum likelihood or MAP training (Graves 2011, section 5.1)."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn
from torch.distributions import Distribution

from varbnn.distributions import Delta as DeltaDistribution
from varbnn.divergence import NormalKLParts, register_family_kl, scalar_normal_nll, scalar_normal_nll_applies
from varbnn.families.base import VariationalFamily, register_family
from varbnn.priors import Normal as NormalPrior

__all__ = ["Delta"]


@register_family("delta")
class Delta(VariationalFamily):
    """Point-mass posterior ``q(w) = delta(w - value)``; the one parameter ``value`` is the weight itself.

    Its complexity cost is ``L^C = -log p(value)`` summed over the tensor (Graves 2011 section 5.1; the
    discretisation constant is dropped); against :class:`~varbnn.priors.Uniform` it is 0. So with ``Uniform()``
    training is maximum likelihood, with ``Normal(0, s)`` L2 regularisation (Graves eq. 8:
    ``sum (w_i - m)^2 / (2 s^2) + W log(sqrt(2 pi) s)``), with ``Laplace(0, b)`` L1 (eq. 7:
    ``sum |w_i - m| / b + W log(2 b)``), and with ``adaptive=True`` priors Graves' adaptive L1/L2 (the prior
    parameters set to their optimum after every step). The family takes no arguments; the mean and the mode are
    ``value``, and a layer built with it reproduces the plain layer exactly.
    """

    value: nn.Parameter
    point_mass: ClassVar[bool] = True
    independent_elements: ClassVar[bool] = True
    """A point mass at ``value`` (:attr:`VariationalFamily.point_mass`)."""

    def __init__(self) -> None:
        super().__init__()

    def _materialize(self, shape: torch.Size, init: torch.Tensor) -> None:
        self.value = nn.Parameter(init)

    def distribution(self) -> Distribution:
        return DeltaDistribution(self.value, validate_args=False)  # (validating reads the device: a wait per step)

    @property
    def mean(self) -> torch.Tensor:
        """The point ``value`` (also the mode)."""
        return self.value

    @property
    def mode(self) -> torch.Tensor:
        """The point ``value`` (also the mean)."""
        return self.value

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.value, torch.zeros_like(self.value)

    def rsample(self, sample_shape: torch.Size | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        return self.value.expand(torch.Size(sample_shape) + self.value.shape)


def _delta_normal_kl_parts(family: Delta, prior: NormalPrior) -> NormalKLParts | None:
    """``-log N(w | m, s^2)`` as :class:`~varbnn.divergence.NormalKLParts`: no sigma, ``constant = n (1 + log 2 pi) / 2``."""
    if not scalar_normal_nll_applies(prior):
        return None
    n = family.value.numel()
    return NormalKLParts(family.value, None, None, prior.loc, prior.scale, 1.0, n * 0.5 * (1.0 + math.log(2 * math.pi)))


@register_family_kl(Delta, NormalPrior, parts=_delta_normal_kl_parts)
def _delta_normal_kl(family: Delta, prior: NormalPrior) -> torch.Tensor:
    """-log N(w | m, s^2) summed over the tensor, (w - m)^2 / (2 s^2) + log(s sqrt(2 pi)), without building
    distribution objects (scalar or elementwise m, s; a scalar prior that is not learned takes a one-pass path)."""
    loc, scale = prior.loc, prior.scale
    if scalar_normal_nll_applies(prior):
        return scalar_normal_nll(family.value, loc, scale)
    diff = family.value - loc
    log_norm = (scale.log() + 0.5 * math.log(2 * math.pi)).expand_as(family.value).sum()
    return 0.5 * (diff.square() / scale.square()).sum() + log_norm
