"""Priors over weight tensors.

A prior is a small ``nn.Module`` holding its parameters as buffers (so they move with the model and are saved
in its ``state_dict``) and producing a torch distribution over a whole tensor with
:meth:`Prior.distribution`. One prior object may be given to many tensors (``bayesianize`` does that when it
is passed one instance): then an *adaptive* prior pools all of them when it sets its parameters to their
closed-form optimum (Graves 2011 uses one prior for all the weights of a network).

Adaptive priors (``adaptive=True``, or ``"loc"`` / ``"scale"`` to adapt one parameter only) are updated by
:func:`update_adaptive_priors`, which ``varbnn.fit`` calls after every optimiser step:

* Normal prior, any posterior with first two moments (delta or Gaussian), Graves 2011 eq. (8) and (15):
  ``loc = mean_i mu_i``, ``scale^2 = mean_i [sigma_i^2 + (mu_i - loc)^2]``.
* Laplace prior, delta posterior, Graves 2011 eq. (7): ``loc = median_i w_i``, ``scale = mean_i |w_i - loc|``.

Because the KL is minimised exactly over the prior parameters, the gradient w.r.t. the posterior at the
optimum equals the gradient of the full minimised objective (envelope theorem), so the prior needs no
gradient of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn
from torch.distributions import Distribution, Independent
from torch.distributions import Laplace as _TorchLaplace
from torch.distributions import Normal as _TorchNormal

from varbnn._checks import ArgumentTypeError, as_float_in
from varbnn.distributions import ImproperUniform, Radial, ScaleMixtureNormal

if TYPE_CHECKING:
    from varbnn.families.base import VariationalFamily

__all__ = [
    "Prior",
    "Normal",
    "Laplace",
    "ScaleMixture",
    "Uniform",
    "RadialDirectionalPrior",
    "RadialPrior",
    "banerjee_concentration",
    "PriorSpec",
    "as_prior",
    "update_adaptive_priors",
    "make_prior",
    "PRIORS",
]

Adaptive = bool | Literal["loc", "scale"]
_ADAPTIVE_CHOICES = (False, True, "loc", "scale")


def _as_tensor(value: float | torch.Tensor, name: str, owner: str, positive: bool = False) -> torch.Tensor:
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise ArgumentTypeError(f"{owner}: {name} must be a number or a tensor of numbers, got a bool ({value!r})")
    try:
        tensor = torch.as_tensor(value, dtype=torch.get_default_dtype()).detach().clone()
    except (TypeError, ValueError, RuntimeError):
        raise ArgumentTypeError(
            f"{owner}: {name} must be a number or a tensor of numbers, got {type(value).__name__} ({value!r})"
        ) from None
    if not torch.isfinite(tensor).all():  # (a number beyond the default dtype's range is inf there)
        raise ValueError(f"{owner}: {name} must be finite, got {value!r}")
    if positive and not (tensor > 0).all():
        raise ValueError(f"{owner}: {name} must be > 0, got {value!r}")
    return tensor


def _parse_adaptive(adaptive: Adaptive, owner: str) -> frozenset[str]:
    if adaptive is True:
        return frozenset({"loc", "scale"})
    if adaptive is False:
        return frozenset()
    if adaptive in ("loc", "scale"):
        return frozenset({str(adaptive)})
    raise ValueError(f"{owner}: adaptive must be one of {_ADAPTIVE_CHOICES}, got {adaptive!r}")


class Prior(nn.Module):
    """Base class: a distribution over one weight tensor, optionally adaptive (empirical Bayes).

    A subclass implements :meth:`distribution` (the prior over a tensor of a given shape, one event) and, if it can
    be adaptive, :meth:`update_` (the closed-form optimum of its parameters given the posteriors that share it).
    Its parameters are buffers, so they move with ``.to()`` and are saved in the model's ``state_dict``.
    """

    adaptive_fields: frozenset[str] = frozenset()
    """The parameters :func:`update_adaptive_priors` sets (e.g. ``{"loc", "scale"}``); empty when not adaptive."""

    @property
    def adaptive(self) -> bool:
        """Whether :func:`update_adaptive_priors` changes this prior."""
        return bool(self.adaptive_fields)

    def distribution(self, shape: torch.Size | Sequence[int]) -> Distribution:
        """The prior over a tensor of ``shape`` as one event (``event_shape == shape``)."""
        raise NotImplementedError

    @torch.no_grad()
    def update_(self, posteriors: Sequence[VariationalFamily]) -> None:
        """Set the adaptive parameters to their closed-form optimum given ``posteriors``."""
        raise NotImplementedError(f"{type(self).__name__} has no adaptive form")

    def _check_scalar_for_adaptive(self) -> None:
        for name in self.adaptive_fields:
            if getattr(self, name).dim() != 0:
                raise ValueError(f"{type(self).__name__}: an adaptive {name} must be a scalar")


PriorSpec = Prior | Distribution | Callable[[str], Prior | Distribution]
"""What layers and ``bayesianize`` accept as a prior: one shared instance, or a factory called with the
qualified name of each tensor (e.g. ``"fc1.weight"``) that returns its own prior. A torch ``Normal`` or
``Laplace`` with scalar parameters stands for the varbnn prior of the same name (see :func:`as_prior`)."""


def _pooled_moments(posteriors: Sequence[VariationalFamily]) -> tuple[torch.Tensor, torch.Tensor]:
    means, variances = [], []
    for posterior in posteriors:
        mean, variance = posterior.moments()
        means.append(mean.detach().reshape(-1))
        variances.append(variance.detach().reshape(-1))
    return torch.cat(means), torch.cat(variances)


class _LocScalePrior(Prior):
    """A location-scale prior, i.i.d. over the tensor (or elementwise if loc/scale are tensors)."""

    loc: torch.Tensor
    scale: torch.Tensor
    _torch_distribution: type[Distribution]

    def __init__(self, loc: float | torch.Tensor = 0.0, scale: float | torch.Tensor = 1.0, adaptive: Adaptive = False):
        super().__init__()
        owner = f"{type(self).__name__} prior"
        self.register_buffer("loc", _as_tensor(loc, "loc", owner))
        self.register_buffer("scale", _as_tensor(scale, "scale", owner, positive=True))
        self.adaptive_fields = _parse_adaptive(adaptive, owner)
        self._check_scalar_for_adaptive()

    def distribution(self, shape: torch.Size | Sequence[int]) -> Distribution:
        shape = torch.Size(shape)
        base = self._torch_distribution(self.loc.expand(shape), self.scale.expand(shape), validate_args=False)  # type: ignore[call-arg, arg-type]
        return Independent(base, len(shape), validate_args=False)

    def extra_repr(self) -> str:
        return _repr_params(self, ("loc", "scale"))


class Normal(_LocScalePrior):
    """Gaussian prior ``N(loc, scale^2)``, i.i.d. over the tensor (or elementwise if ``loc``/``scale`` are tensors):
    ``log p(w) = sum_i [-(w_i - loc)^2 / (2 scale^2) - log(sqrt(2 pi) scale)]``.

    With a Gaussian posterior the KL is Graves 2011 eq. 13 (closed form); with a delta posterior the complexity cost
    is ``-log p(w)``, L2 regularisation (eq. 8). Adaptive: after every step ``loc = mean_i mu_i`` and
    ``scale^2 = mean_i [sigma_i^2 + (mu_i - loc)^2]`` over every tensor sharing this prior (eq. 15; for delta
    posteriors ``sigma_i = 0``, the optimum below eq. 8).

    :param loc: mean (default 0).
    :param scale: standard deviation, > 0 (default 1).
    :param adaptive: ``True`` to set both to their optimum (Graves 2011 eq. 15), ``"loc"`` or ``"scale"`` for one.
    """

    _torch_distribution = _TorchNormal

    @torch.no_grad()
    def update_(self, posteriors: Sequence[VariationalFamily]) -> None:
        means, variances = _pooled_moments(posteriors)
        loc = means.mean() if "loc" in self.adaptive_fields else self.loc
        if "loc" in self.adaptive_fields:
            self.loc.copy_(loc)
        if "scale" in self.adaptive_fields:
            second = (variances + (means - loc) ** 2).mean()
            self.scale.copy_(second.clamp_min(torch.finfo(second.dtype).tiny).sqrt())


class Laplace(_LocScalePrior):
    """Laplace prior with density ``exp(-|w - loc| / scale) / (2 scale)``, i.i.d. over the tensor; arguments as
    :class:`Normal` (``loc`` default 0, ``scale`` default 1, ``adaptive`` default False).

    With a delta posterior the complexity cost is ``sum_i |w_i - loc| / scale + W log(2 scale)``, L1 regularisation
    (Graves 2011 eq. 7); with other posteriors the KL has no registered closed form except Normal-vs-Laplace
    (registered by :mod:`varbnn.divergence`) and otherwise falls back to a Monte Carlo estimate.

    Adaptive (delta posteriors only, Graves 2011 eq. 7): ``loc`` = median weight (the lower median for an even
    count, which minimises the same L1 cost), ``scale`` = mean absolute deviation from ``loc``.
    """

    _torch_distribution = _TorchLaplace

    @torch.no_grad()
    def update_(self, posteriors: Sequence[VariationalFamily]) -> None:
        # the class's declaration (VariationalFamily.point_mass, True for the Delta family): no read of the device
        if not all(getattr(p, "point_mass", False) for p in posteriors):
            raise NotImplementedError(
                "an adaptive Laplace prior has a closed-form optimum only for Delta posteriors "
                "(Graves 2011 eq. 7); use an adaptive Normal prior with Gaussian posteriors"
            )
        means, _ = _pooled_moments(posteriors)
        loc = means.median() if "loc" in self.adaptive_fields else self.loc
        if "loc" in self.adaptive_fields:
            self.loc.copy_(loc)
        if "scale" in self.adaptive_fields:
            mad = (means - loc).abs().mean()
            self.scale.copy_(mad.clamp_min(torch.finfo(mad.dtype).tiny))


class ScaleMixture(Prior):
    """Blundell et al. (2015) scale-mixture prior ``pi N(0, scale1^2) + (1 - pi) N(0, scale2^2)``, i.i.d. over the
    tensor; never adaptive.

    ``log p(w) = logsumexp(log pi + log N(w | 0, scale1^2), log(1 - pi) + log N(w | 0, scale2^2))`` per element
    (no ``log(... + 1e-6)``). No closed-form KL exists: the KL against it is a Monte Carlo estimate
    (:func:`varbnn.divergence.monte_carlo_kl`).

    :param pi: weight of the first component, in (0, 1) (default 0.5).
    :param scale1: standard deviation of the first (wide) component, > 0 (default 1).
    :param scale2: standard deviation of the second (narrow) component, > 0 (default ``exp(-6)``).
    """

    mixture: torch.Tensor
    scale1: torch.Tensor
    scale2: torch.Tensor

    def __init__(self, pi: float = 0.5, scale1: float = 1.0, scale2: float = math.exp(-6)) -> None:
        super().__init__()
        pi = as_float_in(pi, "pi", 0.0, 1.0, low_open=True, high_open=True, owner="ScaleMixture prior")
        self.register_buffer("mixture", _as_tensor(pi, "pi", "ScaleMixture prior"))
        self.register_buffer("scale1", _as_tensor(scale1, "scale1", "ScaleMixture prior", positive=True))
        self.register_buffer("scale2", _as_tensor(scale2, "scale2", "ScaleMixture prior", positive=True))

    def distribution(self, shape: torch.Size | Sequence[int]) -> Distribution:
        return ScaleMixtureNormal(self.mixture, self.scale1, self.scale2, torch.Size(shape), validate_args=False)

    def extra_repr(self) -> str:
        return _repr_params(self, ("mixture", "scale1", "scale2"))


class Uniform(Prior):
    """Improper flat prior (``log p(w) = 0`` everywhere): with a :class:`~varbnn.families.Delta` posterior the KL
    term is 0 and training is maximum likelihood (Graves 2011 section 5.1). Against a posterior with a density the KL
    is ``-H[q]``, up to the infinite constant of an improper prior. Takes no arguments."""

    _anchor: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)

    def distribution(self, shape: torch.Size | Sequence[int]) -> Distribution:
        return ImproperUniform(torch.Size(shape), dtype=self._anchor.dtype, device=self._anchor.device)


def _repr_params(module: nn.Module, names: Iterable[str]) -> str:
    parts = []
    for name in names:
        value = getattr(module, name)
        parts.append(f"{name}={value.item():.4g}" if value.dim() == 0 else f"{name}=tensor{tuple(value.shape)}")
    fields: frozenset[str] = getattr(module, "adaptive_fields", frozenset())
    if fields:
        parts.append(f"adaptive={sorted(fields)}")
    return ", ".join(parts)


def update_adaptive_priors(model: nn.Module) -> int:
    """Set every adaptive prior in ``model`` to its optimum given the current posteriors (Graves 2011 section 6:
    "the prior parameters should be set to their optimal values after every update"); :func:`varbnn.train.fit` calls
    it after every optimiser step.

    Tensors that share one prior object are pooled (e.g. a Normal prior gets ``loc = mean_i mu_i`` and
    ``scale^2 = mean_i [sigma_i^2 + (mu_i - loc)^2]`` over all of them, eq. 15). Returns the number of priors updated.
    The walk over the model's layers is :func:`varbnn.nn.model.update_adaptive_priors`, imported on the first call
    (the layers are built on this module).
    """
    # documented lazy loading: the layers import the priors, so the priors import the layers only when called
    from varbnn.nn.model import update_adaptive_priors as _update_adaptive_priors

    return _update_adaptive_priors(model)


def banerjee_concentration(dim: int, resultant: float) -> float:
    """Banerjee et al.'s (2005) approximate maximum-likelihood vMF concentration on S^{dim-1} for a mean resultant
    length ``resultant`` in (0, 1): ``R (d - R^2) / (1 - R^2)``."""
    if not 0.0 < resultant < 1.0:
        raise ValueError(f"resultant must be in (0, 1), got {resultant!r}")
    if dim < 2:
        raise ValueError(f"dim must be >= 2, got {dim!r}")
    return resultant * (dim - resultant**2) / (1.0 - resultant**2)


class RadialDirectionalPrior(Prior):
    """Prior of the radial-and-directional posterior (Oh et al. 2020, eq. 7-8, 11) for each group (row or column)
    w_g of a weight matrix: ``||w_g|| = s * z_g`` with half-Cauchy ``s ~ C+(global_scale)`` (one per layer and
    grouping) and ``z_g ~ C+(local_scale)``, each written as sqrt(Gamma(1/2, rate 1/scale^2) * InvGamma(1/2, 1));
    and the direction ``w_g / ||w_g|| ~ vMF(mu_p, kappa_p)``.

    :param global_scale: scale of the layer-wide half-Cauchy factor ``s`` (default 1; the published LeNet-5 runs used
        1e-4 for strong sparsity).
    :param local_scale: scale of each group's half-Cauchy factor ``z_g`` (default 1: eq. 7's ``z ~ C+(1)``; the
        published LeNet-5 runs used 5e-3).
    :param direction: ``"tied"`` (default, as the published code): the prior mean direction of each group is the
        posterior's own mean, so the direction KL depends only on the concentrations -- empirical Bayes over
        mu_p, whose optimum is mu_q; ``"uniform"``: the uniform distribution on the sphere (kappa_p = 0).
    :param concentration: kappa_p for ``"tied"``; ``None`` (default) uses :func:`banerjee_concentration` with mean
        resultant length ``resultant`` for each group's dimension (the published code's choice, R = 0.9).
    :param resultant: the mean resultant length R in (0, 1) that sets kappa_p when ``concentration`` is ``None``
        (default 0.9).
    :param fallback: prior of tensors that are not radial-directional (biases, layers with one input or output,
        which fall back to MeanField); default ``Normal(0, 1)``.
    """

    DIRECTIONS = ("tied", "uniform")

    def __init__(
        self,
        global_scale: float = 1.0,
        local_scale: float = 1.0,
        direction: str = "tied",
        concentration: float | None = None,
        resultant: float = 0.9,
        fallback: Prior | None = None,
    ) -> None:
        super().__init__()
        owner = "RadialDirectionalPrior"
        global_scale = as_float_in(global_scale, "global_scale", 0.0, None, low_open=True, owner=owner)
        local_scale = as_float_in(local_scale, "local_scale", 0.0, None, low_open=True, owner=owner)
        if not isinstance(direction, str) or direction not in self.DIRECTIONS:
            raise ValueError(f"RadialDirectionalPrior: direction must be one of {self.DIRECTIONS}, got {direction!r}")
        if concentration is not None:
            concentration = as_float_in(concentration, "concentration (or None)", 0.0, None, low_open=True, owner=owner)
        resultant = as_float_in(resultant, "resultant", 0.0, 1.0, low_open=True, high_open=True, owner=owner)
        self.global_scale, self.local_scale = global_scale, local_scale
        self.direction = direction
        self.concentration = concentration
        self.resultant = resultant
        self.fallback = fallback if fallback is not None else Normal(0.0, 1.0)
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)  # follows the model's device/dtype

    def direction_concentration(self, dim: int) -> float:
        """kappa_p for groups of dimension ``dim`` (0 for the uniform direction prior)."""
        if self.direction == "uniform":
            return 0.0
        return self.concentration if self.concentration is not None else banerjee_concentration(dim, self.resultant)

    def distribution(self, shape: torch.Size | Sequence[int]) -> Distribution:
        raise NotImplementedError(
            "RadialDirectionalPrior has no density over a whole weight tensor; it is used through the closed-form KL "
            "of varbnn.families.RadialDirectional (other families get its fallback prior)"
        )

    def extra_repr(self) -> str:
        kappa = f"banerjee(R={self.resultant:g})" if self.concentration is None else f"{self.concentration:g}"
        return f"global_scale={self.global_scale:g}, local_scale={self.local_scale:g}, direction={self.direction!r}" + (
            f", concentration={kappa}" if self.direction == "tied" else ""
        )


class RadialPrior(Prior):
    """A radial distribution used as a prior (Farquhar et al. 2020, Appendix B): ``Radial(loc, scale)`` over the
    tensor, with the cross-entropy of a posterior estimated by Monte Carlo (``-mean_s log p(w_s)``). Used by
    variational continual learning to turn a trained Radial posterior into the next task's prior.

    :param loc: the prior mode, a number or a tensor of the weight's shape (default 0).
    :param scale: per-element scale sigma > 0, a number or a tensor of the weight's shape (default 1).
    """

    loc: torch.Tensor
    scale: torch.Tensor

    def __init__(self, loc: float | torch.Tensor = 0.0, scale: float | torch.Tensor = 1.0) -> None:
        super().__init__()
        self.register_buffer("loc", _as_tensor(loc, "loc", "RadialPrior"))
        self.register_buffer("scale", _as_tensor(scale, "scale", "RadialPrior", positive=True))

    def distribution(self, shape: torch.Size | Sequence[int]) -> Distribution:
        shape = torch.Size(shape)
        for name in ("loc", "scale"):
            value = getattr(self, name)
            if value.dim() and value.shape != shape:
                raise ValueError(f"RadialPrior: {name} has shape {tuple(value.shape)}, the weight has {tuple(shape)}")
        return Radial(self.loc.expand(shape), self.scale.expand(shape), validate_args=False)

    def extra_repr(self) -> str:
        return _repr_params(self, ("loc", "scale"))


PRIORS: dict[str, type[Prior]] = {
    "normal": Normal,
    "laplace": Laplace,
    "scale_mixture": ScaleMixture,
    "uniform": Uniform,
    "radial_directional": RadialDirectionalPrior,
    "radial": RadialPrior,
}
"""Every prior by the name experiment configs use (:func:`make_prior`)."""


def make_prior(name: str, **kwargs: object) -> Prior:
    """``PRIORS[name](**kwargs)``: a prior by name (used by experiment configs). Allowed names: the keys of
    :data:`PRIORS`; another name raises a ``ValueError`` listing them."""
    try:
        cls = PRIORS[name]
    except KeyError:
        raise ValueError(f"unknown prior name {name!r}; allowed: {sorted(PRIORS)}") from None
    return cls(**kwargs)  # type: ignore[arg-type]


def as_prior(prior: Prior | Distribution) -> Prior:
    """The varbnn :class:`Prior` that ``prior`` stands for.

    A varbnn prior is returned as it is. A ``torch.distributions.Normal`` or ``Laplace`` whose ``loc`` and ``scale``
    are scalars becomes :class:`Normal` / :class:`Laplace` with those values, i.i.d. over every element of each
    tensor it is given to. A varbnn prior is a module (its parameters move with the model and are saved in its
    ``state_dict``) that builds a distribution over a whole weight tensor of any shape; a torch distribution has a
    fixed shape, so any other one (other types, tensor-valued parameters) is refused with a ``TypeError`` that names
    the accepted priors.
    """
    if isinstance(prior, Prior):
        return prior
    accepted = (
        "a varbnn prior (varbnn.priors.Normal, Laplace, ScaleMixture, Uniform, RadialPrior, RadialDirectionalPrior; "
        "e.g. prior=varbnn.priors.Normal(0.0, 1.0)), a torch.distributions Normal or Laplace with scalar loc and scale "
        "(converted to the varbnn prior of the same name), or a callable qualified_tensor_name -> prior"
    )
    converted: dict[type[Distribution], type[_LocScalePrior]] = {_TorchNormal: Normal, _TorchLaplace: Laplace}
    if isinstance(prior, Distribution):
        target = converted.get(type(prior))
        if target is None:
            name = type(prior).__name__
            raise TypeError(f"prior must be {accepted}; got torch.distributions.{name}, which has no varbnn equivalent")
        loc, scale = prior.loc, prior.scale  # type: ignore[attr-defined]
        if loc.numel() != 1 or scale.numel() != 1:
            raise TypeError(
                f"prior must be {accepted}; got a torch {type(prior).__name__} with loc of shape {tuple(loc.shape)} and "
                f"scale of shape {tuple(scale.shape)}: use varbnn.priors.{target.__name__}(loc, scale) per tensor instead"
            )
        return target(loc.detach().reshape(()), scale.detach().reshape(()))
    raise TypeError(f"prior must be {accepted}; got {type(prior).__name__}")
