"""The Radial family (Farquhar, Osborne, Gal 2020): ``w = mu + sigma * (eps / ||eps||) * r`` over a whole tensor.

Every weight tensor (and every bias, as its own tensor) draws one direction ``eps / ||eps||`` (eps ~ N(0, I) over
the tensor) and one scalar radius ``r ~ N(0, 1)`` per Monte Carlo sample; ``sigma = softplus(rho)``. The KL is the
analytic entropy of :class:`varbnn.distributions.Radial` plus a Monte Carlo estimate of the cross-entropy with the
prior, averaged over ``kl_samples`` fresh draws (paper eq. 4 and Appendix A-B); against a Normal prior
``cross_entropy="closed_form"`` uses the exact cross-entropy instead (zero variance).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.distributions import Distribution

from varbnn import philox
from varbnn._checks import as_float_in, as_positive_int
from varbnn._fast.softplus import (
    cache_until_backward,
    cached_draw,
    cached_softplus,
    fused_normal_kl,
    group_stats,
    normal_kl_from_stats,
    softplus_sample,
    softplus_stats,
    step_key,
)
from varbnn._transforms import functorch_active as _functorch_active
from varbnn.distributions.radial import Radial as RadialDistribution
from varbnn.distributions.radial import radial_entropy_constant
from varbnn.divergence import NormalKLParts, register_family_kl, scalar_normal_nll, scalar_normal_nll_applies
from varbnn.families.base import LAYER_KINDS, SampleMode, VariationalFamily, register_family
from varbnn.families.meanfield import INIT_STD_RANGE, _rademacher, inverse_softplus
from varbnn.ops import WeightOp
from varbnn.priors import Normal as NormalPrior
from varbnn.priors import Prior

__all__ = ["Radial", "CROSS_ENTROPY_ESTIMATORS"]

_ESTIMATORS = ("reparam", "flipout")
DEFAULT_ELEMENT_STD = 1e-2
"""The per-element standard deviation of a radial draw at initialisation when ``init_std`` is not given."""
CROSS_ENTROPY_ESTIMATORS = ("monte_carlo", "closed_form")
"""The values of :class:`Radial`'s ``cross_entropy`` argument."""


