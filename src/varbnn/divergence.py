"""KL divergences: one registry of closed forms, a Monte Carlo fallback, and the model-level sum (``kl(model)``, whose
walk over the layers is :mod:`varbnn.nn.model`'s, imported on first use).

The convention used everywhere in varbnn, stated once:

    loss = mean NLL over the batch + beta * KL_total / N_train          (Graves 2011, eq. 18)

This is Graves' online loss ``L(b_j) = L^C / B + L^E(b_j)`` for a dataset split into B batches (eq. 18) divided by
the batch size ``N_train / B``. ``KL_total`` is a SUM over every weight of every Bayesian tensor of the model (never a
mean), and ``N_train`` is the number of training examples (never the batch size). With this scaling the loss is the
negative ELBO divided by ``N_train``, so it is unchanged by the batch size and stays right under
DistributedDataParallel, where gradients are averaged over ranks. See :func:`varbnn.elbo_loss`.

Closed forms are registered with :func:`torch.distributions.kl.register_kl`, so they are dispatched by
type exactly like torch's own (``Independent``-wrapped elementwise pairs sum over the tensor). Pairs with no
closed form fall back to a Monte Carlo estimate ``mean_s [log q(w_s) - log p(w_s)]`` with reparameterised
samples ``w_s ~ q``, averaged (not summed) over the samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.distributions import Distribution, Gamma, InverseGamma, Laplace, LogNormal, Normal, register_kl
from torch.distributions import kl_divergence as _torch_kl

from varbnn._transforms import functorch_active as _functorch_active
from varbnn.distributions import Delta, ImproperUniform, Radial
from varbnn.priors import Normal as NormalPrior

__all__ = [
    "kl",
    "kl_divergence",
    "monte_carlo_kl",
    "register_family_kl",
    "family_kl",
    "family_kl_parts",
    "NormalKLParts",
    "normal_kl_sum",
    "lognormal_gamma_kl",
    "lognormal_inverse_gamma_kl",
    "half_cauchy_pair_kl",
    "scalar_normal_nll",
    "scalar_normal_nll_applies",
    "DEFAULT_KL_SAMPLES",
]

DEFAULT_KL_SAMPLES = 1
"""Monte Carlo samples for KLs without a closed form (one per step is the usual unbiased estimator)."""


@register_kl(Delta, Distribution)
def _kl_delta_any(q: Delta, p: Distribution) -> torch.Tensor:
    # Graves 2011 section 5.1: L^C = -log p(w) + C, with the discretisation constant C dropped.
    return -p.log_prob(q.value)


@register_kl(Delta, ImproperUniform)
def _kl_delta_uniform(q: Delta, p: ImproperUniform) -> torch.Tensor:
    return torch.zeros((), dtype=q.value.dtype, device=q.value.device)


@register_kl(Distribution, ImproperUniform)
def _kl_any_uniform(q: Distribution, p: ImproperUniform) -> torch.Tensor:
    # Up to an infinite constant that carries no gradient.
    return -q.entropy()


@register_kl(Radial, ImproperUniform)
def _kl_radial_uniform(q: Radial, p: ImproperUniform) -> torch.Tensor:
    return -q.entropy()


class _ScalarNormalNLL(torch.autograd.Function):
    """-log N(w | m, s^2) summed over ``w`` for scalar (m, s) that are not learned by gradient:
    ``(|w - m|^2 / s^2 + n log(2 pi s^2)) / 2``, with the gradient ``(w - m) / s^2`` in one pass (instead of the ~8
    elementwise passes of the generic path). No host synchronisation: m and s stay tensors."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        diff = (value - loc).reshape(-1)
        inv_var = scale.reciprocal().square()
        ctx.save_for_backward(diff, inv_var)
        ctx.shape = value.shape
        log_norm = value.numel() * (scale.log() + 0.5 * math.log(2 * math.pi))
        return 0.5 * inv_var * torch.dot(diff, diff) + log_norm

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:  # type: ignore[override]
        diff, inv_var = ctx.saved_tensors
        return (diff * (grad * inv_var)).view(ctx.shape), None, None


