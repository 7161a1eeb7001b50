"""Blundell et al. (2015) scale-mixture prior ``pi N(0, s1^2) + (1 - pi) N(0, s2^2)``."""

from __future__ import annotations

import math

import torch
from torch.distributions import Distribution, constraints

__all__ = ["ScaleMixtureNormal"]


class ScaleMixtureNormal(Distribution):
    """Zero-mean two-component scale mixture of Normals, i.i.d. over a tensor of shape ``shape``.

    ``log_prob`` uses ``logsumexp`` of the two component log-densities; it never takes the log of a sum of
    densities, which underflows to ``log 0 = -inf`` far in the tails:
    ``log p(w) = sum_i logsumexp(log pi + log N(w_i | 0, s1^2), log(1 - pi) + log N(w_i | 0, s2^2))``.

    :param mixture: pi, the first component's weight, in [0, 1] (a 0-d tensor).
    :param scale1: s1 > 0, the first component's standard deviation.
    :param scale2: s2 > 0, the second component's standard deviation.
    :param shape: the tensor's shape (the event shape).
    :param validate_args: as in ``torch.distributions``.
    """

    arg_constraints = {
        "mixture": constraints.unit_interval,
        "scale1": constraints.positive,
        "scale2": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(
        self,
        mixture: torch.Tensor,
        scale1: torch.Tensor,
        scale2: torch.Tensor,
        shape: torch.Size | tuple[int, ...],
        validate_args: bool | None = None,
    ) -> None:
        self.mixture, self.scale1, self.scale2 = mixture, scale1, scale2
        super().__init__(batch_shape=torch.Size(), event_shape=torch.Size(shape), validate_args=validate_args)

    def _log_components(self, value: torch.Tensor) -> torch.Tensor:
        half_log_2pi = 0.5 * math.log(2 * math.pi)
        lp1 = torch.log(self.mixture) - torch.log(self.scale1) - half_log_2pi - 0.5 * (value / self.scale1) ** 2
        lp2 = torch.log1p(-self.mixture) - torch.log(self.scale2) - half_log_2pi - 0.5 * (value / self.scale2) ** 2
        return torch.logaddexp(lp1, lp2)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        n = len(self.event_shape)
        elementwise = self._log_components(value)
        return elementwise.sum(dim=tuple(range(value.dim() - n, value.dim()))) if n else elementwise

    def sample(self, sample_shape: torch.Size | list[int] | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        shape = torch.Size(sample_shape) + self.event_shape
        with torch.no_grad():
            first = torch.rand(shape, device=self.scale1.device) < self.mixture
            scale = torch.where(first, self.scale1, self.scale2)
            return torch.randn(shape, device=self.scale1.device, dtype=self.scale1.dtype) * scale
