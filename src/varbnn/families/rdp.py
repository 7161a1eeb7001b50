"""Radial-and-directional posterior (RDP; Oh, Adamczewski, Park 2020).

Each group g (a row, or a column) of the weight matrix is ``w_g = r_g * u_g``:

* direction ``u_g ~ vMF(mu_g, kappa)`` on S^{d-1}, one concentration per layer and grouping (eq. 5-6; or one per
  group with ``shared_concentration=False``, beyond the paper);
* radius ``r_g = s * z_g`` with ``s = sqrt(s_a s_b)`` (one per layer and grouping) and ``z_g = sqrt(a_g b_g)``, every
  factor log-normal, approximating the Gamma(1/2) x InvGamma(1/2) halves of the half-Cauchy priors (eq. 7-10).
  ``log r_g`` is therefore Normal with mean ``(m_a + m_b + m_sa + m_sb) / 2`` and variance ``(v_a + v_b + v_sa +
  v_sb) / 4``; the LOCAL part ``log z_g ~ N((m_a + m_b) / 2, (v_a + v_b) / 4)`` scores a group for pruning.

Row grouping: rows of the (out, in*kh*kw) matrix (output units / channels). Column grouping: columns, i.e. input
units / channels, as rows of the (in, out*kh*kw) matrix. Double grouping: the elementwise product of a row-grouped
and a column-grouped matrix (eq. 16-18). Tensors that cannot be grouped (biases; weights with one input or one
output) fall back to :class:`~varbnn.families.MeanField`, with a warning for weights.

Gradients: the direction is drawn by rejection sampling (Wood 1994); its pathwise gradient in kappa misses the
rejection correction. Each forward pass with gradients enabled therefore records the score term of
:meth:`varbnn.distributions.VonMisesFisher.rsample_with_score`; :func:`varbnn.objectives.elbo_loss` adds
``nll.detach() * score`` (value 0) so the kappa gradient is unbiased (Naesseth et al. 2017; Oh et al. supp. eq. 20).
This assumes one forward pass per loss, as in an ordinary training step.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributions import Distribution

from varbnn import philox
from varbnn._checks import as_bool, as_float_in
from varbnn._transforms import functorch_active
from varbnn.distributions.vmf import (
    RATIO_METHODS,
    VonMisesFisher,
    _log_sphere_area,
    householder_sample,
    log_normalizer_and_resultant,
    wood_sample,
)
from varbnn.divergence import family_kl, half_cauchy_pair_kl, register_family_kl
from varbnn.families.base import LAYER_KINDS, VariationalFamily, register_family
from varbnn.families.meanfield import INIT_STD_RANGE, MeanField, inverse_softplus
from varbnn.priors import Prior, RadialDirectionalPrior, banerjee_concentration
from varbnn.special import _work_dtype, log_bessel_iv_over_power

__all__ = ["RadialDirectional", "GROUPINGS", "INIT_LOG_STD_RANGE", "INIT_RESULTANT_RANGE"]

GROUPINGS = ("row", "column", "double")
"""The values of :class:`RadialDirectional`'s ``grouping``: rows (output units), columns (input units), or both."""
_PREFIX = {"row": "row", "column": "col"}


def _group_matrix_shape(shape: torch.Size, grouping: str) -> tuple[int, int]:
    """(number of groups, group dimension) of a weight tensor under ``grouping`` ("row" or "column")."""
    out, inp, rest = shape[0], shape[1], math.prod(shape[2:])
    return (out, inp * rest) if grouping == "row" else (inp, out * rest)


def _to_groups(weight: torch.Tensor, grouping: str) -> torch.Tensor:
    """A weight tensor as its (groups, dim) matrix."""
    if grouping == "row":
        return weight.reshape(weight.shape[0], -1)
    return weight.transpose(0, 1).reshape(weight.shape[1], -1)


def _from_groups(matrix: torch.Tensor, shape: torch.Size, grouping: str) -> torch.Tensor:
    """Inverse of :func:`_to_groups`; leading batch dimensions of ``matrix`` (``[..., groups, dim]``) are kept."""
    batch = matrix.shape[:-2]
    if grouping == "row":
        return matrix.reshape(*batch, *shape)
    swapped = matrix.reshape(*batch, shape[1], shape[0], *shape[2:])
    return swapped.transpose(len(batch), len(batch) + 1)


_RADIUS_PARAMS = ("local_loc", "local_rho", "global_loc", "global_rho")


