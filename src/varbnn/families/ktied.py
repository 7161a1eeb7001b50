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

from varbnn._checks import as_float_in, as_positive_int
from varbnn._fast.softplus import ScaleStats, fused_sample, softplus_sample, stats_per_step
from varbnn.families.base import register_family
from varbnn.families.meanfield import INIT_STD_RANGE, MeanField

__all__ = ["KTied"]


def _times_v(grad: torch.Tensor, v: torch.Tensor, base: torch.Tensor | None = None, alpha: float = 1.0) -> torch.Tensor:
    """``base + alpha grad @ v`` (``base`` None: 0) for a (m, n) ``grad`` and a thin (n, k) ``v``, with ``v`` handed to
    the GEMM column-major: the BLAS then takes row dot products, where ``grad @ v`` as it is runs a slow path for thin
    outputs on the CPU (the step's effect: ``benchmarks/results/step-time/studies/ab_ktied_eager_gemms.md``)."""
    v_columns = v.T.contiguous().T
    if base is None:
        return torch.mm(grad, v_columns).mul_(alpha) if alpha != 1.0 else torch.mm(grad, v_columns)
    return torch.addmm(base, grad, v_columns, alpha=alpha)


def _u_times(u: torch.Tensor, grad: torch.Tensor, base: torch.Tensor | None = None, alpha: float = 1.0) -> torch.Tensor:
    """``base + alpha grad.T @ u`` for a thin (m, k) ``u``, computed transposed as ``u.T @ grad`` (the BLAS's fast
    layout for a thin output on the CPU, as :func:`_times_v`)."""
    if base is None:
        out = torch.mm(u.T, grad)
        return (out.mul_(alpha) if alpha != 1.0 else out).T
    return torch.addmm(base.T, u.T, grad, alpha=alpha).T


