"""The radial distribution of Farquhar, Osborne and Gal (2020) over a whole tensor.

A draw is

    w = loc + scale * (eps / ||eps||_2) * r,      eps ~ N(0, I_D) over the WHOLE tensor,  r ~ N(0, 1) scalar,

so ``z = (w - loc) / scale`` has a direction uniform on the unit sphere S^{D-1} and a radius ``|r|`` that is
half-normal, whatever D is: samples stay near the mode instead of on the Gaussian's "soap bubble" at radius
~sqrt(D) (the paper's section 2). Its density follows from the change to hyperspherical coordinates (paper
Appendix A; Muleshkov & Nguyen 2016 for the Jacobian ``rho^{D-1}``):

    log q(w) = log 2 - log(2 pi)/2 - rho^2/2 - (D - 1) log rho - log A_{D-1} - sum_i log scale_i,
    rho = ||(w - loc) / scale||,   A_{D-1} = 2 pi^{D/2} / Gamma(D/2) (the area of S^{D-1}),

and its entropy is analytic (Appendix A, eq. 27-37):

    H[q] = sum_i log scale_i + log(2 pi)/2 + 1/2 + (D/2) log pi - lgamma(D/2) - (D - 1)(gamma + log 2)/2,

with gamma the Euler-Mascheroni constant (from ``E[log |r|] = -(gamma + log 2)/2``). For D = 1 this is the entropy
of N(loc, scale^2), as it must be. The constant is kept (not dropped as in the paper), so ELBOs reported with it
are true bounds.

Against any prior p there is no closed-form KL in general; :func:`radial_kl` returns the analytic entropy plus a
Monte Carlo estimate of the cross-entropy ``-E_q[log p(w)]``, AVERAGED over its samples (a published implementation
sums over samples, which scales the KL with the number of samples). It is therefore RANDOM: two calls give different
values around the true KL. ``torch.distributions.kl_divergence(Radial, p)`` (registered here) is that estimate with one
draw from torch's global generator (``torch.manual_seed`` makes it repeatable); ``radial_kl(q, p, samples=S,
generator=g)`` takes more draws and its own ``torch.Generator``, so a fixed seed gives the same value. Against a
Gaussian prior :func:`radial_normal_cross_entropy` gives the cross-entropy in closed form (``E[(w_i - loc_i)^2] =
scale_i^2 / D``), the oracle the Monte Carlo estimate is tested against.

Batches: ``Radial(loc, scale)`` makes the whole of ``loc`` one event (``batch_shape == ()``); :meth:`Radial.expand`
adds batch dimensions in front (independent radial distributions with the same parameters), as torch distributions do.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints, register_kl
from torch.distributions.utils import _sum_rightmost
from torch.types import _size

from varbnn._checks import as_positive_int

__all__ = ["Radial", "radial_entropy_constant", "radial_kl", "radial_normal_cross_entropy", "chi_log_density"]


def chi_log_density(x: Tensor, dof: int) -> Tensor:
    """log density of the chi distribution with ``dof`` degrees of freedom (the norm of a ``dof``-dimensional standard
    normal): ``(1 - k/2) log 2 - lgamma(k/2) + (k - 1) log x - x^2 / 2``. A mean-field Gaussian draw lies at a
    chi-distributed distance from its mode (the "soap bubble"); a radial draw at a half-normal one."""
    k = float(dof)
    return (1 - k / 2) * math.log(2) - math.lgamma(k / 2) + (k - 1) * x.log() - x.square() / 2

_EULER_GAMMA = 0.5772156649015329
_LOG_2PI = math.log(2 * math.pi)


def radial_entropy_constant(dim: int) -> float:
    """The part of the radial entropy that does not depend on the parameters, for a tensor of ``dim`` elements:
    ``log(2 pi)/2 + 1/2 + (D/2) log pi - lgamma(D/2) - (D - 1)(gamma + log 2)/2`` (computed in float64)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive integer, got {dim!r}")
    return (
        0.5 * _LOG_2PI
        + 0.5
        + 0.5 * dim * math.log(math.pi)
        - math.lgamma(0.5 * dim)
        - 0.5 * (dim - 1) * (_EULER_GAMMA + math.log(2.0))
    )


