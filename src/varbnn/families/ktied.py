"""The k-tied Normal family (Swiatkowski et al. 2020): a mean-field Gaussian whose standard-deviation matrix
has rank k.

    q(W) = N(mu, diag(vec((U V^T)^2))),   U in R^{m x k}, V in R^{n x k}, elementwise positive

W is viewed as the matrix (out, rest): a Linear weight as it is, a Conv2d kernel as (out, in * kh * kw), an LSTM
kernel or recurrent kernel as (4 * hidden, in). Positivity: ``U = exp(log_u)``, ``V = exp(log_v)`` (the paper
optimises the std parameters "in their log forms"). Tensors with fewer than two dimensions (biases) and tensors
where k >= min(m, n) (no saving) get an ordinary per-element std, ``softplus(rho)`` as in :class:`MeanField`.

Everything else is the Normal machinery of :class:`MeanField`: the fused closed-form KL against a Normal prior,
local reparameterization and flipout, ``moments``; only ``scale`` is computed differently. The variational
parameter count is m*n + k*(m + n) per tied tensor.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from varbnn.families.base import register_family
from varbnn.families.gaussian import MeanField, cached_per_step

__all__ = ["KTied"]


class _SharedExpOuter(torch.autograd.Function):
    """``exp(log_u) @ exp(log_v).T`` whose backward can run more than once (the leaf parameters are kept on ``ctx``, not
    saved tensors that autograd frees), so that the per-step cached std matrix can feed graphs differentiated apart.
    Backward: ``dL/dlog_u = (G V) * U``, ``dL/dlog_v = (G^T U) * V``."""

    @staticmethod
    def forward(ctx, log_u: torch.Tensor, log_v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.log_u, ctx.log_v = log_u, log_v
        return log_u.exp() @ log_v.exp().T

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        u, v = ctx.log_u.detach().exp(), ctx.log_v.detach().exp()
        return (grad @ v) * u, (grad.T @ u) * v


@register_family("ktied")
class KTied(MeanField):
    """k-tied Normal posterior.

    Args:
        rank: k >= 1, the rank of the standard-deviation matrix (default 2: the paper's recommendation).
        init_std: the mean of the initial standard deviations (default 1e-2, as :class:`MeanField`), paper
            section 3.1. U and V start at ``sqrt(init_std / k)`` times independent log-normal jitter
            (``exp(0.1 * N(0, 1))``, which breaks the symmetry between the k columns; without it they would get
            identical gradients and stay a rank-1 matrix), rescaled so that the mean of U V^T is ``init_std``.
        estimator: ``"reparam"``, ``"local"`` or ``"flipout"``, as for :class:`MeanField`.
    """

    log_u: nn.Parameter
    log_v: nn.Parameter

    def __init__(self, rank: int = 2, init_std: float = 1e-2, estimator: str = "reparam") -> None:
        if not (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 1):
            raise ValueError(f"KTied: rank must be an int >= 1, got {rank!r}")
        super().__init__(init_std=init_std, estimator=estimator)
        self._hyperparameters = {"rank": rank, "init_std": float(init_std), "estimator": estimator}
        self.rank = rank

    @staticmethod
    def matrix_shape(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
        """(m, n): the matrix a weight tensor is tied as: (shape[0], prod(shape[1:]))."""
        return int(shape[0]), int(math.prod(shape[1:]))

    @property
    def tied(self) -> bool:
        """True when the stds are U V^T (False for biases, rank >= min(m, n), and unbuilt specs)."""
        return "log_u" in self._parameters

    def _materialize(self, shape: torch.Size, init: torch.Tensor) -> None:
        m, n = self.matrix_shape(shape) if len(shape) >= 2 else (0, 0)
        if len(shape) < 2 or self.rank >= min(m, n):
            super()._materialize(shape, init)  # per-element softplus(rho), as MeanField
            return
        self.loc = nn.Parameter(init)
        k = self.rank
        base = math.sqrt(self.init_std / k)
        u = base * torch.exp(0.1 * torch.randn(m, k, dtype=torch.float64))
        v = base * torch.exp(0.1 * torch.randn(n, k, dtype=torch.float64))
        u = u * (self.init_std / (u @ v.T).mean())  # the mean std is exactly init_std
        self.log_u = nn.Parameter(u.log().to(init.dtype))
        self.log_v = nn.Parameter(v.log().to(init.dtype))

    @property
    def u(self) -> torch.Tensor:
        """U = exp(log_u), shape (m, k)."""
        return self.log_u.exp()

    @property
    def v(self) -> torch.Tensor:
        """V = exp(log_v), shape (n, k)."""
        return self.log_v.exp()

    def _softplus_scale(self) -> bool:
        return not self.tied

    @property
    def scale(self) -> torch.Tensor:
        """Posterior standard deviations: U V^T reshaped to the weight's shape (or softplus(rho) if untied), computed once
        per training step and shared by the forward pass and the KL."""
        if not self.tied:
            return super().scale
        shape = self._require_built()
        log_u, log_v = self.log_u, self.log_v
        return cached_per_step(
            self,
            (log_u, log_v),
            lambda: _SharedExpOuter.apply(log_u, log_v).reshape(shape),
            lambda: (self.u @ self.v.T).reshape(shape),
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.tied or not self.is_built else ", untied (per-element std)")
