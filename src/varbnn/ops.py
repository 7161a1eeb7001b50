"""Weight-linear operations that layers hand to their weight family.

A family's fast estimators (local reparameterization, flipout) rely only on the op being LINEAR in the
weight, so one implementation serves ``F.linear``, ``F.conv{1,2,3}d`` and ``F.embedding`` alike. The op says

* what input the variance path takes (:meth:`WeightOp.squared_input`): local reparameterization samples each
  output from ``N(op(x, mu, b_mu), op(x^2, sigma^2, b_sigma^2))`` (Kingma et al. 2015, eq. 6-7) since for
  independent weights ``Var[sum_i x_i w_i] = sum_i x_i^2 Var[w_i]``; for an embedding lookup, a one-hot input
  row squared is itself, so the indices are used as they are;
* where flipout's per-example random signs go (every feature for a dense layer, every channel for a
  convolution; an embedding has no input features to flip, so flipout is not offered there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

__all__ = ["WeightOp", "LinearOp", "ConvOp", "Conv2dOp", "EmbeddingOp"]


class WeightOp(Protocol):
    """``op(x, weight, bias)``, linear in ``weight``: the interface a layer hands to its weight family
    (:meth:`varbnn.families.VariationalFamily.forward_op`). :class:`LinearOp`, :class:`ConvOp` and
    :class:`EmbeddingOp` implement it."""

    @property
    def name(self) -> str:
        """A short name for messages (``"linear"``, ``"conv2d"``, ``"embedding"``)."""
        ...

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The layer's output for input ``x``, a weight tensor and an optional bias (``None``: no bias)."""
        ...

    def squared_input(self, x: torch.Tensor) -> torch.Tensor:
        """The input of the variance path: ``op(squared_input(x), sigma^2, None)`` is the output variance under
        independent weights."""
        ...

    def add_bias(self, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``out`` plus a bias drawn separately (broadcast over the positions of a convolution)."""
        ...

    def input_sign_shape(self, x: torch.Tensor) -> torch.Size:
        """The shape of flipout's random input signs for input ``x``: one per example and input feature (channel)."""
        ...

    def output_sign_shape(self, out: torch.Tensor) -> torch.Size:
        """The shape of flipout's random output signs: one per example and output feature (channel)."""
        ...


@dataclass(frozen=True)
class LinearOp:
    """``F.linear(x, W, b)``: y = x W^T + b."""

    name: str = "linear"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def squared_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x^2`` elementwise: ``Var[x W^T] = x^2 (sigma^2)^T`` for independent weights."""
        return x * x

    def add_bias(self, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``out + bias``."""
        return out + bias

    def input_sign_shape(self, x: torch.Tensor) -> torch.Size:
        """``x.shape``: one sign per example and input feature."""
        return x.shape

    def output_sign_shape(self, out: torch.Tensor) -> torch.Size:
        """``out.shape``: one sign per example and output unit."""
        return out.shape


_CONVOLUTIONS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@dataclass(frozen=True)
class ConvOp:
    """``F.conv{dim}d(x, W, b, stride, padding, dilation, groups)``: one op for 1-, 2- and 3-d convolutions.

    :param dim: number of spatial dimensions (1, 2 or 3).
    :param stride: as ``F.conv{dim}d``, a tuple of length ``dim`` (default ``(1, 1)``).
    :param padding: as ``F.conv{dim}d``, a tuple of length ``dim`` or ``"same"`` / ``"valid"`` (default ``(0, 0)``).
    :param dilation: as ``F.conv{dim}d``, a tuple of length ``dim`` (default ``(1, 1)``).
    :param groups: as ``F.conv{dim}d`` (default 1).
    """

    dim: int = 2
    stride: tuple[int, ...] = (1, 1)
    padding: tuple[int, ...] | str = (0, 0)
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1

    def __post_init__(self) -> None:
        if self.dim not in _CONVOLUTIONS:
            raise ValueError(f"ConvOp: dim must be 1, 2 or 3, got {self.dim!r}")

    @property
    def name(self) -> str:
        """``"conv1d"``, ``"conv2d"`` or ``"conv3d"``."""
        return f"conv{self.dim}d"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        convolution = _CONVOLUTIONS[self.dim]
        return convolution(x, weight, bias, self.stride, self.padding, self.dilation, self.groups)  # type: ignore[arg-type]

    def squared_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x^2`` elementwise (the variance of a convolution of independent weights is the convolution of ``x^2``
        with ``sigma^2``)."""
        return x * x

    def add_bias(self, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``out`` plus the bias broadcast over the spatial positions."""
        return out + bias.view(-1, *(1,) * self.dim)

    def input_sign_shape(self, x: torch.Tensor) -> torch.Size:
        """One sign per example and input channel, shared across positions: ``(N, C_in, 1, ...)``."""
        # One sign per example and input channel: the perturbation must be shared across positions.
        return x.shape[: -self.dim] + (1,) * self.dim

    def output_sign_shape(self, out: torch.Tensor) -> torch.Size:
        """One sign per example and output channel, shared across positions: ``(N, C_out, 1, ...)``."""
        return out.shape[: -self.dim] + (1,) * self.dim


def Conv2dOp(  # noqa: N802 -- kept under its former class name
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] | str = (0, 0),
    dilation: tuple[int, int] = (1, 1),
    groups: int = 1,
) -> ConvOp:
    """The 2-d :class:`ConvOp` (``ConvOp(2, stride, padding, dilation, groups)``)."""
    return ConvOp(2, stride, padding, dilation, groups)


@dataclass(frozen=True)
class EmbeddingOp:
    """``F.embedding(indices, W)``: row ``W[i]`` for every index ``i``; linear in W (a one-hot row times W).

    :param padding_idx: as ``F.embedding``: that row gets no gradient (``None``: every row does).
    :param scale_grad_by_freq: as ``F.embedding``: scale each row's gradient by the inverse of its count in the batch.
    """

    padding_idx: int | None = None
    scale_grad_by_freq: bool = False
    name: str = "embedding"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = F.embedding(x, weight, self.padding_idx, None, 2.0, self.scale_grad_by_freq, False)
        return out if bias is None else out + bias

    def squared_input(self, x: torch.Tensor) -> torch.Tensor:
        """The indices themselves: the one-hot row of an index is its own square."""
        return x  # the one-hot row of an index is its own square

    def add_bias(self, out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``out + bias``."""
        return out + bias

    def input_sign_shape(self, x: torch.Tensor) -> torch.Size:
        """Raises ``NotImplementedError``: an index has no input features to flip (no flipout)."""
        raise NotImplementedError("an embedding lookup has no input features to flip: flipout is not defined for it")

    def output_sign_shape(self, out: torch.Tensor) -> torch.Size:
        """``out.shape``: one sign per looked-up element."""
        return out.shape
