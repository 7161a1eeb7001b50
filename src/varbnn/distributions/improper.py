"""The improper uniform prior over the real line (Graves 2011: uniform prior = maximum likelihood)."""

from __future__ import annotations

import torch
from torch.distributions import Distribution, constraints

__all__ = ["ImproperUniform"]


class ImproperUniform(Distribution):
    """Improper flat density over R^shape with ``log_prob == 0``.

    It cannot be sampled. Against it the KL of any posterior is ``-entropy(q)`` up to an infinite constant
    (and exactly 0 for a delta posterior), which is what turns variational training into maximum likelihood.

    :param shape: the tensor's shape (the event shape).
    :param dtype: the dtype the prior stands for (default float32; ``log_prob`` follows its input's dtype).
    :param device: the device the prior stands for (default: the CPU).
    """

    arg_constraints: dict[str, constraints.Constraint] = {}
    support = constraints.real

    def __init__(
        self,
        shape: torch.Size | tuple[int, ...],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self._dtype = dtype
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        super().__init__(batch_shape=torch.Size(), event_shape=torch.Size(shape), validate_args=False)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        n = len(self.event_shape)
        return value.new_zeros(value.shape[: value.dim() - n])

    def sample(self, sample_shape: torch.Size | list[int] | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        raise NotImplementedError("ImproperUniform is an improper prior and cannot be sampled")