def _log_radius_moments(
    local_loc: Tensor,
    local_rho: Tensor,
    global_loc: Tensor | None = None,
    global_rho: Tensor | None = None,
    softplus: bool = True,
) -> tuple[Tensor, Tensor]:
    """Mean ``(sum local_loc + sum global_loc) / 2`` and variance ``(sum sigma_local^2 + sum sigma_global^2) / 4`` of each
    group's log radius (``sigma = softplus(rho)``, or the rhos are already sigmas with ``softplus=False``); without the
    global pair, of the local part only."""
    sigma = F.softplus(local_rho) if softplus else local_rho
    mean, variance = 0.5 * local_loc.sum(-1), 0.25 * sigma.square().sum(-1)
    if global_loc is not None and global_rho is not None:
        g_sigma = F.softplus(global_rho) if softplus else global_rho
        mean = mean + 0.5 * global_loc.sum()
        variance = variance + 0.25 * g_sigma.square().sum()
    return mean, variance


def _log_normal_radius(local_loc: Tensor, local_rho: Tensor, global_loc: Tensor, global_rho: Tensor, z: Tensor) -> Tensor:
    """:class:`_LogNormalRadius` in plain operations (differentiated by autograd; what a torch.func transform runs)."""
    mean, variance = _log_radius_moments(local_loc, F.softplus(local_rho), global_loc, F.softplus(global_rho), softplus=False)
    return torch.exp(mean + variance.sqrt() * z)