def scalar_normal_nll_applies(prior: Any) -> bool:
    """Whether :func:`scalar_normal_nll` can stand in for ``prior``'s log-density: a Normal prior whose loc and scale are
    scalars that are not learned by gradient (adaptive priors are set in closed form, which is fine)."""
    if not isinstance(prior, NormalPrior):
        return False
    loc, scale = prior.loc, prior.scale
    return loc.dim() == 0 and scale.dim() == 0 and not (loc.requires_grad or scale.requires_grad)


def scalar_normal_nll(value: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``-sum log N(value | loc, scale^2)`` for 0-d ``loc`` and ``scale`` without gradients, with a one-pass backward
    (plain operations under a torch.func transform, for which the Function is not ready)."""
    if _functorch_active():
        return 0.5 * ((value - loc) / scale).square().sum() + value.numel() * (scale.log() + 0.5 * math.log(2 * math.pi))
    return _ScalarNormalNLL.apply(value, loc, scale)


class _HalfCauchyPairKL(torch.autograd.Function):
    """Sum over rows of KL(LN(m_a, s_a^2) || Gamma(1/2, rate)) + KL(LN(m_b, s_b^2) || InvGamma(1/2, scale 1)) for pairs
    ``[..., 2]`` = (a, b): the two log-normal halves of a squared half-Cauchy variable (:func:`lognormal_gamma_kl` and
    :func:`lognormal_inverse_gamma_kl` summed), with the closed-form gradient

        d/dm_a = rate e_a - 1/2,  d/dm_b = 1/2 - e_b,  d/ds_a = rate e_a s_a - 1/s_a,  d/ds_b = e_b s_b - 1/s_b,

    ``e_a = exp(m_a + s_a^2/2)``, ``e_b = exp(-m_b + s_b^2/2)``."""

    @staticmethod
    def forward(ctx, loc: torch.Tensor, sigma: torch.Tensor, rate: float) -> torch.Tensor:  # type: ignore[override]
        half_var = 0.5 * sigma.square()
        e_a = torch.exp(loc[..., 0] + half_var[..., 0])
        e_b = torch.exp(half_var[..., 1] - loc[..., 1])
        rows = e_a.numel()
        constant = rows * (-0.5 * math.log(rate) + 2 * math.lgamma(0.5) - (_LOG_2PI + 1))
        means = loc.reshape(-1, 2).sum(0)  # (sum m_a, sum m_b)
        ctx.save_for_backward(sigma, e_a, e_b)
        ctx.rate = rate
        return constant - 0.5 * (means[0] - means[1]) + rate * e_a.sum() + e_b.sum() - sigma.log().sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        sigma, e_a, e_b = ctx.saved_tensors
        rate = ctx.rate
        grad_loc = torch.stack([rate * e_a - 0.5, 0.5 - e_b], dim=-1) * grad
        grad_sigma = (torch.stack([rate * e_a, e_b], dim=-1) * sigma - sigma.reciprocal()) * grad
        return grad_loc, grad_sigma, None


def half_cauchy_pair_kl(loc: torch.Tensor, sigma: torch.Tensor, rate: float) -> torch.Tensor:
    """``sum[lognormal_gamma_kl(loc[..., 0], sigma[..., 0], 1/2, rate) + lognormal_inverse_gamma_kl(loc[..., 1],
    sigma[..., 1], 1/2, 1)]`` in a few operations with a closed-form backward (``rate`` a positive number)."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"half_cauchy_pair_kl: rate must be a finite number > 0, got {rate!r}")
    if loc.shape != sigma.shape or loc.shape[-1:] != (2,):
        raise ValueError(
            f"half_cauchy_pair_kl: loc and sigma must have the same shape [..., 2], got {tuple(loc.shape)}, {tuple(sigma.shape)}"
        )
    if _functorch_active():  # the Function is not transform-ready: the two closed forms, differentiated by autograd
        return (
            lognormal_gamma_kl(loc[..., 0], sigma[..., 0], 0.5, float(rate))
            + lognormal_inverse_gamma_kl(loc[..., 1], sigma[..., 1], 0.5, 1.0)
        ).sum()
    return _HalfCauchyPairKL.apply(loc, sigma, float(rate))


def lognormal_gamma_kl(m: torch.Tensor, s: torch.Tensor, shape: float | torch.Tensor, rate: float | torch.Tensor) -> torch.Tensor:
    """KL(LN(m, s^2) || Gamma(shape a, rate b)) = -a log b + lgamma(a) - a m + b exp(m + s^2/2) - (log(2 pi s^2) + 1)/2
    (Louizos et al. 2017; from E[log x] = m, E[x] = exp(m + s^2/2) and H = m + log(2 pi e s^2)/2), elementwise."""
    return _lognormal_kl(m, s, shape, rate, sign=1.0)


def lognormal_inverse_gamma_kl(
    m: torch.Tensor, s: torch.Tensor, shape: float | torch.Tensor, scale: float | torch.Tensor
) -> torch.Tensor:
    """KL(LN(m, s^2) || InvGamma(shape a, scale b)) = -a log b + lgamma(a) + a m + b exp(-m + s^2/2) - (log(2 pi s^2) + 1)/2
    (E[1/x] = exp(-m + s^2/2)), elementwise."""
    return _lognormal_kl(m, s, shape, scale, sign=-1.0)


def _lognormal_kl(
    m: torch.Tensor, s: torch.Tensor, a: float | torch.Tensor, b: float | torch.Tensor, sign: float
) -> torch.Tensor:
    """``-a log b + lgamma(a) - sign a m + b exp(sign m + s^2/2) - (log(2 pi s^2) + 1)/2``; Python-number prior
    parameters stay Python numbers (no tensors made, no host-to-device copies on a GPU)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a_t, b_t = torch.as_tensor(a, dtype=m.dtype, device=m.device), torch.as_tensor(b, dtype=m.dtype, device=m.device)
        constant: float | torch.Tensor = -a_t * b_t.log() + torch.lgamma(a_t)
        a, b = a_t, b_t
    else:
        constant = -float(a) * math.log(float(b)) + math.lgamma(float(a))
    return constant - 0.5 * (_LOG_2PI + 1) - sign * a * m + b * torch.exp(sign * m + 0.5 * s.square()) - s.log()


_LOG_2PI = math.log(2 * math.pi)


@register_kl(LogNormal, Gamma)
def _kl_lognormal_gamma(q: LogNormal, p: Gamma) -> torch.Tensor:
    return lognormal_gamma_kl(q.loc, q.scale, p.concentration, p.rate)


@register_kl(LogNormal, InverseGamma)
def _kl_lognormal_inverse_gamma(q: LogNormal, p: InverseGamma) -> torch.Tensor:
    return lognormal_inverse_gamma_kl(q.loc, q.scale, p.concentration, p.rate)  # torch's InverseGamma.rate is the scale


@register_kl(Normal, Laplace)
def _kl_normal_laplace(q: Normal, p: Laplace) -> torch.Tensor:
    # E_q|w - m| for w ~ N(mu, s^2), d = mu - m: s sqrt(2/pi) exp(-d^2 / 2s^2) + d erf(d / (s sqrt 2)).
    d = q.loc - p.loc
    s = q.scale
    abs_moment = s * math.sqrt(2 / math.pi) * torch.exp(-0.5 * (d / s) ** 2) + d * torch.erf(d / (s * math.sqrt(2)))
    return -q.entropy() + torch.log(2 * p.scale) + abs_moment / p.scale


FamilyKL = Callable[[Any, Any], torch.Tensor]
_FAMILY_KL: dict[tuple[type, type], FamilyKL] = {}


class NormalKLParts(NamedTuple):
    """One tensor's KL in the Gaussian form that :func:`kl` evaluates for many tensors at once:

        KL = n log s - sum_log_sigma + (var_scale sum_sq_sigma + |loc - m|^2) / (2 s^2) - n / 2 + constant

    with ``n = loc.numel()``, a 0-d prior mean ``m`` and scale ``s`` that take no gradient, and the sigma statistics
    ``sum(log sigma)``, ``sum(sigma^2)`` (0-d tensors, or both ``None`` for a point posterior, e.g. the Delta family's
    ``-log N(w | m, s^2)`` with ``constant = n (1 + log 2 pi) / 2``)."""

    loc: torch.Tensor
    sum_log_sigma: torch.Tensor | None
    sum_sq_sigma: torch.Tensor | None
    prior_loc: torch.Tensor
    prior_scale: torch.Tensor
    var_scale: float = 1.0
    constant: float = 0.0


KLParts = Callable[[Any, Any], "NormalKLParts | None"]
_FAMILY_KL_PARTS: dict[tuple[type, type], KLParts] = {}


def register_family_kl(family_type: type, prior_type: type, parts: KLParts | None = None) -> Callable[[FamilyKL], FamilyKL]:
    """Decorator: register a fused closed form ``fn(family, prior) -> KL`` (a 0-d tensor, the KL summed over the
    tensor, in nats) for a (family type, prior type) pair; :func:`family_kl` finds it along both classes' MROs.

    These work on a family's own parameters (e.g. ``rho`` rather than ``softplus(rho)``) and avoid building
    distribution objects; they must equal the distribution-level registry exactly (the tests check this).

    ``parts(family, prior)``, optional, returns the same KL as :class:`NormalKLParts` (or ``None`` where that form does
    not apply, e.g. a pruned tensor): :func:`kl` of a model then evaluates all such tensors in one autograd node
    instead of a handful of operations per tensor.
    """

    def decorator(fn: FamilyKL) -> FamilyKL:
        _FAMILY_KL[(family_type, prior_type)] = fn
        if parts is None:
            _FAMILY_KL_PARTS.pop((family_type, prior_type), None)
        else:
            _FAMILY_KL_PARTS[(family_type, prior_type)] = parts
        return fn

    return decorator


def _registered(family: Any, prior: Any) -> tuple[type, type] | None:
    for family_type in type(family).__mro__:
        for prior_type in type(prior).__mro__:
            if (family_type, prior_type) in _FAMILY_KL:
                return family_type, prior_type
    return None


def family_kl(family: Any, prior: Any) -> torch.Tensor:
    """KL(q || p) for a built family and a prior: a fused family-level closed form if one is registered for
    the pair (looked up along both MROs), else the distribution-level :func:`kl_divergence`."""
    pair = _registered(family, prior)
    if pair is not None:
        return _FAMILY_KL[pair](family, prior)
    return kl_divergence(family.distribution(), prior.distribution(family.shape))


def family_kl_parts(family: Any, prior: Any) -> NormalKLParts | None:
    """The :class:`NormalKLParts` of KL(q || p) for a built family and a prior, from the ``parts`` function registered
    with the pair's closed form (the same MRO lookup as :func:`family_kl`); ``None`` if there is none or it does not
    apply (among others: a prior mean or scale that is not a 0-d tensor of the posterior's dtype and device without
    gradient)."""
    pair = _registered(family, prior)
    fn = _FAMILY_KL_PARTS.get(pair) if pair is not None else None
    parts = fn(family, prior) if fn is not None else None
    if parts is None:
        return None
    loc = parts.loc
    for value in (parts.prior_loc, parts.prior_scale):
        if value.dim() != 0 or value.requires_grad or value.dtype != loc.dtype or value.device != loc.device:
            return None
    return parts


def monte_carlo_kl(q: Distribution, p: Distribution, samples: int = DEFAULT_KL_SAMPLES) -> torch.Tensor:
    """Unbiased Monte Carlo estimate of KL(q || p): ``mean_s [log q(w_s) - log p(w_s)]`` over ``samples`` draws
    ``w_s ~ q`` (reparameterised when q has ``rsample``, so it is differentiable in q's parameters), averaged over the
    draws, not summed (Graves 2011 eq. 9 applied to the KL; Blundell et al. 2015). Returns one value per batch
    element of q (a 0-d tensor for a whole-tensor event). ``samples``: an int >= 1 (default
    :data:`DEFAULT_KL_SAMPLES`)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    draw = q.rsample if q.has_rsample else q.sample
    w = draw(torch.Size([samples]))
    return (q.log_prob(w) - p.log_prob(w)).mean(0)


def kl_divergence(q: Distribution, p: Distribution, samples: int = DEFAULT_KL_SAMPLES) -> torch.Tensor:
    """KL(q || p) in nats: the closed form registered with ``torch.distributions.kl.register_kl`` for the pair if
    there is one (torch's own, and varbnn's for Delta, ImproperUniform, Radial, LogNormal vs Gamma/InvGamma, Normal vs
    Laplace), otherwise :func:`monte_carlo_kl` with ``samples`` draws."""
    try:
        return _torch_kl(q, p)
    except NotImplementedError:
        return monte_carlo_kl(q, p, samples)


class _KLSumPlan(NamedTuple):
    """What :class:`_NormalKLSum` needs besides the tensors: how many tensors, how many of them (the first ones) have
    sigma statistics, their ``var_scale``, every tensor's ``numel`` and the sum of the constants."""

    tensors: int
    with_stats: int
    var_scales: tuple[float, ...]
    numels: tuple[int, ...]
    constant: float


_PLAN_VECTORS: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def _plan_vectors(plan: _KLSumPlan, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(numels, var_scales)`` as tensors on ``like``'s device and dtype, made once per plan (a host-to-device copy on
    a GPU would otherwise wait for the device on every step)."""
    key = (plan.numels, plan.var_scales, like.device, like.dtype)
    vectors = _PLAN_VECTORS.get(key)
    if vectors is None:
        if len(_PLAN_VECTORS) >= 64:
            _PLAN_VECTORS.clear()
        vectors = (
            torch.tensor(plan.numels, dtype=like.dtype, device=like.device),
            torch.tensor(plan.var_scales, dtype=like.dtype, device=like.device),
        )
        _PLAN_VECTORS[key] = vectors
    return vectors


class _NormalKLSum(torch.autograd.Function):
    """The sum over tensors of :class:`NormalKLParts` KLs as one autograd node: a few operations over all of a model's
    tensors (``torch._foreach_*``) forward, and in closed form backward,

        dKL/dloc_t = (loc_t - m_t) / s_t^2,   dKL/d sum(log sigma_t) = -1,   dKL/d sum(sigma_t^2) = v_t / (2 s_t^2),

    instead of a dozen recorded scalar operations and a backward node per tensor (host time, which bounds an eager
    step on a GPU). Inputs: the plan, then the locs, the sums of log sigma, the sums of sigma^2 (of the first
    ``with_stats`` tensors), the prior means and the prior scales."""

    @staticmethod
    def forward(ctx, plan: _KLSumPlan, *tensors: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        count, stats = plan.tensors, plan.with_stats
        locs = tensors[:count]
        sum_logs, sum_sqs = tensors[count : count + stats], tensors[count + stats : count + 2 * stats]
        prior_locs, prior_scales = tensors[count + 2 * stats : 2 * count + 2 * stats], tensors[2 * count + 2 * stats :]
        diffs = torch._foreach_sub(locs, prior_locs)
        quadratic = torch.stack(torch._foreach_norm(diffs)).square_()
        scales = torch.stack(prior_scales)
        half_precision = scales.square().reciprocal_().mul_(0.5)
        numels, var_scales = _plan_vectors(plan, scales)
        total = torch.dot(numels, scales.log())
        if stats:
            quadratic[:stats].addcmul_(torch.stack(sum_sqs), var_scales[:stats])
            total = total - torch.stack(sum_logs).sum()
        ctx.save_for_backward(half_precision, *diffs)
        ctx.plan = plan
        return total + torch.dot(half_precision, quadratic) + plan.constant

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        plan = ctx.plan
        half_precision, *diffs = ctx.saved_tensors
        scaled = half_precision * grad
        grad_locs = torch._foreach_mul(diffs, list((scaled * 2).unbind()))
        grads: list[torch.Tensor | None] = [None, *grad_locs]
        if plan.with_stats:
            _, var_scales = _plan_vectors(plan, scaled)
            minus = -grad
            grads += [minus] * plan.with_stats
            grads += list((scaled[: plan.with_stats] * var_scales[: plan.with_stats]).unbind())
        return (*grads, *([None] * (2 * plan.tensors)))


def normal_kl_sum(parts: list[NormalKLParts]) -> torch.Tensor:
    """``sum_t KL_t`` over :class:`NormalKLParts` (one device and dtype) in one autograd node (:class:`_NormalKLSum`);
    the same value as summing each tensor's KL, up to rounding."""
    if not parts:
        raise ValueError("normal_kl_sum: no parts")
    for part in parts:
        for name in ("prior_loc", "prior_scale"):
            value = getattr(part, name)
            if value.dim() != 0 or value.requires_grad:
                raise ValueError(
                    f"normal_kl_sum: {name} must be a 0-d tensor without gradient (its gradient is not computed), got "
                    f"shape {tuple(value.shape)}, requires_grad={value.requires_grad}"
                )
    ordered = sorted(parts, key=lambda part: part.sum_log_sigma is None)  # the ones with sigma statistics first
    stats = [part for part in ordered if part.sum_log_sigma is not None]
    plan = _KLSumPlan(
        len(ordered),
        len(stats),
        tuple(float(part.var_scale) for part in stats),
        tuple(part.loc.numel() for part in ordered),
        sum(float(part.constant) - 0.5 * part.loc.numel() for part in ordered),
    )
    return _NormalKLSum.apply(
        plan,
        *(part.loc for part in ordered),
        *(part.sum_log_sigma for part in stats),
        *(part.sum_sq_sigma for part in stats),
        *(part.prior_loc for part in ordered),
        *(part.prior_scale for part in ordered),
    )


def kl(model_or_q: nn.Module | Distribution, p: Distribution | None = None, samples: int = DEFAULT_KL_SAMPLES) -> torch.Tensor:
    """``kl(model)``: ``KL_total``, the SUM of KL(q || p) over every Bayesian tensor of a model (nats), each
    tensor against its own prior (a 0-d tensor; 0 for a model without Bayesian layers; ``samples`` is not used: each
    family's own estimator decides). ``kl(q, p)``: the KL between two distributions, :func:`kl_divergence` with
    ``samples`` Monte Carlo draws where there is no closed form.

    This is Graves' complexity loss ``L^C`` (2011, eq. 5) of the whole network; divide it by ``N_train`` in the loss
    (see the module docstring, or use :func:`varbnn.objectives.elbo_loss`). The tensors whose closed form has
    :class:`NormalKLParts` (MeanField, KTied and Delta against a fixed scalar Normal prior, Radial's closed form) are
    evaluated together in one autograd node. The model sum is :func:`varbnn.nn.model.model_kl`, imported on the first
    ``kl(model)`` call.
    """
    if isinstance(model_or_q, nn.Module):
        if p is not None:
            raise TypeError("kl(model) takes no prior: each tensor's prior is stored in its layer")
        # documented lazy loading: the whole-model sum walks the Bayesian layers, which are built on this module
        from varbnn.nn.model import model_kl

        return model_kl(model_or_q)
    if p is None:
        raise TypeError("kl(q, p) needs a prior distribution p")
    return kl_divergence(model_or_q, p, samples)