@register_family("radial")
class Radial(VariationalFamily):
    """Radial posterior over one tensor: ``w = loc + softplus(rho) * (eps / ||eps||) * r`` with ``eps ~ N(0, I)``
    over the whole tensor and one scalar ``r ~ N(0, 1)`` per draw (Farquhar et al. 2020, eq. 3).

    Its KL splits into the entropy and the cross-entropy with the prior (eq. 4):
    ``KL(q || p) = -H[q] - E_q[log p(w)]``, where ``H[q] = sum_i log sigma_i + c_D`` is analytic (eq. 5 and
    Appendix A; the constant ``c_D`` is :func:`~varbnn.distributions.radial.radial_entropy_constant`, kept so that
    reported ELBOs are true bounds) and ``E_q[log p(w)]`` is estimated by ``mean_s log p(w_s)`` over ``kl_samples``
    draws (averaged, not summed), or computed exactly for a Normal prior with ``cross_entropy="closed_form"``.
    The means are He-initialised by the layer (or copied from a pretrained weight by
    :func:`~varbnn.convert.bayesianize`).

    :param init_std: initial ``sigma = softplus(rho)`` of every element, a number in ``[1e-8, 1e2]``
        (:data:`~varbnn.families.meanfield.INIT_STD_RANGE`; the paper initialises rho = -6 for both families in its
        continual-learning runs, i.e. 2.5e-3). The per-element standard deviation of a radial draw is
        ``sigma / sqrt(D)`` for a tensor of ``D`` elements, so a given ``sigma`` is ``sqrt(D)`` times less noise
        per weight than :class:`MeanField`'s: with sigma = 1e-2 a 784x400 layer starts at 1.8e-5 per weight and,
        within a normal training budget, stays practically deterministic (mutual information 0.0000 on the
        defaults study's Fashion-MNIST MLP; :func:`varbnn.train.fit` warns). Default ``None``:
        ``sigma = 1e-2 * sqrt(D)`` (at most 1e2), a per-element std of :data:`DEFAULT_ELEMENT_STD` = 1e-2 at the
        start, as :class:`MeanField`'s: over the defaults study's three tasks and two seeds its validation NLL is
        0.765 of the plain network's (at its default KL weight 0.3) against 0.886 for sigma = 1e-2 (see
        ``benchmarks/results/defaults/``). The paper's experiments pass their ``init_std`` explicitly.
    :param estimator: ``"reparam"`` (one draw per forward pass, any layer) or ``"flipout"`` (Linear, Conv1d/2d/3d: the
        perturbation ``sigma * u * r`` times per-example random signs; sign flips keep a uniform direction
        uniform, so each example sees an exact radial draw).
    :param kl_samples: Monte Carlo draws for the cross-entropy with the prior (default 1; an int >= 1), averaged. With 1
        draw and the ``"reparam"`` estimator, a KL evaluated in a training step after the forward pass uses that pass's weight
        draw (once), as Blundell et al. (2015) and the paper do: unbiased, and one draw of the weight instead of
        two. Otherwise (no forward draw in this step, flipout, several draws, a second KL call) it draws afresh.
    :param cross_entropy: ``"monte_carlo"`` (default, the paper's estimator; any prior) or ``"closed_form"`` (Normal
        priors only: ``E[(w_i - m_i)^2] = (loc_i - m_i)^2 + sigma_i^2 / D``).
    """

    default_kl_weight = 0.3  # benchmarks/results/defaults (with the per-element start, init_std=None)

    estimators = _ESTIMATORS
    estimator_layers = {"reparam": LAYER_KINDS, "flipout": ("linear", "conv1d", "conv2d", "conv3d")}

    # the fast paths of its sigma = softplus(rho) (varbnn._fast.softplus), declared for this class's scale and rsample
    softplus_group = True
    has_fused_sample = True

    loc: nn.Parameter
    rho: nn.Parameter
    _scale_cache: tuple[Any, ...] | None = None
    _forward_draw: tuple[Any, torch.Tensor] | None = None

    def __init__(
        self,
        init_std: float | None = None,
        estimator: str = "reparam",
        kl_samples: int = 1,
        cross_entropy: str = "monte_carlo",
    ) -> None:
        if init_std is not None:
            init_std = as_float_in(init_std, "init_std", *INIT_STD_RANGE, owner="Radial")
        if estimator not in _ESTIMATORS:
            raise ValueError(f"Radial: unknown estimator {estimator!r}; allowed: {list(_ESTIMATORS)}")
        kl_samples = as_positive_int(kl_samples, "kl_samples", owner="Radial")
        if cross_entropy not in CROSS_ENTROPY_ESTIMATORS:
            raise ValueError(f"Radial: cross_entropy must be one of {list(CROSS_ENTROPY_ESTIMATORS)}, got {cross_entropy!r}")
        super().__init__(init_std=init_std, estimator=estimator, kl_samples=kl_samples, cross_entropy=cross_entropy)
        self.init_std = init_std
        self.estimator = estimator
        self.kl_samples = kl_samples
        self.cross_entropy = cross_entropy

    def _materialize(self, shape: torch.Size, init: torch.Tensor) -> None:
        self.loc = nn.Parameter(init)
        sigma = self.init_std
        if sigma is None:  # per-element std DEFAULT_ELEMENT_STD at the start: sigma = that * sqrt(D)
            sigma = min(DEFAULT_ELEMENT_STD * math.sqrt(max(math.prod(shape), 1)), INIT_STD_RANGE[1])
        self.rho = nn.Parameter(torch.full(shape, inverse_softplus(sigma), dtype=init.dtype))

    @property
    def scale(self) -> torch.Tensor:
        """sigma = softplus(rho), shared by the forward pass and the KL within a step (:func:`cached_softplus`)."""
        return cached_softplus(self)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_scale_cache"] = None
        state["_forward_draw"] = None
        state.pop("_softplus_group", None)  # the model's KL makes the copy's own group
        return state

    def distribution(self) -> Distribution:
        self._require_built()
        return RadialDistribution(self.loc, self.scale, validate_args=False)

    @property
    def mean(self) -> torch.Tensor:
        """``loc``: the radial draw ``loc + sigma * u * r`` has E[r] = 0."""
        return self.loc

    @property
    def mode(self) -> torch.Tensor:
        """``loc``: the density is largest at the mean (the radius is half-normal; no soap bubble)."""
        return self.loc

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(loc, sigma^2 / D): the exact elementwise mean and variance (used by adaptive Normal priors)."""
        return self.loc, self.scale.square() / self.loc.numel()

    def entropy(self) -> torch.Tensor:
        """Analytic entropy ``H[q] = sum_i log sigma_i + c_D`` in nats, constants included (Farquhar et al. 2020, eq. 5
        and Appendix A; ``c_D`` is :func:`~varbnn.distributions.radial.radial_entropy_constant` of the tensor's size D).
        """
        return softplus_stats(self)[2] + radial_entropy_constant(self.loc.numel())

    def _noise(self, sample_shape: torch.Size) -> torch.Tensor:
        """``(eps / ||eps||) * r`` of shape ``sample_shape + shape``: one direction and one radius per draw."""
        n = self.loc.dim()
        eps = philox.randn(sample_shape + self.loc.shape, dtype=self.loc.dtype, device=self.loc.device)
        r = philox.randn(sample_shape + (1,) * n, dtype=self.loc.dtype, device=self.loc.device)
        dims = tuple(range(eps.dim() - n, eps.dim()))
        norm = torch.linalg.vector_norm(eps, dim=dims, keepdim=True).clamp_min(torch.finfo(eps.dtype).tiny)
        return eps.mul_(r / norm)  # the radius folded into one scalar per draw: one pass over the tensor

    def rsample(self, sample_shape: torch.Size | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        self._require_built()
        if sample_shape:
            return torch.addcmul(self.loc, self.scale, self._noise(torch.Size(sample_shape)))
        if "_softplus_group" in self.__dict__:
            stats = group_stats(self)
            if stats is not None:  # sigma from the step's group node: the draw is one addcmul
                return torch.addcmul(self.loc, stats[0], self._noise(torch.Size()))
        if self.has_fused_sample:  # a training step's first draw: the draw and sigma's statistics in one node
            weight = softplus_sample(self, lambda: self._noise(torch.Size()))
            if weight is not None:
                return weight
        return cached_draw(self, (self.rho,), self.scale, self._noise(torch.Size()))

    def weight(self, mode: SampleMode = "sample") -> torch.Tensor:
        """As :meth:`VariationalFamily.weight`; in a training step a draw is also kept for the Monte Carlo KL (see
        ``kl_samples``)."""
        w = super().weight(mode)
        if mode == "sample" and torch.is_grad_enabled() and w.requires_grad:
            if torch.compiler.is_compiling():
                # a compiled step (fit(compile=True)) traces the forward pass and the KL as one function: the
                # parameters cannot change between them, so no version key (untraceable) and no backward hook
                self._forward_draw = (None, w)
            elif not _functorch_active():  # a plain attribute, set past nn.Module.__setattr__ (once per step)
                object.__setattr__(self, "_forward_draw", (step_key((self.loc, self.rho)), w))
                cache_until_backward(self, "_forward_draw", (w,))
        return w

    def take_forward_draw(self) -> torch.Tensor | None:
        """The weight drawn by this step's forward pass (current parameters, not yet backpropagated), once; else None.
        Within a compiled step only a draw of that traced step counts; outside one only an eager draw whose parameters
        are unchanged."""
        draw, self._forward_draw = self._forward_draw, None
        if draw is None or not torch.is_grad_enabled():
            return None
        if torch.compiler.is_compiling():
            return draw[1] if draw[0] is None else None
        if draw[0] is None or draw[0] != step_key((self.loc, self.rho)):
            return None
        return draw[1]

    def forward_op(
        self,
        op: WeightOp,
        x: torch.Tensor,
        bias: VariationalFamily | None,
        mode: SampleMode = "sample",
    ) -> torch.Tensor:
        if mode != "sample" or self.estimator == "reparam":
            return super().forward_op(op, x, bias, mode)
        b = bias.weight("sample") if bias is not None else None
        mean = op(x, self.loc, b)
        delta = self.scale * self._noise(torch.Size())
        perturbation = op(x * _rademacher(op.input_sign_shape(x), x), delta, None)
        return mean + perturbation * _rademacher(op.output_sign_shape(perturbation), perturbation)


def _radial_kl(family: Radial, prior: Any) -> torch.Tensor:
    shape = family._require_built()
    if family.cross_entropy == "closed_form":
        if not isinstance(prior, NormalPrior):
            raise ValueError(
                f"Radial(cross_entropy='closed_form') needs a Normal prior, got {type(prior).__name__}; "
                "use cross_entropy='monte_carlo' for other priors"
            )
        # sum[log s + log(2 pi)/2 + ((loc - m)^2 + sigma^2 / D) / (2 s^2)] - (sum log sigma + C_D): the Gaussian form
        # with variance factor 1/D, in a few passes with a closed-form backward
        n = family.loc.numel()
        constant = n * (0.5 + 0.5 * math.log(2 * math.pi)) - radial_entropy_constant(n)
        if prior.scale.dim() == 0:  # the sigma part through the step's fused softplus node
            _, _, sum_log, sum_sq = softplus_stats(family)
            return normal_kl_from_stats(family.loc, sum_log, sum_sq, prior.loc, prior.scale, 1.0 / n) + constant
        return fused_normal_kl(family.loc, family.scale, prior.loc, prior.scale, 1.0 / n) + constant
    forward = family.take_forward_draw() if family.kl_samples == 1 else None
    w = forward.unsqueeze(0) if forward is not None else family.rsample(torch.Size([family.kl_samples]))
    if scalar_normal_nll_applies(prior):  # the common N(m, s^2) prior: one pass forward and backward
        return scalar_normal_nll(w, prior.loc, prior.scale) / family.kl_samples - family.entropy()
    p = prior.distribution(shape)
    return -family.entropy() - p.log_prob(w).mean(0)


def _radial_kl_parts(family: Radial, prior: Any) -> NormalKLParts | None:
    """The KL as :class:`~varbnn.divergence.NormalKLParts` for a fixed scalar Normal prior: the closed form
    (``var_scale = 1 / D``), or the Monte Carlo cross-entropy on this step's forward draw ``w`` (``kl_samples=1``),
    ``|w - m|^2 / (2 s^2) + D log s + D log(2 pi) / 2 - H[q]`` (the parts' ``loc`` is ``w``, ``var_scale = 0``); ``None``
    otherwise (a Monte Carlo KL without a forward draw takes its own draws in :func:`_radial_kl`)."""
    here = (family.loc.dtype, family.loc.device)
    if not scalar_normal_nll_applies(prior) or any((t.dtype, t.device) != here for t in (prior.loc, prior.scale)):
        return None
    n = family.loc.numel()
    constant = n * (0.5 + 0.5 * math.log(2 * math.pi)) - radial_entropy_constant(n)
    if family.cross_entropy == "closed_form":
        _, _, sum_log, sum_sq = softplus_stats(family)
        return NormalKLParts(family.loc, sum_log, sum_sq, prior.loc, prior.scale, 1.0 / n, constant)
    if family.kl_samples != 1:
        return None
    forward = family.take_forward_draw()
    if forward is None:
        return None
    _, _, sum_log, sum_sq = softplus_stats(family)
    return NormalKLParts(forward, sum_log, sum_sq, prior.loc, prior.scale, 0.0, constant)


register_family_kl(Radial, Prior, parts=_radial_kl_parts)(_radial_kl)
