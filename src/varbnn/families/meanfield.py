"""Mean-field (diagonal) Gaussian family: Graves 2011 section 5.2, Blundell et al. 2015.

Its per-step speed machinery (the fused softplus nodes, the step caches, :class:`~varbnn._fast.softplus.SoftplusGroup`)
is in the private :mod:`varbnn._fast.softplus`, shared with KTied and Radial."""

from __future__ import annotations

import math
from typing import Any, overload

import torch
from torch import nn
from torch.distributions import Distribution, Independent, Normal

from varbnn import philox
from varbnn._checks import as_bool, as_float_in
from varbnn._fast.softplus import (
    ScaleStats,
    _records_step,
    _shared_sigma,
    cached_draw,
    fused_normal_kl,
    group_stats,
    normal_kl_from_stats,
    softplus,
    softplus_sample,
    softplus_stats,
    step_key,
)
from varbnn.divergence import NormalKLParts, register_family_kl, scalar_normal_nll_applies
from varbnn.families.base import LAYER_KINDS, SampleMode, VariationalFamily, register_family
from varbnn.ops import WeightOp
from varbnn.priors import Normal as NormalPrior

__all__ = ["MeanField", "INIT_STD_RANGE", "inverse_softplus", "normal_kl_elementwise"]

_ESTIMATORS = ("reparam", "local", "flipout", "graves")

INIT_STD_RANGE: tuple[float, float] = (1e-8, 1e2)
"""The allowed initial standard deviations ``init_std`` of the Gaussian families (:class:`MeanField`, ``KTied``,
``Radial``, RDP's ``fallback_init_std``), a closed interval. Both ends give finite outputs and gradients in float32 (tested
for every estimator); far below it ``1 / sigma`` and ``sigma^2`` leave float32's range (``init_std=1e-44`` gave infinite
gradients of ``rho``), and a weight standard deviation above 100 is no prior belief anyone holds."""


@overload
def inverse_softplus(y: float) -> float: ...
@overload
def inverse_softplus(y: torch.Tensor) -> torch.Tensor: ...
def inverse_softplus(y: float | torch.Tensor) -> float | torch.Tensor:
    """rho such that softplus(rho) = y (y > 0; a number or a tensor), computed stably for small and large y."""
    if isinstance(y, torch.Tensor):
        return y + torch.log(-torch.expm1(-y))
    return y + math.log(-math.expm1(-y))