class _OuterProduct(torch.autograd.Function):
    """``u @ v.T`` whose backward takes the fast layouts of :func:`_times_v` and :func:`_u_times` (autograd's mm
    backward runs ``G @ v`` and ``G^T @ u`` as they are): the compiled step's k-tied sigma."""

    @staticmethod
    def forward(ctx, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(u, v)
        return u @ v.T

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        u, v = ctx.saved_tensors
        return _times_v(grad, v), _u_times(u, grad)


def _outer(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``u @ v.T``; while torch.compile traces, through :class:`_OuterProduct` (elsewhere the plain product: outside
    training steps nothing differentiates it, and torch.func transforms need plain operations)."""
    return _OuterProduct.apply(u, v) if torch.compiler.is_compiling() else u @ v.T


class _ExpOuterStats(torch.autograd.Function):
    """The k-tied stds ``sigma = exp(log_u) @ exp(log_v).T`` (returned in the weight's shape), optionally ``sigma^2``,
    and the KL's statistics ``sum(log sigma)`` and ``sum(sigma^2) = sum((U^T U) * (V^T V))`` (from k x k matrices) as
    outputs of one node. With ``G = g_sigma + 2 sigma g_square + g_sumlog / sigma`` (one or two passes over the
    matrix) the backward is

        dL/dlog_u = ((G V) + 2 g_sumsq U (V^T V)) * U,    dL/dlog_v = ((G^T U) + 2 g_sumsq V (U^T U)) * V.

    It can run more than once (the leaf parameters and a detached sigma are kept on ``ctx``, not as saved tensors
    that autograd frees), so that the step's outputs can feed graphs differentiated apart."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, log_u: torch.Tensor, log_v: torch.Tensor, with_square: bool, shape: torch.Size
    ) -> ScaleStats:
        u, v = log_u.exp(), log_v.exp()
        sigma = u @ v.T
        gram_u, gram_v = u.T @ u, v.T @ v  # k x k, kept for the backward's sum(sigma^2) term
        sum_sq = (gram_u * gram_v).sum()
        ctx.log_u, ctx.log_v, ctx.sigma, ctx.grams = log_u, log_v, sigma.detach(), (gram_u, gram_v)  # no graph in forward
        ctx.set_materialize_grads(False)
        square = (sigma * sigma).reshape(shape) if with_square else None
        return sigma.reshape(shape), square, torch.log(sigma).sum(), sum_sq

    @staticmethod
    def backward(  # type: ignore[override]
        ctx, g_sigma: torch.Tensor | None, g_square: torch.Tensor | None, g_log: torch.Tensor | None, g_sq: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        sigma = ctx.sigma
        u, v = ctx.log_u.detach().exp(), ctx.log_v.detach().exp()
        grad: torch.Tensor | None = None  # G / factor
        factor = 1.0
        if g_square is not None:
            grad, factor = g_square.reshape(sigma.shape) * sigma, 2.0
        if g_log is not None:
            g = g_log / factor
            grad = torch.div(g, sigma) if grad is None else grad.addcdiv_(g.expand_as(sigma), sigma)
        if g_sigma is not None:
            g_matrix = g_sigma.reshape(sigma.shape)
            grad = g_matrix if grad is None else grad.add_(g_matrix, alpha=1.0 / factor)  # only read from here on
        g_u = g_v = None
        if g_sq is not None:  # 2 g_sumsq U (V^T V), 2 g_sumsq V (U^T U): the k x k grams scaled first, then one product
            gram_u, gram_v = ctx.grams
            g_u, g_v = u @ (gram_v * (2 * g_sq)), v @ (gram_u * (2 * g_sq))
        if grad is not None:  # + factor G V, + factor G^T U, added by the same GEMM (addmm)
            g_u, g_v = _times_v(grad, v, g_u, alpha=factor), _u_times(u, grad, g_v, alpha=factor)
        return (g_u * u if g_u is not None else None), (g_v * v if g_v is not None else None), None, None


class _ExpOuterSample(_ExpOuterStats):
    """``w = loc + sigma * eps`` with ``sigma = exp(log_u) @ exp(log_v).T`` and :class:`_ExpOuterStats`'s statistics,
    one node: the draw's gradient ``g_w eps`` joins sigma's in the same backward (``d/d loc = g_w``)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, loc: torch.Tensor, log_u: torch.Tensor, log_v: torch.Tensor, eps: torch.Tensor, shape: torch.Size
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        sigma, _, sum_log, sum_sq = _ExpOuterStats.forward(ctx, log_u, log_v, False, shape)
        ctx.save_for_backward(eps)  # as the cached draw does (activation checkpointing compares the two)
        return torch.addcmul(loc, sigma, eps), sigma, sum_log, sum_sq

    @staticmethod
    def backward(  # type: ignore[override]
        ctx, g_w: torch.Tensor | None, g_sigma: torch.Tensor | None, g_log: torch.Tensor | None, g_sq: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None, None]:
        if g_w is not None:  # eps only when the draw has a gradient: the KL's part may run again without it
            (eps,) = ctx.saved_tensors
            g_sigma = g_w * eps if g_sigma is None else torch.addcmul(g_sigma, g_w, eps)
        g_u, g_v, _, _ = _ExpOuterStats.backward(ctx, g_sigma, None, g_log, g_sq)
        return g_w, g_u, g_v, None, None


@register_family("ktied")
class KTied(MeanField):
    """k-tied Normal posterior (Swiatkowski et al. 2020, eq. 7-8): ``q(W) = N(mu, diag(vec((U V^T)^2)))``, i.e.
    a mean-field Gaussian whose (m, n) matrix of standard deviations is ``sigma = U V^T`` with elementwise
    positive ``U = exp(log_u)`` (m x k) and ``V = exp(log_v)`` (n x k): ``k (m + n)`` variance parameters instead of
    ``m n``.

    Everything else is :class:`MeanField`'s: the closed-form KL against a Normal prior (Graves 2011 eq. 13 with
    ``sigma_ij = (U V^T)_ij``; its ``sum sigma_ij^2`` is computed from k x k matrices as
    ``sum((U^T U) * (V^T V))``), the estimators and the moments. Tensors with fewer than two dimensions (biases) and
    tensors with ``k >= min(m, n)`` (no saving) get a per-element ``softplus(rho)`` std (see :attr:`tied`).

    :param rank: k, an int >= 1 (any integer type, e.g. ``np.int64``), the rank of the standard-deviation matrix (default 2:
        the paper's recommendation).
    :param init_std: the mean of the initial standard deviations (default 1e-2, as :class:`MeanField`), a number in
        ``[1e-8, 1e2]`` (:data:`~varbnn.families.meanfield.INIT_STD_RANGE`), paper section 3.1. U and V start at
        ``sqrt(init_std / k)`` times independent log-normal jitter (``exp(0.1 * N(0, 1))``, which breaks the
        symmetry between the k columns; without it they would get identical gradients and stay a rank-1 matrix),
        rescaled so that the mean of U V^T is ``init_std``.
    :param estimator: ``"reparam"``, ``"local"``, ``"flipout"`` or ``"graves"``, as for :class:`MeanField`.
    """

    default_kl_weight = 0.03  # benchmarks/results/defaults

    # its own sigma (U V^T, or softplus(rho) untied) keeps MeanField's fast paths: declared for its overrides
    softplus_group = True  # the untied tensors only (_softplus_group_eligible)
    has_fused_sample = True
    has_plain_scale = True

    log_u: nn.Parameter
    log_v: nn.Parameter

    def __init__(self, rank: int = 2, init_std: float = 1e-2, estimator: str = "reparam") -> None:
        rank = as_positive_int(rank, "rank", owner="KTied")
        init_std = as_float_in(init_std, "init_std", *INIT_STD_RANGE, owner="KTied")
        super().__init__(init_std=init_std, estimator=estimator)
        self._hyperparameters = {"rank": rank, "init_std": init_std, "estimator": estimator}
        self.rank = rank

    @staticmethod
    def matrix_shape(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
        """(m, n): the matrix a weight tensor is tied as: (shape[0], prod(shape[1:]))."""
        return int(shape[0]), int(math.prod(shape[1:]))

    @property
    def share_sigma_in_trace(self) -> bool:
        """A compiled step computes a tied sigma (a GEMM) once for the forward pass and the KL (see
        :func:`~varbnn._fast.softplus.share_sigmas_in_trace`)."""
        return self.tied

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

    def _scale_stats(self, with_square: bool = False) -> ScaleStats:
        """U V^T reshaped to the weight's shape (or softplus(rho) if untied) with its statistics, from one node per
        training step (:func:`~varbnn._fast.softplus.stats_per_step`)."""
        if not self.tied:
            return super()._scale_stats(with_square)
        shape = self._require_built()
        log_u, log_v = self.log_u, self.log_v

        def plain(square: bool) -> ScaleStats:
            u, v = self.u, self.v
            sigma = _outer(u, v).reshape(shape)
            return sigma, sigma.square() if square else None, torch.log(sigma).sum(), ((u.T @ u) * (v.T @ v)).sum()

        return stats_per_step(
            self, (log_u, log_v), lambda square: _ExpOuterStats.apply(log_u, log_v, square, shape), plain, with_square
        )

    # ``scale`` (MeanField's property): U V^T reshaped to the weight's shape (or softplus(rho) if untied), from the
    # step's statistics node within a training step, sigma alone outside one. Not overridden here: torch.compile cannot
    # trace a property reached through super().

    def _scale_sources(self) -> tuple[torch.Tensor, ...]:
        return (self.log_u, self.log_v) if self.tied else (self.rho,)

    def _plain_scale(self) -> torch.Tensor:
        if not self.tied:
            return super()._plain_scale()
        return _outer(self.u, self.v).reshape(self._require_built())

    def _softplus_group_eligible(self) -> bool:
        """An untied tensor (sigma = softplus(rho): biases, and ranks at least the matrix's smaller side) joins its
        model's :class:`~varbnn._fast.softplus.SoftplusGroup` as a MeanField tensor does; a tied one keeps its own
        node (U V^T)."""
        return not self.tied and super()._softplus_group_eligible()

    def _fused_sample(self) -> torch.Tensor | None:
        if not self.has_fused_sample:
            return None  # a subclass with its own sigma draws from it
        if not self.tied:
            return softplus_sample(self)
        loc, log_u, log_v, shape = self.loc, self.log_u, self.log_v, self._require_built()
        return fused_sample(self, (log_u, log_v), lambda eps: _ExpOuterSample.apply(loc, log_u, log_v, eps, shape))

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.tied or not self.is_built else ", untied (per-element std)")