class _LogNormalRadius(torch.autograd.Function):
    """Radius draws ``r = exp(m + sqrt(v) z)`` of every group, with ``m = (sum local_loc + sum global_loc) / 2`` and ``v =
    (sum softplus(local_rho)^2 + sum softplus(global_rho)^2) / 4`` (see :meth:`RadialDirectional.log_radius_moments`),
    as one autograd node: ``d log r / d loc = 1/2``, ``d log r / d rho_i = z softplus(rho_i) sigmoid(rho_i) / (4 sqrt(v))``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, local_loc: Tensor, local_rho: Tensor, global_loc: Tensor, global_rho: Tensor, z: Tensor
    ) -> Tensor:
        local_sigma, global_sigma = F.softplus(local_rho), F.softplus(global_rho)
        mean, variance = _log_radius_moments(local_loc, local_sigma, global_loc, global_sigma, softplus=False)
        sd = variance.sqrt()
        radius = torch.exp(mean + sd * z)
        ctx.save_for_backward(local_rho, global_rho, local_sigma, global_sigma, sd, z, radius)
        return radius

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        local_rho, global_rho, local_sigma, global_sigma, sd, z, radius = ctx.saved_tensors
        g_log = grad * radius  # [*S, groups]
        g_mean = g_log.sum_to_size(sd.shape)
        g_sd = (g_log * z).sum_to_size(sd.shape)
        g_var_sigma = (0.25 * g_sd / sd).unsqueeze(-1)  # d/d sigma_i of v is sigma_i / 2, of sd: sigma_i / (4 sd)
        g_local_rho = g_var_sigma * local_sigma * torch.sigmoid(local_rho)
        g_global_rho = g_var_sigma.sum() * global_sigma * torch.sigmoid(global_rho)
        half = 0.5 * g_mean
        return half.unsqueeze(-1).expand(local_rho.shape), g_local_rho, half.sum().expand(global_rho.shape), g_global_rho, None


RADIUS_INITS = ("prior", "even")
INIT_LOG_STD_RANGE: tuple[float, float] = (1e-8, 1.0)
"""Allowed ``init_log_std`` (closed interval). A grouping's mean factor is ``exp(m + v / 2)`` with ``v = init_log_std^2``,
so double grouping multiplies the mean weight by ``exp(init_log_std^2)``: 10 gave exp(100) = inf and a NaN posterior-mean
output in float32. Up to 1 (a log-normal whose mean is 1.6 times its median) outputs and gradients stay finite in float32
at every grouping (tested); a smaller floor than 1e-8 only adds float32 round-off."""
INIT_RESULTANT_RANGE: tuple[float, float] = (1e-6, 1 - 1e-6)
"""Allowed ``init_resultant`` (closed interval inside (0, 1)): the concentration ``kappa ~ d / (2 (1 - A))`` stays below
~1e6 d and above ~1e-6 d (tested finite in float32 with both Bessel-ratio methods)."""
CONCENTRATION_PARAMS = ("softplus", "log")
INIT_RESULTANT = 0.95
"""The default ``init_resultant`` from scratch (the published code's 1 - 0.05)."""
PRETRAINED_INIT_RESULTANT = 0.999
"""The default ``init_resultant`` around a trained network's weights (``bayesianize(pretrained=True)``): chosen on
validation data by ``benchmarks/conversion_study.py`` (``benchmarks/results/conversion-defaults/``). At 0.95 the
directions of a converted LeNet-5 start about 30% (row) and 30% (column) away from the trained ones, and 2 epochs
later the network is worse than the plain one it came from."""


@register_family("rdp")
class RadialDirectional(VariationalFamily):
    """Radial-and-directional posterior over a weight tensor (Oh et al. 2020); use with
    :class:`varbnn.priors.RadialDirectionalPrior`.

    Each group g (row or column of the weight matrix) is ``w_g = r_g * u_g`` with a von Mises-Fisher direction
    ``u_g ~ vMF(mu_g, kappa)`` (one kappa per layer and grouping, eq. 4-6, by default; see ``shared_concentration``)
    and a log-normal radius
    ``r_g = sqrt(s_a s_b) * sqrt(a_g b_g)`` (eq. 7-10; see the module docstring). The KL against the prior is in
    closed form (eq. 12), summed over the groups and the groupings: the direction term
    ``(kappa_q - kappa_p) A_d(kappa_q) + log C_d(kappa_q) - log C_d(kappa_p)`` per group, plus
    ``KL(LN || Gamma(1/2, 1/scale^2)) + KL(LN || InvGamma(1/2, 1))`` for each local and the global half-Cauchy pair
    (:func:`~varbnn.divergence.lognormal_gamma_kl`, :func:`~varbnn.divergence.lognormal_inverse_gamma_kl`).
    Double grouping multiplies a row-grouped and a column-grouped factor elementwise (eq. 16-18).

    Numbers may be of any numeric type (``np.float32``, 0-d tensors, ...); out-of-range values raise a ``ValueError``
    naming the argument and its range.

    Initialisation: at the posterior mode the weight equals the initial (He-normal or pretrained) tensor: row
    directions are its normalised rows and row radii their norms; a column factor (double grouping) starts with
    equal-entry directions and radii sqrt(dim), i.e. as the all-ones matrix (column grouping alone: the tensor's
    normalised columns and their norms).

    :param grouping: ``"row"`` (output units), ``"column"`` (input units) or ``"double"`` (default, both; the paper's
        experiments).
    :param init_log_std: initial standard deviation of each log-normal factor's log (default 1e-2, the published
        code's variance 1e-4); a number in ``[1e-8, 1]`` (:data:`INIT_LOG_STD_RANGE`).
    :param init_resultant: initial mean resultant length A_d(kappa) of the directions, via Banerjee's concentration;
        a number in ``[1e-6, 1 - 1e-6]`` (:data:`INIT_RESULTANT_RANGE`). Default ``None``: 0.95 from scratch
        (:data:`INIT_RESULTANT`, the published code's 1 - 0.05) and 0.999 around trained weights
        (:data:`PRETRAINED_INIT_RESULTANT`, :meth:`for_trained_weights`), where the relative size of the direction noise
        (about ``sqrt(1 - A^2)``) drops from 0.31 to 0.045.
    :param ratio_method: Bessel-ratio method of the vMF (``"accurate"``, default, or the paper's ``"bounds"``).
    :param score_correction: record the rejection-sampling score term for :func:`varbnn.objectives.elbo_loss`
        (``True``, default, or ``False``, which keeps only the biased pathwise kappa gradient).
    :param fallback_init_std: ``init_std`` of the MeanField fallback for biases and ungroupable weights (default 1e-2; in
        ``[1e-8, 1e2]``, :data:`~varbnn.families.meanfield.INIT_STD_RANGE`).
    :param radius_init: how the initial log radius is split over the four log-normal factors. ``"prior"`` (default): once
        the layer pairs the family with a :class:`~varbnn.priors.RadialDirectionalPrior`, the two Gamma factors
        and the global InvGamma factor start where their own KL terms are smallest (``m = log(scale^2 / 2) -
        v / 2`` and ``m = log 2 + v / 2``) and the local InvGamma factor, whose KL grows only logarithmically,
        carries the rest of each group's radius. ``"even"``: the two local factors share the log radius and the
        global pair starts at 0 (the behaviour before ``radius_init`` existed). The initial weights are the same
        either way; with small prior scales (e.g. global 1e-4) ``"even"`` starts with a KL of ~1e9 nats that Adam
        needs tens of epochs to shed, during which weak units die.
    :param concentration_param: ``kappa = exp(rho)`` (``"log"``, default) or ``softplus(rho)`` (``"softplus"``, the
        published code's choice). With softplus, rho ~= kappa for the concentrations of big layers (hundreds to
        thousands), and Adam moves a parameter by about its learning rate per step, so kappa hardly leaves its
        initial value (at lr 1e-3, by at most ~120 in 120,000 steps); ``"log"`` lets it move by a factor per step.
    :param shared_concentration: one concentration per layer and grouping (``True``, default: the paper's, eq. 4-6) or
        one per group, i.e. per row or column (``False``: not in the paper). A shared concentration gives every group
        the same relative direction noise; in a learned-noise UCI search run it settled at about 38% on every row and
        cost 0.6 nats of validation log-likelihood against mean-field, where one per group let a few rows become
        precise and cost 0.15 (``benchmarks/results/uci-learned/rdp-trace.md``, energy split 0; on concrete's split 0
        the two were within 0.02 nats of each other at their best). Per group, the Bessel
        functions run once per group instead of once per layer.
    """
    default_kl_weight = 0.03  # benchmarks/results/defaults

    estimators = ("reparam",)
    estimator_layers = {"reparam": LAYER_KINDS}

    def __init__(
        self,
        grouping: str = "double",
        init_log_std: float = 1e-2,
        init_resultant: float | None = None,
        ratio_method: str = "accurate",
        score_correction: bool = True,
        fallback_init_std: float = 1e-2,
        radius_init: str = "prior",
        concentration_param: str = "log",
        shared_concentration: bool = True,
    ) -> None:
        if concentration_param not in CONCENTRATION_PARAMS:
            raise ValueError(
                f"RadialDirectional: concentration_param must be one of {CONCENTRATION_PARAMS}, got {concentration_param!r}"
            )
        if radius_init not in RADIUS_INITS:
            raise ValueError(f"RadialDirectional: radius_init must be one of {RADIUS_INITS}, got {radius_init!r}")
        if grouping not in GROUPINGS:
            raise ValueError(f"RadialDirectional: grouping must be one of {GROUPINGS}, got {grouping!r}")
        init_log_std = as_float_in(init_log_std, "init_log_std", *INIT_LOG_STD_RANGE, owner="RadialDirectional")
        given_resultant = init_resultant
        init_resultant = INIT_RESULTANT if init_resultant is None else init_resultant
        init_resultant = as_float_in(init_resultant, "init_resultant", *INIT_RESULTANT_RANGE, owner="RadialDirectional")
        if ratio_method not in RATIO_METHODS:
            raise ValueError(f"RadialDirectional: ratio_method must be one of {RATIO_METHODS}, got {ratio_method!r}")
        score_correction = as_bool(score_correction, "score_correction", owner="RadialDirectional")
        fallback_init_std = as_float_in(fallback_init_std, "fallback_init_std", *INIT_STD_RANGE, owner="RadialDirectional")
        shared_concentration = as_bool(shared_concentration, "shared_concentration", owner="RadialDirectional")
        super().__init__(
            grouping=grouping,
            init_log_std=init_log_std,
            init_resultant=given_resultant if given_resultant is None else init_resultant,
            ratio_method=ratio_method,
            score_correction=score_correction,
            fallback_init_std=fallback_init_std,
            radius_init=radius_init,
            concentration_param=concentration_param,
            shared_concentration=shared_concentration,
        )
        self.radius_init = radius_init
        self.shared_concentration = shared_concentration
        self.concentration_param = concentration_param
        self.grouping = grouping
        self.init_log_std = init_log_std
        self.init_resultant = init_resultant
        self.ratio_method = ratio_method
        self.score_correction = score_correction
        self.fallback_init_std = fallback_init_std
        self.pending_score: torch.Tensor | None = None
        self._normalizer_cache: tuple[tuple[tuple[int, int], ...], dict[str, tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._dims_cache: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    # -- construction ---------------------------------------------------------------------------------
    def for_trained_weights(self) -> RadialDirectional:
        """With ``init_resultant`` left at its default: the same family starting its directions at
        :data:`PRETRAINED_INIT_RESULTANT` (what ``bayesianize(pretrained=True)`` builds with); else this one."""
        if self._hyperparameters["init_resultant"] is not None:
            return self
        return type(self)(**{**self._hyperparameters, "init_resultant": PRETRAINED_INIT_RESULTANT})

    @property
    def inductor_options(self) -> dict[str, Any]:
        """Double grouping: inductor's ``realize_opcount_threshold`` 8 (default 30), so that the column factor's
        per-column values (Wood's omega and sin(theta), the Householder scalars) are computed once into a buffer instead
        of inside the output pass for every row; 11-13% faster compiled steps on the CPU's MNIST MLP
        (``benchmarks/results/step-time/studies/ab_rdp_double_realize*.md``), while the row grouping and the Gaussian families
        were 1-1.5% slower with it (``ab_*_realize.md``)."""
        return {"realize_opcount_threshold": 8} if self.grouping == "double" else {}

    @property
    def groupings(self) -> tuple[str, ...]:
        """The groupings this family draws: ``("row", "column")`` for ``grouping="double"``, else ``(grouping,)``."""
        return ("row", "column") if self.grouping == "double" else (self.grouping,)

    def build(self, shape: torch.Size | tuple[int, ...], init: torch.Tensor | None = None) -> Any:  # type: ignore[override]
        """As :meth:`VariationalFamily.build`; biases, dense weights with one input or one output, and any weight whose
        groups would have dimension 1 get a MeanField (a convolution with one input channel keeps RDP: its single
        column group has dimension ``out * kh * kw``)."""
        shape = torch.Size(shape)
        ungroupable = len(shape) < 2 or any(_group_matrix_shape(shape, g)[1] < 2 for g in self.groupings)
        if ungroupable or (len(shape) == 2 and min(shape) == 1):
            if len(shape) >= 2:
                warnings.warn(
                    f"RadialDirectional: a weight of shape {tuple(shape)} has one input or one output and cannot be "
                    f"grouped; it falls back to MeanField(init_std={self.fallback_init_std})",
                    stacklevel=2,
                )
            return MeanField(init_std=self.fallback_init_std).build(shape, init)
        return super().build(shape, init)

    def _materialize(self, shape: torch.Size, init: torch.Tensor) -> None:
        dtype = init.dtype
        for grouping in self.groupings:
            prefix = _PREFIX[grouping]
            groups, dim = _group_matrix_shape(shape, grouping)
            if grouping == "column" and self.grouping == "double":
                direction = torch.full((groups, dim), 1.0 / math.sqrt(dim), dtype=dtype)
                radius = torch.full((groups,), math.sqrt(dim), dtype=dtype)
            else:
                matrix = _to_groups(init, grouping)
                radius = torch.linalg.vector_norm(matrix, dim=-1).clamp_min(1e-8)
                direction = matrix / radius[:, None]
            kappa = banerjee_concentration(dim, self.init_resultant)
            rho = inverse_softplus(self.init_log_std)
            setattr(self, f"{prefix}_direction", nn.Parameter(direction))
            rho_kappa = math.log(kappa) if self.concentration_param == "log" else inverse_softplus(kappa)
            rho_shape = () if self.shared_concentration else (groups,)
            setattr(self, f"{prefix}_concentration_rho", nn.Parameter(torch.full(rho_shape, rho_kappa, dtype=dtype)))
            # log r = (m_a + m_b + m_sa + m_sb) / 2: the local pair carries log(radius), the global pair starts at 0
            setattr(self, f"{prefix}_local_loc", nn.Parameter(radius.log()[:, None].expand(groups, 2).clone()))
            setattr(self, f"{prefix}_local_rho", nn.Parameter(torch.full((groups, 2), rho, dtype=dtype)))
            setattr(self, f"{prefix}_global_loc", nn.Parameter(torch.zeros(2, dtype=dtype)))
            setattr(self, f"{prefix}_global_rho", nn.Parameter(torch.full((2,), rho, dtype=dtype)))

    @torch.no_grad()
    def adapt_to_prior(self, prior: Any) -> None:
        """With ``radius_init="prior"`` and a :class:`RadialDirectionalPrior`: re-split each group's initial log
        radius over the four log-normal factors (see the class docstring); the sum of their locations, hence the
        weights at the mode and the mean, is unchanged."""
        if self.radius_init != "prior" or not isinstance(prior, RadialDirectionalPrior):
            return
        self._require_built()
        for grouping in self.groupings:
            local_loc, global_loc = self._param(grouping, "local_loc"), self._param(grouping, "global_loc")
            local_var = F.softplus(self._param(grouping, "local_rho")).square()
            global_var = F.softplus(self._param(grouping, "global_rho")).square()
            total = local_loc.sum(-1) + global_loc.sum()
            # argmin_m KL(LN(m, v) || Gamma(1/2, rate 1/c^2)) = log(c^2 / 2) - v/2; || InvGamma(1/2, 1): log 2 + v/2
            global_loc[0] = math.log(prior.global_scale**2 / 2) - global_var[0] / 2
            global_loc[1] = math.log(2.0) + global_var[1] / 2
            local_loc[:, 0] = math.log(prior.local_scale**2 / 2) - local_var[:, 0] / 2
            local_loc[:, 1] = total - local_loc[:, 0] - global_loc.sum()

    # -- per-grouping pieces ------------------------------------------------------------------------------
    def _param(self, grouping: str, name: str) -> torch.Tensor:
        return getattr(self, f"{_PREFIX[grouping]}_{name}")

    def mean_direction(self, grouping: str) -> torch.Tensor:
        """The vMF mean directions of one grouping, ``[groups, dim]`` unit rows."""
        return F.normalize(self._param(grouping, "direction"), dim=-1)

    def concentration(self, grouping: str) -> torch.Tensor:
        """The vMF concentration of one grouping: the layer's shared scalar, or ``[groups]`` with
        ``shared_concentration=False``."""
        rho = self._param(grouping, "concentration_rho")
        return rho.exp() if self.concentration_param == "log" else F.softplus(rho)

    def log_radius_moments(self, grouping: str, local_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of log r_g (``local_only``: of log z_g, the part that ranks groups), ``[groups]``."""
        local_loc, local_rho, global_loc, global_rho = (self._param(grouping, name) for name in _RADIUS_PARAMS)
        if local_only:
            return _log_radius_moments(local_loc, local_rho)
        return _log_radius_moments(local_loc, local_rho, global_loc, global_rho)

    def log_radius_mode(self, grouping: str) -> torch.Tensor:
        """Log of the mode of each group's LOCAL radius log-normal, ``m - v`` (the pruning score, paper section 3.3)."""
        mean, variance = self.log_radius_moments(grouping, local_only=True)
        return mean - variance

    def _vmf(self, grouping: str) -> VonMisesFisher:
        direction = self.mean_direction(grouping)
        kappa = self.concentration(grouping).expand(direction.shape[0])
        return VonMisesFisher(direction, kappa, ratio_method=self.ratio_method, validate_args=False)  # type: ignore[arg-type]

    def _sample_group(self, grouping: str, sample_shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One grouping's factor ``r_g u_g`` for every group, ``sample_shape + weight shape``, and its score term.

        The direction parameter is used unnormalised (:func:`~varbnn.distributions.vmf.householder_sample` folds the
        normalisation and the radius into per-row scalars), so no d-sized tensor is built besides the noise and the
        output; Wood's sampler and the score work on one value per group."""
        param = self._param(grouping, "direction")
        groups, dim = param.shape
        concentration = self.concentration(grouping).to(_work_dtype(param.device))
        kappa = concentration.expand(sample_shape + (groups,))
        score = resultant = None
        with_score = self.score_correction and torch.is_grad_enabled()
        if with_score:  # A_d(kappa) from the evaluation rsample() made for this draw and the step's KL
            cached = self._normalizer_cache
            resultant = cached[1][grouping][1] if cached is not None else self.normalizers()[grouping][1]
        omega, sin_theta, score_terms = wood_sample(dim, kappa, 1000, with_score, self.ratio_method, resultant)  # type: ignore[arg-type]
        if score_terms is not None:
            score = score_terms.sum().to(param.dtype) / max(1, math.prod(sample_shape))  # score of the draws' average
        noise = philox.randn(sample_shape + (groups,), dtype=param.dtype, device=param.device)
        local_loc, local_rho, global_loc, global_rho = (self._param(grouping, name) for name in _RADIUS_PARAMS)
        if functorch_active():  # e.g. predict's vmap over draws: plain operations (the Function is not transform-ready)
            radius = _log_normal_radius(local_loc, local_rho, global_loc, global_rho, noise)
        else:
            radius = _LogNormalRadius.apply(local_loc, local_rho, global_loc, global_rho, noise)
        tangent = None
        if grouping == "column" and len(self._require_built()) == 2:  # a dense weight's columns: drawn in the weight's
            # layout, so the factor's output pass and the product with the row factor (double grouping) run along
            # memory (benchmarks/results/step-time); i.i.d. draws, the same distribution
            tangent = philox.randn(sample_shape + (dim, groups), dtype=param.dtype, device=param.device).transpose(-1, -2)
        matrix = householder_sample(param, omega, sin_theta, radius, normalize=True, noise=tangent)
        return _from_groups(matrix, self._require_built(), grouping), score

    def _point(self, grouping: str, kind: str) -> torch.Tensor:
        mean, variance = self.log_radius_moments(grouping)
        direction = self.mean_direction(grouping)
        if kind == "mean":
            radius = torch.exp(mean + 0.5 * variance)
            direction = direction * self._vmf(grouping).mean_resultant_length[:, None]
        else:
            radius = torch.exp(mean - variance)
        return _from_groups(direction * radius[:, None], self._require_built(), grouping)

    # -- the distribution -------------------------------------------------------------------------------
    def distribution(self) -> Distribution:
        raise NotImplementedError(
            "RadialDirectional has no torch distribution over the whole tensor; use rsample(), mean, mode and its "
            "closed-form KL against RadialDirectionalPrior"
        )

    @property
    def mean(self) -> torch.Tensor:
        """E[W]: the product over groupings of E[r] A_d(kappa) mu (the factors are independent)."""
        out = self._point(self.groupings[0], "mean")
        for grouping in self.groupings[1:]:
            out = out * self._point(grouping, "mean")
        return out

    @property
    def mode(self) -> torch.Tensor:
        """The product over groupings of each factor's mode (radius mode exp(m - v) times the mean direction)."""
        out = self._point(self.groupings[0], "mode")
        for grouping in self.groupings[1:]:
            out = out * self._point(grouping, "mode")
        return out

    def rsample(self, sample_shape: torch.Size | tuple[int, ...] = torch.Size()) -> torch.Tensor:
        """Reparameterised weight samples ``sample_shape + shape``; records the vMF score term (see module doc)."""
        self._require_built()
        sample_shape = torch.Size(sample_shape)
        if self.score_correction and torch.is_grad_enabled():
            # The score needs A_d(kappa) of every grouping, and the step's KL needs (log C_d, A_d): one fused Bessel
            # evaluation for all groupings serves both (kept for the next KL, see take_normalizers).
            self._normalizer_cache = (self._concentration_keys(), self.normalizers())
        weight, score = self._sample_group(self.groupings[0], sample_shape)
        for grouping in self.groupings[1:]:
            other, other_score = self._sample_group(grouping, sample_shape)
            weight = weight * other
            if other_score is not None:
                score = other_score if score is None else score + other_score
        self.pending_score = score
        return weight

    def take_score(self) -> torch.Tensor | None:
        """The score term of the last draw (value 0; gradient = the rejection correction), cleared once taken."""
        score, self.pending_score = self.pending_score, None
        return score

    def _concentration_keys(self) -> tuple[tuple[int, int], ...]:
        if torch.compiler.is_compiling():
            # a compiled step traces the draw and the KL as one function: the concentrations cannot change between
            # them (and tensor versions cannot be traced)
            return ()
        keys = []
        for grouping in self.groupings:
            rho = self._param(grouping, "concentration_rho")
            keys.append((id(rho), rho._version))
        return tuple(keys)

    def normalizers(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{grouping: (log C_d(kappa), A_d(kappa))}`` of the directions, in the working precision and differentiable in
        the concentrations, from ONE fused Bessel evaluation over the groupings (double grouping: the row and the
        column sphere together); with ``shared_concentration=False`` one evaluation per grouping, over its groups."""
        directions = [self._param(g, "direction") for g in self.groupings]
        work = _work_dtype(directions[0].device)
        kappas = [self.concentration(g).to(work) for g in self.groupings]
        if not self.shared_concentration:  # one evaluation per grouping, over its groups
            return {
                g: log_normalizer_and_resultant(d.shape[1], k, self.ratio_method)  # type: ignore[arg-type]
                for g, d, k in zip(self.groupings, directions, kappas)
            }
        if len(kappas) == 1:
            log_c, ratio = log_normalizer_and_resultant(directions[0].shape[1], kappas[0], self.ratio_method)  # type: ignore[arg-type]
            return {self.groupings[0]: (log_c, ratio)}
        key = (directions[0].device, work)
        dims = self._dims_cache.get(key)
        if dims is None:
            dims = torch.tensor([float(d.shape[1]) for d in directions], dtype=work, device=key[0])
            if not torch.compiler.is_compiling():  # made once per device, so no host-to-device copy per step; while
                self._dims_cache[key] = dims  # traced a graph constant (filling the cache would change the guards)
        log_c, ratio = log_normalizer_and_resultant(dims, torch.stack(kappas), self.ratio_method)  # type: ignore[arg-type]
        return {g: (log_c[i], ratio[i]) for i, g in enumerate(self.groupings)}

    def take_normalizers(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`normalizers`, taken from the last draw if it evaluated them for the current concentrations (once: a
        second KL evaluates again, so no graph is ever differentiated twice)."""
        cached, self._normalizer_cache = self._normalizer_cache, None
        if cached is not None and cached[0] == self._concentration_keys() and torch.is_grad_enabled():
            return cached[1]
        return self.normalizers()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_normalizer_cache"] = None  # graph-connected tensors cannot be deep-copied or pickled
        state["_dims_cache"] = {}
        state["pending_score"] = None
        return state


@torch.compiler.assume_constant_result
def _log_normalizer_constant(dim: int, kappa: float) -> float:
    """:func:`_log_normalizer_value`, which torch.compile evaluates while tracing and keeps as a constant."""
    return _log_normalizer_value(dim, kappa)


@functools.lru_cache(maxsize=256)
def _log_normalizer_value(dim: int, kappa: float) -> float:
    """log C_d(kappa) of a fixed prior concentration, computed once (float64)."""
    log_i = float(log_bessel_iv_over_power(dim / 2 - 1, torch.tensor(kappa, dtype=torch.float64), validate=False))
    return -0.5 * dim * math.log(2 * math.pi) - log_i


def _direction_kl(
    family: RadialDirectional, grouping: str, prior: RadialDirectionalPrior, normalizer: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """Sum over the groups of KL(vMF(mu_g, kappa_q) || vMF(mu_g, kappa_p)) (tied prior mean) or of KL(vMF || uniform):
    ``(kappa_q - kappa_p) A_d(kappa_q) + log C_d(kappa_q) - log C_d(kappa_p)``, the same for every group under a
    shared concentration (each group's own, summed, with ``shared_concentration=False``); with kappa_p = 0,
    ``log C_d(0) = -log |S^{d-1}|``. ``normalizer`` is (log C_d(kappa_q), A_d(kappa_q)) from the family's Bessel
    evaluation of the step (:meth:`RadialDirectional.take_normalizers`; none in backward)."""
    direction = family._param(grouping, "direction")  # only its shape and dtype: no normalisation needed
    groups, dim = direction.shape
    kappa_q = family.concentration(grouping).to(_work_dtype(direction.device))
    kappa_p = prior.direction_concentration(dim)
    log_c_q, ratio = normalizer
    log_c_p = -_log_sphere_area(dim) if kappa_p == 0.0 else _log_normalizer_constant(dim, float(kappa_p))
    kl = (kappa_q - kappa_p) * ratio + log_c_q - log_c_p
    return (kl.sum() if kl.dim() else groups * kl).to(direction.dtype)  # per group, or the same for every group


def _kl_grouping(
    family: RadialDirectional, grouping: str, prior: RadialDirectionalPrior, normalizer: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    kl = _direction_kl(family, grouping, prior, normalizer)
    for part, scale in (("local", prior.local_scale), ("global", prior.global_scale)):
        loc = family._param(grouping, f"{part}_loc")
        sigma = F.softplus(family._param(grouping, f"{part}_rho"))
        # z^2 = a b with a ~ Gamma(1/2, rate 1/scale^2) and b ~ InvGamma(1/2, scale 1)
        kl = kl + half_cauchy_pair_kl(loc, sigma, float(scale) ** -2)
    return kl


@register_family_kl(RadialDirectional, RadialDirectionalPrior)
def _rdp_kl(family: RadialDirectional, prior: RadialDirectionalPrior) -> torch.Tensor:
    """Direction (vMF) + local and global radius (log-normal vs Gamma / InvGamma) KLs of every grouping (eq. 12)."""
    normalizers = family.take_normalizers()
    total = _kl_grouping(family, family.groupings[0], prior, normalizers[family.groupings[0]])
    for grouping in family.groupings[1:]:
        total = total + _kl_grouping(family, grouping, prior, normalizers[grouping])
    return total


@register_family_kl(RadialDirectional, Prior)
def _rdp_other_prior(family: RadialDirectional, prior: Prior) -> torch.Tensor:
    raise ValueError(
        f"RadialDirectional needs a RadialDirectionalPrior (half-Cauchy radii, vMF directions), got {type(prior).__name__}; "
        "e.g. bayesianize(model, RadialDirectional(), RadialDirectionalPrior())"
    )


@register_family_kl(VariationalFamily, RadialDirectionalPrior)
def _fallback_kl(family: VariationalFamily, prior: RadialDirectionalPrior) -> torch.Tensor:
    """Biases and ungroupable weights: KL against the prior's ``fallback``."""
    return family_kl(family, prior.fallback)