def _log_normaliser(dim: int) -> float:
    # log 2 - log(2 pi)/2 - log A_{D-1}: the parts of log q that depend on D only.
    log_area = math.log(2.0) + 0.5 * dim * math.log(math.pi) - math.lgamma(0.5 * dim)
    return math.log(2.0) - 0.5 * _LOG_2PI - log_area


class Radial(Distribution):
    """Radial distribution over a tensor of ``loc.shape`` (the whole tensor is one event).

    ``event_shape`` is ``loc.shape`` and ``support`` is ``constraints.independent(constraints.real, loc.dim())`` (its
    ``event_dim`` is the event's number of dimensions). :meth:`expand` adds batch dimensions. ``rsample`` is
    reparameterised (and takes an optional ``generator``); ``log_prob`` and ``entropy`` are analytic. ``log_prob`` is
    +inf at ``loc`` itself (the density has an integrable singularity there for D > 1). KL divergences to other
    distributions are Monte Carlo estimates (see :func:`radial_kl`).

    :param loc: the mode (and mean), any shape with at least one element.
    :param scale: per-element scale, broadcastable to ``loc``; must be > 0. Note that the per-element variance is
        ``scale^2 / D`` (D = number of elements): the scale sets the shape of the distribution, the radius
        ``||(w - loc) / scale||`` is half-normal.
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    has_rsample = True

    def __init__(self, loc: Tensor, scale: Tensor | float, validate_args: bool | None = None) -> None:
        loc = torch.as_tensor(loc)
        scale = torch.as_tensor(scale, dtype=loc.dtype, device=loc.device)
        if loc.numel() < 1:
            raise ValueError("Radial: loc must have at least one element")
        try:
            scale = scale.expand(loc.shape)
        except RuntimeError:
            raise ValueError(
                f"Radial: scale of shape {tuple(scale.shape)} does not broadcast to loc's shape {tuple(loc.shape)}"
            ) from None
        self.loc, self.scale = loc, scale
        super().__init__(batch_shape=torch.Size(), event_shape=loc.shape, validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False)
    def support(self) -> constraints.Constraint:
        """Real tensors of the event's shape: ``independent(real, len(event_shape))``."""
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def dim(self) -> int:
        """D, the number of elements of one event (the tensor)."""
        return math.prod(self.event_shape)

    @property
    def mean(self) -> Tensor:
        """``loc`` (the radius ``r`` has mean 0)."""
        return self.loc

    @property
    def mode(self) -> Tensor:
        """``loc`` (where the density is largest: +inf for D > 1)."""
        return self.loc

    @property
    def variance(self) -> Tensor:
        """Per-element variance ``scale^2 / D`` (E[u_i^2] = 1/D on the sphere, E[r^2] = 1)."""
        return self.scale.square() / self.dim

    def expand(self, batch_shape: _size, _instance: Radial | None = None) -> Radial:
        """The same radial distribution with ``batch_shape`` batch dimensions (independent draws; parameters broadcast,
        not copied), as ``torch.distributions.Distribution.expand``."""
        new = self._get_checked_instance(Radial, _instance)
        batch_shape = torch.Size(batch_shape)
        shape = batch_shape + self.event_shape
        try:
            new.loc, new.scale = self.loc.expand(shape), self.scale.expand(shape)
        except RuntimeError:
            raise ValueError(
                f"Radial.expand: batch_shape {tuple(batch_shape)} does not broadcast with the batch shape "
                f"{tuple(self.batch_shape)}"
            ) from None
        super(Radial, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape: _size = torch.Size(), generator: torch.Generator | None = None) -> Tensor:
        """Draws of shape ``sample_shape + batch_shape + event_shape``; ``generator`` (optional) is the random stream."""
        sample_shape = torch.Size(sample_shape)
        eps = torch.randn(sample_shape + self.loc.shape, dtype=self.loc.dtype, device=self.loc.device, generator=generator)
        r = torch.randn(sample_shape + self.batch_shape, dtype=self.loc.dtype, device=self.loc.device, generator=generator)
        return self.loc + self.scale * unit_direction(eps, len(self.event_shape)) * _right_pad(r, len(self.event_shape))

    def radius(self, value: Tensor) -> Tensor:
        """``||(value - loc) / scale||`` over the event dimensions (half-normal under q)."""
        n = len(self.event_shape)
        z = (value - self.loc) / self.scale
        return torch.linalg.vector_norm(z.reshape(*z.shape[: z.dim() - n], -1), dim=-1)

    def log_prob(self, value: Tensor) -> Tensor:
        """``log q(w) = log 2 - log(2 pi)/2 - rho^2/2 - (D - 1) log rho - log A_{D-1} - sum_i log scale_i`` with
        ``rho = ||(w - loc) / scale||`` and ``A_{D-1} = 2 pi^{D/2} / Gamma(D/2)`` (the density of the module docstring;
        Farquhar et al. 2020, Appendix A), summed over the event: one value per draw and batch element."""
        if self._validate_args:
            self._validate_sample(value)
        rho = self.radius(value)
        log_scale = _sum_rightmost(self.scale.log(), len(self.event_shape))
        return _log_normaliser(self.dim) - 0.5 * rho.square() - (self.dim - 1) * rho.log() - log_scale

    def entropy(self) -> Tensor:
        """``H[q] = sum_i log scale_i + radial_entropy_constant(D)`` in nats (Farquhar et al. 2020, eq. 5 and Appendix
        A, eq. 27-37, with the constants kept), one value per batch element."""
        return _sum_rightmost(self.scale.log(), len(self.event_shape)) + radial_entropy_constant(self.dim)

    def __repr__(self) -> str:
        batch = f", batch_shape={tuple(self.batch_shape)}" if self.batch_shape else ""
        return f"Radial(shape={tuple(self.event_shape)}{batch})"


