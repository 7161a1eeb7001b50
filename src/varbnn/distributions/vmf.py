"""The von Mises-Fisher distribution on the unit sphere S^{d-1}, and the uniform distribution on it.

``VonMisesFisher(loc, concentration)`` has density ``C_d(kappa) exp(kappa * loc . x)`` with respect to the surface
measure, ``log C_d(kappa) = (d/2 - 1) log kappa - (d/2) log(2 pi) - log I_{d/2-1}(kappa)``. Everything that
involves Bessel functions goes through :mod:`varbnn.special` in float64, so it is finite and accurate for d up to
1e4 and beyond and kappa from ~0 to 1e5+, in float32 and float64.

Sampling is Wood's (1994) rejection sampler for the component ``omega = loc . x`` (vectorised over every
sample and batch element, a bounded number of rounds), a uniform tangent direction, and a Householder reflection
that maps the first basis vector to ``loc`` (chosen so that it never divides by a small number); that machinery
lives in :mod:`varbnn.distributions.vmf_sampling`, and its public names are re-exported here.

Gradients of ``rsample``: exact with respect to ``loc``; with respect to ``concentration`` they flow through the
accepted proposal ``omega = h(eps, kappa)`` with ``eps`` held fixed. That is the "reparameterisation" part of
Naesseth et al.'s (2017) rejection-sampling estimator; its "correction" part is the score of the accepted
proposal's density. :meth:`VonMisesFisher.rsample_with_score` returns that score as a tensor whose value is 0
and whose gradient is the score, so that

    w, score = q.rsample_with_score()
    f = loss(w)                          # one value per sample
    (f + f.detach() * score).mean().backward()

gives an unbiased gradient of ``E_q[loss]`` (Oh et al. 2020, supplementary eq. 20; tested in
``tests/test_vmf.py`` against the exact derivative of ``E[loc . w] = A_d(kappa)``). The correction vanishes as
Wood's acceptance rate approaches one (large kappa or large d), which is the regime of Bayesian neural network
weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.distributions import Distribution, constraints, register_kl
from torch.distributions.utils import lazy_property
from torch.types import _size

from varbnn._checks import as_int, as_positive_int
from varbnn.distributions.vmf_sampling import (  # noqa: F401  (re-exported: varbnn.distributions.vmf.<name> as before)
    POOL_EXTRA,
    POOL_FACTOR,
    PROPOSALS_FIRST_ROUND,
    PROPOSALS_FIXED,
    PROPOSALS_PER_ROUND,
    RejectionSamplingError,
    _compact,
    fixed_rejection_rounds,
    householder_sample,
    wood_accepted_proposals,
    wood_constants,
    wood_sample,
)
from varbnn.special import (
    RATIO_METHODS,
    RatioMethod,
    _work_dtype,
    bessel_ratio,
    log_bessel_iv_over_power,
    log_bessel_iv_over_power_and_ratio,
)

__all__ = [
    "VonMisesFisher",
    "HypersphericalUniform",
    "unit_sphere",
    "RejectionSamplingError",
    "householder_sample",
    "wood_accepted_proposals",
    "wood_sample",
]


def _norm_tolerance(dtype: torch.dtype) -> float:
    return 1e-9 if dtype == torch.float64 else 1e-4


class _UnitSphere(constraints.Constraint):
    """Vectors of unit Euclidean norm along the last dimension (tolerance 1e-4 in float32, 1e-9 in float64)."""

    event_dim = 1

    def check(self, value: Tensor) -> Tensor:
        return (torch.linalg.vector_norm(value, dim=-1) - 1).abs() <= _norm_tolerance(value.dtype)

    def __repr__(self) -> str:
        return "UnitSphere()"


unit_sphere = _UnitSphere()


def log_normalizer_and_resultant(
    dim: int | Tensor, kappa: Tensor, ratio_method: RatioMethod = "accurate"
) -> tuple[Tensor, Tensor]:
    """``(log C_d(kappa), A_d(kappa))`` of a vMF on S^{d-1}, in ``kappa``'s dtype, from one fused Bessel evaluation (its
    backward needs none): ``log C_d = -(d/2) log(2 pi) - log(I_{d/2-1}(kappa) / kappa^{d/2-1})``, ``A_d = I_{d/2} /
    I_{d/2-1}``. A concentration expanded from one value is evaluated once; ``dim`` may be a tensor broadcastable with
    ``kappa`` (several spheres in one evaluation). ``ratio_method="bounds"`` and ``"bounds-amos"`` take A_d from the
    paper's bounds instead."""
    shape, work = kappa.shape, _compact(kappa)
    log_iv, ratio = log_bessel_iv_over_power_and_ratio(dim / 2 - 1, work, validate=False)
    if ratio_method != "accurate":
        ratio = bessel_ratio(dim / 2, work, method=ratio_method, validate=False)
    log_c = -0.5 * dim * math.log(2 * math.pi) - log_iv
    return log_c.expand(shape), ratio.expand(shape)