def _rademacher(shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    # Out of place, so that it also draws independent signs under torch.func.vmap(randomness="different").
    uniform = philox.rand(shape, dtype=like.dtype, device=like.device)
    return torch.where(uniform < 0.5, -1.0, 1.0).to(like.dtype)


@register_family("meanfield")
class MeanField(VariationalFamily):
    """Diagonal Gaussian posterior ``q(W) = prod_i N(w_i | loc_i, sigma_i^2)`` with ``sigma = softplus(rho)``
    (Graves 2011 section 5.2; Blundell et al. 2015).

    The KL against a :class:`~varbnn.priors.Normal` prior ``N(m, s^2)`` is in closed form, summed over the tensor
    (Graves 2011 eq. 13): ``KL = sum_i [log(s / sigma_i) + ((loc_i - m)^2 + sigma_i^2 - s^2) / (2 s^2)]``, computed by a
    fused node that shares ``softplus(rho)`` with the forward pass; other priors use the distribution-level registry
    or a Monte Carlo estimate (:func:`varbnn.divergence.kl_divergence`). The means are He-initialised by the layer,
    or copied from a pretrained weight by :func:`~varbnn.convert.bayesianize`.

    Pruning (Graves 2011, section 7): :meth:`prune_` fixes chosen weights at exactly 0. They are no longer
    sampled, have no variance, cost no complexity (they are not transmitted), and get zero gradients; see
    :func:`varbnn.prune.prune_by_density_ratio`.

    :param init_std: initial posterior standard deviation of every weight (default 1e-2); a number (any numeric type,
        e.g. ``np.float32`` or a 0-d tensor) in ``[1e-8, 1e2]`` (:data:`INIT_STD_RANGE`).
    :param estimator: how a layer draws its output and how the std gradient is formed (default ``"reparam"``):

        * ``"reparam"``: one weight sample per forward pass, shared by the batch (any layer).
        * ``"local"``: local reparameterization (Kingma et al. 2015): pre-activations are sampled per
          example from ``N(op(x, loc), op(x^2, sigma^2))``; Linear, Conv1d/2d/3d and Embedding layers.
        * ``"flipout"``: Wen et al. 2018: ``op(x, loc) + op(x * s_in, sigma * eps) * s_out`` with random signs
          ``s_in``, ``s_out`` per example; Linear and Conv1d/2d/3d layers.
        * ``"graves"``: Graves (2011, eq. 11-12 and 16-17): one weight sample per EXAMPLE and the variance
          gradient from the diagonal empirical Fisher, ``dL^E/dsigma^2 = 1/2 mean_n (dL_n/dw)^2``, instead of
          the reparameterization gradient. Training steps go through
          :func:`varbnn.objectives.graves_gradients` (:func:`varbnn.fit` does this by itself); a plain forward pass
          draws like ``"reparam"``. Any layer.
    :param learn_std: ``True`` (default) or ``False``. ``False`` keeps sigma fixed at ``init_std`` (a buffer, not a
        parameter): Graves' fixed-variance "weight noise" posterior, where only the means are trained.
    """

    default_kl_weight = 0.1  # benchmarks/results/defaults: lowest mean validation NLL ratio over three tasks

    estimators = _ESTIMATORS
    estimator_layers = {
        "reparam": LAYER_KINDS,
        "local": ("linear", "conv1d", "conv2d", "conv3d", "embedding"),
        "flipout": ("linear", "conv1d", "conv2d", "conv3d"),
        "graves": LAYER_KINDS,
    }

    # the fast paths of its sigma = softplus(rho) (varbnn._fast.softplus), declared for this class's own members
    softplus_group = True
    independent_elements = True
    has_fused_sample = True
    has_plain_scale = True

    loc: nn.Parameter
    rho: torch.Tensor
    weight_mask: torch.Tensor | None
    _scale_cache: tuple[Any, ...] | None = None

    def __init__(self, init_std: float = 1e-2, estimator: str = "reparam", learn_std: bool = True) -> None:
        init_std = as_float_in(init_std, "init_std", *INIT_STD_RANGE, owner="MeanField")
        if estimator not in _ESTIMATORS:
            raise ValueError(f"MeanField: unknown estimator {estimator!r}; allowed: {list(_ESTIMATORS)}")
        learn_std = as_bool(learn_std, "learn_std", owner="MeanField")
        super().__init__(init_std=init_std, estimator=estimator, learn_std=learn_std)
        self.init_std = init_std
        self.estimator = estimator
        self.learn_std = learn_std
        self.register_buffer("weight_mask", None)

    def _materialize(self, shape: torch.Size, init: torch.Tensor) -> None:
        self.loc = nn.Parameter(init)
        rho = torch.full(shape, inverse_softplus(self.init_std), dtype=init.dtype)
        if self.learn_std:
            self.rho = nn.Parameter(rho)
        else:
            self.register_buffer("rho", rho)

    # -- pruning ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def prune_(self, keep: torch.Tensor | None) -> MeanField:
        """Keep only the weights where ``keep`` is True (a bool tensor of the weight's shape); the others are fixed at
        0 from now on. ``keep=None`` removes the mask (every weight sampled again). Returns self."""
        shape = self._require_built()
        if keep is None:
            self.weight_mask = None
            return self
        if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.shape != shape:
            got = f"{keep.dtype} {tuple(keep.shape)}" if isinstance(keep, torch.Tensor) else type(keep).__name__
            raise ValueError(f"MeanField.prune_: keep must be a bool tensor of shape {tuple(shape)}, got {got}")
        self.weight_mask = keep.to(device=self.loc.device, dtype=self.loc.dtype)
        self._scale_cache = None
        self.__dict__.pop("_softplus_group", None)  # a pruned tensor leaves its model's SoftplusGroup
        return self

    @property
    def kept(self) -> int:
        """Number of weights not pruned."""
        shape = self._require_built()
        return math.prod(shape) if self.weight_mask is None else int(self.weight_mask.sum())

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # another family's state changes nothing (the base class reports it); args[-1] is torch's error_msgs
        if self._refuse_other_family(state_dict, prefix, args[-1] if args else kwargs["error_msgs"]):
            return
        # A pruned family's state carries its mask; an unpruned one loading it (or the reverse) takes the saved state.
        key = prefix + "weight_mask"
        self.weight_mask = state_dict[key].clone() if key in state_dict else None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def scale(self) -> torch.Tensor:
        """Posterior standard deviations (softplus(rho); KTied's U V^T), computed once per training step with the KL's
        statistics (:func:`~varbnn._fast.softplus.stats_per_step`); outside training steps (no gradients recorded, e.g.
        prediction) sigma alone."""
        if self.has_plain_scale and not _records_step(self._scale_sources()):
            shared = _shared_sigma(self, self._plain_scale)
            return self._plain_scale() if shared is None else shared
        return self._scale_stats()[0]

    def _scale_sources(self) -> tuple[torch.Tensor, ...]:
        """The parameters sigma is computed from (the per-step cache's key); subclasses with another parameterisation
        of sigma override this, :meth:`_plain_scale` and :meth:`_scale_stats` together."""
        return (self.rho,)

    def _plain_scale(self) -> torch.Tensor:
        """sigma computed directly, without statistics or cache (outside training steps)."""
        return softplus(self.rho)

    def _softplus_group_eligible(self) -> bool:
        """Whether this tensor joins its model's :class:`~varbnn._fast.softplus.SoftplusGroup`: the class declares
        :attr:`~varbnn.families.VariationalFamily.softplus_group` (a subclass with another parameterisation of sigma or
        of the draw does not, and keeps its own nodes), the tensor is unpruned, and its estimator is not Graves' (whose
        steps run under torch.func)."""
        return self.softplus_group and self.estimator != "graves" and self.weight_mask is None

    def _fused_sample(self) -> torch.Tensor | None:
        """A training step's first draw through a node that also gives sigma's statistics
        (:func:`~varbnn._fast.softplus.fused_sample`), or None: also where the class does not declare
        :attr:`~varbnn.families.VariationalFamily.has_fused_sample` (a subclass with its own sigma draws from
        :attr:`scale`)."""
        if not self.has_fused_sample:
            return None
        return softplus_sample(self)

    def _scale_stats(self, with_square: bool = False) -> ScaleStats:
        """(sigma, sigma^2 or None, sum(log sigma), sum(sigma^2)) from the step's fused node
        (:func:`~varbnn._fast.softplus.stats_per_step`); subclasses with another parameterisation of sigma override
        this."""
        return softplus_stats(self, with_square)

    @property
    def variance(self) -> torch.Tensor:
        """Posterior variances sigma^2 (unmasked), within a training step an output of the fused node."""
        if self.has_plain_scale and not _records_step(self._scale_sources()):
            shared = _shared_sigma(self, self._plain_scale)
            return (self._plain_scale() if shared is None else shared).square()
        square = self._scale_stats(with_square=True)[1]
        assert square is not None
        return square

    def sigma_stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sum(log sigma), sum(sigma^2))`` over the (unmasked) tensor: what the KL to a scalar-scale Normal needs of
        sigma."""
        _, _, sum_log, sum_sq = self._scale_stats()
        return sum_log, sum_sq

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_scale_cache"] = None  # a graph-connected tensor cannot be deep-copied or pickled
        state.pop("_softplus_group", None)  # the model's KL makes the copy's own group
        state.pop("_held_scale", None)  # an optimizer's sigma belongs to the optimizer, not to a copy of the model
        return state

    # -- a sigma held by an optimizer (IVON) -------------------------------------------------------------
    def hold_scale_(self, sigma: torch.Tensor | None) -> MeanField:
        """Draw from ``sigma`` instead of ``softplus(rho)`` while ``rho`` stays as it is now (for an optimizer that
        holds the posterior's sigma itself and has just written ``rho = inverse_softplus(sigma)``, e.g.
        :class:`~varbnn.optim.IVON`).

        ``sigma`` is a leaf tensor of the weight's shape that requires grad: the unmasked reparameterised draw is then
        ``addcmul(loc, sigma, eps)``, whose backward writes ``d loss / d sigma`` into ``sigma.grad`` (one product per
        weight) instead of differentiating softplus into ``rho.grad``. Any change of ``rho`` (an optimizer step, a load,
        a move) ends the hold: the family draws from ``softplus(rho)`` again. ``None`` ends it now. Returns self."""
        if sigma is None:
            self.__dict__.pop("_held_scale", None)
            return self
        shape = self._require_built()
        if not isinstance(sigma, torch.Tensor) or sigma.shape != shape or not sigma.requires_grad or not sigma.is_leaf:
            raise ValueError(f"MeanField.hold_scale_: sigma must be a leaf tensor of shape {tuple(shape)} that requires grad")
        self.__dict__["_held_scale"] = (sigma, step_key((self.rho,)))
        return self

    def held_scale(self, *, ended: bool = False) -> torch.Tensor | None:
        """The sigma set by :meth:`hold_scale_` while ``rho`` is unchanged since, else ``None``; with ``ended=True``
        the tensor last given to :meth:`hold_scale_` even after a change of ``rho`` ended the hold (the optimizer that
        holds it reads the gradients its draws left there and reuses its memory), ``None`` when none was given."""
        held = self.__dict__.get("_held_scale")
        if held is None or (not ended and held[1] != step_key((self.rho,))):
            return None
        return held[0]

    def distribution(self) -> Distribution:
        """The unpruned Gaussian (a pruned family's weights are ``mask * w`` with w from this distribution)."""
        self._require_built()
        return Independent(Normal(self.loc, self.scale, validate_args=False), self.loc.dim(), validate_args=False)

    @property
    def mean(self) -> torch.Tensor:
        """``loc`` (times the pruning mask, if any): the mean and the mode of q."""
        return self.loc if self.weight_mask is None else self.loc * self.weight_mask

    @property
    def mode(self) -> torch.Tensor:
        """The same as :attr:`mean` (a Gaussian's mode is its mean)."""
        return self.mean

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.weight_mask is None:
            return self.loc, self.variance
        return self.loc * self.weight_mask, self.variance * self.weight_mask

    def rsample(self, sample_shape: torch.Size | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        self._require_built()
        if not sample_shape and self.weight_mask is None:
            held = self.held_scale() if "_held_scale" in self.__dict__ else None
            if held is not None:  # an optimizer's sigma: d loss / d sigma goes into held.grad
                loc = self.loc
                return torch.addcmul(loc, held, philox.randn(loc.shape, dtype=loc.dtype, device=loc.device))
            stats = group_stats(self) if "_softplus_group" in self.__dict__ else None
            if stats is not None:  # sigma from the step's group node: the draw is one addcmul
                loc = self.loc
                return torch.addcmul(loc, stats[0], philox.randn(loc.shape, dtype=loc.dtype, device=loc.device))
            weight = self._fused_sample()  # a training step's first draw: the draw and sigma's statistics in one node
            if weight is not None:
                return weight
        eps = philox.randn(torch.Size(sample_shape) + self.loc.shape, dtype=self.loc.dtype, device=self.loc.device)
        if sample_shape:
            weight = torch.addcmul(self.loc, self.scale, eps)
        else:
            weight = cached_draw(self, self._scale_sources(), self.scale, eps)
        return weight if self.weight_mask is None else weight * self.weight_mask

    def forward_op(
        self,
        op: WeightOp,
        x: torch.Tensor,
        bias: VariationalFamily | None,
        mode: SampleMode = "sample",
    ) -> torch.Tensor:
        if mode != "sample" or self.estimator in ("reparam", "graves"):
            return super().forward_op(op, x, bias, mode)
        loc = self.mean
        if self.estimator == "local":
            variance = self.variance if self.weight_mask is None else self.variance * self.weight_mask
            bias_mean = bias_var = None
            sampled_bias = None
            if bias is not None:
                try:
                    bias_mean, bias_var = bias.moments()
                except NotImplementedError:
                    sampled_bias = bias.weight("sample")
            mean = op(x, loc, bias_mean)
            var = op(op.squared_input(x), variance, bias_var)
            out = mean + var.clamp_min(1e-30).sqrt() * philox.randn(mean.shape, dtype=mean.dtype, device=mean.device)
            return op.add_bias(out, sampled_bias) if sampled_bias is not None else out
        # flipout
        sigma = self.scale if self.weight_mask is None else self.scale * self.weight_mask
        b = bias.weight("sample") if bias is not None else None
        mean = op(x, loc, b)
        delta = sigma * philox.randn(sigma.shape, dtype=sigma.dtype, device=sigma.device)
        perturbation = op(x * _rademacher(op.input_sign_shape(x), x), delta, None)
        return mean + perturbation * _rademacher(op.output_sign_shape(perturbation), perturbation)


def normal_kl_elementwise(
    loc: torch.Tensor, sigma: torch.Tensor, prior_loc: torch.Tensor, prior_scale: torch.Tensor
) -> torch.Tensor:
    """KL(N(loc, sigma^2) || N(m, s^2)) per weight: ``log(s / sigma) + ((loc - m)^2 + sigma^2 - s^2) / (2 s^2)``,
    Graves (2011) eq. 13's summand, i.e. each weight's complexity cost in nats."""
    return (prior_scale / sigma).log() + ((loc - prior_loc).square() + sigma.square() - prior_scale.square()) / (
        2 * prior_scale.square()
    )


def _meanfield_normal_kl(family: MeanField, prior: Any) -> torch.Tensor:
    if family.weight_mask is not None:  # pruned weights are fixed at 0: no complexity cost
        terms = normal_kl_elementwise(family.loc, family.scale, prior.loc, prior.scale)
        return (terms * family.weight_mask).sum()
    if prior.scale.dim() == 0:  # the sigma part through the step's fused softplus node
        return normal_kl_from_stats(family.loc, *family.sigma_stats(), prior.loc, prior.scale)
    return fused_normal_kl(family.loc, family.scale, prior.loc, prior.scale)


def _meanfield_normal_kl_parts(family: MeanField, prior: Any) -> NormalKLParts | None:
    """The KL's :class:`~varbnn.divergence.NormalKLParts` (a scalar prior not trained by gradient, an unpruned tensor)."""
    if family.weight_mask is not None or not scalar_normal_nll_applies(prior):
        return None
    return NormalKLParts(family.loc, *family.sigma_stats(), prior.loc, prior.scale)


register_family_kl(MeanField, NormalPrior, parts=_meanfield_normal_kl_parts)(_meanfield_normal_kl)
