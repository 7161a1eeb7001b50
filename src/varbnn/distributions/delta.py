"""A point mass: the "posterior" of maximum-likelihood / MAP training (Graves 2011, section 5.1)."""

from __future__ import annotations

import torch
from torch.distributions import Distribution, constraints

__all__ = ["Delta"]


class Delta(Distribution):
    """Point mass at ``value``; the whole tensor is one event.

    ``log_prob`` is 0 at ``value`` and ``-inf`` elsewhere; ``entropy`` is 0 by convention. Graves (2011,
    section 5.1) notes that the true description length of a delta posterior carries a large constant C
    that depends on the discretisation of the weights; it has no gradient and is dropped here, so
    ``KL(Delta(w) || p) = -log p(w)``.
    """

    arg_constraints = {"value": constraints.real}
    support = constraints.real
    has_rsample = True

    def __init__(self, value: torch.Tensor, validate_args: bool | None = None) -> None:
        self.value = value
        super().__init__(batch_shape=torch.Size(), event_shape=value.shape, validate_args=validate_args)

    @property
    def mean(self) -> torch.Tensor:
        return self.value

    @property
    def mode(self) -> torch.Tensor:
        return self.value

    @property
    def variance(self) -> torch.Tensor:
        return torch.zeros_like(self.value)

    def rsample(self, sample_shape: torch.Size | list[int] | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        return self.value.expand(torch.Size(sample_shape) + self.value.shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        n = len(self.event_shape)
        dims = tuple(range(value.dim() - n, value.dim()))
        equal = (value == self.value).all(dim=dims) if n else value == self.value
        return torch.where(equal, 0.0, float("-inf")).to(self.value.dtype)

    def entropy(self) -> torch.Tensor:
        return torch.zeros((), dtype=self.value.dtype, device=self.value.device)