def _log_sphere_area(dim: int) -> float:
    """log of the surface area of S^{dim-1}: log(2 pi^{dim/2} / Gamma(dim/2))."""
    return math.log(2.0) + 0.5 * dim * math.log(math.pi) - math.lgamma(0.5 * dim)


class VonMisesFisher(Distribution):
    """von Mises-Fisher distribution on the unit sphere in R^d.

    :param loc: mean direction(s), shape ``[..., d]`` with d >= 2, unit norm along the last dimension.
    :param concentration: kappa > 0, shape broadcastable to ``loc.shape[:-1]``.
    :param ratio_method: how ``A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa)`` is computed for ``mean``,
        ``entropy``, KLs and gradients: ``"accurate"`` (default) or the paper's ``"bounds"`` (see
        :func:`varbnn.special.bessel_ratio`).
    :param max_rejection_rounds: rounds of Wood's sampler on the CPU (8 proposals per element, then 4 per pending
        element; with one concentration for all, a pool of ~1.6 proposals per missing draw) before
        :class:`RejectionSamplingError` (default 1000; the acceptance rate is above 0.5 for every d and kappa, so more
        than ~15 rounds never happens in practice). Off the CPU (compiled or not) and under torch.func
        transforms the sampler draws 32 proposals at once instead and never raises (an element with none
        accepted, probability <= 2e-14, keeps its last proposal; see ``PROPOSALS_FIXED``).
    :param validate_args: as in ``torch.distributions``; when on (the default), a non-unit ``loc`` or a
        non-positive / non-finite ``concentration`` raises ``ValueError`` naming the argument.
    """

    arg_constraints = {"loc": unit_sphere, "concentration": constraints.positive}
    support = unit_sphere
    has_rsample = True

    def __init__(
        self,
        loc: Tensor,
        concentration: Tensor | float,
        ratio_method: RatioMethod = "accurate",
        max_rejection_rounds: int = 1000,
        validate_args: bool | None = None,
    ) -> None:
        if not isinstance(loc, Tensor) or loc.dim() < 1:
            raise ValueError("VonMisesFisher: loc must be a tensor of shape [..., d] with d >= 2")
        if loc.shape[-1] < 2:
            raise ValueError(f"VonMisesFisher: loc's last dimension d must be >= 2 (the sphere S^(d-1)), got {loc.shape[-1]}")
        if ratio_method not in RATIO_METHODS:
            raise ValueError(f"VonMisesFisher: unknown ratio_method {ratio_method!r}; choose one of {RATIO_METHODS}")
        max_rejection_rounds = as_positive_int(max_rejection_rounds, "max_rejection_rounds", owner="VonMisesFisher")
        if not isinstance(concentration, Tensor):
            concentration = torch.as_tensor(concentration, dtype=loc.dtype, device=loc.device)
        batch_shape = torch.broadcast_shapes(loc.shape[:-1], concentration.shape)
        self.loc = loc.expand(*batch_shape, loc.shape[-1])
        self.concentration = concentration.expand(batch_shape)
        self.ratio_method: RatioMethod = ratio_method
        self.max_rejection_rounds = max_rejection_rounds
        if validate_args is not False and (validate_args or Distribution._validate_args):
            self._check_parameters()
        super().__init__(batch_shape, loc.shape[-1:], validate_args=False)
        self._validate_args = bool(validate_args) if validate_args is not None else Distribution._validate_args

    def _check_parameters(self) -> None:
        norms = torch.linalg.vector_norm(self.loc, dim=-1)
        if not bool(torch.all(torch.isfinite(norms))):
            raise ValueError("VonMisesFisher: loc contains NaN or inf")
        worst = float((norms - 1).abs().max()) if norms.numel() else 0.0
        if worst > _norm_tolerance(self.loc.dtype):
            raise ValueError(
                f"VonMisesFisher: loc must have unit norm along its last dimension (max |norm - 1| = {worst:.3g}); "
                "normalise it first, e.g. torch.nn.functional.normalize(loc, dim=-1)"
            )
        kappa = self.concentration
        if not bool(torch.all(torch.isfinite(kappa) & (kappa > 0))):
            raise ValueError(
                f"VonMisesFisher: concentration must be finite and > 0 (got min {float(kappa.min()):.4g}, "
                f"max {float(kappa.max()):.4g})"
            )

    # ------------------------------------------------------------------ basic quantities

    @property
    def dim(self) -> int:
        """d, the dimension of the ambient space (the sphere is S^{d-1})."""
        return int(self.loc.shape[-1])

    def _kappa_work(self) -> Tensor:
        return self.concentration.to(_work_dtype(self.concentration.device))

    @lazy_property
    def mean_resultant_length(self) -> Tensor:
        """A_d(kappa) = E[loc . x] = I_{d/2}(kappa) / I_{d/2-1}(kappa)."""
        kappa = self._kappa_work()
        ratio = bessel_ratio(self.dim / 2, _compact(kappa), method=self.ratio_method, validate=False)
        return ratio.expand(kappa.shape).to(self.loc.dtype)

    def _log_normalizer_work(self) -> Tensor:
        """log C_d(kappa) in the working precision; its kappa-gradient is exactly -A_d(kappa)."""
        d = self.dim
        kappa = self._kappa_work()
        log_iv = log_bessel_iv_over_power(d / 2 - 1, _compact(kappa), validate=False).expand(kappa.shape)
        return -0.5 * d * math.log(2 * math.pi) - log_iv

    def log_normalizer(self) -> Tensor:
        """log C_d(kappa), the log of the density's normalising constant (w.r.t. surface measure)."""
        return self._log_normalizer_work().to(self.loc.dtype)

    @property
    def mean(self) -> Tensor:
        """``E[x] = A_d(kappa) loc`` (shorter than a unit vector: the directions spread around ``loc``)."""
        return self.mean_resultant_length.unsqueeze(-1) * self.loc

    @property
    def mode(self) -> Tensor:
        """``loc``, where the density is largest."""
        return self.loc

    def expand(self, batch_shape: _size, _instance: VonMisesFisher | None = None) -> VonMisesFisher:
        new = self._get_checked_instance(VonMisesFisher, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(*batch_shape, self.dim)
        new.concentration = self.concentration.expand(batch_shape)
        new.ratio_method = self.ratio_method
        new.max_rejection_rounds = self.max_rejection_rounds
        super(VonMisesFisher, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value: Tensor) -> Tensor:
        """``log q(x) = kappa loc . x + log C_d(kappa)`` for unit vectors ``x`` ``[..., d]`` (Oh et al. 2020, eq. 4;
        w.r.t. the surface measure of S^{d-1})."""
        if self._validate_args:
            self._validate_sample(value)
        return self.concentration * (value * self.loc).sum(-1) + self.log_normalizer()

    def entropy(self) -> Tensor:
        """``H[q] = -kappa A_d(kappa) - log C_d(kappa)`` (nats; from ``E[loc . x] = A_d(kappa)``)."""
        kappa = self._kappa_work()
        log_c, a = log_normalizer_and_resultant(self.dim, kappa, self.ratio_method)
        return (-kappa * a - log_c).to(self.loc.dtype)

    # ------------------------------------------------------------------ sampling

    def _sample(self, sample_shape: torch.Size, score: bool) -> tuple[Tensor, Tensor | None]:
        shape = self._extended_shape(sample_shape)[:-1]
        kappa = self._kappa_work().expand(shape)
        omega, sin_theta, score_terms = wood_sample(self.dim, kappa, self.max_rejection_rounds, score, self.ratio_method)
        return householder_sample(self.loc, omega, sin_theta), score_terms

    def rsample(self, sample_shape: _size = torch.Size()) -> Tensor:
        """Samples of shape ``sample_shape + batch_shape + (d,)``; see the module docstring for the gradients."""
        return self._sample(torch.Size(sample_shape), score=False)[0]

    def rsample_with_score(self, sample_shape: _size = torch.Size()) -> tuple[Tensor, Tensor]:
        """Samples and the rejection-sampling correction ``score`` (value 0, shape ``sample_shape + batch_shape``).

        ``grad(f(w) + f(w).detach() * score)`` is an unbiased estimate of ``grad E_q[f]``: ``score``'s gradient is
        ``d/dkappa log pi(eps; kappa)``, the score of the accepted proposal's density (Naesseth et al. 2017), i.e.
        ``d/dkappa [log q(omega; kappa) + log |d omega / d eps|]`` with ``eps`` fixed (Oh et al. 2020, supp. eq. 20).
        """
        sample, score = self._sample(torch.Size(sample_shape), score=True)
        assert score is not None
        return sample, score.to(self.loc.dtype)

    def __repr__(self) -> str:
        return f"VonMisesFisher(dim={self.dim}, batch_shape={tuple(self.batch_shape)}, ratio_method={self.ratio_method!r})"


class HypersphericalUniform(Distribution):
    """The uniform distribution on the unit sphere S^{dim-1} in R^dim (a vMF with kappa -> 0).

    :param dim: d >= 2.
    :param batch_shape: optional batch shape.
    :param device: device of samples and log-densities (default: the CPU).
    :param dtype: dtype of samples and log-densities (default: torch's default dtype).
    :param validate_args: as in ``torch.distributions``.
    """

    arg_constraints: dict[str, constraints.Constraint] = {}
    support = unit_sphere
    has_rsample = False

    def __init__(
        self,
        dim: int,
        batch_shape: _size = torch.Size(),
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        validate_args: bool | None = None,
    ) -> None:
        dim = as_int(dim, "dim", low=2, owner="HypersphericalUniform")
        self._dim = dim
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._dtype = dtype or torch.get_default_dtype()
        super().__init__(torch.Size(batch_shape), torch.Size([dim]), validate_args=validate_args)

    @property
    def dim(self) -> int:
        """d, the dimension of the ambient space (the sphere is S^{d-1})."""
        return self._dim

    def log_surface_area(self) -> float:
        """``log |S^{d-1}| = log(2 pi^{d/2} / Gamma(d/2))``."""
        return _log_sphere_area(self._dim)

    def expand(self, batch_shape: _size, _instance: HypersphericalUniform | None = None) -> HypersphericalUniform:
        return HypersphericalUniform(self._dim, batch_shape, self._device, self._dtype, self._validate_args)

    @property
    def mean(self) -> Tensor:
        return torch.zeros(self._extended_shape(), device=self._device, dtype=self._dtype)

    def sample(self, sample_shape: _size = torch.Size()) -> Tensor:
        x = torch.randn(self._extended_shape(torch.Size(sample_shape)), device=self._device, dtype=self._dtype)
        return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)

    def log_prob(self, value: Tensor) -> Tensor:
        """``-log |S^{d-1}|`` for every unit vector ``value`` ``[..., d]``."""
        if self._validate_args:
            self._validate_sample(value)
        return torch.full(value.shape[:-1], -self.log_surface_area(), device=value.device, dtype=value.dtype)

    def entropy(self) -> Tensor:
        """``log |S^{d-1}|``, the largest entropy on the sphere."""
        return torch.full(self.batch_shape, self.log_surface_area(), device=self._device, dtype=self._dtype)

    def __repr__(self) -> str:
        return f"HypersphericalUniform(dim={self._dim}, batch_shape={tuple(self.batch_shape)})"


