"""Delta (point-estimate) family: maximum likelihood or MAP training (Graves 2011, section 5.1)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Distribution

from varbnn.distributions import Delta as DeltaDistribution
from varbnn.families.base import VariationalFamily, register_family

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
