"""Weight-linear operations that layers hand to their weight family.

A family's fast estimators (local reparameterization, flipout) rely only on the op being LINEAR in the
weight, so one implementation serves ``F.linear`` and ``F.conv2d`` alike; the op also says where flipout's
per-example random signs go (every feature for a dense layer, every channel for a convolution).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

__all__ = ["WeightOp", "LinearOp", "Conv2dOp"]


class WeightOp(Protocol):
    """``op(x, weight, bias)``, linear in ``weight``."""

    @property
    def name(self) -> str: ...

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...

    def add_bias(self, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor: ...

    def input_sign_shape(self, x: torch.Tensor) -> torch.Size: ...

    def output_sign_shape(self, out: torch.Tensor) -> torch.Size: ...


@dataclass(frozen=True)
class LinearOp:
    name: str = "linear"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def add_bias(self, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return out + bias

    def input_sign_shape(self, x: torch.Tensor) -> torch.Size:
        return x.shape

    def output_sign_shape(self, out: torch.Tensor) -> torch.Size:
        return out.shape


@dataclass(frozen=True)
class Conv2dOp:
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] | str = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    name: str = "conv2d"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.conv2d(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def add_bias(self, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return out + bias.view(-1, 1, 1)

    def input_sign_shape(self, x: torch.Tensor) -> torch.Size:
        # One sign per example and input channel: the perturbation must be shared across positions.
        return x.shape[:-2] + (1, 1)

    def output_sign_shape(self, out: torch.Tensor) -> torch.Size:
        return out.shape[:-2] + (1, 1)