def _check_same_dim(p: Distribution, q: Distribution) -> None:
    if p.event_shape != q.event_shape:
        raise ValueError(f"KL between distributions on spheres of different dimension: {p.event_shape} vs {q.event_shape}")


@register_kl(VonMisesFisher, VonMisesFisher)
def _kl_vmf_vmf(p: VonMisesFisher, q: VonMisesFisher) -> Tensor:
    """(kappa_p - kappa_q mu_q . mu_p) A_d(kappa_p) + log C_d(kappa_p) - log C_d(kappa_q) (supp. eq. 46)."""
    _check_same_dim(p, q)
    kp, kq = p._kappa_work(), q._kappa_work()
    log_c_p, a = log_normalizer_and_resultant(p.dim, kp, p.ratio_method)
    cos = (p.loc * q.loc).sum(-1).to(kp.dtype)
    out = (kp - kq * cos) * a + log_c_p - q._log_normalizer_work()
    return out.to(p.loc.dtype)


@register_kl(VonMisesFisher, HypersphericalUniform)
def _kl_vmf_uniform(p: VonMisesFisher, q: HypersphericalUniform) -> Tensor:
    """kappa A_d(kappa) + log C_d(kappa) + log |S^{d-1}| = log |S^{d-1}| - H(p)."""
    _check_same_dim(p, q)
    kp = p._kappa_work()
    log_c, a = log_normalizer_and_resultant(p.dim, kp, p.ratio_method)
    return (kp * a + log_c + q.log_surface_area()).to(p.loc.dtype)


@register_kl(HypersphericalUniform, VonMisesFisher)
def _kl_uniform_vmf(p: HypersphericalUniform, q: VonMisesFisher) -> Tensor:
    """-log |S^{d-1}| - log C_d(kappa): E_uniform[loc . x] = 0."""
    _check_same_dim(p, q)
    return (-p.log_surface_area() - q._log_normalizer_work()).to(q.loc.dtype)


@register_kl(HypersphericalUniform, HypersphericalUniform)
def _kl_uniform_uniform(p: HypersphericalUniform, q: HypersphericalUniform) -> Tensor:
    _check_same_dim(p, q)
    return torch.zeros(torch.broadcast_shapes(p.batch_shape, q.batch_shape), device=p._device, dtype=p._dtype)