def unit_direction(eps: Tensor, event_dims: int) -> Tensor:
    """``eps / ||eps||`` over the last ``event_dims`` dimensions (a uniform direction on the sphere if eps is
    standard normal)."""
    dims = tuple(range(eps.dim() - event_dims, eps.dim()))
    return eps / torch.linalg.vector_norm(eps, dim=dims, keepdim=True).clamp_min(torch.finfo(eps.dtype).tiny)


def _right_pad(t: Tensor, n: int) -> Tensor:
    return t.reshape(t.shape + (1,) * n)


def radial_normal_cross_entropy(loc: Tensor, scale: Tensor, prior_loc: Tensor, prior_scale: Tensor) -> Tensor:
    """Closed form of ``-E_q[log N(w | prior_loc, prior_scale^2)]`` summed over the tensor for q = Radial(loc, scale):
    ``sum_i [log s_i + log(2 pi)/2 + ((loc_i - m_i)^2 + scale_i^2 / D) / (2 s_i^2)]``."""
    dim = loc.numel()
    prior_loc, prior_scale = torch.broadcast_tensors(prior_loc, prior_scale)
    second = (loc - prior_loc).square() + scale.square() / dim
    log_s = prior_scale.log().expand(loc.shape) if prior_scale.dim() == 0 else prior_scale.log()
    return (log_s + 0.5 * _LOG_2PI).sum() + (second / (2 * prior_scale.square())).sum()


def radial_kl(q: Radial, p: Distribution, samples: int = 1, generator: torch.Generator | None = None) -> Tensor:
    """A Monte Carlo estimate of KL(q || p) = -H[q] (analytic) - mean over ``samples`` draws w_s ~ q of log p(w_s).

    Unbiased, with a standard error that shrinks as ``1 / sqrt(samples)``, and random: each call draws afresh.
    ``generator`` (a ``torch.Generator`` on q's device) makes it repeatable: the same seed gives the same value; without
    it the draws come from torch's global generator. Reparameterised, so it is differentiable in q's parameters.

    :param q: the radial posterior.
    :param p: any distribution with q's event shape and a ``log_prob``.
    :param samples: number of draws, an int >= 1 (default 1, as the paper's training loss).
    :param generator: optional random stream of the draws.
    """
    samples = as_positive_int(samples, "samples", owner="radial_kl")
    if p.event_shape != q.event_shape:
        raise ValueError(f"prior event shape {tuple(p.event_shape)} differs from the posterior's {tuple(q.event_shape)}")
    w = q.rsample(torch.Size([samples]), generator=generator)
    return -q.entropy() - p.log_prob(w).mean(0)


@register_kl(Radial, Distribution)
def _kl_radial_any(q: Radial, p: Distribution) -> Tensor:
    """``torch.distributions.kl_divergence(Radial, p)``: :func:`radial_kl` with ONE draw from torch's global generator, a
    random estimate (seed torch, or call :func:`radial_kl` with ``samples`` and a ``generator``, for a fixed value)."""
    return radial_kl(q, p)
