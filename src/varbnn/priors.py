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

from varbnn.distributions import ImproperUniform, ScaleMixtureNormal

if TYPE_CHECKING:
    from varbnn.families.base import VariationalFamily

__all__ = [
    "Prior",
    "Normal",
    "Laplace",
    "ScaleMixture",
    "Uniform",
    "PriorSpec",
    "update_adaptive_priors",
    "make_prior",
    "PRIORS",
]

Adaptive = bool | Literal["loc", "scale"]
_ADAPTIVE_CHOICES = (False, True, "loc", "scale")


def _as_tensor(value: float | torch.Tensor, name: str, owner: str, positive: bool = False) -> torch.Tensor:
    tensor = torch.as_tensor(value, dtype=torch.get_default_dtype()).detach().clone()
    if not torch.isfinite(tensor).all():
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
    """Base class: a distribution over one weight tensor, optionally adaptive (empirical Bayes)."""

    adaptive_fields: frozenset[str] = frozenset()

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


PriorSpec = Prior | Callable[[str], Prior]
"""What layers and ``bayesianize`` accept as a prior: one shared instance, or a factory called with the
qualified name of each tensor (e.g. ``"fc1.weight"``) that returns its own prior."""


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
    """Gaussian prior N(loc, scale^2).

    Args:
        loc: mean (default 0).
        scale: standard deviation, > 0 (default 1).
        adaptive: ``True`` to set both to their optimum (Graves 2011 eq. 15), ``"loc"`` or ``"scale"`` for one.
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
    """Laplace prior with density exp(-|w - loc| / scale) / (2 scale); arguments as :class:`Normal`.

    Adaptive (delta posteriors only, Graves 2011 eq. 7): ``loc`` = median weight (the lower median for an even
    count, which minimises the same L1 cost), ``scale`` = mean absolute deviation from ``loc``.
    """

    _torch_distribution = _TorchLaplace

    @torch.no_grad()
    def update_(self, posteriors: Sequence[VariationalFamily]) -> None:
        means, variances = _pooled_moments(posteriors)
        if bool((variances != 0).any()):
            raise NotImplementedError(
                "an adaptive Laplace prior has a closed-form optimum only for Delta posteriors "
                "(Graves 2011 eq. 7); use an adaptive Normal prior with Gaussian posteriors"
            )
        loc = means.median() if "loc" in self.adaptive_fields else self.loc
        if "loc" in self.adaptive_fields:
            self.loc.copy_(loc)
        if "scale" in self.adaptive_fields:
            mad = (means - loc).abs().mean()
            self.scale.copy_(mad.clamp_min(torch.finfo(mad.dtype).tiny))


class ScaleMixture(Prior):
    """Blundell et al. (2015) prior ``pi N(0, scale1^2) + (1 - pi) N(0, scale2^2)``; never adaptive."""

    mixture: torch.Tensor
    scale1: torch.Tensor
    scale2: torch.Tensor

    def __init__(self, pi: float = 0.5, scale1: float = 1.0, scale2: float = math.exp(-6)) -> None:
        super().__init__()
        if not 0.0 < float(pi) < 1.0:
            raise ValueError(f"ScaleMixture prior: pi must be in (0, 1), got {pi!r}")
        self.register_buffer("mixture", _as_tensor(pi, "pi", "ScaleMixture prior"))
        self.register_buffer("scale1", _as_tensor(scale1, "scale1", "ScaleMixture prior", positive=True))
        self.register_buffer("scale2", _as_tensor(scale2, "scale2", "ScaleMixture prior", positive=True))

    def distribution(self, shape: torch.Size | Sequence[int]) -> Distribution:
        return ScaleMixtureNormal(self.mixture, self.scale1, self.scale2, torch.Size(shape), validate_args=False)

    def extra_repr(self) -> str:
        return _repr_params(self, ("mixture", "scale1", "scale2"))


class Uniform(Prior):
    """Improper flat prior: with a Delta posterior the KL term is 0 and training is maximum likelihood."""

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


@torch.no_grad()
def update_adaptive_priors(model: nn.Module) -> int:
    """Set every adaptive prior in ``model`` to its optimum given the current posteriors.

    Tensors that share one prior object are pooled. Returns the number of priors updated.
    """
    from varbnn.nn.base import BayesianModule

    groups: dict[int, tuple[Prior, list[VariationalFamily]]] = {}
    for module in model.modules():
        if isinstance(module, BayesianModule):
            for _, posterior, prior in module.bayesian_tensors():
                if prior.adaptive:
                    groups.setdefault(id(prior), (prior, []))[1].append(posterior)
    for prior, posteriors in groups.values():
        prior.update_(posteriors)
    return len(groups)


PRIORS: dict[str, type[Prior]] = {"normal": Normal, "laplace": Laplace, "scale_mixture": ScaleMixture, "uniform": Uniform}


def make_prior(name: str, **kwargs: object) -> Prior:
    """Build a prior by name (used by experiment configs). Allowed names: the keys of :data:`PRIORS`."""
    try:
        cls = PRIORS[name]
    except KeyError:
        raise ValueError(f"unknown prior name {name!r}; allowed: {sorted(PRIORS)}") from None
    return cls(**kwargs)  # type: ignore[arg-type]
